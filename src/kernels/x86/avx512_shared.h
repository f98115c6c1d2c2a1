/* AVX-512 helpers shared by the skylake-class families (icelake, sapphireamx): tagged screening
 * bounds, thresholds, batched float64 rescoring and per-row screening constants. */
#ifndef NUMKONG_X86_AVX512_SHARED_H
#define NUMKONG_X86_AVX512_SHARED_H
#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "avx512_dot.h"
#include "maxsim_internal.h"

/* Exact cosine in the contract's order: dot * inv_q * inv_d, 0 for a zero document row.
 * `decoded` is the query row in float64, or NULL to read the stored row. */
static inline double nk_x512_cosine(nk_maxsim_view_t const *q, nk_maxsim_view_t const *d, void const *q_row,
                                   double const *decoded, double inv_q, uint64_t doc, size_t row_bytes) {
    double inv_d = d->inv_norms[doc];
    if (inv_d == 0.0) return 0.0;
    void const *d_row = (char const *)d->values + doc * row_bytes;
    double dot = decoded ? nk_x512_dot_decoded((int)q->dtype, decoded, d_row, q->depth)
                         : nk_x512_dot_stored((int)q->dtype, q_row, d_row, q->depth);
    return dot * inv_q * inv_d;
}


/* ---- Tagged screening bounds. ----
 * A kernel that wants to rescore each row's largest upper bound first keeps per-lane maxima of its
 * bounds with the low 6 mantissa bits replaced by the bound's 16-row tile within the block (up to
 * 64 tiles): the maximum of tagged bounds names a document whose bound is within 2^-17 (relative)
 * of the largest. Tags only choose that document; cuts compare the stored, untagged bounds. */
#define NK_X512_TAG_BITS 0x3F

NK_INLINE __m512 nk_x512_tag(__m512 upper, unsigned tile) {
    return _mm512_castsi512_ps(_mm512_ternarylogic_epi32(
        _mm512_castps_si512(upper), _mm512_set1_epi32(~NK_X512_TAG_BITS), _mm512_set1_epi32((int)tile), 0xEA));
}

/* The tile and lane of the largest of 16 tagged per-lane maxima; 0 when there is none (NaN bounds,
 * which only sections changed after validation produce). */
NK_INLINE int nk_x512_tagged_top(__m512 top, unsigned *tile, unsigned *lane) {
    float largest = _mm512_reduce_max_ps(top);
    int32_t bits;
    memcpy(&bits, &largest, sizeof bits);
    unsigned at = (unsigned)_mm512_cmp_ps_mask(top, _mm512_set1_ps(largest), _CMP_EQ_OQ);
    if (!at) return 0;
    *lane = nk_ctz32(at);
    *tile = (unsigned)(bits & NK_X512_TAG_BITS);
    return 1;
}

#define NK_X512_PREFETCH_BYTES 1024u /* leading bytes of a candidate row fetched ahead of its rescoring */

/* Ask for the leading bytes of a stored row that is about to be rescored: in a corpus (`cold`
 * documents) rows stream from memory, and for cached documents this would only cost time. */
NK_INLINE void nk_x512_prefetch_row(void const *row, size_t row_bytes) {
    size_t bytes = row_bytes < NK_X512_PREFETCH_BYTES ? row_bytes : NK_X512_PREFETCH_BYTES;
    for (size_t line = 0; line < bytes; line += 64) _mm_prefetch((char const *)row + line, _MM_HINT_T0);
}

/* A row's threshold (a proven lower bound on its best cosine) rises to `lower` if that is higher,
 * and its cut on the stored bounds follows: (threshold - offset) * inv_scale, rounded down. */
static inline void nk_x512_raise(double lower, double offset, double inv_scale, double *threshold, float *cut) {
    if (lower > *threshold) {
        *threshold = lower;
        *cut = nk_threshold_floor(nk_f32_at_most((lower - offset) * inv_scale));
    }
}

/* An exact cosine of a query row raises the row's best exact cosine, and its threshold and cut. */
static inline void nk_x512_take(double cos, double *best, double offset, double inv_scale, double *threshold,
                                float *cut) {
    if (cos > *best) *best = cos;
    nk_x512_raise(cos, offset, inv_scale, threshold, cut);
}

