/* Skylake-X family: AVX-512 F/CD/BW/DQ/VL, no VNNI.
 *
 * Certified screening, then exact rescoring:
 *  1. Screening: for a tile of 16 query rows and a tile of 16 document rows, the int8 dot
 *     products come from the tiled `screen` section. Without VNNI there is no u8 x s8 -> s32
 *     instruction, and vpmaddubsw would saturate on biased bytes (255 * 127 * 2 > 32767), so both
 *     operands stay biased (0..255) and are split into the even and odd bytes of each 4-byte group
 *     as 16-bit words: two vpmaddwd cover the 4 depths exactly in int32. The bias terms are
 *     removed with the packer's row sums in wrapping 32-bit arithmetic (the true dot fits int32).
 *     The query rows sit in up to 16 accumulators and their split words come from a small stack
 *     buffer as broadcasts, so per 4 depths the inner loop is 1 load, 2 splits, 32 vpmaddwd and
 *     32 vpaddd for 16 x 16 x 4 multiply-accumulates: 4 vector ops per 64, the floor without VNNI.
 *  2. Each estimate becomes a lower and an upper bound on the cosine (maxsim_internal.h).
 *  3. Per query row, the documents whose upper bound reaches the best lower bound of all blocks
 *     (or the best exact cosine) are rescored exactly in float64, best upper bound first,
 *     stopping as soon as no remaining candidate can win.
 * Stack use is fixed (about 42 KB); no allocation, no global state. */
#include <immintrin.h>
#include <math.h>

#include "avx512_dot.h"
#include "maxsim_internal.h"

#define NK_SKL_TILE 16u                                    /* rows per screen tile */
#define NK_SKL_BLOCK_TILES 16u                             /* document tiles per block */
#define NK_SKL_BLOCK_ROWS (NK_SKL_BLOCK_TILES * NK_SKL_TILE) /* 256 documents */
#define NK_SKL_CHUNK_GROUPS 128u                           /* 4-depth groups per depth chunk */
#define NK_SKL_PENDING_MAX 32u     /* candidates held per query row before rescoring early */

/* ---- Exact float64 dot products of stored rows: the shared AVX-512 ones (avx512_dot.h), in the
 * canonical order every family follows. ---- */

static inline __mmask16 nk_skl_mask16(uint64_t n) { return (__mmask16)((1u << n) - 1u); }

/* float64 dot of two stored rows, decoded exactly as nk_decode() does. */
static inline double nk_skl_dot(int dtype, void const *a, void const *b, uint64_t n) {
    return nk_x512_dot_stored(dtype, a, b, n);
}

/* Exact cosine exactly as the contract states: (float64 dot) * inv_q * inv_d. */
static inline double nk_skl_cosine(nk_maxsim_view_t const *q, nk_maxsim_view_t const *d, uint64_t row_bytes,
                                   uint64_t i, double inv_q, uint64_t j) {
    double inv_d = d->inv_norms[j];
    if (inv_d == 0.0) return 0.0;
    return nk_skl_dot((int)q->dtype, (char const *)q->values + i * row_bytes, (char const *)d->values + j * row_bytes,
                      q->depth) *
           inv_q * inv_d;
}

/* ---- Screening ---- */

/* Per query row constants of the bound and of the bias removal. */
typedef struct nk_skl_query_rows { /* also read as vectors, one lane per row */
    float scale[NK_SKL_TILE];           /* screen_scales */
    float slack[NK_SKL_TILE];           /* A = e_q + float32 slack */
    float growth[NK_SKL_TILE];          /* B = 1 + e_q */
    int32_t negative_bias[NK_SKL_TILE]; /* -(128 sum(v_q) + 128 * 128 * screen_depth), wrapping */
} nk_skl_query_rows_t;

/* Where the finishing step finds one document tile's per-row data. Loaded after the depth loop,
 * not before it, so nothing but the accumulators competes for registers inside the loop. */
typedef struct nk_skl_doc_tile {
    float const *scales, *errors;
    int32_t const *sums;
    __mmask16 valid;
} nk_skl_doc_tile_t;

