/* Advanced SIMD code shared by the Arm families (neon.c, sve.c) on driver.h. Both screen with UDOT on
 * the stored (biased, unsigned) bytes of both operands, so everything around their micro-kernels is
 * common and lives here once: the query group (its gathered words and bias), the epilogue that turns
 * the biased sums into driver.h's u and each row's top document, driver.h's scan and the exact dot
 * batch (over neon_dot.h). Each including file compiles it with its own flags; nothing here needs more
 * than armv8.2-a (+ the fp16 conversions neon_dot.h uses).
 */
#ifndef NUMKONG_ARM_NEON_SHARED_H
#define NUMKONG_ARM_NEON_SHARED_H
#include <arm_neon.h>
#include <math.h>
#include <string.h>

#include "maxsim_internal.h"
#include "neon_dot.h"

/* 8 rows: 8 x 2 accumulators + 2 document + 2 query operands fit both micro-kernels' 32 registers.
 * 512 documents: 16 KB of u stays in a 32 KB L1 beside the streamed screening bytes (and the tags
 * below name up to 1024). */
#define NK_ARM_ROWS 8u
#define NK_ARM_BLOCK_DOCS 512u
#define NK_ARM_CHUNK_GROUPS 256u /* 4-byte depth groups per pass over the query words (depth 1024) */
#define NK_ARM_TAG_BITS 0x3Fu    /* low mantissa bits of a tagged u: its 16-document tile, < 64 */

_Static_assert(NK_ARM_BLOCK_DOCS <= 16u * (NK_ARM_TAG_BITS + 1u), "a tag names every tile of a block");

/* ---- The query group (driver.h's nk_family_query_t, or part of it). ----
 * Both operands are stored v + 128, so a micro-kernel's sum over the screening depth D is
 *   raw = dot + 128 sum_q + 128 sum_d + 128^2 D   (mod 2^32).
 * Accumulators start at minus the query terms (`start`); the epilogue removes 128 sum_d. The true dot
 * fits int32 (maxsim_internal.h), so the wrapped uint32 result read as int32 is exact. */
typedef struct nk_arm_group {
    _Alignas(64) uint32_t words[NK_ARM_CHUNK_GROUPS * NK_ARM_ROWS]; /* stored query words, [group][row] */
    uint32_t start[NK_ARM_ROWS]; /* -(128 sum_q + 128^2 D) */
    nk_maxsim_view_t const *q;
    uint64_t first;
    int words_ready; /* the whole depth is in `words` (one chunk) */
} nk_arm_group_t;

/* The group's rows as UDOT-by-lane operands: a depth group's 32 bytes of words are two 16-byte vectors,
 * and row r is lane r % 4 of vector r / 4. Lane indices must be immediates, so micro-kernels spell the
 * rows out: STEP(r, vector, lane) for each row. */
#define NK_ARM_EACH_ROW(STEP, low, high)                                                                       \
    STEP(0, low, 0) STEP(1, low, 1) STEP(2, low, 2) STEP(3, low, 3)                                            \
    STEP(4, high, 0) STEP(5, high, 1) STEP(6, high, 2) STEP(7, high, 3)
_Static_assert(NK_ARM_ROWS == 8, "NK_ARM_EACH_ROW spells out 8 rows");

/* Stored words of query rows [first, first + 8) for depth groups [g0, g0 + groups), [group][row].
 * first is a multiple of 8, so the rows are adjacent lanes of one query tile: one copy of 4 x present
 * bytes per depth group. Rows past the end are zero. */
static void nk_arm_gather_query(nk_maxsim_view_t const *q, uint64_t first, uint64_t g0, uint64_t groups,
                                uint32_t *words) {
    uint64_t present = q->vectors - first < NK_ARM_ROWS ? q->vectors - first : NK_ARM_ROWS;
    uint64_t base = nk_screen_offset(q->vectors, q->screen_depth, first, 0);
    uint64_t stride = nk_screen_offset(q->vectors, q->screen_depth, first, 4) - base; /* 4 x rows in the tile */
    uint8_t const *source = q->screen + base + g0 * stride;
    for (uint64_t g = 0; g < groups; ++g, source += stride, words += NK_ARM_ROWS) {
        memcpy(words, source, (size_t)present * 4);
        if (present < NK_ARM_ROWS) memset(words + present, 0, (size_t)(NK_ARM_ROWS - present) * 4);
    }
}

