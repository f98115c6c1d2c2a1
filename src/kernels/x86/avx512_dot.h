/* Exact dot products of stored rows with AVX-512 (F/BW/DQ/VL + F16C; the e4m3 integer dot product
 * also needs VNNI and VBMI, and without them e4m3 is decoded like e5m2): the primitive every AVX-512
 * family (skylake, icelake, sapphireamx) rescores with, and float32 dot products with a proven error
 * bound for cheap checks. */
#ifndef NUMKONG_X86_AVX512_DOT_H
#define NUMKONG_X86_AVX512_DOT_H
#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "maxsim_internal.h"

/* ---- Exact float64 dot products, in the canonical order (maxsim_internal.h). ----
 * Lanes 0-7 of the sum in one register and 8-15 in another, 16 elements a step, the last one masked.
 * Every stored format converts exactly to float64 (the minifloats through their IEEE half images,
 * their power-of-two scale applied once to the sum). A query row with several candidates is decoded
 * once into float64 on the stack; two half-based rows are multiplied exactly in float32 first. Same
 * products, same lanes, same reduction: every path gives the same bits. */

NK_INLINE __mmask16 nk_x512_tail_mask(uint64_t remaining) {
    return remaining >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << remaining) - 1u);
}
NK_INLINE __mmask32 nk_x512_tail_mask32(uint64_t remaining) {
    return remaining >= 32 ? (__mmask32)0xFFFFFFFFu : (__mmask32)((1u << remaining) - 1u);
}

/* IEEE half bit patterns of 16 one-byte minifloats: the sign is shifted to bit 15 and smeared right
 * by an arithmetic shift, which also puts exponent and mantissa in place; one AND clears the smear. */
NK_INLINE __m256i nk_x512_minifloat_to_half(int dtype, __m128i bytes) {
    switch (dtype) {
    case nk_dtype_e4m3_k: /* sign-extended byte << 7: sign at 15 and 14, the rest at 7..13 */
        return _mm256_and_si256(_mm256_slli_epi16(_mm256_cvtepi8_epi16(bytes), 7), _mm256_set1_epi16((short)0xBFFF));
    case nk_dtype_e5m2_k: return _mm256_slli_epi16(_mm256_cvtepu8_epi16(bytes), 8);
    case nk_dtype_e2m3_k: /* bit 5 to 15, then >> 3: magnitude at 7..11, sign at 12..15 */
        return _mm256_and_si256(_mm256_srai_epi16(_mm256_slli_epi16(_mm256_cvtepu8_epi16(bytes), 10), 3),
                                _mm256_set1_epi16((short)0x8FFF));
    default: /* e3m2: bit 5 to 15, then >> 2: magnitude at 8..12, sign at 13..15 */
        return _mm256_and_si256(_mm256_srai_epi16(_mm256_slli_epi16(_mm256_cvtepu8_epi16(bytes), 10), 2),
                                _mm256_set1_epi16((short)0x9FFF));
    }
}

/* Elements k .. k+15 of a row of `dtype` (only `lanes` of them are read) as two float64 vectors. */
NK_INLINE void nk_x512_load16(int dtype, void const *row, uint64_t k, __mmask16 lanes, __m512d *low,
                                   __m512d *high) {
    __m512 wide;
    switch (dtype) {
    case nk_dtype_float64_k:
        *low = _mm512_maskz_loadu_pd((__mmask8)lanes, (double const *)row + k);
        *high = _mm512_maskz_loadu_pd((__mmask8)(lanes >> 8), (double const *)row + k + 8);
        return;
    case nk_dtype_float32_k:
        *low = _mm512_cvtps_pd(_mm256_maskz_loadu_ps((__mmask8)lanes, (float const *)row + k));
        *high = _mm512_cvtps_pd(_mm256_maskz_loadu_ps((__mmask8)(lanes >> 8), (float const *)row + k + 8));
        return;
    case nk_dtype_float16_k: {
        uint16_t const *halves = (uint16_t const *)row + k;
        *low = _mm512_cvtps_pd(_mm256_cvtph_ps(_mm_maskz_loadu_epi16((__mmask8)lanes, halves)));
        *high = _mm512_cvtps_pd(_mm256_cvtph_ps(_mm_maskz_loadu_epi16((__mmask8)(lanes >> 8), halves + 8)));
        return;
    }
    case nk_dtype_bfloat16_k:
        wide = _mm512_castsi512_ps(
            _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(lanes, (uint16_t const *)row + k)), 16));
        break;
    default:
        wide = _mm512_cvtph_ps(
            nk_x512_minifloat_to_half(dtype, _mm_maskz_loadu_epi8(lanes, (uint8_t const *)row + k)));
        break;
    }
    *low = _mm512_cvtps_pd(_mm512_castps512_ps256(wide));
    *high = _mm512_cvtps_pd(_mm512_extractf32x8_ps(wide, 1));
}

/* The canonical reduction of lanes 0-7 (`low`) and 8-15 (`high`), written out: the order of
 * _mm512_reduce_add_pd is the compiler's. */
NK_INLINE double nk_x512_reduce16(__m512d low, __m512d high) {
    __m512d t = _mm512_add_pd(low, high);                                               /* s_i + s_{i+8} */
    __m256d u = _mm256_add_pd(_mm512_castpd512_pd256(t), _mm512_extractf64x4_pd(t, 1)); /* t_i + t_{i+4} */
    __m128d v = _mm_add_pd(_mm256_castpd256_pd128(u), _mm256_extractf128_pd(u, 1));    /* u_i + u_{i+2} */
    return _mm_cvtsd_f64(_mm_add_sd(v, _mm_unpackhi_pd(v, v)));
}

/* Products added to the lanes. Two float64 operands: the product is rounded, then added, and the
 * empty asm keeps any build (-ffp-contract=fast) from fusing the two. Otherwise the product is exact,
 * so the fused form rounds only the sum, as mul-then-add would, in fewer instructions. */
NK_INLINE void nk_x512_add_products(int rounded, __m512d a0, __m512d b0, __m512d a1, __m512d b1, __m512d *low,
                                    __m512d *high) {
    if (!rounded) {
        *low = _mm512_fmadd_pd(a0, b0, *low);
        *high = _mm512_fmadd_pd(a1, b1, *high);
        return;
    }
    __m512d p0 = _mm512_mul_pd(a0, b0), p1 = _mm512_mul_pd(a1, b1);
#if defined(__GNUC__)
    __asm__("" : "+v"(p0), "+v"(p1));
#endif
    *low = _mm512_add_pd(*low, p0);
    *high = _mm512_add_pd(*high, p1);
}

