/* Skylake-X family: AVX-512 F/CD/BW/DQ/VL, no VNNI.
 *
 * The family primitives of driver.h: an int8 GEMM screens a group of 16 query rows (one 16 x 16
 * register tile) against blocks of up to 960 documents, its epilogue turns the sums into u
 * (driver.h) and keeps each row's tagged largest u (nk_x512_tag); driver.h's scan collects
 * candidates with nk_x512_collect; exact dot products are the float64 ones below, one per pair.
 *
 * Stack: the group's split query words (16 KB), tops and few-document sums (2 KB), and driver.h's:
 * 60 KB of u, 16 KB of candidate lists, 8 KB of decoded row; about 103 KB in all.
 */
#include <immintrin.h>
#include <math.h>

#include "avx512_dot.h"
#include "avx512_shared.h"
#include "maxsim_internal.h"

#define NK_SKL_TILE 16u          /* query rows per group = rows per screen tile */
/* Document rows per block of bounds. Not 1024: u's rows would be 4 KB apart, and a tile's 16 rows
 * would share one L1 set (more than its ways); 3840 bytes spread them over 16 sets. 32x18x128 went
 * from 1.01-1.06 to 0.93-0.99 of the old kernel, and 960 matched 1024 with padded rows elsewhere. */
#define NK_SKL_BLOCK_DOCS 960u
#define NK_SKL_CHUNK_GROUPS 128u /* 4-depth groups per depth chunk of split query words */
/* driver.h's group of query rows and block of documents */
#define NK_DRIVER_ROWS NK_SKL_TILE
#define NK_DRIVER_BLOCK NK_SKL_BLOCK_DOCS

/* ---- Exact float64 dot products of stored rows: the shared AVX-512 ones (avx512_dot.h), in the
 * canonical order every family follows. ---- */

/* float64 dot of two stored rows, decoded exactly as nk_decode() does. */
static inline double nk_skl_dot(int dtype, void const *a, void const *b, uint64_t n) {
    return nk_x512_dot_stored(dtype, a, b, n);
}

/* driver.h's batch of exact dot products, pair by pair. */
static void nk_skl_dot_batch(int dtype, void const *const *a, void const *const *b, unsigned n, uint64_t depth,
                             double *out) {
    for (unsigned k = 0; k < n; ++k) out[k] = nk_skl_dot(dtype, a[k], b[k], depth);
}
#define nk_family_dot_batch nk_skl_dot_batch

/* ---- Screening ----
 * Without VNNI there is no u8 x s8 -> s32 instruction, and vpmaddubsw would saturate on biased
 * bytes (255 * 127 * 2 > 32767), so both operands stay biased (0..255) and are split into the even
 * and odd bytes of each 4-byte group as 16-bit words: two vpmaddwd cover the 4 depths exactly in
 * int32. The bias terms are removed with the packer's row sums in wrapping 32-bit arithmetic (the
 * true dot fits int32). The query rows sit in up to 16 accumulators and their split words come from
 * the group's buffer as broadcasts, so per 4 depths the inner loop is 1 load, 2 splits, 32 vpmaddwd
 * and 32 vpaddd for 16 x 16 x 4 multiply-accumulates: 4 vector ops per 64, the floor without VNNI.
 * The epilogue stores u = p + b e (driver.h) and keeps, per lane, the largest u tagged with its
 * tile: the document the driver rescores first. */

/* A query group's screening state. */
typedef struct nk_skl_group {
    _Alignas(64) float top[NK_SKL_TILE][16];                      /* per lane, the block's largest u, tagged */
    _Alignas(64) int32_t negative_bias[NK_SKL_TILE];               /* -(128 sum(v_q) + 128 * 128 * screen_depth) */
    _Alignas(64) float growth[NK_SKL_TILE];                        /* b = (1 + e_q) / s_q, from the driver */
    _Alignas(64) int32_t few_sums[NK_SKL_TILE * NK_SKL_TILE];      /* [document][row] sums of the few-docs path */
    _Alignas(64) uint32_t split[NK_SKL_CHUNK_GROUPS * 2 * NK_SKL_TILE]; /* [group][even, odd][row] words */
    uint8_t const *tile;      /* the group's query screen tile */
    uint64_t stride;          /* its bytes per depth group */
    __mmask64 mask;           /* and the bytes of those that are present */
    unsigned rows;            /* query rows in the tile */
    int split_ready;          /* the whole depth is in `split` (one chunk) */
    int few_docs;             /* the matrix's partial last tile goes through nk_skl_screen_few_docs */
    nk_prefetch_stream_t *prefetch; /* the next document: two lines per depth group screened */
} nk_skl_group_t;
#define nk_family_query_t nk_skl_group_t

