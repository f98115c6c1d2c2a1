/* MaxSim kernel for AVX2 + FMA + F16C (Haswell class), 256-bit ymm registers, no AVX-512.
 *
 * Plan (see maxsim_internal.h for the packed layout and the screening bound):
 *   1. Screening: exact int32 dot products of the int8 screening copies, computed GEMM-style on the
 *      tiled `screen` section: 4 query rows x 16 document rows per register block, one 4-depth step
 *      per iteration. Without VNNI, u8 x s8 products go through vpmaddubsw, which saturates int16
 *      for biased bytes (255 * 127 * 2), so the sign is moved onto the document operand instead:
 *      |q| (unsigned, <= 127) x sign(d, q) (signed, |.| <= 127) never exceeds 2 * 127 * 127.
 *   2. Certified bound per pair: estimate +- (e_q + slack + (1 + e_q) e_d); every document whose
 *      upper bound reaches the best lower bound (or the best exact cosine so far) is a candidate.
 *   3. Candidates are rescored exactly with a float64 dot product of the decoded stored values.
 * Documents are processed in blocks so all scratch lives in fixed stack buffers (no allocation).
 */
#include <immintrin.h>
#include <math.h>

#include "maxsim_internal.h"

/* Document rows per block: a multiple of 16 (whole screening tiles). */
#define NK_HASWELL_BLOCK 256u
/* Prepared query screening bytes (signed + absolute copies), in int32 units: 32 KB. */
#define NK_HASWELL_QBUF_INTS 8192u
/* Query rows whose prepared bytes are kept while the document blocks stream past. */
#define NK_HASWELL_SUPER_ROWS 64u
/* Query rows per register block. */
#define NK_HASWELL_GROUP 4u

#define NK_INLINE static inline __attribute__((always_inline))

static inline uint64_t nk_min_u64(uint64_t a, uint64_t b) { return a < b ? a : b; }

/* ---- Exact float64 dot products of stored rows, one function per dtype. ---- */

typedef double (*nk_dot_fn)(void const *a, void const *b, uint64_t n);

static inline double nk_hsum_pd(__m256d v) {
    __m128d sum = _mm_add_pd(_mm256_castpd256_pd128(v), _mm256_extractf128_pd(v, 1));
    return _mm_cvtsd_f64(_mm_add_sd(sum, _mm_unpackhi_pd(sum, sum)));
}

/* Lanes [0, count) set, for maskload tails. */
static inline __m256i nk_lanes32(uint64_t count) {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32((int)count), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}
static inline __m256i nk_lanes64(uint64_t count) {
    return _mm256_cmpgt_epi64(_mm256_set1_epi64x((long long)count), _mm256_setr_epi64x(0, 1, 2, 3));
}

static double nk_dot_f64(void const *a, void const *b, uint64_t n) {
    double const *x = (double const *)a, *y = (double const *)b;
    __m256d s0 = _mm256_setzero_pd(), s1 = _mm256_setzero_pd();
    uint64_t k = 0;
    for (; k + 8 <= n; k += 8) {
        s0 = _mm256_fmadd_pd(_mm256_loadu_pd(x + k), _mm256_loadu_pd(y + k), s0);
        s1 = _mm256_fmadd_pd(_mm256_loadu_pd(x + k + 4), _mm256_loadu_pd(y + k + 4), s1);
    }
    for (; k + 4 <= n; k += 4) s0 = _mm256_fmadd_pd(_mm256_loadu_pd(x + k), _mm256_loadu_pd(y + k), s0);
    if (k < n) {
        __m256i mask = nk_lanes64(n - k);
        s1 = _mm256_fmadd_pd(_mm256_maskload_pd(x + k, mask), _mm256_maskload_pd(y + k, mask), s1);
    }
    return nk_hsum_pd(_mm256_add_pd(s0, s1));
}

