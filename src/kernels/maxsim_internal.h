/* Internal layout and kernel contract shared by the packer, the dispatcher and every kernel family.
 * Not installed. No Python headers.
 *
 * Packed buffer (all fields little/native-endian, sections 64-byte aligned):
 *   header            nk_maxsim_header_t, 128 bytes
 *   values            vectors x depth elements of the packing dtype, row-major, no padding
 *   inv_norms         float64[vectors]: 1/||row||, 0 for a zero row
 *   screen            biased int8 copy of the unit-normalized rows, see below
 *   screen_scales     float32[vectors]: dequantization step; u'[k] = (screen byte - 128) * scale
 *   screen_errors     float32[vectors]: upper bound on ||u - u'||_2 (u = row * inv_norm)
 *   screen_sums       int32[vectors]: sum over k of (screen byte - 128)
 *
 * Screen layout: rows grouped in tiles of 16 (the last tile holds n = vectors - 16 t rows),
 * depth padded to screen_depth = round_up(depth, 4) with value 0 (byte 0x80).
 * Tile t starts at byte 16 t screen_depth; inside a tile of n rows, the 4 bytes of depth
 * k .. k+3 (k % 4 == 0) of lane r live at (k / 4) * 4 n + 4 r. So one 64-byte load holds the
 * same 4 depths of 16 rows (a VNNI operand), and the 4 bytes of one row are one 32-bit broadcast.
 * Stored bytes are v + 128 for v in [-127, 127].
 *
 * Integer formats (int8, int4, uint1) store no row-major values and no screening copy: their values
 * are tiled as the screen is, which is what the kernels read, and their dot products are exact:
 *   values        (the values_offset section) vectors rows of row_bytes = padded depth x bits / 8,
 *                 tiled by 16 rows in 4-byte words: word g of lane r of a tile of n rows at
 *                 g * 4 n + 4 r (nk_tile_word_offset). int8: 4 depths a word, byte q + 128 (one
 *                 screen group). int4: 8 depths a word, byte j holding depth 8g + j in its low
 *                 nibble and 8g + 4 + j in its high one, each q + 8. uint1: 32 depths a word, bit b
 *                 for depth 32g + b, set for +1. Padding depths store q = 0 (int8, int4) or bit 0.
 *   norms2        (the inv_norms_offset section) uint32[vectors]: sum of q^2 (int8, int4); none (uint1)
 *   scales        (the screen_scales_offset section) float32[vectors]: value = scale x q (int8,
 *                 int4); none (uint1)
 *   The screen, screen_errors and screen_sums sections are empty; screen_depth is the padded depth.
 * cos = ((double)dot * inv_q) * inv_d with inv = 1 / sqrt((double)norms2) (0 for a zero row): the
 * scales cancel. uint1: cos = (double)(depth - 2 hamming) / (double)depth.
 *
 * Screening bound: with unit rows u, v and their dequantized copies u', v',
 *   |u.v - u'.v'| <= |u - u'| + |u'| |v - v'| <= e_u + (1 + e_u) e_v.
 * A kernel adds nk_screen_slack_k for the float32 rounding of its estimate. Any document row whose
 * upper bound is below the best lower bound (or the best exact cosine) cannot win.
 */
#ifndef NUMKONG_MAXSIM_INTERNAL_H
#define NUMKONG_MAXSIM_INTERNAL_H

#include <float.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "compiler.h"
#include "numkong/maxsim.h"

#define NK_MAXSIM_MAGIC "NKMAXSIM"
#define NK_HEADER_BYTES 128u
#define NK_SECTION_ALIGN 64u
#define NK_SCREEN_TILE 16u
/* Largest depth whose biased u8 x s8 dot fits int32: 255 * 127 * depth < 2^31. */
#define NK_SCREEN_MAX_DEPTH 65536u
/* Absolute slack for float32 rounding in a screening estimate of a cosine (|estimate| <= ~1). */
#define nk_screen_slack_k 1e-5f

typedef struct nk_maxsim_header {
    char magic[8];
    uint32_t version;
    uint32_t dtype;
    uint64_t vectors;
    uint64_t depth;
    uint64_t capabilities;
    uint64_t nbytes;
    uint64_t values_offset;
    uint64_t inv_norms_offset;
    uint64_t screen_offset;
    uint64_t screen_scales_offset;
    uint64_t screen_errors_offset;
    uint64_t screen_sums_offset;
    uint64_t screen_depth;
    uint8_t reserved[NK_HEADER_BYTES - 8 - 4 - 4 - 11 * 8];
} nk_maxsim_header_t;

