/* Arm NEON family: Advanced SIMD + dotprod + fp16 (armv8.2-a).
 *
 * Certified screening, as in maxsim_internal.h: an int8 dot-product GEMM over the packed screening
 * copy estimates every cosine, the proven error bound turns each estimate into [LB, UB], and only
 * documents whose UB reaches the best LB (or the best exact cosine so far) are rescored exactly in
 * float64. The result is the exact MaxSim at int8 GEMM speed.
 *
 * Screening uses UDOT on the stored (biased, unsigned) bytes of both operands, so nothing is
 * converted in the inner loop; the bias terms are removed afterwards with the row sums, in uint32
 * arithmetic (it wraps, but the true dot fits int32, so the wrapped result is exact).
 *
 * Work: groups of 8 query rows against blocks of up to 512 document rows; stack use is a 16 KB
 * score buffer, a 2 KB bound buffer and an 8 KB buffer of query screening words.
 */
#include <arm_neon.h>
#include <math.h>

#include "neon_shared.h"
#include "maxsim_internal.h"

#define NK_NEON_ROWS 8u           /* query rows per group = accumulator rows of the micro-kernel */
#define NK_NEON_BLOCK_DOCS 512u   /* document rows per score block (a multiple of 16) */
#define NK_NEON_CHUNK_GROUPS 256u /* 4-byte depth groups per pass over the query buffer (depth 1024) */


/* ---- Screening. ----
 * A document "quad" is 16 bytes of a tile: depths 4g..4g+3 of 4 consecutive rows. The query
 * group's stored words are gathered once into [group][row] order, so one 16-byte load holds
 * 4 query rows and UDOT-by-lane broadcasts each of them against a document quad. */

/* Up to 16 bytes of a quad; only the last quad of the last (partial) tile is short. */
NK_INLINE uint8x16_t nk_neon_load_quad(uint8_t const *source, unsigned bytes) {
    if (bytes == 16) return vld1q_u8(source);
    uint8_t padded[16] = {0};
    memcpy(padded, source, bytes);
    return vld1q_u8(padded);
}

/* scores[r * BLOCK + 4 * quad + lane] (+)= biased dot of query row r with document lane of
 * `quads` (1 or 2) quads at `doc`, over `groups` depth groups `doc_stride` bytes apart; the last
 * quad holds `last_bytes` valid bytes. 8 x 2 accumulators + 4 operands fit the 32 registers. */
NK_INLINE void nk_neon_screen_quads(uint32_t const *query_words, uint64_t groups, uint8_t const *doc,
                                         uint64_t doc_stride, int const quads, unsigned const last_bytes,
                                         int accumulate, uint32_t *scores) {
    uint32x4_t acc0[NK_NEON_ROWS], acc1[NK_NEON_ROWS];
#pragma GCC unroll 8
    for (unsigned r = 0; r < NK_NEON_ROWS; ++r) {
        acc0[r] = accumulate ? vld1q_u32(scores + r * NK_NEON_BLOCK_DOCS) : vdupq_n_u32(0);
        acc1[r] = accumulate && quads > 1 ? vld1q_u32(scores + r * NK_NEON_BLOCK_DOCS + 4) : vdupq_n_u32(0);
    }
    uint8_t const *query = (uint8_t const *)query_words;
    for (uint64_t g = 0; g < groups; ++g, doc += doc_stride, query += 4 * NK_NEON_ROWS) {
        uint8x16_t doc0 = nk_neon_load_quad(doc, quads == 1 ? last_bytes : 16);
        uint8x16_t doc1 = quads > 1 ? nk_neon_load_quad(doc + 16, last_bytes) : vdupq_n_u8(0);
        uint8x16_t rows_low = vld1q_u8(query), rows_high = vld1q_u8(query + 16);
        /* Lane indices must be immediates, hence the spelled-out rows. */
#define NK_NEON_ROW(r, rows, lane)                                               \
    acc0[r] = vdotq_laneq_u32(acc0[r], doc0, rows, lane);                        \
    if (quads > 1) acc1[r] = vdotq_laneq_u32(acc1[r], doc1, rows, lane);
        NK_NEON_ROW(0, rows_low, 0)
        NK_NEON_ROW(1, rows_low, 1)
        NK_NEON_ROW(2, rows_low, 2)
        NK_NEON_ROW(3, rows_low, 3)
        NK_NEON_ROW(4, rows_high, 0)
        NK_NEON_ROW(5, rows_high, 1)
        NK_NEON_ROW(6, rows_high, 2)
        NK_NEON_ROW(7, rows_high, 3)
#undef NK_NEON_ROW
    }
#pragma GCC unroll 8
    for (unsigned r = 0; r < NK_NEON_ROWS; ++r) {
        vst1q_u32(scores + r * NK_NEON_BLOCK_DOCS, acc0[r]);
        if (quads > 1) vst1q_u32(scores + r * NK_NEON_BLOCK_DOCS + 4, acc1[r]);
    }
}

