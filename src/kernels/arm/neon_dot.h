/* Exact dot products of stored rows with Advanced SIMD (armv8.2-a + fp16 conversions): the rescoring
 * primitive of the Arm families (neon.c, sve.c), one routine per storage format, float64
 * accumulation, every tail handled. */
#ifndef NUMKONG_ARM_NEON_DOT_H
#define NUMKONG_ARM_NEON_DOT_H
#include <arm_neon.h>
#include <string.h>

#include "maxsim_internal.h"

/* ---- Exact float64 dot products of two stored rows, one routine per storage format. ----
 * All in the canonical order (maxsim_internal.h): lanes 2i and 2i + 1 in s[i] (i < 8), 16 elements
 * a step, the last partial step through zero-padded copies (never past the row). */

/* t_i = s_i + s_{i+8}, u_i = t_i + t_{i+4}, v_i = u_i + u_{i+2}, v_0 + v_1, two lanes a register. */
NK_INLINE double nk_arm_reduce16(float64x2_t const s[8]) {
    float64x2_t t01 = vaddq_f64(s[0], s[4]), t23 = vaddq_f64(s[1], s[5]);
    float64x2_t t45 = vaddq_f64(s[2], s[6]), t67 = vaddq_f64(s[3], s[7]);
    float64x2_t v = vaddq_f64(vaddq_f64(t01, t45), vaddq_f64(t23, t67));
    return vgetq_lane_f64(v, 0) + vgetq_lane_f64(v, 1);
}

/* The canonical dot of a format whose 16-element step is `step`(x, y, s) on elements of `type`. The
 * last partial step (and the reduction after it) is out of line and takes the sums by value, so the
 * common path keeps them in registers and needs no stack frame for the zero-padded copies. */
#define NK_ARM_DOT_CANONICAL(name, type, step) \
    static NK_NOINLINE double name##_tail(type const *x, type const *y, uint64_t count, float64x2_t s0, \
                                          float64x2_t s1, float64x2_t s2, float64x2_t s3, float64x2_t s4, \
                                          float64x2_t s5, float64x2_t s6, float64x2_t s7) { \
        float64x2_t s[8] = {s0, s1, s2, s3, s4, s5, s6, s7}; \
        type xt[16] = {0}, yt[16] = {0}; /* zero is +0 in every format */ \
        memcpy(xt, x, (size_t)count * sizeof(type)); \
        memcpy(yt, y, (size_t)count * sizeof(type)); \
        step(xt, yt, s); \
        return nk_arm_reduce16(s); \
    } \
    static double name(void const *a, void const *b, uint64_t depth) { \
        type const *x = (type const *)a, *y = (type const *)b; \
        float64x2_t const zero = vdupq_n_f64(0); \
        float64x2_t s[8] = {zero, zero, zero, zero, zero, zero, zero, zero}; \
        uint64_t k = 0; \
        for (; k + 16 <= depth; k += 16) step(x + k, y + k, s); \
        if (k < depth) return name##_tail(x + k, y + k, depth - k, s[0], s[1], s[2], s[3], s[4], s[5], s[6], s[7]); \
        return nk_arm_reduce16(s); \
    }

/* float64: the product is rounded, then added. The empty asm keeps any build (-ffp-contract=fast)
 * from fusing the two into an fmla, which would change the bits. */
NK_INLINE float64x2_t nk_arm_add_product_f64(float64x2_t sum, double const *x, double const *y) {
    float64x2_t p = vmulq_f64(vld1q_f64(x), vld1q_f64(y));
#if defined(__GNUC__)
    __asm__("" : "+w"(p));
#endif
    return vaddq_f64(sum, p);
}

/* Steps written out, not looped: every build keeps the eight sums in registers. */
NK_INLINE void nk_arm_step_f64(double const *x, double const *y, float64x2_t s[8]) {
    s[0] = nk_arm_add_product_f64(s[0], x, y);
    s[1] = nk_arm_add_product_f64(s[1], x + 2, y + 2);
    s[2] = nk_arm_add_product_f64(s[2], x + 4, y + 4);
    s[3] = nk_arm_add_product_f64(s[3], x + 6, y + 6);
    s[4] = nk_arm_add_product_f64(s[4], x + 8, y + 8);
    s[5] = nk_arm_add_product_f64(s[5], x + 10, y + 10);
    s[6] = nk_arm_add_product_f64(s[6], x + 12, y + 12);
    s[7] = nk_arm_add_product_f64(s[7], x + 14, y + 14);
}