/* A packed corpus (format in maxsim.h): this header, the documents, then the table. */
#define NK_CORPUS_MAGIC "NKCORPUS"

typedef struct nk_corpus_header {
    char magic[8];
    uint32_t version;
    uint32_t dtype;
    uint64_t depth;
    uint64_t documents;
    uint64_t total_vectors;
    uint64_t capabilities;
    uint64_t nbytes;
    uint64_t table_offset;
    uint64_t checksum; /* nk_checksum of bytes [NK_HEADER_BYTES, nbytes) */
    uint8_t reserved[NK_HEADER_BYTES - 8 - 4 - 4 - 7 * 8];
} nk_corpus_header_t;

/* The prescreen (corpus format 4): after each float-format document's packed matrix, at the next
 * 64-byte boundary, a 4-bit copy of its screen that a top-k search reads first. Most documents are
 * proven out of the k best from it alone, at half the bytes of the screen (tools/bench.py --corpus).
 * Rows go in tiles of 16 (the last padded to 16 rows); depth in pairs of 64-deep steps:
 *   codes    tiles x pairs x 1024 bytes. In tile t, pair p, row r (0..15), byte i (0..63): at
 *            t (1024 pairs) + 1024 p + 64 r + i, low nibble c + 8 for depth 128 p + i, high nibble
 *            c' + 8 for depth 128 p + 64 + i (c = 0 past the screen depth and in padding rows).
 *            Unpacked, the nibbles of a pair are two row-major AMX A tiles, a row per document row.
 *   scales   float32[tiles x 16]: u''[k] = c[k] * scale (0 in padding lanes)
 *   errors   float32[tiles x 16]: upper bound on ||u - u''||_2 (-inf in padding lanes, so that no
 *            bound comes from them)
 * Derived from the screen alone: with the screen's codes v (|v| <= 127) and step s, a row's divisor
 * m = max(1, ceil(max |v| / 7)), c = v / m rounded half away from zero (|c| <= 7), scale = (float)(s m),
 * and error = (screen error + s ||v - m c||_2 + |s m - scale| ||c||_2) (1 + 2^-40), rounded up to a
 * float (the norms from exact integer sums): the screening bound of this header holds with u'' in
 * place of u'. Integer formats have none. */
#define NK_PRESCREEN_MAX_PAIRS 6u /* depth <= 768; deeper documents store none */

typedef struct nk_prescreen_layout {
    uint64_t tiles, pairs;       /* pairs == 0: none */
    uint64_t codes_offset;       /* from the document's first byte */
    uint64_t scales_offset, errors_offset;
    uint64_t end;                /* the document's bytes, prescreen included (a multiple of 64) */
} nk_prescreen_layout_t;

/* The prescreen of a document of `vectors` rows of `depth` whose packed matrix takes matrix_bytes
 * (a multiple of 64). 0 when a size overflows. */
static inline int nk_prescreen_layout(uint64_t vectors, uint64_t depth, int dtype, uint64_t matrix_bytes,
                                      nk_prescreen_layout_t *p) {
    memset(p, 0, sizeof(*p));
    p->end = matrix_bytes;
    uint64_t steps = (depth / 4 + (depth % 4 != 0) + 15) / 16;
    if (dtype < nk_dtype_float64_k || dtype > nk_dtype_e3m2_k || (steps + 1) / 2 > NK_PRESCREEN_MAX_PAIRS) return 1;
    uint64_t codes, per_row;
    p->pairs = (steps + 1) / 2;
    p->tiles = vectors / 16 + (vectors % 16 != 0);
    p->codes_offset = matrix_bytes;
    return nk_u64_mul(p->tiles, 1024 * p->pairs, &codes) && nk_u64_mul(p->tiles, 64, &per_row) &&
           nk_u64_add(p->codes_offset, codes, &p->scales_offset) &&
           nk_u64_add(p->scales_offset, per_row, &p->errors_offset) && nk_u64_add(p->errors_offset, per_row, &p->end);
}

/* A query prepared once for a family's prescreen pass (nk_prescreen_for): at most this many bytes,
 * 64-byte aligned. */
#define NK_PRESCREEN_STATE_BYTES 26624u

