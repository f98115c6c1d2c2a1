/* The certified MaxSim algorithm, written once for every SIMD family.
 *
 * A family source file defines the primitives below and then includes this header, which defines
 * `static double nk_driver_maxsim(q, d)`: the family's kernel returns it. Everything is static and
 * inlined into the family's translation unit, so the family's -m flags apply throughout.
 *
 * The algorithm (the bound is explained in maxsim_internal.h). Query rows go in groups of
 * NK_DRIVER_ROWS, documents in blocks of NK_DRIVER_BLOCK. For each group and block:
 *   1. screen: the family's int8 GEMM over the screening copies gives, for every (row r, document j),
 *      u[r][j] = p_j + b_r e_j, where p_j = (int8 dot) * s_d[j], b_r = (1 + e_q) / s_q and e the
 *      screening errors; the upper bound on the cosine is then UB = s_q u + a_r with a_r = e_q + slack.
 *      It also names, per row, a document whose u is (nearly) the row's largest.
 *   2. tops: every row's named document is rescored exactly, one batch of independent float64 dot
 *      products, so the row has an exact cosine (usually its winner) before anything else.
 *   3. scan: the documents whose u reaches the row's cut, cut = (best exact cosine - a_r) / s_q
 *      rounded down, are collected; usually none.
 *   4. rounds: a row whose best rose first drops, with a float32 cosine and its proven error bound,
 *      every candidate provably below it (families with such checks); then each row's largest
 *      remaining u is rescored, one batch per round, until no candidate reaches its cut.
 *   5. A row whose candidate list filled up continues its scan and rescores one candidate at a time.
 * The result, sum over rows of max(0, 1 - best), adds rows in order, and every exact cosine is
 * (canonical float64 dot) * inv_q * inv_d, so all families return the same bits. A pair with few
 * documents per query row skips all this: every (row, document) pair is rescored (nk_driver_all_pairs).
 *
 * The family defines (types and functions may be macros):
 *   NK_DRIVER_ROWS       query rows per group (1..32)
 *   NK_DRIVER_BLOCK      documents per block (a multiple of 64)
 *   NK_DRIVER_STRIDE     optional: floats from one row of u to the next (a multiple of 16, at least
 *                        NK_DRIVER_BLOCK; default NK_DRIVER_BLOCK). A family whose screening stores
 *                        u a column at a time pads it so that the rows do not share cache sets.
 *   nk_family_stride(docs)  optional: the stride for a block of `docs` documents instead (a multiple
 *                        of 16, at least docs, at most NK_DRIVER_STRIDE), so that a small block's
 *                        rows of u lie close together.
 *   nk_family_query_t    the family's prepared form of one group's screening bytes
 *   void nk_family_prepare(nk_maxsim_view_t const *q, nk_maxsim_view_t const *d, uint64_t first,
 *                          uint64_t rows, nk_family_query_t *query)
 *       Before a group's blocks. Rows past `rows` must screen as zeros.
 *   void nk_family_screen(nk_family_query_t *query, float const *growth, uint64_t rows,
 *                         nk_maxsim_view_t const *d, uint64_t first_doc, uint64_t docs, float *u, int32_t *top,
 *                         nk_prefetch_stream_t *prefetch)
 *       Step 1 for documents [first_doc, first_doc + docs) (first_doc a multiple of NK_DRIVER_BLOCK):
 *       u[r * stride + j] (stride = nk_family_stride(docs)) for r < rows, j < docs, with
 *       b_r = growth[r] (NK_DRIVER_ROWS entries, all set, kept until the group ends), and -inf for
 *       docs <= j < docs rounded up to 16; top[r] in [0, docs), or -1 when the row has no finite u,
 *       naming a u at most 2^-16 |u| below the row's largest (what tagging a u's low 6 mantissa bits
 *       with its tile loses); the driver bounds the row from it.
 *       The family may use u as scratch until it returns. Its screening loop takes a line of
 *       `prefetch` (the next document) per step.
 *   The compares of step 3, over 16-document tiles of one row's u (64-byte aligned):
 *   nk_family_cut_t nk_family_cut(float cut)                     the cut, broadcast
 *   int nk_family_any_hit4(float const *tile_u, nk_family_cut_t cut)
 *       Whether any u of the 4 tiles from tile_u reaches the cut (the usual answer: no).
 *   uint64_t nk_family_hit_bits(float const *tile_u, nk_family_cut_t cut)
 *       Bit NK_FAMILY_BITS_PER_DOC * l set when u[l] >= cut, no other bits.
 *   and optionally nk_family_collect(tile_u, bits, first_doc, list_u, list_doc, count), appending
 *       the hits (at most 16) to the lists, where the family has a faster way than one at a time.
 *   void nk_family_dot_batch(int dtype, void const *const *a, void const *const *b, unsigned n,
 *                            uint64_t depth, double *out)
 *       n canonical exact dot products of stored rows (maxsim_internal.h).
 *   NK_FAMILY_F32_CHECKS and, if 1, double nk_family_cosine_f32(int dtype, void const *a,
 *       void const *b, uint64_t depth, double inv_q, double inv_d, double *slack)
 *       A float32 cosine and a bound on its distance from the exact one (+inf when none).
 *   optionally void nk_family_group_constants(q, first, rows, unsigned group_rows, uint32_t *live,
 *       double *inv_scale, double *offset, float *growth): nk_driver_group_init's per-row constants
 *       for group_rows (a multiple of 8) rows, with the same bits as its scalar loop.
 *   NK_FAMILY_DECODE and, if 1, nk_family_decode_row(dtype, row, depth, double *out) and
 *       double nk_family_dot_decoded(dtype, double const *a, void const *b, depth): a query row
 *       decoded once to float64 for many candidates (same bits as the stored dot product).
 *
 * Stack: NK_DRIVER_ROWS x NK_DRIVER_STRIDE floats of u, plus candidate lists and a decoded row.
 */
