/* Sapphire Rapids AMX family: AMX-INT8 tiles for the screening, AVX-512 for everything else.
 *
 * The family primitives of driver.h. The screen section is already an AMX B operand: one 64-byte
 * line holds the same 4 depths of the 16 rows of a tile, so 16 consecutive lines (1 KB) are a
 * 64-deep, 16-column B tile. Documents are used straight from memory (unsigned, biased by 128);
 * each query tile (16 rows) is transposed once into signed row-major A tiles. TDPBSUD then gives
 * dot + 128 * (sum of the query's values), and the epilogue removes that per-row bias with
 * screen_sums while it turns the sums into u (driver.h) in place. A group is 32 query rows: with the
 * whole depth in one pass, both query tiles share every document tile load (the pair form).
 *
 * Stack (beside the driver's 133 KB of u): 24 KB of A tiles, 13 KB padded copy of the last document
 * tile, 16 KB of accumulator copies (the int8 path: 6 KB of tops more). Nothing is allocated. Built
 * with NK_AMX_EMULATE (tests/c), the tile instructions are C functions (amx_emulation.h), so CPUs
 * without AMX check this family's logic too.
 */
#include <immintrin.h>
#include <math.h>
#ifdef NK_AMX_EMULATE
#include "amx_emulation.h"
#endif

#include "avx512_shared.h"
#include "maxsim_internal.h"

#define NK_SAMX_ROWS 32u           /* query rows per group: two query tiles */
/* Document rows per block (a multiple of 64, at most 64 tiles for the tags). 1024 against 512: one
 * block's tops and scan instead of two, 1024x1024x128 1.08-1.10x, 32x1024x128 1.03-1.04x (A/B). */
#define NK_SAMX_BLOCK_DOCS 1024u
/* The most floats from one row of u to the next (nk_samx_stride). */
#define NK_SAMX_STRIDE (NK_SAMX_BLOCK_DOCS + 16u)
#define NK_SAMX_CHUNK_STEPS 12u    /* 64-deep steps per pass over the A buffer: depth 768 in one pass */
#define NK_SAMX_STEP_BYTES 1024u   /* one 16 x 64-byte tile */
/* int8 / int4 blocks of at most this many documents take every cosine exactly rather than screen
 * (time against the screen: 32x16x128 0.49, 20x8x128 0.65, 32x64x128 0.99, 32x100x128 1.05). */
#define NK_SAMX_EXACT_DOCS 64u
/* driver.h's group of query rows and block of documents */
#define NK_DRIVER_ROWS NK_SAMX_ROWS
#define NK_DRIVER_BLOCK NK_SAMX_BLOCK_DOCS
#define NK_DRIVER_STRIDE NK_SAMX_STRIDE

/* Floats from one row of u to the next for a block of `docs` documents: the block's tiles and an odd
 * count of 64-byte lines in all. A tile store writes a column of 16 rows, which 2 KB apart would share
 * two L1 sets (32x1024x128 float32 took 13.6 us so, 10.2 us with 64 bytes more); an odd count of lines
 * puts the 16 in 16 sets. Small blocks keep their rows close: the 1024-document stride for 180
 * documents made 32x180x128 0.94-0.97x as fast (A/B). */
static inline uint64_t nk_samx_stride(uint64_t docs) {
    return 16 * (((docs + 15) / 16 + 1) | 1);
}
#define nk_family_stride nk_samx_stride

/* LDTILECFG's 64-byte operand, palette 1. */
typedef struct nk_samx_tile_config {
    uint8_t palette;
    uint8_t start_row;
    uint8_t reserved[14];
    uint16_t bytes_per_row[16];
    uint8_t rows[16];
} nk_samx_tile_config_t;

/* The even 128-bit lanes of a then b, and the odd ones. */
NK_INLINE void nk_samx_lane_pairs(__m512i a, __m512i b, __m512i *even, __m512i *odd) {
    *even = _mm512_shuffle_i32x4(a, b, 0x88);
    *odd = _mm512_shuffle_i32x4(a, b, 0xDD);
}

/* Transpose a 16 x 16 matrix of 32-bit words held in 16 registers. */
NK_INLINE void nk_samx_transpose16(__m512i r[16]) {
    __m512i t[16];
#pragma GCC unroll 16
    for (int i = 0; i < 16; i += 2) {
        t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
        t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
    }
#pragma GCC unroll 16
    for (int i = 0; i < 16; i += 4) {
        r[i] = _mm512_unpacklo_epi64(t[i], t[i + 2]);
        r[i + 1] = _mm512_unpackhi_epi64(t[i], t[i + 2]);
        r[i + 2] = _mm512_unpacklo_epi64(t[i + 1], t[i + 3]);
        r[i + 3] = _mm512_unpackhi_epi64(t[i + 1], t[i + 3]);
    }
    /* Then 128-bit lanes: twice, the even and the odd lanes of register pairs. */
#pragma GCC unroll 4
    for (int i = 0; i < 4; ++i) {
        nk_samx_lane_pairs(r[i], r[i + 4], &t[i], &t[i + 4]);
        nk_samx_lane_pairs(r[i + 8], r[i + 12], &t[i + 8], &t[i + 12]);
    }
#pragma GCC unroll 4
    for (int i = 0; i < 4; ++i) {
        nk_samx_lane_pairs(t[i], t[i + 8], &r[i], &r[i + 8]);
        nk_samx_lane_pairs(t[i + 4], t[i + 12], &r[i + 4], &r[i + 12]);
    }
}

/* Depth steps: G groups of 4 depths make ceil(G / 16) steps of 16 groups. When G is not a multiple
 * of 16 (and G >= 16), the last step is aligned to end at group G: it covers groups [G - 16, G), the
 * `pad` = 16 steps - G groups it shares with the step before carry zero query bytes, and a document
 * tile's last step reads its own last 16 lines, never past the tile. Below 16 groups every document
 * tile is copied into a padded buffer instead. */
typedef struct nk_samx_depth {
    uint64_t groups, steps, pad;
    int tiny; /* fewer than 16 groups */
} nk_samx_depth_t;

static nk_samx_depth_t nk_samx_depth_of(uint64_t screen_depth) {
    nk_samx_depth_t depth;
    depth.groups = screen_depth / 4;
    depth.steps = (depth.groups + 15) / 16;
    depth.tiny = depth.groups < 16;
    depth.pad = depth.tiny ? 0 : 16 * depth.steps - depth.groups;
    return depth;
}

/* Signed A tiles of the query tile starting at row `first` (a multiple of 16) for steps
 * [step0, step0 + steps): out[s][row][4 k + b] = byte b of group 16 (step0 + s) + k (or of the
 * end-aligned last step), minus 128. Rows past the end, groups past the depth and shared groups are
 * zero, so they add nothing. */
static void nk_samx_build_query_tiles(nk_maxsim_view_t const *q, nk_samx_depth_t const *depth, uint64_t first,
                                      uint64_t step0, uint64_t steps, int8_t *out) {
    uint64_t present = q->vectors - first;
    uint64_t lanes = present < 16 ? present : 16;
    __mmask16 rows = nk_x512_tail_mask(lanes);
    uint8_t const *tile = q->screen + first * q->screen_depth;
    __m512i flip = _mm512_set1_epi32((int)0x80808080u);
    for (uint64_t s = 0; s < steps; ++s) {
        __m512i r[16];
        int last = step0 + s + 1 == depth->steps;
        uint64_t g = last && depth->pad ? depth->groups - 16 : 16 * (step0 + s);
        uint64_t skip = last ? depth->pad : 0; /* leading groups the step before already covered */
#pragma GCC unroll 16
        for (int k = 0; k < 16; ++k)
            r[k] = g + (uint64_t)k < depth->groups && (uint64_t)k >= skip
                       ? _mm512_maskz_xor_epi32(
                             rows, _mm512_maskz_loadu_epi32(rows, tile + (g + (uint64_t)k) * 4 * lanes), flip)
                       : _mm512_setzero_si512();
        nk_samx_transpose16(r);
#pragma GCC unroll 16
        for (int k = 0; k < 16; ++k) _mm512_store_si512(out + s * NK_SAMX_STEP_BYTES + 64 * k, r[k]);
    }
}

/* Document tile t in B layout with 64-byte lines, groups [g0, g0 + lines) (g0 may be negative):
 * absent lanes and groups outside the depth read as value 0 (byte 0x80); nothing outside the section
 * is read. For the partial last tile of the matrix and for tiny depths. */