/* Screen `rows` query rows (a compile-time count after inlining, so the accumulators live in
 * registers) starting at row0 of the query tile against one document tile, over `groups`
 * 4-depth groups. `split` holds, per group, the query tile's even bytes then odd bytes as 16-bit
 * words inside each row's 32-bit lane. `out` (row stride NK_SKL_BLOCK_ROWS) holds int32 partial
 * sums between depth chunks and receives the float32 upper bounds after the last one. */
NK_INLINE void nk_skl_screen_rows(unsigned const rows, unsigned const row0,
                                                                    uint32_t const *split, uint64_t groups,
                                                                    uint8_t const *doc, uint64_t doc_stride,
                                                                    __mmask64 doc_mask, int first, int last,
                                                                    float *out, nk_skl_query_rows_t const *qr,
                                                                    nk_skl_doc_tile_t const *tile, float *lower) {
    /* Start from minus the query's bias terms, so only the document's remain at the end. */
    __m512i acc[NK_SKL_TILE];
#pragma GCC unroll 16
    for (unsigned r = 0; r < rows; ++r)
        acc[r] = first ? _mm512_set1_epi32(qr->negative_bias[row0 + r])
                       : _mm512_loadu_si512((void const *)(out + r * NK_SKL_BLOCK_ROWS));
    __m512i const even_bytes = _mm512_set1_epi32(0x00FF00FF);
    for (uint64_t g = 0; g < groups; ++g) {
        __m512i d_bytes = _mm512_maskz_loadu_epi8(doc_mask, doc + g * doc_stride);
        __m512i d_even = _mm512_and_si512(d_bytes, even_bytes), d_odd = _mm512_srli_epi16(d_bytes, 8);
        uint32_t const *q_group = split + g * 2 * NK_SKL_TILE + row0;
#pragma GCC unroll 16
        for (unsigned r = 0; r < rows; ++r) {
            __m512i q_even = _mm512_set1_epi32((int)q_group[r]);
            __m512i q_odd = _mm512_set1_epi32((int)q_group[NK_SKL_TILE + r]);
            acc[r] = _mm512_add_epi32(acc[r], _mm512_madd_epi16(d_even, q_even));
            acc[r] = _mm512_add_epi32(acc[r], _mm512_madd_epi16(d_odd, q_odd));
        }
    }
    if (!last) {
#pragma GCC unroll 16
        for (unsigned r = 0; r < rows; ++r) _mm512_storeu_si512((void *)(out + r * NK_SKL_BLOCK_ROWS), acc[r]);
        return;
    }
    __m512 const doc_scale = _mm512_maskz_loadu_ps(tile->valid, tile->scales);
    __m512 const doc_error = _mm512_maskz_loadu_ps(tile->valid, tile->errors);
    __m512i const doc_bias = _mm512_slli_epi32(_mm512_maskz_loadu_epi32(tile->valid, tile->sums), 7);
#pragma GCC unroll 16
    for (unsigned r = 0; r < rows; ++r) {
        unsigned row = row0 + r;
        /* exact int8 dot: the biased sum minus the document's bias term, wrapping (fits int32) */
        __m512 dot = _mm512_cvtepi32_ps(_mm512_sub_epi32(acc[r], doc_bias));
        __m512 scale = _mm512_mul_ps(_mm512_set1_ps(qr->scale[row]), doc_scale);
        __m512 margin = _mm512_fmadd_ps(_mm512_set1_ps(qr->growth[row]), doc_error, _mm512_set1_ps(qr->slack[row]));
        /* Lanes past the last document hold garbage: the candidate pass masks them out of the
         * upper bounds, and they must not raise the best lower bound. */
        _mm512_storeu_ps(out + r * NK_SKL_BLOCK_ROWS, _mm512_fmadd_ps(dot, scale, margin));
        __m512 best_lower = _mm512_load_ps(lower + row * NK_SKL_TILE);
        best_lower = _mm512_mask_max_ps(best_lower, tile->valid, best_lower, _mm512_fmsub_ps(dot, scale, margin));
        _mm512_store_ps(lower + row * NK_SKL_TILE, best_lower);
    }
}

