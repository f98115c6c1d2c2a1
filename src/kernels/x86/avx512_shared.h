/* AVX-512 helpers the AVX-512 families share for driver.h's primitives: tagged screening bounds
 * (a block's per-row top document) and the candidate scan. */
#ifndef NUMKONG_X86_AVX512_SHARED_H
#define NUMKONG_X86_AVX512_SHARED_H
#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "avx512_dot.h"
#include "maxsim_internal.h"

/* ---- Tagged screening bounds. ----
 * A kernel that wants to rescore each row's largest upper bound first keeps per-lane maxima of its
 * bounds with the low 6 mantissa bits replaced by the bound's 16-row tile within the block (up to
 * 64 tiles): the maximum of tagged bounds names a document whose bound is within 2^-17 (relative)
 * of the largest. Tags only choose that document; cuts compare the stored, untagged bounds. */
#define NK_X512_TAG_BITS 0x3F

NK_INLINE __m512 nk_x512_tag(__m512 upper, unsigned tile) {
    return _mm512_castsi512_ps(_mm512_ternarylogic_epi32(
        _mm512_castps_si512(upper), _mm512_set1_epi32(~NK_X512_TAG_BITS), _mm512_set1_epi32((int)tile), 0xEA));
}

/* The largest lane of each of 8 vectors, that of v[r] in lanes 4 (r % 4) + 2 (r / 4) and the next: a
 * tree of 128-bit and in-lane shuffles over all 8 at once (15 shuffles and 8 maxima, against 32 and
 * 32 for 8 reductions of one vector each). Without NaNs the order does not change the maximum. */
NK_INLINE __m512 nk_x512_max8(__m512 const v[8]) {
    __m512 pairs[4], quads[2];
#pragma GCC unroll 4
    for (int p = 0; p < 4; ++p) /* lanes 0-7: v[2p], 8-15: v[2p + 1] */
        pairs[p] = _mm512_max_ps(_mm512_shuffle_f32x4(v[2 * p], v[2 * p + 1], 0x44),
                                 _mm512_shuffle_f32x4(v[2 * p], v[2 * p + 1], 0xEE));
#pragma GCC unroll 2
    for (int p = 0; p < 2; ++p) /* 128-bit lane j: v[4p + j] */
        quads[p] = _mm512_max_ps(_mm512_shuffle_f32x4(pairs[2 * p], pairs[2 * p + 1], 0x88),
                                 _mm512_shuffle_f32x4(pairs[2 * p], pairs[2 * p + 1], 0xDD));
    __m512 halves = _mm512_max_ps(_mm512_shuffle_ps(quads[0], quads[1], 0x44), _mm512_shuffle_ps(quads[0], quads[1], 0xEE));
    return _mm512_max_ps(halves, _mm512_shuffle_ps(halves, halves, 0xB1));
}

/* Each row's top document of a block of `docs` from its 16 tagged per-lane maxima (tops[r], 64-byte
 * aligned), as driver.h's screen primitive reports it: the tile of the largest tagged maximum and the
 * first lane holding it, or -1 when there is none (NaN bounds, which only sections changed after
 * validation produce). 8 rows at a time (nk_x512_max8): icelake's 8 rows took 39 against 50 TSC
 * cycles with one reduction per row. */
NK_INLINE void nk_x512_read_tops(float const (*tops)[16], uint64_t rows, uint64_t docs, int32_t *top) {
    for (uint64_t first = 0; first < rows; first += 8) {
        unsigned count = rows - first < 8 ? (unsigned)(rows - first) : 8u;
        __m512 v[8];
        _Alignas(64) float largest[16];
#pragma GCC unroll 8
        for (unsigned i = 0; i < 8; ++i) v[i] = i < count ? _mm512_load_ps(tops[first + i]) : _mm512_set1_ps(-INFINITY);
        _mm512_store_ps(largest, nk_x512_max8(v));
        for (unsigned i = 0; i < count; ++i) {
            float value = largest[4 * (i % 4) + 2 * (i / 4)];
            int32_t bits;
            memcpy(&bits, &value, sizeof bits);
            unsigned at = (unsigned)_mm512_cmp_ps_mask(v[i], _mm512_set1_ps(value), _CMP_EQ_OQ);
            unsigned doc = 16u * (unsigned)(bits & NK_X512_TAG_BITS) + nk_ctz32(at | 0x10000u);
            top[first + i] = at && doc < docs ? (int32_t)doc : -1;
        }
    }
}

