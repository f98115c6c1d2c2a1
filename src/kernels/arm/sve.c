/* Arm SVE family, vector-length agnostic (any VL from 128 to 2048 bits), on driver.h.
 *
 * Only the screening micro-kernel is SVE's own: UDOT by lane on the stored (biased, unsigned) bytes of
 * both operands over "columns", one vector's worth (or less) of a tile's 4n-byte depth group, so a
 * tile is 1 column at VL >= 512 and 4 at VL 128; predicates cover partial tiles and wide vectors.
 * Query words are replicated per 128-bit segment with LD1RQ, so the indexed UDOT selects the same
 * query row in every segment whatever the VL. The query group, the epilogue (bias removal, u and
 * tagged tops), the scan and the exact dot batch are the Advanced SIMD code of neon_shared.h, shared
 * with neon.c: the epilogue and scan are a small part of the work, and neon_dot.h's float64
 * throughput matches SVE's on 128- and 256-bit cores. Groups of 8 query rows, blocks of 512 documents.
 *
 * Stack, fixed: u 16 KB, the query group 8 KB and its 2 KB column table, the driver's candidate lists
 * 8 KB; GCC 12 -fstack-usage gives 37.3 KB for nk_driver_maxsim (the unused decoded row dropped) and
 * at most 0.5 KB below it.
 */
#include <arm_neon.h>
#include <arm_sve.h>
#include <math.h>

#include "maxsim_internal.h"
#include "neon_shared.h"

#define NK_SVE_MAX_COLUMNS (NK_ARM_BLOCK_DOCS / 4u) /* at VL 128 a column holds 4 documents */

/* A column: `bytes` (<= VL/8) consecutive bytes of each depth group of one tile, starting at
 * screen byte `offset` for group 0, groups `stride` (= 4 x rows of the tile) bytes apart; its
 * first document is `first` within the block. */
typedef struct nk_sve_column {
    uint64_t offset;
    uint32_t stride, bytes, first;
} nk_sve_column_t;

/* driver.h's nk_family_query_t: the shared group and the current block's columns. */
typedef struct nk_sve_query {
    nk_arm_group_t group;
    nk_sve_column_t columns[NK_SVE_MAX_COLUMNS];
} nk_sve_query_t;

/* Columns of documents [first_doc, first_doc + docs); first_doc is a multiple of 16. */
static unsigned nk_sve_columns(nk_maxsim_view_t const *d, uint64_t first_doc, uint64_t docs, nk_sve_column_t *columns) {
    uint32_t vector_bytes = (uint32_t)svcntb();
    unsigned count = 0;
    for (uint64_t start = 0; start < docs; start += NK_SCREEN_TILE) {
        uint32_t rows = (uint32_t)(docs - start < NK_SCREEN_TILE ? docs - start : NK_SCREEN_TILE), stride = 4 * rows;
        for (uint32_t byte = 0; byte < stride; byte += vector_bytes) {
            columns[count].offset = (first_doc + start) * d->screen_depth + byte;
            columns[count].stride = stride;
            columns[count].bytes = stride - byte < vector_bytes ? stride - byte : vector_bytes;
            columns[count].first = (uint32_t)start + byte / 4;
            ++count;
        }
    }
    return count;
}

/* Raw sums (neon_shared.h) of the 8 query rows with the documents of columns a and b (b may be
 * absent: its predicates are then all false and it touches no memory), over depth groups
 * [g0, g0 + groups), into (or added to) sums[r * BLOCK + first + lane]. 8 x 2 accumulators +
 * 4 operands: 20 of the 32 registers. */
