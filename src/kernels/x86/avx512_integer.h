/* integer_maxsim.h's primitives with AVX-512 VNNI and VPOPCNTDQ (icelake, sapphireamx).
 *
 * One 64-byte load holds one stored word of 16 documents (a full tile); each query row's word is a
 * 32-bit broadcast. Per stored word and query row: int8 one vpdpbusd (u8 document codes x s8
 * query), int4 two (the low and high nibbles, masked out of the same load), uint1 an xor and a
 * vpopcntd. Two tiles at a time keep 16 independent accumulators in flight. */
#ifndef NUMKONG_X86_AVX512_INTEGER_H
#define NUMKONG_X86_AVX512_INTEGER_H
#include <immintrin.h>

#include "maxsim_internal.h"

/* acc[r][t] += stored word w of `tiles` tiles (`lanes` rows each, 64-byte words `stride` bytes apart)
 * against every query row's prepared word(s). */
NK_INLINE void nk_x512_integer_step(int dtype, int32_t const *words, uint8_t const *at, uint64_t stride, int tiles,
                                    __mmask16 lanes, __m512i acc[NK_INTEGER_ROWS][2]) {
    __m512i x[2];
    for (int t = 0; t < tiles; ++t) x[t] = _mm512_maskz_loadu_epi32(lanes, at + (uint64_t)t * stride);
    if (dtype == nk_dtype_uint1_k) {
#pragma GCC unroll 8
        for (unsigned r = 0; r < NK_INTEGER_ROWS; ++r) {
            __m512i query = _mm512_set1_epi32(words[r]);
            for (int t = 0; t < tiles; ++t)
                acc[r][t] = _mm512_add_epi32(acc[r][t], _mm512_popcnt_epi32(_mm512_xor_si512(x[t], query)));
        }
        return;
    }
    if (dtype == nk_dtype_int8_k) {
#pragma GCC unroll 8
        for (unsigned r = 0; r < NK_INTEGER_ROWS; ++r) {
            __m512i query = _mm512_set1_epi32(words[r]);
            for (int t = 0; t < tiles; ++t) acc[r][t] = _mm512_dpbusd_epi32(acc[r][t], x[t], query);
        }
        return;
    }
    __m512i nibble = _mm512_set1_epi8(0x0F), low[2], high[2];
    for (int t = 0; t < tiles; ++t) {
        low[t] = _mm512_and_si512(x[t], nibble);
        high[t] = _mm512_and_si512(_mm512_srli_epi16(x[t], 4), nibble);
    }
#pragma GCC unroll 8
    for (unsigned r = 0; r < NK_INTEGER_ROWS; ++r) {
        __m512i query_low = _mm512_set1_epi32(words[r]), query_high = _mm512_set1_epi32(words[NK_INTEGER_ROWS + r]);
        for (int t = 0; t < tiles; ++t)
            acc[r][t] = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(acc[r][t], low[t], query_low), high[t], query_high);
    }
}

/* integer_maxsim.h's prepared words of a query group: the group's 8 rows of one stored word are 32
 * adjacent bytes; their signed bytes are stored as they are (int8) or as two words of nibbles (int4),
 * and summed by vpdpbusd against bytes of 1. */