/* Unscaled dot product of `a` (a decoded float64 row when a_dtype is float64) and `b` (stored).
 * Masked loads never read past either row. */
NK_INLINE double nk_x512_dot_kernel(int a_dtype, void const *a, int b_dtype, void const *b, uint64_t depth) {
    int const rounded = a_dtype == nk_dtype_float64_k && b_dtype == nk_dtype_float64_k;
    __m512d low = _mm512_setzero_pd(), high = _mm512_setzero_pd();
    __m512d a0, a1, b0, b1;
    uint64_t k = 0;
    for (; k + 16 <= depth; k += 16) {
        nk_x512_load16(a_dtype, a, k, 0xFFFF, &a0, &a1);
        nk_x512_load16(b_dtype, b, k, 0xFFFF, &b0, &b1);
        nk_x512_add_products(rounded, a0, b0, a1, b1, &low, &high);
    }
    if (k < depth) {
        __mmask16 lanes = nk_x512_tail_mask(depth - k);
        nk_x512_load16(a_dtype, a, k, lanes, &a0, &a1);
        nk_x512_load16(b_dtype, b, k, lanes, &b0, &b1);
        nk_x512_add_products(rounded, a0, b0, a1, b1, &low, &high);
    }
    return nk_x512_reduce16(low, high);
}

/* 16 elements of a half-based row (float16 or a minifloat's half image) as float32, exactly. */
NK_INLINE __m512 nk_x512_load16_half(int dtype, void const *row, uint64_t k, __mmask16 lanes) {
    if (dtype == nk_dtype_float16_k)
        return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(lanes, (uint16_t const *)row + k));
    return _mm512_cvtph_ps(nk_x512_minifloat_to_half(dtype, _mm_maskz_loadu_epi8(lanes, (uint8_t const *)row + k)));
}

/* 16 exact float32 products (of two half images) into lanes 0-7 and 8-15. */
NK_INLINE void nk_x512_add_product_ps(__m512 product, __m512d *low, __m512d *high) {
    *low = _mm512_add_pd(*low, _mm512_cvtps_pd(_mm512_castps512_ps256(product)));
    *high = _mm512_add_pd(*high, _mm512_cvtps_pd(_mm512_extractf32x8_ps(product, 1)));
}

/* Products of 8 float16 elements k .. k+7 (`lanes` of them) of two rows added, widened, to `sum`. */
NK_INLINE void nk_x512_add_f16_products8(void const *a, void const *b, uint64_t k, __mmask8 lanes, __m512d *sum) {
    __m256 x = _mm256_cvtph_ps(_mm_maskz_loadu_epi16(lanes, (uint16_t const *)a + k));
    __m256 y = _mm256_cvtph_ps(_mm_maskz_loadu_epi16(lanes, (uint16_t const *)b + k));
    *sum = _mm512_add_pd(*sum, _mm512_cvtps_pd(_mm256_mul_ps(x, y)));
}

/* Unscaled dot products of `rows` (1 or 2, a literal) pairs of stored float16 rows, a[j] with b[j], in
 * one loop. A product of two halves (11-bit significands) is exact in float32, so each pair is
 * multiplied there and only the product is widened. Each half of a step in 256-bit registers, so no
 * product is extracted from a 512-bit one: depth 128 15.0 against 16.3 ns, 768 84 against 90 (8 in a
 * batch). Two pairs at once give the core two independent chains per step (a batch's dot products:
 * 32x180x128 Ice Lake class 0.98-1.00 of the time of one pair after the other). */
NK_INLINE void nk_x512_dot_f16_rows(void const *const *a, void const *const *b, int const rows, uint64_t depth,
                                    double *out) {
    __m512d low[2] = {_mm512_setzero_pd(), _mm512_setzero_pd()}, high[2] = {low[0], low[1]};
    uint64_t k = 0;
    for (; k + 16 <= depth; k += 16) {
#pragma GCC unroll 2
        for (int j = 0; j < rows; ++j) nk_x512_add_f16_products8(a[j], b[j], k, 0xFF, &low[j]);
#pragma GCC unroll 2
        for (int j = 0; j < rows; ++j) nk_x512_add_f16_products8(a[j], b[j], k + 8, 0xFF, &high[j]);
    }
    if (k < depth) {
        __mmask16 lanes = nk_x512_tail_mask(depth - k);
#pragma GCC unroll 2
        for (int j = 0; j < rows; ++j) nk_x512_add_f16_products8(a[j], b[j], k, (__mmask8)lanes, &low[j]);
#pragma GCC unroll 2
        for (int j = 0; j < rows; ++j) nk_x512_add_f16_products8(a[j], b[j], k + 8, (__mmask8)(lanes >> 8), &high[j]);
    }
#pragma GCC unroll 2
    for (int j = 0; j < rows; ++j) out[j] = nk_x512_reduce16(low[j], high[j]);
}

/* Unscaled dot product of two stored minifloat rows through their half images (exact in float32, as
 * float16's: nk_x512_dot_f16_rows); the minifloats decode 16 bytes at a time. */
NK_INLINE double nk_x512_dot_halves(int dtype, void const *a, void const *b, uint64_t depth) {
    __m512d low = _mm512_setzero_pd(), high = _mm512_setzero_pd();
    uint64_t k = 0;
    for (; k + 16 <= depth; k += 16)
        nk_x512_add_product_ps(_mm512_mul_ps(nk_x512_load16_half(dtype, a, k, 0xFFFF),
                                             nk_x512_load16_half(dtype, b, k, 0xFFFF)),
                               &low, &high);
    if (k < depth) {
        __mmask16 lanes = nk_x512_tail_mask(depth - k);
        nk_x512_add_product_ps(
            _mm512_mul_ps(nk_x512_load16_half(dtype, a, k, lanes), nk_x512_load16_half(dtype, b, k, lanes)), &low,
            &high);
    }
    return nk_x512_reduce16(low, high);
}