/* Up to 16 (query row, document) pairs waiting for one batch of float64 rescoring. */
typedef struct nk_x512_batch {
    void const *q_rows[16], *d_rows[16]; /* the stored rows */
    uint64_t docs[16];                   /* document indices */
    unsigned which[16];                  /* query rows, relative to the group's first */
    unsigned n;
} nk_x512_batch_t;

/* Queue query row first_query + r against document `doc`. */
NK_INLINE void nk_x512_batch_add(nk_x512_batch_t *batch, nk_maxsim_view_t const *q, nk_maxsim_view_t const *d,
                                      uint64_t first_query, size_t row_bytes, unsigned r, uint64_t doc) {
    unsigned k = batch->n++;
    batch->q_rows[k] = (char const *)q->values + (first_query + r) * row_bytes;
    batch->d_rows[k] = (char const *)d->values + doc * row_bytes;
    batch->docs[k] = doc;
    batch->which[k] = r;
}

/* Queue row r's tagged largest bound of a block of `docs` documents (`top`, its per-lane maxima) if
 * it still reaches `cut`: the bound of document 16 tile + lane sits at upper_block[tile * tile_stride
 * + r * row_stride + lane] and becomes -inf, so the scan that follows never collects it again. In a
 * corpus (`cold` documents) its row is prefetched. Returns whether the pair was queued. A tag naming
 * no document of the block (from NaN bounds) queues nothing. */
NK_INLINE int nk_x512_queue_top(nk_x512_batch_t *batch, nk_maxsim_view_t const *q, nk_maxsim_view_t const *d,
                                     uint64_t first_query, size_t row_bytes, unsigned r, __m512 top, float cut,
                                     float *upper_block, size_t tile_stride, size_t row_stride, uint64_t first_doc,
                                     uint64_t docs) {
    unsigned tile, lane;
    if (!nk_x512_tagged_top(top, &tile, &lane) || 16u * tile + lane >= docs) return 0;
    float *upper = upper_block + tile * tile_stride + r * row_stride + lane;
    if (!(*upper >= cut)) return 0; /* (also when the block holds no live bound) */
    *upper = -INFINITY;
    nk_x512_batch_add(batch, q, d, first_query, row_bytes, r, first_doc + 16u * tile + lane);
    if (d->cold) nk_x512_prefetch_row(batch->d_rows[batch->n - 1], row_bytes);
    return 1;
}

/* Rescore the queued pairs with one batch of float64 dot products, independent work for the core to
 * overlap (a zero document row has cosine 0). Each cosine is taken into row which[k] of the per-row
 * arrays. */
static inline void nk_x512_rescore_batch(nk_maxsim_view_t const *q, nk_maxsim_view_t const *d, uint64_t first_query,
                                         nk_x512_batch_t const *batch, double *best, double const *offset,
                                         double const *inv_scale, double *threshold, float *cut) {
    double dots[16];
    if (!batch->n) return;
    nk_x512_dot_batch((int)q->dtype, batch->q_rows, batch->d_rows, batch->n, q->depth, dots);
    for (unsigned k = 0; k < batch->n; ++k) {
        unsigned r = batch->which[k];
        double inv_d = d->inv_norms[batch->docs[k]];
        double cos = inv_d == 0.0 ? 0.0 : dots[k] * q->inv_norms[first_query + r] * inv_d;
        nk_x512_take(cos, &best[r], offset[r], inv_scale[r], &threshold[r], &cut[r]);
    }
}

/* ---- Per-row screening constants of a query group. ----
 * Lane r describes query row first + r (r < rows <= 8); rows past the end and zero rows are dead:
 * scale 1, growth 0, bias 0, offset the slack alone, not in `live`. */
typedef struct nk_x512_row_constants {
    __m512d scale;     /* s_q */
    __m512d inv_scale; /* 1 / s_q */
    __m512d offset;    /* a = e_q + slack */
    __m256 growth;     /* b = (1 + e_q) / s_q */
    __m256i bias;      /* 128 * screen_sums[q]: the documents' +128 offset times the query's sum */
    __mmask8 live;
} nk_x512_row_constants_t;