/* float32 x float32 is exact in float64, so widen first and FMA in float64. */
NK_INLINE void nk_fma_ps_as_pd(__m256 a, __m256 b, __m256d *s0, __m256d *s1) {
    *s0 = _mm256_fmadd_pd(_mm256_cvtps_pd(_mm256_castps256_ps128(a)), _mm256_cvtps_pd(_mm256_castps256_ps128(b)), *s0);
    *s1 = _mm256_fmadd_pd(_mm256_cvtps_pd(_mm256_extractf128_ps(a, 1)), _mm256_cvtps_pd(_mm256_extractf128_ps(b, 1)),
                          *s1);
}

/* A float32 product that is exact (few significant bits, no under/overflow): add it in float64. */
NK_INLINE void nk_add_ps_as_pd(__m256 p, __m256d *s0, __m256d *s1) {
    *s0 = _mm256_add_pd(*s0, _mm256_cvtps_pd(_mm256_castps256_ps128(p)));
    *s1 = _mm256_add_pd(*s1, _mm256_cvtps_pd(_mm256_extractf128_ps(p, 1)));
}

static double nk_dot_f32(void const *a, void const *b, uint64_t n) {
    float const *x = (float const *)a, *y = (float const *)b;
    __m256d s0 = _mm256_setzero_pd(), s1 = _mm256_setzero_pd(), s2 = _mm256_setzero_pd(), s3 = _mm256_setzero_pd();
    uint64_t k = 0;
    for (; k + 16 <= n; k += 16) {
        nk_fma_ps_as_pd(_mm256_loadu_ps(x + k), _mm256_loadu_ps(y + k), &s0, &s1);
        nk_fma_ps_as_pd(_mm256_loadu_ps(x + k + 8), _mm256_loadu_ps(y + k + 8), &s2, &s3);
    }
    for (; k + 8 <= n; k += 8) nk_fma_ps_as_pd(_mm256_loadu_ps(x + k), _mm256_loadu_ps(y + k), &s0, &s1);
    if (k < n) {
        __m256i mask = nk_lanes32(n - k);
        nk_fma_ps_as_pd(_mm256_maskload_ps(x + k, mask), _mm256_maskload_ps(y + k, mask), &s2, &s3);
    }
    return nk_hsum_pd(_mm256_add_pd(_mm256_add_pd(s0, s1), _mm256_add_pd(s2, s3)));
}

/* half x half has at most 22 significant bits and stays in float32's normal range: exact. */
static double nk_dot_f16(void const *a, void const *b, uint64_t n) {
    uint16_t const *x = (uint16_t const *)a, *y = (uint16_t const *)b;
    __m256d s0 = _mm256_setzero_pd(), s1 = _mm256_setzero_pd(), s2 = _mm256_setzero_pd(), s3 = _mm256_setzero_pd();
    uint64_t k = 0;
    for (; k + 16 <= n; k += 16) {
        __m256 p0 = _mm256_mul_ps(_mm256_cvtph_ps(_mm_loadu_si128((__m128i const *)(x + k))),
                                  _mm256_cvtph_ps(_mm_loadu_si128((__m128i const *)(y + k))));
        __m256 p1 = _mm256_mul_ps(_mm256_cvtph_ps(_mm_loadu_si128((__m128i const *)(x + k + 8))),
                                  _mm256_cvtph_ps(_mm_loadu_si128((__m128i const *)(y + k + 8))));
        nk_add_ps_as_pd(p0, &s0, &s1);
        nk_add_ps_as_pd(p1, &s2, &s3);
    }
    for (; k < n; k += 8) {
        uint16_t xt[8] = {0}, yt[8] = {0}; /* zero-padded tail: never reads past the row */
        uint64_t count = nk_min_u64(8, n - k);
        memcpy(xt, x + k, count * 2), memcpy(yt, y + k, count * 2);
        nk_add_ps_as_pd(_mm256_mul_ps(_mm256_cvtph_ps(_mm_loadu_si128((__m128i const *)xt)),
                                      _mm256_cvtph_ps(_mm_loadu_si128((__m128i const *)yt))),
                        &s0, &s1);
    }
    return nk_hsum_pd(_mm256_add_pd(_mm256_add_pd(s0, s1), _mm256_add_pd(s2, s3)));
}

