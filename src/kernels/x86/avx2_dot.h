/* Exact dot products of stored rows with AVX2 + FMA + F16C: the rescoring primitive of the haswell
 * family, one function per storage format, float64 accumulation, every tail handled. */
#ifndef NUMKONG_X86_AVX2_DOT_H
#define NUMKONG_X86_AVX2_DOT_H
#include <immintrin.h>
#include <string.h>

#include "maxsim_internal.h"

static inline uint64_t nk_min_u64(uint64_t a, uint64_t b) { return a < b ? a : b; }

/* Lanes [0, count) set, for maskload tails (haswell.c's screening). */
static inline __m256i nk_lanes32(uint64_t count) {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32((int)count), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

/* ---- Exact float64 dot products of stored rows, one function per dtype. ----
 * All in the canonical order (maxsim_internal.h): lanes 0-3, 4-7, 8-11 and 12-15 in s[0] .. s[3],
 * 16 elements a step, the last partial step through zero-padded copies (never past the row). */

typedef double (*nk_dot_fn)(void const *a, void const *b, uint64_t n);

/* t = s0 + s2 | s1 + s3 (t_i = s_i + s_{i+8}), u = t_0..3 + t_4..7, v = u_0,1 + u_2,3, v0 + v1. */
NK_INLINE double nk_reduce16_pd(__m256d const s[4]) {
    __m256d u = _mm256_add_pd(_mm256_add_pd(s[0], s[2]), _mm256_add_pd(s[1], s[3]));
    __m128d v = _mm_add_pd(_mm256_castpd256_pd128(u), _mm256_extractf128_pd(u, 1));
    return _mm_cvtsd_f64(_mm_add_sd(v, _mm_unpackhi_pd(v, v)));
}

/* The canonical dot of a format whose 16-element step is `step`(x, y, s) on elements of `type`. The
 * last partial step (and the reduction after it) is out of line and takes the sums by value, so the
 * common path keeps them in registers and needs no stack frame for the zero-padded copies. */
#define NK_DOT_CANONICAL(name, type, step) \
    static NK_NOINLINE double name##_tail(type const *x, type const *y, uint64_t count, __m256d s0, __m256d s1, \
                                          __m256d s2, __m256d s3) { \
        __m256d s[4] = {s0, s1, s2, s3}; \
        type xt[16] = {0}, yt[16] = {0}; /* zero is +0 in every format */ \
        memcpy(xt, x, (size_t)count * sizeof(type)), memcpy(yt, y, (size_t)count * sizeof(type)); \
        step(xt, yt, s); \
        return nk_reduce16_pd(s); \
    } \
    static double name(void const *a, void const *b, uint64_t n) { \
        type const *x = (type const *)a, *y = (type const *)b; \
        __m256d s[4] = {_mm256_setzero_pd(), _mm256_setzero_pd(), _mm256_setzero_pd(), _mm256_setzero_pd()}; \
        uint64_t k = 0; \
        for (; k + 16 <= n; k += 16) step(x + k, y + k, s); \
        if (k < n) return name##_tail(x + k, y + k, n - k, s[0], s[1], s[2], s[3]); \
        return nk_reduce16_pd(s); \
    }

/* float64: the product is rounded, then added. The empty asm keeps any build (-ffp-contract=fast)
 * from fusing the two, which would change the bits. Every other format's products are exact, so
 * they may be fused. */
NK_INLINE __m256d nk_mul_pd_rounded(__m256d x, __m256d y) {
    __m256d p = _mm256_mul_pd(x, y);
#if defined(__GNUC__)
    __asm__("" : "+x"(p));
#endif
    return p;
}

NK_INLINE void nk_step_f64(double const *x, double const *y, __m256d s[4]) {
    s[0] = _mm256_add_pd(s[0], nk_mul_pd_rounded(_mm256_loadu_pd(x), _mm256_loadu_pd(y)));
    s[1] = _mm256_add_pd(s[1], nk_mul_pd_rounded(_mm256_loadu_pd(x + 4), _mm256_loadu_pd(y + 4)));
    s[2] = _mm256_add_pd(s[2], nk_mul_pd_rounded(_mm256_loadu_pd(x + 8), _mm256_loadu_pd(y + 8)));
    s[3] = _mm256_add_pd(s[3], nk_mul_pd_rounded(_mm256_loadu_pd(x + 12), _mm256_loadu_pd(y + 12)));
}