#ifndef NUMKONG_DRIVER_H
#define NUMKONG_DRIVER_H

#include <math.h>

#include "maxsim_internal.h"

#ifndef NK_DRIVER_STRIDE
#define NK_DRIVER_STRIDE NK_DRIVER_BLOCK
#endif
#ifndef nk_family_stride
#define nk_family_stride(docs) ((void)(docs), (uint64_t)NK_DRIVER_STRIDE)
#endif
#ifndef NK_FAMILY_F32_CHECKS
#define NK_FAMILY_F32_CHECKS 0
#endif
#ifndef NK_FAMILY_DECODE
#define NK_FAMILY_DECODE 0
#endif

#define NK_DRIVER_LIST 128u           /* candidates collected per row before they are rescored */
#define NK_DRIVER_DECODED_DEPTH 1024u /* deepest query row decoded to float64 on the stack (8 KB) */
#define NK_DRIVER_PREFETCH_BYTES 1024u /* leading bytes of a candidate row fetched ahead of its rescoring */

/* Per group: the constants of the bound and what the rows have found. */
typedef struct nk_driver_group {
    uint64_t first, rows;           /* query rows [first, first + rows) */
    uint32_t live;                  /* rows with a nonzero norm (bit r) */
    float growth[NK_DRIVER_ROWS];   /* b = (1 + e_q) / s_q */
    double inv_scale[NK_DRIVER_ROWS]; /* 1 / s_q */
    double offset[NK_DRIVER_ROWS];  /* a = e_q + slack */
    double best[NK_DRIVER_ROWS];    /* best exact cosine so far */
    double threshold[NK_DRIVER_ROWS]; /* a proven lower bound on the best cosine */
    float cut[NK_DRIVER_ROWS];      /* candidates need u >= cut; never below -FLT_MAX */
} nk_driver_group_t;

