/* Exact MaxSim of a packed float32 query against float32 documents read where they are (unpacked).
 *
 * Packing a document costs more than scoring it (quantizing its screening copy, its norms, the
 * copy itself): reranking raw embeddings once, a caller pays the packer for every candidate. This
 * path, beside driver.h's (it pays: 1,000 x 180 x 128 float32 documents against a 32-row query, one
 * thread, 12.6-13.1 ms here against 43-46 ms to pack them and score the corpus), screens the
 * caller's rows with float32 FMAs instead and returns the bits of packing each
 * document as float32 and scoring it (nk_maxsim_score): for each query row the largest exact
 * cosine, (canonical float64 dot) * inv_q * inv_d with inv_d the packer's (its squares in four
 * float64 lanes, in order), then the same sum over rows.
 *
 * Screening: a query group of 32 rows is transposed to [depth][32] floats, so that each step takes
 * one element of each of 8 document rows (a broadcast) times two vectors of the query column: 16
 * float32 FMAs, no packing of the document. c = s * iq * id estimates each cosine (s the float32 dot,
 * iq the query row's inverse norm, id the float32 inverse norm of the document row) within
 * E = (2 depth + 32) 2^-24: |s - dot| <= gamma_depth |q||d| (any order of FMAs), and the two inverse
 * norms and the products add a few units of rounding. A document row can hold a row's largest
 * cosine only if its c is within 2E of the row's largest c: those, usually one, are rescored exactly.
 * The bound needs float32 neither to overflow nor to lose a row's norm (nk_unp_check_rows): every value
 * finite and below 2^56 in magnitude, every nonzero row's float32 sum of squares between 2^-80 and
 * 2^120 (so |q||d| and every partial sum of a dot product stay far below float32's overflow); a
 * document that is not so is left unscored (NaN) for the caller to pack (which also reports a NaN).
 *
 * bfloat16 screening (NK_UNP_BF16, the genoa family: AVX512_BF16). The check pass also writes each
 * document row rounded to bfloat16, the query columns hold pairs of elements ([depth / 2][32] pairs),
 * and each step's vdpbf16ps multiplies one pair of each of 8 document rows by two query vectors: 32
 * multiply-adds per instruction where an FMA does 16, at the same rate on this CPU. Rounding both
 * operands to 8 significant bits (u = 2^-8) moves a dot product by at most (2u + u^2) |q||d|
 * (sum of |q_k d_k| <= |q||d|); the products are exact in float32, the sums keep gamma_depth of
 * (1 + u)^2 |q||d|; denormals flushed to zero (vdpbf16ps does) move it by under 2 depth 2^-126,
 * below 2^-28 |q||d| for rows that pass the checks. So the estimates hold within
 * E_bf = (E + 2u + u^2)(1 + 2^-6) + 2^-28, about 0.008: a few more candidates, each rescored exactly
 * as before. 1,000 x 180 x 128 documents against a 32-row query (in-process A/B against float32
 * screening): 1.40x in cache, 1.22-1.27x read from memory on one thread, 1.21x on two.
 */
#ifndef NUMKONG_AVX512_UNPACKED_H
#define NUMKONG_AVX512_UNPACKED_H

#include <float.h>
#include <immintrin.h>
#include <math.h>

#include "avx512_dot.h"
#include "maxsim_internal.h"

#define NK_UNP_ROWS NK_UNPACKED_ROWS /* query rows per group: two vectors */
#define NK_UNP_BLOCK 8   /* document rows per micro-kernel call: 8 x 2 accumulators */
#define NK_UNP_HIGH 0x1p56f /* magnitudes below it: no float32 product or sum of a row overflows */

/* out lane j = the sum of the 16 lanes of v[j], in four rounds of shuffles and adds (any order of
 * addition keeps a sum of squares within the bound). */