NK_INLINE void nk_sve_screen_pair(uint8_t const *screen, nk_sve_column_t const *a, nk_sve_column_t const *b,
                                  uint64_t g0, uint64_t groups, uint8_t const *query, int accumulate,
                                  uint32_t const *start, float *sums) {
    svbool_t load_a = svwhilelt_b8_u32(0, a->bytes), load_b = b ? svwhilelt_b8_u32(0, b->bytes) : svpfalse_b();
    svbool_t keep_a = svwhilelt_b32_u32(0, a->bytes / 4), keep_b = b ? svwhilelt_b32_u32(0, b->bytes / 4) : svpfalse_b();
    uint8_t const *doc_a = screen + a->offset + g0 * a->stride;
    uint8_t const *doc_b = b ? screen + b->offset + g0 * b->stride : doc_a;
    uint64_t stride_a = a->stride, stride_b = b ? b->stride : 0;
    float *out_a = sums + a->first, *out_b = b ? sums + b->first : out_a;
    /* Sizeless SVE types cannot live in arrays, hence the spelled-out rows. */
#define NK_SVE_INIT(r, rows, lane)                                                                             \
    svuint32_t acc_a##r = accumulate ? svreinterpret_u32_f32(svld1_f32(keep_a, out_a + r * NK_ARM_BLOCK_DOCS)) \
                                     : svdup_n_u32(start[r]);                                                  \
    svuint32_t acc_b##r = accumulate ? svreinterpret_u32_f32(svld1_f32(keep_b, out_b + r * NK_ARM_BLOCK_DOCS)) \
                                     : svdup_n_u32(start[r]);
    NK_ARM_EACH_ROW(NK_SVE_INIT, _, _)
#undef NK_SVE_INIT
    svbool_t all = svptrue_b8();
    for (uint64_t g = 0; g < groups; ++g, doc_a += stride_a, doc_b += stride_b, query += 4 * NK_ARM_ROWS) {
        svuint8_t bytes_a = svld1_u8(load_a, doc_a), bytes_b = svld1_u8(load_b, doc_b);
        /* 4 query rows' words, replicated into every 128-bit segment. */
        svuint8_t rows_low = svld1rq_u8(all, query), rows_high = svld1rq_u8(all, query + 16);
#define NK_SVE_ROW(r, rows, lane)                                                                              \
    acc_a##r = svdot_lane_u32(acc_a##r, bytes_a, rows, lane);                                                  \
    acc_b##r = svdot_lane_u32(acc_b##r, bytes_b, rows, lane);
        NK_ARM_EACH_ROW(NK_SVE_ROW, rows_low, rows_high)
#undef NK_SVE_ROW
    }
#define NK_SVE_STORE(r, rows, lane)                                                                            \
    svst1_f32(keep_a, out_a + r * NK_ARM_BLOCK_DOCS, svreinterpret_f32_u32(acc_a##r));                         \
    svst1_f32(keep_b, out_b + r * NK_ARM_BLOCK_DOCS, svreinterpret_f32_u32(acc_b##r));
    NK_ARM_EACH_ROW(NK_SVE_STORE, _, _)
#undef NK_SVE_STORE
}

static void nk_sve_prepare(nk_maxsim_view_t const *q, nk_maxsim_view_t const *d, uint64_t first, uint64_t rows,
                           nk_sve_query_t *query) {
    nk_arm_prepare(q, d, first, rows, &query->group);
}

/* Raw sums of the query group with the block's columns over depth groups [g0, g0 + groups), into (or
 * added to) `sums`; a function of its own, so the micro-kernel's registers are allocated alone. */
static NK_NOINLINE void nk_sve_screen_block(uint8_t const *screen, nk_sve_column_t const *columns, unsigned count,
                                            uint8_t const *query, uint64_t g0, uint64_t groups,
                                            uint32_t const *start, float *sums) {
    unsigned c = 0;
    for (; c + 2 <= count; c += 2)
        nk_sve_screen_pair(screen, &columns[c], &columns[c + 1], g0, groups, query, g0 != 0, start, sums);
    if (c < count) nk_sve_screen_pair(screen, &columns[c], NULL, g0, groups, query, g0 != 0, start, sums);
}

/* driver.h's nk_family_screen: the raw sums of each depth chunk, then the shared epilogue. */
static void nk_sve_screen(nk_sve_query_t *query, float const *growth, uint64_t rows, nk_maxsim_view_t const *d,
                          uint64_t first_doc, uint64_t docs, float *u, int32_t *top) {
    unsigned count = nk_sve_columns(d, first_doc, docs, query->columns);
    uint64_t total = d->screen_depth / 4, groups; /* >= 1: dispatch sends depth 0 to serial */
    for (uint64_t g0 = 0; g0 < total; g0 += groups) {
        uint8_t const *words = nk_arm_query_chunk(&query->group, total, g0, &groups);
        nk_sve_screen_block(d->screen, query->columns, count, words, g0, groups, query->group.start, u);
    }
    nk_arm_finish(growth, rows, d, first_doc, docs, u, top);
}

#define nk_family_query_t nk_sve_query_t
#define nk_family_prepare nk_sve_prepare
#define nk_family_screen nk_sve_screen
#include "driver.h"

#include "integer_maxsim.h"

double nk_maxsim_sve(nk_maxsim_view_t const *q, nk_maxsim_view_t const *d) {
    return nk_dtype_is_integer((int)q->dtype) ? nk_integer_maxsim(q, d) : nk_driver_maxsim(q, d);
}
