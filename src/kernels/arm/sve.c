/* Arm SVE family, vector-length agnostic (any VL from 128 to 2048 bits).
 *
 * Certified screening, as in maxsim_internal.h: an int8 dot-product GEMM over the packed screening
 * copy estimates every cosine, the proven error bound turns each estimate into [LB, UB], and only
 * documents whose UB reaches the best LB (or the best exact cosine so far) are rescored exactly in
 * float64. The result is the exact MaxSim at int8 GEMM speed.
 *
 * Screening uses UDOT on the stored (biased, unsigned) bytes of both operands; the bias terms are
 * removed afterwards with the row sums in wrapping uint32 arithmetic (the true dot fits int32).
 * A document "column" is one vector's worth (or less) of a tile's 4n-byte depth group, so a tile
 * is 1 column at VL >= 512 and 4 at VL 128; predicates cover partial tiles and wide vectors.
 * Query rows are gathered into [group][row] words and replicated per 128-bit segment with LD1RQ,
 * so the indexed UDOT selects the same query row in every segment whatever the VL.
 * Exact rescoring is the Advanced SIMD code of arm_exact.h, shared with the neon family: its
 * float64 throughput matches SVE's on 128- and 256-bit cores.
 *
 * Work: groups of 8 query rows against blocks of up to 512 document rows; stack use is a 16 KB
 * score buffer, a 2 KB bound buffer, an 8 KB query buffer and a 2 KB column table.
 */
#include <arm_neon.h>
#include <arm_sve.h>
#include <math.h>

#include "neon_shared.h"
#include "maxsim_internal.h"

#define NK_SVE_ROWS 8u           /* query rows per group = accumulator rows of the micro-kernel */
#define NK_SVE_BLOCK_DOCS 512u   /* document rows per score block (a multiple of 16) */
#define NK_SVE_CHUNK_GROUPS 256u /* 4-byte depth groups per pass over the query buffer (depth 1024) */
#define NK_SVE_MAX_COLUMNS (NK_SVE_BLOCK_DOCS / 4u) /* at VL 128 a column holds 4 documents */


/* ---- Screening. ---- */

/* A column: `bytes` (<= VL/8) consecutive bytes of each depth group of one tile, starting at
 * screen byte `offset` for group 0, groups `stride` (= 4 x rows of the tile) bytes apart; its
 * first document is `first` within the block. */
typedef struct nk_sve_column {
    uint64_t offset;
    uint32_t stride, bytes, first;
} nk_sve_column_t;

/* Columns of documents [first_doc, first_doc + docs); first_doc is a multiple of 16. */
static unsigned nk_sve_columns(nk_maxsim_view_t const *d, uint64_t first_doc, uint64_t docs, nk_sve_column_t *columns) {
    uint32_t vector_bytes = (uint32_t)svcntb();
    unsigned count = 0;
    for (uint64_t start = 0; start < docs; start += NK_SCREEN_TILE) {
        uint32_t rows = (uint32_t)(docs - start < NK_SCREEN_TILE ? docs - start : NK_SCREEN_TILE), stride = 4 * rows;
        for (uint32_t byte = 0; byte < stride; byte += vector_bytes) {
            columns[count].offset = (first_doc + start) * d->screen_depth + byte;
            columns[count].stride = stride;
            columns[count].bytes = stride - byte < vector_bytes ? stride - byte : vector_bytes;
            columns[count].first = (uint32_t)start + byte / 4;
            ++count;
        }
    }
    return count;
}

/* scores[r * BLOCK + first + lane] (+)= biased dot of query row r with the documents of columns
 * a and b (b may be absent: its predicates are then all false and it touches no memory), over
 * depth groups [g0, g0 + groups). 8 x 2 accumulators + 4 operands: 20 of the 32 registers. */