static inline __m512 nk_unp_lane_sums(__m512 const v[16]) {
    __m512 pairs[8], quads[4], halves[2];
    for (int i = 0; i < 8; ++i) /* per 128-bit block: [x0 + x2, y0 + y2, x1 + x3, y1 + y3] */
        pairs[i] = _mm512_add_ps(_mm512_unpacklo_ps(v[2 * i], v[2 * i + 1]), _mm512_unpackhi_ps(v[2 * i], v[2 * i + 1]));
    for (int i = 0; i < 4; ++i) /* per block: the block sums of rows 4i .. 4i + 3 */
        quads[i] = _mm512_add_ps(_mm512_shuffle_ps(pairs[2 * i], pairs[2 * i + 1], 0x44),
                                 _mm512_shuffle_ps(pairs[2 * i], pairs[2 * i + 1], 0xEE));
    for (int i = 0; i < 2; ++i) /* blocks: two partial sums of rows 8i .. 8i + 3, then two of 8i + 4 .. 8i + 7 */
        halves[i] = _mm512_add_ps(_mm512_shuffle_f32x4(quads[2 * i], quads[2 * i + 1], 0x88),
                                  _mm512_shuffle_f32x4(quads[2 * i], quads[2 * i + 1], 0xDD));
    return _mm512_add_ps(_mm512_shuffle_f32x4(halves[0], halves[1], 0x88),
                         _mm512_shuffle_f32x4(halves[0], halves[1], 0xDD));
}

/* Whether the row's `depth` values are all zero (+0 or -0). */
static int nk_unp_row_is_zero(float const *row, uint64_t depth) {
    for (uint64_t k = 0; k < depth; ++k)
        if (row[k] != 0.0f) return 0;
    return 1;
}

/* Check rows [0, count) (count <= 16) of a matrix (`stride` bytes apart) and write their float32 inverse
 * norms (0 for a zero row) to inv_norms, and with NK_UNP_BF16 and `bf16`, each row rounded to bfloat16
 * (bf16_stride elements apart, zero past the depth up to a multiple of 16). 0 when a value is not
 * finite or not below 2^56 in magnitude, or a nonzero row's float32 sum of squares is below 2^-80 or
 * above 2^120: the screening bound then holds (no product or sum overflows; a row's norm loses at most
 * 2^-53 of itself to underflow, and so does a dot product of two such rows, at depths up to 65,536).
 * Per row, one chain of squares: a NaN or infinity makes its sum non-finite; a sum below 2^-80 (rare)
 * is told apart as a zero row by a second look at the row. */
static int nk_unp_check_rows(float const *first, int64_t stride, unsigned count, uint64_t depth, float *inv_norms,
                             uint16_t *bf16, uint64_t bf16_stride) {
    __m512 squares[16], zero = _mm512_setzero_ps(), top = zero;
#ifndef NK_UNP_BF16
    (void)bf16, (void)bf16_stride;
#endif
    uint64_t full = depth / 16 * 16;
    __mmask16 tail = (__mmask16)((1u << (depth % 16)) - 1u);
    for (unsigned j = count; j < 16; ++j) squares[j] = zero;
    for (unsigned j = 0; j < count; ++j) {
        float const *row = (float const *)((char const *)first + (int64_t)j * stride);
        __m512 sum = zero, largest = zero;
        for (uint64_t k = 0; k < full; k += 16) {
            __m512 x = _mm512_loadu_ps(row + k);
            sum = _mm512_fmadd_ps(x, x, sum);
            largest = _mm512_max_ps(largest, _mm512_abs_ps(x));
#ifdef NK_UNP_BF16
            if (bf16) _mm256_store_si256((__m256i *)(bf16 + j * bf16_stride + k), (__m256i)_mm512_cvtneps_pbh(x));
#endif
        }
        if (tail) {
            __m512 x = _mm512_maskz_loadu_ps(tail, row + full);
            sum = _mm512_fmadd_ps(x, x, sum);
            largest = _mm512_max_ps(largest, _mm512_abs_ps(x));
#ifdef NK_UNP_BF16
            if (bf16) _mm256_store_si256((__m256i *)(bf16 + j * bf16_stride + full), (__m256i)_mm512_cvtneps_pbh(x));
#endif
        }
        squares[j] = sum;
        top = _mm512_max_ps(top, largest);
    }
    __m512 sums = nk_unp_lane_sums(squares);
    __mmask16 rows = (__mmask16)((1u << count) - 1u);
    __mmask16 finite = _mm512_cmp_ps_mask(sums, _mm512_set1_ps(0x1p120f), _CMP_LE_OQ); /* NaN, inf fail too */
    __mmask16 usable = _mm512_cmp_ps_mask(sums, _mm512_set1_ps(0x1p-80f), _CMP_GE_OQ) & finite;
    if (_mm512_reduce_max_ps(top) >= NK_UNP_HIGH || (rows & ~finite)) return 0;
    for (__mmask16 small = rows & ~usable; small; small &= (__mmask16)(small - 1u))
        if (!nk_unp_row_is_zero((float const *)((char const *)first + (int64_t)nk_ctz64(small) * stride), depth))
            return 0;
    __m512 inv = _mm512_maskz_div_ps(usable, _mm512_set1_ps(1.0f), _mm512_sqrt_ps(sums));
    _mm512_mask_storeu_ps(inv_norms, rows, inv);
    return 1;
}

