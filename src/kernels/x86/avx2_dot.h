/* Exact dot products of stored rows with AVX2 + FMA + F16C: the rescoring primitive of the haswell
 * family, one function per storage format, float64 accumulation, every tail handled. */
#ifndef NUMKONG_X86_AVX2_DOT_H
#define NUMKONG_X86_AVX2_DOT_H
#include <immintrin.h>
#include <string.h>

#include "maxsim_internal.h"

static inline uint64_t nk_min_u64(uint64_t a, uint64_t b) { return a < b ? a : b; }

/* ---- Exact float64 dot products of stored rows, one function per dtype. ---- */

typedef double (*nk_dot_fn)(void const *a, void const *b, uint64_t n);

static inline double nk_hsum_pd(__m256d v) {
    __m128d sum = _mm_add_pd(_mm256_castpd256_pd128(v), _mm256_extractf128_pd(v, 1));
    return _mm_cvtsd_f64(_mm_add_sd(sum, _mm_unpackhi_pd(sum, sum)));
}

/* Lanes [0, count) set, for maskload tails. */
static inline __m256i nk_lanes32(uint64_t count) {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32((int)count), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}
static inline __m256i nk_lanes64(uint64_t count) {
    return _mm256_cmpgt_epi64(_mm256_set1_epi64x((long long)count), _mm256_setr_epi64x(0, 1, 2, 3));
}

static double nk_dot_f64(void const *a, void const *b, uint64_t n) {
    double const *x = (double const *)a, *y = (double const *)b;
    __m256d s0 = _mm256_setzero_pd(), s1 = _mm256_setzero_pd();
    uint64_t k = 0;
    for (; k + 8 <= n; k += 8) {
        s0 = _mm256_fmadd_pd(_mm256_loadu_pd(x + k), _mm256_loadu_pd(y + k), s0);
        s1 = _mm256_fmadd_pd(_mm256_loadu_pd(x + k + 4), _mm256_loadu_pd(y + k + 4), s1);
    }
    for (; k + 4 <= n; k += 4) s0 = _mm256_fmadd_pd(_mm256_loadu_pd(x + k), _mm256_loadu_pd(y + k), s0);
    if (k < n) {
        __m256i mask = nk_lanes64(n - k);
        s1 = _mm256_fmadd_pd(_mm256_maskload_pd(x + k, mask), _mm256_maskload_pd(y + k, mask), s1);
    }
    return nk_hsum_pd(_mm256_add_pd(s0, s1));
}

/* A float32 product that is exact (few significant bits, no under/overflow): add it in float64. */
NK_INLINE void nk_add_ps_as_pd(__m256 p, __m256d *s0, __m256d *s1) {
    *s0 = _mm256_add_pd(*s0, _mm256_cvtps_pd(_mm256_castps256_ps128(p)));
    *s1 = _mm256_add_pd(*s1, _mm256_cvtps_pd(_mm256_extractf128_ps(p, 1)));
}

/* float32 x float32 is exact in float64: widen first, then FMA in float64. */
static double nk_dot_f32(void const *a, void const *b, uint64_t n) {
    float const *x = (float const *)a, *y = (float const *)b;
    __m256d s0 = _mm256_setzero_pd(), s1 = _mm256_setzero_pd(), s2 = _mm256_setzero_pd(), s3 = _mm256_setzero_pd();
    uint64_t k = 0;
    /* 4 floats per 128-bit load, widened straight from memory: no lane extraction. */
    for (; k + 16 <= n; k += 16) {
        s0 = _mm256_fmadd_pd(_mm256_cvtps_pd(_mm_loadu_ps(x + k)), _mm256_cvtps_pd(_mm_loadu_ps(y + k)), s0);
        s1 = _mm256_fmadd_pd(_mm256_cvtps_pd(_mm_loadu_ps(x + k + 4)), _mm256_cvtps_pd(_mm_loadu_ps(y + k + 4)), s1);
        s2 = _mm256_fmadd_pd(_mm256_cvtps_pd(_mm_loadu_ps(x + k + 8)), _mm256_cvtps_pd(_mm_loadu_ps(y + k + 8)), s2);
        s3 = _mm256_fmadd_pd(_mm256_cvtps_pd(_mm_loadu_ps(x + k + 12)), _mm256_cvtps_pd(_mm_loadu_ps(y + k + 12)), s3);
    }
    for (; k + 4 <= n; k += 4)
        s0 = _mm256_fmadd_pd(_mm256_cvtps_pd(_mm_loadu_ps(x + k)), _mm256_cvtps_pd(_mm_loadu_ps(y + k)), s0);
    if (k < n) {
        __m128i mask = _mm256_castsi256_si128(nk_lanes32(n - k));
        __m256d tail_x = _mm256_cvtps_pd(_mm_maskload_ps(x + k, mask));
        __m256d tail_y = _mm256_cvtps_pd(_mm_maskload_ps(y + k, mask));
        s1 = _mm256_fmadd_pd(tail_x, tail_y, s1);
    }
    return nk_hsum_pd(_mm256_add_pd(_mm256_add_pd(s0, s1), _mm256_add_pd(s2, s3)));
}

