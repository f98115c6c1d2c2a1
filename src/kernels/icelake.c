/* Ice Lake family: AVX-512 F/CD/BW/DQ/VL + VNNI.
 *
 * Certified screening: an int8 VNNI GEMM estimates every cosine from the packed screening copy,
 * the proven error bound of maxsim_internal.h turns each estimate into [LB, UB], and only the
 * documents whose UB reaches the best LB (or the best exact cosine so far) are rescored exactly
 * in float64. The result is therefore the exact MaxSim, at int8 GEMM speed.
 *
 * Work is done per group of 8 query rows against blocks of up to 1024 document rows, so the
 * whole stack footprint is one 32 KB score buffer plus one 8 KB query buffer.
 */
#include <immintrin.h>
#include <math.h>

#include "maxsim_internal.h"

#define NK_ICE_ROWS 8           /* query rows per group = accumulator rows of the micro-kernel */
#define NK_ICE_TILES 3          /* 16-row document tiles per micro-kernel call: 8 x 3 accumulators */
#define NK_ICE_BLOCK_DOCS 1024u /* document rows per block of the score buffer */
#define NK_ICE_CHUNK_GROUPS 256u /* 4-byte depth groups per pass over the query buffer (depth 1024) */

#define NK_ICE_INLINE static inline __attribute__((always_inline))

/* ---- Exact float64 dot products of two stored rows, one routine per storage format. ----
 * Four independent float64 accumulators hide the FMA latency; tails use masked loads, which
 * never touch memory past the row. */

NK_ICE_INLINE __mmask16 nk_ice_tail_mask(uint64_t remaining) {
    return remaining >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << remaining) - 1u);
}

NK_ICE_INLINE double nk_ice_sum4(__m512d a, __m512d b, __m512d c, __m512d d) {
    return _mm512_reduce_add_pd(_mm512_add_pd(_mm512_add_pd(a, b), _mm512_add_pd(c, d)));
}

static double nk_ice_dot_f64(double const *a, double const *b, uint64_t depth) {
    __m512d sum0 = _mm512_setzero_pd(), sum1 = _mm512_setzero_pd(), sum2 = _mm512_setzero_pd(), sum3 = _mm512_setzero_pd();
    uint64_t k = 0;
    for (; k + 32 <= depth; k += 32) {
        sum0 = _mm512_fmadd_pd(_mm512_loadu_pd(a + k), _mm512_loadu_pd(b + k), sum0);
        sum1 = _mm512_fmadd_pd(_mm512_loadu_pd(a + k + 8), _mm512_loadu_pd(b + k + 8), sum1);
        sum2 = _mm512_fmadd_pd(_mm512_loadu_pd(a + k + 16), _mm512_loadu_pd(b + k + 16), sum2);
        sum3 = _mm512_fmadd_pd(_mm512_loadu_pd(a + k + 24), _mm512_loadu_pd(b + k + 24), sum3);
    }
    for (; k < depth; k += 8) {
        __mmask8 lanes = (__mmask8)nk_ice_tail_mask(depth - k);
        sum0 = _mm512_fmadd_pd(_mm512_maskz_loadu_pd(lanes, a + k), _mm512_maskz_loadu_pd(lanes, b + k), sum0);
    }
    return nk_ice_sum4(sum0, sum1, sum2, sum3);
}

/* 16 float32 products added into two float64 accumulators (low and high 8 lanes). */
NK_ICE_INLINE void nk_ice_fma_f32_pairs(__m512 x, __m512 y, __m512d *low, __m512d *high) {
    *low = _mm512_fmadd_pd(_mm512_cvtps_pd(_mm512_castps512_ps256(x)), _mm512_cvtps_pd(_mm512_castps512_ps256(y)), *low);
    *high = _mm512_fmadd_pd(_mm512_cvtps_pd(_mm512_extractf32x8_ps(x, 1)), _mm512_cvtps_pd(_mm512_extractf32x8_ps(y, 1)),
                            *high);
}