/* The next document's bytes, prefetched into L2 a few cache lines at a time from inside the work on
 * the current document: a family's screening loop takes a line or two per step, so the lines arrive
 * spread over the screening. One burst per query group (a quarter of the screen at a time) had the
 * core waiting on the loads of the next document: stepping it from the icelake micro-kernel made
 * top_k=10 1.39x and full scoring 1.18x faster, and adding the values in full scoring another 1.23x
 * (20k clustered float16 documents, one thread). */
typedef struct nk_prefetch_stream {
    uint8_t const *next; /* the first line not prefetched yet */
    uint64_t lines;      /* lines left, from `next` on */
    uint8_t const *rest; /* the second range, taken up when the first runs out */
    uint64_t rest_lines;
} nk_prefetch_stream_t;

/* A stream over `first_bytes` bytes at `first`, then `rest_bytes` at `rest` (either may be empty). */
static inline nk_prefetch_stream_t nk_prefetch_stream(void const *first, uint64_t first_bytes, void const *rest,
                                                      uint64_t rest_bytes) {
    nk_prefetch_stream_t stream = {(uint8_t const *)first, (first_bytes + 63) / 64, (uint8_t const *)rest,
                                   (rest_bytes + 63) / 64};
    if (!stream.lines) stream.next = stream.rest, stream.lines = stream.rest_lines, stream.rest_lines = 0;
    return stream;
}

/* Prefetch the stream's next `lines` cache lines (fewer once it runs out); `next` never moves past
 * the last line of its range. */
static inline void nk_prefetch_lines(nk_prefetch_stream_t *stream, uint64_t lines) {
    for (; lines && stream->lines; --lines) {
        nk_prefetch_l2(stream->next);
        if (--stream->lines) stream->next += 64;
        else if (stream->rest_lines) {
            stream->next = stream->rest, stream->lines = stream->rest_lines;
            stream->rest_lines = 0;
        }
    }
}

/* What a kernel reads from one packed operand. */
typedef struct nk_maxsim_view {
    uint32_t dtype;
    uint64_t vectors;
    uint64_t depth;
    uint64_t screen_depth;
    uint64_t row_bytes; /* depth x the dtype's item size */
    void const *values;
    double const *inv_norms;
    uint8_t const *screen;
    float const *screen_scales;
    float const *screen_errors;
    int32_t const *screen_sums;
    uint32_t const *norms2; /* integer formats: sum of q^2 per row (int8, int4), else NULL */
    float const *scales;    /* integer formats: value = scale x q per row (int8, int4), else NULL */
    int cold; /* a hint: the rows come from memory (a corpus), so prefetching candidate rows pays */
    /* Documents in a corpus walk: the next document's bytes its scoring reads first (its screen, or an
     * integer format's tiled values), then, when the walk scores every document in full (no top-k),
     * its values, which rescoring reads; empty otherwise. A kernel prefetches from a copy. */
    nk_prefetch_stream_t next;
    double stop_above; /* queries only: a kernel may stop once the result is proven above this (top-k) */
} nk_maxsim_view_t;

/* Kernel contract (kernels are reached through nk_maxsim_score, which probes the CPU first: the
 * sapphireamx family needs that probe's Linux AMX permission request before its first tile
 * instruction): q and d share dtype and depth, q->vectors >= 0, d->vectors >= 1.
 * Returns sum over query rows of max(0, 1 - max over document rows of cos), where every cosine
 * that decides the maximum is computed as (float64 sum of decoded products) * inv_q * inv_d.
 * A zero query row (inv_norm 0) contributes exactly 1. No allocation, no global state.
 * Early exit: once a proven lower bound on the result exceeds q->stop_above (+inf unless a top-k
 * caller sets it), a kernel may return any value above q->stop_above instead; every row's distance is
 * at least 0, so an exact partial sum of rows is such a bound, and so is a sum from screening bounds. */
typedef double (*nk_maxsim_kernel_t)(nk_maxsim_view_t const *q, nk_maxsim_view_t const *d);