static void nk_samx_copy_doc_tile(nk_maxsim_view_t const *d, uint64_t t, int64_t g0, uint64_t lines, uint8_t *out) {
    int64_t groups = (int64_t)(d->screen_depth / 4);
    uint64_t first = 16 * t, lanes = d->vectors - first < 16 ? d->vectors - first : 16;
    __mmask16 rows = nk_x512_tail_mask(lanes);
    uint8_t const *tile = d->screen + first * d->screen_depth;
    __m512i zero = _mm512_set1_epi32((int)0x80808080u);
    for (int64_t g = g0; g < g0 + (int64_t)lines; ++g, out += 64)
        _mm512_store_si512(out, g >= 0 && g < groups ? _mm512_mask_loadu_epi32(zero, rows, tile + g * 4 * (int64_t)lanes)
                                                     : zero);
}

/* Tile registers (GCC's tile intrinsics need literal numbers): 0-3 accumulate four document tiles,
 * 4 and 5 hold the query tile of even and odd steps, 6 and 7 take turns with the document tiles
 * (nk_samx_stationary_dots: 0 and 1 accumulate, 2-5 hold two query tiles' steps). */

/* Start the DT (1..4, compile-time) accumulators from `init` (int32 partial sums, tile t at
 * init + 16 t, rows `row_bytes` apart: the driver's u) or from zero, then run `steps`
 * 64-deep steps. Document tile t's step s is at
 * doc[t] + 1024 s, except the last, which `tail_back` bytes earlier is end-aligned; the query tile's
 * is at a_tiles + 1024 s. With `stationary` the query tiles are already in registers 4 and 5 (at
 * most two steps). */
NK_INLINE void nk_samx_quad_dots(int8_t const *a_tiles, uint8_t const *const doc[4], uint64_t steps,
                                      uint64_t tail_back, int32_t const *init, uint64_t row_bytes, int stationary,
                                      int const DT) {
    if (init) {
        _tile_loadd(0, init, row_bytes);
        if (DT > 1) _tile_loadd(1, init + 16, row_bytes);
        if (DT > 2) _tile_loadd(2, init + 32, row_bytes);
        if (DT > 3) _tile_loadd(3, init + 48, row_bytes);
    } else {
        _tile_zero(0);
        if (DT > 1) _tile_zero(1);
        if (DT > 2) _tile_zero(2);
        if (DT > 3) _tile_zero(3);
    }
/* Both steps of document tile T (a literal) against query tiles 4 and 5. */
#define NK_SAMX_BOTH_STEPS(T) \
    do { \
        _tile_loadd(6, doc[T], 64); \
        _tile_loadd(7, doc[T] + second, 64); \
        _tile_dpbsud(T, 4, 6); \
        _tile_dpbsud(T, 5, 7); \
    } while (0)
    if (stationary && steps == 2) { /* both steps of one document tile back to back: fewer stalls */
        uint64_t second = NK_SAMX_STEP_BYTES - tail_back;
        NK_SAMX_BOTH_STEPS(0);
        if (DT > 1) NK_SAMX_BOTH_STEPS(1);
        if (DT > 2) NK_SAMX_BOTH_STEPS(2);
        if (DT > 3) NK_SAMX_BOTH_STEPS(3);
        return;
    }
#undef NK_SAMX_BOTH_STEPS
/* One step of query tile A (a literal) against the DT document tiles at doc[t] + `at`, their
 * loads alternating between tiles 6 and 7. */
#define NK_SAMX_ONE_STEP(A, at) \
    do { \
        _tile_loadd(6, doc[0] + (at), 64); \
        _tile_dpbsud(0, A, 6); \
        if (DT > 1) { \
            _tile_loadd(7, doc[1] + (at), 64); \
            _tile_dpbsud(1, A, 7); \
        } \
        if (DT > 2) { \
            _tile_loadd(6, doc[2] + (at), 64); \
            _tile_dpbsud(2, A, 6); \
        } \
        if (DT > 3) { \
            _tile_loadd(7, doc[3] + (at), 64); \
            _tile_dpbsud(3, A, 7); \
        } \
    } while (0)
    for (uint64_t s = 0, a_offset = 0; s < steps; s += 2, a_offset += 2 * NK_SAMX_STEP_BYTES) {
        uint64_t offset = s + 1 == steps ? a_offset - tail_back : a_offset;
        if (!stationary) _tile_loadd(4, a_tiles + a_offset, 64);
        NK_SAMX_ONE_STEP(4, offset);
        if (s + 1 == steps) break;
        uint64_t odd = a_offset + NK_SAMX_STEP_BYTES - (s + 2 == steps ? tail_back : 0);
        if (!stationary) _tile_loadd(5, a_tiles + a_offset + NK_SAMX_STEP_BYTES, 64);
        NK_SAMX_ONE_STEP(5, odd);
    }
#undef NK_SAMX_ONE_STEP
}

/* Store the DT accumulators into u: tile t at out + 16 t, rows `row_bytes` apart. */
NK_INLINE void nk_samx_quad_store(int32_t *out, uint64_t row_bytes, int const DT) {
    _tile_stored(0, out, row_bytes);
    if (DT > 1) _tile_stored(1, out + 16, row_bytes);
    if (DT > 2) _tile_stored(2, out + 32, row_bytes);
    if (DT > 3) _tile_stored(3, out + 48, row_bytes);
}

/* A query group's screening state: up to two query tiles of A operands and what the epilogue needs. */
typedef struct nk_samx_group {
    _Alignas(64) int8_t query_tiles[2][NK_SAMX_CHUNK_STEPS * NK_SAMX_STEP_BYTES];
    /* The padded last document tile: one pass and one step before it (or four tiles of a tiny depth). */
    _Alignas(64) uint8_t last_tile[(NK_SAMX_CHUNK_STEPS + 1) * NK_SAMX_STEP_BYTES];
    _Alignas(64) float top[NK_SAMX_ROWS][16]; /* per lane, the block's largest u, tagged (nk_x512_tag) */
    /* Two quads of accumulators (32 rows x 4 tiles of int32 sums, rows 64 words apart): the fused
     * epilogue of nk_samx_dots_block_pair reads one while the tile unit fills the other. */
    _Alignas(64) int32_t quads[2][NK_SAMX_ROWS * 64];
    int32_t bias[NK_SAMX_ROWS];               /* -128 * screen_sums[q]: cancels the documents' +128 offset */
    nk_maxsim_view_t const *q;
    uint64_t first, rows;
    nk_samx_depth_t depth;
    int single_pass; /* the whole depth fits the A buffer, built once per group */
} nk_samx_group_t;
#define nk_family_query_t nk_samx_group_t

/* Turn the biased sums of query rows [row0, row0 + rows) against tiles [t, t + DT) (DT 1..4,
 * compile-time; all lanes present but the last tile's `last_lanes`) into u (rows `stride` floats
 * apart), raising the tagged per-lane maxima of u. Row r's sums against tile t + k are at
 * sums + r * sums_stride + 16 k: u itself (in place) or the group's copy of the accumulators. */
NK_INLINE void nk_samx_quad_epilogue(int32_t const *sums, uint64_t sums_stride, float *u, uint64_t stride,
                                     uint64_t row0, uint64_t rows, uint64_t t, float const *scales_d,
                                     float const *errors_d, __mmask16 last_lanes, float const *growth,
                                     nk_samx_group_t *group, int const DT) {
    __m512 scale[4], error[4];
    __mmask16 lanes[4];
    __m512 minus_infinity = _mm512_set1_ps(-INFINITY);
#pragma GCC unroll 4
    for (int k = 0; k < DT; ++k) {
        lanes[k] = k + 1 < DT ? (__mmask16)0xFFFF : last_lanes;
        scale[k] = _mm512_maskz_loadu_ps(lanes[k], scales_d + 16 * k);
        error[k] = _mm512_maskz_loadu_ps(lanes[k], errors_d + 16 * k);
    }
    for (uint64_t r = row0; r < row0 + rows; ++r) {
        __m512 b = _mm512_set1_ps(growth[r]), top = _mm512_load_ps(group->top[r]);
        __m512i bias = _mm512_set1_epi32(group->bias[r]);
#pragma GCC unroll 4
        for (int k = 0; k < DT; ++k) {
            float *at = u + r * stride + 16 * (t + (uint64_t)k);
            __m512i sum = _mm512_load_si512((void const *)(sums + r * sums_stride + 16 * (uint64_t)k));
            __m512 p = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(sum, bias)), scale[k]);
            __m512 upper = _mm512_fmadd_ps(b, error[k], p);
            top = _mm512_mask_max_ps(top, lanes[k], top, nk_x512_tag(upper, (unsigned)(t + (uint64_t)k)));
            _mm512_store_ps(at, _mm512_mask_mov_ps(minus_infinity, lanes[k], upper));
        }
        _mm512_store_ps(group->top[r], top);
    }
}