NK_INLINE void nk_sve_screen_pair(uint8_t const *screen, nk_sve_column_t const *a, nk_sve_column_t const *b,
                                      uint64_t g0, uint64_t groups, uint8_t const *query, int accumulate,
                                      uint32_t *scores) {
    svbool_t load_a = svwhilelt_b8_u32(0, a->bytes), load_b = b ? svwhilelt_b8_u32(0, b->bytes) : svpfalse_b();
    svbool_t keep_a = svwhilelt_b32_u32(0, a->bytes / 4), keep_b = b ? svwhilelt_b32_u32(0, b->bytes / 4) : svpfalse_b();
    uint8_t const *doc_a = screen + a->offset + g0 * a->stride;
    uint8_t const *doc_b = b ? screen + b->offset + g0 * b->stride : doc_a;
    uint64_t stride_a = a->stride, stride_b = b ? b->stride : 0;
    uint32_t *out_a = scores + a->first, *out_b = b ? scores + b->first : out_a;
    svuint32_t zero = svdup_n_u32(0);
    /* Sizeless SVE types cannot live in arrays, hence the spelled-out rows. */
#define NK_SVE_INIT(r)                                                                                  \
    svuint32_t acc_a##r = accumulate ? svld1_u32(keep_a, out_a + r * NK_SVE_BLOCK_DOCS) : zero; \
    svuint32_t acc_b##r = accumulate ? svld1_u32(keep_b, out_b + r * NK_SVE_BLOCK_DOCS) : zero;
    NK_SVE_INIT(0)
    NK_SVE_INIT(1)
    NK_SVE_INIT(2)
    NK_SVE_INIT(3)
    NK_SVE_INIT(4)
    NK_SVE_INIT(5)
    NK_SVE_INIT(6)
    NK_SVE_INIT(7)
#undef NK_SVE_INIT
    svbool_t all = svptrue_b8();
    for (uint64_t g = 0; g < groups; ++g, doc_a += stride_a, doc_b += stride_b, query += 4 * NK_SVE_ROWS) {
        svuint8_t bytes_a = svld1_u8(load_a, doc_a), bytes_b = svld1_u8(load_b, doc_b);
        /* 4 query rows' words, replicated into every 128-bit segment. */
        svuint8_t rows_low = svld1rq_u8(all, query), rows_high = svld1rq_u8(all, query + 16);
#define NK_SVE_ROW(r, rows, lane)                                   \
    acc_a##r = svdot_lane_u32(acc_a##r, bytes_a, rows, lane); \
    acc_b##r = svdot_lane_u32(acc_b##r, bytes_b, rows, lane);
        NK_SVE_ROW(0, rows_low, 0)
        NK_SVE_ROW(1, rows_low, 1)
        NK_SVE_ROW(2, rows_low, 2)
        NK_SVE_ROW(3, rows_low, 3)
        NK_SVE_ROW(4, rows_high, 0)
        NK_SVE_ROW(5, rows_high, 1)
        NK_SVE_ROW(6, rows_high, 2)
        NK_SVE_ROW(7, rows_high, 3)
#undef NK_SVE_ROW
    }
#define NK_SVE_STORE(r)                                          \
    svst1_u32(keep_a, out_a + r * NK_SVE_BLOCK_DOCS, acc_a##r); \
    svst1_u32(keep_b, out_b + r * NK_SVE_BLOCK_DOCS, acc_b##r);
    NK_SVE_STORE(0)
    NK_SVE_STORE(1)
    NK_SVE_STORE(2)
    NK_SVE_STORE(3)
    NK_SVE_STORE(4)
    NK_SVE_STORE(5)
    NK_SVE_STORE(6)
    NK_SVE_STORE(7)
#undef NK_SVE_STORE
}

/* Stored screening words of query rows [first, first + 8) for depth groups [g0, g0 + groups),
 * in [group][row] order; rows past the end are zero (their scores are never read). */
static void nk_sve_gather_query(nk_maxsim_view_t const *q, uint64_t first, uint64_t g0, uint64_t groups,
                                uint32_t *query_words) {
    for (unsigned r = 0; r < NK_SVE_ROWS; ++r) {
        uint64_t row = first + r;
        if (row >= q->vectors) {
            for (uint64_t g = 0; g < groups; ++g) query_words[g * NK_SVE_ROWS + r] = 0;
            continue;
        }
        uint64_t base = nk_screen_offset(q->vectors, q->screen_depth, row, 0);
        uint64_t stride = nk_screen_offset(q->vectors, q->screen_depth, row, 4) - base; /* 4 x rows in its tile */
        uint8_t const *source = q->screen + base + g0 * stride;
        for (uint64_t g = 0; g < groups; ++g, source += stride) memcpy(&query_words[g * NK_SVE_ROWS + r], source, 4);
    }
}

double nk_maxsim_sve(nk_maxsim_view_t const *q, nk_maxsim_view_t const *d) {

    _Alignas(64) uint32_t scores[NK_SVE_ROWS * NK_SVE_BLOCK_DOCS];
    _Alignas(64) float upper[NK_SVE_BLOCK_DOCS];
    _Alignas(64) uint32_t query_words[NK_SVE_CHUNK_GROUPS * NK_SVE_ROWS];
    nk_sve_column_t columns[NK_SVE_MAX_COLUMNS];
    size_t row_bytes = q->row_bytes;
    uint64_t total_groups = d->screen_depth / 4, lanes = svcntw();
    int single_chunk = total_groups <= NK_SVE_CHUNK_GROUPS;
    /* Both operands are stored +128: raw = dot + 128 (sum_q + sum_d) + 128^2 screen_depth (mod 2^32). */
    uint32_t depth_bias = (uint32_t)(16384u * (uint32_t)d->screen_depth);
    double total = 0.0;

    for (uint64_t first_query = 0; first_query < q->vectors; first_query += NK_SVE_ROWS) {
        uint64_t rows = q->vectors - first_query < NK_SVE_ROWS ? q->vectors - first_query : NK_SVE_ROWS;
        double best[NK_SVE_ROWS];
        for (unsigned r = 0; r < NK_SVE_ROWS; ++r) best[r] = -INFINITY;
        /* With one depth chunk the gathered query words serve every document block. */
        if (single_chunk) nk_sve_gather_query(q, first_query, 0, total_groups, query_words);

        for (uint64_t first_doc = 0; first_doc < d->vectors; first_doc += NK_SVE_BLOCK_DOCS) {
            uint64_t docs = d->vectors - first_doc < NK_SVE_BLOCK_DOCS ? d->vectors - first_doc : NK_SVE_BLOCK_DOCS;
            unsigned column_count = nk_sve_columns(d, first_doc, docs, columns);
            for (uint64_t g0 = 0; g0 < total_groups || g0 == 0; g0 += NK_SVE_CHUNK_GROUPS) {
                uint64_t groups = total_groups - g0 < NK_SVE_CHUNK_GROUPS ? total_groups - g0 : NK_SVE_CHUNK_GROUPS;
                if (!single_chunk) nk_sve_gather_query(q, first_query, g0, groups, query_words);
                unsigned c = 0;
                for (; c + 2 <= column_count; c += 2)
                    nk_sve_screen_pair(d->screen, &columns[c], &columns[c + 1], g0, groups,
                                       (uint8_t const *)query_words, g0 != 0, scores);
                if (c < column_count)
                    nk_sve_screen_pair(d->screen, &columns[c], NULL, g0, groups, (uint8_t const *)query_words, g0 != 0,
                                       scores);
            }

            for (uint64_t r = 0; r < rows; ++r) {
                uint64_t i = first_query + r;
                double inv_q = q->inv_norms[i];
                if (inv_q == 0.0) continue;
                float error_q = q->screen_errors[i], scale_q = q->screen_scales[i];
                uint32_t bias_q = (uint32_t)q->screen_sums[i] * 128u + depth_bias;
                svfloat32_t slack = svdup_n_f32(error_q + nk_screen_slack_k), growth = svdup_n_f32(1.0f + error_q);
                svfloat32_t best_lower = svdup_n_f32(-INFINITY);
                uint32_t const *row_scores = scores + r * NK_SVE_BLOCK_DOCS;

                /* Pass 1: raw dots -> upper bounds, and the best lower bound. */
                for (uint64_t v = 0; v < docs; v += lanes) {
                    svbool_t pg = svwhilelt_b32_u64(v, docs);
                    uint64_t j = first_doc + v;
                    svuint32_t doc_sums = svreinterpret_u32_s32(svld1_s32(pg, d->screen_sums + j));
                    svuint32_t raw = svsub_n_u32_x(pg, svld1_u32(pg, row_scores + v), bias_q);
                    svint32_t dot = svreinterpret_s32_u32(svsub_u32_x(pg, raw, svlsl_n_u32_x(pg, doc_sums, 7)));
                    svfloat32_t estimate = svcvt_f32_s32_x(pg, dot);
                    svfloat32_t scale = svmul_n_f32_x(pg, svld1_f32(pg, d->screen_scales + j), scale_q);
                    svfloat32_t margin = svmla_f32_x(pg, slack, svld1_f32(pg, d->screen_errors + j), growth);
                    svfloat32_t up = svmla_f32_x(pg, margin, estimate, scale);   /* margin + estimate * scale */
                    svfloat32_t low = svnmls_f32_x(pg, margin, estimate, scale); /* estimate * scale - margin */
                    best_lower = svmax_f32_m(pg, best_lower, low);
                    svst1_f32(pg, upper + v, up);
                }

                /* Pass 2: rescore every document whose upper bound reaches the threshold. */
                void const *q_row = (char const *)q->values + i * row_bytes;
                float threshold = svmaxv_f32(svptrue_b32(), best_lower), from_best = nk_f32_at_most(best[r]);
                if (from_best > threshold) threshold = from_best;
                threshold = nk_threshold_floor(threshold);
                for (uint64_t v = 0; v < docs; v += lanes) {
                    svbool_t pg = svwhilelt_b32_u64(v, docs);
                    svbool_t hits = svcmpge_n_f32(pg, svld1_f32(pg, upper + v), threshold);
                    while (svptest_any(pg, hits)) {
                        /* Index of the first hit = active lanes before it; then drop it. */
                        uint64_t lane = svcntp_b32(pg, svbrkb_b_z(pg, hits));
                        hits = svbic_b_z(pg, hits, svbrka_b_z(pg, hits));
                        if (upper[v + lane] < threshold) continue; /* the threshold rose since the compare */
                        nk_arm_rescore(q, d, q_row, inv_q, first_doc + v + lane, row_bytes, &best[r], &threshold);
                    }
                }
            }
        }
        for (uint64_t r = 0; r < rows; ++r)
            total += nk_row_distance(q->inv_norms[first_query + r], best[r]);
    }
    return total;
}
