/* Ice Lake family: AVX-512 F/CD/BW/DQ/VL + VNNI (and VBMI, for the exact e4m3 dot products).
 *
 * The family primitives of driver.h: an int8 VNNI GEMM screens a group of 8 query rows against
 * blocks of up to 1024 documents, its epilogue turns the sums into u (driver.h) and keeps each
 * row's tagged largest u; candidates are collected 64 documents per branch; exact dot products and
 * float32 checks are avx512_dot.h's.
 */
#include <immintrin.h>
#include <math.h>

#include "avx512_shared.h"
#include "maxsim_internal.h"

#define NK_ICE_ROWS 8              /* query rows per group = accumulator rows of the micro-kernel */
#define NK_ICE_TILES 3             /* 16-row document tiles per micro-kernel call: 8 x 3 accumulators */
#define NK_ICE_BLOCK_DOCS 1024u    /* document rows per block of bounds; larger blocks rescore less */
#define NK_ICE_CHUNK_GROUPS 256u   /* 4-byte depth groups per pass over the query buffer (depth 1024) */
/* driver.h's group of query rows and block of documents */
#define NK_DRIVER_ROWS NK_ICE_ROWS
#define NK_DRIVER_BLOCK NK_ICE_BLOCK_DOCS

/* ---- Screening. ----
 * VNNI multiplies unsigned by signed bytes, and only the signed operand can be a 32-bit memory
 * broadcast. Documents stream as stored (v + 128, unsigned); the small query group is converted
 * once to signed (XOR 0x80) into a stack buffer of [group][row] words, so each step is one load
 * per document tile, one broadcast per query row and 8 x tiles multiply-accumulates. The bias
 * adds 128 * (sum of the query's screen bytes); each sum starts at minus that. The epilogue
 * stores u = p + b e (driver.h) and keeps, per lane, the largest u tagged with its tile
 * (nk_x512_tag): the document the driver rescores first. */

/* A query group's screening state. */
typedef struct nk_ice_group {
    _Alignas(64) float top[NK_ICE_ROWS][16];      /* per lane, the block's largest u, tagged */
    int32_t start[NK_ICE_ROWS];                   /* -128 * screen_sums[q]: cancels the unsigned offset */
    float const *growth;                          /* b = (1 + e_q) / s_q: the driver's, 8 rows */
    _Alignas(64) int32_t words[NK_ICE_CHUNK_GROUPS * NK_ICE_ROWS]; /* signed words, [group][row] */
    nk_maxsim_view_t const *q;
    uint64_t first;
    int words_ready; /* the whole depth is in `words` (one chunk) */
    nk_prefetch_stream_t *prefetch; /* the next document: two lines per depth group screened */
} nk_ice_group_t;
#define nk_family_query_t nk_ice_group_t

/* One depth group of nk_ice_screen_tiles: a load per document tile, a broadcast per query row and
 * rows x tiles multiply-accumulates. */
NK_INLINE void nk_ice_screen_step(__m512i (*acc)[NK_ICE_TILES], int32_t const *query_groups, uint8_t const *doc,
                                  uint64_t tile_stride, uint8_t const *partial, unsigned partial_rows,
                                  __mmask16 last_lanes, int const tiles) {
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
                                   : _mm512_set1_epi32(group->start[r]);
    /* Two lines of the next document per depth group while there are any (full scoring streams the
     * values too: 3x the screen). A call with none runs a loop without the test: 8x40x128 in C took
     * 0.96-0.98 of the time, 32x180x128 the same. */
    nk_prefetch_stream_t prefetch = *group->prefetch; /* in registers through the loop */
    uint64_t g = 0;
    if (prefetch.lines)
        for (; g < groups; ++g, doc += 64, partial += 4 * partial_rows, query_groups += NK_ICE_ROWS) {
            nk_prefetch_lines(&prefetch, 2);
            nk_ice_screen_step(acc, query_groups, doc, tile_stride, partial, partial_rows, last_lanes, tiles);
        }
    for (; g < groups; ++g, doc += 64, partial += 4 * partial_rows, query_groups += NK_ICE_ROWS)
        nk_ice_screen_step(acc, query_groups, doc, tile_stride, partial, partial_rows, last_lanes, tiles);
    *group->prefetch = prefetch;
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
    __m512i start = _mm512_broadcast_i32x8(_mm256_loadu_si256((__m256i const *)group->start));
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

/* ---- The driver's primitives. ---- */

static void nk_ice_prepare(nk_maxsim_view_t const *q, nk_maxsim_view_t const *d, uint64_t first, uint64_t rows,
                           nk_ice_group_t *group) {
    for (unsigned r = 0; r < NK_ICE_ROWS; ++r)
        /* Unsigned: a buffer changed after validation may hold any sum; it must wrap, not overflow. */
        group->start[r] =
            r < rows && q->inv_norms[first + r] != 0.0 ? (int32_t)(0u - (uint32_t)q->screen_sums[first + r] * 128u) : 0;
    group->q = q, group->first = first;
    /* With one depth chunk the converted query group serves every document block. */
    group->words_ready = d->screen_depth / 4 <= NK_ICE_CHUNK_GROUPS;
    if (group->words_ready) nk_ice_load_query_groups(q, first, 0, d->screen_depth / 4, group->words);
}
#define nk_family_prepare nk_ice_prepare

static void nk_ice_screen(nk_ice_group_t *group, float const *growth, uint64_t rows, nk_maxsim_view_t const *d,
                          uint64_t first_doc, uint64_t docs, float *u, int32_t *top, nk_prefetch_stream_t *prefetch) {
    group->prefetch = prefetch;
    group->growth = growth;
    nk_ice_screen_block(group->q, d, group->first, first_doc, docs, group->words, group->words_ready, u, group);
    nk_x512_read_tops(group->top, rows, docs, top);
}
#define nk_family_screen nk_ice_screen

#include "avx512_rescoring.h"
#include "driver.h"

#include "avx512_integer.h"
#include "integer_maxsim.h"

NK_FAMILY_KERNEL(nk_maxsim_icelake)