/* The epilogue for query rows [row0, row0 + rows) and tiles [t0, t1) of a block of `docs`, from
 * `sums` (tile t0 at sums, rows sums_stride words apart; u itself when the sums are there). */
static void nk_samx_finish(nk_samx_group_t *group, nk_maxsim_view_t const *d, uint64_t row0, uint64_t rows,
                           uint64_t first_doc, uint64_t docs, uint64_t t0, uint64_t t1, int32_t const *sums,
                           uint64_t sums_stride, float const *growth, float *u) {
    uint64_t tiles = (docs + 15) / 16, partial = docs % 16, stride = nk_samx_stride(docs);
    __mmask16 last = partial ? (__mmask16)((1u << partial) - 1u) : (__mmask16)0xFFFF;
    float const *scales_d = d->screen_scales + first_doc, *errors_d = d->screen_errors + first_doc;
    for (uint64_t t = t0; t < t1; t += 4, sums += 64) {
        float const *scales = scales_d + 16 * t, *errors = errors_d + 16 * t;
        uint64_t quad = t1 - t < 4 ? t1 - t : 4;
        __mmask16 lanes = t + quad == tiles ? last : (__mmask16)0xFFFF; /* only the block's last tile is partial */
        switch (quad) {
        case 4:
            nk_samx_quad_epilogue(sums, sums_stride, u, stride, row0, rows, t, scales, errors, lanes, growth, group, 4);
            break;
        case 3:
            nk_samx_quad_epilogue(sums, sums_stride, u, stride, row0, rows, t, scales, errors, lanes, growth, group, 3);
            break;
        case 2:
            nk_samx_quad_epilogue(sums, sums_stride, u, stride, row0, rows, t, scales, errors, lanes, growth, group, 2);
            break;
        default:
            nk_samx_quad_epilogue(sums, sums_stride, u, stride, row0, rows, t, scales, errors, lanes, growth, group, 1);
            break;
        }
    }
}

/* The int8 path's fused epilogue (nk_samx_int8): per query row and lane, the largest float32 screen
 * value f (tagged with its tile, nk_x512_tag), the second largest, and the exact dot product of the
 * largest, kept while the tile unit computes the next quad of sums, which then need not be stored
 * for the whole block. */
typedef struct nk_samx_int8_tops {
    _Alignas(64) float first[NK_SAMX_ROWS][16];
    _Alignas(64) float second[NK_SAMX_ROWS][16];
    _Alignas(64) int32_t dot[NK_SAMX_ROWS][16];
    float const *weights; /* the block's ~ 1 / sqrt(norms2) (nk_samx_int8) */
    int32_t const *bias;  /* per query row, what the biased document bytes add to its dot products */
} nk_samx_int8_tops_t;

/* Raise the tops of rows [0, rows) with tiles [t, t + DT) (DT 1..4, compile-time; all lanes present
 * but the last tile's `last_lanes`), whose biased sums are at sums + 64 r + 16 k. */
NK_INLINE void nk_samx_int8_quad(nk_samx_int8_tops_t *tops, int32_t const *sums, uint64_t rows, uint64_t t,
                                 __mmask16 last_lanes, int const DT) {
    for (uint64_t r = 0; r < rows; ++r) {
        __m512 first = _mm512_load_ps(tops->first[r]), second = _mm512_load_ps(tops->second[r]);
        __m512i dot = _mm512_load_si512((void const *)tops->dot[r]), bias = _mm512_set1_epi32(tops->bias[r]);
#pragma GCC unroll 4
        for (int k = 0; k < DT; ++k) {
            __mmask16 lanes = k + 1 < DT ? (__mmask16)0xFFFF : last_lanes;
            __m512i exact = _mm512_sub_epi32(_mm512_load_si512((void const *)(sums + 64 * r + 16 * k)), bias);
            __m512 f = _mm512_mul_ps(_mm512_cvtepi32_ps(exact), _mm512_load_ps(tops->weights + 16 * (t + (uint64_t)k)));
            __m512 tagged = nk_x512_tag(f, (unsigned)(t + (uint64_t)k));
            __mmask16 above = _mm512_mask_cmp_ps_mask(lanes, tagged, first, _CMP_GT_OQ);
            second = _mm512_mask_max_ps(second, lanes, second, _mm512_min_ps(first, tagged));
            first = _mm512_mask_mov_ps(first, above, tagged);
            dot = _mm512_mask_mov_epi32(dot, above, exact);
        }
        _mm512_store_ps(tops->first[r], first);
        _mm512_store_ps(tops->second[r], second);
        _mm512_store_si512((void *)tops->dot[r], dot);
    }
}

/* nk_samx_int8_quad for tiles [t0, t1) (at most 4) of a block of `docs`. */
static void nk_samx_int8_tiles(nk_samx_int8_tops_t *tops, int32_t const *sums, uint64_t rows, uint64_t docs,
                               uint64_t t0, uint64_t t1) {
    uint64_t partial = docs % 16;
    __mmask16 lanes = t1 == (docs + 15) / 16 && partial ? (__mmask16)((1u << partial) - 1u) : (__mmask16)0xFFFF;
    switch (t1 - t0) {
    case 4: nk_samx_int8_quad(tops, sums, rows, t0, lanes, 4); break;
    case 3: nk_samx_int8_quad(tops, sums, rows, t0, lanes, 3); break;
    case 2: nk_samx_int8_quad(tops, sums, rows, t0, lanes, 2); break;
    default: nk_samx_int8_quad(tops, sums, rows, t0, lanes, 1); break;
    }
}

/* Tile t of an int4 matrix (words of 8 depths: depth 8g + j in the low nibble of byte j of word g,
 * 8g + 4 + j in its high one, each q + 8) as a whole int8 document tile of the screen layout: line 2g
 * the low nibbles, line 2g + 1 the high ones, bytes q + 8 (lanes past the matrix read as q = 0). */
static void nk_samx_unpack_int4_tile(nk_maxsim_view_t const *d, uint64_t t, uint8_t *out) {
    uint64_t first = 16 * t, lanes = d->vectors - first < 16 ? d->vectors - first : 16;
    __mmask16 present = nk_x512_tail_mask(lanes);
    uint8_t const *tile = (uint8_t const *)d->values + first * d->row_bytes;
    __m512i nibble = _mm512_set1_epi8(0x0F), zero = _mm512_set1_epi8((char)0x88);
    for (uint64_t g = 0; g < d->row_bytes / 4; ++g, out += 128) {
        __m512i words = _mm512_mask_loadu_epi32(zero, present, tile + g * 4 * lanes);
        _mm512_store_si512((void *)out, _mm512_and_si512(words, nibble));
        _mm512_store_si512((void *)(out + 64), _mm512_and_si512(_mm512_srli_epi16(words, 4), nibble));
    }
}

/* The biased sums of one query tile (rows [16 half, 16 half + 16) of the group) against documents
 * [first_doc, first_doc + docs) into u, depth pass by depth pass. */
