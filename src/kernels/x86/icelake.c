/* Ice Lake family: AVX-512 F/CD/BW/DQ/VL + VNNI (and VBMI, for the exact e4m3 dot products).
 *
 * Certified screening: an int8 VNNI GEMM estimates every cosine from the packed screening copy,
 * the proven error bound of maxsim_internal.h turns each estimate into an upper bound UB, each
 * query row's largest UB is rescored exactly in float64 first, and then only the documents whose
 * UB reaches the best exact cosine so far are. The result is therefore the exact MaxSim, at int8
 * GEMM speed.
 *
 * Work is done per group of 8 query rows against blocks of up to 1024 document rows. The stack
 * holds a 32 KB buffer of bounds, an 8 KB signed copy of the query group's screening bytes, an
 * 8 KB float64 copy of one query row and 8 KB of candidate lists; nothing else is allocated.
 */
#include <immintrin.h>
#include <math.h>

#include "avx512_shared.h"
#include "maxsim_internal.h"

#define NK_ICE_ROWS 8              /* query rows per group = accumulator rows of the micro-kernel */
#define NK_ICE_TILES 3             /* 16-row document tiles per micro-kernel call: 8 x 3 accumulators */
#define NK_ICE_BLOCK_DOCS 1024u    /* document rows per block of bounds; larger blocks rescore less */
#define NK_ICE_CHUNK_GROUPS 256u   /* 4-byte depth groups per pass over the query buffer (depth 1024) */
#define NK_ICE_LIST 128u           /* candidates collected per row before rescoring them best-first */
#define NK_ICE_DECODED_DEPTH 1024u /* deepest query row decoded to float64 on the stack (8 KB) */


/* ---- Screening. ----
 * VNNI multiplies unsigned by signed bytes, and only the signed operand can be a 32-bit memory
 * broadcast. Documents stream as stored (v + 128, unsigned); the small query group is converted
 * once to signed (XOR 0x80) into a stack buffer of [group][row] words, so each step is one load
 * per document tile, one broadcast per query row and 8 x tiles multiply-accumulates. The bias
 * adds 128 * (sum of the query's screen bytes), removed with screen_sums afterwards.
 *
 * Bounds are kept in units of the query's screening step s_q, so that only per-row constants
 * remain: with p_j = dot_j * s_d[j] (the estimate is s_q p_j), b = (1 + e_q) / s_q and
 * a = e_q + slack,
 *   UB_j = s_q (p_j + b e_j) + a.
 * The micro-kernel's epilogue stores p_j + b e_j and keeps, per lane, the largest of them tagged
 * with its tile (nk_x512_tag): the document that is rescored first. */

/* Per query group: the constants of each row and what the screening has seen so far. */
typedef struct nk_ice_group {
    float top[NK_ICE_ROWS][16];      /* per lane, the block's largest p + b e, tagged by nk_x512_tag */
    int32_t bias[NK_ICE_ROWS];       /* 128 * screen_sums[q]: the unsigned-operand offset */
    float growth[NK_ICE_ROWS];       /* b = (1 + e_q) / s_q */
    double inv_scale[NK_ICE_ROWS];   /* 1 / s_q */
    double offset[NK_ICE_ROWS];      /* a = e_q + slack */
    double best[NK_ICE_ROWS];        /* best exact cosine so far */
} nk_ice_group_t;

/* Documents of `tiles` adjacent 16-row tiles (full tiles `tile_stride` bytes apart, 64 bytes per
 * depth group; the first is tile `first_tile` of the block) against the 8 query rows, over `groups`
 * depth groups. With partial_rows > 0 the last tile is instead the matrix's partial one at `partial`
 * (4 partial_rows bytes per depth group), sharing the call's broadcasts. Partial sums live
 * in scores[r * NK_ICE_BLOCK_DOCS + 16 t + lane] between depth chunks (`accumulate`); on the last
 * chunk (`finish`) the epilogue turns them into upper bounds (-inf at absent lanes) and raises
 * group->top. */