/* Where the epilogue finds one document tile's per-row data. Loaded after the depth loop, not
 * before it, so nothing but the accumulators competes for registers inside the loop. */
typedef struct nk_skl_doc_tile {
    float const *scales, *errors;
    int32_t const *sums;
    __mmask16 valid;
    unsigned index; /* the tile within the block: its tag */
} nk_skl_doc_tile_t;

/* Screen `rows` query rows (a compile-time count after inlining, so the accumulators live in
 * registers) starting at row0 of the group against one document tile, over `groups` 4-depth
 * groups. `u` (row stride NK_SKL_BLOCK_DOCS) holds int32 partial sums between depth chunks and
 * receives u after the last one (-inf at absent lanes), which also raises group->top. */
NK_INLINE void nk_skl_screen_rows(unsigned const rows, unsigned const row0, nk_skl_group_t *group, uint64_t groups,
                                  uint8_t const *doc, uint64_t doc_stride, __mmask64 doc_mask, int first, int last,
                                  float *u, nk_skl_doc_tile_t const *tile) {
    /* Start from minus the query's bias terms, so only the document's remain at the end. */
    __m512i acc[NK_SKL_TILE];
#pragma GCC unroll 16
    for (unsigned r = 0; r < rows; ++r)
        acc[r] = first ? _mm512_set1_epi32(group->negative_bias[row0 + r])
                       : _mm512_load_si512((void const *)(u + r * NK_SKL_BLOCK_DOCS));
    __m512i const even_bytes = _mm512_set1_epi32(0x00FF00FF);
    uint32_t const *split = group->split + row0;
    nk_prefetch_stream_t prefetch = *group->prefetch; /* in registers through the loop */
    for (uint64_t g = 0; g < groups; ++g) {
        __m512i d_bytes = _mm512_maskz_loadu_epi8(doc_mask, doc + g * doc_stride);
        nk_prefetch_lines(&prefetch, 2); /* full scoring streams the values too: 3x the screen */
        __m512i d_even = _mm512_and_si512(d_bytes, even_bytes), d_odd = _mm512_srli_epi16(d_bytes, 8);
        uint32_t const *q_group = split + g * 2 * NK_SKL_TILE;
#pragma GCC unroll 16
        for (unsigned r = 0; r < rows; ++r) {
            __m512i q_even = _mm512_set1_epi32((int)q_group[r]);
            __m512i q_odd = _mm512_set1_epi32((int)q_group[NK_SKL_TILE + r]);
            acc[r] = _mm512_add_epi32(acc[r], _mm512_madd_epi16(d_even, q_even));
            acc[r] = _mm512_add_epi32(acc[r], _mm512_madd_epi16(d_odd, q_odd));
        }
    }
    *group->prefetch = prefetch;
    if (!last) {
#pragma GCC unroll 16
        for (unsigned r = 0; r < rows; ++r) _mm512_store_si512((void *)(u + r * NK_SKL_BLOCK_DOCS), acc[r]);
        return;
    }
    __m512 const doc_scale = _mm512_maskz_loadu_ps(tile->valid, tile->scales);
    __m512 const doc_error = _mm512_maskz_loadu_ps(tile->valid, tile->errors);
    __m512i const doc_bias = _mm512_slli_epi32(_mm512_maskz_loadu_epi32(tile->valid, tile->sums), 7);
    __m512 const minus_infinity = _mm512_set1_ps(-INFINITY);
#pragma GCC unroll 16
    for (unsigned r = 0; r < rows; ++r) {
        /* exact int8 dot: the biased sum minus the document's bias term, wrapping (fits int32) */
        __m512 dot = _mm512_cvtepi32_ps(_mm512_sub_epi32(acc[r], doc_bias));
        __m512 b = _mm512_set1_ps(group->growth[row0 + r]);
        __m512 bound = _mm512_fmadd_ps(b, doc_error, _mm512_mul_ps(dot, doc_scale));
        _mm512_store_ps(u + r * NK_SKL_BLOCK_DOCS, _mm512_mask_mov_ps(minus_infinity, tile->valid, bound));
        float *top = group->top[row0 + r];
        _mm512_store_ps(top, _mm512_mask_max_ps(_mm512_load_ps(top), tile->valid, nk_x512_tag(bound, tile->index),
                                                _mm512_load_ps(top))); /* a NaN tag keeps the top */
    }
}

