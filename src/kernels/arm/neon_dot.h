/* Exact dot products of stored rows with Advanced SIMD (armv8.2-a + fp16 conversions): the rescoring
 * primitive of the Arm families (neon.c, sve.c), one routine per storage format, float64
 * accumulation, every tail handled. */
#ifndef NUMKONG_ARM_NEON_DOT_H
#define NUMKONG_ARM_NEON_DOT_H
#include <arm_neon.h>
#include <string.h>

#include "maxsim_internal.h"

/* ---- Exact float64 dot products of two stored rows, one routine per storage format. ---- */

static double nk_arm_dot_f64(double const *a, double const *b, uint64_t depth) {
    float64x2_t sum0 = vdupq_n_f64(0), sum1 = vdupq_n_f64(0), sum2 = vdupq_n_f64(0), sum3 = vdupq_n_f64(0);
    uint64_t k = 0;
    for (; k + 8 <= depth; k += 8) {
        sum0 = vfmaq_f64(sum0, vld1q_f64(a + k), vld1q_f64(b + k));
        sum1 = vfmaq_f64(sum1, vld1q_f64(a + k + 2), vld1q_f64(b + k + 2));
        sum2 = vfmaq_f64(sum2, vld1q_f64(a + k + 4), vld1q_f64(b + k + 4));
        sum3 = vfmaq_f64(sum3, vld1q_f64(a + k + 6), vld1q_f64(b + k + 6));
    }
    for (; k + 2 <= depth; k += 2) sum0 = vfmaq_f64(sum0, vld1q_f64(a + k), vld1q_f64(b + k));
    double sum = vaddvq_f64(vaddq_f64(vaddq_f64(sum0, sum1), vaddq_f64(sum2, sum3)));
    for (; k < depth; ++k) sum += a[k] * b[k];
    return sum;
}

/* float32 (and bfloat16) products can overflow or round in float32: widen first, FMA in float64. */
NK_INLINE void nk_arm_fma_f32_as_f64(float32x4_t x, float32x4_t y, float64x2_t *low, float64x2_t *high) {
    *low = vfmaq_f64(*low, vcvt_f64_f32(vget_low_f32(x)), vcvt_f64_f32(vget_low_f32(y)));
    *high = vfmaq_f64(*high, vcvt_high_f64_f32(x), vcvt_high_f64_f32(y));
}

static double nk_arm_dot_f32(float const *a, float const *b, uint64_t depth) {
    float64x2_t sum0 = vdupq_n_f64(0), sum1 = vdupq_n_f64(0), sum2 = vdupq_n_f64(0), sum3 = vdupq_n_f64(0);
    uint64_t k = 0;
    for (; k + 8 <= depth; k += 8) {
        nk_arm_fma_f32_as_f64(vld1q_f32(a + k), vld1q_f32(b + k), &sum0, &sum1);
        nk_arm_fma_f32_as_f64(vld1q_f32(a + k + 4), vld1q_f32(b + k + 4), &sum2, &sum3);
    }
    double sum = vaddvq_f64(vaddq_f64(vaddq_f64(sum0, sum1), vaddq_f64(sum2, sum3)));
    for (; k < depth; ++k) sum += (double)a[k] * (double)b[k];
    return sum;
}

/* bfloat16 is the top half of a float32. */
NK_INLINE void nk_arm_fma_bf16x8(uint16x8_t x, uint16x8_t y, float64x2_t sums[4]) {
    nk_arm_fma_f32_as_f64(vreinterpretq_f32_u32(vshll_n_u16(vget_low_u16(x), 16)),
                           vreinterpretq_f32_u32(vshll_n_u16(vget_low_u16(y), 16)), &sums[0], &sums[1]);
    nk_arm_fma_f32_as_f64(vreinterpretq_f32_u32(vshll_n_u16(vget_high_u16(x), 16)),
                           vreinterpretq_f32_u32(vshll_n_u16(vget_high_u16(y), 16)), &sums[2], &sums[3]);
}

/* Every half-based format: a product of two halves (11-bit significands, exponents within
 * [-24, 15]) is exact in float32, so multiply there and accumulate the exact products in float64. */
NK_INLINE void nk_arm_add_f16x8_products(uint16x8_t x, uint16x8_t y, float64x2_t sums[4]) {
    float32x4_t low = vmulq_f32(vcvt_f32_f16(vreinterpret_f16_u16(vget_low_u16(x))),
                                vcvt_f32_f16(vreinterpret_f16_u16(vget_low_u16(y))));
    float32x4_t high = vmulq_f32(vcvt_f32_f16(vreinterpret_f16_u16(vget_high_u16(x))),
                                 vcvt_f32_f16(vreinterpret_f16_u16(vget_high_u16(y))));
    sums[0] = vaddq_f64(sums[0], vcvt_f64_f32(vget_low_f32(low)));
    sums[1] = vaddq_f64(sums[1], vcvt_high_f64_f32(low));
    sums[2] = vaddq_f64(sums[2], vcvt_f64_f32(vget_low_f32(high)));
    sums[3] = vaddq_f64(sums[3], vcvt_high_f64_f32(high));
}