/* bfloat16 spans float32's range, so products may under/overflow in float32: multiply in float64. */
NK_INLINE __m256 nk_bf16_to_ps(__m128i bits) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(bits), 16));
}

static double nk_dot_bf16(void const *a, void const *b, uint64_t n) {
    uint16_t const *x = (uint16_t const *)a, *y = (uint16_t const *)b;
    __m256d s0 = _mm256_setzero_pd(), s1 = _mm256_setzero_pd(), s2 = _mm256_setzero_pd(), s3 = _mm256_setzero_pd();
    uint64_t k = 0;
    for (; k + 16 <= n; k += 16) {
        nk_fma_ps_as_pd(nk_bf16_to_ps(_mm_loadu_si128((__m128i const *)(x + k))),
                        nk_bf16_to_ps(_mm_loadu_si128((__m128i const *)(y + k))), &s0, &s1);
        nk_fma_ps_as_pd(nk_bf16_to_ps(_mm_loadu_si128((__m128i const *)(x + k + 8))),
                        nk_bf16_to_ps(_mm_loadu_si128((__m128i const *)(y + k + 8))), &s2, &s3);
    }
    for (; k < n; k += 8) {
        uint16_t xt[8] = {0}, yt[8] = {0};
        uint64_t count = nk_min_u64(8, n - k);
        memcpy(xt, x + k, count * 2), memcpy(yt, y + k, count * 2);
        nk_fma_ps_as_pd(nk_bf16_to_ps(_mm_loadu_si128((__m128i const *)xt)),
                        nk_bf16_to_ps(_mm_loadu_si128((__m128i const *)yt)), &s0, &s1);
    }
    return nk_hsum_pd(_mm256_add_pd(_mm256_add_pd(s0, s1), _mm256_add_pd(s2, s3)));
}

/* 8 bytes of a 1-byte format -> 8 IEEE half bit patterns (the value divided by the format's
 * power-of-two half scale), as documented in maxsim_internal.h. */
NK_INLINE __m128i nk_bytes_to_half_bits(__m128i bytes8, int dtype) {
    __m128i b = _mm_cvtepu8_epi16(bytes8);
    switch (dtype) {
    case nk_dtype_e4m3_k:
        return _mm_or_si128(_mm_slli_epi16(_mm_and_si128(b, _mm_set1_epi16(0x80)), 8),
                            _mm_slli_epi16(_mm_and_si128(b, _mm_set1_epi16(0x7F)), 7));
    case nk_dtype_e5m2_k: return _mm_slli_epi16(b, 8);
    case nk_dtype_e2m3_k:
        return _mm_or_si128(_mm_slli_epi16(_mm_and_si128(b, _mm_set1_epi16(0x20)), 10),
                            _mm_slli_epi16(_mm_and_si128(b, _mm_set1_epi16(0x1F)), 7));
    default: /* e3m2 */
        return _mm_or_si128(_mm_slli_epi16(_mm_and_si128(b, _mm_set1_epi16(0x20)), 10),
                            _mm_slli_epi16(_mm_and_si128(b, _mm_set1_epi16(0x1F)), 8));
    }
}

NK_INLINE __m256 nk_bytes_product(uint8_t const *x, uint8_t const *y, int dtype) {
    __m256 fx = _mm256_cvtph_ps(nk_bytes_to_half_bits(_mm_loadl_epi64((__m128i const *)x), dtype));
    __m256 fy = _mm256_cvtph_ps(nk_bytes_to_half_bits(_mm_loadl_epi64((__m128i const *)y), dtype));
    return _mm256_mul_ps(fx, fy); /* <= 8 significant bits each, normal range: exact */
}

