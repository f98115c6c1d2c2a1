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
 * The integer formats (int8, int4, uint1) run SVE SDOT and CNT over the same columns (below).
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
#define nk_family_query_t nk_sve_query_t

/* Columns of documents [first_doc, first_doc + docs) of a section tiled by 16 rows of `row_bytes`
 * (the screen: screen_depth; integer values: row_bytes); first_doc is a multiple of 16. */
static unsigned nk_sve_columns(uint64_t row_bytes, uint64_t first_doc, uint64_t docs, nk_sve_column_t *columns) {
    uint32_t vector_bytes = (uint32_t)svcntb();
    unsigned count = 0;
    for (uint64_t start = 0; start < docs; start += NK_SCREEN_TILE) {
        uint32_t rows = (uint32_t)(docs - start < NK_SCREEN_TILE ? docs - start : NK_SCREEN_TILE), stride = 4 * rows;
        for (uint32_t byte = 0; byte < stride; byte += vector_bytes) {
            columns[count].offset = (first_doc + start) * row_bytes + byte;
            columns[count].stride = stride;
            columns[count].bytes = stride - byte < vector_bytes ? stride - byte : vector_bytes;
            columns[count].first = (uint32_t)start + byte / 4;
            ++count;
        }
    }
    return count;
}

/* A column pair's set-up (b may be absent: its predicates all false, its pointers a's, its stride 0):
 * load and keep predicates, the columns' words in `base` from word `first_word` and their strides,
 * and their outputs in `out` (of `type`). A macro: sizeless SVE predicates cannot be returned. */
#define NK_SVE_PAIR_SETUP(a, b, base, first_word, type, out)                                                   \
    svbool_t load_a = svwhilelt_b8_u32(0, (a)->bytes);                                                         \
    svbool_t load_b = (b) ? svwhilelt_b8_u32(0, (b)->bytes) : svpfalse_b();                                    \
    svbool_t keep_a = svwhilelt_b32_u32(0, (a)->bytes / 4);                                                    \
    svbool_t keep_b = (b) ? svwhilelt_b32_u32(0, (b)->bytes / 4) : svpfalse_b();                               \
    uint8_t const *doc_a = (base) + (a)->offset + (first_word) * (a)->stride;                                  \
    uint8_t const *doc_b = (b) ? (base) + (b)->offset + (first_word) * (b)->stride : doc_a;                    \
    uint64_t stride_a = (a)->stride, stride_b = (b) ? (b)->stride : 0;                                         \
    type *out_a = (out) + (a)->first, *out_b = (b) ? (out) + (b)->first : out_a

/* Raw sums (neon_shared.h) of the 8 query rows with the documents of columns a and b (b may be
 * absent: its predicates are then all false and it touches no memory), over depth groups
 * [g0, g0 + groups), into (or added to) sums[r * BLOCK + first + lane]. 8 x 2 accumulators +
 * 4 operands: 20 of the 32 registers. */