/* All rows of the query tile against one document tile, in register blocks of 16/8/4/2/1 rows. */
static void nk_skl_screen_tile(unsigned query_rows, uint32_t const *split, uint64_t groups, uint8_t const *doc,
                               uint64_t doc_stride, __mmask64 doc_mask, int first, int last, float *out,
                               nk_skl_query_rows_t const *qr, nk_skl_doc_tile_t const *tile, float *lower) {
    unsigned row0 = 0;
#define NK_SKL_ROWS(n)                                                                                              \
    nk_skl_screen_rows(n, row0, split, groups, doc, doc_stride, doc_mask, first, last, out + row0 * NK_SKL_BLOCK_ROWS, \
                       qr, tile, lower);                                                                            \
    row0 += n
    if (query_rows - row0 >= 16) { NK_SKL_ROWS(16); }
    if (query_rows - row0 >= 8) { NK_SKL_ROWS(8); }
    if (query_rows - row0 >= 4) { NK_SKL_ROWS(4); }
    if (query_rows - row0 >= 2) { NK_SKL_ROWS(2); }
    if (query_rows - row0 >= 1) { NK_SKL_ROWS(1); }
#undef NK_SKL_ROWS
}

/* The last document tile when it holds only a few rows: the 16 query rows of the split buffer
 * form the vector and each document's 4-byte group is broadcast, so the work scales with the
 * documents present rather than with a full tile. Documents go 4 at a time (a missing one repeats
 * the last row, so nothing past the tile is read). `partial` ([16 documents][16 rows] int32) holds
 * the sums between depth chunks; the upper bounds land in `out` with the usual layout. */
static void nk_skl_screen_few_docs(unsigned doc_rows, unsigned query_rows, uint32_t const *split, uint64_t groups,
                                   uint8_t const *doc, int first, int last, int32_t *partial, float *out,
                                   nk_skl_query_rows_t const *qr, nk_skl_doc_tile_t const *tile, float *lower) {
    uint64_t const stride = 4u * doc_rows;
    __m512i const even_bytes = _mm512_set1_epi32(0x00FF00FF);
    __m512 lower_by_row = _mm512_set1_ps(-INFINITY);
    for (unsigned m0 = 0; m0 < doc_rows; m0 += 4) {
        __m512i acc[4];
        unsigned lane[4];
        for (unsigned m = 0; m < 4; ++m) {
            lane[m] = m0 + m < doc_rows ? m0 + m : doc_rows - 1;
            acc[m] = first ? _mm512_loadu_si512((void const *)qr->negative_bias)
                           : _mm512_loadu_si512((void const *)(partial + (m0 + m) * NK_SKL_TILE));
        }
        for (uint64_t g = 0; g < groups; ++g) {
            __m512i q_even = _mm512_load_si512((void const *)(split + g * 2 * NK_SKL_TILE));
            __m512i q_odd = _mm512_load_si512((void const *)(split + g * 2 * NK_SKL_TILE + NK_SKL_TILE));
            uint8_t const *group = doc + g * stride;
            for (unsigned m = 0; m < 4; ++m) {
                uint32_t bits;
                memcpy(&bits, group + 4u * lane[m], 4);
                __m512i d_bytes = _mm512_set1_epi32((int)bits);
                acc[m] = _mm512_add_epi32(acc[m], _mm512_madd_epi16(q_even, _mm512_and_si512(d_bytes, even_bytes)));
                acc[m] = _mm512_add_epi32(acc[m], _mm512_madd_epi16(q_odd, _mm512_srli_epi16(d_bytes, 8)));
            }
        }
        for (unsigned m = 0; m < 4 && m0 + m < doc_rows; ++m) {
            unsigned j = m0 + m;
            if (!last) {
                _mm512_storeu_si512((void *)(partial + j * NK_SKL_TILE), acc[m]);
                continue;
            }
            /* Same arithmetic as nk_skl_screen_rows, with rows in the lanes. */
            __m512i doc_bias = _mm512_set1_epi32((int32_t)((uint32_t)tile->sums[j] * 128u));
            __m512 dot = _mm512_cvtepi32_ps(_mm512_sub_epi32(acc[m], doc_bias));
            __m512 scale = _mm512_mul_ps(_mm512_loadu_ps(qr->scale), _mm512_set1_ps(tile->scales[j]));
            __m512 margin = _mm512_fmadd_ps(_mm512_loadu_ps(qr->growth), _mm512_set1_ps(tile->errors[j]),
                                            _mm512_loadu_ps(qr->slack));
            _Alignas(64) float upper_by_row[NK_SKL_TILE];
            _mm512_store_ps(upper_by_row, _mm512_fmadd_ps(dot, scale, margin));
            lower_by_row = _mm512_max_ps(lower_by_row, _mm512_fmsub_ps(dot, scale, margin));
            for (unsigned r = 0; r < query_rows; ++r) out[r * NK_SKL_BLOCK_ROWS + j] = upper_by_row[r];
        }
    }
    if (!last) return;
    /* Any lane of a row's running maximum will do: fold this tile's into lane 0. */
    _Alignas(64) float best_by_row[NK_SKL_TILE];
    _mm512_store_ps(best_by_row, lower_by_row);
    for (unsigned r = 0; r < query_rows; ++r)
        if (best_by_row[r] > lower[r * NK_SKL_TILE]) lower[r * NK_SKL_TILE] = best_by_row[r];
}