/* float32 x float32 is exact in float64: widen (4 floats per 128-bit load, straight from memory)
 * and fuse, which rounds only the sum, as mul-then-add would. */
NK_INLINE __m256d nk_fma_f32x4_as_pd(float const *x, float const *y, __m256d sum) {
    return _mm256_fmadd_pd(_mm256_cvtps_pd(_mm_loadu_ps(x)), _mm256_cvtps_pd(_mm_loadu_ps(y)), sum);
}

NK_INLINE void nk_step_f32(float const *x, float const *y, __m256d s[4]) {
    s[0] = nk_fma_f32x4_as_pd(x, y, s[0]);
    s[1] = nk_fma_f32x4_as_pd(x + 4, y + 4, s[1]);
    s[2] = nk_fma_f32x4_as_pd(x + 8, y + 8, s[2]);
    s[3] = nk_fma_f32x4_as_pd(x + 12, y + 12, s[3]);
}

/* 8 exact float32 products of elements 8h .. 8h+7 into lanes 8h .. 8h+7. */
NK_INLINE void nk_add_ps_as_pd(__m256 p, __m256d *low, __m256d *high) {
    *low = _mm256_add_pd(*low, _mm256_cvtps_pd(_mm256_castps256_ps128(p)));
    *high = _mm256_add_pd(*high, _mm256_cvtps_pd(_mm256_extractf128_ps(p, 1)));
}

/* half x half has at most 22 significant bits and stays in float32's normal range: exact. */
NK_INLINE __m256 nk_f16x8_product(uint16_t const *x, uint16_t const *y) {
    return _mm256_mul_ps(_mm256_cvtph_ps(_mm_loadu_si128((__m128i const *)x)),
                         _mm256_cvtph_ps(_mm_loadu_si128((__m128i const *)y)));
}

NK_INLINE void nk_step_f16(uint16_t const *x, uint16_t const *y, __m256d s[4]) {
    nk_add_ps_as_pd(nk_f16x8_product(x, y), &s[0], &s[1]);
    nk_add_ps_as_pd(nk_f16x8_product(x + 8, y + 8), &s[2], &s[3]);
}

/* bfloat16 spans float32's range, so products may under/overflow in float32: multiply in float64.
 * Interleaving zeros below the 16 bits makes the float32 bit patterns in place (4 per register),
 * and the 128-bit widening to float64 is cheaper than extracting 256-bit halves. */
NK_INLINE __m256d nk_bf16x4_to_pd(__m128i bits4) {
    return _mm256_cvtps_pd(_mm_castsi128_ps(_mm_unpacklo_epi16(_mm_setzero_si128(), bits4)));
}

/* 8 bfloat16 pairs into lanes 8h .. 8h+7 (`low`, `high`): exact products, fused. */
NK_INLINE void nk_fma_bf16x8(uint16_t const *x, uint16_t const *y, __m256d *low, __m256d *high) {
    __m128i xh = _mm_loadu_si128((__m128i const *)x), yh = _mm_loadu_si128((__m128i const *)y);
    *low = _mm256_fmadd_pd(nk_bf16x4_to_pd(xh), nk_bf16x4_to_pd(yh), *low);
    *high = _mm256_fmadd_pd(nk_bf16x4_to_pd(_mm_unpackhi_epi64(xh, xh)), nk_bf16x4_to_pd(_mm_unpackhi_epi64(yh, yh)),
                            *high);
}

NK_INLINE void nk_step_bf16(uint16_t const *x, uint16_t const *y, __m256d s[4]) {
    nk_fma_bf16x8(x, y, &s[0], &s[1]);
    nk_fma_bf16x8(x + 8, y + 8, &s[2], &s[3]);
}

NK_DOT_CANONICAL(nk_dot_f64, double, nk_step_f64)
NK_DOT_CANONICAL(nk_dot_f32, float, nk_step_f32)
NK_DOT_CANONICAL(nk_dot_f16, uint16_t, nk_step_f16)
NK_DOT_CANONICAL(nk_dot_bf16, uint16_t, nk_step_bf16)