static double nk_ice_dot_f32(float const *a, float const *b, uint64_t depth) {
    __m512d sum0 = _mm512_setzero_pd(), sum1 = _mm512_setzero_pd(), sum2 = _mm512_setzero_pd(), sum3 = _mm512_setzero_pd();
    uint64_t k = 0;
    for (; k + 32 <= depth; k += 32) {
        nk_ice_fma_f32_pairs(_mm512_loadu_ps(a + k), _mm512_loadu_ps(b + k), &sum0, &sum1);
        nk_ice_fma_f32_pairs(_mm512_loadu_ps(a + k + 16), _mm512_loadu_ps(b + k + 16), &sum2, &sum3);
    }
    for (; k < depth; k += 16) {
        __mmask16 lanes = nk_ice_tail_mask(depth - k);
        nk_ice_fma_f32_pairs(_mm512_maskz_loadu_ps(lanes, a + k), _mm512_maskz_loadu_ps(lanes, b + k), &sum0, &sum1);
    }
    return nk_ice_sum4(sum0, sum1, sum2, sum3);
}

/* bfloat16 is the top half of a float32; products can overflow float32, so multiply in float64. */
NK_ICE_INLINE __m512 nk_ice_bf16_to_f32(__m256i bits) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(bits), 16));
}

static double nk_ice_dot_bf16(uint16_t const *a, uint16_t const *b, uint64_t depth) {
    __m512d sum0 = _mm512_setzero_pd(), sum1 = _mm512_setzero_pd(), sum2 = _mm512_setzero_pd(), sum3 = _mm512_setzero_pd();
    uint64_t k = 0;
    for (; k + 32 <= depth; k += 32) {
        nk_ice_fma_f32_pairs(nk_ice_bf16_to_f32(_mm256_loadu_si256((__m256i const *)(a + k))),
                             nk_ice_bf16_to_f32(_mm256_loadu_si256((__m256i const *)(b + k))), &sum0, &sum1);
        nk_ice_fma_f32_pairs(nk_ice_bf16_to_f32(_mm256_loadu_si256((__m256i const *)(a + k + 16))),
                             nk_ice_bf16_to_f32(_mm256_loadu_si256((__m256i const *)(b + k + 16))), &sum2, &sum3);
    }
    for (; k < depth; k += 16) {
        __mmask16 lanes = nk_ice_tail_mask(depth - k);
        nk_ice_fma_f32_pairs(nk_ice_bf16_to_f32(_mm256_maskz_loadu_epi16(lanes, a + k)),
                             nk_ice_bf16_to_f32(_mm256_maskz_loadu_epi16(lanes, b + k)), &sum0, &sum1);
    }
    return nk_ice_sum4(sum0, sum1, sum2, sum3);
}

/* Every half-based format: a product of two halves (11-bit significands, exponents within
 * [-24, 15]) is exact in float32, so multiply there and accumulate the exact products in float64. */
NK_ICE_INLINE void nk_ice_add_products(__m512 x, __m512 y, __m512d *low, __m512d *high) {
    __m512 product = _mm512_mul_ps(x, y);
    *low = _mm512_add_pd(*low, _mm512_cvtps_pd(_mm512_castps512_ps256(product)));
    *high = _mm512_add_pd(*high, _mm512_cvtps_pd(_mm512_extractf32x8_ps(product, 1)));
}

static double nk_ice_dot_f16(uint16_t const *a, uint16_t const *b, uint64_t depth) {
    __m512d sum0 = _mm512_setzero_pd(), sum1 = _mm512_setzero_pd(), sum2 = _mm512_setzero_pd(), sum3 = _mm512_setzero_pd();
    uint64_t k = 0;
    for (; k + 32 <= depth; k += 32) {
        nk_ice_add_products(_mm512_cvtph_ps(_mm256_loadu_si256((__m256i const *)(a + k))),
                            _mm512_cvtph_ps(_mm256_loadu_si256((__m256i const *)(b + k))), &sum0, &sum1);
        nk_ice_add_products(_mm512_cvtph_ps(_mm256_loadu_si256((__m256i const *)(a + k + 16))),
                            _mm512_cvtph_ps(_mm256_loadu_si256((__m256i const *)(b + k + 16))), &sum2, &sum3);
    }
    for (; k < depth; k += 16) {
        __mmask16 lanes = nk_ice_tail_mask(depth - k);
        nk_ice_add_products(_mm512_cvtph_ps(_mm256_maskz_loadu_epi16(lanes, a + k)),
                            _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(lanes, b + k)), &sum0, &sum1);
    }
    return nk_ice_sum4(sum0, sum1, sum2, sum3);
}

