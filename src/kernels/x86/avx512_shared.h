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

/* The tile and lane of the largest of 16 tagged per-lane maxima; 0 when there is none (NaN bounds,
 * which only sections changed after validation produce). */
NK_INLINE int nk_x512_tagged_top(__m512 top, unsigned *tile, unsigned *lane) {
    float largest = _mm512_reduce_max_ps(top);
    int32_t bits;
    memcpy(&bits, &largest, sizeof bits);
    unsigned at = (unsigned)_mm512_cmp_ps_mask(top, _mm512_set1_ps(largest), _CMP_EQ_OQ);
    if (!at) return 0;
    *lane = nk_ctz32(at);
    *tile = (unsigned)(bits & NK_X512_TAG_BITS);
    return 1;
}

/* Each row's top document of a block of `docs` from its 16 tagged per-lane maxima (tops[r], 64-byte
 * aligned), as driver.h's screen primitive reports it: -1 when there is none. */
NK_INLINE void nk_x512_read_tops(float const (*tops)[16], uint64_t rows, uint64_t docs, int32_t *top) {
    for (uint64_t r = 0; r < rows; ++r) {
        unsigned tile, lane;
        top[r] = nk_x512_tagged_top(_mm512_load_ps(tops[r]), &tile, &lane) && 16u * tile + lane < docs
                     ? (int32_t)(16u * tile + lane)
                     : -1;
    }
}

/* ---- Collecting candidates. ---- */

/* Append the lanes of `upper` (tile t) that reach the cut to the candidate list, which has room
 * for 16 more. Compressing in registers and storing whole vectors is much faster than the
 * memory form of vcompressps. */
NK_INLINE unsigned nk_x512_collect(__m512 upper, __mmask16 candidates, uint64_t t, float *list_upper,
                                      int32_t *list_doc, unsigned count) {
    __m512i lane_index = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    _mm512_storeu_ps(list_upper + count, _mm512_maskz_compress_ps(candidates, upper));
    __m512i docs = _mm512_add_epi32(lane_index, _mm512_set1_epi32((int)(16 * t)));
    _mm512_storeu_si512(list_doc + count, _mm512_maskz_compress_epi32(candidates, docs));
    return count + nk_popcount32(candidates);
}

/* Collect the documents of tiles [*tile, tiles) whose stored upper bound reaches the cut, until the
 * list could overflow; *tile is left where the scan stopped (tiles when it finished). Four tiles
 * per test keep the common no-candidate case to one branch. Inlined: it runs once per query row,
 * and the call cost 2-4 % at 32x180x128 (icelake). The scan of driver.h's AVX-512 families. */
NK_INLINE unsigned nk_x512_scan(float const *row_scores, uint64_t *tile, uint64_t tiles, float cut,
                               float *list_upper, int32_t *list_doc, unsigned capacity) {
    __m512 cut_vector = _mm512_set1_ps(cut);
    unsigned count = 0;
    uint64_t t = *tile;
    for (; t + 4 <= tiles; t += 4) {
        __mmask16 hit[4];
        __m512 upper[4];
#pragma GCC unroll 4
        for (int u = 0; u < 4; ++u) {
            upper[u] = _mm512_load_ps(row_scores + 16 * (t + (uint64_t)u));
            hit[u] = _mm512_cmp_ps_mask(upper[u], cut_vector, _CMP_GE_OQ);
        }
        if (!(hit[0] | hit[1] | hit[2] | hit[3])) continue;
#pragma GCC unroll 4
        for (int u = 0; u < 4; ++u) {
            if (!hit[u]) continue;
            if (count + 16 > capacity) {
                *tile = t + (uint64_t)u;
                return count;
            }
            count = nk_x512_collect(upper[u], hit[u], t + (uint64_t)u, list_upper, list_doc, count);
        }
    }
    for (; t < tiles; ++t) {
        __m512 upper = _mm512_load_ps(row_scores + 16 * t);
        __mmask16 hit = _mm512_cmp_ps_mask(upper, cut_vector, _CMP_GE_OQ);
        if (!hit) continue;
        if (count + 16 > capacity) break;
        count = nk_x512_collect(upper, hit, t, list_upper, list_doc, count);
    }
    *tile = t;
    return count;
}


#endif /* NUMKONG_X86_AVX512_SHARED_H */