/* ---- bfloat16 dot products from float32 products. ----
 * A product of two bfloat16 values (8-bit significands) is exact in float32 unless it overflows or
 * lands below float32's normal range; then the multiply raises the overflow or the underflow flag
 * (flush-to-zero is on meanwhile, so a tiny product always raises underflow and costs no microcode
 * assist). A batch multiplies in float32 with those flags cleared, widens and adds the products in
 * float64 with exceptions suppressed, so only the multiplies can raise them, and redoes any 8 dot
 * products after which a flag is up with nk_x512_dot_kernel's float64 products: same products, same
 * lanes, same bits. The caller's MXCSR (modes and flags) is restored on return.
 * A 32-bit word of two bfloat16 values holds the even element in its low half, so a shift and a mask
 * give the even and the odd elements as float32 without a shuffle; the even ones of a 32-element step
 * belong to lanes 0, 2, .., 14 of the canonical sum (twice: elements k + 2j and k + 16 + 2j), the odd
 * ones to 1, 3, .., 15. One core, 32 in a batch: depth 128 16.4 against 21.0 ns, depth 768 88 against
 * 117; all products tiny or huge 35.7 (every batch redone). GCC and Clang only (the MXCSR accesses are
 * asm statements, whose order the compiler keeps); MSVC builds take the float64 products. */
/* Even and odd elements of 32 bfloat16 values as float32: the low and the high half of each 32-bit word. */
NK_INLINE void nk_x512_bf16_split(__m512i words, __m512 *even, __m512 *odd) {
    *even = _mm512_castsi512_ps(_mm512_slli_epi32(words, 16));
    *odd = _mm512_castsi512_ps(_mm512_and_si512(words, _mm512_set1_epi32((int)0xFFFF0000u)));
}

#if defined(__GNUC__)
#define NK_X512_NEAREST (_MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC) /* a constant expression for clang */
NK_INLINE void nk_x512_bf16_sums(void const *a, void const *b, uint64_t depth, __m512d *even, __m512d *odd) {
    __m512d e = _mm512_setzero_pd(), o = _mm512_setzero_pd();
    for (uint64_t k = 0; k < depth; k += 32) {
        uint64_t left = depth - k;
        __mmask32 lanes = nk_x512_tail_mask32(left);
        __m512 xe, xo, ye, yo;
        nk_x512_bf16_split(_mm512_maskz_loadu_epi16(lanes, (uint16_t const *)a + k), &xe, &xo);
        nk_x512_bf16_split(_mm512_maskz_loadu_epi16(lanes, (uint16_t const *)b + k), &ye, &yo);
        __m512 pe = _mm512_mul_ps(xe, ye), po = _mm512_mul_ps(xo, yo);
        e = _mm512_add_round_pd(e, _mm512_cvtps_pd(_mm512_castps512_ps256(pe)), NK_X512_NEAREST);
        o = _mm512_add_round_pd(o, _mm512_cvtps_pd(_mm512_castps512_ps256(po)), NK_X512_NEAREST);
        if (left > 16) { /* the canonical order's next 16-element step */
            e = _mm512_add_round_pd(e, _mm512_cvtps_pd(_mm512_extractf32x8_ps(pe, 1)), NK_X512_NEAREST);
            o = _mm512_add_round_pd(o, _mm512_cvtps_pd(_mm512_extractf32x8_ps(po, 1)), NK_X512_NEAREST);
        }
    }
    *even = e, *odd = o;
}

static void nk_x512_dot_batch_bf16(void const *const *a, void const *const *b, unsigned n, uint64_t depth,
                                   double *out) {
    unsigned const flags = _MM_EXCEPT_OVERFLOW | _MM_EXCEPT_UNDERFLOW;
    unsigned caller, mode, raised;
    /* Own asm statements: volatile ones keep their order, and the memory operands pin the loads after
     * the flags are cleared and every product before they are read. */
    __asm__ volatile("stmxcsr %0" : "=m"(caller));
    mode = (caller & ~flags) | _MM_FLUSH_ZERO_ON;
    __asm__ volatile("ldmxcsr %0" : : "m"(mode) : "memory");
    for (unsigned c = 0; c < n; c += 8) {
        unsigned m = n - c < 8 ? n - c : 8;
        __m512d sums[16];
        for (unsigned k = 0; k < m; ++k) nk_x512_bf16_sums(a[c + k], b[c + k], depth, &sums[2 * k], &sums[2 * k + 1]);
        __asm__ volatile("stmxcsr %0" : "=m"(raised) : "m"(sums));
        if (raised & flags) {
            __asm__ volatile("ldmxcsr %0" : : "m"(caller) : "memory");
            for (unsigned k = 0; k < m; ++k)
                out[c + k] = nk_x512_dot_kernel(nk_dtype_bfloat16_k, a[c + k], nk_dtype_bfloat16_k, b[c + k], depth);
            __asm__ volatile("ldmxcsr %0" : : "m"(mode) : "memory");
            continue;
        }
        __m512i const low_lanes = _mm512_set_epi64(11, 3, 10, 2, 9, 1, 8, 0);
        __m512i const high_lanes = _mm512_set_epi64(15, 7, 14, 6, 13, 5, 12, 4);
        for (unsigned k = 0; k < m; ++k)
            out[c + k] = nk_x512_reduce16(_mm512_permutex2var_pd(sums[2 * k], low_lanes, sums[2 * k + 1]),
                                          _mm512_permutex2var_pd(sums[2 * k], high_lanes, sums[2 * k + 1]));
    }
    __asm__ volatile("ldmxcsr %0" : : "m"(caller) : "memory");
}
#else
static void nk_x512_dot_batch_bf16(void const *const *a, void const *const *b, unsigned n, uint64_t depth,
                                   double *out) {
    for (unsigned k = 0; k < n; ++k)
        out[k] = nk_x512_dot_kernel(nk_dtype_bfloat16_k, a[k], nk_dtype_bfloat16_k, b[k], depth);
}
#endif

/* ---- Exact integer dot products of fp6 rows. ----
 * Every e2m3 value is a multiple of 2^-3 and every e3m2 value one of 2^-4, at most 60 and 448 of
 * those units: an int16. A 32-entry word table turns a code's 5-bit magnitude into that integer,
 * vpmaddwd multiplies and adds pairs exactly, and an int32 lane holds the products of 4,096
 * elements (2 * 448^2 per pair, 2,048 pairs: < 2^31) before it is widened to float64, where the
 * whole sum (< 2^53) stays exact. Several times cheaper than decoding to floats. */