/* Check every row of a matrix (nk_unp_check_rows), 16 at a time. */
static int nk_unp_check_matrix(float const *first, int64_t stride, uint64_t rows, uint64_t depth, float *inv_norms,
                               uint16_t *bf16, uint64_t bf16_stride) {
    for (uint64_t j = 0; j < rows; j += 16)
        if (!nk_unp_check_rows((float const *)((char const *)first + (int64_t)j * stride), stride,
                               rows - j < 16 ? (unsigned)(rows - j) : 16u, depth, inv_norms + j,
                               bf16 ? bf16 + j * bf16_stride : NULL, bf16_stride))
            return 0;
    return 1;
}

/* The packer's inverse norms of `count` (<= 4) float32 rows: per row, squares of the values (exact in
 * float64) summed in four lanes, lane l taking elements l, l + 4, l + 8, ... in order, then
 * (s0 + s1) + (s2 + s3). The rows' chains are independent, so they run side by side. */
static void nk_unp_inv_norms(float const *const *rows, unsigned count, uint64_t depth, double *out) {
    __m256d lanes[4] = {_mm256_setzero_pd(), _mm256_setzero_pd(), _mm256_setzero_pd(), _mm256_setzero_pd()};
    uint64_t k = 0;
    for (; k + 4 <= depth; k += 4)
        for (unsigned i = 0; i < 4; ++i)
            if (i < count) {
                __m256d x = _mm256_cvtps_pd(_mm_loadu_ps(rows[i] + k));
                lanes[i] = _mm256_add_pd(lanes[i], _mm256_mul_pd(x, x));
            }
    if (k < depth)
        for (unsigned i = 0; i < count; ++i) {
            __m256d x = _mm256_cvtps_pd(_mm_maskz_loadu_ps((__mmask8)((1u << (depth - k)) - 1u), rows[i] + k));
            lanes[i] = _mm256_add_pd(lanes[i], _mm256_mul_pd(x, x));
        }
    for (unsigned i = 0; i < count; ++i) {
        double q[4];
        _mm256_storeu_pd(q, lanes[i]);
        double sum = (q[0] + q[1]) + (q[2] + q[3]);
        out[i] = sum > 0.0 ? 1.0 / sqrt(sum) : 0.0;
    }
}

/* Candidates waiting for their exact cosines: document rows without an exact inverse norm yet, and
 * (document row, query row) pairs. Rescoring them together lets their independent float64 chains
 * overlap: 1.04x the whole kernel on 50-200 documents in cache, 1.01x on 1,000 read from memory. */
#define NK_UNP_PAIRS 64
typedef struct nk_unp_pending {
    unsigned norms, pairs;
    uint64_t norm_rows[NK_UNP_PAIRS], doc_rows[NK_UNP_PAIRS];
    unsigned query_rows[NK_UNP_PAIRS];
} nk_unp_pending_t;