/* driver.h's nk_family_prepare. With one depth chunk the words serve every document block. */
static void nk_arm_prepare(nk_maxsim_view_t const *q, nk_maxsim_view_t const *d, uint64_t first, uint64_t rows,
                           nk_arm_group_t *group) {
    uint32_t depth_bias = 16384u * (uint32_t)q->screen_depth;
    for (unsigned r = 0; r < NK_ARM_ROWS; ++r)
        group->start[r] = r < rows ? 0u - ((uint32_t)q->screen_sums[first + r] * 128u + depth_bias) : 0u;
    group->q = q, group->first = first;
    group->words_ready = d->screen_depth / 4 <= NK_ARM_CHUNK_GROUPS;
    if (group->words_ready) nk_arm_gather_query(q, first, 0, d->screen_depth / 4, group->words);
}

/* The query words of depth groups [g0, g0 + *groups) of `total`, as bytes for the micro-kernels. */
static inline uint8_t const *nk_arm_query_chunk(nk_arm_group_t *group, uint64_t total, uint64_t g0,
                                                uint64_t *groups) {
    *groups = total - g0 < NK_ARM_CHUNK_GROUPS ? total - g0 : NK_ARM_CHUNK_GROUPS;
    if (!group->words_ready) nk_arm_gather_query(group->q, group->first, g0, *groups, group->words);
    return (uint8_t const *)group->words;
}

/* ---- Epilogue: biased sums -> u and each row's top. ----
 * A micro-kernel leaves row r's sums in u[r * NK_ARM_BLOCK_DOCS + j] as raw bits, stored and loaded
 * with float32 intrinsics (so u is only ever accessed as float). The epilogue replaces them with
 * u = dot s_d + b e_d in place and keeps, per lane of a tile, the largest u with its tile index in
 * the low mantissa bits: the largest tagged value names a document within 2^-17 (relative) of the
 * row's largest u, the one driver.h rescores first. Tags only choose it; the scan reads plain u. */

NK_INLINE float32x4_t nk_arm_tag(float32x4_t upper, uint32x4_t tag) {
    return vreinterpretq_f32_u32(vbslq_u32(vdupq_n_u32(NK_ARM_TAG_BITS), tag, vreinterpretq_u32_f32(upper)));
}

/* u of one quad (4 documents) from its raw sums and the documents' sums, scales and errors. */
NK_INLINE float32x4_t nk_arm_quad_upper(uint32x4_t raw, int32x4_t sums, float32x4_t scales, float32x4_t errors,
                                        float32x4_t growth) {
    int32x4_t dot = vreinterpretq_s32_u32(vmlsq_n_u32(raw, vreinterpretq_u32_s32(sums), 128u));
    return vfmaq_f32(vmulq_f32(vcvtq_f32_s32(dot), scales), growth, errors);
}

/* Up to 4 consecutive 32-bit values through a zero-padded copy: no read past a section. */
NK_INLINE uint32x4_t nk_arm_load_words(void const *source, unsigned count) {
    uint32_t padded[4] = {0, 0, 0, 0};
    memcpy(padded, source, (size_t)count * 4);
    return vld1q_u32(padded);
}

/* The epilogue of one tile of `present` (1..16) documents: u at `row` (the tile's 16 slots, -inf past
 * `present`), document data at sums / scales / errors. A full tile loads everything before it stores
 * (stores to u could alias the loads otherwise, which keeps the compiler from pairing them). */