/* 16 one-byte minifloats to float32 through their exact IEEE half images (scale applied later). */
NK_ICE_INLINE __m512 nk_ice_minifloat_to_f32(int dtype, __m128i bytes) {
    __m256i x = _mm256_cvtepu8_epi16(bytes), half;
    switch (dtype) {
    case nk_dtype_e4m3_k:
        half = _mm256_or_si256(_mm256_and_si256(_mm256_slli_epi16(x, 8), _mm256_set1_epi16((short)0x8000)),
                               _mm256_and_si256(_mm256_slli_epi16(x, 7), _mm256_set1_epi16(0x3F80)));
        break;
    case nk_dtype_e5m2_k: half = _mm256_slli_epi16(x, 8); break;
    case nk_dtype_e2m3_k:
        half = _mm256_or_si256(_mm256_and_si256(_mm256_slli_epi16(x, 10), _mm256_set1_epi16((short)0x8000)),
                               _mm256_and_si256(_mm256_slli_epi16(x, 7), _mm256_set1_epi16(0x0F80)));
        break;
    default: /* e3m2 */
        half = _mm256_or_si256(_mm256_and_si256(_mm256_slli_epi16(x, 10), _mm256_set1_epi16((short)0x8000)),
                               _mm256_and_si256(_mm256_slli_epi16(x, 8), _mm256_set1_epi16(0x1F00)));
        break;
    }
    return _mm512_cvtph_ps(half);
}

NK_ICE_INLINE double nk_ice_dot_minifloat(int dtype, uint8_t const *a, uint8_t const *b, uint64_t depth, double scale) {
    __m512d sum0 = _mm512_setzero_pd(), sum1 = _mm512_setzero_pd(), sum2 = _mm512_setzero_pd(), sum3 = _mm512_setzero_pd();
    uint64_t k = 0;
    for (; k + 32 <= depth; k += 32) {
        nk_ice_add_products(nk_ice_minifloat_to_f32(dtype, _mm_loadu_si128((__m128i const *)(a + k))),
                            nk_ice_minifloat_to_f32(dtype, _mm_loadu_si128((__m128i const *)(b + k))), &sum0, &sum1);
        nk_ice_add_products(nk_ice_minifloat_to_f32(dtype, _mm_loadu_si128((__m128i const *)(a + k + 16))),
                            nk_ice_minifloat_to_f32(dtype, _mm_loadu_si128((__m128i const *)(b + k + 16))), &sum2,
                            &sum3);
    }
    for (; k < depth; k += 16) {
        __mmask16 lanes = nk_ice_tail_mask(depth - k);
        nk_ice_add_products(nk_ice_minifloat_to_f32(dtype, _mm_maskz_loadu_epi8(lanes, a + k)),
                            nk_ice_minifloat_to_f32(dtype, _mm_maskz_loadu_epi8(lanes, b + k)), &sum0, &sum1);
    }
    /* The power-of-two scales of both operands, exact in float64. */
    return nk_ice_sum4(sum0, sum1, sum2, sum3) * (scale * scale);
}