#define NK_X512_FP6_CHUNK 4096u

/* total + weight * (the 16 int32 lanes of `lanes`), in float64: exact while every partial sum stays
 * below 2^53 (weight a power of two). How the integer dot products fold each chunk. */
NK_INLINE __m512d nk_x512_add_lanes_pd(__m512d total, __m512i lanes, double weight) {
    __m512d scale = _mm512_set1_pd(weight);
    total = _mm512_fmadd_pd(_mm512_cvtepi32_pd(_mm512_castsi512_si256(lanes)), scale, total);
    return _mm512_fmadd_pd(_mm512_cvtepi32_pd(_mm512_extracti64x4_epi64(lanes, 1)), scale, total);
}

/* Magnitudes of the 32 codes without their sign bit, in units of the smallest subnormal. */
static inline __m512i nk_x512_fp6_table(int dtype) {
    static _Alignas(64) int16_t const e2m3[32] = {
        0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 18, 20, 22, 24, 26, 28, 30,
        32, 36, 40, 44, 48, 52, 56, 60}; /* e = c >> 3, m = c & 7: m or (8 + m) << (e - 1) */
    static _Alignas(64) int16_t const e3m2[32] = {
        0,  1,  2,  3,  4,  5,  6,  7,  8,  10, 12, 14, 16,  20,  24,  28,
        32, 40, 48, 56, 64, 80, 96, 112, 128, 160, 192, 224, 256, 320, 384, 448}; /* m or (4 + m) << (e - 1) */
    return _mm512_load_si512(dtype == nk_dtype_e2m3_k ? e2m3 : e3m2);
}

/* Elements k .. k+31 (`lanes` of them) of an fp6 row: magnitudes as int16, and which are negative. */
NK_INLINE __m512i nk_x512_load32_fp6(__m512i table, void const *row, uint64_t k, __mmask32 lanes,
                                          __mmask32 *negative) {
    __m512i codes = _mm512_cvtepu8_epi16(_mm256_maskz_loadu_epi8(lanes, (uint8_t const *)row + k));
    *negative = _mm512_test_epi16_mask(codes, _mm512_set1_epi16(0x20));
    return _mm512_permutexvar_epi16(codes, table); /* the index is the low 5 bits */
}

/* The int32 lane sums of the products of elements [k, end) of two stored fp6 rows (at most a chunk). */
NK_INLINE __m512i nk_x512_fp6_chunk_sums(__m512i table, void const *a, void const *b, uint64_t k, uint64_t end) {
    __m512i sum0 = _mm512_setzero_si512(), sum1 = _mm512_setzero_si512();
    for (; k + 64 <= end; k += 64) {
        __mmask32 negative_a0, negative_b0, negative_a1, negative_b1;
        __m512i a0 = nk_x512_load32_fp6(table, a, k, 0xFFFFFFFFu, &negative_a0);
        __m512i b0 = nk_x512_load32_fp6(table, b, k, 0xFFFFFFFFu, &negative_b0);
        __m512i a1 = nk_x512_load32_fp6(table, a, k + 32, 0xFFFFFFFFu, &negative_a1);
        __m512i b1 = nk_x512_load32_fp6(table, b, k + 32, 0xFFFFFFFFu, &negative_b1);
        b0 = _mm512_mask_sub_epi16(b0, negative_a0 ^ negative_b0, _mm512_setzero_si512(), b0);
        b1 = _mm512_mask_sub_epi16(b1, negative_a1 ^ negative_b1, _mm512_setzero_si512(), b1);
        sum0 = _mm512_add_epi32(sum0, _mm512_madd_epi16(a0, b0));
        sum1 = _mm512_add_epi32(sum1, _mm512_madd_epi16(a1, b1));
    }
    for (; k < end; k += 32) {
        __mmask32 lanes = nk_x512_tail_mask32(end - k), negative_a, negative_b;
        __m512i a0 = nk_x512_load32_fp6(table, a, k, lanes, &negative_a);
        __m512i b0 = nk_x512_load32_fp6(table, b, k, lanes, &negative_b);
        b0 = _mm512_mask_sub_epi16(b0, negative_a ^ negative_b, _mm512_setzero_si512(), b0);
        sum0 = _mm512_add_epi32(sum0, _mm512_madd_epi16(a0, b0));
    }
    return _mm512_add_epi32(sum0, sum1); /* at most 2 * 448^2 * 2,048 per lane: no overflow */
}

#if defined(__AVX512VNNI__) && defined(__AVX512VBMI__)
/* ---- fp6 dot products in bytes (VBMI + VNNI): the same int32 sums, so the same bits. ----
 * VBMI's byte permute turns 64 codes at once into byte values (the index is the code's low 6 bits,
 * so the sign bit picks the same entry), the product's sign goes onto b's side, and VNNI adds
 * groups of four byte products into int32 lanes.
 * e2m3: magnitudes of at most 60 units fit a byte: 8 vector operations per 64 elements where the
 * word table takes 24. icelake 32x180x128 e2m3, perf samples of the rescoring over those of the
 * unchanged screening: 0.188 -> 0.108 (1.7x faster).
 * e3m2: magnitudes of at most 448 units are two base-64 digits, and the four digit products are
 * high x high (weight 4096), the two cross products (64) and low x low (1). Over a chunk of 4,096
 * elements a lane holds at most 64 x 4 x 7^2 = 12,544 high products, 64 x 4 x 2 x 7 x 63 = 225,792
 * cross and 64 x 4 x 63^2 = 1,016,064 low: the folded sum stays below 2^27. 14 vector operations
 * per 64 elements against the word table's 24. A/B against the word table, e3m2 pairs: 32x180x128
 * 1.02 / 1.01, 32x512x768 1.06-1.08 / 1.03 (all families / Ice Lake class). */