/* Dot product in half units; the caller multiplies by the (power of two) scale squared. */
NK_INLINE double nk_dot_bytes(void const *a, void const *b, uint64_t n, int dtype) {
    uint8_t const *x = (uint8_t const *)a, *y = (uint8_t const *)b;
    __m256d s0 = _mm256_setzero_pd(), s1 = _mm256_setzero_pd(), s2 = _mm256_setzero_pd(), s3 = _mm256_setzero_pd();
    uint64_t k = 0;
    for (; k + 16 <= n; k += 16) {
        nk_add_ps_as_pd(nk_bytes_product(x + k, y + k, dtype), &s0, &s1);
        nk_add_ps_as_pd(nk_bytes_product(x + k + 8, y + k + 8, dtype), &s2, &s3);
    }
    for (; k < n; k += 8) {
        uint8_t xt[8] = {0}, yt[8] = {0}; /* byte 0 decodes to +0 in every format */
        uint64_t count = nk_min_u64(8, n - k);
        memcpy(xt, x + k, count), memcpy(yt, y + k, count);
        nk_add_ps_as_pd(nk_bytes_product(xt, yt, dtype), &s0, &s1);
    }
    return nk_hsum_pd(_mm256_add_pd(_mm256_add_pd(s0, s1), _mm256_add_pd(s2, s3)));
}

#define NK_SCALE2(s) ((double)(s) * (double)(s))
static double nk_dot_e4m3(void const *a, void const *b, uint64_t n) {
    return nk_dot_bytes(a, b, n, nk_dtype_e4m3_k) * NK_SCALE2(nk_e4m3_half_scale_k);
}
static double nk_dot_e5m2(void const *a, void const *b, uint64_t n) {
    return nk_dot_bytes(a, b, n, nk_dtype_e5m2_k) * NK_SCALE2(nk_e5m2_half_scale_k);
}
static double nk_dot_e2m3(void const *a, void const *b, uint64_t n) {
    return nk_dot_bytes(a, b, n, nk_dtype_e2m3_k) * NK_SCALE2(nk_e2m3_half_scale_k);
}
static double nk_dot_e3m2(void const *a, void const *b, uint64_t n) {
    return nk_dot_bytes(a, b, n, nk_dtype_e3m2_k) * NK_SCALE2(nk_e3m2_half_scale_k);
}

static nk_dot_fn nk_dot_for(uint32_t dtype) {
    switch (dtype) {
    case nk_dtype_float64_k: return nk_dot_f64;
    case nk_dtype_float32_k: return nk_dot_f32;
    case nk_dtype_float16_k: return nk_dot_f16;
    case nk_dtype_bfloat16_k: return nk_dot_bf16;
    case nk_dtype_e4m3_k: return nk_dot_e4m3;
    case nk_dtype_e5m2_k: return nk_dot_e5m2;
    case nk_dtype_e2m3_k: return nk_dot_e2m3;
    case nk_dtype_e3m2_k: return nk_dot_e3m2;
    default: return NULL;
    }
}

/* ---- Screening: int8 dot products on the tiled screen section. ---- */

/* Copy the screening bytes of query rows [row0, row0 + 4) for depth groups [g0, g1) (group = 4
 * depths) into out[(g - g0) * 8 + 0..7]: lanes 0..3 the signed values of the 4 rows, lanes 4..7
 * their absolute values, each lane 4 bytes (4 depths). Missing rows become zeros. */