_Static_assert(NK_DRIVER_ROWS >= 1 && NK_DRIVER_ROWS <= 32, "a group is 1..32 query rows");
#ifdef nk_family_group_constants
_Static_assert(NK_DRIVER_ROWS % 8 == 0, "nk_family_group_constants fills whole 8-row steps");
#endif
_Static_assert(NK_DRIVER_BLOCK % 64 == 0, "blocks are whole 64-document steps");
_Static_assert(NK_DRIVER_STRIDE % 16 == 0 && NK_DRIVER_STRIDE >= NK_DRIVER_BLOCK, "rows of u are whole tiles apart");

static void nk_driver_group_init(nk_maxsim_view_t const *q, uint64_t first, uint64_t rows, nk_driver_group_t *g) {
    g->first = first, g->rows = rows;
#ifdef nk_family_group_constants
    nk_family_group_constants(q, first, rows, NK_DRIVER_ROWS, &g->live, g->inv_scale, g->offset, g->growth);
    for (unsigned r = 0; r < NK_DRIVER_ROWS; ++r) g->best[r] = -INFINITY;
#else
    double error[NK_DRIVER_ROWS], scale[NK_DRIVER_ROWS];
    g->live = 0;
    for (unsigned r = 0; r < NK_DRIVER_ROWS; ++r) error[r] = 0.0, scale[r] = 1.0;
    for (unsigned r = 0; r < rows; ++r)
        if (q->inv_norms[first + r] != 0.0) {
            g->live |= 1u << r;
            error[r] = q->screen_errors[first + r];
            scale[r] = q->screen_scales[first + r];
        }
    /* Branch-free over the whole group, so that the divisions vectorize. */
    for (unsigned r = 0; r < NK_DRIVER_ROWS; ++r) {
        double s = scale[r] > 0.0 ? scale[r] : 0x1p-126; /* never for a packed nonzero row; keeps b finite */
        g->inv_scale[r] = 1.0 / s;
        g->offset[r] = error[r] + (double)nk_screen_slack_k;
        /* One division per row: the product's rounding (2^-53 relative) is far inside the slack. */
        g->growth[r] = (float)((1.0 + error[r]) * g->inv_scale[r]);
        g->best[r] = -INFINITY;
    }
#endif
}

/* Row r's threshold rises to `lower` (a proven lower bound on its best cosine) if that is higher,
 * and its cut on u follows: (threshold - a) / s_q, rounded down. */
static inline void nk_driver_raise(nk_driver_group_t *g, unsigned r, double lower) {
    if (lower > g->threshold[r]) {
        g->threshold[r] = lower;
        g->cut[r] = nk_threshold_floor(nk_f32_at_most((lower - g->offset[r]) * g->inv_scale[r]));
    }
}

/* An exact cosine of row r raises its best, threshold and cut. */
static inline void nk_driver_take(nk_driver_group_t *g, unsigned r, double cos) {
    if (cos > g->best[r]) g->best[r] = cos;
    nk_driver_raise(g, r, cos);
}

/* An upper bound on a row's largest u from the u of the top the family named, which may be up to
 * 2^-16 |u| below it (nk_family_screen): twice that, and a little more near zero. */
static inline double nk_driver_largest_u(float named) {
    double largest = named;
    return largest + (fabs(largest) * 0x1p-15 + 0x1p-120);
}

static inline void nk_driver_prefetch_row(void const *row, size_t row_bytes) {
    size_t bytes = row_bytes < NK_DRIVER_PREFETCH_BYTES ? row_bytes : NK_DRIVER_PREFETCH_BYTES;
    for (size_t line = 0; line < bytes; line += 64) nk_prefetch_l1((char const *)row + line);
}

/* Up to one (row, document) pair per row, rescored together: independent work for the core. */
typedef struct nk_driver_batch {
    void const *q_rows[NK_DRIVER_ROWS], *d_rows[NK_DRIVER_ROWS];
    uint64_t docs[NK_DRIVER_ROWS];
    unsigned which[NK_DRIVER_ROWS];
    unsigned n;
} nk_driver_batch_t;

