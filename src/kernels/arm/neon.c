/* Arm NEON family: Advanced SIMD + dotprod + fp16 (armv8.2-a), on driver.h.
 *
 * Only the screening micro-kernel is NEON's own: UDOT by lane on the stored (biased, unsigned) bytes of
 * both operands, nothing converted in the inner loop. The query group, the epilogue (bias removal,
 * u and tagged tops), the scan and the exact dot batch are neon_shared.h's, shared with sve.c.
 * The integer formats (int8, int4, uint1) are neon_integer.h's SDOT and CNT kernels.
 * Groups of 8 query rows, blocks of 512 documents (neon_shared.h says why).
 *
 * Stack, fixed: u 16 KB, the query group 8 KB, the driver's candidate lists 8 KB; GCC 12 -fstack-usage
 * gives 34.2 KB for nk_driver_maxsim (the unused decoded row dropped) and at most 0.5 KB below it.
 */
#include <arm_neon.h>
#include <math.h>

#include "maxsim_internal.h"
#include "neon_shared.h"

/* A document "quad" is 16 bytes of a tile: depths 4g..4g+3 of 4 consecutive rows. One 16-byte load
 * of the query words holds 4 query rows, and UDOT by lane broadcasts each against a document quad. */

/* The last quad of a partial tile, through a zero-padded copy. */
NK_INLINE uint8x16_t nk_neon_load_short_quad(uint8_t const *source, unsigned bytes) {
    uint8_t padded[16] = {0};
    memcpy(padded, source, bytes);
    return vld1q_u8(padded);
}

/* One depth group: 8 query rows (32 bytes at `query`) against 1 or 2 document quads. */
NK_INLINE void nk_neon_step(uint32x4_t acc0[NK_ARM_ROWS], uint32x4_t acc1[NK_ARM_ROWS], uint8x16_t doc0,
                            uint8x16_t doc1, uint8_t const *query, int const quads) {
    uint8x16_t rows_low = vld1q_u8(query), rows_high = vld1q_u8(query + 16);
#define NK_NEON_ROW(r, rows, lane)                                                                             \
    acc0[r] = vdotq_laneq_u32(acc0[r], doc0, rows, lane);                                                      \
    if (quads > 1) acc1[r] = vdotq_laneq_u32(acc1[r], doc1, rows, lane);
    NK_ARM_EACH_ROW(NK_NEON_ROW, rows_low, rows_high)
#undef NK_NEON_ROW
}

/* Raw sums (neon_shared.h) of the 8 query rows with the documents of `quads` (1 or 2) quads at `doc`,
 * over `groups` depth groups `doc_stride` bytes apart, into (or added to) sums[r * BLOCK + lane]; the
 * last quad holds `last_bytes` valid bytes. A short last quad is read whole but for the last group:
 * its 16 bytes then end inside the next depth group of the same tile, and the lanes they fill are
 * past the matrix, never read by the epilogue. 8 x 2 accumulators + 4 operands fit the 32 registers. */
NK_INLINE void nk_neon_screen_quads(uint8_t const *query, uint64_t groups, uint8_t const *doc, uint64_t doc_stride,
                                    int const quads, unsigned const last_bytes, int accumulate,
                                    uint32_t const *start, float *sums) {
    uint32x4_t acc0[NK_ARM_ROWS], acc1[NK_ARM_ROWS];
#pragma GCC unroll 8
    for (unsigned r = 0; r < NK_ARM_ROWS; ++r) {
        float const *row = sums + r * NK_ARM_BLOCK_DOCS;
        acc0[r] = accumulate ? vreinterpretq_u32_f32(vld1q_f32(row)) : vdupq_n_u32(start[r]);
        acc1[r] = accumulate && quads > 1 ? vreinterpretq_u32_f32(vld1q_f32(row + 4)) : vdupq_n_u32(start[r]);
    }
    uint64_t whole = last_bytes == 16 ? groups : groups - 1; /* groups >= 1 */
    for (uint64_t g = 0; g < whole; ++g, doc += doc_stride, query += 4 * NK_ARM_ROWS)
        nk_neon_step(acc0, acc1, vld1q_u8(doc), quads > 1 ? vld1q_u8(doc + 16) : vdupq_n_u8(0), query, quads);
    if (last_bytes < 16) {
        uint8x16_t doc0 = quads > 1 ? vld1q_u8(doc) : nk_neon_load_short_quad(doc, last_bytes);
        uint8x16_t doc1 = quads > 1 ? nk_neon_load_short_quad(doc + 16, last_bytes) : vdupq_n_u8(0);
        nk_neon_step(acc0, acc1, doc0, doc1, query, quads);
    }
#pragma GCC unroll 8
    for (unsigned r = 0; r < NK_ARM_ROWS; ++r) {
        vst1q_f32(sums + r * NK_ARM_BLOCK_DOCS, vreinterpretq_f32_u32(acc0[r]));
        if (quads > 1) vst1q_f32(sums + r * NK_ARM_BLOCK_DOCS + 4, vreinterpretq_f32_u32(acc1[r]));
    }
}