#define NK_X512_FP6_BYTES 1
/* Entry c: of the magnitude of code c & 31 (nk_x512_fp6_table's rows), twice over. */
static _Alignas(64) uint8_t const nk_x512_fp6_bytes[3][64] = {
    /* e2m3 magnitude */
    {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 18, 20, 22, 24, 26, 28, 30, 32, 36, 40, 44, 48, 52, 56, 60,
     0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 18, 20, 22, 24, 26, 28, 30, 32, 36, 40, 44, 48, 52, 56, 60},
    /* e3m2 low digit */
    {0, 1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 14, 16, 20, 24, 28, 32, 40, 48, 56, 0, 16, 32, 48, 0, 32, 0, 32, 0, 0, 0, 0,
     0, 1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 14, 16, 20, 24, 28, 32, 40, 48, 56, 0, 16, 32, 48, 0, 32, 0, 32, 0, 0, 0, 0},
    /* e3m2 high digit */
    {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 3, 3, 4, 5, 6, 7,
     0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 3, 3, 4, 5, 6, 7}};

/* The first `left` of 64 byte lanes. */
NK_INLINE __mmask64 nk_x512_tail_mask64(uint64_t left) {
    return left >= 64 ? ~(__mmask64)0 : ((__mmask64)1 << left) - 1;
}

/* Codes k .. k+63 (`lanes` of them) of two fp6 rows, and which of their products are negative. */
NK_INLINE __mmask64 nk_x512_fp6_codes(void const *a, void const *b, uint64_t k, __mmask64 lanes, __m512i *codes_a,
                                      __m512i *codes_b) {
    *codes_a = _mm512_maskz_loadu_epi8(lanes, (uint8_t const *)a + k);
    *codes_b = _mm512_maskz_loadu_epi8(lanes, (uint8_t const *)b + k);
    return _mm512_test_epi8_mask(_mm512_xor_si512(*codes_a, *codes_b), _mm512_set1_epi8(0x20));
}

NK_INLINE __m512i nk_x512_e2m3_step(__m512i table, void const *a, void const *b, uint64_t k, __mmask64 lanes,
                                    __m512i sum) {
    __m512i codes_a, codes_b;
    __mmask64 negative = nk_x512_fp6_codes(a, b, k, lanes, &codes_a, &codes_b);
    __m512i magnitude_b = _mm512_permutexvar_epi8(codes_b, table);
    __m512i signed_b = _mm512_mask_sub_epi8(magnitude_b, negative, _mm512_setzero_si512(), magnitude_b);
    return _mm512_dpbusd_epi32(sum, _mm512_permutexvar_epi8(codes_a, table), signed_b);
}

/* nk_x512_fp6_chunk_sums for e2m3. */
NK_INLINE __m512i nk_x512_e2m3_chunk_sums(void const *a, void const *b, uint64_t k, uint64_t end) {
    __m512i table = _mm512_load_si512(nk_x512_fp6_bytes[0]);
    __m512i sum0 = _mm512_setzero_si512(), sum1 = _mm512_setzero_si512();
    for (; k + 128 <= end; k += 128) {
        sum0 = nk_x512_e2m3_step(table, a, b, k, ~(__mmask64)0, sum0);
        sum1 = nk_x512_e2m3_step(table, a, b, k + 64, ~(__mmask64)0, sum1);
    }
    for (; k < end; k += 64) sum0 = nk_x512_e2m3_step(table, a, b, k, nk_x512_tail_mask64(end - k), sum0);
    return _mm512_add_epi32(sum0, sum1);
}

/* nk_x512_fp6_chunk_sums for e3m2. */
NK_INLINE __m512i nk_x512_e3m2_chunk_sums(void const *a, void const *b, uint64_t k, uint64_t end) {
    __m512i low = _mm512_load_si512(nk_x512_fp6_bytes[1]), high = _mm512_load_si512(nk_x512_fp6_bytes[2]);
    __m512i high_high = _mm512_setzero_si512(), cross = _mm512_setzero_si512(), low_low = _mm512_setzero_si512();
    for (; k < end; k += 64) {
        __m512i codes_a, codes_b;
        __mmask64 negative = nk_x512_fp6_codes(a, b, k, nk_x512_tail_mask64(end - k), &codes_a, &codes_b);
        __m512i low_a = _mm512_permutexvar_epi8(codes_a, low), high_a = _mm512_permutexvar_epi8(codes_a, high);
        __m512i low_b = _mm512_permutexvar_epi8(codes_b, low), high_b = _mm512_permutexvar_epi8(codes_b, high);
        low_b = _mm512_mask_sub_epi8(low_b, negative, _mm512_setzero_si512(), low_b);
        high_b = _mm512_mask_sub_epi8(high_b, negative, _mm512_setzero_si512(), high_b);
        high_high = _mm512_dpbusd_epi32(high_high, high_a, high_b);
        cross = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(cross, high_a, low_b), low_a, high_b);
        low_low = _mm512_dpbusd_epi32(low_low, low_a, low_b);
    }
    return _mm512_add_epi32(_mm512_add_epi32(_mm512_slli_epi32(high_high, 12), _mm512_slli_epi32(cross, 6)), low_low);
}
#else
#define NK_X512_FP6_BYTES 0
#define nk_x512_e2m3_chunk_sums(a, b, k, end) _mm512_setzero_si512() /* never used */
#define nk_x512_e3m2_chunk_sums(a, b, k, end) _mm512_setzero_si512() /* never used */
#endif

/* The dot product of two stored fp6 rows, exactly (already scaled: not a half-image sum). */
NK_INLINE double nk_x512_dot_fp6(int dtype, void const *a, void const *b, uint64_t depth) {
    __m512i table = nk_x512_fp6_table(dtype);
    __m512d total = _mm512_setzero_pd();
    for (uint64_t chunk = 0; chunk < depth; chunk += NK_X512_FP6_CHUNK) {
        uint64_t end = depth - chunk < NK_X512_FP6_CHUNK ? depth : chunk + NK_X512_FP6_CHUNK;
        __m512i sums = !NK_X512_FP6_BYTES               ? nk_x512_fp6_chunk_sums(table, a, b, chunk, end)
                       : dtype == nk_dtype_e2m3_k ? nk_x512_e2m3_chunk_sums(a, b, chunk, end)
                                                   : nk_x512_e3m2_chunk_sums(a, b, chunk, end);
        total = nk_x512_add_lanes_pd(total, sums, 1.0);
    }
    double unit = dtype == nk_dtype_e2m3_k ? 0x1p-6 : 0x1p-8; /* the square of the unit */
    return _mm512_reduce_add_pd(total) * unit; /* integers below 2^53: exact in any order */
}