/* Stored screening words of query rows [first, first + 8) for depth groups [g0, g0 + groups),
 * in [group][row] order; rows past the end are zero (their scores are never read). */
static void nk_neon_gather_query(nk_maxsim_view_t const *q, uint64_t first, uint64_t g0, uint64_t groups,
                                 uint32_t *query_words) {
    for (unsigned r = 0; r < NK_NEON_ROWS; ++r) {
        uint64_t row = first + r;
        if (row >= q->vectors) {
            for (uint64_t g = 0; g < groups; ++g) query_words[g * NK_NEON_ROWS + r] = 0;
            continue;
        }
        uint64_t base = nk_screen_offset(q->vectors, q->screen_depth, row, 0);
        uint64_t stride = nk_screen_offset(q->vectors, q->screen_depth, row, 4) - base; /* 4 x rows in its tile */
        uint8_t const *source = q->screen + base + g0 * stride;
        for (uint64_t g = 0; g < groups; ++g, source += stride) memcpy(&query_words[g * NK_NEON_ROWS + r], source, 4);
    }
}

/* Biased dots of the query group with documents [first_doc, first_doc + docs), depth groups
 * [g0, g0 + groups), into (or added to) `scores`. first_doc is a multiple of 16. */
static void nk_neon_screen_block(nk_maxsim_view_t const *d, uint32_t const *query_words, uint64_t g0, uint64_t groups,
                                 uint64_t first_doc, uint64_t docs, int accumulate, uint32_t *scores) {
    for (uint64_t start = 0; start < docs; start += NK_SCREEN_TILE) {
        uint64_t rows = docs - start < NK_SCREEN_TILE ? docs - start : NK_SCREEN_TILE;
        uint64_t stride = 4 * rows; /* bytes per depth group inside this tile */
        uint8_t const *tile = d->screen + (first_doc + start) * d->screen_depth + g0 * stride;
        uint32_t *out = scores + start;
        unsigned full_quads = (unsigned)(rows / 4), tail_bytes = (unsigned)(4 * (rows % 4)), quad = 0;
        for (; quad + 2 <= full_quads; quad += 2)
            nk_neon_screen_quads(query_words, groups, tile + 16 * quad, stride, 2, 16, accumulate, out + 4 * quad);
        if (full_quads - quad == 1) {
            if (tail_bytes)
                nk_neon_screen_quads(query_words, groups, tile + 16 * quad, stride, 2, tail_bytes, accumulate,
                                     out + 4 * quad);
            else nk_neon_screen_quads(query_words, groups, tile + 16 * quad, stride, 1, 16, accumulate, out + 4 * quad);
        }
        else if (tail_bytes)
            nk_neon_screen_quads(query_words, groups, tile + 16 * quad, stride, 1, tail_bytes, accumulate, out + 4 * quad);
    }
}

/* Up to 4 consecutive 32-bit values; short reads go through a zero-padded copy. */
NK_INLINE uint32x4_t nk_neon_load_words(void const *source, uint64_t count) {
    if (count >= 4) return vld1q_u32((uint32_t const *)source);
    uint32_t padded[4] = {0, 0, 0, 0};
    memcpy(padded, source, (size_t)count * 4);
    return vld1q_u32(padded);
}