/* All rows of the group against one document tile, in register blocks of 16/8/4/2/1 rows. */
static void nk_skl_screen_tile(nk_skl_group_t *group, uint64_t groups, uint8_t const *doc, uint64_t doc_stride,
                               __mmask64 doc_mask, int first, int last, float *u, nk_skl_doc_tile_t const *tile) {
    unsigned row0 = 0, rows = group->rows;
#define NK_SKL_ROWS(n)                                                                                              \
    nk_skl_screen_rows(n, row0, group, groups, doc, doc_stride, doc_mask, first, last,                              \
                       u + row0 * NK_SKL_BLOCK_DOCS, tile);                                                         \
    row0 += n
    if (rows - row0 >= 16) { NK_SKL_ROWS(16); }
    if (rows - row0 >= 8) { NK_SKL_ROWS(8); }
    if (rows - row0 >= 4) { NK_SKL_ROWS(4); }
    if (rows - row0 >= 2) { NK_SKL_ROWS(2); }
    if (rows - row0 >= 1) { NK_SKL_ROWS(1); }
#undef NK_SKL_ROWS
}

/* The matrix's last document tile when it holds only a few rows: the 16 query rows of the split
 * words form the vector and each document's 4-byte group is broadcast, so the work scales with the
 * documents present rather than with a full tile. Documents go 4 at a time (a missing one repeats
 * the last row, so nothing past the tile is read). group->few_sums holds the sums between depth
 * chunks. After the last, u gets the usual layout (-inf past the documents): whole -inf rows first,
 * then each document's lanes; no vector reads back those narrow stores (a store-forwarding stall).
 * Each row's largest u is found with its lane as the tag, then merged into group->top. */
