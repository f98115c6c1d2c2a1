/* MaxSim kernel for AVX2 + FMA + F16C (Haswell class), 256-bit ymm registers, no AVX-512.
 *
 * Plan (see maxsim_internal.h for the packed layout and the screening bound):
 *   1. Screening: exact int32 dot products of the int8 screening copies, computed GEMM-style on the
 *      tiled `screen` section: 4 query rows x 16 document rows per register block, one 4-depth step
 *      per iteration. Without VNNI, u8 x s8 products go through vpmaddubsw, which saturates int16
 *      for biased bytes (255 * 127 * 2), so the sign is moved onto the document operand instead:
 *      |q| (unsigned, <= 127) x sign(d, q) (signed, |.| <= 127) never exceeds 2 * 127 * 127.
 *   2. Certified bound per pair, computed in the register block's epilogue: estimate +- (e_q +
 *      slack + (1 + e_q) e_d); every document whose upper bound reaches the best lower bound (or
 *      the best exact cosine so far) is a candidate, found 16 bounds per compare.
 *   3. Candidates are rescored exactly with a float64 dot product of the decoded stored values,
 *      highest upper bound first, skipping any whose bound falls below the best exact cosine.
 * Documents are processed in blocks of NK_HASWELL_BLOCK rows and queries in super-groups whose
 * prepared screening bytes fit a fixed buffer, so all scratch lives on the stack (~45 KB).
 */
#include <immintrin.h>
#include <math.h>

#include "avx2_dot.h"
#include "maxsim_internal.h"

/* Document rows per block: a multiple of 16 (whole screening tiles). */
#define NK_HASWELL_BLOCK 512u
/* Prepared query screening bytes (signed + absolute copies), in int32 units: 32 KB. */
#define NK_HASWELL_QBUF_INTS 8192u
/* Query rows whose prepared bytes are kept while the document blocks stream past. */
#define NK_HASWELL_SUPER_ROWS 64u
/* Query rows per register block. */
#define NK_HASWELL_GROUP 4u


/* ---- Screening: int8 dot products on the tiled screen section. ---- */

/* Copy the screening bytes of query rows [row0, row0 + 4) for depth groups [g0, g1) (group = 4
 * depths) into out[(g - g0) * 8 + 0..7]: lanes 0..3 the signed values of the 4 rows, lanes 4..7
 * their absolute values, each lane 4 bytes (4 depths). Missing rows become zeros. */
static void nk_prepare_queries(nk_maxsim_view_t const *q, uint64_t row0, uint64_t g0, uint64_t g1, int32_t *out) {
    uint64_t tile = row0 / NK_SCREEN_TILE, lane = row0 % NK_SCREEN_TILE;
    uint64_t rows_in_tile = nk_min_u64(NK_SCREEN_TILE, q->vectors - tile * NK_SCREEN_TILE);
    uint64_t present = nk_min_u64(NK_HASWELL_GROUP, q->vectors - row0);
    uint8_t const *base = q->screen + tile * NK_SCREEN_TILE * q->screen_depth + 4 * lane;
    __m128i const bias = _mm_set1_epi8((char)0x80);
    for (uint64_t g = g0; g < g1; ++g) {
        uint8_t const *source = base + g * 4 * rows_in_tile; /* the 4 rows are adjacent lanes of one tile */
        __m128i biased;
        if (present == NK_HASWELL_GROUP) biased = _mm_loadu_si128((__m128i const *)source);
        else {
            uint8_t padded[16];
            memset(padded, 0x80, sizeof(padded)); /* biased zero */
            memcpy(padded, source, 4 * present);
            biased = _mm_loadu_si128((__m128i const *)padded);
        }
        __m128i value = _mm_xor_si128(biased, bias);
        _mm_storeu_si128((__m128i *)(out + (g - g0) * 8), value);
        _mm_storeu_si128((__m128i *)(out + (g - g0) * 8 + 4), _mm_abs_epi8(value));
    }
}

/* What the bound needs from a register-block group of query rows, and the running maximum of
 * the lower bounds (lane-wise: a lower bound from any lane rules out the same documents). */
typedef struct nk_group_bounds {
    __m256 lower_max[NK_HASWELL_GROUP];
    float scale[NK_HASWELL_GROUP], factor[NK_HASWELL_GROUP], offset[NK_HASWELL_GROUP];
} nk_group_bounds_t;