NK_INLINE void nk_ice_screen_tiles(int32_t const *query_groups, uint64_t groups, uint8_t const *doc,
                                       uint64_t tile_stride, uint8_t const *partial, unsigned partial_rows,
                                       int const tiles, int accumulate, int finish, float *scores,
                                       nk_ice_group_t *group, float const *scales_d, float const *errors_d,
                                       unsigned first_tile) {
    __mmask16 last_lanes = partial_rows ? (__mmask16)((1u << partial_rows) - 1u) : (__mmask16)0xFFFF;
    __m512i acc[NK_ICE_ROWS][NK_ICE_TILES];
#pragma GCC unroll 8
    for (int r = 0; r < NK_ICE_ROWS; ++r)
#pragma GCC unroll 4
        for (int t = 0; t < tiles; ++t)
            acc[r][t] = accumulate ? _mm512_load_si512(scores + (unsigned)r * NK_ICE_BLOCK_DOCS + 16u * (unsigned)t)
                                   : _mm512_set1_epi32(-group->bias[r]); /* start at minus the query bias */
    for (uint64_t g = 0; g < groups; ++g, doc += 64, partial += 4 * partial_rows, query_groups += NK_ICE_ROWS) {
        __m512i doc_bytes[NK_ICE_TILES];
#pragma GCC unroll 4
        for (int t = 0; t < tiles; ++t)
            doc_bytes[t] = partial_rows && t == tiles - 1 ? _mm512_maskz_loadu_epi32(last_lanes, partial)
                                                          : _mm512_loadu_si512(doc + (uint64_t)t * tile_stride);
#pragma GCC unroll 8
        for (int r = 0; r < NK_ICE_ROWS; ++r) {
            __m512i query = _mm512_set1_epi32(query_groups[r]);
#pragma GCC unroll 4
            for (int t = 0; t < tiles; ++t) acc[r][t] = _mm512_dpbusd_epi32(acc[r][t], doc_bytes[t], query);
        }
    }
    if (!finish) {
#pragma GCC unroll 8
        for (int r = 0; r < NK_ICE_ROWS; ++r)
#pragma GCC unroll 4
            for (int t = 0; t < tiles; ++t)
                _mm512_store_si512(scores + (unsigned)r * NK_ICE_BLOCK_DOCS + 16u * (unsigned)t, acc[r][t]);
        return;
    }
    __m512 minus_infinity = _mm512_set1_ps(-INFINITY);
#pragma GCC unroll 8
    for (int r = 0; r < NK_ICE_ROWS; ++r) {
        __m512 growth = _mm512_set1_ps(group->growth[r]);
        __m512 top = _mm512_load_ps(group->top[r]);
#pragma GCC unroll 4
        for (int t = 0; t < tiles; ++t) {
            __mmask16 lanes = t == tiles - 1 ? last_lanes : (__mmask16)0xFFFF;
            __m512 estimate = _mm512_cvtepi32_ps(acc[r][t]);
            __m512 p = _mm512_mul_ps(estimate, _mm512_maskz_loadu_ps(lanes, scales_d + 16 * t));
            __m512 error_d = _mm512_maskz_loadu_ps(lanes, errors_d + 16 * t);
            __m512 upper = _mm512_fmadd_ps(growth, error_d, p);
            top = _mm512_mask_max_ps(top, lanes, top, nk_x512_tag(upper, first_tile + (unsigned)t));
            upper = _mm512_mask_mov_ps(minus_infinity, lanes, upper);
            _mm512_store_ps(scores + (unsigned)r * NK_ICE_BLOCK_DOCS + 16u * (unsigned)t, upper);
        }
        _mm512_store_ps(group->top[r], top);
    }
}

/* nk_ice_screen_tiles for a count of 1-3 tiles known only at run time. */
NK_INLINE void nk_ice_screen_rest(int32_t const *query_groups, uint64_t groups, uint8_t const *doc,
                                      uint64_t tile_stride, uint8_t const *partial, unsigned partial_rows, int tiles,
                                      int accumulate, int finish, float *scores, nk_ice_group_t *group,
                                      float const *scales_d, float const *errors_d, unsigned first_tile) {
    if (tiles == 3)
        nk_ice_screen_tiles(query_groups, groups, doc, tile_stride, partial, partial_rows, 3, accumulate, finish,
                            scores, group, scales_d, errors_d, first_tile);
    else if (tiles == 2)
        nk_ice_screen_tiles(query_groups, groups, doc, tile_stride, partial, partial_rows, 2, accumulate, finish,
                            scores, group, scales_d, errors_d, first_tile);
    else
        nk_ice_screen_tiles(query_groups, groups, doc, tile_stride, partial, partial_rows, 1, accumulate, finish,
                            scores, group, scales_d, errors_d, first_tile);
}