#if defined(__AVX512VNNI__) && defined(__AVX512VBMI__)
/* ---- Exact integer dot products of e4m3 rows. ----
 * Every e4m3 value is a multiple of 2^-9, at most 448 = 229,376 of those units (18 bits). VBMI's
 * two-register byte permute turns a code's 7-bit magnitude (the sign bit is ignored as an index) into
 * the three base-64 digits of that integer; VNNI multiplies one row's digits (unsigned) by the other's
 * (signed with the product's sign) and adds groups of four, the 9 digit pairs going to 5 accumulators
 * by weight 64^(i + j). Over 2,048 elements the folds low = acc0 + 64 acc1 and
 * high = acc2 + 64 acc3 + 4096 acc4 stay below 2^31 per lane (high: 32 steps of 4 products, at most
 * 4 (2 * 63 * 60 + 63^2) + 64 * 4 * 2 * 63 * 60 + 4096 * 4 * 60^2 each: 1.95e9, even for the NaN code
 * that packing never stores); each chunk is then added in float64, where the whole sum (< 2^53
 * units^2) stays exact. About two thirds of the cost of decoding to floats at depth 128, half at 768;
 * rows shorter than one step (64) are decoded instead. */
#define NK_X512_E4M3_INTEGER 1
#define NK_X512_E4M3_CHUNK 2048u
/* Magnitude code c in units: (8 + mantissa) << (exponent - 1), or the mantissa alone when the
 * exponent field is 0. The shift count is never negative, not even in the arm not taken. */
#define NK_X512_E4M3_UNITS(c) ((((c) & 7) + ((c) >> 3 ? 8 : 0)) << ((c) >> 3 ? ((c) >> 3) - 1 : 0))
#define NK_X512_E4M3_DIGIT(c, i) ((NK_X512_E4M3_UNITS(c) >> (6 * (i))) & 63)
#define NK_X512_E4M3_DIGITS8(c, i) \
    NK_X512_E4M3_DIGIT(c, i), NK_X512_E4M3_DIGIT(c + 1, i), NK_X512_E4M3_DIGIT(c + 2, i), \
        NK_X512_E4M3_DIGIT(c + 3, i), NK_X512_E4M3_DIGIT(c + 4, i), NK_X512_E4M3_DIGIT(c + 5, i), \
        NK_X512_E4M3_DIGIT(c + 6, i), NK_X512_E4M3_DIGIT(c + 7, i)
#define NK_X512_E4M3_DIGITS64(c, i) \
    NK_X512_E4M3_DIGITS8(c, i), NK_X512_E4M3_DIGITS8(c + 8, i), NK_X512_E4M3_DIGITS8(c + 16, i), \
        NK_X512_E4M3_DIGITS8(c + 24, i), NK_X512_E4M3_DIGITS8(c + 32, i), NK_X512_E4M3_DIGITS8(c + 40, i), \
        NK_X512_E4M3_DIGITS8(c + 48, i), NK_X512_E4M3_DIGITS8(c + 56, i)

/* Digit i of the 128 magnitudes: entry c at byte c. */
static _Alignas(64) uint8_t const nk_x512_e4m3_digits[3][128] = {
    {NK_X512_E4M3_DIGITS64(0, 0), NK_X512_E4M3_DIGITS64(64, 0)},
    {NK_X512_E4M3_DIGITS64(0, 1), NK_X512_E4M3_DIGITS64(64, 1)},
    {NK_X512_E4M3_DIGITS64(0, 2), NK_X512_E4M3_DIGITS64(64, 2)},
};

/* Rows shorter than one step, decoded. Out of line: inlined, GCC -O3 allocates the registers of the
 * digit loop below worse (measured 10-30 % slower at depth 128). */
static NK_NOINLINE double nk_x512_dot_e4m3_short(void const *a, void const *b, uint64_t depth) {
    return nk_x512_dot_halves(nk_dtype_e4m3_k, a, b, depth) * nk_half_scale_squared(nk_dtype_e4m3_k);
}

/* The dot product of two stored e4m3 rows, exactly (already scaled: not a half-image sum). */
NK_INLINE double nk_x512_dot_e4m3(void const *a, void const *b, uint64_t depth) {
    if (depth < 64) /* one step: the fold costs more than the decoding it saves (measured crossover) */
        return nk_x512_dot_e4m3_short(a, b, depth);
    __m512i low_table[3], high_table[3];
    for (int i = 0; i < 3; ++i) {
        low_table[i] = _mm512_load_si512(nk_x512_e4m3_digits[i]);
        high_table[i] = _mm512_load_si512(nk_x512_e4m3_digits[i] + 64);
    }
    __m512d total = _mm512_setzero_pd();
    for (uint64_t chunk = 0; chunk < depth; chunk += NK_X512_E4M3_CHUNK) {
        uint64_t end = depth - chunk < NK_X512_E4M3_CHUNK ? depth : chunk + NK_X512_E4M3_CHUNK;
        __m512i acc[5];
        for (int w = 0; w < 5; ++w) acc[w] = _mm512_setzero_si512();
        for (uint64_t k = chunk; k < end; k += 64) {
            __mmask64 lanes = end - k >= 64 ? ~(__mmask64)0 : ((__mmask64)1 << (end - k)) - 1u;
            __m512i x = _mm512_maskz_loadu_epi8(lanes, (uint8_t const *)a + k);
            __m512i y = _mm512_maskz_loadu_epi8(lanes, (uint8_t const *)b + k);
            __mmask64 negative = _mm512_movepi8_mask(_mm512_xor_si512(x, y));
            __m512i x_digit[3], y_digit[3];
#pragma GCC unroll 3
            for (int i = 0; i < 3; ++i) {
                x_digit[i] = _mm512_permutex2var_epi8(low_table[i], x, high_table[i]);
                y_digit[i] = _mm512_permutex2var_epi8(low_table[i], y, high_table[i]);
                y_digit[i] = _mm512_mask_sub_epi8(y_digit[i], negative, _mm512_setzero_si512(), y_digit[i]);
            }
#pragma GCC unroll 3
            for (int i = 0; i < 3; ++i)
#pragma GCC unroll 3
                for (int j = 0; j < 3; ++j) acc[i + j] = _mm512_dpbusd_epi32(acc[i + j], x_digit[i], y_digit[j]);
        }
        __m512i low = _mm512_add_epi32(acc[0], _mm512_slli_epi32(acc[1], 6));
        __m512i high = _mm512_add_epi32(_mm512_add_epi32(acc[2], _mm512_slli_epi32(acc[3], 6)),
                                        _mm512_slli_epi32(acc[4], 12));
        total = nk_x512_add_lanes_pd(nk_x512_add_lanes_pd(total, low, 1.0), high, 4096.0);
    }
    return _mm512_reduce_add_pd(total) * 0x1p-18; /* exact in any order; the square of the unit */
}

