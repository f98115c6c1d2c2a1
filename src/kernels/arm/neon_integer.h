/* integer_maxsim.h's primitives with Advanced SIMD (neon.c; sve.c takes the preparation and the
 * epilogue and brings its own block).
 *
 * Documents are 16-byte "quads" of a tile's stored word: one 4-byte word of 4 documents, so a full
 * tile's word is 4 quads. Per stored word, query row and quad: int8 one SDOT by lane (the stored
 * bytes q + 128 XORed with 0x80 are q), int4 two (the nibbles minus 8), uint1 XOR, CNT and a
 * UDOT with ones. The products are true dot products, so integer_maxsim.h's bias is not
 * used. 8 rows x 2 quads of accumulators, as in neon.c's screening kernel.
 *
 * Preparation and epilogue need only armv8.2-a; the block needs dotprod (neon's flags have it,
 * i8mm's mixed-sign USDOT is not promised, hence the XOR). */
#ifndef NUMKONG_ARM_NEON_INTEGER_H
#define NUMKONG_ARM_NEON_INTEGER_H
#include <arm_neon.h>
#include <string.h>

#include "maxsim_internal.h"
#include "neon_shared.h"

/* integer_maxsim.h's nk_family_integer_prepare. The group's 8 rows of one stored word are 32
 * adjacent bytes, row r in bytes 4r .. 4r + 3; rows past `rows` come out as zeros. */
static void nk_arm_integer_prepare(int dtype, uint8_t const *source, uint64_t step, uint64_t rows, uint64_t count,
                                   int32_t *words, int32_t *bias) {
    uint8_t const byte_index[16] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
    uint8x16_t index = vld1q_u8(byte_index), present = vdupq_n_u8((uint8_t)(4 * rows));
    uint8x16_t keep_low = vcltq_u8(index, present), keep_high = vcltq_u8(vaddq_u8(index, vdupq_n_u8(16)), present);
    uint8x16_t nibble = vdupq_n_u8(0x0F), flip = vdupq_n_u8(0x80);
    int8x16_t eight = vdupq_n_s8(8);
    int32x4_t sums_low = vdupq_n_s32(0), sums_high = vdupq_n_s32(0); /* rows 0-3, 4-7 */
    for (uint64_t w = 0; w < count; ++w, source += step) {
        uint8x16_t raw_low, raw_high;
        if (rows == NK_INTEGER_ROWS) raw_low = vld1q_u8(source), raw_high = vld1q_u8(source + 16);
        else { /* the last group of the matrix: only 4 x rows bytes are there */
            uint8_t padded[32] = {0};
            memcpy(padded, source, (size_t)(4 * rows));
            raw_low = vld1q_u8(padded), raw_high = vld1q_u8(padded + 16);
        }
        if (dtype == nk_dtype_int8_k) {
            int8x16_t low = vreinterpretq_s8_u8(vandq_u8(veorq_u8(raw_low, flip), keep_low));
            int8x16_t high = vreinterpretq_s8_u8(vandq_u8(veorq_u8(raw_high, flip), keep_high));
            vst1q_s32(words + w * NK_INTEGER_ROWS, vreinterpretq_s32_s8(low));
            vst1q_s32(words + w * NK_INTEGER_ROWS + 4, vreinterpretq_s32_s8(high));
            sums_low = vpadalq_s16(sums_low, vpaddlq_s8(low));
            sums_high = vpadalq_s16(sums_high, vpaddlq_s8(high));
        }
        else if (dtype == nk_dtype_int4_k) {
            int8x16_t parts[4] = {
                vsubq_s8(vreinterpretq_s8_u8(vandq_u8(raw_low, nibble)), eight),
                vsubq_s8(vreinterpretq_s8_u8(vandq_u8(raw_high, nibble)), eight),
                vsubq_s8(vreinterpretq_s8_u8(vshrq_n_u8(raw_low, 4)), eight),
                vsubq_s8(vreinterpretq_s8_u8(vshrq_n_u8(raw_high, 4)), eight),
            };
            parts[0] = vandq_s8(parts[0], vreinterpretq_s8_u8(keep_low));
            parts[1] = vandq_s8(parts[1], vreinterpretq_s8_u8(keep_high));
            parts[2] = vandq_s8(parts[2], vreinterpretq_s8_u8(keep_low));
            parts[3] = vandq_s8(parts[3], vreinterpretq_s8_u8(keep_high));
            /* low nibbles of rows 0-7, then high nibbles of rows 0-7 */
            for (unsigned p = 0; p < 4; ++p) vst1q_s32(words + 2 * w * NK_INTEGER_ROWS + 4 * p, vreinterpretq_s32_s8(parts[p]));
            sums_low = vpadalq_s16(vpadalq_s16(sums_low, vpaddlq_s8(parts[0])), vpaddlq_s8(parts[2]));
            sums_high = vpadalq_s16(vpadalq_s16(sums_high, vpaddlq_s8(parts[1])), vpaddlq_s8(parts[3]));
        }
        else {
            vst1q_s32(words + w * NK_INTEGER_ROWS, vreinterpretq_s32_u8(raw_low));
            vst1q_s32(words + w * NK_INTEGER_ROWS + 4, vreinterpretq_s32_u8(raw_high));
        }
    }
    /* The contract's bias (what a kernel on biased codes would subtract); the blocks here ignore it. */
    int32_t offset = dtype == nk_dtype_int8_k ? 128 : dtype == nk_dtype_int4_k ? 8 : 0;
    vst1q_s32(bias, vmulq_n_s32(sums_low, offset));
    vst1q_s32(bias + 4, vmulq_n_s32(sums_high, offset));
}