static inline void nk_driver_batch_add(nk_driver_batch_t *batch, nk_maxsim_view_t const *q, nk_maxsim_view_t const *d,
                                       nk_driver_group_t const *g, unsigned r, uint64_t doc) {
    unsigned k = batch->n++;
    batch->q_rows[k] = (char const *)q->values + (g->first + r) * q->row_bytes;
    batch->d_rows[k] = (char const *)d->values + doc * d->row_bytes;
    batch->docs[k] = doc;
    batch->which[k] = r;
}

/* Exact cosines of the queued pairs (a zero document row has cosine 0), each taken into its row. */
NK_INLINE void nk_driver_rescore(nk_maxsim_view_t const *q, nk_maxsim_view_t const *d, nk_driver_group_t *g,
                              nk_driver_batch_t const *batch) {
    double dots[NK_DRIVER_ROWS];
    if (!batch->n) return;
    nk_family_dot_batch((int)q->dtype, batch->q_rows, batch->d_rows, batch->n, q->depth, dots);
    for (unsigned k = 0; k < batch->n; ++k) {
        unsigned r = batch->which[k];
        double inv_d = d->inv_norms[batch->docs[k]];
        nk_driver_take(g, r, nk_exact_cosine(dots[k], q->inv_norms[g->first + r], inv_d));
    }
}

/* Index of the largest of count >= 1 values. A plain loop: these lists are short. */
static inline unsigned nk_driver_top(float const *values, unsigned count) {
    unsigned top = 0;
    for (unsigned c = 1; c < count; ++c)
        if (values[c] > values[top]) top = c;
    return top;
}

/* Candidate lists of a group's rows within one block. */
typedef struct nk_driver_lists {
    float u[NK_DRIVER_ROWS][NK_DRIVER_LIST];
    int32_t doc[NK_DRIVER_ROWS][NK_DRIVER_LIST];
    unsigned count[NK_DRIVER_ROWS];
    uint64_t next_tile[NK_DRIVER_ROWS]; /* where a scan stopped on a full list */
} nk_driver_lists_t;

/* Remove entry c of row r's list (the last one takes its place). */
static inline void nk_driver_remove(nk_driver_lists_t *lists, unsigned r, unsigned c) {
    unsigned last = --lists->count[r];
    lists->u[r][c] = lists->u[r][last];
    lists->doc[r][c] = lists->doc[r][last];
}

#if NK_FAMILY_F32_CHECKS
/* Drop the candidates of row r that a float32 cosine proves to be below its best exact cosine. */
static void nk_driver_check(nk_maxsim_view_t const *q, nk_maxsim_view_t const *d, nk_driver_group_t const *g,
                            nk_driver_lists_t *lists, unsigned r, uint64_t first_doc) {
    void const *q_row = (char const *)q->values + (g->first + r) * q->row_bytes;
    double inv_q = q->inv_norms[g->first + r], best = g->best[r];
    for (unsigned c = 0; c < lists->count[r];) {
        uint64_t doc = first_doc + (uint64_t)lists->doc[r][c];
        double inv_d = d->inv_norms[doc], slack;
        if (lists->u[r][c] >= g->cut[r] && inv_d != 0.0 &&
            nk_family_cosine_f32((int)q->dtype, q_row, (char const *)d->values + doc * d->row_bytes, q->depth, inv_q,
                                 inv_d, &slack) + slack < best) {
            nk_driver_remove(lists, r, c);
            continue;
        }
        ++c;
    }
}
#endif

/* Rescore row r's listed candidates one at a time, the largest u first, until none reaches the cut
 * (a row whose full list stopped its scan). `decoded` is its query row in float64, or NULL. */