/* Tile shapes: all 16 rows, 9..15 rows (second half masked), 1..8 rows (first half only). */
enum { nk_tile_full_k, nk_tile_upper_k, nk_tile_lower_k };

/* Bounds of 8 document rows for query row r: estimate = s * scale_d * scale_q,
 * radius = e_q + slack + (1 + e_q) e_d. Returns the upper bounds, raises the lower-bound maximum. */
NK_INLINE __m256 nk_bound8(__m256i dots, __m256 scale_d, __m256 error_d, nk_group_bounds_t *bounds, int r,
                           __m256 valid, int masked) {
    __m256 partial = _mm256_mul_ps(_mm256_cvtepi32_ps(dots), scale_d);
    __m256 radius = _mm256_fmadd_ps(_mm256_set1_ps(bounds->factor[r]), error_d, _mm256_set1_ps(bounds->offset[r]));
    __m256 scale_q = _mm256_set1_ps(bounds->scale[r]);
    __m256 lower = _mm256_fmsub_ps(partial, scale_q, radius), upper = _mm256_fmadd_ps(partial, scale_q, radius);
    if (masked) { /* lanes past the last document can never be candidates */
        __m256 minus_inf = _mm256_set1_ps(-INFINITY);
        lower = _mm256_blendv_ps(minus_inf, lower, valid);
        upper = _mm256_blendv_ps(minus_inf, upper, valid);
    }
    bounds->lower_max[r] = _mm256_max_ps(bounds->lower_max[r], lower);
    return upper;
}

/* One register block: `rows` (1..4) prepared query rows x one tile of `n` document rows, over
 * `groups` depth groups starting at `tile` (already offset to the first group).
 * Sums the int32 screening dots (adding to the partial sums kept in `out` when `accumulate`);
 * when `finish`, turns them into float upper bounds instead (-inf for lanes >= n) and raises the
 * group's lower-bound maximum. Row r of the block lives at out[r * NK_HASWELL_BLOCK + 0..15];
 * partial int32 sums only ever pass through vector loads and stores, which may alias anything.
 * `rows` and `shape` are compile-time constants at every call site, so each variant stays lean. */