static void nk_prepare_queries(nk_maxsim_view_t const *q, uint64_t row0, uint64_t g0, uint64_t g1, int32_t *out) {
    uint64_t tile = row0 / NK_SCREEN_TILE, lane = row0 % NK_SCREEN_TILE;
    uint64_t rows_in_tile = nk_min_u64(NK_SCREEN_TILE, q->vectors - tile * NK_SCREEN_TILE);
    uint64_t present = nk_min_u64(NK_HASWELL_GROUP, q->vectors - row0);
    uint8_t const *base = q->screen + tile * NK_SCREEN_TILE * q->screen_depth + 4 * lane;
    __m128i const bias = _mm_set1_epi8((char)0x80);
    for (uint64_t g = g0; g < g1; ++g) {
        uint8_t const *source = base + g * 4 * rows_in_tile; /* the 4 rows are adjacent lanes of one tile */
        __m128i biased;
        if (present == NK_HASWELL_GROUP) biased = _mm_loadu_si128((__m128i const *)source);
        else {
            uint8_t padded[16];
            memset(padded, 0x80, sizeof(padded)); /* biased zero */
            memcpy(padded, source, 4 * present);
            biased = _mm_loadu_si128((__m128i const *)padded);
        }
        __m128i value = _mm_xor_si128(biased, bias);
        _mm_storeu_si128((__m128i *)(out + (g - g0) * 8), value);
        _mm_storeu_si128((__m128i *)(out + (g - g0) * 8 + 4), _mm_abs_epi8(value));
    }
}

/* One register block: `rows` (1..4) prepared query rows x one tile of `n` document rows, over
 * `groups` depth groups starting at `tile` (already offset to the first group). Writes (or adds)
 * 16 int32 dot products per query row at out[r * NK_HASWELL_BLOCK + 0..15]; lanes >= n are junk.
 * `full` (n == 16) is a compile-time constant at every call site so both variants stay lean. */