/* Cosines ((double)D * inv_q) * inv_d of 4 documents, two float64 lanes a half, in that order and
 * unfused: the bits of serial's expression. */
NK_INLINE void nk_arm_integer_cosines(int32x4_t dots, float64x2_t inv_q, double const *inv_d, float64x2_t *low,
                                      float64x2_t *high) {
    float64x2_t d_low = vcvtq_f64_s64(vmovl_s32(vget_low_s32(dots))), d_high = vcvtq_f64_s64(vmovl_high_s32(dots));
    *low = vmulq_f64(vmulq_f64(d_low, inv_q), vld1q_f64(inv_d));
    *high = vmulq_f64(vmulq_f64(d_high, inv_q), vld1q_f64(inv_d + 2));
}

/* integer_maxsim.h's `finish` from D in dots[r * NK_INTEGER_BLOCK + j], j < docs: each row's best
 * cosine (int8, int4) or least Hamming distance (uint1). The last docs % 4 go through zero-padded
 * copies and are masked, so nothing past `docs` is read. */
static void nk_arm_integer_best(int dtype, int32_t const *dots, uint64_t docs, double const *inv_q,
                                double const *inv_d, double *best) {
    uint64_t full = docs / 4 * 4;
    unsigned rest = (unsigned)(docs - full);
    uint32_t const lane_index[4] = {0, 1, 2, 3};
    uint64_t const pair_index[2] = {0, 1};
    uint32x4_t valid = vcltq_u32(vld1q_u32(lane_index), vdupq_n_u32(rest));
    uint64x2_t valid_low = vcltq_u64(vld1q_u64(pair_index), vdupq_n_u64(rest));
    uint64x2_t valid_high = vcltq_u64(vaddq_u64(vld1q_u64(pair_index), vdupq_n_u64(2)), vdupq_n_u64(rest));
    double inv_rest[4] = {0, 0, 0, 0};
    memcpy(inv_rest, inv_d + full, rest * sizeof(double));
    for (unsigned r = 0; r < NK_INTEGER_ROWS; ++r) {
        int32_t const *row = dots + r * NK_INTEGER_BLOCK;
        int32x4_t tail = vreinterpretq_s32_u32(nk_arm_load_words(row + full, rest));
        if (dtype == nk_dtype_uint1_k) {
            int32x4_t least = vbslq_s32(valid, tail, vdupq_n_s32(INT32_MAX));
            for (uint64_t j = 0; j < full; j += 4) least = vminq_s32(least, vld1q_s32(row + j));
            double value = (double)vminvq_s32(least);
            if (value < best[r]) best[r] = value;
            continue;
        }
        float64x2_t scale = vdupq_n_f64(inv_q[r]), none = vdupq_n_f64(-INFINITY), low, high;
        nk_arm_integer_cosines(tail, scale, inv_rest, &low, &high);
        float64x2_t top = vmaxq_f64(vbslq_f64(valid_low, low, none), vbslq_f64(valid_high, high, none));
        for (uint64_t j = 0; j < full; j += 4) {
            nk_arm_integer_cosines(vld1q_s32(row + j), scale, inv_d + j, &low, &high);
            top = vmaxq_f64(top, vmaxq_f64(low, high));
        }
        double value = vmaxvq_f64(top); /* no NaN: D and the inverse norms are finite */
        if (value > best[r]) best[r] = value;
    }
}