NK_INLINE void nk_sve_screen_pair(uint8_t const *screen, nk_sve_column_t const *a, nk_sve_column_t const *b,
                                  uint64_t g0, uint64_t groups, uint8_t const *query, int accumulate,
                                  uint32_t const *start, float *sums) {
    NK_SVE_PAIR_SETUP(a, b, screen, g0, float, sums);
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
#define nk_family_prepare nk_sve_prepare

/* Raw sums of the query group with the block's columns over depth groups [g0, g0 + groups), into (or
 * added to) `sums`; a function of its own, so the micro-kernel's registers are allocated alone. */
static NK_NOINLINE void nk_sve_screen_block(uint8_t const *screen, nk_sve_column_t const *columns, unsigned count,
                                            uint8_t const *query, uint64_t g0, uint64_t groups,
                                            uint32_t const *start, float *sums, nk_prefetch_stream_t *prefetch) {
    unsigned c = 0;
    for (; c + 2 <= count; c += 2) {
        nk_prefetch_lines(prefetch, groups); /* the next document: a line per depth group screened */
        nk_sve_screen_pair(screen, &columns[c], &columns[c + 1], g0, groups, query, g0 != 0, start, sums);
    }
    if (c < count) nk_sve_screen_pair(screen, &columns[c], NULL, g0, groups, query, g0 != 0, start, sums);
}

/* driver.h's nk_family_screen: the raw sums of each depth chunk, then the shared epilogue. */
static void nk_sve_screen(nk_sve_query_t *query, float const *growth, uint64_t rows, nk_maxsim_view_t const *d,
                          uint64_t first_doc, uint64_t docs, float *u, int32_t *top, nk_prefetch_stream_t *prefetch) {
    unsigned count = nk_sve_columns(d->screen_depth, first_doc, docs, query->columns);
    uint64_t total = d->screen_depth / 4, groups; /* >= 1: dispatch sends depth 0 to serial */
    for (uint64_t g0 = 0; g0 < total; g0 += groups) {
        uint8_t const *words = nk_arm_query_chunk(&query->group, total, g0, &groups);
        nk_sve_screen_block(d->screen, query->columns, count, words, g0, groups, query->group.start, u, prefetch);
    }
    nk_arm_finish(growth, rows, d, first_doc, docs, u, top);
}
#define nk_family_screen nk_sve_screen

#include "driver.h"

/* ---- Integer formats (integer_maxsim.h): SVE's own block over the same columns. ----
 * SVE, not neon_integer.h's block: that one needs NEON's SDOT (dotprod), which the sve capability
 * (HWCAP_SVE) and flags (armv8.2-a+sve) do not promise, while SVE's SDOT and CNT are base SVE. The
 * query preparation and the float64 epilogue are neon_integer.h's (plain armv8.2-a). Per stored word,
 * query row and column: int8 one SDOT by lane (bytes XORed with 0x80 are q), int4 two (nibbles
 * minus 8), uint1 EOR + CNT + ADD; true dot products, so the bias is not used. */
#define nk_family_integer_block nk_sve_integer_block /* before neon_integer.h: it then skips its own */
#include "neon_integer.h"

/* D (uint1: Hamming distances) of the 8 query rows with columns a and b (b may be absent: its
 * predicates are then all false and it touches no memory) over stored words
 * [first_word, first_word + count), into (or added to) dots[r * BLOCK + first + lane]. Predicated
 * loads read only the column's bytes, so partial tiles need no tail. */
NK_INLINE void nk_sve_integer_pair(int const dtype, int32_t const *words, uint8_t const *values,
                                   nk_sve_column_t const *a, nk_sve_column_t const *b, uint64_t first_word,
                                   uint64_t count, int accumulate, int32_t *dots) {
    NK_SVE_PAIR_SETUP(a, b, values, first_word, int32_t, dots);
    uint64_t per_word = dtype == nk_dtype_int4_k ? 2 * NK_INTEGER_ROWS : NK_INTEGER_ROWS;
#define NK_SVE_INTEGER_INIT(r, rows, lane)                                                                    \
    svint32_t acc_a##r = accumulate ? svld1_s32(keep_a, out_a + r * NK_INTEGER_BLOCK) : svdup_n_s32(0);       \
    svint32_t acc_b##r = accumulate ? svld1_s32(keep_b, out_b + r * NK_INTEGER_BLOCK) : svdup_n_s32(0);
    NK_ARM_EACH_ROW(NK_SVE_INTEGER_INIT, _, _)
#undef NK_SVE_INTEGER_INIT
    svbool_t all = svptrue_b8();
    for (uint64_t w = 0; w < count; ++w, doc_a += stride_a, doc_b += stride_b, words += per_word) {
        svuint8_t bytes_a = svld1_u8(load_a, doc_a), bytes_b = svld1_u8(load_b, doc_b);
        if (dtype == nk_dtype_int8_k) {
            svint8_t x_a = svreinterpret_s8_u8(sveor_n_u8_x(all, bytes_a, 0x80));
            svint8_t x_b = svreinterpret_s8_u8(sveor_n_u8_x(all, bytes_b, 0x80));
            /* 4 query rows' words, replicated into every 128-bit segment. */
            svint8_t rows_low = svld1rq_s8(all, (int8_t const *)words);
            svint8_t rows_high = svld1rq_s8(all, (int8_t const *)(words + 4));
#define NK_SVE_INT8(r, rows, lane)                                                                            \
    acc_a##r = svdot_lane_s32(acc_a##r, x_a, rows, lane);                                                     \
    acc_b##r = svdot_lane_s32(acc_b##r, x_b, rows, lane);
            NK_ARM_EACH_ROW(NK_SVE_INT8, rows_low, rows_high)
#undef NK_SVE_INT8
        }
        else if (dtype == nk_dtype_int4_k) {
            svint8_t low_a = svsub_n_s8_x(all, svreinterpret_s8_u8(svand_n_u8_x(all, bytes_a, 0x0F)), 8);
            svint8_t high_a = svsub_n_s8_x(all, svreinterpret_s8_u8(svlsr_n_u8_x(all, bytes_a, 4)), 8);
            svint8_t low_b = svsub_n_s8_x(all, svreinterpret_s8_u8(svand_n_u8_x(all, bytes_b, 0x0F)), 8);
            svint8_t high_b = svsub_n_s8_x(all, svreinterpret_s8_u8(svlsr_n_u8_x(all, bytes_b, 4)), 8);
            /* low nibbles of rows 0-3 / 4-7, then high nibbles of rows 0-3 / 4-7 */
            svint8_t low_rows0 = svld1rq_s8(all, (int8_t const *)words);
            svint8_t low_rows4 = svld1rq_s8(all, (int8_t const *)(words + 4));
            svint8_t high_rows0 = svld1rq_s8(all, (int8_t const *)(words + 8));
            svint8_t high_rows4 = svld1rq_s8(all, (int8_t const *)(words + 12));
#define NK_SVE_INT4(r, rows, lane)                                                                            \
    acc_a##r = svdot_lane_s32(svdot_lane_s32(acc_a##r, low_a, r < 4 ? low_rows0 : low_rows4, lane), high_a,   \
                              r < 4 ? high_rows0 : high_rows4, lane);                                         \
    acc_b##r = svdot_lane_s32(svdot_lane_s32(acc_b##r, low_b, r < 4 ? low_rows0 : low_rows4, lane), high_b,   \
                              r < 4 ? high_rows0 : high_rows4, lane);
            NK_ARM_EACH_ROW(NK_SVE_INT4, _, _)
#undef NK_SVE_INT4
        }
        else {
            svbool_t all32 = svptrue_b32();
            svuint32_t x_a = svreinterpret_u32_u8(bytes_a), x_b = svreinterpret_u32_u8(bytes_b);
#define NK_SVE_HAMMING(r, rows, lane)                                                                         \
    {                                                                                                         \
        svuint32_t word = svdup_n_u32((uint32_t)words[r]);                                                    \
        acc_a##r = svadd_s32_x(all32, acc_a##r, svreinterpret_s32_u32(svcnt_u32_x(all32, sveor_u32_x(all32, x_a, word)))); \
        acc_b##r = svadd_s32_x(all32, acc_b##r, svreinterpret_s32_u32(svcnt_u32_x(all32, sveor_u32_x(all32, x_b, word)))); \
    }
            NK_ARM_EACH_ROW(NK_SVE_HAMMING, _, _)
#undef NK_SVE_HAMMING
        }
    }