NK_INLINE void nk_arm_finish_tile(float *row, int32_t const *sums, float const *scales, float const *errors,
                                  unsigned present, float32x4_t growth, uint32x4_t tag, float32x4_t top[4]) {
    float32x4_t minus_infinity = vdupq_n_f32(-INFINITY);
    if (present == 16) {
        uint32x4_t raw[4];
        int32x4_t doc_sums[4];
        float32x4_t doc_scales[4], doc_errors[4], upper[4];
#pragma GCC unroll 4
        for (unsigned quad = 0; quad < 4; ++quad) {
            raw[quad] = vreinterpretq_u32_f32(vld1q_f32(row + 4 * quad));
            doc_sums[quad] = vld1q_s32(sums + 4 * quad);
            doc_scales[quad] = vld1q_f32(scales + 4 * quad);
            doc_errors[quad] = vld1q_f32(errors + 4 * quad);
        }
#pragma GCC unroll 4
        for (unsigned quad = 0; quad < 4; ++quad) {
            upper[quad] = nk_arm_quad_upper(raw[quad], doc_sums[quad], doc_scales[quad], doc_errors[quad], growth);
            top[quad] = vmaxq_f32(top[quad], nk_arm_tag(upper[quad], tag));
        }
#pragma GCC unroll 4
        for (unsigned quad = 0; quad < 4; ++quad) vst1q_f32(row + 4 * quad, upper[quad]);
        return;
    }
#pragma GCC unroll 4 /* constant indices keep the tops in registers */
    for (unsigned quad = 0; quad < 4; ++quad) { /* the last documents of the matrix */
        unsigned at = 4 * quad, count = present <= at ? 0 : present - at >= 4 ? 4 : present - at;
        if (!count) {
            vst1q_f32(row + at, minus_infinity);
            continue;
        }
        uint32_t const lane_init[4] = {0, 1, 2, 3};
        uint32x4_t valid = vcltq_u32(vld1q_u32(lane_init), vdupq_n_u32(count));
        float32x4_t upper = nk_arm_quad_upper(
            nk_arm_load_words(row + at, count), vreinterpretq_s32_u32(nk_arm_load_words(sums + at, count)),
            vreinterpretq_f32_u32(nk_arm_load_words(scales + at, count)),
            vreinterpretq_f32_u32(nk_arm_load_words(errors + at, count)), growth);
        top[quad] = vmaxq_f32(top[quad], vbslq_f32(valid, nk_arm_tag(upper, tag), top[quad]));
        vst1q_f32(row + at, vbslq_f32(valid, upper, minus_infinity));
    }
}

/* The document 16 tile + lane named by a row's tagged per-lane maxima, or -1 (no finite u, NaN, or a
 * tag past `docs`: only sections changed after validation make those). */
NK_INLINE int32_t nk_arm_tagged_top(float32x4_t const top[4], uint64_t docs) {
    float largest = vmaxvq_f32(vmaxq_f32(vmaxq_f32(top[0], top[1]), vmaxq_f32(top[2], top[3])));
    if (!(largest > -INFINITY)) return -1;
    float32x4_t target = vdupq_n_f32(largest);
    uint32_t bits;
    memcpy(&bits, &largest, sizeof bits);
#pragma GCC unroll 4 /* constant indices keep the tops in registers */
    for (unsigned quad = 0; quad < 4; ++quad) {
        uint64_t equal = vget_lane_u64(vreinterpret_u64_u16(vmovn_u32(vceqq_f32(top[quad], target))), 0);
        if (!equal) continue;
        uint64_t doc = 16u * (bits & NK_ARM_TAG_BITS) + 4u * quad + nk_ctz64(equal) / 16u;
        return doc < docs ? (int32_t)doc : -1;
    }
    return -1;
}

/* The epilogue of driver.h's nk_family_screen for rows [0, rows) of documents [first_doc, first_doc +
 * docs): u for every document and -inf up to the next multiple of 16, and top[r]. */