static void nk_samx_dots_block(nk_samx_group_t *group, nk_maxsim_view_t const *d, unsigned half, uint64_t first_doc,
                               uint64_t docs, float *u, nk_prefetch_stream_t *prefetch) {
    nk_samx_depth_t const depth = group->depth;
    uint64_t total_steps = depth.steps, tile_bytes = NK_SCREEN_TILE * d->screen_depth;
    uint64_t tiles = (docs + 15) / 16, partial = docs % 16;
    /* A partial last tile of the matrix (rows 4 n bytes apart) is read from its padded copy. */
    int last_is_copy = !depth.tiny && first_doc + docs == d->vectors && partial;
    uint64_t direct_tiles = last_is_copy ? tiles - 1 : tiles;
    uint8_t const *block = d->screen + first_doc * d->screen_depth;
    int8_t *query_tiles = group->query_tiles[half];
    uint64_t stride = nk_samx_stride(docs), row_bytes = 4 * stride;
    int32_t *sums = (int32_t *)(void *)(u + 16 * half * stride);
    for (uint64_t step0 = 0; step0 < total_steps; step0 += NK_SAMX_CHUNK_STEPS) {
        uint64_t steps = total_steps - step0 < NK_SAMX_CHUNK_STEPS ? total_steps - step0 : NK_SAMX_CHUNK_STEPS;
        int accumulate = step0 != 0, finish = step0 + steps == total_steps;
        uint64_t tail_back = finish ? 64 * depth.pad : 0;
        uint8_t const *last_copy = group->last_tile;
        if (!group->single_pass) {
            nk_samx_build_query_tiles(group->q, &group->depth, group->first + 16 * half, step0, steps, query_tiles);
            /* One step of lines before the pass too, for an end-aligned last step that reaches back. */
            if (last_is_copy)
                nk_samx_copy_doc_tile(d, (d->vectors - 1) / 16, 16 * (int64_t)step0 - 16, 16 * steps + 16,
                                      group->last_tile);
            last_copy = group->last_tile + NK_SAMX_STEP_BYTES;
        }
        /* At most two steps: the query tiles stay in registers for the whole pass. */
        int stationary = steps <= 2;
        if (stationary) {
            _tile_loadd(4, query_tiles, 64);
            if (steps == 2) _tile_loadd(5, query_tiles + NK_SAMX_STEP_BYTES, 64);
        }
        uint64_t line0 = step0 * NK_SAMX_STEP_BYTES;
        /* The AMX unit first, then the vector units: interleaving them costs more than it overlaps. */
        for (uint64_t t = 0; t < tiles; t += 4) {
            uint8_t const *doc[4];
            uint64_t quad = tiles - t < 4 ? tiles - t : 4;
            for (unsigned k = 0; k < 4; ++k) {
                if (depth.tiny) { /* a single step of fewer than 16 lines: pad every tile */
                    if (k < quad)
                        nk_samx_copy_doc_tile(d, first_doc / 16 + t + k, 0, 16,
                                              group->last_tile + k * NK_SAMX_STEP_BYTES);
                    doc[k] = group->last_tile + k * NK_SAMX_STEP_BYTES;
                } else
                    doc[k] = t + k < direct_tiles ? block + (t + k) * tile_bytes + line0 : last_copy;
            }
            int32_t *out = sums + 16 * t;
            int32_t const *init = accumulate ? out : NULL;
            nk_prefetch_lines(prefetch, 16 * steps); /* the next document: a line per depth group screened */
            switch (quad) {
            case 4:
                nk_samx_quad_dots(query_tiles, doc, steps, tail_back, init, row_bytes, stationary, 4);
                nk_samx_quad_store(out, row_bytes, 4);
                break;
            case 3:
                nk_samx_quad_dots(query_tiles, doc, steps, tail_back, init, row_bytes, stationary, 3);
                nk_samx_quad_store(out, row_bytes, 3);
                break;
            case 2:
                nk_samx_quad_dots(query_tiles, doc, steps, tail_back, init, row_bytes, stationary, 2);
                nk_samx_quad_store(out, row_bytes, 2);
                break;
            default:
                nk_samx_quad_dots(query_tiles, doc, steps, tail_back, init, row_bytes, stationary, 1);
                nk_samx_quad_store(out, row_bytes, 1);
                break;
            }
        }
    }
}

/* Two query groups (32 rows) against up to two document tiles, one pass over the whole depth:
 * accumulators 0/1 take group 0 against documents 0/1, 2/3 group 1. Each document tile loaded from L2
 * serves both groups, which halves the document traffic of one stationary group; the query tiles come
 * from L1. */
NK_INLINE void nk_samx_pair_dots(int8_t const *a0, int8_t const *a1, uint8_t const *const doc[2], uint64_t steps,
                                      uint64_t tail_back, int const DT) {
    _tile_zero(0);
    _tile_zero(2);
    if (DT > 1) {
        _tile_zero(1);
        _tile_zero(3);
    }
    for (uint64_t s = 0, a_offset = 0; s < steps; ++s, a_offset += NK_SAMX_STEP_BYTES) {
        uint64_t offset = s + 1 == steps ? a_offset - tail_back : a_offset;
        _tile_loadd(4, a0 + a_offset, 64);
        _tile_loadd(6, doc[0] + offset, 64);
        _tile_loadd(5, a1 + a_offset, 64);
        _tile_dpbsud(0, 4, 6);
        _tile_dpbsud(2, 5, 6);
        if (DT > 1) {
            _tile_loadd(7, doc[1] + offset, 64);
            _tile_dpbsud(1, 4, 7);
            _tile_dpbsud(3, 5, 7);
        }
    }
}

/* Both query tiles against one document tile at a depth of one or two steps, the query tiles held in
 * registers for the whole block (the first tile's steps in 4 and 5, the second's in 2 and 3): one load
 * per document tile and step feeds two products, where nk_samx_pair_dots loads one tile per product.
 * Accumulator 0 takes the first query tile, 1 the second. C, bfloat16, time against the pair form:
 * 32x180x128 0.98, 32x1024x128 0.92-0.93, 1024x1024x128 0.89-0.91. */
NK_INLINE void nk_samx_stationary_dots(uint8_t const *doc, uint64_t steps, uint64_t tail_back) {
    _tile_zero(0);
    _tile_zero(1);
    _tile_loadd(6, doc, 64);
    _tile_dpbsud(0, 4, 6);
    _tile_dpbsud(1, 2, 6);
    if (steps == 2) {
        _tile_loadd(7, doc + NK_SAMX_STEP_BYTES - tail_back, 64);
        _tile_dpbsud(0, 5, 7);
        _tile_dpbsud(1, 3, 7);
    }
}

/* The paired form of nk_samx_dots_block, both query tiles at once, for a depth of 16 groups or more
 * in a single pass: each document tile loaded from L2 serves both. With `growth` (not NULL) the
 * epilogue is fused: each quad of 4 document tiles leaves its accumulators in the group's L1 copy
 * (`quads`), and the quad before is turned into u while the tile unit works on this one, so u is
 * written once rather than stored, read back and written again. That pays where u outgrows L1 and
 * the tile unit's share is small (nk_samx_screen). With `int8` instead, the quads raise the int8
 * path's tops (nk_samx_int8_quad) and u is not written. */
static void nk_samx_dots_block_pair(nk_samx_group_t *group, nk_maxsim_view_t const *d, uint64_t first_doc,
                                    uint64_t docs, float const *growth, float *u, nk_samx_int8_tops_t *int8,
                                    uint8_t *int4_tiles, nk_prefetch_stream_t *prefetch) {
    nk_samx_depth_t const depth = group->depth;
    uint64_t tile_bytes = NK_SCREEN_TILE * d->screen_depth, tiles = (docs + 15) / 16;
    uint64_t direct_tiles = first_doc + docs == d->vectors && docs % 16 ? tiles - 1 : tiles;
    uint64_t tail_back = 64 * depth.pad;
    uint8_t const *block = d->screen + first_doc * d->screen_depth;
    int fused = growth || int8;
    uint64_t sums_stride = fused ? 64 : nk_samx_stride(docs), row_bytes = 4 * sums_stride;
    /* int4 keeps the pair form: unpacking its tiles dominates (32x1024x64 1.06-1.11 the time so) */
    int stationary = depth.steps <= 2 && !int4_tiles;
    if (stationary) {
        _tile_loadd(4, group->query_tiles[0], 64);
        _tile_loadd(2, group->query_tiles[1], 64);
        if (depth.steps == 2) {
            _tile_loadd(5, group->query_tiles[0] + NK_SAMX_STEP_BYTES, 64);
            _tile_loadd(3, group->query_tiles[1] + NK_SAMX_STEP_BYTES, 64);
        }
    }
    for (uint64_t t = 0; t < tiles; t += 4) {
        int32_t *sums = fused ? group->quads[t / 4 % 2] : (int32_t *)(void *)u + 16 * t;
        for (uint64_t p = t; stationary && p < t + 4 && p < tiles; ++p) {
            uint8_t const *doc = p < direct_tiles ? block + p * tile_bytes : group->last_tile;
            nk_prefetch_lines(prefetch, 8 * depth.steps); /* the next document, at the pair form's rate */
            nk_samx_stationary_dots(doc, depth.steps, tail_back);
            _tile_stored(0, sums + 16 * (p - t), row_bytes);
            _tile_stored(1, sums + 16 * (p - t) + 16 * sums_stride, row_bytes);
        }
        for (uint64_t p = t; !stationary && p < t + 4 && p < tiles; p += 2) {
            uint8_t const *doc[2];
            for (unsigned k = 0; k < 2; ++k)
                if (int4_tiles) { /* int4 documents: the pair's tiles unpacked into L1 */
                    if (p + k < tiles) nk_samx_unpack_int4_tile(d, first_doc / 16 + p + k, int4_tiles + k * tile_bytes);
                    doc[k] = int4_tiles + k * tile_bytes;
                }
                else
                    doc[k] = p + k < direct_tiles ? block + (p + k) * tile_bytes : group->last_tile;
            nk_prefetch_lines(prefetch, 16 * depth.steps); /* the next document: a line per depth group screened */
            int32_t *sums0 = sums + 16 * (p - t), *sums1 = sums0 + 16 * sums_stride;
            if (p + 1 < tiles) {
                nk_samx_pair_dots(group->query_tiles[0], group->query_tiles[1], doc, depth.steps, tail_back, 2);
                _tile_stored(0, sums0, row_bytes);
                _tile_stored(1, sums0 + 16, row_bytes);
                _tile_stored(2, sums1, row_bytes);
                _tile_stored(3, sums1 + 16, row_bytes);
            } else {
                nk_samx_pair_dots(group->query_tiles[0], group->query_tiles[1], doc, depth.steps, tail_back, 1);
                _tile_stored(0, sums0, row_bytes);
                _tile_stored(2, sums1, row_bytes);
            }
        }
        if (growth && t)
            nk_samx_finish(group, d, 0, group->rows, first_doc, docs, t - 4, t, group->quads[(t / 4 + 1) % 2], 64,
                           growth, u);
        else if (int8 && t)
            nk_samx_int8_tiles(int8, group->quads[(t / 4 + 1) % 2], group->rows, docs, t - 4, t);
    }
    uint64_t last = (tiles - 1) / 4 * 4;
    if (growth)
        nk_samx_finish(group, d, 0, group->rows, first_doc, docs, last, tiles, group->quads[last / 4 % 2], 64, growth,
                       u);
    else if (int8)
        nk_samx_int8_tiles(int8, group->quads[last / 4 % 2], group->rows, docs, last, tiles);
}