/* Rescore the pending candidates exactly, raising best[] (query rows of the group from `first`). */
static void nk_unp_rescore(nk_unp_pending_t *pending, nk_maxsim_view_t const *q, uint64_t first, float const *doc,
                           int64_t stride, uint64_t depth, double *exact_inv_d, double best[NK_UNP_ROWS]) {
    for (unsigned i = 0; i < pending->norms; i += 4) {
        unsigned count = pending->norms - i < 4 ? pending->norms - i : 4;
        float const *rows[4];
        double norms[4];
        for (unsigned j = 0; j < count; ++j)
            rows[j] = (float const *)((char const *)doc + (int64_t)pending->norm_rows[i + j] * stride);
        nk_unp_inv_norms(rows, count, depth, norms);
        for (unsigned j = 0; j < count; ++j) exact_inv_d[pending->norm_rows[i + j]] = norms[j];
    }
    void const *a[NK_UNP_PAIRS], *b[NK_UNP_PAIRS];
    double dots[NK_UNP_PAIRS];
    for (unsigned i = 0; i < pending->pairs; ++i) {
        a[i] = (char const *)q->values + (first + pending->query_rows[i]) * q->row_bytes;
        b[i] = (char const *)doc + (int64_t)pending->doc_rows[i] * stride;
    }
    nk_x512_dot_batch(nk_dtype_float32_k, a, b, pending->pairs, depth, dots);
    for (unsigned i = 0; i < pending->pairs; ++i) {
        unsigned r = pending->query_rows[i];
        double cos = nk_exact_cosine(dots[i], q->inv_norms[first + r], exact_inv_d[pending->doc_rows[i]]);
        if (cos > best[r]) best[r] = cos;
    }
    pending->norms = pending->pairs = 0;
}

/* s[j][h] += sum over depth of rows[j][k] * column k of the group (its 16 h-th rows), for `count`
 * document rows (a constant after inlining) and `halves` query vectors. */
NK_INLINE void nk_unp_block(float const *columns, uint64_t depth, float const *first, int64_t stride, int count,
                            int halves, __m512 s[NK_UNP_BLOCK][2], nk_prefetch_stream_t *prefetch) {
    float const *rows[NK_UNP_BLOCK];
    for (int j = 0; j < count; ++j) rows[j] = (float const *)((char const *)first + j * stride);
    for (int j = 0; j < count; ++j) s[j][0] = s[j][1] = _mm512_setzero_ps();
    /* The next document streams in: 4 lines per 8 steps, outside the step loop (whose registers the
     * stream's would crowd). */
    for (uint64_t k0 = 0; k0 < depth; k0 += 8) {
        nk_prefetch_lines(prefetch, 4);
        uint64_t end = depth - k0 < 8 ? depth : k0 + 8;
        for (uint64_t k = k0; k < end; ++k, columns += NK_UNP_ROWS) {
            __m512 low = _mm512_load_ps(columns), high = halves == 2 ? _mm512_load_ps(columns + 16) : low;
#pragma GCC unroll 8
            for (int j = 0; j < count; ++j) {
                __m512 value = _mm512_set1_ps(rows[j][k]);
                s[j][0] = _mm512_fmadd_ps(value, low, s[j][0]);
                if (halves == 2) s[j][1] = _mm512_fmadd_ps(value, high, s[j][1]);
            }
        }
    }
}

#ifdef NK_UNP_BF16
/* The same sums from bfloat16 pairs: column p of the group holds, per query row, its elements 2p and
 * 2p + 1; each step broadcasts one pair of each document row (32 bits). */