#else /* skylake: no byte permute or VNNI; decoded like e5m2 (exact all the same, see the bounds) */
#define NK_X512_E4M3_INTEGER 0
NK_INLINE double nk_x512_dot_e4m3(void const *a, void const *b, uint64_t depth) {
    return nk_x512_dot_halves(nk_dtype_e4m3_k, a, b, depth) * nk_half_scale_squared(nk_dtype_e4m3_k);
}
#endif

/* Formats whose dot products are exact integer sums here: never decoded to floats for rescoring, and
 * their float32 checks are replaced by the exact cosine (no dearer). */
static inline int nk_x512_is_integer(int dtype) {
    return (NK_X512_E4M3_INTEGER && dtype == nk_dtype_e4m3_k) || dtype == nk_dtype_e2m3_k || dtype == nk_dtype_e3m2_k;
}

/* Dot product of a decoded (float64, unscaled) query row with a stored document row. */
static inline double nk_x512_dot_decoded(int dtype, double const *a, void const *b, uint64_t depth) {
    switch (dtype) {
#define NK_X512_DECODED(format) \
    case format: return nk_x512_dot_kernel(nk_dtype_float64_k, a, format, b, depth) * nk_half_scale_squared(format);
        NK_X512_DECODED(nk_dtype_float64_k)
        NK_X512_DECODED(nk_dtype_float32_k)
        NK_X512_DECODED(nk_dtype_float16_k)
        NK_X512_DECODED(nk_dtype_bfloat16_k)
        NK_X512_DECODED(nk_dtype_e4m3_k)
        NK_X512_DECODED(nk_dtype_e5m2_k)
        NK_X512_DECODED(nk_dtype_e2m3_k)
        NK_X512_DECODED(nk_dtype_e3m2_k)
#undef NK_X512_DECODED
    default: return 0.0;
    }
}

/* out[k] = dot product of stored rows a[k] and b[k], k < n: one loop per format, so consecutive dot
 * products are independent straight-line work that the core overlaps. */
static inline void nk_x512_dot_batch(int dtype, void const *const *a, void const *const *b, unsigned n, uint64_t depth,
                              double *out) {
    switch (dtype) {
#define NK_X512_BATCH(format, expression) \
    case format: \
        for (unsigned k = 0; k < n; ++k) out[k] = expression; \
        return;
        NK_X512_BATCH(nk_dtype_float64_k, nk_x512_dot_kernel(nk_dtype_float64_k, a[k], nk_dtype_float64_k, b[k], depth))
        NK_X512_BATCH(nk_dtype_float32_k, nk_x512_dot_kernel(nk_dtype_float32_k, a[k], nk_dtype_float32_k, b[k], depth))
        case nk_dtype_bfloat16_k: nk_x512_dot_batch_bf16(a, b, n, depth, out); return;
    case nk_dtype_float16_k: {
        unsigned k = 0;
        for (; k + 2 <= n; k += 2) nk_x512_dot_f16_rows(a + k, b + k, 2, depth, out + k);
        if (k < n) nk_x512_dot_f16_rows(a + k, b + k, 1, depth, out + k);
        return;
    }
        NK_X512_BATCH(nk_dtype_e4m3_k, nk_x512_dot_e4m3(a[k], b[k], depth))
        NK_X512_BATCH(nk_dtype_e5m2_k, nk_x512_dot_halves(nk_dtype_e5m2_k, a[k], b[k], depth) *
                                           nk_half_scale_squared(nk_dtype_e5m2_k))
        NK_X512_BATCH(nk_dtype_e2m3_k, nk_x512_dot_fp6(nk_dtype_e2m3_k, a[k], b[k], depth))
        NK_X512_BATCH(nk_dtype_e3m2_k, nk_x512_dot_fp6(nk_dtype_e3m2_k, a[k], b[k], depth))
#undef NK_X512_BATCH
    default:
        for (unsigned k = 0; k < n; ++k) out[k] = 0.0;
    }
}

/* Dot product of two stored rows: a batch of one, so each format's dot product is named once. */
static inline double nk_x512_dot_stored(int dtype, void const *a, void const *b, uint64_t depth) {
    double dot;
    nk_x512_dot_batch(dtype, &a, &b, 1, depth, &dot);
    return dot;
}

/* Decode a stored row into float64 (unscaled), padded with zeros to a multiple of 16. */
static inline void nk_x512_decode_row(int dtype, void const *row, uint64_t depth, double *out) {
    for (uint64_t k = 0; k < depth; k += 16) {
        __m512d low, high;
        nk_x512_load16(dtype, row, k, nk_x512_tail_mask(depth - k), &low, &high);
        _mm512_store_pd(out + k, low);
        _mm512_store_pd(out + k + 8, high);
    }
}

/* ---- Float32 cosines with a proven error bound. ----
 * Every format but float64 is exact in float32, so a float32 FMA dot product is off only by its own
 * rounding: with m = the most roundings any product goes through, |error| <= gamma_m sum |a_k b_k|
 * (gamma_m = m u / (1 - m u), u = 2^-24) plus 2^-149 per operation below the normal range, and
 * sum |a_k b_k| <= |a| |b| = 1 / (inv_q inv_d) (up to the rounding of the stored inverse norms,
 * covered by a factor 1.0001). The float64 cosine the contract uses differs from the real one by
 * less than (depth + 8) 2^-52, which the slack adds too. A non-finite sum means over- or underflow
 * and no bound at all. It costs about a quarter of the float64 dot product: cos + slack below the
 * best exact cosine rules a candidate out. */