#define nk_family_integer_prepare nk_arm_integer_prepare

#ifndef nk_family_integer_block /* sve.c defines its own */
#ifndef __ARM_FEATURE_DOTPROD
#error "neon_integer.h's block needs dotprod (SDOT)"
#endif

/* acc0 / acc1 (quads 0 / 1) of each row += one stored word, `query` its prepared word(s). */
NK_INLINE void nk_neon_integer_step(int const dtype, int32x4_t acc0[NK_INTEGER_ROWS], int32x4_t acc1[NK_INTEGER_ROWS],
                                    uint8x16_t doc0, uint8x16_t doc1, int32_t const *query, int const quads) {
    if (dtype == nk_dtype_uint1_k) {
        uint32x4_t rows_low = vld1q_u32((uint32_t const *)query), rows_high = vld1q_u32((uint32_t const *)query + 4);
        uint8x16_t ones = vdupq_n_u8(1);
        /* Per-byte counts summed into the 32-bit lanes by one UDOT with ones (not UADDLP + UADALP). */
#define NK_NEON_HAMMING(r, rows, lane)                                                                          \
    {                                                                                                           \
        uint8x16_t word = vreinterpretq_u8_u32(vdupq_laneq_u32(rows, lane));                                   \
        acc0[r] = vreinterpretq_s32_u32(                                                                        \
            vdotq_u32(vreinterpretq_u32_s32(acc0[r]), vcntq_u8(veorq_u8(doc0, word)), ones));                   \
        if (quads > 1)                                                                                          \
            acc1[r] = vreinterpretq_s32_u32(                                                                    \
                vdotq_u32(vreinterpretq_u32_s32(acc1[r]), vcntq_u8(veorq_u8(doc1, word)), ones));               \
    }
        NK_ARM_EACH_ROW(NK_NEON_HAMMING, rows_low, rows_high)
#undef NK_NEON_HAMMING
        return;
    }
    if (dtype == nk_dtype_int8_k) {
        int8x16_t x0 = vreinterpretq_s8_u8(veorq_u8(doc0, vdupq_n_u8(0x80)));
        int8x16_t x1 = vreinterpretq_s8_u8(veorq_u8(doc1, vdupq_n_u8(0x80)));
        int8x16_t rows_low = vreinterpretq_s8_s32(vld1q_s32(query)), rows_high = vreinterpretq_s8_s32(vld1q_s32(query + 4));
#define NK_NEON_INT8(r, rows, lane)                                                                             \
    acc0[r] = vdotq_laneq_s32(acc0[r], x0, rows, lane);                                                         \
    if (quads > 1) acc1[r] = vdotq_laneq_s32(acc1[r], x1, rows, lane);
        NK_ARM_EACH_ROW(NK_NEON_INT8, rows_low, rows_high)
#undef NK_NEON_INT8
        return;
    }
    int8x16_t eight = vdupq_n_s8(8);
    uint8x16_t nibble = vdupq_n_u8(0x0F);
    int8x16_t low0 = vsubq_s8(vreinterpretq_s8_u8(vandq_u8(doc0, nibble)), eight);
    int8x16_t high0 = vsubq_s8(vreinterpretq_s8_u8(vshrq_n_u8(doc0, 4)), eight);
    int8x16_t low1 = vsubq_s8(vreinterpretq_s8_u8(vandq_u8(doc1, nibble)), eight);
    int8x16_t high1 = vsubq_s8(vreinterpretq_s8_u8(vshrq_n_u8(doc1, 4)), eight);
    /* 4 query vectors: low nibbles of rows 0-3 / 4-7, then high nibbles of rows 0-3 / 4-7. */
    int8x16_t low_rows0 = vreinterpretq_s8_s32(vld1q_s32(query)), low_rows4 = vreinterpretq_s8_s32(vld1q_s32(query + 4));
    int8x16_t high_rows0 = vreinterpretq_s8_s32(vld1q_s32(query + 8));
    int8x16_t high_rows4 = vreinterpretq_s8_s32(vld1q_s32(query + 12));
#define NK_NEON_INT4(r, rows, lane)                                                                             \
    acc0[r] = vdotq_laneq_s32(vdotq_laneq_s32(acc0[r], low0, r < 4 ? low_rows0 : low_rows4, lane), high0,       \
                              r < 4 ? high_rows0 : high_rows4, lane);                                           \
    if (quads > 1)                                                                                              \
        acc1[r] = vdotq_laneq_s32(vdotq_laneq_s32(acc1[r], low1, r < 4 ? low_rows0 : low_rows4, lane), high1,   \
                                  r < 4 ? high_rows0 : high_rows4, lane);
    NK_ARM_EACH_ROW(NK_NEON_INT4, _, _)
#undef NK_NEON_INT4
}