NK_INLINE void nk_screen_tile(int rows, int shape, int32_t const *prepared, uint8_t const *tile, uint64_t n,
                              uint64_t groups, float *out, int accumulate, int finish, float const *scales_d,
                              float const *errors_d, nk_group_bounds_t *bounds) {
    __m256i const bias = _mm256_set1_epi8((char)0x80), ones = _mm256_set1_epi16(1);
    __m256i acc[NK_HASWELL_GROUP][2];
#pragma GCC unroll 4
    for (int r = 0; r < rows; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_si256();
    uint64_t stride = shape == nk_tile_full_k ? 64 : 4 * n; /* bytes per depth group inside the tile */
    /* Rows 0..7 are the first 32 bytes of a group, rows 8..n-1 follow: mask what is not there. */
    __m256i const mask = nk_lanes32(shape == nk_tile_upper_k ? n - 8 : n);
#pragma GCC unroll 2
    for (uint64_t g = 0; g < groups; ++g, tile += stride, prepared += 8) {
        __m256i d0, d1 = _mm256_setzero_si256();
        if (shape == nk_tile_lower_k) d0 = _mm256_maskload_epi32((int const *)tile, mask);
        else d0 = _mm256_loadu_si256((__m256i const *)tile);
        if (shape == nk_tile_full_k) d1 = _mm256_loadu_si256((__m256i const *)(tile + 32));
        if (shape == nk_tile_upper_k) d1 = _mm256_maskload_epi32((int const *)(tile + 32), mask);
        d0 = _mm256_xor_si256(d0, bias);
        d1 = _mm256_xor_si256(d1, bias);
#pragma GCC unroll 4
        for (int r = 0; r < rows; ++r) {
            __m256i q_signed = _mm256_set1_epi32(prepared[r]), q_abs = _mm256_set1_epi32(prepared[4 + r]);
            acc[r][0] = _mm256_add_epi32(
                acc[r][0], _mm256_madd_epi16(_mm256_maddubs_epi16(q_abs, _mm256_sign_epi8(d0, q_signed)), ones));
            if (shape != nk_tile_lower_k)
                acc[r][1] = _mm256_add_epi32(
                    acc[r][1], _mm256_madd_epi16(_mm256_maddubs_epi16(q_abs, _mm256_sign_epi8(d1, q_signed)), ones));
        }
    }

    __m256 scale0 = _mm256_setzero_ps(), scale1 = _mm256_setzero_ps(), error0 = scale0, error1 = scale0;
    if (finish) { /* per-document bound inputs, masked like the screening bytes */
        if (shape == nk_tile_lower_k) {
            scale0 = _mm256_maskload_ps(scales_d, mask), error0 = _mm256_maskload_ps(errors_d, mask);
        }
        else {
            scale0 = _mm256_loadu_ps(scales_d), error0 = _mm256_loadu_ps(errors_d);
            if (shape == nk_tile_full_k)
                scale1 = _mm256_loadu_ps(scales_d + 8), error1 = _mm256_loadu_ps(errors_d + 8);
            else
                scale1 = _mm256_maskload_ps(scales_d + 8, mask), error1 = _mm256_maskload_ps(errors_d + 8, mask);
        }
    }
    __m256 const valid = _mm256_castsi256_ps(mask);
#pragma GCC unroll 4
    for (int r = 0; r < rows; ++r) {
        float *target = out + (size_t)r * NK_HASWELL_BLOCK;
        if (accumulate) {
            acc[r][0] = _mm256_add_epi32(acc[r][0], _mm256_loadu_si256((__m256i const *)target));
            acc[r][1] = _mm256_add_epi32(acc[r][1], _mm256_loadu_si256((__m256i const *)(target + 8)));
        }
        if (!finish) {
            _mm256_storeu_si256((__m256i *)target, acc[r][0]);
            _mm256_storeu_si256((__m256i *)(target + 8), acc[r][1]);
            continue;
        }
        __m256 upper0 = nk_bound8(acc[r][0], scale0, error0, bounds, r, valid, shape == nk_tile_lower_k);
        __m256 upper1 = _mm256_set1_ps(-INFINITY);
        if (shape != nk_tile_lower_k)
            upper1 = nk_bound8(acc[r][1], scale1, error1, bounds, r, valid, shape == nk_tile_upper_k);
        _mm256_storeu_ps(target, upper0); /* same slot, same width: bound j replaces dot j */
        _mm256_storeu_ps(target + 8, upper1);
    }
}

/* Screen `rows` prepared query rows against document rows [j0, j0 + count) (j0 % 16 == 0) over
 * depth groups [g0, g0 + groups), into out[r * NK_HASWELL_BLOCK + (j - j0)] (see nk_screen_tile). */
NK_INLINE void nk_screen_block_rows(int rows, int32_t const *prepared, nk_maxsim_view_t const *d, uint64_t j0,
                                    uint64_t count, uint64_t g0, uint64_t groups, float *out, int accumulate,
                                    int finish, nk_group_bounds_t *bounds) {
    uint64_t first_tile = j0 / NK_SCREEN_TILE, tiles = (count + NK_SCREEN_TILE - 1) / NK_SCREEN_TILE;
    for (uint64_t t = 0; t < tiles; ++t) {
        uint64_t tile = first_tile + t, first_row = tile * NK_SCREEN_TILE;
        uint64_t n = nk_min_u64(NK_SCREEN_TILE, d->vectors - first_row);
        uint8_t const *start = d->screen + first_row * d->screen_depth + g0 * 4 * n;
        float *target = out + t * NK_SCREEN_TILE;
        float const *scales = d->screen_scales + first_row, *errors = d->screen_errors + first_row;
        if (n == NK_SCREEN_TILE)
            nk_screen_tile(rows, nk_tile_full_k, prepared, start, n, groups, target, accumulate, finish, scales, errors,
                           bounds);
        else if (n > 8)
            nk_screen_tile(rows, nk_tile_upper_k, prepared, start, n, groups, target, accumulate, finish, scales,
                           errors, bounds);
        else
            nk_screen_tile(rows, nk_tile_lower_k, prepared, start, n, groups, target, accumulate, finish, scales,
                           errors, bounds);
    }
}

static void nk_screen_block(int rows, int32_t const *prepared, nk_maxsim_view_t const *d, uint64_t j0, uint64_t count,
                            uint64_t g0, uint64_t groups, float *out, int accumulate, int finish,
                            nk_group_bounds_t *bounds) {
    switch (rows) { /* one specialization per register-block height */
    case 1: nk_screen_block_rows(1, prepared, d, j0, count, g0, groups, out, accumulate, finish, bounds); break;
    case 2: nk_screen_block_rows(2, prepared, d, j0, count, g0, groups, out, accumulate, finish, bounds); break;
    case 3: nk_screen_block_rows(3, prepared, d, j0, count, g0, groups, out, accumulate, finish, bounds); break;
    default: nk_screen_block_rows(4, prepared, d, j0, count, g0, groups, out, accumulate, finish, bounds); break;
    }
}

/* ---- Candidates and exact rescoring. ---- */

static inline float nk_hmax_ps(__m256 v) {
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ps(m, _mm_shuffle_ps(m, m, 1));
    return _mm_cvtss_f32(m);
}

typedef struct nk_rescore {
    nk_maxsim_view_t const *q, *d;
    nk_dot_fn dot;
    size_t row_bytes;
} nk_rescore_t;

static inline double nk_exact_cos(nk_rescore_t const *ctx, uint64_t i, void const *q_row, uint64_t j) {
    double inv_d = ctx->d->inv_norms[j];
    if (inv_d == 0.0) return 0.0;
    double dot = ctx->dot(q_row, (char const *)ctx->d->values + j * ctx->row_bytes, ctx->q->depth);
    return dot * ctx->q->inv_norms[i] * inv_d;
}

/* Candidate indices inside a block. */
typedef uint16_t nk_block_index_t;
_Static_assert(NK_HASWELL_BLOCK <= 65536 && NK_HASWELL_BLOCK % NK_SCREEN_TILE == 0, "block indices must fit");

/* Below this many candidates, rescore them best-bound-first so the first exact cosine prunes the rest. */
#define NK_HASWELL_ORDERED_CANDIDATES 16u

/* Indices (within the block) of the rows whose upper bound reaches `threshold`. */
static uint64_t nk_collect_candidates(float const *upper, uint64_t count, float threshold, nk_block_index_t *list) {
    __m256 const threshold_v = _mm256_set1_ps(threshold);
    uint64_t listed = 0;
    for (uint64_t j = 0; j < count; j += 16) { /* 16 bounds per test (-inf padded): candidates are rare */
        unsigned bits =
            (unsigned)_mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(upper + j), threshold_v, _CMP_GE_OQ)) |
            (unsigned)_mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(upper + j + 8), threshold_v, _CMP_GE_OQ)) << 8;
        while (bits) {
            list[listed++] = (nk_block_index_t)(j + (uint64_t)nk_ctz32(bits));
            bits &= bits - 1;
        }
    }
    return listed;
}