static double nk_ice_dot_e4m3(uint8_t const *a, uint8_t const *b, uint64_t depth) {
    return nk_ice_dot_minifloat(nk_dtype_e4m3_k, a, b, depth, nk_e4m3_half_scale_k);
}
static double nk_ice_dot_e5m2(uint8_t const *a, uint8_t const *b, uint64_t depth) {
    return nk_ice_dot_minifloat(nk_dtype_e5m2_k, a, b, depth, nk_e5m2_half_scale_k);
}
static double nk_ice_dot_e2m3(uint8_t const *a, uint8_t const *b, uint64_t depth) {
    return nk_ice_dot_minifloat(nk_dtype_e2m3_k, a, b, depth, nk_e2m3_half_scale_k);
}
static double nk_ice_dot_e3m2(uint8_t const *a, uint8_t const *b, uint64_t depth) {
    return nk_ice_dot_minifloat(nk_dtype_e3m2_k, a, b, depth, nk_e3m2_half_scale_k);
}

static double nk_ice_dot(int dtype, void const *a, void const *b, uint64_t depth) {
    switch (dtype) {
    case nk_dtype_float64_k: return nk_ice_dot_f64((double const *)a, (double const *)b, depth);
    case nk_dtype_float32_k: return nk_ice_dot_f32((float const *)a, (float const *)b, depth);
    case nk_dtype_float16_k: return nk_ice_dot_f16((uint16_t const *)a, (uint16_t const *)b, depth);
    case nk_dtype_bfloat16_k: return nk_ice_dot_bf16((uint16_t const *)a, (uint16_t const *)b, depth);
    case nk_dtype_e4m3_k: return nk_ice_dot_e4m3((uint8_t const *)a, (uint8_t const *)b, depth);
    case nk_dtype_e5m2_k: return nk_ice_dot_e5m2((uint8_t const *)a, (uint8_t const *)b, depth);
    case nk_dtype_e2m3_k: return nk_ice_dot_e2m3((uint8_t const *)a, (uint8_t const *)b, depth);
    case nk_dtype_e3m2_k: return nk_ice_dot_e3m2((uint8_t const *)a, (uint8_t const *)b, depth);
    default: return 0.0;
    }
}

/* Exact cosine in the contract's order: dot * inv_q * inv_d, 0 for a zero document row. */
static inline double nk_ice_cosine(nk_maxsim_view_t const *q, nk_maxsim_view_t const *d, void const *q_row,
                                   double inv_q, uint64_t doc, size_t row_bytes) {
    double inv_d = d->inv_norms[doc];
    if (inv_d == 0.0) return 0.0;
    return nk_ice_dot((int)q->dtype, q_row, (char const *)d->values + doc * row_bytes, q->depth) * inv_q * inv_d;
}

/* float32 not above x, so a threshold derived from an exact cosine never excludes a winner. */
static inline float nk_ice_round_down(double x) {
    return _mm_cvtss_f32(_mm_cvt_roundsd_ss(_mm_setzero_ps(), _mm_set_sd(x), _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC));
}

/* Depth too large for int32 screening: every pair exactly. */
static double nk_ice_exhaustive(nk_maxsim_view_t const *q, nk_maxsim_view_t const *d) {
    size_t row_bytes = nk_dtype_itemsize((int)q->dtype) * q->depth;
    double total = 0.0;
    for (uint64_t i = 0; i < q->vectors; ++i) {
        double inv_q = q->inv_norms[i], best = -INFINITY;
        if (inv_q == 0.0) {
            total += 1.0;
            continue;
        }
        void const *q_row = (char const *)q->values + i * row_bytes;
        for (uint64_t j = 0; j < d->vectors; ++j) {
            double cos = nk_ice_cosine(q, d, q_row, inv_q, j, row_bytes);
            if (cos > best) best = cos;
        }
        total += nk_distance_from_cos(best);
    }
    return total;
}

/* ---- Screening. ----
 * VNNI multiplies unsigned by signed bytes, and only the signed operand can be a 32-bit memory
 * broadcast. Documents stream as stored (v + 128, unsigned); the small query group is converted
 * once to signed (XOR 0x80) into a stack buffer of [group][row] words, so each step is one load
 * per document tile, one broadcast per query row and 8 x tiles multiply-accumulates. The bias
 * adds 128 * (sum of the query's screen bytes), removed with screen_sums afterwards. */