static void nk_driver_drain(nk_maxsim_view_t const *q, nk_maxsim_view_t const *d, nk_driver_group_t *g,
                            nk_driver_lists_t *lists, unsigned r, uint64_t first_doc, double const *decoded) {
    void const *q_row = (char const *)q->values + (g->first + r) * q->row_bytes;
    double inv_q = q->inv_norms[g->first + r];
    while (lists->count[r]) {
        unsigned top = nk_driver_top(lists->u[r], lists->count[r]);
        if (!(lists->u[r][top] >= g->cut[r])) break;
        uint64_t doc = first_doc + (uint64_t)lists->doc[r][top];
        nk_driver_remove(lists, r, top);
        double dot;
        void const *d_row = (char const *)d->values + doc * d->row_bytes;
#if NK_FAMILY_DECODE
        if (decoded) dot = nk_family_dot_decoded((int)q->dtype, decoded, d_row, q->depth);
        else
#endif
            nk_family_dot_batch((int)q->dtype, &q_row, &d_row, 1, q->depth, &dot);
        nk_driver_take(g, r, nk_exact_cosine(dot, inv_q, d->inv_norms[doc]));
    }
    lists->count[r] = 0;
    (void)decoded;
}

/* ---- Step 3's scan, over the family's compares. ---- */

#ifndef nk_family_collect
/* Append the documents of one tile whose bit is set (the rare case: a plain loop). */
NK_INLINE unsigned nk_driver_collect(float const *tile_u, uint64_t bits, uint64_t first_doc, float *list_u,
                                     int32_t *list_doc, unsigned count) {
    for (; bits; bits &= bits - 1, ++count) {
        unsigned lane = nk_ctz64(bits) / NK_FAMILY_BITS_PER_DOC;
        list_u[count] = tile_u[lane], list_doc[count] = (int32_t)(first_doc + lane);
    }
    return count;
}
#define nk_family_collect nk_driver_collect
#endif

/* Append the documents of tiles [*tile, tiles) whose u reaches the cut until fewer than 16 free
 * entries remain; *tile is left where the scan stopped (tiles when it finished). Four tiles per
 * test keep the usual no-candidate case to one branch; a hit compares its tiles again rather than
 * keep 4 vectors live. */
NK_INLINE unsigned nk_driver_scan(float const *row_u, uint64_t *tile, uint64_t tiles, float cut, float *list_u,
                                  int32_t *list_doc, unsigned capacity) {
    nk_family_cut_t limit = nk_family_cut(cut);
    unsigned count = 0;
    uint64_t t = *tile;
    /* The common path walks one pointer: with a tile counter too, GCC kept the counters of this loop
     * on the stack inside nk_driver_maxsim (sapphireamx 32x2048x128: the scan was 60% of the driver). */
    float const *at = row_u + NK_SCREEN_TILE * t, *quads_end = at + NK_SCREEN_TILE * ((tiles - t) & ~(uint64_t)3);
    for (; at < quads_end; at += 4 * NK_SCREEN_TILE) {
        if (!nk_family_any_hit4(at, limit)) continue;
        for (uint64_t v = (uint64_t)(at - row_u) / NK_SCREEN_TILE, end = v + 4; v < end; ++v) {
            uint64_t bits = nk_family_hit_bits(row_u + NK_SCREEN_TILE * v, limit);
            if (!bits) continue;
            if (count + NK_SCREEN_TILE > capacity) {
                *tile = v;
                return count;
            }
            count = nk_family_collect(row_u + NK_SCREEN_TILE * v, bits, NK_SCREEN_TILE * v, list_u, list_doc, count);
        }
    }
    for (t = (uint64_t)(at - row_u) / NK_SCREEN_TILE; t < tiles; ++t) {
        uint64_t bits = nk_family_hit_bits(row_u + NK_SCREEN_TILE * t, limit);
        if (!bits) continue;
        if (count + NK_SCREEN_TILE > capacity) break;
        count = nk_family_collect(row_u + NK_SCREEN_TILE * t, bits, NK_SCREEN_TILE * t, list_u, list_doc, count);
    }
    *tile = t;
    return count;
}