double nk_maxsim_serial(nk_maxsim_view_t const *q, nk_maxsim_view_t const *d);
double nk_maxsim_haswell(nk_maxsim_view_t const *q, nk_maxsim_view_t const *d);
double nk_maxsim_skylake(nk_maxsim_view_t const *q, nk_maxsim_view_t const *d);
double nk_maxsim_icelake(nk_maxsim_view_t const *q, nk_maxsim_view_t const *d);
double nk_maxsim_sapphireamx(nk_maxsim_view_t const *q, nk_maxsim_view_t const *d);
double nk_maxsim_neon(nk_maxsim_view_t const *q, nk_maxsim_view_t const *d);
double nk_maxsim_sve(nk_maxsim_view_t const *q, nk_maxsim_view_t const *d);

/* A family's prescreen pass for top-k (the layout above): `prepare` turns the first group of up to 32
 * rows of a query into `state` (NK_PRESCREEN_STATE_BYTES, 64-byte aligned) and says whether it can
 * (0: no prescreen for this query); `bound` returns a lower bound on maxsim(q, d) from the prescreen
 * of the document d whose bytes start at `document` (the sum over the prepared rows of their
 * screening bounds; the other rows add at least 0), taking lines of `prefetch` as it goes. */
typedef struct nk_prescreen_ops {
    int (*prepare)(nk_maxsim_view_t const *q, void *state);
    double (*bound)(void const *state, uint8_t const *document, nk_prescreen_layout_t const *layout,
                    nk_prefetch_stream_t prefetch);
} nk_prescreen_ops_t;

int nk_prescreen_prepare_sapphireamx(nk_maxsim_view_t const *q, void *state);
double nk_prescreen_bound_sapphireamx(void const *state, uint8_t const *document, nk_prescreen_layout_t const *layout,
                                      nk_prefetch_stream_t prefetch);

/* The prescreen pass of the family nk_maxsim_kernel_for picks, or NULL when it has none. */
nk_prescreen_ops_t const *nk_prescreen_for(uint64_t capabilities, uint64_t depth);

/* Write the prescreen of the packed float-format document `d` (its bytes at `document`) where
 * `layout` puts it, with the packer's row routines for `capabilities` (all write the same bytes), or
 * with `check` compare it with what is there: 1 when equal (or written). */
int nk_prescreen_build(nk_maxsim_view_t const *d, uint8_t *document, nk_prescreen_layout_t const *layout,
                       uint64_t capabilities, int check);

/* A SIMD family's kernel, defined after its driver.h and integer_maxsim.h: the integer formats go to
 * nk_integer_maxsim, the float formats to nk_driver_maxsim. */
#define NK_FAMILY_KERNEL(name)                                                                          \
    double name(nk_maxsim_view_t const *q, nk_maxsim_view_t const *d) {                                 \
        return nk_dtype_is_integer((int)q->dtype) ? nk_integer_maxsim(q, d) : nk_driver_maxsim(q, d); \
    }

/* The header (every section offset) of a matrix of (vectors, depth, dtype): the one source of the
 * layout, for packing, validation and views. nk_error_argument_k for an unknown dtype,
 * nk_error_overflow_k when a size does not fit. */
nk_status_t nk_maxsim_layout(uint64_t vectors, uint64_t depth, int dtype, nk_maxsim_header_t *header);

/* Fill a view of a validated matrix from its info alone (cold = 0): the header bytes are not read. */
void nk_maxsim_view_init(nk_maxsim_matrix_t const *matrix, nk_maxsim_view_t *view);

/* The kernel that scores operands of `depth` within `capabilities`: the best available family in
 * the mask, or serial, which also takes every depth too large for int8 screening. The AMX family's
 * kernel picks per pair between its tiles and its vector units alone (dispatch.c). */
nk_maxsim_kernel_t nk_maxsim_kernel_for(uint64_t capabilities, uint64_t depth);

/* Unpacked float32 documents (x86/avx512_unpacked.h): query rows per screening group, and the
 * family entry (1, or 0 when the query is out of the screened range and nothing was scored), whose
 * scratch holds max_rows rows (at least the query's and every document's). */
#define NK_UNPACKED_ROWS 32u
#define NK_UNPACKED_MAX_DEPTH 65536u
int nk_maxsim_unpacked_skylake(nk_maxsim_view_t const *q, float const *const *documents, uint64_t const *rows,
                               int64_t const *strides, uint64_t count, uint64_t max_rows, void *scratch,
                               double *scores);
int nk_maxsim_unpacked_genoa(nk_maxsim_view_t const *q, float const *const *documents, uint64_t const *rows,
                             int64_t const *strides, uint64_t count, uint64_t max_rows, void *scratch, double *scores);