static inline double nk_arm_sum4(float64x2_t const sums[4]) {
    return vaddvq_f64(vaddq_f64(vaddq_f64(sums[0], sums[1]), vaddq_f64(sums[2], sums[3])));
}

/* 16-bit formats, 8 elements a step; the tail goes through zero-padded copies (zeros add nothing). */
NK_INLINE double nk_arm_dot_16bit(int is_bf16, uint16_t const *a, uint16_t const *b, uint64_t depth) {
    float64x2_t sums[4] = {vdupq_n_f64(0), vdupq_n_f64(0), vdupq_n_f64(0), vdupq_n_f64(0)};
    uint64_t k = 0;
    for (; k + 8 <= depth; k += 8) {
        if (is_bf16) nk_arm_fma_bf16x8(vld1q_u16(a + k), vld1q_u16(b + k), sums);
        else nk_arm_add_f16x8_products(vld1q_u16(a + k), vld1q_u16(b + k), sums);
    }
    if (k < depth) {
        uint16_t tail_a[8] = {0}, tail_b[8] = {0};
        memcpy(tail_a, a + k, (size_t)(depth - k) * 2);
        memcpy(tail_b, b + k, (size_t)(depth - k) * 2);
        if (is_bf16) nk_arm_fma_bf16x8(vld1q_u16(tail_a), vld1q_u16(tail_b), sums);
        else nk_arm_add_f16x8_products(vld1q_u16(tail_a), vld1q_u16(tail_b), sums);
    }
    return nk_arm_sum4(sums);
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

NK_INLINE double nk_arm_dot_minifloat(int dtype, uint8_t const *a, uint8_t const *b, uint64_t depth, double scale) {
    float64x2_t sums[4] = {vdupq_n_f64(0), vdupq_n_f64(0), vdupq_n_f64(0), vdupq_n_f64(0)};
    uint64_t k = 0;
    for (; k + 8 <= depth; k += 8)
        nk_arm_add_f16x8_products(nk_arm_minifloat_to_half(dtype, vld1_u8(a + k)),
                                   nk_arm_minifloat_to_half(dtype, vld1_u8(b + k)), sums);
    if (k < depth) {
        uint8_t tail_a[8] = {0}, tail_b[8] = {0};
        memcpy(tail_a, a + k, (size_t)(depth - k));
        memcpy(tail_b, b + k, (size_t)(depth - k));
        nk_arm_add_f16x8_products(nk_arm_minifloat_to_half(dtype, vld1_u8(tail_a)),
                                   nk_arm_minifloat_to_half(dtype, vld1_u8(tail_b)), sums);
    }
    /* The power-of-two scales of both operands, exact in float64. */
    return nk_arm_sum4(sums) * (scale * scale);
}

static double nk_arm_dot(int dtype, void const *a, void const *b, uint64_t depth) {
    switch (dtype) {
    case nk_dtype_float64_k: return nk_arm_dot_f64((double const *)a, (double const *)b, depth);
    case nk_dtype_float32_k: return nk_arm_dot_f32((float const *)a, (float const *)b, depth);
    case nk_dtype_float16_k: return nk_arm_dot_16bit(0, (uint16_t const *)a, (uint16_t const *)b, depth);
    case nk_dtype_bfloat16_k: return nk_arm_dot_16bit(1, (uint16_t const *)a, (uint16_t const *)b, depth);
    case nk_dtype_e4m3_k:
        return nk_arm_dot_minifloat(nk_dtype_e4m3_k, (uint8_t const *)a, (uint8_t const *)b, depth, nk_e4m3_half_scale_k);
    case nk_dtype_e5m2_k:
        return nk_arm_dot_minifloat(nk_dtype_e5m2_k, (uint8_t const *)a, (uint8_t const *)b, depth, nk_e5m2_half_scale_k);
    case nk_dtype_e2m3_k:
        return nk_arm_dot_minifloat(nk_dtype_e2m3_k, (uint8_t const *)a, (uint8_t const *)b, depth, nk_e2m3_half_scale_k);
    case nk_dtype_e3m2_k:
        return nk_arm_dot_minifloat(nk_dtype_e3m2_k, (uint8_t const *)a, (uint8_t const *)b, depth, nk_e3m2_half_scale_k);
    default: return 0.0;
    }
}

#endif /* NUMKONG_ARM_NEON_DOT_H */