/* Raw sums of the query group with documents [first_doc, first_doc + docs), depth groups
 * [g0, g0 + groups), into (or added to) `sums`. first_doc is a multiple of 16. A function of its own:
 * inlined into the driver, the micro-kernel lost a register and took 24 instructions a step, not 23. */
static NK_NOINLINE void nk_neon_screen_block(nk_maxsim_view_t const *d, uint8_t const *query, uint64_t g0, uint64_t groups,
                                 uint64_t first_doc, uint64_t docs, int accumulate, uint32_t const *start,
                                 float *sums, nk_prefetch_stream_t *prefetch) {
    for (uint64_t first = 0; first < docs; first += NK_SCREEN_TILE) {
        uint64_t rows = docs - first < NK_SCREEN_TILE ? docs - first : NK_SCREEN_TILE;
        uint64_t stride = 4 * rows; /* bytes per depth group inside this tile */
        uint8_t const *tile = d->screen + (first_doc + first) * d->screen_depth + g0 * stride;
        float *out = sums + first;
        unsigned full_quads = (unsigned)(rows / 4), tail_bytes = (unsigned)(4 * (rows % 4)), quad = 0;
        nk_prefetch_lines(prefetch, groups); /* the next document: a line per depth group screened */
        for (; quad + 2 <= full_quads; quad += 2)
            nk_neon_screen_quads(query, groups, tile + 16 * quad, stride, 2, 16, accumulate, start, out + 4 * quad);
        if (full_quads - quad == 1) {
            if (tail_bytes)
                nk_neon_screen_quads(query, groups, tile + 16 * quad, stride, 2, tail_bytes, accumulate, start,
                                     out + 4 * quad);
            else
                nk_neon_screen_quads(query, groups, tile + 16 * quad, stride, 1, 16, accumulate, start,
                                     out + 4 * quad);
        } else if (tail_bytes)
            nk_neon_screen_quads(query, groups, tile + 16 * quad, stride, 1, tail_bytes, accumulate, start,
                                 out + 4 * quad);
    }
}

/* driver.h's nk_family_screen: the raw sums of each depth chunk, then the shared epilogue. */
static void nk_neon_screen(nk_arm_group_t *group, float const *growth, uint64_t rows, nk_maxsim_view_t const *d,
                           uint64_t first_doc, uint64_t docs, float *u, int32_t *top, nk_prefetch_stream_t *prefetch) {
    uint64_t total = d->screen_depth / 4, groups; /* >= 1: dispatch sends depth 0 to serial */
    for (uint64_t g0 = 0; g0 < total; g0 += groups) {
        uint8_t const *query = nk_arm_query_chunk(group, total, g0, &groups);
        nk_neon_screen_block(d, query, g0, groups, first_doc, docs, g0 != 0, group->start, u, prefetch);
    }
    nk_arm_finish(growth, rows, d, first_doc, docs, u, top);
}
#define nk_family_query_t nk_arm_group_t
#define nk_family_prepare nk_arm_prepare
#define nk_family_screen nk_neon_screen

#include "driver.h"

#include "neon_integer.h"
#include "integer_maxsim.h"

NK_FAMILY_KERNEL(nk_maxsim_neon)