double nk_maxsim_neon(nk_maxsim_view_t const *q, nk_maxsim_view_t const *d) {

    _Alignas(64) uint32_t scores[NK_NEON_ROWS * NK_NEON_BLOCK_DOCS];
    _Alignas(64) float upper[NK_NEON_BLOCK_DOCS];
    _Alignas(64) uint32_t query_words[NK_NEON_CHUNK_GROUPS * NK_NEON_ROWS];
    size_t row_bytes = q->row_bytes;
    uint64_t total_groups = d->screen_depth / 4;
    int single_chunk = total_groups <= NK_NEON_CHUNK_GROUPS;
    /* Both operands are stored +128: raw = dot + 128 (sum_q + sum_d) + 128^2 screen_depth (mod 2^32). */
    uint32_t depth_bias = (uint32_t)(16384u * (uint32_t)d->screen_depth);
    uint32_t const lane_init[4] = {0, 1, 2, 3};
    uint32x4_t lane_index = vld1q_u32(lane_init);
    float32x4_t minus_infinity = vdupq_n_f32(-INFINITY);
    double total = 0.0;

    for (uint64_t first_query = 0; first_query < q->vectors; first_query += NK_NEON_ROWS) {
        uint64_t rows = q->vectors - first_query < NK_NEON_ROWS ? q->vectors - first_query : NK_NEON_ROWS;
        double best[NK_NEON_ROWS];
        for (unsigned r = 0; r < NK_NEON_ROWS; ++r) best[r] = -INFINITY;
        /* With one depth chunk the gathered query words serve every document block. */
        if (single_chunk) nk_neon_gather_query(q, first_query, 0, total_groups, query_words);

        for (uint64_t first_doc = 0; first_doc < d->vectors; first_doc += NK_NEON_BLOCK_DOCS) {
            uint64_t docs = d->vectors - first_doc < NK_NEON_BLOCK_DOCS ? d->vectors - first_doc : NK_NEON_BLOCK_DOCS;
            uint64_t quads = (docs + 3) / 4, padded_docs = (docs + 15) / 16 * 16;
            for (uint64_t g0 = 0; g0 < total_groups || g0 == 0; g0 += NK_NEON_CHUNK_GROUPS) {
                uint64_t groups = total_groups - g0 < NK_NEON_CHUNK_GROUPS ? total_groups - g0 : NK_NEON_CHUNK_GROUPS;
                if (!single_chunk) nk_neon_gather_query(q, first_query, g0, groups, query_words);
                nk_neon_screen_block(d, query_words, g0, groups, first_doc, docs, g0 != 0, scores);
            }

            for (uint64_t r = 0; r < rows; ++r) {
                uint64_t i = first_query + r;
                double inv_q = q->inv_norms[i];
                if (inv_q == 0.0) continue;
                float error_q = q->screen_errors[i], scale_q = q->screen_scales[i];
                uint32x4_t bias_q = vdupq_n_u32((uint32_t)q->screen_sums[i] * 128u + depth_bias);
                float32x4_t slack = vdupq_n_f32(error_q + nk_screen_slack_k);
                float growth = 1.0f + error_q;
                float32x4_t best_lower = minus_infinity;
                uint32_t const *row_scores = scores + r * NK_NEON_BLOCK_DOCS;

                /* Pass 1: raw dots -> upper bounds, and the best lower bound. */
                for (uint64_t v = 0; v < quads; ++v) {
                    uint64_t j = first_doc + 4 * v, present = docs - 4 * v;
                    uint32x4_t doc_sums = nk_neon_load_words(d->screen_sums + j, present);
                    float32x4_t doc_scales = vreinterpretq_f32_u32(nk_neon_load_words(d->screen_scales + j, present));
                    float32x4_t doc_errors = vreinterpretq_f32_u32(nk_neon_load_words(d->screen_errors + j, present));
                    uint32x4_t raw = vld1q_u32(row_scores + 4 * v);
                    int32x4_t dot = vreinterpretq_s32_u32(vsubq_u32(vsubq_u32(raw, bias_q), vshlq_n_u32(doc_sums, 7)));
                    float32x4_t estimate = vcvtq_f32_s32(dot), scale = vmulq_n_f32(doc_scales, scale_q);
                    float32x4_t margin = vfmaq_n_f32(slack, doc_errors, growth);
                    float32x4_t up = vfmaq_f32(margin, estimate, scale);
                    float32x4_t low = vnegq_f32(vfmsq_f32(margin, estimate, scale)); /* estimate * scale - margin */
                    uint32x4_t valid = vcltq_u32(lane_index, vdupq_n_u32(present < 4 ? (uint32_t)present : 4u));
                    best_lower = vmaxq_f32(best_lower, vbslq_f32(valid, low, minus_infinity));
                    vst1q_f32(upper + 4 * v, vbslq_f32(valid, up, minus_infinity));
                }
                for (uint64_t v = quads; v < padded_docs / 4; ++v) vst1q_f32(upper + 4 * v, minus_infinity);

                /* Pass 2: rescore every document whose upper bound reaches the threshold. */
                void const *q_row = (char const *)q->values + i * row_bytes;
                float threshold = vmaxvq_f32(best_lower), from_best = nk_f32_at_most(best[r]);
                if (from_best > threshold) threshold = from_best;
                threshold = nk_threshold_floor(threshold);
                for (uint64_t t = 0; t < padded_docs; t += 16) {
                    float32x4_t limit = vdupq_n_f32(threshold);
                    uint16x8_t low_half = vcombine_u16(vmovn_u32(vcgeq_f32(vld1q_f32(upper + t), limit)),
                                                       vmovn_u32(vcgeq_f32(vld1q_f32(upper + t + 4), limit)));
                    uint16x8_t high_half = vcombine_u16(vmovn_u32(vcgeq_f32(vld1q_f32(upper + t + 8), limit)),
                                                        vmovn_u32(vcgeq_f32(vld1q_f32(upper + t + 12), limit)));
                    uint8x16_t hits = vcombine_u8(vmovn_u16(low_half), vmovn_u16(high_half));
                    /* One nibble per document: bits 4 l .. 4 l + 3 for lane l. */
                    uint64_t candidates = vget_lane_u64(vreinterpret_u64_u8(vshrn_n_u16(vreinterpretq_u16_u8(hits), 4)), 0);
                    while (candidates) {
                        unsigned lane = nk_ctz64(candidates) >> 2;
                        candidates &= ~((uint64_t)0xF << (4 * lane));
                        if (upper[t + lane] < threshold) continue; /* the threshold rose since the compare */
                        nk_arm_rescore(q, d, q_row, inv_q, first_doc + t + lane, row_bytes, &best[r], &threshold);
                    }
                }
            }
        }
        for (uint64_t r = 0; r < rows; ++r)
            total += nk_row_distance(q->inv_norms[first_query + r], best[r]);
    }
    return total;
}