NK_INLINE void nk_screen_tile(int rows, int full, int32_t const *prepared, uint8_t const *tile, uint64_t n,
                              uint64_t groups, int32_t *out, int accumulate) {
    __m256i const bias = _mm256_set1_epi8((char)0x80), ones = _mm256_set1_epi16(1);
    __m256i acc[NK_HASWELL_GROUP][2];
#pragma GCC unroll 4
    for (int r = 0; r < rows; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_si256();
    uint64_t stride = full ? 64 : 4 * n; /* bytes per depth group inside the tile */
    __m256i mask_low = _mm256_setzero_si256(), mask_high = _mm256_setzero_si256();
    if (!full) { /* rows 0..7 in the first 32 bytes, rows 8..n-1 after them */
        mask_low = nk_lanes32(n < 8 ? n : 8);
        mask_high = nk_lanes32(n > 8 ? n - 8 : 0);
    }
    for (uint64_t g = 0; g < groups; ++g, tile += stride, prepared += 8) {
        __m256i d0, d1;
        if (full) {
            d0 = _mm256_loadu_si256((__m256i const *)tile);
            d1 = _mm256_loadu_si256((__m256i const *)(tile + 32));
        }
        else {
            d0 = _mm256_maskload_epi32((int const *)tile, mask_low);
            d1 = _mm256_maskload_epi32((int const *)(tile + 32), mask_high);
        }
        d0 = _mm256_xor_si256(d0, bias);
        d1 = _mm256_xor_si256(d1, bias);
#pragma GCC unroll 4
        for (int r = 0; r < rows; ++r) {
            __m256i q_signed = _mm256_set1_epi32(prepared[r]), q_abs = _mm256_set1_epi32(prepared[4 + r]);
            __m256i p0 = _mm256_maddubs_epi16(q_abs, _mm256_sign_epi8(d0, q_signed));
            __m256i p1 = _mm256_maddubs_epi16(q_abs, _mm256_sign_epi8(d1, q_signed));
            acc[r][0] = _mm256_add_epi32(acc[r][0], _mm256_madd_epi16(p0, ones));
            acc[r][1] = _mm256_add_epi32(acc[r][1], _mm256_madd_epi16(p1, ones));
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < rows; ++r) {
        __m256i *target = (__m256i *)(out + r * NK_HASWELL_BLOCK);
        if (accumulate) {
            acc[r][0] = _mm256_add_epi32(acc[r][0], _mm256_loadu_si256(target));
            acc[r][1] = _mm256_add_epi32(acc[r][1], _mm256_loadu_si256(target + 1));
        }
        _mm256_storeu_si256(target, acc[r][0]);
        _mm256_storeu_si256(target + 1, acc[r][1]);
    }
}

/* Screen `rows` prepared query rows against document rows [j0, j0 + count) (j0 % 16 == 0) over
 * depth groups [g0, g0 + groups): out[r * NK_HASWELL_BLOCK + (j - j0)]. */
NK_INLINE void nk_screen_block_rows(int rows, int32_t const *prepared, nk_maxsim_view_t const *d, uint64_t j0,
                                    uint64_t count, uint64_t g0, uint64_t groups, int32_t *out, int accumulate) {
    uint64_t first_tile = j0 / NK_SCREEN_TILE, tiles = (count + NK_SCREEN_TILE - 1) / NK_SCREEN_TILE;
    for (uint64_t t = 0; t < tiles; ++t) {
        uint64_t tile = first_tile + t;
        uint64_t n = nk_min_u64(NK_SCREEN_TILE, d->vectors - tile * NK_SCREEN_TILE);
        uint8_t const *start = d->screen + tile * NK_SCREEN_TILE * d->screen_depth + g0 * 4 * n;
        if (n == NK_SCREEN_TILE) nk_screen_tile(rows, 1, prepared, start, n, groups, out + t * 16, accumulate);
        else nk_screen_tile(rows, 0, prepared, start, n, groups, out + t * 16, accumulate);
    }
}

static void nk_screen_block(int rows, int32_t const *prepared, nk_maxsim_view_t const *d, uint64_t j0, uint64_t count,
                            uint64_t g0, uint64_t groups, int32_t *out, int accumulate) {
    switch (rows) { /* one specialization per register-block height */
    case 1: nk_screen_block_rows(1, prepared, d, j0, count, g0, groups, out, accumulate); break;
    case 2: nk_screen_block_rows(2, prepared, d, j0, count, g0, groups, out, accumulate); break;
    case 3: nk_screen_block_rows(3, prepared, d, j0, count, g0, groups, out, accumulate); break;
    default: nk_screen_block_rows(4, prepared, d, j0, count, g0, groups, out, accumulate); break;
    }
}

/* ---- Bound, candidates, exact rescoring. ---- */

static inline float nk_hmax_ps(__m256 v) {
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ps(m, _mm_shuffle_ps(m, m, 1));
    return _mm_cvtss_f32(m);
}

/* Largest float not above x (x finite or -inf), so a threshold from an exact cosine never rounds up. */
static inline float nk_float_at_most(double x) {
    float f = (float)x;
    if ((double)f > x) {
        uint32_t bits;
        memcpy(&bits, &f, 4);
        if (f > 0.0f) bits -= 1;
        else if (f < 0.0f) bits += 1;
        else bits = 0x80000001u; /* -smallest subnormal */
        memcpy(&f, &bits, 4);
    }
    return f;
}

typedef struct nk_rescore {
    nk_maxsim_view_t const *q, *d;
    nk_dot_fn dot;
    size_t row_bytes;
} nk_rescore_t;

static inline double nk_exact_cos(nk_rescore_t const *ctx, uint64_t i, void const *q_row, uint64_t j) {
    double inv_d = ctx->d->inv_norms[j];
    if (inv_d == 0.0) return 0.0;
    double dot = ctx->dot(q_row, (char const *)ctx->d->values + j * ctx->row_bytes, ctx->q->depth);
    return dot * ctx->q->inv_norms[i] * inv_d;
}

/* Query row i against document rows [j0, j0 + count) whose screening dots are in `dots` (reused
 * as float scratch for the upper bounds): rescore every candidate and raise *best. */
static void nk_candidates(nk_rescore_t const *ctx, uint64_t i, int32_t *dots, uint64_t j0, uint64_t count,
                          double *best) {
    nk_maxsim_view_t const *q = ctx->q, *d = ctx->d;
    float error_q = q->screen_errors[i];
    __m256 const offset = _mm256_set1_ps(error_q + nk_screen_slack_k), factor = _mm256_set1_ps(1.0f + error_q);
    __m256 const scale_q = _mm256_set1_ps(q->screen_scales[i]), minus_inf = _mm256_set1_ps(-INFINITY);
    float const *scales_d = d->screen_scales + j0, *errors_d = d->screen_errors + j0;
    float *upper = (float *)dots; /* same slot, same width: bound j overwrites dot j */
    __m256 lower_max = minus_inf;
    for (uint64_t j = 0; j < count; j += 8) {
        __m256 scale_d, error_d;
        int tail = j + 8 > count;
        __m256i mask = _mm256_setzero_si256();
        if (!tail) {
            scale_d = _mm256_loadu_ps(scales_d + j);
            error_d = _mm256_loadu_ps(errors_d + j);
        }
        else { /* the last rows of the matrix: never read past the sections */
            mask = nk_lanes32(count - j);
            scale_d = _mm256_maskload_ps(scales_d + j, mask);
            error_d = _mm256_maskload_ps(errors_d + j, mask);
        }
        __m256 estimate = _mm256_mul_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_loadu_si256((__m256i const *)(dots + j))),
                                                      scale_q),
                                        scale_d);
        __m256 radius = _mm256_fmadd_ps(factor, error_d, offset);
        __m256 lower = _mm256_sub_ps(estimate, radius), high = _mm256_add_ps(estimate, radius);
        if (tail) { /* padded lanes can never be candidates */
            lower = _mm256_blendv_ps(minus_inf, lower, _mm256_castsi256_ps(mask));
            high = _mm256_blendv_ps(minus_inf, high, _mm256_castsi256_ps(mask));
        }
        lower_max = _mm256_max_ps(lower_max, lower);
        _mm256_storeu_ps(upper + j, high);
    }
    float threshold = nk_hmax_ps(lower_max), from_best = nk_float_at_most(*best);
    if (from_best > threshold) threshold = from_best;
    __m256 const threshold_v = _mm256_set1_ps(threshold);
    void const *q_row = (char const *)q->values + i * ctx->row_bytes;
    double best_cos = *best;
    for (uint64_t j = 0; j < count; j += 8) {
        unsigned bits = (unsigned)_mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(upper + j), threshold_v, _CMP_GE_OQ));
        while (bits) {
            uint64_t jj = j0 + j + (uint64_t)__builtin_ctz(bits);
            bits &= bits - 1;
            double cos = nk_exact_cos(ctx, i, q_row, jj);
            if (cos > best_cos) best_cos = cos;
        }
    }
    *best = best_cos;
}