/* The matrix's last tile when it holds m <= 4 rows (stored 4 m bytes per depth group). Lanes pair
 * query row r with document row i as lane 8 (i % 2) + r of vector i / 2, so one (m <= 2) or two
 * multiply-accumulates per depth group replace the 8 of nk_ice_screen_tiles, whose lanes would be
 * mostly empty. Partial sums live in the first two rows of the tile's scores between depth chunks;
 * the epilogue writes every row's 16 lanes (-inf past m) and raises group->top as there. */
static NK_NOINLINE void nk_ice_screen_partial(int32_t const *query_groups, uint64_t groups,
                                                            uint8_t const *doc, unsigned m, int accumulate, int finish,
                                                            float *scores, nk_ice_group_t *group, float const *scales_d,
                                                            float const *errors_d, unsigned tile) {
    __mmask8 present = (__mmask8)((1u << m) - 1u);
    int vectors = m <= 2 ? 1 : 2;
    __m512i pair_low = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
    __m512i pair_high = _mm512_setr_epi32(2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
    /* Four partial sums per vector, over alternating depth groups: one chain of dependent
     * multiply-accumulates would take their latency, not their throughput, per group. */
    __m512i part[2][4], acc[2];
    __m512i start = _mm512_sub_epi32(_mm512_setzero_si512(),
                                     _mm512_broadcast_i32x8(_mm256_loadu_si256((__m256i const *)group->bias)));
    for (int v = 0; v < 2; ++v) {
        part[v][0] = accumulate ? _mm512_load_si512(scores + (unsigned)v * NK_ICE_BLOCK_DOCS) : start;
        part[v][1] = part[v][2] = part[v][3] = _mm512_setzero_si512();
    }
    uint64_t g = 0;
    for (; g + 4 <= groups; g += 4, doc += 16u * m, query_groups += 4 * NK_ICE_ROWS)
#pragma GCC unroll 4
        for (int k = 0; k < 4; ++k) {
            __m512i words = _mm512_castsi128_si512(_mm_maskz_loadu_epi32(present, doc + 4u * m * (unsigned)k));
            __m512i query =
                _mm512_broadcast_i32x8(_mm256_load_si256((__m256i const *)(query_groups + k * NK_ICE_ROWS)));
            part[0][k] = _mm512_dpbusd_epi32(part[0][k], _mm512_permutexvar_epi32(pair_low, words), query);
            if (vectors == 2)
                part[1][k] = _mm512_dpbusd_epi32(part[1][k], _mm512_permutexvar_epi32(pair_high, words), query);
        }
    for (; g < groups; ++g, doc += 4u * m, query_groups += NK_ICE_ROWS) {
        __m512i words = _mm512_castsi128_si512(_mm_maskz_loadu_epi32(present, doc));
        __m512i query = _mm512_broadcast_i32x8(_mm256_load_si256((__m256i const *)query_groups));
        part[0][0] = _mm512_dpbusd_epi32(part[0][0], _mm512_permutexvar_epi32(pair_low, words), query);
        if (vectors == 2)
            part[1][0] = _mm512_dpbusd_epi32(part[1][0], _mm512_permutexvar_epi32(pair_high, words), query);
    }
    for (int v = 0; v < 2; ++v)
        acc[v] = _mm512_add_epi32(_mm512_add_epi32(part[v][0], part[v][1]), _mm512_add_epi32(part[v][2], part[v][3]));
    if (!finish) {
        for (int v = 0; v < 2; ++v) _mm512_store_si512(scores + (unsigned)v * NK_ICE_BLOCK_DOCS, acc[v]);
        return;
    }
    __m512 scales = _mm512_castps128_ps512(_mm_maskz_loadu_ps(present, scales_d));
    __m512 errors = _mm512_castps128_ps512(_mm_maskz_loadu_ps(present, errors_d));
    __m512 growth = _mm512_broadcast_f32x8(_mm256_loadu_ps(group->growth));
    __m512 upper[2];
    upper[1] = _mm512_set1_ps(-INFINITY);
    for (int v = 0; v < vectors; ++v) {
        __m512i pair = v ? pair_high : pair_low;
        __m512 p = _mm512_mul_ps(_mm512_cvtepi32_ps(acc[v]), _mm512_permutexvar_ps(pair, scales));
        upper[v] = _mm512_fmadd_ps(growth, _mm512_permutexvar_ps(pair, errors), p);
    }
#pragma GCC unroll 8
    for (int r = 0; r < NK_ICE_ROWS; ++r) { /* row r: lanes r, 8 + r of both vectors */
        __m512i gather = _mm512_setr_epi32(r, 8 + r, 16 + r, 24 + r, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0);
        __m512 row = _mm512_mask_permutex2var_ps(upper[0], (__mmask16)present, gather, upper[1]);
        row = _mm512_mask_mov_ps(_mm512_set1_ps(-INFINITY), (__mmask16)present, row);
        _mm512_store_ps(scores + (unsigned)r * NK_ICE_BLOCK_DOCS, row);
        __m512 top = _mm512_load_ps(group->top[r]);
        _mm512_store_ps(group->top[r], _mm512_mask_max_ps(top, (__mmask16)present, top, nk_x512_tag(row, tile)));
    }
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
    __m256i flip = _mm256_set1_epi32((int)0x80808080u); /* stored v + 128 -> signed v */
    uint8_t const *source = q->screen + base + g0 * stride;
    for (uint64_t g = 0; g < groups; ++g, source += stride)
        _mm256_store_si256((__m256i *)(query_groups + g * NK_ICE_ROWS),
                           _mm256_maskz_xor_epi32(rows, _mm256_maskz_loadu_epi32(rows, source), flip));
}

/* Screen documents [first_doc, first_doc + docs) against one query group over the whole depth,
 * leaving upper bounds in `scores` and the block's tagged largest ones in group->top. */
static void nk_ice_screen_block(nk_maxsim_view_t const *q, nk_maxsim_view_t const *d, uint64_t first_query,
                                uint64_t first_doc, uint64_t docs, int32_t *query_groups, int query_groups_ready,
                                float *scores, nk_ice_group_t *group) {
    uint64_t total_groups = d->screen_depth / 4, tile_stride = NK_SCREEN_TILE * d->screen_depth;
    uint64_t full_tiles = docs / NK_SCREEN_TILE, partial_rows = docs % NK_SCREEN_TILE;
    uint8_t const *block = d->screen + first_doc * d->screen_depth; /* first_doc is a multiple of 16 */
    float const *scales_d = d->screen_scales + first_doc, *errors_d = d->screen_errors + first_doc;
    for (int r = 0; r < NK_ICE_ROWS; ++r) _mm512_store_ps(group->top[r], _mm512_set1_ps(-INFINITY));
    for (uint64_t g0 = 0; g0 < total_groups; g0 += NK_ICE_CHUNK_GROUPS) {
        uint64_t groups = total_groups - g0 < NK_ICE_CHUNK_GROUPS ? total_groups - g0 : NK_ICE_CHUNK_GROUPS;
        int accumulate = g0 != 0, finish = g0 + groups == total_groups;
        if (!query_groups_ready) nk_ice_load_query_groups(q, first_query, g0, groups, query_groups);
        /* Calls of 3 tiles, then one of the 1-3 left. A partial last tile of more than 4 rows is the
         * last tile of that call; one of at most 4 rows is screened on its own. */
        uint8_t const *chunk = block + g0 * 64, *partial = block + full_tiles * tile_stride + g0 * 4 * partial_rows;
        unsigned merged_rows = partial_rows > 4 ? (unsigned)partial_rows : 0u;
        uint64_t tiles = full_tiles + (merged_rows != 0), t = 0;
        for (; t + NK_ICE_TILES + (merged_rows != 0) <= tiles; t += NK_ICE_TILES)
            nk_ice_screen_tiles(query_groups, groups, chunk + t * tile_stride, tile_stride, chunk, 0, NK_ICE_TILES,
                                accumulate, finish, scores + t * 16, group, scales_d + t * 16, errors_d + t * 16,
                                (unsigned)t);
        if (t < tiles) {
            /* Two calls, not one passing merged_rows: with partial_rows a literal 0 the full-tile call
             * keeps unmasked loads and epilogue (run-time masks there measured 1 % slower at 32 x 180). */
            if (merged_rows)
                nk_ice_screen_rest(query_groups, groups, chunk + t * tile_stride, tile_stride, partial, merged_rows,
                                   (int)(tiles - t), accumulate, finish, scores + t * 16, group, scales_d + t * 16,
                                   errors_d + t * 16, (unsigned)t);
            else
                nk_ice_screen_rest(query_groups, groups, chunk + t * tile_stride, tile_stride, chunk, 0,
                                   (int)(tiles - t), accumulate, finish, scores + t * 16, group, scales_d + t * 16,
                                   errors_d + t * 16, (unsigned)t);
        }
        if (partial_rows && !merged_rows)
            nk_ice_screen_partial(query_groups, groups, partial, (unsigned)partial_rows, accumulate, finish,
                                  scores + full_tiles * 16, group, scales_d + full_tiles * 16,
                                  errors_d + full_tiles * 16, (unsigned)full_tiles);
    }
}

/* What rescoring needs for one query row. */
typedef struct nk_ice_row {
    nk_maxsim_view_t const *q, *d;
    void const *q_row;
    double const *decoded; /* the query row in float64, or NULL */
    size_t row_bytes;
    uint64_t first_doc;
    double inv_q, inv_scale_q, a;
    double *best, threshold;
} nk_ice_row_t;

/* Index of the largest of count >= 1 upper bounds. A plain loop: these lists are short, and the
 * branch-free search of sapphireamx.c (nk_samx_top) measured 1-4 % slower here at 32x180x128. */
NK_INLINE unsigned nk_ice_top(float const *upper, unsigned count) {
    unsigned top = 0;
    for (unsigned c = 1; c < count; ++c)
        if (upper[c] > upper[top]) top = c;
    return top;
}

/* Rescore collected candidates, the largest upper bound first, until none reaches the cut: a row
 * whose full list stopped its scan. Returns the (possibly raised) cut. */
static float nk_ice_drain(nk_ice_row_t *row, float *list_upper, int32_t *list_doc, unsigned count, float cut) {
    while (count) {
        unsigned top = nk_ice_top(list_upper, count);
        if (!(list_upper[top] >= cut)) break;
        double cos = nk_x512_cosine(row->q, row->d, row->q_row, row->decoded, row->inv_q,
                                   row->first_doc + (uint64_t)list_doc[top], row->row_bytes);
        nk_x512_take(cos, row->best, row->a, row->inv_scale_q, &row->threshold, &cut); /* tightens what follows */
        --count;
        list_upper[top] = list_upper[count];
        list_doc[top] = list_doc[count];
    }
    return cut;
}

/* Append the lanes of `upper` (tile t) that reach the cut to the candidate list, which has room
 * for 16 more. Compressing in registers and storing whole vectors is much faster than the
 * memory form of vcompressps. */
NK_INLINE unsigned nk_ice_collect(__m512 upper, __mmask16 candidates, uint64_t t, float *list_upper,
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
 * and the call cost 2-4 % at 32x180x128. */
NK_INLINE unsigned nk_ice_scan(float const *row_scores, uint64_t *tile, uint64_t tiles, float cut,
                                   float *list_upper, int32_t *list_doc) {
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
            if (count + 16 > NK_ICE_LIST) {
                *tile = t + (uint64_t)u;
                return count;
            }
            count = nk_ice_collect(upper[u], hit[u], t + (uint64_t)u, list_upper, list_doc, count);
        }
    }
    for (; t < tiles; ++t) {
        __m512 upper = _mm512_load_ps(row_scores + 16 * t);
        __mmask16 hit = _mm512_cmp_ps_mask(upper, cut_vector, _CMP_GE_OQ);
        if (!hit) continue;
        if (count + 16 > NK_ICE_LIST) break;
        count = nk_ice_collect(upper, hit, t, list_upper, list_doc, count);
    }
    *tile = t;
    return count;
}