#define NK_SVE_INTEGER_STORE(r, rows, lane)                                                                   \
    svst1_s32(keep_a, out_a + r * NK_INTEGER_BLOCK, acc_a##r);                                                \
    svst1_s32(keep_b, out_b + r * NK_INTEGER_BLOCK, acc_b##r);
    NK_ARM_EACH_ROW(NK_SVE_INTEGER_STORE, _, _)
#undef NK_SVE_INTEGER_STORE
}

/* integer_maxsim.h's nk_family_integer_block: D of every column pair into dots, then (finish) the
 * bests by neon_integer.h's epilogue, which reads only documents below `docs`. */
static void nk_sve_integer_block(int dtype, int32_t const *words, nk_maxsim_view_t const *d, uint64_t first_doc,
                                 uint64_t docs, uint64_t first_word, uint64_t count, int accumulate, int finish,
                                 int32_t const *bias, double const *inv_q, double const *inv_d, int32_t *dots,
                                 double *best, nk_prefetch_stream_t *prefetch) {
    (void)bias; /* true dot products */
    nk_sve_column_t columns[NK_SVE_MAX_COLUMNS];
    unsigned total = nk_sve_columns(d->row_bytes, first_doc, docs, columns), c = 0;
    uint8_t const *values = (uint8_t const *)d->values;
    /* One loop per dtype, so that each inlines its own step. */
#define NK_SVE_INTEGER_CASE(code)                                                                             \
    case code:                                                                                                \
        for (c = 0; c + 2 <= total; c += 2) {                                                                 \
            nk_prefetch_lines(prefetch, count); /* the next document: a line per word screened */             \
            nk_sve_integer_pair(code, words, values, &columns[c], &columns[c + 1], first_word, count, accumulate, dots); \
        }                                                                                                     \
        if (c < total) nk_sve_integer_pair(code, words, values, &columns[c], NULL, first_word, count, accumulate, dots); \
        break;
    switch (dtype) {
        NK_SVE_INTEGER_CASE(nk_dtype_int8_k)
        NK_SVE_INTEGER_CASE(nk_dtype_int4_k)
        NK_SVE_INTEGER_CASE(nk_dtype_uint1_k)
    default: return;
    }
#undef NK_SVE_INTEGER_CASE
    if (finish) nk_arm_integer_best(dtype, dots, docs, inv_q, inv_d, best);
}

#include "integer_maxsim.h"

NK_FAMILY_KERNEL(nk_maxsim_sve)
