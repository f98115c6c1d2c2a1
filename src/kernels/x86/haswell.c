/* Haswell family: AVX2 + FMA + F16C, 256-bit registers, no AVX-512.
 *
 * The family primitives of driver.h: an int8 GEMM screens a group of 8 query rows (two register
 * blocks of 4 rows x 16 documents) against blocks of up to 1024 documents, its epilogue turns the
 * sums into u (driver.h) and keeps each row's tagged largest u; the AVX2 scan collects candidates
 * 64 documents per branch; exact dot products are avx2_dot.h's, one call per pair.
 *
 * Stack: the group's prepared query bytes (16 KB) and tops (0.5 KB), and driver.h's: 32 KB of u,
 * 8 KB of candidate lists, 8 KB of decoded row; about 65 KB in all.
 */
#include <immintrin.h>
#include <math.h>

#include "avx2_dot.h"
#include "maxsim_internal.h"

#define NK_HSW_ROWS 8              /* query rows per group: NK_HSW_BLOCKS register blocks */
#define NK_HSW_BLOCK_ROWS 4        /* query rows per register block (8 accumulators of 8 lanes) */
#define NK_HSW_BLOCKS (NK_HSW_ROWS / NK_HSW_BLOCK_ROWS)
#define NK_HSW_BLOCK_DOCS 1024u    /* document rows per block of bounds; larger blocks rescore less */
#define NK_HSW_CHUNK_GROUPS 256u   /* 4-byte depth groups prepared at once (depth 1024): the words
                                      * (16 KB) and a tile's bytes (16 KB) fit a Haswell L1 */
#define NK_HSW_WORDS 8u            /* prepared int32 words per register block and depth group */
/* driver.h's group of query rows and block of documents */
#define NK_DRIVER_ROWS NK_HSW_ROWS
#define NK_DRIVER_BLOCK NK_HSW_BLOCK_DOCS

/* ---- Screening. ----
 * Without VNNI, u8 x s8 products go through vpmaddubsw, which saturates int16 for biased bytes
 * (255 * 127 * 2), so the sign is moved onto the document operand instead: |q| (unsigned, <= 127)
 * x sign(d, q) (signed, |.| <= 127) never exceeds 2 * 127 * 127. The query group is prepared once
 * per depth chunk as [register block][depth group][4 signed words, 4 absolute words]; each step
 * is two document loads per 16-document tile and two broadcasts per query row. The epilogue stores
 * u = p + b e (driver.h) and keeps, per lane, the largest u tagged with its tile (nk_hsw_tag). */

/* A query group's screening state. */
typedef struct nk_hsw_group {
    _Alignas(32) float top[NK_HSW_ROWS][16]; /* per lane, the block's largest u, tagged */
    float growth[NK_HSW_ROWS];               /* b = (1 + e_q) / s_q, from the driver */
    _Alignas(32) int32_t words[NK_HSW_BLOCKS][NK_HSW_CHUNK_GROUPS * NK_HSW_WORDS];
    nk_maxsim_view_t const *q;
    uint64_t first, rows;
    unsigned live_blocks; /* register blocks with a nonzero row (bit s) */
    int words_ready;      /* the whole depth is in `words` (one chunk) */
} nk_hsw_group_t;
#define nk_family_query_t nk_hsw_group_t

/* Tagged bounds: the low 6 mantissa bits of u replaced by its 16-document tile within the block
 * (up to 64 tiles), so a per-lane maximum names a document whose u is within 2^-17 (relative) of
 * the largest. An absent lane (-inf) tags to NaN, which nk_hsw_raise_top drops. */
#define NK_HSW_TAG_BITS 0x3F
_Static_assert(NK_HSW_BLOCK_DOCS / NK_SCREEN_TILE <= NK_HSW_TAG_BITS + 1, "tile tags must fit");

NK_INLINE __m256 nk_hsw_tag(__m256 u, __m256i tile) {
    __m256i bits = _mm256_andnot_si256(_mm256_set1_epi32(NK_HSW_TAG_BITS), _mm256_castps_si256(u));
    return _mm256_castsi256_ps(_mm256_or_si256(bits, tile));
}