/* D of the 8 rows with `quads` (1 or 2) quads at `doc`, stored words `step` bytes apart, into (or
 * added to) out[r * NK_INTEGER_BLOCK + lane]. The last quad holds `last_bytes` valid bytes; words
 * from `direct` on read it through a copy, since a 16-byte load there would leave the tile. Lanes
 * past the valid bytes hold garbage that the epilogue never reads. */
NK_INLINE void nk_neon_integer_quads(int const dtype, int32_t const *words, uint8_t const *doc, uint64_t step,
                                     uint64_t count, uint64_t direct, int const quads, unsigned last_bytes,
                                     int accumulate, int32_t *out) {
    int32x4_t acc0[NK_INTEGER_ROWS], acc1[NK_INTEGER_ROWS];
    uint64_t per_word = dtype == nk_dtype_int4_k ? 2 * NK_INTEGER_ROWS : NK_INTEGER_ROWS;
#pragma GCC unroll 8
    for (unsigned r = 0; r < NK_INTEGER_ROWS; ++r) {
        acc0[r] = accumulate ? vld1q_s32(out + r * NK_INTEGER_BLOCK) : vdupq_n_s32(0);
        acc1[r] = accumulate && quads > 1 ? vld1q_s32(out + r * NK_INTEGER_BLOCK + 4) : vdupq_n_s32(0);
    }
    uint64_t w = 0;
    for (; w < direct; ++w, doc += step, words += per_word)
        nk_neon_integer_step(dtype, acc0, acc1, vld1q_u8(doc), quads > 1 ? vld1q_u8(doc + 16) : vdupq_n_u8(0), words,
                             quads);
    for (; w < count; ++w, doc += step, words += per_word) { /* quad 0 of a pair is full: direct */
        uint8x16_t doc0 = quads > 1 ? vld1q_u8(doc) : vreinterpretq_u8_u32(nk_arm_load_words(doc, last_bytes / 4));
        uint8x16_t doc1 = quads > 1 ? vreinterpretq_u8_u32(nk_arm_load_words(doc + 16, last_bytes / 4)) : vdupq_n_u8(0);
        nk_neon_integer_step(dtype, acc0, acc1, doc0, doc1, words, quads);
    }
#pragma GCC unroll 8
    for (unsigned r = 0; r < NK_INTEGER_ROWS; ++r) {
        vst1q_s32(out + r * NK_INTEGER_BLOCK, acc0[r]);
        if (quads > 1) vst1q_s32(out + r * NK_INTEGER_BLOCK + 4, acc1[r]);
    }
}