/* 8 bytes of a 1-byte format -> 8 IEEE half bit patterns (the value divided by the format's
 * power-of-two half scale, see maxsim_internal.h). Sign-extending the byte (after moving an fp6
 * sign to bit 7) and shifting puts the sign at bit 15; the mask then clears the extended copies. */
NK_INLINE __m128i nk_fp6_sign_to_bit7(__m128i bytes) {
    /* keep the 6 value bits (as serial does), then a 16-bit shift by 2 moves nothing across bytes */
    return _mm_slli_epi16(_mm_and_si128(bytes, _mm_set1_epi8(0x3F)), 2);
}

NK_INLINE __m128i nk_bytes_to_half_bits(__m128i bytes, int dtype) {
    switch (dtype) {
    case nk_dtype_e4m3_k: /* ((b & 0x80) << 8) | ((b & 0x7F) << 7) */
        return _mm_and_si128(_mm_slli_epi16(_mm_cvtepi8_epi16(bytes), 7), _mm_set1_epi16(-16385));
    case nk_dtype_e5m2_k: /* b << 8 */
        return _mm_unpacklo_epi8(_mm_setzero_si128(), bytes);
    case nk_dtype_e2m3_k: /* ((b & 0x20) << 10) | ((b & 0x1F) << 7) */
        return _mm_and_si128(_mm_slli_epi16(_mm_cvtepi8_epi16(nk_fp6_sign_to_bit7(bytes)), 5),
                             _mm_set1_epi16((short)0x8F80));
    default: /* e3m2: ((b & 0x20) << 10) | ((b & 0x1F) << 8) */
        return _mm_and_si128(_mm_slli_epi16(_mm_cvtepi8_epi16(nk_fp6_sign_to_bit7(bytes)), 6),
                             _mm_set1_epi16((short)0x9F00));
    }
}

/* 8 products of decoded values. Each factor has <= 4 significant bits and the product stays in
 * float32's normal range, so the float32 product is exact. */
NK_INLINE __m256 nk_bytes_product(uint8_t const *x, uint8_t const *y, int dtype) {
    __m256 fx = _mm256_cvtph_ps(nk_bytes_to_half_bits(_mm_loadl_epi64((__m128i const *)x), dtype));
    __m256 fy = _mm256_cvtph_ps(nk_bytes_to_half_bits(_mm_loadl_epi64((__m128i const *)y), dtype));
    return _mm256_mul_ps(fx, fy);
}

/* Per minifloat format: 16 bytes as exact float32 products of half images into the 16 lanes, the
 * canonical dot of half images, and the dot of values (times the power-of-two scale squared). */
#define NK_DOT_MINIFLOAT(format, dtype, scale) \
    NK_INLINE void nk_step_##format(uint8_t const *x, uint8_t const *y, __m256d s[4]) { \
        nk_add_ps_as_pd(nk_bytes_product(x, y, dtype), &s[0], &s[1]); \
        nk_add_ps_as_pd(nk_bytes_product(x + 8, y + 8, dtype), &s[2], &s[3]); \
    } \
    NK_DOT_CANONICAL(nk_dot_halves_##format, uint8_t, nk_step_##format) \
    static double nk_dot_##format(void const *a, void const *b, uint64_t n) { \
        return nk_dot_halves_##format(a, b, n) * nk_half_scale_squared(dtype); \
    }
NK_FOR_EACH_MINIFLOAT(NK_DOT_MINIFLOAT)
#undef NK_DOT_MINIFLOAT
#undef NK_DOT_CANONICAL

static nk_dot_fn nk_dot_for(uint32_t dtype) {
    switch (dtype) {
    case nk_dtype_float64_k: return nk_dot_f64;
    case nk_dtype_float32_k: return nk_dot_f32;
    case nk_dtype_float16_k: return nk_dot_f16;
    case nk_dtype_bfloat16_k: return nk_dot_bf16;
#define NK_DOT_CASE(format, code, scale) \
    case code: return nk_dot_##format;
        NK_FOR_EACH_MINIFLOAT(NK_DOT_CASE)
#undef NK_DOT_CASE
    default: return NULL;
    }
}

#endif /* NUMKONG_X86_AVX2_DOT_H */