/* Split the query tile's 4-byte groups [g0, g0 + groups) into even and odd 16-bit words. */
static void nk_skl_split_queries(uint8_t const *tile, uint64_t stride, __mmask64 mask, uint64_t g0, uint64_t groups,
                                 uint32_t *split) {
    __m512i const even_bytes = _mm512_set1_epi32(0x00FF00FF);
    for (uint64_t g = 0; g < groups; ++g) {
        __m512i bytes = _mm512_maskz_loadu_epi8(mask, tile + (g0 + g) * stride);
        _mm512_store_si512((void *)(split + g * 2 * NK_SKL_TILE), _mm512_and_si512(bytes, even_bytes));
        _mm512_store_si512((void *)(split + g * 2 * NK_SKL_TILE + NK_SKL_TILE), _mm512_srli_epi16(bytes, 8));
    }
}

/* Candidates of one query row, kept across document blocks so that the best lower bound of all
 * blocks prunes them, and visited best upper bound first (the likely winner raises the threshold
 * before the others are looked at). A full list is rescored early, so the size stays fixed. */
typedef struct nk_skl_pending {
    uint64_t doc[NK_SKL_PENDING_MAX];
    float upper[NK_SKL_PENDING_MAX];
    unsigned count;
    float threshold; /* max(best lower bound so far, best exact cosine rounded down) */
    double best;     /* best exact cosine so far */
} nk_skl_pending_t;

static void nk_skl_sort_pending(nk_skl_pending_t *p) {
    for (unsigned n = 1; n < p->count; ++n) { /* insertion sort, descending: lists are short */
        float key = p->upper[n];
        uint64_t doc = p->doc[n];
        unsigned m = n;
        for (; m > 0 && p->upper[m - 1] < key; --m) p->upper[m] = p->upper[m - 1], p->doc[m] = p->doc[m - 1];
        p->upper[m] = key, p->doc[m] = doc;
    }
}

/* Rescore a sorted list until no remaining candidate can reach the threshold; empties it. */
static void nk_skl_rescore_pending(nk_maxsim_view_t const *q, nk_maxsim_view_t const *d, uint64_t row_bytes,
                                   uint64_t i, double inv_q, nk_skl_pending_t *p) {
    for (unsigned n = 0; n < p->count && p->upper[n] >= p->threshold; ++n) {
        double cos = nk_skl_cosine(q, d, row_bytes, i, inv_q, p->doc[n]);
        if (cos > p->best) {
            p->best = cos;
            float raised = nk_f32_at_most(cos);
            if (raised > p->threshold) p->threshold = raised;
        }
    }
    p->count = 0;
}

/* Append the documents of one block whose upper bound reaches the row's threshold. Four tiles
 * are compared per branch: most rows have no candidate in most tiles. */