/* scores[r * NK_ICE_BLOCK_DOCS + 16 t + lane] (+)= screening dot of query row r with document
 * lane of tile t, over `groups` depth groups starting at `doc` (tiles `tile_stride` bytes apart,
 * depth groups `vector_stride` bytes apart, `lanes` the rows present in each tile). */
NK_ICE_INLINE void nk_ice_screen_tiles(int32_t const *query_groups, uint64_t groups, uint8_t const *doc,
                                       uint64_t tile_stride, uint64_t vector_stride, __mmask16 lanes, int const tiles,
                                       int accumulate, float *scores) {
    __m512i acc[NK_ICE_ROWS][NK_ICE_TILES];
#pragma GCC unroll 8
    for (int r = 0; r < NK_ICE_ROWS; ++r)
#pragma GCC unroll 4
        for (int t = 0; t < tiles; ++t)
            acc[r][t] = accumulate ? _mm512_load_si512(scores + r * NK_ICE_BLOCK_DOCS + 16 * t) : _mm512_setzero_si512();
    for (uint64_t g = 0; g < groups; ++g, doc += vector_stride, query_groups += NK_ICE_ROWS) {
        __m512i doc_bytes[NK_ICE_TILES];
#pragma GCC unroll 4
        for (int t = 0; t < tiles; ++t) doc_bytes[t] = _mm512_maskz_loadu_epi32(lanes, doc + t * tile_stride);
#pragma GCC unroll 8
        for (int r = 0; r < NK_ICE_ROWS; ++r) {
            __m512i query = _mm512_set1_epi32(query_groups[r]);
#pragma GCC unroll 4
            for (int t = 0; t < tiles; ++t) acc[r][t] = _mm512_dpbusd_epi32(acc[r][t], doc_bytes[t], query);
        }
    }
#pragma GCC unroll 8
    for (int r = 0; r < NK_ICE_ROWS; ++r)
#pragma GCC unroll 4
        for (int t = 0; t < tiles; ++t) _mm512_store_si512(scores + r * NK_ICE_BLOCK_DOCS + 16 * t, acc[r][t]);
}

/* Signed screening words of query rows [first, first + 8) for depth groups [g0, g0 + groups).
 * first is a multiple of 8, so the 8 rows are 8 adjacent lanes of one query tile: one 32-byte
 * (masked) load per depth group. Rows past the end are zero and so contribute nothing. */
static void nk_ice_load_query_groups(nk_maxsim_view_t const *q, uint64_t first, uint64_t g0, uint64_t groups,
                                     int32_t *query_groups) {
    uint64_t base = nk_screen_offset(q->vectors, q->screen_depth, first, 0);
    uint64_t stride = nk_screen_offset(q->vectors, q->screen_depth, first, 4) - base;
    uint64_t present = q->vectors - first;
    __mmask8 rows = present >= NK_ICE_ROWS ? (__mmask8)0xFF : (__mmask8)((1u << present) - 1u);
    __m256i bias = _mm256_set1_epi32((int)0x80808080u);
    uint8_t const *source = q->screen + base + g0 * stride;
    for (uint64_t g = 0; g < groups; ++g, source += stride)
        _mm256_store_si256((__m256i *)(query_groups + g * NK_ICE_ROWS),
                           _mm256_maskz_xor_epi32(rows, _mm256_maskz_loadu_epi32(rows, source), bias));
}

/* Screen documents [first_doc, first_doc + docs) against one query group, all depth groups,
 * leaving raw int32 dot products (biased by the query sums) in `scores`. */
