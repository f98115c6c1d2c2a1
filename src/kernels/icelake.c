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

/* ---- Exact float64 dot products of two stored rows, one routine per storage format. ---- */

static double nk_ice_dot_f64(double const *a, double const *b, uint64_t depth) {
    __m512d sum0 = _mm512_setzero_pd(), sum1 = _mm512_setzero_pd();
    uint64_t k = 0;
    for (; k + 16 <= depth; k += 16) {
        sum0 = _mm512_fmadd_pd(_mm512_loadu_pd(a + k), _mm512_loadu_pd(b + k), sum0);
        sum1 = _mm512_fmadd_pd(_mm512_loadu_pd(a + k + 8), _mm512_loadu_pd(b + k + 8), sum1);
    }
    for (; k < depth; k += 8) {
        __mmask8 lanes = depth - k >= 8 ? (__mmask8)0xFF : (__mmask8)((1u << (depth - k)) - 1u);
        sum0 = _mm512_fmadd_pd(_mm512_maskz_loadu_pd(lanes, a + k), _mm512_maskz_loadu_pd(lanes, b + k), sum0);
    }
    return _mm512_reduce_add_pd(_mm512_add_pd(sum0, sum1));
}

static double nk_ice_dot_f32(float const *a, float const *b, uint64_t depth) {
    __m512d sum0 = _mm512_setzero_pd(), sum1 = _mm512_setzero_pd();
    uint64_t k = 0;
    for (; k + 16 <= depth; k += 16) {
        __m512 x = _mm512_loadu_ps(a + k), y = _mm512_loadu_ps(b + k);
        sum0 = _mm512_fmadd_pd(_mm512_cvtps_pd(_mm512_castps512_ps256(x)), _mm512_cvtps_pd(_mm512_castps512_ps256(y)), sum0);
        sum1 = _mm512_fmadd_pd(_mm512_cvtps_pd(_mm512_extractf32x8_ps(x, 1)), _mm512_cvtps_pd(_mm512_extractf32x8_ps(y, 1)),
                               sum1);
    }
    for (; k < depth; k += 8) {
        __mmask8 lanes = depth - k >= 8 ? (__mmask8)0xFF : (__mmask8)((1u << (depth - k)) - 1u);
        __m256 x = _mm256_maskz_loadu_ps(lanes, a + k), y = _mm256_maskz_loadu_ps(lanes, b + k);
        sum0 = _mm512_fmadd_pd(_mm512_cvtps_pd(x), _mm512_cvtps_pd(y), sum0);
    }
    return _mm512_reduce_add_pd(_mm512_add_pd(sum0, sum1));
}

/* bfloat16 is the top half of a float32; products can overflow float32, so multiply in float64. */
static inline __m512 nk_ice_bf16_to_f32(__m256i bits) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(bits), 16));
}

static double nk_ice_dot_bf16(uint16_t const *a, uint16_t const *b, uint64_t depth) {
    __m512d sum0 = _mm512_setzero_pd(), sum1 = _mm512_setzero_pd();
    for (uint64_t k = 0; k < depth; k += 16) {
        __mmask16 lanes = depth - k >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (depth - k)) - 1u);
        __m512 x = nk_ice_bf16_to_f32(_mm256_maskz_loadu_epi16(lanes, a + k));
        __m512 y = nk_ice_bf16_to_f32(_mm256_maskz_loadu_epi16(lanes, b + k));
        sum0 = _mm512_fmadd_pd(_mm512_cvtps_pd(_mm512_castps512_ps256(x)), _mm512_cvtps_pd(_mm512_castps512_ps256(y)), sum0);
        sum1 = _mm512_fmadd_pd(_mm512_cvtps_pd(_mm512_extractf32x8_ps(x, 1)), _mm512_cvtps_pd(_mm512_extractf32x8_ps(y, 1)),
                               sum1);
    }
    return _mm512_reduce_add_pd(_mm512_add_pd(sum0, sum1));
}

/* Every half-based format: a product of two halves (11-bit significands, exponents within
 * [-24, 15]) is exact in float32, so multiply there and accumulate the exact products in float64. */
NK_ICE_INLINE __m512d nk_ice_add_products(__m512d sum, __m512 x, __m512 y, __m512d *sum_high) {
    __m512 product = _mm512_mul_ps(x, y);
    *sum_high = _mm512_add_pd(*sum_high, _mm512_cvtps_pd(_mm512_extractf32x8_ps(product, 1)));
    return _mm512_add_pd(sum, _mm512_cvtps_pd(_mm512_castps512_ps256(product)));
}