/* half x half has at most 22 significant bits and stays in float32's normal range: exact. */
static double nk_dot_f16(void const *a, void const *b, uint64_t n) {
    uint16_t const *x = (uint16_t const *)a, *y = (uint16_t const *)b;
    __m256d s0 = _mm256_setzero_pd(), s1 = _mm256_setzero_pd(), s2 = _mm256_setzero_pd(), s3 = _mm256_setzero_pd();
    uint64_t k = 0;
    for (; k + 16 <= n; k += 16) {
        __m256 p0 = _mm256_mul_ps(_mm256_cvtph_ps(_mm_loadu_si128((__m128i const *)(x + k))),
                                  _mm256_cvtph_ps(_mm_loadu_si128((__m128i const *)(y + k))));
        __m256 p1 = _mm256_mul_ps(_mm256_cvtph_ps(_mm_loadu_si128((__m128i const *)(x + k + 8))),
                                  _mm256_cvtph_ps(_mm_loadu_si128((__m128i const *)(y + k + 8))));
        nk_add_ps_as_pd(p0, &s0, &s1);
        nk_add_ps_as_pd(p1, &s2, &s3);
    }
    for (; k < n; k += 8) {
        uint16_t xt[8] = {0}, yt[8] = {0}; /* zero-padded tail: never reads past the row */
        uint64_t count = nk_min_u64(8, n - k);
        memcpy(xt, x + k, count * 2), memcpy(yt, y + k, count * 2);
        nk_add_ps_as_pd(_mm256_mul_ps(_mm256_cvtph_ps(_mm_loadu_si128((__m128i const *)xt)),
                                      _mm256_cvtph_ps(_mm_loadu_si128((__m128i const *)yt))),
                        &s0, &s1);
    }
    return nk_hsum_pd(_mm256_add_pd(_mm256_add_pd(s0, s1), _mm256_add_pd(s2, s3)));
}

/* bfloat16 spans float32's range, so products may under/overflow in float32: multiply in float64.
 * Interleaving zeros below the 16 bits makes the float32 bit patterns in place (4 per register),
 * and the 128-bit widening to float64 is cheaper than extracting 256-bit halves. */
NK_INLINE __m256d nk_bf16x4_to_pd(__m128i bits4) {
    return _mm256_cvtps_pd(_mm_castsi128_ps(_mm_unpacklo_epi16(_mm_setzero_si128(), bits4)));
}