/* Check a pair of views and score them with `kernel`: the statuses of nk_maxsim_score_matrices. */
nk_status_t nk_maxsim_score_views(nk_maxsim_kernel_t kernel, nk_maxsim_view_t const *q, nk_maxsim_view_t const *d,
                                  double *result);

/* Byte offset of 4-byte word `word` of `row` in a section tiled by 16 rows of row_bytes each. */
static inline uint64_t nk_tile_word_offset(uint64_t vectors, uint64_t row_bytes, uint64_t row, uint64_t word) {
    uint64_t tile = row / NK_SCREEN_TILE, lane = row % NK_SCREEN_TILE;
    uint64_t rows_in_tile = vectors - tile * NK_SCREEN_TILE;
    if (rows_in_tile > NK_SCREEN_TILE) rows_in_tile = NK_SCREEN_TILE;
    return tile * NK_SCREEN_TILE * row_bytes + word * 4 * rows_in_tile + 4 * lane;
}

/* Byte offset of the 4-byte group (row, depth k..k+3) in the screen section. */
static inline uint64_t nk_screen_offset(uint64_t vectors, uint64_t screen_depth, uint64_t row, uint64_t k) {
    return nk_tile_word_offset(vectors, screen_depth, row, k / 4) + (k % 4);
}

/* ---- Integer formats. ---- */

#define NK_INTEGER_ROWS 8u    /* query rows per group of integer_maxsim.h */
#define NK_INTEGER_BLOCK 512u /* documents per block of integer_maxsim.h: a multiple of 16 */

static inline int nk_dtype_is_known(int dtype) { return dtype >= nk_dtype_float64_k && dtype <= nk_dtype_uint1_k; }

static inline int nk_dtype_is_integer(int dtype) {
    return dtype == nk_dtype_int8_k || dtype == nk_dtype_int4_k || dtype == nk_dtype_uint1_k;
}

/* Depths per 4-byte word of an integer format (the padding unit of its rows). */
static inline uint64_t nk_integer_word_depths(int dtype) {
    return dtype == nk_dtype_int8_k ? 4u : dtype == nk_dtype_int4_k ? 8u : 32u;
}

/* q of element k of `row` of a tiled integer section (uint1: +1 or -1). */
static inline int nk_integer_at(int dtype, uint8_t const *values, uint64_t vectors, uint64_t row_bytes, uint64_t row,
                                uint64_t k) {
    uint64_t per_word = nk_integer_word_depths(dtype);
    uint8_t const *word = values + nk_tile_word_offset(vectors, row_bytes, row, k / per_word);
    uint64_t j = k % per_word;
    switch (dtype) {
    case nk_dtype_int8_k: return (int)word[j] - 128;
    case nk_dtype_int4_k: return (int)(j < 4 ? word[j] & 0x0Fu : word[j - 4] >> 4) - 8;
    default: return (word[j / 8] >> (j % 8)) & 1u ? 1 : -1;
    }
}

/* Stored word `first_word` of row `first` of an integer matrix, and in *step the bytes from one of
 * that row's words to the next; rows first, first + 1, ... of the same tile follow it at 4 bytes. */
static inline uint8_t const *nk_integer_group_words(nk_maxsim_view_t const *q, uint64_t first, uint64_t first_word,
                                                    uint64_t *step) {
    uint64_t tile_rows = q->vectors - first / NK_SCREEN_TILE * NK_SCREEN_TILE;
    *step = 4 * (tile_rows < NK_SCREEN_TILE ? tile_rows : NK_SCREEN_TILE);
    return (uint8_t const *)q->values + nk_tile_word_offset(q->vectors, q->row_bytes, first, first_word);
}

/* 1 / ||q|| of a row of an int8 / int4 matrix from its sum of squares: the same bits everywhere
 * (IEEE square root and division round correctly). */
static inline double nk_integer_inv_norm(uint32_t norm2) { return norm2 ? 1.0 / sqrt((double)norm2) : 0.0; }