/* 4 float32 values of lanes 4h .. 4h+3 of each row: the products are exact in float64, so the fused
 * multiply-add rounds only the sum, as mul-then-add would. */
NK_INLINE void nk_arm_fma_f32_as_f64(float32x4_t x, float32x4_t y, float64x2_t *low, float64x2_t *high) {
    *low = vfmaq_f64(*low, vcvt_f64_f32(vget_low_f32(x)), vcvt_f64_f32(vget_low_f32(y)));
    *high = vfmaq_f64(*high, vcvt_high_f64_f32(x), vcvt_high_f64_f32(y));
}

/* float32 (and bfloat16) products can overflow or round in float32: widen first. */
NK_INLINE void nk_arm_step_f32(float const *x, float const *y, float64x2_t s[8]) {
    nk_arm_fma_f32_as_f64(vld1q_f32(x), vld1q_f32(y), &s[0], &s[1]);
    nk_arm_fma_f32_as_f64(vld1q_f32(x + 4), vld1q_f32(y + 4), &s[2], &s[3]);
    nk_arm_fma_f32_as_f64(vld1q_f32(x + 8), vld1q_f32(y + 8), &s[4], &s[5]);
    nk_arm_fma_f32_as_f64(vld1q_f32(x + 12), vld1q_f32(y + 12), &s[6], &s[7]);
}

/* bfloat16 is the top half of a float32: 8 of them into lanes 8h .. 8h+7 (s[0] .. s[3]). */
NK_INLINE void nk_arm_fma_bf16x8(uint16x8_t x, uint16x8_t y, float64x2_t s[4]) {
    nk_arm_fma_f32_as_f64(vreinterpretq_f32_u32(vshll_n_u16(vget_low_u16(x), 16)),
                          vreinterpretq_f32_u32(vshll_n_u16(vget_low_u16(y), 16)), &s[0], &s[1]);
    nk_arm_fma_f32_as_f64(vreinterpretq_f32_u32(vshll_n_u16(vget_high_u16(x), 16)),
                          vreinterpretq_f32_u32(vshll_n_u16(vget_high_u16(y), 16)), &s[2], &s[3]);
}

NK_INLINE void nk_arm_step_bf16(uint16_t const *x, uint16_t const *y, float64x2_t s[8]) {
    nk_arm_fma_bf16x8(vld1q_u16(x), vld1q_u16(y), s);
    nk_arm_fma_bf16x8(vld1q_u16(x + 8), vld1q_u16(y + 8), s + 4);
}

/* Every half-based format: a product of two halves (11-bit significands, exponents within
 * [-24, 15]) is exact in float32, so multiply there and add the exact products in float64.
 * 8 elements into lanes 8h .. 8h+7 (s[4h] .. s[4h+3]). */
NK_INLINE void nk_arm_add_f16x8_products(uint16x8_t x, uint16x8_t y, float64x2_t s[4]) {
    float32x4_t low = vmulq_f32(vcvt_f32_f16(vreinterpret_f16_u16(vget_low_u16(x))),
                                vcvt_f32_f16(vreinterpret_f16_u16(vget_low_u16(y))));
    float32x4_t high = vmulq_f32(vcvt_f32_f16(vreinterpret_f16_u16(vget_high_u16(x))),
                                 vcvt_f32_f16(vreinterpret_f16_u16(vget_high_u16(y))));
    s[0] = vaddq_f64(s[0], vcvt_f64_f32(vget_low_f32(low)));
    s[1] = vaddq_f64(s[1], vcvt_high_f64_f32(low));
    s[2] = vaddq_f64(s[2], vcvt_f64_f32(vget_low_f32(high)));
    s[3] = vaddq_f64(s[3], vcvt_high_f64_f32(high));
}