NK_INLINE void nk_unp_block_bf16(uint32_t const *columns, uint64_t pairs, uint16_t const *first, uint64_t stride,
                                 int count, int halves, __m512 s[NK_UNP_BLOCK][2], nk_prefetch_stream_t *prefetch) {
    uint32_t const *rows[NK_UNP_BLOCK];
    for (int j = 0; j < count; ++j) rows[j] = (uint32_t const *)(first + (uint64_t)j * stride);
    for (int j = 0; j < count; ++j) s[j][0] = s[j][1] = _mm512_setzero_ps();
    for (uint64_t p0 = 0; p0 < pairs; p0 += 4) {
        nk_prefetch_lines(prefetch, 4);
        uint64_t end = pairs - p0 < 4 ? pairs : p0 + 4;
        for (uint64_t p = p0; p < end; ++p, columns += NK_UNP_ROWS) {
            __m512bh low = (__m512bh)_mm512_load_si512(columns),
                     high = halves == 2 ? (__m512bh)_mm512_load_si512(columns + 16) : low;
#pragma GCC unroll 8
            for (int j = 0; j < count; ++j) {
                __m512bh value = (__m512bh)_mm512_set1_epi32((int)rows[j][p]);
                s[j][0] = _mm512_dpbf16_ps(s[j][0], low, value);
                if (halves == 2) s[j][1] = _mm512_dpbf16_ps(s[j][1], high, value);
            }
        }
    }
}
#endif

/* Estimates c of document rows [j0, j0 + count) into estimates[j][32], raising the running maxima. */
NK_INLINE void nk_unp_estimate(float const *columns, uint64_t depth, float const *doc, int64_t stride, uint64_t j0,
                               int count, int halves, __m512 const inv_q[2], float const *inv_d, float *estimates,
                               __m512 top[2], nk_prefetch_stream_t *prefetch, uint16_t const *doc_bf, uint64_t bf_stride) {
    __m512 s[NK_UNP_BLOCK][2];
#ifdef NK_UNP_BF16
    (void)doc, (void)stride;
    nk_unp_block_bf16((uint32_t const *)columns, (depth + 1) / 2, doc_bf + j0 * bf_stride, bf_stride, count, halves, s,
                      prefetch);
#else
    (void)doc_bf, (void)bf_stride;
    nk_unp_block(columns, depth, (float const *)((char const *)doc + (int64_t)j0 * stride), stride, count, halves, s,
                 prefetch);
#endif
    for (int j = 0; j < count; ++j)
        for (int h = 0; h < halves; ++h) {
            __m512 c = _mm512_mul_ps(_mm512_mul_ps(s[j][h], inv_q[h]), _mm512_set1_ps(inv_d[j0 + (uint64_t)j]));
            _mm512_store_ps(estimates + (j0 + (uint64_t)j) * NK_UNP_ROWS + 16 * h, c);
            top[h] = _mm512_max_ps(top[h], c);
        }
}

/* nk_unp_estimate for 1..8 rows known only at run time, with the count a constant in each branch. */
static void nk_unp_estimate_rest(float const *columns, uint64_t depth, float const *doc, int64_t stride, uint64_t j0,
                                 int count, int halves, __m512 const inv_q[2], float const *inv_d, float *estimates,
                                 __m512 top[2], nk_prefetch_stream_t *prefetch, uint16_t const *doc_bf, uint64_t bf_stride) {
    switch (count * 2 + halves - 1) {
#define NK_UNP_CASE(rows, halves_)                                                                                  \
    case rows * 2 + halves_ - 1:                                                                                    \
        nk_unp_estimate(columns, depth, doc, stride, j0, rows, halves_, inv_q, inv_d, estimates, top, prefetch, doc_bf, bf_stride); \
        return;
        NK_UNP_CASE(1, 1) NK_UNP_CASE(1, 2) NK_UNP_CASE(2, 1) NK_UNP_CASE(2, 2) NK_UNP_CASE(3, 1) NK_UNP_CASE(3, 2)
        NK_UNP_CASE(4, 1) NK_UNP_CASE(4, 2) NK_UNP_CASE(5, 1) NK_UNP_CASE(5, 2) NK_UNP_CASE(6, 1) NK_UNP_CASE(6, 2)
        NK_UNP_CASE(7, 1) NK_UNP_CASE(7, 2) NK_UNP_CASE(8, 1) NK_UNP_CASE(8, 2)
#undef NK_UNP_CASE
    default: return;
    }
}

/* MaxSim of the packed float32 query q (view, at least one row) against each of `count` documents
 * (rows x depth float32 values, `strides[i]` bytes apart), into scores; NaN for a document it leaves
 * to the caller. 0 if the query itself is out of range (nothing scored). The scratch is laid out as
 * nk_maxsim_unpacked_scratch_bytes counts it, for max_rows rows (the query's and every document's). */