/* Every document of one screened block whose upper bound reaches the best exact cosine is rescored
 * exactly, raising group->best. */
static void nk_ice_candidates(nk_maxsim_view_t const *q, nk_maxsim_view_t const *d, nk_ice_group_t *group,
                              uint64_t first_query, uint64_t rows, uint64_t first_doc, uint64_t docs,
                              float *scores, double *decoded_query) {
    size_t row_bytes = q->row_bytes;
    uint64_t tiles = (docs + NK_SCREEN_TILE - 1) / NK_SCREEN_TILE;
    double thresholds[NK_ICE_ROWS];
    float cuts[NK_ICE_ROWS];
    /* First every row's tagged largest bound is rescored, one independent float64 dot product per
     * row, so that the scan below starts from an exact cosine (usually the winner): only documents
     * within the error bound of it are collected, rarely any. */
    nk_x512_batch_t batch;
    batch.n = 0;
    for (uint64_t r = 0; r < rows; ++r) {
        thresholds[r] = -INFINITY, cuts[r] = -FLT_MAX;
        nk_x512_raise(group->best[r], group->offset[r], group->inv_scale[r], &thresholds[r], &cuts[r]);
        if (q->inv_norms[first_query + r] == 0.0) continue;
        nk_x512_queue_top(&batch, q, d, first_query, row_bytes, (unsigned)r, _mm512_load_ps(group->top[r]), cuts[r],
                          scores, NK_SCREEN_TILE, NK_ICE_BLOCK_DOCS, first_doc, docs);
    }
    nk_x512_rescore_batch(q, d, first_query, &batch, group->best, group->offset, group->inv_scale, thresholds, cuts);
    /* Then collect every row's candidates and, in a corpus (which does not fit in cache), prefetch
     * the stored row of each one's largest upper bound, so the misses of a whole group overlap.
     * (Prefetching every candidate fetches rows the float32 checks mostly never read.) */
    float list_upper[NK_ICE_ROWS][NK_ICE_LIST];
    int32_t list_doc[NK_ICE_ROWS][NK_ICE_LIST];
    unsigned counts[NK_ICE_ROWS];
    uint64_t next_tile[NK_ICE_ROWS];
    for (uint64_t r = 0; r < rows; ++r) {
        counts[r] = 0, next_tile[r] = tiles;
        if (q->inv_norms[first_query + r] == 0.0) continue;
        next_tile[r] = 0;
        counts[r] = nk_ice_scan(scores + r * NK_ICE_BLOCK_DOCS, &next_tile[r], tiles, cuts[r], list_upper[r],
                                list_doc[r]);
        if (!d->cold || !counts[r]) continue;
        unsigned top = nk_ice_top(list_upper[r], counts[r]);
        nk_x512_prefetch_row((char const *)d->values + (first_doc + (uint64_t)list_doc[r][top]) * row_bytes, row_bytes);
    }
    /* Rescore in rounds. A row with an exact cosine first checks every candidate that still
     * reaches its cut in float32 (a fraction of the float64 cost): one provably below that cosine
     * is dropped, which leaves only true near-ties. Then each round takes every row's largest upper
     * bound that still reaches its cut, so the float64 dot products of a round are independent work
     * for the core to overlap; the exact cosines raise the cuts before the next round. Only rows
     * with candidates left are visited (`active`): most rows have none. Rows whose full list
     * stopped the scan finish one at a time below. */
    int checks = q->dtype != nk_dtype_float64_k;
    double checked_against[NK_ICE_ROWS];
    unsigned active[NK_ICE_ROWS], live = 0; /* the rows with candidates left */
    for (uint64_t r = 0; r < rows; ++r) {
        checked_against[r] = -INFINITY;
        if (counts[r]) active[live++] = (unsigned)r;
    }
    for (;;) {
        for (unsigned a = 0; checks && a < live; ++a) {
            unsigned r = active[a];
            double best = group->best[r];
            if (!(best > checked_against[r])) continue; /* nothing new to check against */
            checked_against[r] = best;
            void const *q_row = (char const *)q->values + (first_query + r) * row_bytes;
            double inv_q = q->inv_norms[first_query + r];
            for (unsigned c = 0; c < counts[r];) {
                uint64_t doc = first_doc + (uint64_t)list_doc[r][c];
                double inv_d = d->inv_norms[doc], slack;
                if (list_upper[r][c] >= cuts[r] && inv_d != 0.0 &&
                    nk_x512_cosine_f32((int)q->dtype, q_row, 0, (char const *)d->values + doc * row_bytes, q->depth,
                                       inv_q, inv_d, &slack) + slack < best) {
                    unsigned last = --counts[r];
                    list_upper[r][c] = list_upper[r][last];
                    list_doc[r][c] = list_doc[r][last];
                    continue;
                }
                ++c;
            }
        }
        batch.n = 0;
        unsigned kept = 0;
        for (unsigned a = 0; a < live; ++a) {
            unsigned r = active[a];
            if (!counts[r]) continue;
            unsigned top = nk_ice_top(list_upper[r], counts[r]), last = --counts[r];
            if (!(list_upper[r][top] >= cuts[r])) { /* nothing left in the list can win */
                counts[r] = 0;
                continue;
            }
            nk_x512_batch_add(&batch, q, d, first_query, row_bytes, r, first_doc + (uint64_t)list_doc[r][top]);
            list_upper[r][top] = list_upper[r][last]; /* taken out of the list */
            list_doc[r][top] = list_doc[r][last];
            if (counts[r]) active[kept++] = r;
        }
        live = kept;
        if (!batch.n) break;
        nk_x512_rescore_batch(q, d, first_query, &batch, group->best, group->offset, group->inv_scale, thresholds,
                              cuts);
    }
    for (uint64_t r = 0; r < rows; ++r) {
        uint64_t i = first_query + r, tile = next_tile[r];
        if (tile == tiles) continue;
        float const *row_scores = scores + r * NK_ICE_BLOCK_DOCS;
        void const *q_row = (char const *)q->values + i * row_bytes;
        /* Decode the query row once for its many candidates (float64 rows are used in place). */
        double const *decoded = NULL;
        if (q->dtype == nk_dtype_float64_k) decoded = (double const *)q_row;
        else if (q->depth <= NK_ICE_DECODED_DEPTH && !nk_x512_is_integer((int)q->dtype)) { /* integers, as stored */
            nk_x512_decode_row((int)q->dtype, q_row, q->depth, decoded_query);
            decoded = decoded_query;
        }
        nk_ice_row_t row = {q,    d, q_row, decoded, row_bytes, first_doc, q->inv_norms[i], group->inv_scale[r],
                            group->offset[r], &group->best[r], thresholds[r]};
        float cut = cuts[r];
        while (tile < tiles) { /* continue the scan that a full list stopped, with the raised cut */
            unsigned count = nk_ice_scan(row_scores, &tile, tiles, cut, list_upper[r], list_doc[r]);
            cut = nk_ice_drain(&row, list_upper[r], list_doc[r], count, cut);
        }
    }
}