/* Steps 2-5 for one screened block. */
static void nk_driver_candidates(nk_maxsim_view_t const *q, nk_maxsim_view_t const *d, nk_driver_group_t *g,
                                 uint64_t first_doc, uint64_t docs, float *u, int32_t const *top,
                                 nk_driver_lists_t *lists, double *decoded_row) {
    uint64_t tiles = (docs + NK_SCREEN_TILE - 1) / NK_SCREEN_TILE, stride = nk_family_stride(docs);
    nk_driver_batch_t batch;
    batch.n = 0;
    /* Step 2: each row's named top first, from a threshold of its best exact cosine so far. A row
     * whose largest u (nk_driver_largest_u) is below its cut has nothing to collect, and step 3
     * skips it: in a block after the first, that is most rows. */
    uint32_t scan = 0; /* bit r: step 3 scans row r */
    for (unsigned r = 0; r < g->rows; ++r) {
        g->threshold[r] = -INFINITY, g->cut[r] = -FLT_MAX;
        nk_driver_raise(g, r, g->best[r]);
        lists->count[r] = 0, lists->next_tile[r] = tiles;
        if (!(g->live >> r & 1)) continue;
        if (top[r] < 0 || (uint64_t)top[r] >= docs) { /* no finite top named: scan it all */
            scan |= 1u << r;
            continue;
        }
        float *at = u + (uint64_t)r * stride + (uint64_t)top[r];
        if (!(*at >= g->cut[r])) {
            if (!(nk_driver_largest_u(*at) < (double)g->cut[r])) scan |= 1u << r;
            continue;
        }
        scan |= 1u << r;
        *at = -INFINITY; /* the scan must not collect it again */
        nk_driver_batch_add(&batch, q, d, g, r, first_doc + (uint64_t)top[r]);
        if (d->cold) nk_driver_prefetch_row(batch.d_rows[batch.n - 1], d->row_bytes);
    }
    nk_driver_rescore(q, d, g, &batch);
    /* Step 3: collect; in a corpus (not in cache) prefetch each row's likeliest candidate, so the
     * misses of a whole group overlap. */
    unsigned active[NK_DRIVER_ROWS], live = 0;
    double checked_against[NK_DRIVER_ROWS];
    for (unsigned r = 0; r < g->rows; ++r) {
        checked_against[r] = -INFINITY;
        if (!(scan >> r & 1)) continue;
        lists->next_tile[r] = 0;
        lists->count[r] = nk_driver_scan(u + (uint64_t)r * stride, &lists->next_tile[r], tiles, g->cut[r],
                                         lists->u[r], lists->doc[r], NK_DRIVER_LIST);
        if (!lists->count[r]) continue;
        active[live++] = r;
        if (d->cold) {
            unsigned c = nk_driver_top(lists->u[r], lists->count[r]);
            nk_driver_prefetch_row((char const *)d->values + (first_doc + (uint64_t)lists->doc[r][c]) * d->row_bytes,
                                   d->row_bytes);
        }
    }
    /* Step 4: rounds over the rows with candidates left. */
    for (;;) {
#if NK_FAMILY_F32_CHECKS
        if (q->dtype != nk_dtype_float64_k) /* float64 does not fit float32 */
            for (unsigned a = 0; a < live; ++a) {
                unsigned r = active[a];
                if (!(g->best[r] > checked_against[r])) continue; /* nothing new to check against */
                checked_against[r] = g->best[r];
                nk_driver_check(q, d, g, lists, r, first_doc);
            }
#endif
        batch.n = 0;
        unsigned kept = 0;
        for (unsigned a = 0; a < live; ++a) {
            unsigned r = active[a];
            if (!lists->count[r]) continue;
            unsigned c = nk_driver_top(lists->u[r], lists->count[r]);
            if (!(lists->u[r][c] >= g->cut[r])) { /* nothing left can win */
                lists->count[r] = 0;
                continue;
            }
            nk_driver_batch_add(&batch, q, d, g, r, first_doc + (uint64_t)lists->doc[r][c]);
            nk_driver_remove(lists, r, c);
            if (lists->count[r]) active[kept++] = r;
        }
        live = kept;
        if (!batch.n) break;
        nk_driver_rescore(q, d, g, &batch);
    }
    (void)checked_against;
    /* Step 5: rows whose scan a full list stopped; their query row is decoded once. */
    for (unsigned r = 0; r < g->rows; ++r) {
        if (lists->next_tile[r] == tiles) continue;
        double const *decoded = NULL;
#if NK_FAMILY_DECODE
        void const *q_row = (char const *)q->values + (g->first + r) * q->row_bytes;
        if (q->dtype == nk_dtype_float64_k) decoded = (double const *)q_row;
        else if (q->depth <= NK_DRIVER_DECODED_DEPTH && !nk_dtype_is_exact_integer((int)q->dtype)) {
            nk_family_decode_row((int)q->dtype, q_row, q->depth, decoded_row);
            decoded = decoded_row;
        }
#endif
        while (lists->next_tile[r] < tiles) {
            lists->count[r] = nk_driver_scan(u + (uint64_t)r * stride, &lists->next_tile[r], tiles,
                                             g->cut[r], lists->u[r], lists->doc[r], NK_DRIVER_LIST);
            nk_driver_drain(q, d, g, lists, r, first_doc, decoded);
        }
    }
    (void)decoded_row;
}