static int nk_unp_score(nk_maxsim_view_t const *q, float const *const *documents, uint64_t const *rows,
                        int64_t const *strides, uint64_t count, uint64_t max_rows, void *scratch, double *scores) {
    uint64_t depth = q->depth, groups = (q->vectors + NK_UNP_ROWS - 1) / NK_UNP_ROWS;
    float *columns = (float *)(((uintptr_t)scratch + 63) & ~(uintptr_t)63);
    float *inv_d = columns + groups * depth * NK_UNP_ROWS;
    double *exact_inv_d = (double *)(((uintptr_t)(inv_d + max_rows) + 63) & ~(uintptr_t)63);
    float *estimates = (float *)(((uintptr_t)(exact_inv_d + max_rows) + 63) & ~(uintptr_t)63);
    uint64_t bf_stride = (depth + 15) / 16 * 16; /* the document's bfloat16 copy: 32-byte blocks per row */
#ifdef NK_UNP_BF16
    uint16_t *doc_bf = (uint16_t *)(((uintptr_t)(estimates + max_rows * NK_UNP_ROWS) + 63) & ~(uintptr_t)63);
#else
    uint16_t *doc_bf = NULL;
#endif
    /* The query's range (its float32 norms are not needed: the screening takes its exact ones), then
     * its groups, transposed (rows past the query are zero). */
    if (!nk_unp_check_matrix((float const *)q->values, (int64_t)q->row_bytes, q->vectors, depth, inv_d, NULL, 0))
        return 0;
#ifdef NK_UNP_BF16
    uint64_t pairs = (depth + 1) / 2;
    for (uint64_t r = 0; r < groups * NK_UNP_ROWS; ++r) {
        float const *row = r < q->vectors ? (float const *)((char const *)q->values + r * q->row_bytes) : NULL;
        uint16_t *column = (uint16_t *)columns + (r / NK_UNP_ROWS) * pairs * NK_UNP_ROWS * 2 + (r % NK_UNP_ROWS) * 2;
        for (uint64_t k = 0; k < 2 * pairs; ++k) {
            float x = row && k < depth ? row[k] : 0.0f;
            __m128bh h = _mm_cvtneps_pbh(_mm_set1_ps(x));
            column[(k / 2) * NK_UNP_ROWS * 2 + (k % 2)] = (uint16_t)_mm_extract_epi16((__m128i)h, 0);
        }
    }
    float const margin = (((float)(2 * depth + 32) * 0x1p-24f + 0x1p-7f + 0x1p-16f) * (1.0f + 0x1p-6f) + 0x1p-28f) *
                         2.0f; /* 2 E_bf */
#else
    for (uint64_t r = 0; r < groups * NK_UNP_ROWS; ++r) {
        float const *row = r < q->vectors ? (float const *)((char const *)q->values + r * q->row_bytes) : NULL;
        float *column = columns + (r / NK_UNP_ROWS) * depth * NK_UNP_ROWS + r % NK_UNP_ROWS;
        for (uint64_t k = 0; k < depth; ++k) column[k * NK_UNP_ROWS] = row ? row[k] : 0.0f;
    }
    float const margin = (float)(2 * depth + 32) * 0x1p-24f * 2.0f; /* 2E: the estimates of two rows */
#endif
    for (uint64_t i = 0; i < count; ++i) {
        float const *doc = documents[i];
        int64_t stride = strides[i];
        uint64_t n = rows[i];
        /* The next document streams in while this one is screened (its rows, when they ascend). */
        nk_prefetch_stream_t prefetch = nk_prefetch_stream(NULL, 0, NULL, 0);
        if (i + 1 < count && strides[i + 1] > 0)
            prefetch = nk_prefetch_stream(documents[i + 1], rows[i + 1] * (uint64_t)strides[i + 1], NULL, 0);
        for (uint64_t j = 0; j < n; ++j) exact_inv_d[j] = -1.0; /* computed when a row is first rescored */
        if (!n || !nk_unp_check_matrix(doc, stride, n, depth, inv_d, doc_bf, bf_stride)) {
            scores[i] = NAN;
            continue;
        }
        double total = 0.0;
        for (uint64_t g = 0; g < groups; ++g) {
            uint64_t first = g * NK_UNP_ROWS, live = q->vectors - first < NK_UNP_ROWS ? q->vectors - first : NK_UNP_ROWS;
            int halves = live > 16 ? 2 : 1;
#ifdef NK_UNP_BF16
            float const *group_columns = columns + g * pairs * NK_UNP_ROWS;
#else
            float const *group_columns = columns + g * depth * NK_UNP_ROWS;
#endif
            _Alignas(64) float inv_q_lanes[NK_UNP_ROWS];
            for (unsigned r = 0; r < NK_UNP_ROWS; ++r) inv_q_lanes[r] = r < live ? (float)q->inv_norms[first + r] : 0.0f;
            __m512 inv_q[2] = {_mm512_load_ps(inv_q_lanes), _mm512_load_ps(inv_q_lanes + 16)};
            __m512 top[2] = {_mm512_set1_ps(-INFINITY), _mm512_set1_ps(-INFINITY)};
            uint64_t j = 0;
            for (; j + NK_UNP_BLOCK <= n; j += NK_UNP_BLOCK)
                if (halves == 2)
                    nk_unp_estimate(group_columns, depth, doc, stride, j, NK_UNP_BLOCK, 2, inv_q, inv_d, estimates, top,
                                    &prefetch, doc_bf, bf_stride);
                else
                    nk_unp_estimate(group_columns, depth, doc, stride, j, NK_UNP_BLOCK, 1, inv_q, inv_d, estimates, top,
                                    &prefetch, doc_bf, bf_stride);
            if (j < n)
                nk_unp_estimate_rest(group_columns, depth, doc, stride, j, (int)(n - j), halves, inv_q, inv_d,
                                     estimates, top, &prefetch, doc_bf, bf_stride);
            /* Candidates: estimates within 2E of their row's largest; each rescored exactly. */
            __m512 const spread = _mm512_set1_ps(margin);
            __m512 cuts[2] = {_mm512_sub_ps(top[0], spread), _mm512_sub_ps(top[1], spread)};
            double best[NK_UNP_ROWS];
            for (unsigned r = 0; r < NK_UNP_ROWS; ++r) best[r] = -INFINITY;
            nk_unp_pending_t pending;
            pending.norms = pending.pairs = 0;
            uint32_t query_nonzero = 0; /* zero query rows add exactly 1 whatever their best */
            for (unsigned r = 0; r < live; ++r) query_nonzero |= (uint32_t)(q->inv_norms[first + r] != 0.0) << r;
            for (uint64_t d = 0; d < n; ++d) {
                uint32_t hits = 0;
                for (int h = 0; h < halves; ++h)
                    hits |= (uint32_t)_mm512_cmp_ps_mask(_mm512_load_ps(estimates + d * NK_UNP_ROWS + 16 * h), cuts[h],
                                                         _CMP_GE_OQ) << (16 * h);
                hits &= query_nonzero;
                if (!hits) continue;
                if (pending.pairs + (unsigned)nk_popcount32(hits) > NK_UNP_PAIRS)
                    nk_unp_rescore(&pending, q, first, doc, stride, depth, exact_inv_d, best);
                if (exact_inv_d[d] < 0.0) {
                    exact_inv_d[d] = 0.0; /* set by the rescoring, before any pair of this row is read */
                    pending.norm_rows[pending.norms++] = d;
                }
                for (; hits; hits &= hits - 1) {
                    pending.doc_rows[pending.pairs] = d;
                    pending.query_rows[pending.pairs++] = nk_ctz64(hits);
                }
            }
            nk_unp_rescore(&pending, q, first, doc, stride, depth, exact_inv_d, best);
            for (uint64_t r = 0; r < live; ++r) total += nk_row_distance(q->inv_norms[first + r], best[r]);
        }
        scores[i] = total;
    }
    return 1;
}

#endif /* NUMKONG_AVX512_UNPACKED_H */