/* A query group's per-row constants and empty state for rows [first, first + rows). */
static void nk_ice_group_init(nk_maxsim_view_t const *q, uint64_t first, uint64_t rows, nk_ice_group_t *group) {
    nk_x512_row_constants_t c = nk_x512_row_constants(q, first, rows);
    _mm256_storeu_ps(group->growth, c.growth);
    _mm256_storeu_si256((__m256i *)group->bias, c.bias);
    _mm512_storeu_pd(group->inv_scale, c.inv_scale);
    _mm512_storeu_pd(group->offset, c.offset);
    _mm512_storeu_pd(group->best, _mm512_set1_pd(-INFINITY));
}

double nk_maxsim_icelake(nk_maxsim_view_t const *q, nk_maxsim_view_t const *d) {

    _Alignas(64) float scores[NK_ICE_ROWS * NK_ICE_BLOCK_DOCS];
    _Alignas(64) int32_t query_groups[NK_ICE_CHUNK_GROUPS * NK_ICE_ROWS];
    _Alignas(64) nk_ice_group_t group;
    _Alignas(64) double decoded_query[NK_ICE_DECODED_DEPTH];
    int single_chunk = d->screen_depth / 4 <= NK_ICE_CHUNK_GROUPS;
    double total = 0.0;

    for (uint64_t first_query = 0; first_query < q->vectors; first_query += NK_ICE_ROWS) {
        uint64_t rows = q->vectors - first_query < NK_ICE_ROWS ? q->vectors - first_query : NK_ICE_ROWS;
        nk_ice_group_init(q, first_query, rows, &group);
        /* With one depth chunk the converted query group serves every document block. */
        if (single_chunk) nk_ice_load_query_groups(q, first_query, 0, d->screen_depth / 4, query_groups);

        for (uint64_t first_doc = 0; first_doc < d->vectors; first_doc += NK_ICE_BLOCK_DOCS) {
            uint64_t docs = d->vectors - first_doc < NK_ICE_BLOCK_DOCS ? d->vectors - first_doc : NK_ICE_BLOCK_DOCS;
            nk_ice_screen_block(q, d, first_query, first_doc, docs, query_groups, single_chunk, scores, &group);
            nk_ice_candidates(q, d, &group, first_query, rows, first_doc, docs, scores, decoded_query);
        }
        for (uint64_t r = 0; r < rows; ++r)
            total += nk_row_distance(q->inv_norms[first_query + r], group.best[r]);
    }
    return total;
}