/* Rescore the listed candidates of query row i (upper bounds in `upper`) and raise *best.
 * A candidate whose bound is below the best exact cosine so far cannot win. */
static void nk_rescore_candidates(nk_rescore_t const *ctx, uint64_t i, float *upper, uint64_t j0,
                                  nk_block_index_t const *list, uint64_t listed, double *best) {
    void const *q_row = (char const *)ctx->q->values + i * ctx->row_bytes;
    double best_cos = *best;
    if (listed <= NK_HASWELL_ORDERED_CANDIDATES) {
        for (;;) { /* highest upper bound first: its exact cosine usually rules out the rest */
            uint64_t pick = 0;
            float pick_bound = -INFINITY;
            for (uint64_t c = 0; c < listed; ++c)
                if (upper[list[c]] > pick_bound) pick_bound = upper[list[c]], pick = c;
            if (pick_bound == -INFINITY || !(pick_bound >= nk_f32_at_most(best_cos))) break;
            upper[list[pick]] = -INFINITY;
            double cos = nk_exact_cos(ctx, i, q_row, j0 + list[pick]);
            if (cos > best_cos) best_cos = cos;
        }
    }
    else
        for (uint64_t c = 0; c < listed; ++c) {
            if (!(upper[list[c]] >= nk_f32_at_most(best_cos))) continue;
            double cos = nk_exact_cos(ctx, i, q_row, j0 + list[c]);
            if (cos > best_cos) best_cos = cos;
        }
    *best = best_cos;
}