static void nk_x512_integer_prepare(int dtype, uint8_t const *source, uint64_t step, uint64_t rows, uint64_t count,
                                    int32_t *words, int32_t *bias) {
    __mmask8 present = rows >= 8 ? (__mmask8)0xFF : (__mmask8)((1u << rows) - 1u);
    __mmask32 present_bytes = rows >= 8 ? (__mmask32)0xFFFFFFFFu : (__mmask32)((1u << (4 * rows)) - 1u);
    __m256i sums = _mm256_setzero_si256(), ones = _mm256_set1_epi8(1), nibble = _mm256_set1_epi8(0x0F);
    __m256i eight = _mm256_set1_epi8(8), flip = _mm256_set1_epi8((char)0x80);
    for (uint64_t w = 0; w < count; ++w, source += step) {
        __m256i raw = _mm256_maskz_loadu_epi32(present, source);
        if (dtype == nk_dtype_int8_k) {
            __m256i q8 = _mm256_maskz_xor_epi32(present, raw, flip);
            _mm256_storeu_si256((__m256i *)(words + w * NK_INTEGER_ROWS), q8);
            sums = _mm256_dpbusd_epi32(sums, ones, q8);
        }
        else if (dtype == nk_dtype_int4_k) {
            __m256i low = _mm256_maskz_sub_epi8(present_bytes, _mm256_and_si256(raw, nibble), eight);
            __m256i high = _mm256_maskz_sub_epi8(present_bytes, _mm256_and_si256(_mm256_srli_epi16(raw, 4), nibble), eight);
            _mm256_storeu_si256((__m256i *)(words + 2 * w * NK_INTEGER_ROWS), low);
            _mm256_storeu_si256((__m256i *)(words + (2 * w + 1) * NK_INTEGER_ROWS), high);
            sums = _mm256_dpbusd_epi32(_mm256_dpbusd_epi32(sums, ones, low), ones, high);
        }
        else
            _mm256_storeu_si256((__m256i *)(words + w * NK_INTEGER_ROWS), raw);
    }
    int offset = dtype == nk_dtype_int8_k ? 128 : dtype == nk_dtype_int4_k ? 8 : 0;
    _mm256_storeu_si256((__m256i *)bias, _mm256_mullo_epi32(sums, _mm256_set1_epi32(offset)));
}

/* Per-lane running bests of a group's rows over one block: float64 cosines (two vectors of 8 per
 * row, for a tile's lanes 0-7 and 8-15) or, for uint1, int32 Hamming distances. */
typedef struct nk_x512_integer_best {
    __m512d cos[NK_INTEGER_ROWS][2];
    __m512i least[NK_INTEGER_ROWS];
} nk_x512_integer_best_t;

/* `tiles` (1 or 2) adjacent tiles of `rows_in_tile` rows starting at tile `tile` of the block. With
 * `finish` the sums go straight into the running bests (lanes past the block's documents masked),
 * else into dots. */
NK_INLINE void nk_x512_integer_tiles(int dtype, int32_t const *words, nk_maxsim_view_t const *d, uint64_t first_doc,
                                     uint64_t tile, int tiles, unsigned rows_in_tile, uint64_t first_word,
                                     uint64_t count, int accumulate, int finish, int32_t const *bias,
                                     double const *inv_q, double const *inv_d, int32_t *dots,
                                     nk_x512_integer_best_t *best) {
    uint64_t absolute = first_doc / NK_SCREEN_TILE + tile;
    uint64_t stride = NK_SCREEN_TILE * d->row_bytes, step = 4u * rows_in_tile;
    uint8_t const *at = (uint8_t const *)d->values + absolute * stride + first_word * step;
    __mmask16 lanes = rows_in_tile >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << rows_in_tile) - 1u);
    unsigned per_word = dtype == nk_dtype_int4_k ? 2u : 1u;
    __m512i acc[NK_INTEGER_ROWS][2];