/* ---- The driver's primitives. ---- */

/* A group's query tiles (and the padded last document tile) for the screen sections of q and d. */
static void nk_samx_prepare_tiles(nk_maxsim_view_t const *q, nk_maxsim_view_t const *d, uint64_t first, uint64_t rows,
                                  nk_samx_group_t *group) {
    group->q = q, group->first = first, group->rows = rows;
    group->depth = nk_samx_depth_of(d->screen_depth);
    group->single_pass = group->depth.steps <= NK_SAMX_CHUNK_STEPS;
    if (group->single_pass) {
        for (unsigned half = 0; 16 * half < rows; ++half)
            nk_samx_build_query_tiles(q, &group->depth, first + 16 * half, 0, group->depth.steps,
                                      group->query_tiles[half]);
        if (!group->depth.tiny && d->vectors % 16 && d->dtype != nk_dtype_int4_k) /* int4: unpacked per tile */
            nk_samx_copy_doc_tile(d, (d->vectors - 1) / 16, 0, 16 * group->depth.steps, group->last_tile);
    }
}

static void nk_samx_prepare(nk_maxsim_view_t const *q, nk_maxsim_view_t const *d, uint64_t first, uint64_t rows,
                            nk_samx_group_t *group) {
    for (unsigned r = 0; r < NK_SAMX_ROWS; ++r)
        group->bias[r] = /* unsigned: wraps, never overflows, whatever the buffer holds */
            r < rows && q->inv_norms[first + r] != 0.0 ? (int32_t)(0u - (uint32_t)q->screen_sums[first + r] * 128u) : 0;
    nk_samx_prepare_tiles(q, d, first, rows, group);
}
#define nk_family_prepare nk_samx_prepare

static void nk_samx_screen(nk_samx_group_t *group, float const *growth, uint64_t rows, nk_maxsim_view_t const *d,
                           uint64_t first_doc, uint64_t docs, float *u, int32_t *top, nk_prefetch_stream_t *prefetch) {
    int fused = 0;
    for (unsigned r = 0; r < rows; ++r) _mm512_store_ps(group->top[r], _mm512_set1_ps(-INFINITY));
    if (rows > 16 && group->single_pass && !group->depth.tiny) {
        /* The fused epilogue from 320 documents (u over 40 KB, most of L1) at depths of one or two
         * steps. C, time against the separate epilogue: 32x1024x128 0.94-0.97, 32x2000x128 0.94-0.95,
         * 32x1024x96 0.91, 32x1024x64 0.87; but 32x1024x256 1.03, 32x1024x512 1.05, 32x512x768
         * 1.01-1.05. With the query tiles in registers (nk_samx_stationary_dots): 32x320x128 0.977,
         * 32x400x128 0.964-0.969, 32x480x128 0.949, 32x480x64 0.936; but 32x288x128 1.011,
         * 32x256x128 1.019, 32x180x128 1.024 (its u fits L1). */
        fused = docs >= 320 && group->depth.steps <= 2;
        nk_samx_dots_block_pair(group, d, first_doc, docs, fused ? growth : NULL, u, NULL, NULL, prefetch);
    }
    else
        for (unsigned half = 0; 16 * half < rows; ++half)
            nk_samx_dots_block(group, d, half, first_doc, docs, u, prefetch);
    if (!fused)
        nk_samx_finish(group, d, 0, rows, first_doc, docs, 0, (docs + 15) / 16, (int32_t const *)(void const *)u,
                       nk_samx_stride(docs), growth, u);
    nk_x512_read_tops(group->top, rows, docs, top);
}
#define nk_family_screen nk_samx_screen

#include "avx512_rescoring.h"
#include "driver.h"

/* ---- int8 and int4 with tiles. ----
 * An int8 matrix's values are laid out as a screen section is (biased bytes in 16-row tiles of 4-byte
 * words), so the screening's tile GEMM runs on them unchanged and gives dot + 128 x (sum of the query
 * row's q); the epilogue removes that and takes the float64 maximum that integer_maxsim.h takes. An
 * int4 matrix's nibbles are unpacked into that layout on the way (documents q + 8, a tile pair at a
 * time). uint1 has no tile instruction and uses avx512_integer.h's VPOPCNTDQ, as do int4 queries of
 * one tile and depths outside one pass. */
#include "avx512_integer.h"
#include "integer_maxsim.h"

/* 2^shift x the sum of q of query rows [first, first + rows) (at most 32) of an int8 matrix (or an
 * int4 query's nk_samx_int4_query copy): the stored bytes summed as unsigned by vpdpbusd against
 * bytes of 1, less 128 per stored depth (padding stores q = 0). What document bytes q + 2^shift add. */
static void nk_samx_int8_bias(nk_maxsim_view_t const *q, uint64_t first, uint64_t rows, unsigned shift,
                              int32_t *bias) {
    __m512i ones = _mm512_set1_epi8(1);
    for (uint64_t half = 0; 16 * half < rows; ++half) {
        uint64_t step, present = rows - 16 * half < 16 ? rows - 16 * half : 16;
        uint8_t const *words = nk_integer_group_words(q, first + 16 * half, 0, &step);
        __mmask16 lanes = nk_x512_tail_mask(present);
        __m512i sums = _mm512_setzero_si512();
        for (uint64_t w = 0; w < q->row_bytes / 4; ++w, words += step)
            sums = _mm512_dpbusd_epi32(sums, _mm512_maskz_loadu_epi32(lanes, words), ones);
        __m512i unbiased = _mm512_sub_epi32(sums, _mm512_set1_epi32((int)(128 * q->screen_depth)));
        _mm512_mask_storeu_epi32(bias + 16 * half, lanes, _mm512_sll_epi32(unbiased, _mm_cvtsi32_si128((int)shift)));
    }
}

/* Rows [first, first + rows) (first a multiple of 32) of an int4 matrix as the int8 matrix of `rows`
 * rows that nk_samx_prepare_tiles and nk_samx_int8_bias read (bytes q + 128, the same tile layout):
 * `view` describes it, `out` holds it (rows x screen_depth bytes). */