/* A lower bound on row r's distance when `largest` bounds its u from above: its best cosine is at most
 * s_q largest + a; a zero row's distance is 1. */
static inline double nk_driver_row_bound(nk_driver_group_t const *g, unsigned r, double largest) {
    if (!(g->live >> r & 1)) return 1.0;
    double distance = 1.0 - (largest / g->inv_scale[r] + g->offset[r]) - 0x1p-40; /* rounding, generously */
    return distance > 0.0 ? distance : 0.0;
}

/* A lower bound on the distances of a group's rows from one block of screening bounds that covers all
 * `docs` documents: the margin of nk_driver_largest_u covers how far below the row's largest u its
 * named top may be; a row without a finite u bounds nothing. */
static double nk_driver_screened_bound(nk_driver_group_t const *g, uint64_t docs, float const *u, int32_t const *top) {
    uint64_t stride = nk_family_stride(docs);
    double bound = 0.0;
    for (unsigned r = 0; r < g->rows; ++r)
        bound += nk_driver_row_bound(
            g, r, top[r] < 0 ? INFINITY : nk_driver_largest_u(u[(uint64_t)r * stride + (uint64_t)top[r]]));
    return bound;
}

/* Top-k: screen every group of a document that fits one block, without rescoring anything, and add
 * up the screening bounds; a sum above q->stop_above proves the document out (it is returned). Most
 * documents of a top-k search end here, at the cost of the screening alone; the others are scored
 * exactly afterwards (0 is returned). */
static double nk_driver_bound_pass(nk_maxsim_view_t const *q, nk_maxsim_view_t const *d, float *u, int32_t *top,
                                   nk_family_query_t *query, nk_driver_group_t *group,
                                   nk_prefetch_stream_t *prefetch) {
    double bound = 0.0;
    for (uint64_t first = 0; first < q->vectors; first += NK_DRIVER_ROWS) {
        uint64_t rows = q->vectors - first < NK_DRIVER_ROWS ? q->vectors - first : NK_DRIVER_ROWS;
        nk_driver_group_init(q, first, rows, group);
        if (!group->live) {
            bound += (double)rows;
        }
        else {
            nk_family_prepare(q, d, first, rows, query);
            nk_family_screen(query, group->growth, rows, d, 0, d->vectors, u, top, prefetch);
            bound += nk_driver_screened_bound(group, d->vectors, u, top);
        }
        if (bound > q->stop_above) return bound;
    }
    return 0.0;
}