/* The canonical exact dot product. Every family (serial, haswell, skylake, icelake, sapphireamx,
 * neon, sve) computes the float64 dot of two stored rows a, b of `depth` elements exactly so, and
 * therefore returns the same bits for the same packed operands (the cosine is then
 * dot * inv_q * inv_d, left to right, unfused). serial.c's nk_dot_serial is the reference.
 *  1. Products p_k = a_k * b_k of the decoded values (nk_decode). float64: the product is rounded
 *     to float64, then added; never a fused multiply-add. Every other format: the product is exact
 *     in float64 (at most 24 + 24 significant bits, exponents far inside its range), so fused or
 *     not, in float32 for two half images, or summed in half-image units with the power-of-two
 *     scales applied to the final sum, it is the same value (no partial sum comes near float64's
 *     subnormal or overflow range, so scaling by a power of two commutes with every rounding).
 *  2. Sixteen float64 lane sums s_0 .. s_15, each from +0.0: lane j adds p_j, p_{j+16}, p_{j+32},
 *     ... in increasing k. Elements past `depth` count as zero products (zero padding or masked
 *     loads, never a read past the row).
 *  3. Reduction, exactly: t_i = s_i + s_{i+8} (i < 8), u_i = t_i + t_{i+4} (i < 4),
 *     v_i = u_i + u_{i+2} (i < 2), dot = v_0 + v_1. AVX-512 holds lanes 0-7 and 8-15 in two
 *     registers, AVX2 in four, NEON in eight; the halving tree is then register adds.
 *  4. A sum that is exact anyway may be computed any way. e4m3, e2m3 and e3m2 values are integers
 *     times 2^-9, 2^-3 and 2^-4, of at most 245,760 (480, the NaN code's half image; 448 is the
 *     largest finite), 60 (7.5) and 448 (28) units, so products are integers in units^2 of at most
 *     6.04e10, 3,600 and 200,704, and every partial sum of any order is an integer below 2^53 up
 *     to depth 149,130 (e4m3), 2.5e12 (e2m3) and 4.4e10 (e3m2): every addition above is exact at
 *     the SIMD families' depths (<= 65,536), and integer dot products (VNNI digits, vpmaddwd) give
 *     the canonical value. Serial follows steps 1-3 at every depth.
 * A query row decoded to float64 once yields the same products, hence the same dot. The sign of a
 * zero sum is not specified (it never changes a distance). */

/* Scalar decoding. Every narrow format maps exactly onto IEEE half bits times a power of two:
 *   e5m2:  half(b << 8)
 *   e4m3:  half(((b & 0x80) << 8) | ((b & 0x7F) << 7)) * 2^8
 *   e2m3:  half(((b & 0x20) << 10) | ((b & 0x1F) << 7)) * 2^14
 *   e3m2:  half(((b & 0x20) << 10) | ((b & 0x1F) << 8)) * 2^12
 * so SIMD families can decode them with F16C / vcvtph2ps and one multiply. */
static inline float nk_f32_from_bits(uint32_t bits) {
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

/* Without branches, so that loops of it vectorize. */
static inline float nk_half_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exponent = (h >> 10) & 0x1Fu, mantissa = h & 0x3FFu, subnormal;
    float magnitude = (float)mantissa * 5.9604644775390625e-08f; /* subnormal or zero: mantissa * 2^-24, exact */
    memcpy(&subnormal, &magnitude, 4);
    uint32_t normal = (exponent == 31 ? 0x7F800000u : (exponent + 112u) << 23) | (mantissa << 13);
    return nk_f32_from_bits(sign | (exponent == 0 ? subnormal : normal));
}

static inline uint16_t nk_e4m3_to_half_bits(uint8_t b) { return (uint16_t)(((b & 0x80u) << 8) | ((b & 0x7Fu) << 7)); }
static inline uint16_t nk_e5m2_to_half_bits(uint8_t b) { return (uint16_t)(b << 8); }
static inline uint16_t nk_e2m3_to_half_bits(uint8_t b) { return (uint16_t)(((b & 0x20u) << 10) | ((b & 0x1Fu) << 7)); }
static inline uint16_t nk_e3m2_to_half_bits(uint8_t b) { return (uint16_t)(((b & 0x20u) << 10) | ((b & 0x1Fu) << 8)); }
#define nk_e4m3_half_scale_k 256.0f
#define nk_e5m2_half_scale_k 1.0f
#define nk_e2m3_half_scale_k 16384.0f
#define nk_e3m2_half_scale_k 4096.0f
/* X(format, dtype code, half scale) for each minifloat: the families' per-format lists expand it. */
#define NK_FOR_EACH_MINIFLOAT(X) \
    X(e4m3, nk_dtype_e4m3_k, nk_e4m3_half_scale_k) \
    X(e5m2, nk_dtype_e5m2_k, nk_e5m2_half_scale_k) \
    X(e2m3, nk_dtype_e2m3_k, nk_e2m3_half_scale_k) \
    X(e3m2, nk_dtype_e3m2_k, nk_e3m2_half_scale_k)