static void nk_skl_gather(nk_maxsim_view_t const *q, nk_maxsim_view_t const *d, uint64_t row_bytes, uint64_t i,
                          double inv_q, uint64_t block_start, uint64_t block_rows, float const *upper, __m512 lower,
                          nk_skl_pending_t *p) {
    float block_lower = _mm512_reduce_max_ps(lower);
    if (block_lower > p->threshold) p->threshold = block_lower;
    __m512 const limit = _mm512_set1_ps(p->threshold);
    for (uint64_t t0 = 0; t0 < block_rows; t0 += 4 * NK_SKL_TILE) {
        uint64_t hits = 0;
        for (unsigned t = 0; t < 4; ++t) {
            uint64_t first = t0 + t * NK_SKL_TILE;
            __mmask16 valid = first >= block_rows ? 0
                              : block_rows - first < NK_SKL_TILE ? nk_skl_mask16(block_rows - first)
                                                                 : (__mmask16)0xFFFF;
            __m512 bounds = _mm512_maskz_loadu_ps(valid, upper + first);
            uint64_t tile_hits = _mm512_mask_cmp_ps_mask(valid, bounds, limit, _CMP_GE_OQ);
            hits |= tile_hits << (t * NK_SKL_TILE);
        }
        while (hits) {
            uint64_t j = t0 + (uint64_t)nk_ctz64(hits);
            hits &= hits - 1;
            if (p->count == NK_SKL_PENDING_MAX) {
                nk_skl_sort_pending(p);
                nk_skl_rescore_pending(q, d, row_bytes, i, inv_q, p);
            }
            if (upper[j] < p->threshold) continue; /* raised by an early rescoring */
            p->doc[p->count] = block_start + j;
            p->upper[p->count++] = upper[j];
        }
    }
}