static double nk_ice_dot_f16(uint16_t const *a, uint16_t const *b, uint64_t depth) {
    __m512d sum0 = _mm512_setzero_pd(), sum1 = _mm512_setzero_pd();
    for (uint64_t k = 0; k < depth; k += 16) {
        __mmask16 lanes = depth - k >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (depth - k)) - 1u);
        __m512 x = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(lanes, a + k));
        __m512 y = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(lanes, b + k));
        sum0 = nk_ice_add_products(sum0, x, y, &sum1);
    }
    return _mm512_reduce_add_pd(_mm512_add_pd(sum0, sum1));
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
    __m512d sum0 = _mm512_setzero_pd(), sum1 = _mm512_setzero_pd();
    for (uint64_t k = 0; k < depth; k += 16) {
        __mmask16 lanes = depth - k >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (depth - k)) - 1u);
        __m512 x = nk_ice_minifloat_to_f32(dtype, _mm_maskz_loadu_epi8(lanes, a + k));
        __m512 y = nk_ice_minifloat_to_f32(dtype, _mm_maskz_loadu_epi8(lanes, b + k));
        sum0 = nk_ice_add_products(sum0, x, y, &sum1);
    }
    /* The power-of-two scales of both operands, exact in float64. */
    return _mm512_reduce_add_pd(_mm512_add_pd(sum0, sum1)) * (scale * scale);
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

/* Signed screening words of query rows [first, first + 8) for depth groups [g0, g0 + groups);
 * rows past the end are zero and so contribute nothing. */
static void nk_ice_load_query_groups(nk_maxsim_view_t const *q, uint64_t first, uint64_t g0, uint64_t groups,
                                     int32_t *query_groups) {
    for (int r = 0; r < NK_ICE_ROWS; ++r) {
        uint64_t row = first + (uint64_t)r;
        if (row >= q->vectors) {
            for (uint64_t g = 0; g < groups; ++g) query_groups[g * NK_ICE_ROWS + r] = 0;
            continue;
        }
        uint64_t base = nk_screen_offset(q->vectors, q->screen_depth, row, 0);
        uint64_t stride = nk_screen_offset(q->vectors, q->screen_depth, row, 4) - base;
        uint8_t const *source = q->screen + base + g0 * stride;
        for (uint64_t g = 0; g < groups; ++g, source += stride) {
            uint32_t word;
            memcpy(&word, source, 4);
            query_groups[g * NK_ICE_ROWS + r] = (int32_t)(word ^ 0x80808080u);
        }
    }
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
                float error_q = q->screen_errors[i];
                __m512i bias = _mm512_set1_epi32(128 * q->screen_sums[i]);
                __m512 scale_q = _mm512_set1_ps(q->screen_scales[i]);
                __m512 slack = _mm512_set1_ps(error_q + nk_screen_slack_k), growth = _mm512_set1_ps(1.0f + error_q);
                __m512 best_lower = _mm512_set1_ps(-INFINITY), minus_infinity = _mm512_set1_ps(-INFINITY);
                float *row_scores = scores + r * NK_ICE_BLOCK_DOCS;

                /* Pass 1: raw dots -> upper bounds in place, and the best lower bound. */
                for (uint64_t t = 0; t < tiles; ++t) {
                    uint64_t present = docs - 16 * t;
                    __mmask16 lanes = present >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << present) - 1u);
                    uint64_t j = first_doc + 16 * t;
                    __m512i dot = _mm512_sub_epi32(_mm512_load_si512(row_scores + 16 * t), bias);
                    __m512 scale = _mm512_mul_ps(scale_q, _mm512_maskz_loadu_ps(lanes, d->screen_scales + j));
                    __m512 margin = _mm512_fmadd_ps(growth, _mm512_maskz_loadu_ps(lanes, d->screen_errors + j), slack);
                    __m512 estimate = _mm512_cvtepi32_ps(dot);
                    __m512 upper = _mm512_fmadd_ps(estimate, scale, margin);
                    __m512 lower = _mm512_fmsub_ps(estimate, scale, margin);
                    best_lower = _mm512_mask_max_ps(best_lower, lanes, best_lower, lower);
                    _mm512_store_ps(row_scores + 16 * t, _mm512_mask_mov_ps(minus_infinity, lanes, upper));
                }

                /* Pass 2: rescore every document whose upper bound reaches the threshold. */
                void const *q_row = (char const *)q->values + i * row_bytes;
                float threshold = _mm512_reduce_max_ps(best_lower), from_best = nk_ice_round_down(best[r]);
                if (from_best > threshold) threshold = from_best;
                __m512 threshold_vector = _mm512_set1_ps(threshold);
                for (uint64_t t = 0; t < tiles; ++t) {
                    __m512 upper = _mm512_load_ps(row_scores + 16 * t);
                    __mmask16 candidates = _mm512_cmp_ps_mask(upper, threshold_vector, _CMP_GE_OQ);
                    while (candidates) {
                        unsigned lane = (unsigned)__builtin_ctz(candidates);
                        candidates &= (__mmask16)(candidates - 1u);
                        double cos = nk_ice_cosine(q, d, q_row, inv_q, first_doc + 16 * t + lane, row_bytes);
                        if (cos > best[r]) {
                            best[r] = cos;
                            /* A better exact cosine tightens the threshold for what follows. */
                            float raised = nk_ice_round_down(cos);
                            if (raised > threshold) {
                                threshold = raised;
                                threshold_vector = _mm512_set1_ps(threshold);
                                candidates &= _mm512_cmp_ps_mask(upper, threshold_vector, _CMP_GE_OQ);
                            }
                        }
                    }
                }
            }
        }
        for (uint64_t r = 0; r < rows; ++r)
            total += q->inv_norms[first_query + r] == 0.0 ? 1.0 : nk_distance_from_cos(best[r]);
    }
    return total;
}