/* How many of words [first_word, first_word + count) of a tile (`row_words` words of `step` bytes)
 * a load of `reach` bytes from a word's start can read without leaving the tile. */
static inline uint64_t nk_neon_integer_direct(uint64_t row_words, uint64_t step, uint64_t reach, uint64_t first_word,
                                              uint64_t count) {
    uint64_t unsafe = (reach + step - 1) / step - 1; /* the row's last words that such a load overruns */
    uint64_t end = row_words > unsafe ? row_words - unsafe : 0;
    if (end <= first_word) return 0;
    return end - first_word < count ? end - first_word : count;
}

/* One tile of `rows` (1..16) documents starting at document t0 of the block: quads two at a time. */
NK_INLINE void nk_neon_integer_tile(int const dtype, int32_t const *words, nk_maxsim_view_t const *d,
                                    uint64_t first_doc, uint64_t t0, uint64_t rows, uint64_t first_word,
                                    uint64_t count, int accumulate, int32_t *dots) {
    uint64_t step = 4 * rows, row_words = d->row_bytes / 4;
    uint8_t const *base = (uint8_t const *)d->values + (first_doc + t0) * d->row_bytes + first_word * step;
    unsigned full = (unsigned)(rows / 4), tail = (unsigned)(4 * (rows % 4)), quad = 0;
    int32_t *out = dots + t0;
    for (; quad + 2 <= full; quad += 2)
        nk_neon_integer_quads(dtype, words, base + 16 * quad, step, count, count, 2, 16, accumulate, out + 4 * quad);
    if (full - quad == 1 && !tail)
        nk_neon_integer_quads(dtype, words, base + 16 * quad, step, count, count, 1, 16, accumulate, out + 4 * quad);
    else if (tail) {
        int quads = full - quad == 1 ? 2 : 1;
        uint64_t direct = nk_neon_integer_direct(row_words, step, 16 * (quad + (unsigned)quads), first_word, count);
        if (quads == 2)
            nk_neon_integer_quads(dtype, words, base + 16 * quad, step, count, direct, 2, tail, accumulate,
                                  out + 4 * quad);
        else
            nk_neon_integer_quads(dtype, words, base + 16 * quad, step, count, direct, 1, tail, accumulate,
                                  out + 4 * quad);
    }
}

/* integer_maxsim.h's nk_family_integer_block: D of every tile into dots, then (finish) the bests. */
static void nk_neon_integer_block(int dtype, int32_t const *words, nk_maxsim_view_t const *d, uint64_t first_doc,
                                  uint64_t docs, uint64_t first_word, uint64_t count, int accumulate, int finish,
                                  int32_t const *bias, double const *inv_q, double const *inv_d, int32_t *dots,
                                  double *best, nk_prefetch_stream_t *prefetch) {
    (void)bias; /* true dot products */
    /* One loop per dtype, so that each inlines its own step. */
#define NK_NEON_INTEGER_CASE(code)                                                                              \
    case code:                                                                                                  \
        for (uint64_t t0 = 0; t0 < docs; t0 += NK_SCREEN_TILE) {                                                \
            nk_prefetch_lines(prefetch, count); /* the next document: a line per word of a tile */              \
            nk_neon_integer_tile(code, words, d, first_doc, t0, docs - t0 < NK_SCREEN_TILE ? docs - t0 : NK_SCREEN_TILE, \
                                 first_word, count, accumulate, dots);                                          \
        }                                                                                                       \
        break;
    switch (dtype) {
        NK_NEON_INTEGER_CASE(nk_dtype_int8_k)
        NK_NEON_INTEGER_CASE(nk_dtype_int4_k)
        NK_NEON_INTEGER_CASE(nk_dtype_uint1_k)
    default: return;
    }
#undef NK_NEON_INTEGER_CASE
    if (finish) nk_arm_integer_best(dtype, dots, docs, inv_q, inv_d, best);
}

#define nk_family_integer_block nk_neon_integer_block
#endif /* nk_family_integer_block */

#endif /* NUMKONG_ARM_NEON_INTEGER_H */