#pragma GCC unroll 8
    for (unsigned r = 0; r < NK_INTEGER_ROWS; ++r)
        for (int t = 0; t < tiles; ++t)
            acc[r][t] = _mm512_sub_epi32(accumulate ? _mm512_loadu_si512(dots + r * NK_INTEGER_BLOCK +
                                                                          16 * (tile + (uint64_t)t))
                                                    : _mm512_setzero_si512(),
                                         _mm512_set1_epi32(bias[r]));
    for (uint64_t w = 0; w < count; ++w, at += step)
        nk_x512_integer_step(dtype, words + w * per_word * NK_INTEGER_ROWS, at, stride, tiles, lanes, acc);
    if (!finish) {
#pragma GCC unroll 8
        for (unsigned r = 0; r < NK_INTEGER_ROWS; ++r)
            for (int t = 0; t < tiles; ++t)
                _mm512_storeu_si512(dots + r * NK_INTEGER_BLOCK + 16 * (tile + (uint64_t)t), acc[r][t]);
        return;
    }
    if (dtype == nk_dtype_uint1_k) {
#pragma GCC unroll 8
        for (unsigned r = 0; r < NK_INTEGER_ROWS; ++r)
            for (int t = 0; t < tiles; ++t)
                best->least[r] = _mm512_mask_min_epi32(best->least[r], lanes, best->least[r], acc[r][t]);
        return;
    }
    for (int t = 0; t < tiles; ++t) {
        double const *norms = inv_d + 16 * (tile + (uint64_t)t);
        __mmask8 low_lanes = (__mmask8)lanes, high_lanes = (__mmask8)(lanes >> 8);
        __m512d inv_low = _mm512_maskz_loadu_pd(low_lanes, norms), inv_high = _mm512_maskz_loadu_pd(high_lanes, norms + 8);
#pragma GCC unroll 8
        for (unsigned r = 0; r < NK_INTEGER_ROWS; ++r) {
            __m512d scale = _mm512_set1_pd(inv_q[r]);
            __m512d low = _mm512_mul_pd(_mm512_mul_pd(_mm512_cvtepi32_pd(_mm512_castsi512_si256(acc[r][t])), scale),
                                        inv_low);
            __m512d high = _mm512_mul_pd(
                _mm512_mul_pd(_mm512_cvtepi32_pd(_mm512_extracti64x4_epi64(acc[r][t], 1)), scale), inv_high);
            best->cos[r][0] = _mm512_mask_max_pd(best->cos[r][0], low_lanes, best->cos[r][0], low);
            best->cos[r][1] = _mm512_mask_max_pd(best->cos[r][1], high_lanes, best->cos[r][1], high);
        }
    }
}

static void nk_x512_integer_block(int dtype, int32_t const *words, nk_maxsim_view_t const *d, uint64_t first_doc,
                                  uint64_t docs, uint64_t first_word, uint64_t count, int accumulate, int finish,
                                  int32_t const *bias, double const *inv_q, double const *inv_d, int32_t *dots,
                                  double *best, nk_prefetch_stream_t *prefetch) {
    nk_x512_integer_best_t lanes;
    for (unsigned r = 0; r < NK_INTEGER_ROWS; ++r) {
        lanes.cos[r][0] = lanes.cos[r][1] = _mm512_set1_pd(-2.0);
        lanes.least[r] = _mm512_set1_epi32(INT32_MAX);
    }
    uint64_t full = docs / NK_SCREEN_TILE, tile = 0;
    /* Full tiles two at a time; one case per dtype so that each inlines its own step. */
#define NK_X512_INTEGER_CASE(code) \
    case code: \
        for (; tile + 2 <= full; tile += 2) { \
            nk_prefetch_lines(prefetch, 2 * count); /* the next document: a line per word of a tile */ \
            nk_x512_integer_tiles(code, words, d, first_doc, tile, 2, 16, first_word, count, accumulate, finish, bias, \
                                  inv_q, inv_d, dots, &lanes); \
        } \
        if (tile < full) \
            nk_x512_integer_tiles(code, words, d, first_doc, tile++, 1, 16, first_word, count, accumulate, finish, \
                                  bias, inv_q, inv_d, dots, &lanes); \
        if (docs % NK_SCREEN_TILE) \
            nk_x512_integer_tiles(code, words, d, first_doc, tile, 1, (unsigned)(docs % NK_SCREEN_TILE), first_word, \
                                  count, accumulate, finish, bias, inv_q, inv_d, dots, &lanes); \
        break;
    switch (dtype) {
        NK_X512_INTEGER_CASE(nk_dtype_int8_k)
        NK_X512_INTEGER_CASE(nk_dtype_int4_k)
        NK_X512_INTEGER_CASE(nk_dtype_uint1_k)
    default: return;
    }
#undef NK_X512_INTEGER_CASE
    for (unsigned r = 0; r < NK_INTEGER_ROWS && finish; ++r) {
        double value = dtype == nk_dtype_uint1_k ? (double)_mm512_reduce_min_epi32(lanes.least[r])
                                                 : _mm512_reduce_max_pd(_mm512_max_pd(lanes.cos[r][0], lanes.cos[r][1]));
        if (dtype == nk_dtype_uint1_k ? value < best[r] : value > best[r]) best[r] = value;
    }
}

#define nk_family_integer_prepare nk_x512_integer_prepare
#define nk_family_integer_block nk_x512_integer_block

#endif /* NUMKONG_X86_AVX512_INTEGER_H */