static void nk_samx_int4_query(nk_maxsim_view_t const *q, uint64_t first, uint64_t rows, nk_maxsim_view_t *view,
                               uint8_t *out) {
    __m512i nibble = _mm512_set1_epi8(0x0F), offset = _mm512_set1_epi8(120); /* q + 8 + 120 */
    *view = *q;
    view->dtype = nk_dtype_int8_k, view->vectors = rows, view->row_bytes = q->screen_depth;
    view->values = out, view->screen = out;
    for (uint64_t half = 0; 16 * half < rows; ++half) {
        uint64_t lanes = rows - 16 * half < 16 ? rows - 16 * half : 16;
        __mmask16 present = nk_x512_tail_mask(lanes);
        uint8_t const *tile = (uint8_t const *)q->values + (first + 16 * half) * q->row_bytes;
        uint8_t *to = out + 16 * half * q->screen_depth;
        for (uint64_t g = 0; g < q->row_bytes / 4; ++g) {
            __m512i words = _mm512_maskz_loadu_epi32(present, tile + g * 4 * lanes);
            __m512i low = _mm512_add_epi8(_mm512_and_si512(words, nibble), offset);
            __m512i high = _mm512_add_epi8(_mm512_and_si512(_mm512_srli_epi16(words, 4), nibble), offset);
            _mm512_mask_storeu_epi32(to + 2 * g * 4 * lanes, present, low);
            _mm512_mask_storeu_epi32(to + (2 * g + 1) * 4 * lanes, present, high);
        }
    }
}

/* A candidate's exact cosine from its dot product: integer_maxsim.h's ((double)dot * inv_q) * inv_d. */
static inline double nk_samx_int8_cosine(int32_t dot, double inv_q, uint32_t norm2) {
    return (double)dot * inv_q * nk_integer_inv_norm(norm2);
}

/* Row r's best cosine over a block from its biased sums (`sums`, `docs` of them): a float32 screen
 * f_j = (float)dot_j * w_j with w_j within 2^-14 of 1 / sqrt(norms2_j) (vrsqrt14), then the exact
 * cosine, ((double)dot_j * inv_q) * inv_d, of every document whose f_j is within `tolerance` of the
 * largest. |f_j - g_j| <= 2^-13.5 |g_j| for g_j = dot_j * inv_d, and |g_j| <= sqrt(norms2_q) (Cauchy-
 * Schwarz on the codes), so with tolerance = 2^-12 sqrt(norms2_q) every document left out has a g, and
 * so a float64 cosine, below the largest one's: the maximum is the one over all documents, bit for bit.
 * The float64 pass this replaces (8 cosines a vector, and a square root and a division per document
 * for every query group) made int8 slower than bfloat16's screening on the same tiles. */
static double nk_samx_int8_row_best(int32_t const *sums, int32_t bias, float const *weights, uint64_t docs,
                                    uint32_t const *norms2_d, double inv_q, double tolerance, float *screened) {
    uint64_t tiles = (docs + 15) / 16, t = 0;
    __m512i unbias = _mm512_set1_epi32(bias);
    __m512 minus_infinity = _mm512_set1_ps(-INFINITY), most[4];
/* f of tile T (lanes past `docs` -inf) into screened, its maximum into most[K] */
#define NK_SAMX_SCREEN_TILE(K, T, LANES) \
    do { \
        __m512i dot = _mm512_sub_epi32(_mm512_load_si512((void const *)(sums + 16 * (T))), unbias); \
        __m512 f = _mm512_mask_mul_ps(minus_infinity, LANES, _mm512_cvtepi32_ps(dot), _mm512_load_ps(weights + 16 * (T))); \
        most[K] = _mm512_max_ps(most[K], f); \
        _mm512_store_ps(screened + 16 * (T), f); \
    } while (0)
    for (int k = 0; k < 4; ++k) most[k] = minus_infinity;
    for (; t + 4 < tiles; t += 4) { /* four maxima, not one chain of them: 32x1024x128 0.88 of the time */
        NK_SAMX_SCREEN_TILE(0, t, 0xFFFF);
        NK_SAMX_SCREEN_TILE(1, t + 1, 0xFFFF);
        NK_SAMX_SCREEN_TILE(2, t + 2, 0xFFFF);
        NK_SAMX_SCREEN_TILE(3, t + 3, 0xFFFF);
    }
    for (; t < tiles; ++t) NK_SAMX_SCREEN_TILE(0, t, nk_x512_tail_mask(docs - 16 * t));
#undef NK_SAMX_SCREEN_TILE
    most[0] = _mm512_max_ps(_mm512_max_ps(most[0], most[1]), _mm512_max_ps(most[2], most[3]));
    __m512 cut = _mm512_set1_ps(nk_f32_at_most((double)_mm512_reduce_max_ps(most[0]) - tolerance));
    double best = -2.0;
/* the exact cosines of tile T's documents whose f reaches the cut */
#define NK_SAMX_TAKE_HITS(T) \
    for (uint64_t bits = nk_x512_hit_bits(screened + 16 * (T), cut); bits; bits &= bits - 1) { \
        uint64_t j = 16 * (T) + nk_ctz64(bits); \
        double cos = nk_samx_int8_cosine((int32_t)((uint32_t)sums[j] - (uint32_t)bias), inv_q, norms2_d[j]); \
        if (cos > best) best = cos; \
    }
    for (t = 0; t + 4 <= tiles; t += 4)
        if (nk_x512_any_hit4(screened + 16 * t, cut))
            for (uint64_t v = t; v < t + 4; ++v) NK_SAMX_TAKE_HITS(v)
    for (; t < tiles; ++t) NK_SAMX_TAKE_HITS(t)
#undef NK_SAMX_TAKE_HITS
    return best;
}

/* inv[j] = 1 / sqrt(norms2[j]) (0 for 0) for `docs` rows, 8 at a time: nk_integer_inv_norm's bits.
 * The same as integer_maxsim.h's portable loop, written out: that loop as the compiler vectorizes it
 * made int8 32x64x128 1.07x slower (A/B). */
static void nk_samx_inv_norms(uint32_t const *norms2, uint64_t docs, double *inv) {
    for (uint64_t j = 0; j < docs; j += 8) {
        __mmask8 lanes = docs - j >= 8 ? (__mmask8)0xFF : (__mmask8)((1u << (docs - j)) - 1u);
        __m512d n = _mm512_cvtepu32_pd(_mm256_maskz_loadu_epi32(lanes, norms2 + j));
        __mmask8 nonzero = _mm512_cmp_pd_mask(n, _mm512_setzero_pd(), _CMP_NEQ_OQ);
        _mm512_store_pd(inv + j, _mm512_maskz_div_pd(nonzero, _mm512_set1_pd(1.0), _mm512_sqrt_pd(n)));
    }
}

/* Row r's best cosine over a block of few documents, every one exact: ((double)dot * inv_q) * inv_d
 * from its biased sums, 8 at a time (cheaper than the screen's per-row work up to NK_SAMX_EXACT_DOCS). */
static double nk_samx_int8_row_exact(int32_t const *sums, int32_t bias, double const *inv_d, uint64_t docs,
                                     double inv_q) {
    __m256i unbias = _mm256_set1_epi32(bias);
    __m512d scale = _mm512_set1_pd(inv_q), most = _mm512_set1_pd(-2.0);
    for (uint64_t j = 0; j < docs; j += 8) {
        __mmask8 lanes = docs - j >= 8 ? (__mmask8)0xFF : (__mmask8)((1u << (docs - j)) - 1u);
        __m256i dot = _mm256_sub_epi32(_mm256_maskz_loadu_epi32(lanes, sums + j), unbias);
        __m512d cos = _mm512_mul_pd(_mm512_mul_pd(_mm512_cvtepi32_pd(dot), scale), _mm512_maskz_loadu_pd(lanes, inv_d + j));
        most = _mm512_mask_max_pd(most, lanes, most, cos);
    }
    return _mm512_reduce_max_pd(most);
}

/* Row r's best cosine from its fused-epilogue tops (nk_samx_int8_tops_t), or NaN when some lane's
 * second largest f reaches the cut: a document other than the lanes' largest may then be the best,
 * and the caller screens the row again from all its sums. `tolerance` is nk_samx_int8_row_best's,
 * widened by 2^-15 sqrt(norms2_q) for the tags (each within 2^-17 |f| of its f). */
static double nk_samx_int8_resolve(nk_samx_int8_tops_t const *tops, unsigned r, uint32_t const *norms2_d,
                                   double inv_q, double tolerance) {
    __m512 first = _mm512_load_ps(tops->first[r]);
    __m512 cut = _mm512_set1_ps(nk_f32_at_most((double)_mm512_reduce_max_ps(first) - tolerance));
    if (_mm512_cmp_ps_mask(_mm512_load_ps(tops->second[r]), cut, _CMP_GE_OQ)) return NAN;
    double best = -2.0;
    for (uint32_t lanes = _mm512_cmp_ps_mask(first, cut, _CMP_GE_OQ); lanes; lanes &= lanes - 1) {
        unsigned lane = nk_ctz32(lanes);
        int32_t bits;
        memcpy(&bits, &tops->first[r][lane], sizeof bits);
        uint64_t j = 16 * (uint64_t)(bits & NK_X512_TAG_BITS) + lane;
        double cos = nk_samx_int8_cosine(tops->dot[r][lane], inv_q, norms2_d[j]);
        if (cos > best) best = cos;
    }
    return best;
}