double nk_maxsim_haswell(nk_maxsim_view_t const *q, nk_maxsim_view_t const *d) {
    nk_rescore_t ctx = {q, d, nk_dot_for(q->dtype), q->row_bytes};
    if (!ctx.dot) return 0.0; /* unknown dtype: the dispatcher never passes one */

    _Alignas(32) int32_t prepared[NK_HASWELL_QBUF_INTS];
    _Alignas(32) float upper[NK_HASWELL_GROUP * NK_HASWELL_BLOCK]; /* or partial int32 dots */
    double best[NK_HASWELL_SUPER_ROWS];
    nk_group_bounds_t bounds;
    nk_block_index_t list[NK_HASWELL_BLOCK];

    /* Keep all prepared query rows of a super-group if they fit; otherwise one group at a time,
     * preparing and accumulating the depth in chunks that fit. */
    uint64_t groups_total = q->screen_depth / 4, ints_per_row = 2 * groups_total;
    int chunked = NK_HASWELL_GROUP * ints_per_row > NK_HASWELL_QBUF_INTS;
    uint64_t super_rows = NK_HASWELL_SUPER_ROWS, chunk_groups = groups_total;
    if (chunked) {
        super_rows = NK_HASWELL_GROUP;
        chunk_groups = NK_HASWELL_QBUF_INTS / (2 * NK_HASWELL_GROUP);
    }
    else if (ints_per_row) {
        super_rows = nk_min_u64(NK_HASWELL_SUPER_ROWS, NK_HASWELL_QBUF_INTS / ints_per_row);
        super_rows -= super_rows % NK_HASWELL_GROUP;
    }
    uint64_t group_ints = 8 * groups_total; /* prepared ints of one register-block group */

    double total = 0.0;
    for (uint64_t row0 = 0; row0 < q->vectors; row0 += super_rows) {
        uint64_t rows = nk_min_u64(super_rows, q->vectors - row0);
        uint64_t groups_of_rows = (rows + NK_HASWELL_GROUP - 1) / NK_HASWELL_GROUP;
        for (uint64_t r = 0; r < rows; ++r) best[r] = -INFINITY;
        if (!chunked)
            for (uint64_t gi = 0; gi < groups_of_rows; ++gi)
                nk_prepare_queries(q, row0 + gi * NK_HASWELL_GROUP, 0, groups_total, prepared + gi * group_ints);

        for (uint64_t j0 = 0; j0 < d->vectors; j0 += NK_HASWELL_BLOCK) {
            uint64_t count = nk_min_u64(NK_HASWELL_BLOCK, d->vectors - j0);
            for (uint64_t gi = 0; gi < groups_of_rows; ++gi) {
                uint64_t first = row0 + gi * NK_HASWELL_GROUP;
                int height = (int)nk_min_u64(NK_HASWELL_GROUP, q->vectors - first);
                int live = 0; /* skip screening for groups of zero query rows */
                for (int r = 0; r < height; ++r) {
                    float error_q = q->screen_errors[first + (uint64_t)r];
                    bounds.lower_max[r] = _mm256_set1_ps(-INFINITY);
                    bounds.scale[r] = q->screen_scales[first + (uint64_t)r];
                    bounds.factor[r] = 1.0f + error_q;
                    bounds.offset[r] = error_q + nk_screen_slack_k;
                    live |= q->inv_norms[first + (uint64_t)r] != 0.0;
                }
                if (!live) continue;
                if (!chunked)
                    nk_screen_block(height, prepared + gi * group_ints, d, j0, count, 0, groups_total, upper, 0, 1,
                                    &bounds);
                else
                    for (uint64_t g0 = 0; g0 < groups_total; g0 += chunk_groups) {
                        uint64_t g1 = nk_min_u64(groups_total, g0 + chunk_groups);
                        nk_prepare_queries(q, first, g0, g1, prepared);
                        nk_screen_block(height, prepared, d, j0, count, g0, g1 - g0, upper, g0 != 0,
                                        g1 == groups_total, &bounds);
                    }
                /* Threshold: the best lower bound, or the best exact cosine of earlier blocks. */
                for (int r = 0; r < height; ++r) {
                    uint64_t i = first + (uint64_t)r;
                    if (q->inv_norms[i] == 0.0) continue;
                    double *row_best = &best[i - row0];
                    float *row_upper = upper + (uint64_t)r * NK_HASWELL_BLOCK;
                    float threshold = nk_hmax_ps(bounds.lower_max[r]), from_best = nk_f32_at_most(*row_best);
                    if (from_best > threshold) threshold = from_best;
                    threshold = nk_threshold_floor(threshold);
                    uint64_t listed = nk_collect_candidates(row_upper, count, threshold, list);
                    nk_rescore_candidates(&ctx, i, row_upper, j0, list, listed, row_best);
                }
            }
        }
        for (uint64_t r = 0; r < rows; ++r)
            total += nk_row_distance(q->inv_norms[row0 + r], best[r]);
    }
    return total;
}