/* Square of the power of two that a minifloat's half images are scaled by (1 for other dtypes):
 * a dot of half images times this is the dot of the values, exactly. */
static inline double nk_half_scale_squared(int dtype) {
    switch (dtype) {
#define NK_SCALE_CASE(format, code, scale) \
    case code: return (double)scale * (double)scale;
        NK_FOR_EACH_MINIFLOAT(NK_SCALE_CASE)
#undef NK_SCALE_CASE
    default: return 1.0;
    }
}

/* Element k of a row of `dtype`, decoded exactly to double. */
static inline double nk_decode(int dtype, void const *row, uint64_t k) {
    switch (dtype) {
    case nk_dtype_float64_k: return ((double const *)row)[k];
    case nk_dtype_float32_k: return ((float const *)row)[k];
    case nk_dtype_float16_k: return nk_half_to_f32(((uint16_t const *)row)[k]);
    case nk_dtype_bfloat16_k: return nk_f32_from_bits((uint32_t)((uint16_t const *)row)[k] << 16);
    case nk_dtype_e4m3_k: return nk_half_to_f32(nk_e4m3_to_half_bits(((uint8_t const *)row)[k])) * nk_e4m3_half_scale_k;
    case nk_dtype_e5m2_k: return nk_half_to_f32(nk_e5m2_to_half_bits(((uint8_t const *)row)[k])) * nk_e5m2_half_scale_k;
    case nk_dtype_e2m3_k: return nk_half_to_f32(nk_e2m3_to_half_bits(((uint8_t const *)row)[k])) * nk_e2m3_half_scale_k;
    case nk_dtype_e3m2_k: return nk_half_to_f32(nk_e3m2_to_half_bits(((uint8_t const *)row)[k])) * nk_e3m2_half_scale_k;
    default: return 0.0;
    }
}

/* The smallest float32 at or above x (x >= 0, finite): a proven error bound stays proven. */
static inline float nk_f32_at_least(double x) {
    float f = (float)x;
    return (double)f < x ? nextafterf(f, INFINITY) : f;
}

/* The largest float32 not above x (x not NaN): a threshold derived from an exact cosine never rounds
 * up past a winner's bound. */
static inline float nk_f32_at_most(double x) {
    float f = (float)x;
    if ((double)f > x) {
        uint32_t bits;
        memcpy(&bits, &f, 4);
        if (f > 0.0f) bits -= 1u;
        else if (f < 0.0f) bits += 1u;
        else bits = 0x80000001u; /* the negative subnormal closest to zero */
        memcpy(&f, &bits, 4);
    }
    return f;
}

/* A candidate threshold on screening bounds, never below the lowest finite float (NaN -> that too):
 * absent lanes hold -inf, so they can never pass a threshold, whatever sections changed after
 * validation do to the bounds and the exact cosines. */
static inline float nk_threshold_floor(float threshold) { return threshold >= -FLT_MAX ? threshold : -FLT_MAX; }

/* Formats whose dot products are exact integer sums (every value a small multiple of a power of
 * two): their rows are used as stored, never decoded to float64 for rescoring. */
static inline int nk_dtype_is_exact_integer(int dtype) {
    return dtype == nk_dtype_e4m3_k || dtype == nk_dtype_e2m3_k || dtype == nk_dtype_e3m2_k;
}

/* The contract's exact cosine of a pair from its dot product: dot * inv_q * inv_d, left to right; a zero
 * document row (inv_d 0) has cosine 0. */
static inline double nk_exact_cosine(double dot, double inv_q, double inv_d) {
    return inv_d == 0.0 ? 0.0 : dot * inv_q * inv_d;
}

/* Distance contributed by one query row (inverse norm inv_q) whose best cosine is `best_cos`:
 * max(0, 1 - best_cos), and exactly 1 for a zero row, whose best_cos is not looked at. */
static inline double nk_row_distance(double inv_q, double best_cos) {
    if (inv_q == 0.0) return 1.0;
    double distance = 1.0 - best_cos;
    return distance > 0.0 ? distance : 0.0;
}

#endif /* NUMKONG_MAXSIM_INTERNAL_H */