static void nk_ice_screen_block(nk_maxsim_view_t const *q, nk_maxsim_view_t const *d, uint64_t first_query,
                                uint64_t first_doc, uint64_t docs, int32_t *query_groups, int query_groups_ready,
                                float *scores) {
    uint64_t total_groups = d->screen_depth / 4, tile_stride = NK_SCREEN_TILE * d->screen_depth;
    uint64_t full_tiles = docs / NK_SCREEN_TILE, partial_rows = docs % NK_SCREEN_TILE;
    uint8_t const *block = d->screen + first_doc * d->screen_depth; /* first_doc is a multiple of 16 */
    for (uint64_t g0 = 0; g0 < total_groups; g0 += NK_ICE_CHUNK_GROUPS) {
        uint64_t groups = total_groups - g0 < NK_ICE_CHUNK_GROUPS ? total_groups - g0 : NK_ICE_CHUNK_GROUPS;
        int accumulate = g0 != 0;
        if (!query_groups_ready) nk_ice_load_query_groups(q, first_query, g0, groups, query_groups);
        uint64_t t = 0;
        for (; t + NK_ICE_TILES <= full_tiles; t += NK_ICE_TILES)
            nk_ice_screen_tiles(query_groups, groups, block + t * tile_stride + g0 * 64, tile_stride, 64, 0xFFFF,
                                NK_ICE_TILES, accumulate, scores + t * 16);
        if (full_tiles - t == 2)
            nk_ice_screen_tiles(query_groups, groups, block + t * tile_stride + g0 * 64, tile_stride, 64, 0xFFFF, 2,
                                accumulate, scores + t * 16);
        else if (full_tiles - t == 1)
            nk_ice_screen_tiles(query_groups, groups, block + t * tile_stride + g0 * 64, tile_stride, 64, 0xFFFF, 1,
                                accumulate, scores + t * 16);
        if (partial_rows) /* the last tile of the whole matrix: rows packed 4 * partial_rows apart */
            nk_ice_screen_tiles(query_groups, groups, block + full_tiles * tile_stride + g0 * 4 * partial_rows, 0,
                                4 * partial_rows, (__mmask16)((1u << partial_rows) - 1u), 1, accumulate,
                                scores + full_tiles * 16);
    }
}

/* Bounds and candidates of query row i against one screened block, raising *best.
 * In units of the query's screening step s_q (so per-row constants leave the inner loops):
 *   p_j = dot_j * s_d[j],  estimate c_j = s_q p_j,
 *   UB_j = s_q (p_j + b e_j) + a,  LB_j = s_q (p_j - b e_j) - a,  with b = (1 + e_q) / s_q,
 * a = e_q + slack. Document j stays a candidate while UB_j >= max(max LB, best exact cosine). */
static void nk_ice_candidates(nk_maxsim_view_t const *q, nk_maxsim_view_t const *d, uint64_t i, uint64_t first_doc,
                              uint64_t docs, float *row_scores, double *best) {
    double error_q = q->screen_errors[i], scale_q = q->screen_scales[i], inv_q = q->inv_norms[i];
    double a = error_q + nk_screen_slack_k;
    __m512 b = _mm512_set1_ps((float)((1.0 + error_q) / scale_q));
    __m512i bias = _mm512_set1_epi32(128 * q->screen_sums[i]);
    float const *scales_d = d->screen_scales + first_doc, *errors_d = d->screen_errors + first_doc;
    uint64_t tiles = (docs + NK_SCREEN_TILE - 1) / NK_SCREEN_TILE;

    /* Pass 1: raw dots -> p in place, and the best lower bound (in p units, before - a). */
    __m512 best_lower = _mm512_set1_ps(-INFINITY);
    for (uint64_t t = 0; t < tiles; ++t) {
        __mmask16 lanes = nk_ice_tail_mask(docs - 16 * t);
        __m512i dot = _mm512_sub_epi32(_mm512_load_si512(row_scores + 16 * t), bias);
        __m512 p = _mm512_maskz_mul_ps(lanes, _mm512_cvtepi32_ps(dot), _mm512_maskz_loadu_ps(lanes, scales_d + 16 * t));
        _mm512_store_ps(row_scores + 16 * t, p);
        __m512 lower = _mm512_fnmadd_ps(b, _mm512_maskz_loadu_ps(lanes, errors_d + 16 * t), p);
        best_lower = _mm512_mask_max_ps(best_lower, lanes, best_lower, lower);
    }

    /* Threshold on p + b e: max(LB) or best, minus a, over s_q; rounded down so it only admits. */
    double from_bounds = (double)_mm512_reduce_max_ps(best_lower) * scale_q - a;
    double threshold = from_bounds > *best ? from_bounds : *best;
    __m512 cut = _mm512_set1_ps(nk_ice_round_down((threshold - a) / scale_q));

    /* Pass 2: rescore every document whose upper bound reaches the threshold. */
    void const *q_row = (char const *)q->values + i * nk_dtype_itemsize((int)q->dtype) * q->depth;
    size_t row_bytes = nk_dtype_itemsize((int)q->dtype) * q->depth;
    for (uint64_t t = 0; t < tiles; ++t) {
        __mmask16 lanes = nk_ice_tail_mask(docs - 16 * t);
        __m512 upper = _mm512_fmadd_ps(b, _mm512_maskz_loadu_ps(lanes, errors_d + 16 * t), _mm512_load_ps(row_scores + 16 * t));
        __mmask16 candidates = _mm512_mask_cmp_ps_mask(lanes, upper, cut, _CMP_GE_OQ);
        while (candidates) {
            unsigned lane = (unsigned)__builtin_ctz(candidates);
            candidates &= (__mmask16)(candidates - 1u);
            double cos = nk_ice_cosine(q, d, q_row, inv_q, first_doc + 16 * t + lane, row_bytes);
            if (cos > *best) {
                *best = cos;
                /* A better exact cosine tightens the cut for what follows. */
                if (cos > threshold) {
                    threshold = cos;
                    cut = _mm512_set1_ps(nk_ice_round_down((threshold - a) / scale_q));
                    candidates &= _mm512_cmp_ps_mask(upper, cut, _CMP_GE_OQ);
                }
            }
        }
    }
}