static inline nk_x512_row_constants_t nk_x512_row_constants(nk_maxsim_view_t const *q, uint64_t first, uint64_t rows) {
    nk_x512_row_constants_t c;
    __mmask8 present = rows >= 8 ? (__mmask8)0xFF : (__mmask8)((1u << rows) - 1u);
    __m512d one = _mm512_set1_pd(1.0), zero = _mm512_setzero_pd();
    c.live = _mm512_mask_cmp_pd_mask(present, _mm512_maskz_loadu_pd(present, q->inv_norms + first), zero, _CMP_NEQ_UQ);
    __m512d error = _mm512_cvtps_pd(_mm256_maskz_loadu_ps(c.live, q->screen_errors + first)); /* e_q */
    c.scale = _mm512_mask_cvtps_pd(one, c.live, _mm256_maskz_loadu_ps(c.live, q->screen_scales + first));
    /* never for a packed nonzero row; keeps b finite */
    c.scale = _mm512_mask_blend_pd(_mm512_cmp_pd_mask(c.scale, zero, _CMP_GT_OQ), _mm512_set1_pd(0x1p-126), c.scale);
    c.inv_scale = _mm512_div_pd(one, c.scale);
    c.offset = _mm512_add_pd(error, _mm512_set1_pd((double)nk_screen_slack_k));
    c.growth = _mm256_maskz_mov_ps(c.live, _mm512_cvtpd_ps(_mm512_div_pd(_mm512_add_pd(one, error), c.scale)));
    c.bias = _mm256_slli_epi32(_mm256_maskz_loadu_epi32(c.live, q->screen_sums + first), 7);
    return c;
}

/* ---- Collecting candidates. ---- */

/* Append the lanes of `upper` (tile t) that reach the cut to the candidate list, which has room
 * for 16 more. Compressing in registers and storing whole vectors is much faster than the
 * memory form of vcompressps. */
NK_INLINE unsigned nk_x512_collect(__m512 upper, __mmask16 candidates, uint64_t t, float *list_upper,
                                      int32_t *list_doc, unsigned count) {
    __m512i lane_index = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    _mm512_storeu_ps(list_upper + count, _mm512_maskz_compress_ps(candidates, upper));
    __m512i docs = _mm512_add_epi32(lane_index, _mm512_set1_epi32((int)(16 * t)));
    _mm512_storeu_si512(list_doc + count, _mm512_maskz_compress_epi32(candidates, docs));
    return count + nk_popcount32(candidates);
}

/* Collect the documents of tiles [*tile, tiles) whose stored upper bound reaches the cut, until the
 * list could overflow; *tile is left where the scan stopped (tiles when it finished). Four tiles
 * per test keep the common no-candidate case to one branch. Inlined: it runs once per query row,
 * and the call cost 2-4 % at 32x180x128 (icelake). The scan of driver.h's AVX-512 families. */
NK_INLINE unsigned nk_x512_scan(float const *row_scores, uint64_t *tile, uint64_t tiles, float cut,
                               float *list_upper, int32_t *list_doc, unsigned capacity) {
    __m512 cut_vector = _mm512_set1_ps(cut);
    unsigned count = 0;
    uint64_t t = *tile;
    for (; t + 4 <= tiles; t += 4) {
        __mmask16 hit[4];
        __m512 upper[4];
#pragma GCC unroll 4
        for (int u = 0; u < 4; ++u) {
            upper[u] = _mm512_load_ps(row_scores + 16 * (t + (uint64_t)u));
            hit[u] = _mm512_cmp_ps_mask(upper[u], cut_vector, _CMP_GE_OQ);
        }
        if (!(hit[0] | hit[1] | hit[2] | hit[3])) continue;
#pragma GCC unroll 4
        for (int u = 0; u < 4; ++u) {
            if (!hit[u]) continue;
            if (count + 16 > capacity) {
                *tile = t + (uint64_t)u;
                return count;
            }
            count = nk_x512_collect(upper[u], hit[u], t + (uint64_t)u, list_upper, list_doc, count);
        }
    }
    for (; t < tiles; ++t) {
        __m512 upper = _mm512_load_ps(row_scores + 16 * t);
        __mmask16 hit = _mm512_cmp_ps_mask(upper, cut_vector, _CMP_GE_OQ);
        if (!hit) continue;
        if (count + 16 > capacity) break;
        count = nk_x512_collect(upper, hit, t, list_upper, list_doc, count);
    }
    *tile = t;
    return count;
}


#endif /* NUMKONG_X86_AVX512_SHARED_H */