/* int8, and int4 whose bytes are unpacked to int8 ones on the way (nk_samx_int4_query,
 * nk_samx_unpack_int4_tile; nk_samx_int4_fits), by tile GEMM: each row's best cosine from the fused
 * epilogue's tops, or from all the sums of a block. */
static double nk_samx_integer(nk_maxsim_view_t const *q, nk_maxsim_view_t const *d) {
    /* the tile GEMM's int32 sums; for int4, first each group's query rows as int8 */
    _Alignas(64) float u[NK_SAMX_ROWS * NK_SAMX_STRIDE];
    _Alignas(64) uint8_t int4_tiles[2 * NK_SAMX_CHUNK_STEPS * NK_SAMX_STEP_BYTES]; /* two document tiles */
    _Alignas(64) float weights[NK_SAMX_BLOCK_DOCS];     /* ~ 1 / sqrt(norms2) of the block's documents */
    _Alignas(64) float screened[NK_SAMX_BLOCK_DOCS];    /* one row's float32 screen */
    _Alignas(64) double inv_d[NK_SAMX_EXACT_DOCS];      /* a block of few documents: 1 / sqrt(norms2) */
    _Alignas(64) nk_samx_group_t group;
    _Alignas(64) nk_samx_int8_tops_t tops;
    int32_t bias[NK_SAMX_ROWS];
    /* The values as the screen sections the tile code reads. */
    nk_maxsim_view_t qs = *q, ds = *d, int4_query;
    qs.screen = (uint8_t const *)q->values, ds.screen = (uint8_t const *)d->values;
    nk_prefetch_stream_t prefetch = d->next;
    double total = 0.0;
    int int4 = q->dtype == nk_dtype_int4_k;
    tops.weights = weights, tops.bias = bias;
    for (uint64_t first = 0; first < q->vectors; first += NK_SAMX_ROWS) {
        uint64_t rows = q->vectors - first < NK_SAMX_ROWS ? q->vectors - first : NK_SAMX_ROWS;
        double best[NK_SAMX_ROWS], inv_q[NK_SAMX_ROWS], tolerance[NK_SAMX_ROWS];
        for (uint64_t r = 0; r < rows; ++r) {
            best[r] = -2.0, inv_q[r] = nk_integer_inv_norm(q->norms2[first + r]);
            tolerance[r] = sqrt((double)q->norms2[first + r]) * 0x1p-12;
        }
        nk_maxsim_view_t const *query = &qs; /* the group's query rows as int8 */
        uint64_t group_first = first;
        if (int4) {
            nk_samx_int4_query(q, first, rows, &int4_query, (uint8_t *)(void *)u);
            query = &int4_query, group_first = 0;
        }
        nk_samx_int8_bias(query, group_first, rows, int4 ? 3u : 7u, bias);
        nk_samx_prepare_tiles(query, &ds, group_first, rows, &group);
        if (int4 && rows <= 16) /* the pair form multiplies an empty second query tile */
            memset(group.query_tiles[1], 0, group.depth.steps * NK_SAMX_STEP_BYTES);
        /* Both query tiles, the whole depth in one pass: the fused epilogue, whose tile stores stay in L1
         * (A/B against storing every sum of the block: 32x1024x128 0.93, 1024x1024x128 0.82 of the time).
         * int4 always (nk_samx_int4_fits); int8 from 17 rows. */
        int fused = (rows > 16 || int4) && group.single_pass && !group.depth.tiny;
        uint8_t *unpacked = int4 ? int4_tiles : NULL;
        for (uint64_t first_doc = 0; first_doc < d->vectors; first_doc += NK_SAMX_BLOCK_DOCS) {
            uint64_t docs = d->vectors - first_doc < NK_SAMX_BLOCK_DOCS ? d->vectors - first_doc : NK_SAMX_BLOCK_DOCS;
            uint64_t stride = nk_samx_stride(docs);
            uint32_t again = 0; /* rows screened again from all their sums */
            int exact = docs <= NK_SAMX_EXACT_DOCS;
            if (first == 0 || d->vectors > NK_SAMX_BLOCK_DOCS) { /* else the only block's, from the group before */
                if (exact)
                    nk_samx_inv_norms(d->norms2 + first_doc, docs, inv_d);
                else
                    for (uint64_t j = 0; j < docs; j += 16) { /* a zero row's weight is 0, not rsqrt(0) = inf */
                        __mmask16 lanes = nk_x512_tail_mask(docs - j);
                        __m512i norms2 = _mm512_maskz_loadu_epi32(lanes, d->norms2 + first_doc + j);
                        __mmask16 nonzero = _mm512_test_epi32_mask(norms2, norms2);
                        _mm512_store_ps(weights + j, _mm512_maskz_rsqrt14_ps(nonzero, _mm512_cvtepu32_ps(norms2)));
                    }
            }
            if (fused && !exact) {
                for (uint64_t r = 0; r < rows; ++r) {
                    _mm512_store_ps(tops.first[r], _mm512_set1_ps(-INFINITY));
                    _mm512_store_ps(tops.second[r], _mm512_set1_ps(-INFINITY));
                    _mm512_store_si512((void *)tops.dot[r], _mm512_setzero_si512());
                }
                nk_samx_dots_block_pair(&group, &ds, first_doc, docs, NULL, NULL, &tops, unpacked, &prefetch);
                for (uint64_t r = 0; r < rows; ++r) {
                    if (inv_q[r] == 0.0) continue; /* a zero row: distance 1 whatever its cosines */
                    double block_best = nk_samx_int8_resolve(&tops, (unsigned)r, d->norms2 + first_doc, inv_q[r],
                                                             tolerance[r] * (1.0 + 0x1p-3));
                    if (block_best != block_best) again |= 1u << r;
                    else if (block_best > best[r]) best[r] = block_best;
                }
                if (!again) continue;
                nk_samx_dots_block_pair(&group, &ds, first_doc, docs, NULL, u, NULL, unpacked, &prefetch);
            }
            else {
                again = rows == 32 ? ~0u : (1u << rows) - 1u;
                if (fused) /* int4, or int8 from 17 rows */
                    nk_samx_dots_block_pair(&group, &ds, first_doc, docs, NULL, u, NULL, unpacked, &prefetch);
                else
                    for (unsigned half = 0; 16 * half < rows; ++half)
                        nk_samx_dots_block(&group, &ds, half, first_doc, docs, u, &prefetch);
            }
            for (uint64_t r = 0; r < rows; ++r) {
                if (inv_q[r] == 0.0 || !(again >> r & 1)) continue;
                int32_t const *sums = (int32_t const *)(void const *)(u + r * stride);
                double block_best = exact ? nk_samx_int8_row_exact(sums, bias[r], inv_d, docs, inv_q[r])
                                          : nk_samx_int8_row_best(sums, bias[r], weights, docs, d->norms2 + first_doc,
                                                                  inv_q[r], tolerance[r], screened);
                if (block_best > best[r]) best[r] = block_best;
            }
        }
        for (uint64_t r = 0; r < rows; ++r) total += nk_row_distance(inv_q[r], best[r]);
        if (total > q->stop_above) return total;
    }
    return total;
}

/* Every tile 16 rows of 64 bytes. */
static void nk_samx_configure(void) {
    nk_samx_tile_config_t config;
    memset(&config, 0, sizeof(config));
    config.palette = 1;
    for (int t = 0; t < 8; ++t) config.bytes_per_row[t] = 64, config.rows[t] = 16;
    _tile_loadconfig(&config);
}

/* ---- The prescreen pass of a top-k search (maxsim_internal.h): a document's 4-bit copy, each 16-row
 * tile's pair of 64-deep steps unpacked into two A tiles in L1, against the query's first 32 rows as
 * B tiles. The sums come out a document row per tile row, the query rows across it, so the epilogue
 * keeps each query row's largest u in a register lane (no u stored, nothing tagged). ---- */