/* 16 elements of a row as float32 (minifloats as their unscaled half images). */
NK_INLINE __m512 nk_x512_load16_f32(int dtype, void const *row, uint64_t k, __mmask16 lanes) {
    switch (dtype) {
    case nk_dtype_float32_k: return _mm512_maskz_loadu_ps(lanes, (float const *)row + k);
    case nk_dtype_bfloat16_k:
        return _mm512_castsi512_ps(
            _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(lanes, (uint16_t const *)row + k)), 16));
    default: return nk_x512_load16_half(dtype, row, k, lanes);
    }
}

/* The float32 dot product of two stored rows of `dtype`. */
NK_INLINE float nk_x512_dot_f32_kernel(int dtype, void const *a, void const *b, uint64_t depth) {
    __m512 sum0 = _mm512_setzero_ps(), sum1 = _mm512_setzero_ps(), sum2 = _mm512_setzero_ps(), sum3 = sum0;
    uint64_t k = 0;
    if (dtype == nk_dtype_bfloat16_k) {
        /* Even and odd elements in their own sums, split with a shift and a mask rather than widened
         * (32x512x768: float32 checks are a quarter of the call); each lane still takes one product
         * per 64 elements, and at most two in the tail. */
        __m512 xe, xo, ye, yo;
        for (; k + 64 <= depth; k += 64) {
            nk_x512_bf16_split(_mm512_loadu_si512((uint16_t const *)a + k), &xe, &xo);
            nk_x512_bf16_split(_mm512_loadu_si512((uint16_t const *)b + k), &ye, &yo);
            sum0 = _mm512_fmadd_ps(xe, ye, sum0);
            sum1 = _mm512_fmadd_ps(xo, yo, sum1);
            nk_x512_bf16_split(_mm512_loadu_si512((uint16_t const *)a + k + 32), &xe, &xo);
            nk_x512_bf16_split(_mm512_loadu_si512((uint16_t const *)b + k + 32), &ye, &yo);
            sum2 = _mm512_fmadd_ps(xe, ye, sum2);
            sum3 = _mm512_fmadd_ps(xo, yo, sum3);
        }
        for (; k < depth; k += 32) { /* masked: an absent element reads as zero, never past the row */
            __mmask32 lanes = nk_x512_tail_mask32(depth - k);
            nk_x512_bf16_split(_mm512_maskz_loadu_epi16(lanes, (uint16_t const *)a + k), &xe, &xo);
            nk_x512_bf16_split(_mm512_maskz_loadu_epi16(lanes, (uint16_t const *)b + k), &ye, &yo);
            sum0 = _mm512_fmadd_ps(xe, ye, sum0);
            sum1 = _mm512_fmadd_ps(xo, yo, sum1);
        }
        return _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(sum0, sum1), _mm512_add_ps(sum2, sum3)));
    }
    for (; k + 64 <= depth; k += 64) {
        sum0 = _mm512_fmadd_ps(nk_x512_load16_f32(dtype, a, k, 0xFFFF), nk_x512_load16_f32(dtype, b, k, 0xFFFF), sum0);
        sum1 = _mm512_fmadd_ps(nk_x512_load16_f32(dtype, a, k + 16, 0xFFFF),
                               nk_x512_load16_f32(dtype, b, k + 16, 0xFFFF), sum1);
        sum2 = _mm512_fmadd_ps(nk_x512_load16_f32(dtype, a, k + 32, 0xFFFF),
                               nk_x512_load16_f32(dtype, b, k + 32, 0xFFFF), sum2);
        sum3 = _mm512_fmadd_ps(nk_x512_load16_f32(dtype, a, k + 48, 0xFFFF),
                               nk_x512_load16_f32(dtype, b, k + 48, 0xFFFF), sum3);
    }
    for (; k < depth; k += 16) {
        __mmask16 lanes = nk_x512_tail_mask(depth - k);
        sum0 = _mm512_fmadd_ps(nk_x512_load16_f32(dtype, a, k, lanes), nk_x512_load16_f32(dtype, b, k, lanes), sum0);
    }
    return _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(sum0, sum1), _mm512_add_ps(sum2, sum3)));
}

/* The cosine of two stored rows (inv_d > 0) from a float32 dot product, and in *slack how far the
 * exact cosine can be from it: +inf when nothing can be said. Two rows of an integer format
 * (nk_x512_is_integer) get the exact cosine and a slack of 0. */
static inline double nk_x512_cosine_f32(int dtype, void const *a, void const *b, uint64_t depth, double inv_q,
                                        double inv_d, double *slack) {
    if (nk_x512_is_integer(dtype)) { /* exact, and no dearer than the float32 sum */
        *slack = 0.0;
        return nk_x512_dot_stored(dtype, a, b, depth) * inv_q * inv_d;
    }
    *slack = INFINITY;
    float sum;
    switch (dtype) {
#define NK_X512_DOT_F32(format) \
    case format: \
        sum = nk_x512_dot_f32_kernel(format, a, b, depth); \
        break;
        NK_X512_DOT_F32(nk_dtype_float32_k)
        NK_X512_DOT_F32(nk_dtype_bfloat16_k)
        NK_X512_DOT_F32(nk_dtype_float16_k)
        NK_X512_DOT_F32(nk_dtype_e4m3_k)
        NK_X512_DOT_F32(nk_dtype_e5m2_k)
        NK_X512_DOT_F32(nk_dtype_e2m3_k)
        NK_X512_DOT_F32(nk_dtype_e3m2_k)
#undef NK_X512_DOT_F32
    default: return 0.0; /* float64 does not fit float32 */
    }
    if (!(sum - sum == 0.0f)) return 0.0;
    /* Roundings per product: the chain of one accumulator lane, the tail, and a generous 24 for
     * combining accumulators and lanes in any order. */
    double roundings = (double)(depth / 64 + 1) + 24.0, unit = 0x1p-24;
    double gamma = roundings * unit / (1.0 - roundings * unit);
    double scale = nk_half_scale_squared(dtype) * inv_q * inv_d;
    double underflow = (double)(depth + 64) * 0x1p-149 * scale, contract = (double)(depth + 8) * 0x1p-52;
    *slack = gamma * 1.0001 + underflow + contract;
    return (double)sum * scale;
}

#endif /* NUMKONG_X86_AVX512_DOT_H */