/* Up to this many (query row, document row) pairs, when few documents compete for each query row
 * ((documents - 1) x queries x depth <= 512 elements), every pair is scored exactly in one batch
 * without the screening, whose set-up costs more (icelake, bfloat16, in C: 1x1x1 0.11 -> 0.035 us,
 * 1x1x128 0.15 -> 0.052, 1x4x128 0.14 -> 0.11, 8x1x128 0.38 -> 0.22, 32x1x768 5.0 -> 3.8; the
 * screening stays ahead from 1x8x128 on: 0.18 against 0.21). */
#define NK_DRIVER_ALL_PAIRS 32u

static double nk_driver_all_pairs(nk_maxsim_view_t const *q, nk_maxsim_view_t const *d) {
    void const *q_rows[NK_DRIVER_ALL_PAIRS], *d_rows[NK_DRIVER_ALL_PAIRS];
    double dots[NK_DRIVER_ALL_PAIRS], total = 0.0;
    unsigned n = 0;
    for (uint64_t r = 0; r < q->vectors; ++r)
        for (uint64_t j = 0; j < d->vectors; ++j, ++n) {
            q_rows[n] = (char const *)q->values + r * q->row_bytes;
            d_rows[n] = (char const *)d->values + j * d->row_bytes;
        }
    nk_family_dot_batch((int)q->dtype, q_rows, d_rows, n, q->depth, dots);
    n = 0;
    for (uint64_t r = 0; r < q->vectors; ++r) {
        double inv_q = q->inv_norms[r], best = -INFINITY; /* a zero query row: nk_row_distance gives 1 */
        for (uint64_t j = 0; j < d->vectors; ++j, ++n) {
            double cos = nk_exact_cosine(dots[n], inv_q, d->inv_norms[j]);
            if (cos > best) best = cos;
        }
        total += nk_row_distance(inv_q, best);
    }
    return total;
}

static double nk_driver_maxsim(nk_maxsim_view_t const *q, nk_maxsim_view_t const *d) {
    if (q->vectors <= NK_DRIVER_ALL_PAIRS && d->vectors <= NK_DRIVER_ALL_PAIRS &&
        q->vectors * d->vectors <= NK_DRIVER_ALL_PAIRS && (d->vectors - 1) * q->vectors * q->depth <= 512)
        return nk_driver_all_pairs(q, d);
    _Alignas(64) float u[NK_DRIVER_ROWS * NK_DRIVER_STRIDE];
    _Alignas(64) double decoded_row[NK_DRIVER_DECODED_DEPTH];
    _Alignas(64) int32_t top[NK_DRIVER_ROWS];
    _Alignas(64) nk_family_query_t query;
    nk_driver_group_t group;
    nk_driver_lists_t lists;
    nk_prefetch_stream_t prefetch = d->next;
    double total = 0.0;
    if (q->stop_above < INFINITY && d->vectors <= NK_DRIVER_BLOCK) {
        double bound = nk_driver_bound_pass(q, d, u, top, &query, &group, &prefetch);
        if (bound > q->stop_above) return bound;
    }
    for (uint64_t first = 0; first < q->vectors; first += NK_DRIVER_ROWS) {
        uint64_t rows = q->vectors - first < NK_DRIVER_ROWS ? q->vectors - first : NK_DRIVER_ROWS;
        nk_driver_group_init(q, first, rows, &group);
        if (group.live) {
            nk_family_prepare(q, d, first, rows, &query);
            for (uint64_t first_doc = 0; first_doc < d->vectors; first_doc += NK_DRIVER_BLOCK) {
                uint64_t docs = d->vectors - first_doc < NK_DRIVER_BLOCK ? d->vectors - first_doc : NK_DRIVER_BLOCK;
                nk_family_screen(&query, group.growth, rows, d, first_doc, docs, u, top, &prefetch);
                nk_driver_candidates(q, d, &group, first_doc, docs, u, top, &lists, decoded_row);
            }
        }
        for (uint64_t r = 0; r < rows; ++r) total += nk_row_distance(q->inv_norms[first + r], group.best[r]);
        if (total > q->stop_above) return total; /* every row adds at least 0: a top-k caller needs no more */
    }
    return total;
}

#endif /* NUMKONG_DRIVER_H */