/* max(tagged, top): vmaxps returns its second operand when either is NaN, so NaN tags never enter. */
NK_INLINE void nk_hsw_raise_top(float *top, __m256 u, __m256i tile) {
    _mm256_store_ps(top, _mm256_max_ps(nk_hsw_tag(u, tile), _mm256_load_ps(top)));
}

/* Tile shapes: all 16 rows, 9..15 rows (second half masked), 1..8 rows (first half only). */
enum { nk_hsw_tile_full_k, nk_hsw_tile_upper_k, nk_hsw_tile_lower_k };

/* One register block: `rows` (1..4) prepared query rows x one tile of `n` document rows, over
 * `groups` depth groups starting at `tile` (already offset to the first group). Partial int32 sums
 * live in u[r * NK_HSW_BLOCK_DOCS + 0..15] between depth chunks (`accumulate`; only vector loads and
 * stores touch them); on the last chunk (`finish`) the epilogue writes u (-inf for lanes >= n) and
 * raises top[r]. `rows` and `shape` are compile-time constants at every call site. */
NK_INLINE void nk_hsw_screen_tile(int rows, int shape, int32_t const *words, uint8_t const *tile, uint64_t n,
                                  uint64_t groups, float *u, int accumulate, int finish, float const *scales_d,
                                  float const *errors_d, float const *growth, float *top, unsigned tile_index) {
    __m256i const bias = _mm256_set1_epi8((char)0x80), ones = _mm256_set1_epi16(1);
    __m256i acc[NK_HSW_BLOCK_ROWS][2];
#pragma GCC unroll 4
    for (int r = 0; r < rows; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_si256();
    uint64_t stride = shape == nk_hsw_tile_full_k ? 64 : 4 * n; /* bytes per depth group inside the tile */
    /* Rows 0..7 are the first 32 bytes of a group, rows 8..n-1 follow: mask what is not there. */
    __m256i const mask = nk_lanes32(shape == nk_hsw_tile_upper_k ? n - 8 : n);
#pragma GCC unroll 2
    for (uint64_t g = 0; g < groups; ++g, tile += stride, words += NK_HSW_WORDS) {
        __m256i d0, d1 = _mm256_setzero_si256();
        if (shape == nk_hsw_tile_lower_k) d0 = _mm256_maskload_epi32((int const *)tile, mask);
        else d0 = _mm256_loadu_si256((__m256i const *)tile);
        if (shape == nk_hsw_tile_full_k) d1 = _mm256_loadu_si256((__m256i const *)(tile + 32));
        if (shape == nk_hsw_tile_upper_k) d1 = _mm256_maskload_epi32((int const *)(tile + 32), mask);
        d0 = _mm256_xor_si256(d0, bias);
        d1 = _mm256_xor_si256(d1, bias);
#pragma GCC unroll 4
        for (int r = 0; r < rows; ++r) {
            __m256i q_signed = _mm256_set1_epi32(words[r]), q_abs = _mm256_set1_epi32(words[4 + r]);
            acc[r][0] = _mm256_add_epi32(
                acc[r][0], _mm256_madd_epi16(_mm256_maddubs_epi16(q_abs, _mm256_sign_epi8(d0, q_signed)), ones));
            if (shape != nk_hsw_tile_lower_k)
                acc[r][1] = _mm256_add_epi32(
                    acc[r][1], _mm256_madd_epi16(_mm256_maddubs_epi16(q_abs, _mm256_sign_epi8(d1, q_signed)), ones));
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < rows; ++r) {
        float *target = u + (size_t)r * NK_HSW_BLOCK_DOCS;
        if (accumulate) {
            acc[r][0] = _mm256_add_epi32(acc[r][0], _mm256_load_si256((__m256i const *)target));
            acc[r][1] = _mm256_add_epi32(acc[r][1], _mm256_load_si256((__m256i const *)(target + 8)));
        }
        if (!finish) {
            _mm256_store_si256((__m256i *)target, acc[r][0]);
            _mm256_store_si256((__m256i *)(target + 8), acc[r][1]);
        }
    }
    if (!finish) return;
    /* Per-document bound inputs, masked like the screening bytes (absent lanes load 0). */
    __m256 scale0, scale1 = _mm256_setzero_ps(), error0, error1 = _mm256_setzero_ps();
    if (shape == nk_hsw_tile_lower_k)
        scale0 = _mm256_maskload_ps(scales_d, mask), error0 = _mm256_maskload_ps(errors_d, mask);
    else {
        scale0 = _mm256_loadu_ps(scales_d), error0 = _mm256_loadu_ps(errors_d);
        if (shape == nk_hsw_tile_full_k)
            scale1 = _mm256_loadu_ps(scales_d + 8), error1 = _mm256_loadu_ps(errors_d + 8);
        else
            scale1 = _mm256_maskload_ps(scales_d + 8, mask), error1 = _mm256_maskload_ps(errors_d + 8, mask);
    }
    __m256 const minus_infinity = _mm256_set1_ps(-INFINITY), valid = _mm256_castsi256_ps(mask);
    __m256i const tag = _mm256_set1_epi32((int)tile_index);
#pragma GCC unroll 4
    for (int r = 0; r < rows; ++r) {
        float *target = u + (size_t)r * NK_HSW_BLOCK_DOCS;
        __m256 b = _mm256_set1_ps(growth[r]);
        __m256 u0 = _mm256_fmadd_ps(b, error0, _mm256_mul_ps(_mm256_cvtepi32_ps(acc[r][0]), scale0));
        __m256 u1 = minus_infinity;
        if (shape == nk_hsw_tile_lower_k) u0 = _mm256_blendv_ps(minus_infinity, u0, valid);
        else {
            u1 = _mm256_fmadd_ps(b, error1, _mm256_mul_ps(_mm256_cvtepi32_ps(acc[r][1]), scale1));
            if (shape == nk_hsw_tile_upper_k) u1 = _mm256_blendv_ps(minus_infinity, u1, valid);
        }
        _mm256_store_ps(target, u0);
        _mm256_store_ps(target + 8, u1);
        nk_hsw_raise_top(top + 16 * r, u0, tag);
        if (shape != nk_hsw_tile_lower_k) nk_hsw_raise_top(top + 16 * r + 8, u1, tag);
    }
}

/* nk_hsw_screen_tile for a register block of 1-4 rows and a tile shape known only at run time: the
 * last tile of the matrix or the group's last, short register block. */
static NK_NOINLINE void nk_hsw_screen_tile_any(int rows, int32_t const *words, uint8_t const *tile, uint64_t n,
                                               uint64_t groups, float *u, int accumulate, int finish,
                                               float const *scales_d, float const *errors_d, float const *growth,
                                               float *top, unsigned tile_index) {
#define NK_HSW_TILE(height, shape)                                                                                   \
    nk_hsw_screen_tile(height, shape, words, tile, n, groups, u, accumulate, finish, scales_d, errors_d, growth, top, \
                       tile_index)
#define NK_HSW_SHAPES(height)                                                                                        \
    if (n == NK_SCREEN_TILE) NK_HSW_TILE(height, nk_hsw_tile_full_k);                                                  \
    else if (n > 8) NK_HSW_TILE(height, nk_hsw_tile_upper_k);                                                          \
    else NK_HSW_TILE(height, nk_hsw_tile_lower_k);                                                                     \
    break
    switch (rows) {
    case 1: NK_HSW_SHAPES(1);
    case 2: NK_HSW_SHAPES(2);
    case 3: NK_HSW_SHAPES(3);
    default: NK_HSW_SHAPES(4);
    }
#undef NK_HSW_SHAPES
#undef NK_HSW_TILE
}

/* Prepared words of query rows [row0, row0 + 4) for depth groups [g0, g0 + groups): per group,
 * the 4 rows' signed bytes, then their absolute values, 4 depths per word. Rows past the matrix
 * are zeros. The 4 rows are adjacent lanes of one query tile (row0 is a multiple of 4). */
static void nk_hsw_prepare_words(nk_maxsim_view_t const *q, uint64_t row0, uint64_t g0, uint64_t groups,
                                 int32_t *out) {
    uint64_t tile = row0 / NK_SCREEN_TILE, lane = row0 % NK_SCREEN_TILE;
    uint64_t rows_in_tile = nk_min_u64(NK_SCREEN_TILE, q->vectors - tile * NK_SCREEN_TILE);
    uint64_t present = nk_min_u64(NK_HSW_BLOCK_ROWS, q->vectors - row0);
    uint8_t const *source = q->screen + tile * NK_SCREEN_TILE * q->screen_depth + 4 * lane + g0 * 4 * rows_in_tile;
    __m128i const bias = _mm_set1_epi8((char)0x80);
    for (uint64_t g = 0; g < groups; ++g, source += 4 * rows_in_tile, out += NK_HSW_WORDS) {
        __m128i biased;
        if (present == NK_HSW_BLOCK_ROWS) biased = _mm_loadu_si128((__m128i const *)source);
        else {
            uint8_t padded[16];
            memset(padded, 0x80, sizeof(padded)); /* biased zero */
            memcpy(padded, source, 4 * present);
            biased = _mm_loadu_si128((__m128i const *)padded);
        }
        __m128i value = _mm_xor_si128(biased, bias);
        _mm_store_si128((__m128i *)out, value);
        _mm_store_si128((__m128i *)(out + 4), _mm_abs_epi8(value));
    }
}

static void nk_hsw_prepare_chunk(nk_hsw_group_t *group, uint64_t g0, uint64_t groups) {
    for (unsigned s = 0; s < NK_HSW_BLOCKS; ++s)
        if (group->live_blocks >> s & 1)
            nk_hsw_prepare_words(group->q, group->first + NK_HSW_BLOCK_ROWS * s, g0, groups, group->words[s]);
}

static inline float nk_hsw_hmax_ps(__m256 v) {
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ps(m, _mm_shuffle_ps(m, m, 1));
    return _mm_cvtss_f32(m);
}

/* The document (16 tile + lane) named by a row's 16 tagged per-lane maxima, or -1 when there is
 * none (no finite u) or the tag names no document of the block. */
static inline int32_t nk_hsw_tagged_top(float const *top, uint64_t docs) {
    __m256 low = _mm256_load_ps(top), high = _mm256_load_ps(top + 8);
    float largest = nk_hsw_hmax_ps(_mm256_max_ps(low, high));
    if (!(largest > -INFINITY)) return -1;
    __m256 at_largest = _mm256_set1_ps(largest);
    unsigned at = (unsigned)_mm256_movemask_ps(_mm256_cmp_ps(low, at_largest, _CMP_EQ_OQ)) |
                  (unsigned)_mm256_movemask_ps(_mm256_cmp_ps(high, at_largest, _CMP_EQ_OQ)) << 8;
    int32_t bits;
    memcpy(&bits, &largest, sizeof bits);
    uint64_t doc = NK_SCREEN_TILE * (uint64_t)(bits & NK_HSW_TAG_BITS) + nk_ctz32(at); /* at != 0 */
    return doc < docs ? (int32_t)doc : -1;
}

/* ---- The driver's primitives. ---- */

static void nk_hsw_prepare(nk_maxsim_view_t const *q, nk_maxsim_view_t const *d, uint64_t first, uint64_t rows,
                           nk_hsw_group_t *group) {
    group->q = q, group->first = first, group->rows = rows, group->live_blocks = 0;
    for (uint64_t r = 0; r < rows; ++r)
        if (q->inv_norms[first + r] != 0.0) group->live_blocks |= 1u << (r / NK_HSW_BLOCK_ROWS);
    /* With one depth chunk the prepared group serves every document block. */
    group->words_ready = d->screen_depth / 4 <= NK_HSW_CHUNK_GROUPS;
    if (group->words_ready) nk_hsw_prepare_chunk(group, 0, d->screen_depth / 4);
}
#define nk_family_prepare nk_hsw_prepare

/* Documents [first_doc, first_doc + docs) against the group, tile by tile so that a tile's bytes
 * stay in L1 for both register blocks. A register block without a nonzero row is skipped: the
 * driver never reads its u. */
static void nk_hsw_screen(nk_hsw_group_t *group, float const *growth, uint64_t rows, nk_maxsim_view_t const *d,
                          uint64_t first_doc, uint64_t docs, float *u, int32_t *top, nk_prefetch_stream_t *prefetch) {
    for (unsigned r = 0; r < NK_HSW_ROWS; ++r) {
        group->growth[r] = r < rows ? growth[r] : 0.0f;
        _mm256_store_ps(group->top[r], _mm256_set1_ps(-INFINITY));
        _mm256_store_ps(group->top[r] + 8, _mm256_set1_ps(-INFINITY));
    }
    uint64_t total_groups = d->screen_depth / 4, tiles = (docs + NK_SCREEN_TILE - 1) / NK_SCREEN_TILE;
    for (uint64_t g0 = 0; g0 < total_groups; g0 += NK_HSW_CHUNK_GROUPS) {
        uint64_t groups = nk_min_u64(total_groups - g0, NK_HSW_CHUNK_GROUPS);
        int accumulate = g0 != 0, finish = g0 + groups == total_groups;
        if (!group->words_ready) nk_hsw_prepare_chunk(group, g0, groups);
        for (uint64_t t = 0; t < tiles; ++t) {
            uint64_t first_row = first_doc + t * NK_SCREEN_TILE;
            uint64_t n = nk_min_u64(NK_SCREEN_TILE, d->vectors - first_row);
            uint8_t const *start = d->screen + first_row * d->screen_depth + g0 * 4 * n;
            float const *scales = d->screen_scales + first_row, *errors = d->screen_errors + first_row;
            nk_prefetch_lines(prefetch, groups); /* the next document: a line per depth group screened */
            for (unsigned s = 0; s < NK_HSW_BLOCKS; ++s) {
                if (!(group->live_blocks >> s & 1)) continue;
                unsigned row0 = NK_HSW_BLOCK_ROWS * s;
                int height = (int)nk_min_u64(NK_HSW_BLOCK_ROWS, rows - row0);
                float *target = u + (uint64_t)row0 * NK_HSW_BLOCK_DOCS + t * NK_SCREEN_TILE;
                if (height == NK_HSW_BLOCK_ROWS && n == NK_SCREEN_TILE)
                    nk_hsw_screen_tile(NK_HSW_BLOCK_ROWS, nk_hsw_tile_full_k, group->words[s], start, n, groups, target,
                                       accumulate, finish, scales, errors, group->growth + row0, group->top[row0],
                                       (unsigned)t);
                else
                    nk_hsw_screen_tile_any(height, group->words[s], start, n, groups, target, accumulate, finish,
                                           scales, errors, group->growth + row0, group->top[row0], (unsigned)t);
            }
        }
    }
    for (unsigned r = 0; r < rows; ++r)
        top[r] = group->live_blocks >> (r / NK_HSW_BLOCK_ROWS) & 1 ? nk_hsw_tagged_top(group->top[r], docs) : -1;
}
#define nk_family_screen nk_hsw_screen

/* driver.h's compares: 8 floats per vector, one movemask bit per document. */
NK_INLINE int nk_hsw_any_hit4(float const *tile_u, __m256 cut) {
    __m256 any = _mm256_setzero_ps();
#pragma GCC unroll 8
    for (int v = 0; v < 8; ++v) any = _mm256_or_ps(any, _mm256_cmp_ps(_mm256_load_ps(tile_u + 8 * v), cut, _CMP_GE_OQ));
    return !_mm256_testz_ps(any, any);
}

NK_INLINE uint64_t nk_hsw_hit_bits(float const *tile_u, __m256 cut) {
    __m256 low = _mm256_cmp_ps(_mm256_load_ps(tile_u), cut, _CMP_GE_OQ);
    __m256 high = _mm256_cmp_ps(_mm256_load_ps(tile_u + 8), cut, _CMP_GE_OQ);
    return (uint64_t)((unsigned)_mm256_movemask_ps(low) | (unsigned)_mm256_movemask_ps(high) << 8);
}
#define nk_family_cut_t __m256
#define nk_family_cut _mm256_set1_ps
#define nk_family_any_hit4 nk_hsw_any_hit4
#define nk_family_hit_bits nk_hsw_hit_bits
#define NK_FAMILY_BITS_PER_DOC 1

/* driver.h's batch of exact dot products: avx2_dot.h's function for the dtype, pair by pair. */
static void nk_hsw_dot_batch(int dtype, void const *const *a, void const *const *b, unsigned n, uint64_t depth,
                             double *out) {
    nk_dot_fn dot = nk_dot_for((uint32_t)dtype);
    for (unsigned k = 0; k < n; ++k) out[k] = dot ? dot(a[k], b[k], depth) : 0.0; /* the dispatcher checks dtype */
}
#define nk_family_dot_batch nk_hsw_dot_batch

#include "driver.h"

#include "integer_maxsim.h"

NK_FAMILY_KERNEL(nk_maxsim_haswell)