/* Depth beyond the int32-safe screening range: every pair exactly. */
static double nk_maxsim_haswell_exact(nk_rescore_t const *ctx) {
    nk_maxsim_view_t const *q = ctx->q, *d = ctx->d;
    double total = 0.0;
    for (uint64_t i = 0; i < q->vectors; ++i) {
        if (q->inv_norms[i] == 0.0) {
            total += 1.0;
            continue;
        }
        void const *q_row = (char const *)q->values + i * ctx->row_bytes;
        double best = -2.0;
        for (uint64_t j = 0; j < d->vectors; ++j) {
            double cos = nk_exact_cos(ctx, i, q_row, j);
            if (cos > best) best = cos;
        }
        total += nk_distance_from_cos(best);
    }
    return total;
}

double nk_maxsim_haswell(nk_maxsim_view_t const *q, nk_maxsim_view_t const *d) {
    nk_rescore_t ctx = {q, d, nk_dot_for(q->dtype), nk_dtype_itemsize((int)q->dtype) * (size_t)q->depth};
    if (!ctx.dot) return 0.0; /* unknown dtype: the dispatcher never passes one */
    if (q->depth > NK_SCREEN_MAX_DEPTH) return nk_maxsim_haswell_exact(&ctx);

    int32_t prepared[NK_HASWELL_QBUF_INTS] __attribute__((aligned(32)));
    int32_t dots[NK_HASWELL_GROUP * NK_HASWELL_BLOCK] __attribute__((aligned(32)));
    double best[NK_HASWELL_SUPER_ROWS];

    /* Keep all prepared query rows of a super-group if they fit; otherwise one group at a time,
     * preparing and accumulating the depth in chunks that fit. */
    uint64_t groups_total = q->screen_depth / 4, ints_per_row = 2 * groups_total;
    int chunked = NK_HASWELL_GROUP * ints_per_row > NK_HASWELL_QBUF_INTS;
    uint64_t super_rows = NK_HASWELL_SUPER_ROWS, chunk_groups = groups_total;
    if (chunked) {
        super_rows = NK_HASWELL_GROUP;
        chunk_groups = NK_HASWELL_QBUF_INTS / (2 * NK_HASWELL_GROUP);
    }
    else if (ints_per_row) {
        super_rows = nk_min_u64(NK_HASWELL_SUPER_ROWS, NK_HASWELL_QBUF_INTS / ints_per_row);
        super_rows -= super_rows % NK_HASWELL_GROUP;
    }
    uint64_t group_ints = 8 * groups_total; /* prepared ints of one register-block group */

    double total = 0.0;
    for (uint64_t row0 = 0; row0 < q->vectors; row0 += super_rows) {
        uint64_t rows = nk_min_u64(super_rows, q->vectors - row0);
        uint64_t groups_of_rows = (rows + NK_HASWELL_GROUP - 1) / NK_HASWELL_GROUP;
        for (uint64_t r = 0; r < rows; ++r) best[r] = -INFINITY;
        if (!chunked)
            for (uint64_t gi = 0; gi < groups_of_rows; ++gi)
                nk_prepare_queries(q, row0 + gi * NK_HASWELL_GROUP, 0, groups_total, prepared + gi * group_ints);

        for (uint64_t j0 = 0; j0 < d->vectors; j0 += NK_HASWELL_BLOCK) {
            uint64_t count = nk_min_u64(NK_HASWELL_BLOCK, d->vectors - j0);
            for (uint64_t gi = 0; gi < groups_of_rows; ++gi) {
                uint64_t first = row0 + gi * NK_HASWELL_GROUP;
                int height = (int)nk_min_u64(NK_HASWELL_GROUP, q->vectors - first);
                int live = 0; /* skip screening for groups of zero query rows */
                for (int r = 0; r < height; ++r) live |= q->inv_norms[first + (uint64_t)r] != 0.0;
                if (!live) continue;
                if (!chunked)
                    nk_screen_block(height, prepared + gi * group_ints, d, j0, count, 0, groups_total, dots, 0);
                else
                    for (uint64_t g0 = 0; g0 < groups_total; g0 += chunk_groups) {
                        uint64_t g1 = nk_min_u64(groups_total, g0 + chunk_groups);
                        nk_prepare_queries(q, first, g0, g1, prepared);
                        nk_screen_block(height, prepared, d, j0, count, g0, g1 - g0, dots, g0 != 0);
                    }
                for (int r = 0; r < height; ++r)
                    if (q->inv_norms[first + (uint64_t)r] != 0.0)
                        nk_candidates(&ctx, first + (uint64_t)r, dots + (uint64_t)r * NK_HASWELL_BLOCK, j0, count,
                                      &best[gi * NK_HASWELL_GROUP + (uint64_t)r]);
            }
        }
        for (uint64_t r = 0; r < rows; ++r)
            total += q->inv_norms[row0 + r] == 0.0 ? 1.0 : nk_distance_from_cos(best[r]);
    }
    return total;
}