static void nk_arm_finish(float const *growth, uint64_t rows, nk_maxsim_view_t const *d, uint64_t first_doc,
                          uint64_t docs, float *u, int32_t *top) {
    int32_t const *sums = d->screen_sums + first_doc;
    float const *scales = d->screen_scales + first_doc, *errors = d->screen_errors + first_doc;
    uint64_t full_tiles = docs / NK_SCREEN_TILE;
    unsigned rest = (unsigned)(docs % NK_SCREEN_TILE);
    for (uint64_t r = 0; r < rows; ++r) {
        float *row = u + r * NK_ARM_BLOCK_DOCS;
        float32x4_t b = vdupq_n_f32(growth[r]), minus_infinity = vdupq_n_f32(-INFINITY);
        float32x4_t top4[4] = {minus_infinity, minus_infinity, minus_infinity, minus_infinity};
        uint64_t t = 0;
        for (; t < full_tiles; ++t)
            nk_arm_finish_tile(row + 16 * t, sums + 16 * t, scales + 16 * t, errors + 16 * t, 16, b,
                               vdupq_n_u32((uint32_t)t), top4);
        if (rest)
            nk_arm_finish_tile(row + 16 * t, sums + 16 * t, scales + 16 * t, errors + 16 * t, rest, b,
                               vdupq_n_u32((uint32_t)t), top4);
        top[r] = nk_arm_tagged_top(top4, docs);
    }
}

/* ---- driver.h's scan. ---- */

/* The compares of a tile's 16 u with the cut, one byte per document. */
NK_INLINE uint8x16_t nk_arm_tile_hits(float const *tile_u, float32x4_t cut) {
    uint16x8_t low = vuzp1q_u16(vreinterpretq_u16_u32(vcgeq_f32(vld1q_f32(tile_u), cut)),
                                vreinterpretq_u16_u32(vcgeq_f32(vld1q_f32(tile_u + 4), cut)));
    uint16x8_t high = vuzp1q_u16(vreinterpretq_u16_u32(vcgeq_f32(vld1q_f32(tile_u + 8), cut)),
                                 vreinterpretq_u16_u32(vcgeq_f32(vld1q_f32(tile_u + 12), cut)));
    return vuzp1q_u8(vreinterpretq_u8_u16(low), vreinterpretq_u8_u16(high));
}

/* Byte hits as a 64-bit mask with bit 4 l set for document l. */
NK_INLINE uint64_t nk_arm_hit_bits(uint8x16_t hits) {
    return vget_lane_u64(vreinterpret_u64_u8(vshrn_n_u16(vreinterpretq_u16_u8(hits), 4)), 0) &
           0x1111111111111111ull;
}

NK_INLINE int nk_arm_any_hit4(float const *tile_u, float32x4_t cut) {
    uint8x16_t any = vorrq_u8(vorrq_u8(nk_arm_tile_hits(tile_u, cut), nk_arm_tile_hits(tile_u + 16, cut)),
                              vorrq_u8(nk_arm_tile_hits(tile_u + 32, cut), nk_arm_tile_hits(tile_u + 48, cut)));
    return nk_arm_hit_bits(any) != 0;
}

NK_INLINE uint64_t nk_arm_tile_hit_bits(float const *tile_u, float32x4_t cut) {
    return nk_arm_hit_bits(nk_arm_tile_hits(tile_u, cut));
}

/* ---- driver.h's exact dot batch. ---- */

static void nk_arm_dot_batch(int dtype, void const *const *a, void const *const *b, unsigned n, uint64_t depth,
                             double *out) {
    for (unsigned k = 0; k < n; ++k) out[k] = nk_arm_dot(dtype, a[k], b[k], depth);
}

/* The primitives both families share; each defines nk_family_query_t, prepare and screen itself. */
#define NK_DRIVER_ROWS NK_ARM_ROWS
#define NK_DRIVER_BLOCK NK_ARM_BLOCK_DOCS
#define nk_family_cut_t float32x4_t
#define nk_family_cut vdupq_n_f32
#define nk_family_any_hit4 nk_arm_any_hit4
#define nk_family_hit_bits nk_arm_tile_hit_bits
#define NK_FAMILY_BITS_PER_DOC 4
#define nk_family_dot_batch nk_arm_dot_batch

#endif /* NUMKONG_ARM_NEON_SHARED_H */