static double nk_dot_bf16(void const *a, void const *b, uint64_t n) {
    uint16_t const *x = (uint16_t const *)a, *y = (uint16_t const *)b;
    __m256d s0 = _mm256_setzero_pd(), s1 = _mm256_setzero_pd(), s2 = _mm256_setzero_pd(), s3 = _mm256_setzero_pd();
    uint64_t k = 0;
    for (; k + 16 <= n; k += 16) {
        __m128i x0 = _mm_loadu_si128((__m128i const *)(x + k)), y0 = _mm_loadu_si128((__m128i const *)(y + k));
        __m128i x1 = _mm_loadu_si128((__m128i const *)(x + k + 8)), y1 = _mm_loadu_si128((__m128i const *)(y + k + 8));
        s0 = _mm256_fmadd_pd(nk_bf16x4_to_pd(x0), nk_bf16x4_to_pd(y0), s0);
        x0 = _mm_unpackhi_epi64(x0, x0), y0 = _mm_unpackhi_epi64(y0, y0);
        s1 = _mm256_fmadd_pd(nk_bf16x4_to_pd(x0), nk_bf16x4_to_pd(y0), s1);
        s2 = _mm256_fmadd_pd(nk_bf16x4_to_pd(x1), nk_bf16x4_to_pd(y1), s2);
        x1 = _mm_unpackhi_epi64(x1, x1), y1 = _mm_unpackhi_epi64(y1, y1);
        s3 = _mm256_fmadd_pd(nk_bf16x4_to_pd(x1), nk_bf16x4_to_pd(y1), s3);
    }
    for (; k < n; k += 4) {
        uint16_t xt[4] = {0}, yt[4] = {0}; /* zero-padded tail: never reads past the row */
        uint64_t count = nk_min_u64(4, n - k);
        memcpy(xt, x + k, count * 2), memcpy(yt, y + k, count * 2);
        s0 = _mm256_fmadd_pd(nk_bf16x4_to_pd(_mm_loadl_epi64((__m128i const *)xt)),
                             nk_bf16x4_to_pd(_mm_loadl_epi64((__m128i const *)yt)), s0);
    }
    return nk_hsum_pd(_mm256_add_pd(_mm256_add_pd(s0, s1), _mm256_add_pd(s2, s3)));
}

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

/* Dot product in half units; the caller multiplies by the (power of two) scale squared. */
NK_INLINE double nk_dot_bytes(void const *a, void const *b, uint64_t n, int dtype) {
    uint8_t const *x = (uint8_t const *)a, *y = (uint8_t const *)b;
    __m256d s0 = _mm256_setzero_pd(), s1 = _mm256_setzero_pd(), s2 = _mm256_setzero_pd(), s3 = _mm256_setzero_pd();
    uint64_t k = 0;
    for (; k + 16 <= n; k += 16) {
        nk_add_ps_as_pd(nk_bytes_product(x + k, y + k, dtype), &s0, &s1);
        nk_add_ps_as_pd(nk_bytes_product(x + k + 8, y + k + 8, dtype), &s2, &s3);
    }
    for (; k < n; k += 8) {
        uint8_t xt[8] = {0}, yt[8] = {0}; /* zero-padded tail (byte 0 is +0 in every format) */
        uint64_t count = nk_min_u64(8, n - k);
        memcpy(xt, x + k, count), memcpy(yt, y + k, count);
        nk_add_ps_as_pd(nk_bytes_product(xt, yt, dtype), &s0, &s1);
    }
    return nk_hsum_pd(_mm256_add_pd(_mm256_add_pd(s0, s1), _mm256_add_pd(s2, s3)));
}

#define NK_SCALE2(s) ((double)(s) * (double)(s))
static double nk_dot_e4m3(void const *a, void const *b, uint64_t n) {
    return nk_dot_bytes(a, b, n, nk_dtype_e4m3_k) * NK_SCALE2(nk_e4m3_half_scale_k);
}
static double nk_dot_e5m2(void const *a, void const *b, uint64_t n) {
    return nk_dot_bytes(a, b, n, nk_dtype_e5m2_k) * NK_SCALE2(nk_e5m2_half_scale_k);
}
static double nk_dot_e2m3(void const *a, void const *b, uint64_t n) {
    return nk_dot_bytes(a, b, n, nk_dtype_e2m3_k) * NK_SCALE2(nk_e2m3_half_scale_k);
}
static double nk_dot_e3m2(void const *a, void const *b, uint64_t n) {
    return nk_dot_bytes(a, b, n, nk_dtype_e3m2_k) * NK_SCALE2(nk_e3m2_half_scale_k);
}

static nk_dot_fn nk_dot_for(uint32_t dtype) {
    switch (dtype) {
    case nk_dtype_float64_k: return nk_dot_f64;
    case nk_dtype_float32_k: return nk_dot_f32;
    case nk_dtype_float16_k: return nk_dot_f16;
    case nk_dtype_bfloat16_k: return nk_dot_bf16;
    case nk_dtype_e4m3_k: return nk_dot_e4m3;
    case nk_dtype_e5m2_k: return nk_dot_e5m2;
    case nk_dtype_e2m3_k: return nk_dot_e2m3;
    case nk_dtype_e3m2_k: return nk_dot_e3m2;
    default: return NULL;
    }
}

#endif /* NUMKONG_X86_AVX2_DOT_H */