/* ---- A group's constants. ----
 * driver.h's per-row constants eight rows at a time with masked loads, the same operations as its
 * scalar loop (so the same bits): that loop, its rows read one by one, took 3% of icelake's
 * 32x180x128 call (four groups of 8 rows). */
NK_INLINE void nk_x512_group_constants(nk_maxsim_view_t const *q, uint64_t first, uint64_t rows, unsigned group_rows,
                                       uint32_t *live, double *inv_scale, double *offset, float *growth) {
    __m512d one = _mm512_set1_pd(1.0), zero = _mm512_setzero_pd();
    *live = 0;
    for (unsigned r0 = 0; r0 < group_rows; r0 += 8) {
        uint64_t left = rows > r0 ? rows - r0 : 0;
        __mmask8 present = left >= 8 ? (__mmask8)0xFF : (__mmask8)((1u << left) - 1u);
        /* != 0.0, as the scalar test: true for NaN too */
        __mmask8 nonzero = _mm512_mask_cmp_pd_mask(present, _mm512_maskz_loadu_pd(present, q->inv_norms + first + r0),
                                                   zero, _CMP_NEQ_UQ);
        __m512d error = _mm512_maskz_cvtps_pd(nonzero, _mm256_maskz_loadu_ps(nonzero, q->screen_errors + first + r0));
        __m512d scale = _mm512_mask_cvtps_pd(one, nonzero, _mm256_maskz_loadu_ps(nonzero, q->screen_scales + first + r0));
        scale = _mm512_mask_blend_pd(_mm512_cmp_pd_mask(scale, zero, _CMP_GT_OQ), _mm512_set1_pd(0x1p-126), scale);
        __m512d inverse = _mm512_div_pd(one, scale);
        _mm512_storeu_pd(inv_scale + r0, inverse);
        _mm512_storeu_pd(offset + r0, _mm512_add_pd(error, _mm512_set1_pd((double)nk_screen_slack_k)));
        _mm256_storeu_ps(growth + r0, _mm512_cvtpd_ps(_mm512_mul_pd(_mm512_add_pd(one, error), inverse)));
        *live |= (uint32_t)nonzero << r0;
    }
}
#define nk_family_group_constants nk_x512_group_constants

/* ---- Collecting candidates. ---- */

/* driver.h's compares, one mask bit per document. The scan is inlined: it runs once per query row,
 * and a call cost 2-4 % at 32x180x128 (icelake). */
NK_INLINE int nk_x512_any_hit4(float const *tile_u, __m512 cut) {
    return (_mm512_cmp_ps_mask(_mm512_load_ps(tile_u), cut, _CMP_GE_OQ) |
            _mm512_cmp_ps_mask(_mm512_load_ps(tile_u + 16), cut, _CMP_GE_OQ) |
            _mm512_cmp_ps_mask(_mm512_load_ps(tile_u + 32), cut, _CMP_GE_OQ) |
            _mm512_cmp_ps_mask(_mm512_load_ps(tile_u + 48), cut, _CMP_GE_OQ)) != 0;
}

NK_INLINE uint64_t nk_x512_hit_bits(float const *tile_u, __m512 cut) {
    return _mm512_cmp_ps_mask(_mm512_load_ps(tile_u), cut, _CMP_GE_OQ);
}

/* Append a tile's hits to the candidate lists, which have room for 16 more. Compressing in
 * registers and storing whole vectors is much faster than the memory form of vcompressps. */
NK_INLINE unsigned nk_x512_collect(float const *tile_u, uint64_t bits, uint64_t first_doc, float *list_u,
                                   int32_t *list_doc, unsigned count) {
    __mmask16 hits = (__mmask16)bits;
    __m512i docs = _mm512_add_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                    _mm512_set1_epi32((int)first_doc));
    _mm512_storeu_ps(list_u + count, _mm512_maskz_compress_ps(hits, _mm512_load_ps(tile_u)));
    _mm512_storeu_si512(list_doc + count, _mm512_maskz_compress_epi32(hits, docs));
    return count + nk_popcount32(hits);
}

/* The compares and collection of driver.h's AVX-512 families. */
#define nk_family_cut_t __m512
#define nk_family_cut _mm512_set1_ps
#define nk_family_any_hit4 nk_x512_any_hit4
#define nk_family_hit_bits nk_x512_hit_bits
#define nk_family_collect nk_x512_collect
#define NK_FAMILY_BITS_PER_DOC 1

#endif /* NUMKONG_X86_AVX512_SHARED_H */