typedef struct nk_samx_prescreen {
    /* [half][step]: 16 lines of query rows 16 half .. + 15, line g the 4 depths 64 step + 4 g .. of each,
     * signed (zero past the depth and the rows) */
    _Alignas(64) int8_t query_tiles[2][2 * NK_PRESCREEN_MAX_PAIRS][16][64];
    nk_driver_group_t group;    /* the bound's constants, as the screening has them */
    int32_t bias[NK_SAMX_ROWS]; /* -8 x the row's sum of screen values: cancels the codes' +8 */
    uint64_t pairs;
} nk_samx_prescreen_t;
_Static_assert(sizeof(nk_samx_prescreen_t) <= NK_PRESCREEN_STATE_BYTES, "the prescreen state fits its scratch");

int nk_prescreen_prepare_sapphireamx(nk_maxsim_view_t const *q, void *state) {
    nk_samx_prescreen_t *p = (nk_samx_prescreen_t *)state;
    uint64_t groups = q->screen_depth / 4, steps = (groups + 15) / 16;
    if (nk_dtype_is_integer((int)q->dtype) || q->vectors == 0 || (steps + 1) / 2 > NK_PRESCREEN_MAX_PAIRS) return 0;
    uint64_t rows = q->vectors < NK_SAMX_ROWS ? q->vectors : NK_SAMX_ROWS;
    p->pairs = (steps + 1) / 2;
    nk_driver_group_init(q, 0, rows, &p->group);
    for (unsigned r = 0; r < NK_SAMX_ROWS; ++r)
        p->bias[r] = r < rows && (p->group.live >> r & 1) ? (int32_t)(0u - (uint32_t)q->screen_sums[r] * 8u) : 0;
    /* The query's screen tiles as B tiles of 16 lanes (nk_samx_copy_doc_tile pads with byte 0x80), then
     * signed: 0x80 becomes 0. */
    __m512i flip = _mm512_set1_epi32((int)0x80808080u);
    for (uint64_t half = 0; 16 * half < rows; ++half) {
        uint8_t *lines = (uint8_t *)p->query_tiles[half];
        nk_samx_copy_doc_tile(q, half, 0, 32 * p->pairs, lines);
        for (uint64_t at = 0; at < 64 * 32 * p->pairs; at += 64) {
            __m512i line = _mm512_load_si512((void const *)(lines + at));
            _mm512_store_si512((void *)(lines + at), _mm512_xor_si512(line, flip));
        }
    }
    return 1;
}

double nk_prescreen_bound_sapphireamx(void const *state, uint8_t const *document, nk_prescreen_layout_t const *layout,
                                      nk_prefetch_stream_t prefetch) {
    nk_samx_prescreen_t const *p = (nk_samx_prescreen_t const *)state;
    _Alignas(64) uint8_t unpacked[2 * NK_SAMX_STEP_BYTES];
    _Alignas(64) int32_t sums[2][16][16]; /* [half][document row][query row] */
    _Alignas(64) float largest[NK_SAMX_ROWS];
    uint64_t rows = p->group.rows, pairs = p->pairs;
    int both = rows > 16;
    uint8_t const *codes = document + layout->codes_offset;
    float const *scales = (float const *)(void const *)(document + layout->scales_offset);
    float const *errors = (float const *)(void const *)(document + layout->errors_offset);
    __m512i nibble = _mm512_set1_epi8(0x0F);
    __m512i bias0 = _mm512_loadu_si512((void const *)p->bias), bias1 = _mm512_loadu_si512((void const *)(p->bias + 16));
    __m512 growth0 = _mm512_loadu_ps(p->group.growth), growth1 = both ? _mm512_loadu_ps(p->group.growth + 16) : growth0;
    __m512 top0 = _mm512_set1_ps(-INFINITY), top1 = top0;
    nk_samx_configure();
    for (uint64_t t = 0; t < layout->tiles; ++t) {
        _tile_zero(0);
        if (both) _tile_zero(1);
        for (uint64_t pair = 0; pair < pairs; ++pair) {
            uint8_t const *lines = codes + (t * pairs + pair) * NK_SAMX_STEP_BYTES;
            for (unsigned l = 0; l < 16; ++l) {
                __m512i x = _mm512_load_si512((void const *)(lines + 64 * l));
                _mm512_store_si512((void *)(unpacked + 64 * l), _mm512_and_si512(x, nibble));
                _mm512_store_si512((void *)(unpacked + NK_SAMX_STEP_BYTES + 64 * l),
                                   _mm512_and_si512(_mm512_srli_epi16(x, 4), nibble));
            }
            if (t == 0 || pairs > 1) { /* one pair: the query tiles stay for the whole document */
                _tile_loadd(4, p->query_tiles[0][2 * pair], 64);
                _tile_loadd(5, p->query_tiles[0][2 * pair + 1], 64);
                if (both) {
                    _tile_loadd(6, p->query_tiles[1][2 * pair], 64);
                    _tile_loadd(7, p->query_tiles[1][2 * pair + 1], 64);
                }
            }
            _tile_loadd(2, unpacked, 64);
            _tile_loadd(3, unpacked + NK_SAMX_STEP_BYTES, 64);
            _tile_dpbusd(0, 2, 4);
            _tile_dpbusd(0, 3, 5);
            if (both) {
                _tile_dpbusd(1, 2, 6);
                _tile_dpbusd(1, 3, 7);
            }
        }
        nk_prefetch_lines(&prefetch, 16 * pairs + 2); /* the next document's prescreen */
        _tile_stored(0, sums[0], 64);
        if (both) _tile_stored(1, sums[1], 64);
        for (unsigned r = 0; r < 16; ++r) { /* padding rows: scale 0, error -inf, so u = -inf */
            __m512 scale = _mm512_set1_ps(scales[16 * t + r]), error = _mm512_set1_ps(errors[16 * t + r]);
            __m512 sum0 = _mm512_cvtepi32_ps(_mm512_add_epi32(_mm512_load_si512((void const *)sums[0][r]), bias0));
            top0 = _mm512_max_ps(top0, _mm512_fmadd_ps(growth0, error, _mm512_mul_ps(sum0, scale)));
            if (both) {
                __m512 sum1 = _mm512_cvtepi32_ps(_mm512_add_epi32(_mm512_load_si512((void const *)sums[1][r]), bias1));
                top1 = _mm512_max_ps(top1, _mm512_fmadd_ps(growth1, error, _mm512_mul_ps(sum1, scale)));
            }
        }
    }
    _tile_release();
    _mm512_store_ps(largest, top0);
    _mm512_store_ps(largest + 16, top1);
    double bound = 0.0;
    for (unsigned r = 0; r < rows; ++r) bound += nk_driver_row_bound(&p->group, r, largest[r]);
    return bound;
}

/* Whether int4 goes through the tiles: more than one query tile and 64 documents or more (against
 * avx512_integer.h's VNNI kernel, 8x100x128 took 1.13x the time, 32x16x128 1.36x, 32x40x128 1.03x), and
 * a depth the pair form takes in one pass (64..768, padded). */
static int nk_samx_int4_fits(nk_maxsim_view_t const *q, nk_maxsim_view_t const *d) {
    nk_samx_depth_t depth = nk_samx_depth_of(q->screen_depth);
    return q->vectors > 16 && d->vectors >= 64 && !depth.tiny && depth.steps <= NK_SAMX_CHUNK_STEPS;
}

/* Whether int8 goes through the tiles: not for up to 8 query rows against fewer than 64 documents,
 * where the set-up costs more than the VNNI kernel's whole call (its time against the tiles': 1x1x1
 * 0.32, 4x8x64 0.56, 8x32x128 0.71, 8x63x128 0.96, 4x63x128 1.05; 16x16x128 1.19, 32x8x128 1.62). */
static int nk_samx_int8_fits(nk_maxsim_view_t const *q, nk_maxsim_view_t const *d) {
    return q->vectors > 8 || d->vectors >= 64;
}

double nk_maxsim_sapphireamx(nk_maxsim_view_t const *q, nk_maxsim_view_t const *d) {
    int integer = nk_dtype_is_integer((int)q->dtype);
    if (integer && !(q->dtype == nk_dtype_int8_k   ? nk_samx_int8_fits(q, d)
                     : q->dtype == nk_dtype_int4_k ? nk_samx_int4_fits(q, d)
                                                   : 0))
        return nk_integer_maxsim(q, d);
    nk_samx_configure();
    double total = integer ? nk_samx_integer(q, d) : nk_driver_maxsim(q, d);
    _tile_release();
    return total;
}