NK_INLINE void nk_arm_step_f16(uint16_t const *x, uint16_t const *y, float64x2_t s[8]) {
    nk_arm_add_f16x8_products(vld1q_u16(x), vld1q_u16(y), s);
    nk_arm_add_f16x8_products(vld1q_u16(x + 8), vld1q_u16(y + 8), s + 4);
}

/* 8 one-byte minifloats to their exact IEEE half images (the power-of-two scale comes later). */
NK_INLINE uint16x8_t nk_arm_minifloat_to_half(int dtype, uint8x8_t bytes) {
    uint16x8_t x = vmovl_u8(bytes);
    switch (dtype) {
    case nk_dtype_e4m3_k:
        return vorrq_u16(vandq_u16(vshlq_n_u16(x, 8), vdupq_n_u16(0x8000)), vandq_u16(vshlq_n_u16(x, 7), vdupq_n_u16(0x3F80)));
    case nk_dtype_e5m2_k: return vshlq_n_u16(x, 8);
    case nk_dtype_e2m3_k:
        return vorrq_u16(vandq_u16(vshlq_n_u16(x, 10), vdupq_n_u16(0x8000)), vandq_u16(vshlq_n_u16(x, 7), vdupq_n_u16(0x0F80)));
    default: /* e3m2 */
        return vorrq_u16(vandq_u16(vshlq_n_u16(x, 10), vdupq_n_u16(0x8000)), vandq_u16(vshlq_n_u16(x, 8), vdupq_n_u16(0x1F00)));
    }
}

/* Per minifloat format: 16 bytes as exact half products into the 16 lanes, and the canonical dot
 * of half images; nk_arm_dot applies the power-of-two scales (exact). */
#define NK_ARM_DOT_MINIFLOAT(format, dtype, scale) \
    NK_INLINE void nk_arm_step_##format(uint8_t const *x, uint8_t const *y, float64x2_t s[8]) { \
        uint8x16_t xb = vld1q_u8(x), yb = vld1q_u8(y); \
        nk_arm_add_f16x8_products(nk_arm_minifloat_to_half(dtype, vget_low_u8(xb)), \
                                  nk_arm_minifloat_to_half(dtype, vget_low_u8(yb)), s); \
        nk_arm_add_f16x8_products(nk_arm_minifloat_to_half(dtype, vget_high_u8(xb)), \
                                  nk_arm_minifloat_to_half(dtype, vget_high_u8(yb)), s + 4); \
    } \
    NK_ARM_DOT_CANONICAL(nk_arm_dot_halves_##format, uint8_t, nk_arm_step_##format)
NK_FOR_EACH_MINIFLOAT(NK_ARM_DOT_MINIFLOAT)
#undef NK_ARM_DOT_MINIFLOAT

NK_ARM_DOT_CANONICAL(nk_arm_dot_f64, double, nk_arm_step_f64)
NK_ARM_DOT_CANONICAL(nk_arm_dot_f32, float, nk_arm_step_f32)
NK_ARM_DOT_CANONICAL(nk_arm_dot_bf16, uint16_t, nk_arm_step_bf16)
NK_ARM_DOT_CANONICAL(nk_arm_dot_f16, uint16_t, nk_arm_step_f16)
#undef NK_ARM_DOT_CANONICAL

static double nk_arm_dot(int dtype, void const *a, void const *b, uint64_t depth) {
    switch (dtype) {
    case nk_dtype_float64_k: return nk_arm_dot_f64(a, b, depth);
    case nk_dtype_float32_k: return nk_arm_dot_f32(a, b, depth);
    case nk_dtype_float16_k: return nk_arm_dot_f16(a, b, depth);
    case nk_dtype_bfloat16_k: return nk_arm_dot_bf16(a, b, depth);
#define NK_ARM_DOT_CASE(format, code, scale) \
    case code: return nk_arm_dot_halves_##format(a, b, depth) * nk_half_scale_squared(code);
        NK_FOR_EACH_MINIFLOAT(NK_ARM_DOT_CASE)
#undef NK_ARM_DOT_CASE
    default: return 0.0;
    }
}

#endif /* NUMKONG_ARM_NEON_DOT_H */