static void nk_skl_screen_few_docs(nk_skl_group_t *group, unsigned doc_rows, uint64_t groups, uint8_t const *doc,
                                   int first, int last, float *u, nk_skl_doc_tile_t const *tile) {
    uint64_t const stride = 4u * doc_rows;
    __m512i const even_bytes = _mm512_set1_epi32(0x00FF00FF);
    __m512 const growth = _mm512_load_ps(group->growth);
    __m512 largest = _mm512_set1_ps(-INFINITY); /* per row (lane), tagged with the document */
    if (last)
        for (unsigned r = 0; r < group->rows; ++r) _mm512_store_ps(u + r * NK_SKL_BLOCK_DOCS, largest);
    for (unsigned m0 = 0; m0 < doc_rows; m0 += 4) {
        __m512i acc[4];
        unsigned lane[4];
#pragma GCC unroll 4
        for (unsigned m = 0; m < 4; ++m) {
            lane[m] = m0 + m < doc_rows ? m0 + m : doc_rows - 1;
            acc[m] = first ? _mm512_load_si512((void const *)group->negative_bias)
                           : _mm512_load_si512((void const *)(group->few_sums + (m0 + m) * NK_SKL_TILE));
        }
        for (uint64_t g = 0; g < groups; ++g) {
            __m512i q_even = _mm512_load_si512((void const *)(group->split + g * 2 * NK_SKL_TILE));
            __m512i q_odd = _mm512_load_si512((void const *)(group->split + g * 2 * NK_SKL_TILE + NK_SKL_TILE));
            uint8_t const *bytes = doc + g * stride;
#pragma GCC unroll 4
            for (unsigned m = 0; m < 4; ++m) {
                uint32_t bits;
                memcpy(&bits, bytes + 4u * lane[m], 4);
                __m512i d_bytes = _mm512_set1_epi32((int)bits);
                acc[m] = _mm512_add_epi32(acc[m], _mm512_madd_epi16(q_even, _mm512_and_si512(d_bytes, even_bytes)));
                acc[m] = _mm512_add_epi32(acc[m], _mm512_madd_epi16(q_odd, _mm512_srli_epi16(d_bytes, 8)));
            }
        }
#pragma GCC unroll 4
        for (unsigned m = 0; m < 4; ++m) {
            unsigned j = m0 + m;
            if (j >= doc_rows) break;
            if (!last) {
                _mm512_store_si512((void *)(group->few_sums + j * NK_SKL_TILE), acc[m]);
                continue;
            }
            /* Same arithmetic as nk_skl_screen_rows, with rows in the lanes. */
            __m512i doc_bias = _mm512_set1_epi32((int32_t)((uint32_t)tile->sums[j] * 128u));
            __m512 dot = _mm512_cvtepi32_ps(_mm512_sub_epi32(acc[m], doc_bias));
            __m512 bound = _mm512_fmadd_ps(growth, _mm512_set1_ps(tile->errors[j]),
                                           _mm512_mul_ps(dot, _mm512_set1_ps(tile->scales[j])));
            largest = _mm512_max_ps(nk_x512_tag(bound, j), largest); /* a NaN tag keeps `largest` */
            _Alignas(64) float by_row[NK_SKL_TILE];
            _mm512_store_ps(by_row, bound);
            for (unsigned r = 0; r < group->rows; ++r) u[r * NK_SKL_BLOCK_DOCS + j] = by_row[r];
        }
    }
    if (!last) return;
    _Alignas(64) int32_t tagged[NK_SKL_TILE];
    _mm512_store_ps((float *)tagged, largest);
    for (unsigned r = 0; r < group->rows; ++r) { /* retag with the tile, into the row's lane */
        float *top = &group->top[r][tagged[r] & NK_X512_TAG_BITS];
        float value = nk_f32_from_bits(((uint32_t)tagged[r] & ~(uint32_t)NK_X512_TAG_BITS) | tile->index);
        if (value > *top) *top = value;
    }
}

/* Split the group's 4-byte groups [g0, g0 + groups) into even and odd 16-bit words. */
static void nk_skl_split_queries(nk_skl_group_t *group, uint64_t g0, uint64_t groups) {
    __m512i const even_bytes = _mm512_set1_epi32(0x00FF00FF);
    for (uint64_t g = 0; g < groups; ++g) {
        __m512i bytes = _mm512_maskz_loadu_epi8(group->mask, group->tile + (g0 + g) * group->stride);
        _mm512_store_si512((void *)(group->split + g * 2 * NK_SKL_TILE), _mm512_and_si512(bytes, even_bytes));
        _mm512_store_si512((void *)(group->split + g * 2 * NK_SKL_TILE + NK_SKL_TILE), _mm512_srli_epi16(bytes, 8));
    }
}

/* ---- The driver's primitives. ---- */