double nk_maxsim_skylake(nk_maxsim_view_t const *q, nk_maxsim_view_t const *d) {
    uint64_t const row_bytes = q->row_bytes;

    uint64_t const screen_depth = q->screen_depth, groups = screen_depth / 4;
    uint64_t const chunks = (groups + NK_SKL_CHUNK_GROUPS - 1) / NK_SKL_CHUNK_GROUPS;
    _Alignas(64) uint32_t split[NK_SKL_CHUNK_GROUPS * 2 * NK_SKL_TILE];  /* 16 KB */
    _Alignas(64) float upper[NK_SKL_TILE * NK_SKL_BLOCK_ROWS];           /* 16 KB */
    _Alignas(64) float lower[NK_SKL_TILE * NK_SKL_TILE];                 /* 1 KB: 16 lanes per row */
    nk_skl_pending_t pending[NK_SKL_TILE];                               /* 6.5 KB */
    _Alignas(64) int32_t few_partial[NK_SKL_TILE * NK_SKL_TILE];         /* 1 KB */
    nk_skl_query_rows_t qr;
    double total = 0.0;

    for (uint64_t q0 = 0; q0 < q->vectors; q0 += NK_SKL_TILE) {
        uint64_t left = q->vectors - q0;
        unsigned query_rows = left < NK_SKL_TILE ? (unsigned)left : NK_SKL_TILE;
        uint8_t const *q_tile = q->screen + q0 * screen_depth;
        uint64_t q_stride = 4u * query_rows;
        __mmask64 q_mask = query_rows == NK_SKL_TILE ? ~(__mmask64)0 : (((__mmask64)1 << q_stride) - 1);
        uint32_t bias_depth = (uint32_t)screen_depth * 16384u;
        /* Vector op counts per 4-depth group for the last document tile: a few documents against
         * all rows, or all rows (in 16/8/4/2/1 blocks) against a full tile. */
        unsigned tail_rows = (unsigned)(d->vectors % NK_SKL_TILE);
        unsigned few_docs_cost = 24u * ((tail_rows + 3u) / 4u);
        unsigned row_blocks_cost = 4u * query_rows + 2u * nk_popcount32(query_rows);
        int use_few_docs = tail_rows != 0 && few_docs_cost < row_blocks_cost;
        memset(&qr, 0, sizeof(qr)); /* rows past the tile stay zero in the few-documents lanes */
        for (unsigned r = 0; r < query_rows; ++r) {
            float error = q->screen_errors[q0 + r];
            qr.scale[r] = q->screen_scales[q0 + r];
            qr.slack[r] = error + nk_screen_slack_k;
            qr.growth[r] = 1.0f + error;
            qr.negative_bias[r] = (int32_t)(0u - ((uint32_t)q->screen_sums[q0 + r] * 128u + bias_depth));
            pending[r].count = 0;
            pending[r].threshold = -FLT_MAX;
            pending[r].best = -2.0;
        }
        if (chunks == 1) nk_skl_split_queries(q_tile, q_stride, q_mask, 0, groups, split);

        for (uint64_t block_start = 0; block_start < d->vectors; block_start += NK_SKL_BLOCK_ROWS) {
            uint64_t block_rows = d->vectors - block_start;
            if (block_rows > NK_SKL_BLOCK_ROWS) block_rows = NK_SKL_BLOCK_ROWS;
            unsigned block_tiles = (unsigned)((block_rows + NK_SKL_TILE - 1) / NK_SKL_TILE);
            for (unsigned r = 0; r < query_rows; ++r)
                _mm512_store_ps(lower + r * NK_SKL_TILE, _mm512_set1_ps(-INFINITY));

            for (uint64_t chunk = 0; chunk < chunks; ++chunk) {
                uint64_t g0 = chunk * NK_SKL_CHUNK_GROUPS, chunk_groups = groups - g0;
                if (chunk_groups > NK_SKL_CHUNK_GROUPS) chunk_groups = NK_SKL_CHUNK_GROUPS;
                if (chunks > 1) nk_skl_split_queries(q_tile, q_stride, q_mask, g0, chunk_groups, split);
                int first = chunk == 0, last = chunk + 1 == chunks;
                for (unsigned t = 0; t < block_tiles; ++t) {
                    uint64_t d0 = block_start + (uint64_t)t * NK_SKL_TILE, tile_left = d->vectors - d0;
                    unsigned doc_rows = tile_left < NK_SKL_TILE ? (unsigned)tile_left : NK_SKL_TILE;
                    uint64_t doc_stride = 4u * doc_rows;
                    __mmask64 doc_mask = doc_rows == NK_SKL_TILE ? ~(__mmask64)0 : (((__mmask64)1 << doc_stride) - 1);
                    nk_skl_doc_tile_t tile;
                    tile.valid = nk_skl_mask16(doc_rows);
                    tile.scales = d->screen_scales + d0;
                    tile.errors = d->screen_errors + d0;
                    tile.sums = d->screen_sums + d0;
                    uint8_t const *doc = d->screen + d0 * screen_depth + g0 * doc_stride;
                    if (use_few_docs && doc_rows < NK_SKL_TILE)
                        nk_skl_screen_few_docs(doc_rows, query_rows, split, chunk_groups, doc, first, last, few_partial,
                                               upper + t * NK_SKL_TILE, &qr, &tile, lower);
                    else
                        nk_skl_screen_tile(query_rows, split, chunk_groups, doc, doc_stride, doc_mask, first, last,
                                           upper + t * NK_SKL_TILE, &qr, &tile, lower);
                }
            }

            for (unsigned r = 0; r < query_rows; ++r) {
                double inv_q = q->inv_norms[q0 + r];
                if (inv_q == 0.0) continue;
                nk_skl_gather(q, d, row_bytes, q0 + r, inv_q, block_start, block_rows, upper + r * NK_SKL_BLOCK_ROWS,
                              _mm512_load_ps(lower + r * NK_SKL_TILE), &pending[r]);
            }
        }

        for (unsigned r = 0; r < query_rows; ++r) {
            double inv_q = q->inv_norms[q0 + r];
            if (inv_q != 0.0) {
                nk_skl_sort_pending(&pending[r]);
                nk_skl_rescore_pending(q, d, row_bytes, q0 + r, inv_q, &pending[r]);
            }
            total += nk_row_distance(inv_q, pending[r].best);
        }
    }
    return total;
}