double nk_maxsim_icelake(nk_maxsim_view_t const *q, nk_maxsim_view_t const *d) {
    if (q->depth > NK_SCREEN_MAX_DEPTH) return nk_ice_exhaustive(q, d);

    float scores[NK_ICE_ROWS * NK_ICE_BLOCK_DOCS] __attribute__((aligned(64)));
    int32_t query_groups[NK_ICE_CHUNK_GROUPS * NK_ICE_ROWS] __attribute__((aligned(64)));
    size_t row_bytes = nk_dtype_itemsize((int)q->dtype) * q->depth;
    int single_chunk = d->screen_depth / 4 <= NK_ICE_CHUNK_GROUPS;
    double total = 0.0;

    for (uint64_t first_query = 0; first_query < q->vectors; first_query += NK_ICE_ROWS) {
        uint64_t rows = q->vectors - first_query < NK_ICE_ROWS ? q->vectors - first_query : NK_ICE_ROWS;
        double best[NK_ICE_ROWS];
        for (int r = 0; r < NK_ICE_ROWS; ++r) best[r] = -INFINITY;
        /* With one depth chunk the converted query group serves every document block. */
        if (single_chunk) nk_ice_load_query_groups(q, first_query, 0, d->screen_depth / 4, query_groups);

        for (uint64_t first_doc = 0; first_doc < d->vectors; first_doc += NK_ICE_BLOCK_DOCS) {
            uint64_t docs = d->vectors - first_doc < NK_ICE_BLOCK_DOCS ? d->vectors - first_doc : NK_ICE_BLOCK_DOCS;
            uint64_t tiles = (docs + NK_SCREEN_TILE - 1) / NK_SCREEN_TILE;
            nk_ice_screen_block(q, d, first_query, first_doc, docs, query_groups, single_chunk, scores);

            for (uint64_t r = 0; r < rows; ++r) {
                uint64_t i = first_query + r;
                double inv_q = q->inv_norms[i];
                if (inv_q == 0.0) continue;
                nk_ice_candidates(q, d, i, first_doc, docs, scores + r * NK_ICE_BLOCK_DOCS, &best[r]);
            }
        }
        for (uint64_t r = 0; r < rows; ++r)
            total += q->inv_norms[first_query + r] == 0.0 ? 1.0 : nk_distance_from_cos(best[r]);
    }
    return total;
}