static void nk_skl_prepare(nk_maxsim_view_t const *q, nk_maxsim_view_t const *d, uint64_t first, uint64_t rows,
                           nk_skl_group_t *group) {
    uint64_t const groups = q->screen_depth / 4;
    uint32_t bias_depth = (uint32_t)q->screen_depth * 16384u;
    group->rows = (unsigned)rows;
    group->tile = q->screen + first * q->screen_depth; /* first is a multiple of 16 */
    group->stride = 4u * rows;
    group->mask = rows == NK_SKL_TILE ? ~(__mmask64)0 : (((__mmask64)1 << group->stride) - 1);
    for (unsigned r = 0; r < NK_SKL_TILE; ++r) /* rows past the tile stay zero in the few-documents lanes */
        group->negative_bias[r] =
            r < rows ? (int32_t)(0u - ((uint32_t)q->screen_sums[first + r] * 128u + bias_depth)) : 0;
    /* Vector op counts per 4-depth group for the last document tile: a few documents against all
     * rows, or all rows (in 16/8/4/2/1 blocks) against a full tile. */
    unsigned tail_rows = (unsigned)(d->vectors % NK_SKL_TILE);
    unsigned few_docs_cost = 24u * ((tail_rows + 3u) / 4u);
    unsigned row_blocks_cost = 4u * group->rows + 2u * nk_popcount32(group->rows);
    group->few_docs = tail_rows != 0 && few_docs_cost < row_blocks_cost;
    /* With one depth chunk the split words serve every document block. */
    group->split_ready = groups <= NK_SKL_CHUNK_GROUPS;
    if (group->split_ready) nk_skl_split_queries(group, 0, groups);
}
#define nk_family_prepare nk_skl_prepare

static void nk_skl_screen(nk_skl_group_t *group, float const *growth, uint64_t rows, nk_maxsim_view_t const *d,
                          uint64_t first_doc, uint64_t docs, float *u, int32_t *top, nk_prefetch_stream_t *prefetch) {
    group->prefetch = prefetch;
    uint64_t const groups = d->screen_depth / 4, tiles = (docs + NK_SKL_TILE - 1) / NK_SKL_TILE;
    for (unsigned r = 0; r < NK_SKL_TILE; ++r) {
        group->growth[r] = r < rows ? growth[r] : 0.0f;
        _mm512_store_ps(group->top[r], _mm512_set1_ps(-INFINITY));
    }
    for (uint64_t g0 = 0; g0 < groups; g0 += NK_SKL_CHUNK_GROUPS) {
        uint64_t chunk_groups = groups - g0 < NK_SKL_CHUNK_GROUPS ? groups - g0 : NK_SKL_CHUNK_GROUPS;
        int first = g0 == 0, last = g0 + chunk_groups == groups;
        if (!group->split_ready) nk_skl_split_queries(group, g0, chunk_groups);
        for (uint64_t t = 0; t < tiles; ++t) {
            uint64_t d0 = first_doc + t * NK_SKL_TILE, tile_left = d->vectors - d0;
            unsigned doc_rows = tile_left < NK_SKL_TILE ? (unsigned)tile_left : NK_SKL_TILE;
            uint64_t doc_stride = 4u * doc_rows;
            nk_skl_doc_tile_t tile;
            tile.valid = (__mmask16)((1u << doc_rows) - 1u);
            tile.scales = d->screen_scales + d0;
            tile.errors = d->screen_errors + d0;
            tile.sums = d->screen_sums + d0;
            tile.index = (unsigned)t;
            uint8_t const *doc = d->screen + d0 * d->screen_depth + g0 * doc_stride;
            if (doc_rows < NK_SKL_TILE && group->few_docs)
                nk_skl_screen_few_docs(group, doc_rows, chunk_groups, doc, first, last, u + t * NK_SKL_TILE, &tile);
            else {
                __mmask64 doc_mask = doc_rows == NK_SKL_TILE ? ~(__mmask64)0 : (((__mmask64)1 << doc_stride) - 1);
                nk_skl_screen_tile(group, chunk_groups, doc, doc_stride, doc_mask, first, last, u + t * NK_SKL_TILE,
                                   &tile);
            }
        }
    }
    nk_x512_read_tops(group->top, rows, docs, top);
}
#define nk_family_screen nk_skl_screen

#include "driver.h"

#include "integer_maxsim.h"

NK_FAMILY_KERNEL(nk_maxsim_skylake)

#include "avx512_unpacked.h"

int nk_maxsim_unpacked_skylake(nk_maxsim_view_t const *q, float const *const *documents, uint64_t const *rows,
                               int64_t const *strides, uint64_t count, uint64_t max_rows, void *scratch,
                               double *scores) {
    return nk_unp_score(q, documents, rows, strides, count, max_rows, scratch, scores);
}
