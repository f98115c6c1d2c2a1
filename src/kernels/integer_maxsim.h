/* MaxSim of the integer formats (int8, int4, uint1), written once for every SIMD family.
 *
 * Their dot products are exact integer sums, so nothing is screened or rescored: every (query row,
 * document row) dot product is computed over the tiled layout (maxsim_internal.h) and each query row
 * keeps its best cosine: for int8 / int4 ((double)dot * inv_q) * inv_d, for uint1 the smallest
 * Hamming distance h, whose cosine is (depth - 2 h) / depth. The same integers and the same float64
 * operations in every family give the same bits.
 *
 * Work goes in blocks of NK_INTEGER_BLOCK documents (their inverse norms computed once per block)
 * and groups of NK_INTEGER_ROWS query rows, whose stored words are prepared once per block as int32
 * `words[w][row]` over chunks of NK_INTEGER_CHUNK_WORDS stored words:
 *   int8   one word per stored word: 4 signed bytes q (depths 4w .. 4w+3)
 *   int4   two per stored word: 4 signed bytes of the low nibbles (depths 8w .. 8w+3), then of the
 *          high nibbles (8w+4 .. 8w+7)
 *   uint1  the stored word (32 depths, bit set for +1)
 * Document words stay as stored: int8 bytes q + 128 and int4 nibbles q + 8, so a dot product
 * accumulated from them starts at minus the query's `bias` (128 or 8 times its sum of q, per chunk); uint1
 * accumulates popcount(query word ^ document word), the Hamming distance.
 *
 * A family may define, before including this header (else portable C, vectorized by its flags):
 *   void nk_family_integer_prepare(int dtype, uint8_t const *source, uint64_t step, uint64_t rows,
 *                                  uint64_t count, int32_t *words, int32_t *bias)
 *       The group's words as above from its `count` stored words (the first at `source`, `step` bytes
 *       apart, each 4 x rows adjacent bytes: nk_integer_group_words), and bias[r] over those words
 *       (what nk_integer_prepare_portable does).
 *   void nk_family_integer_block(int dtype, int32_t const *words, nk_maxsim_view_t const *d,
 *                                uint64_t first_doc, uint64_t docs, uint64_t first_word, uint64_t count,
 *                                int accumulate, int finish, int32_t const *bias, double const *inv_q,
 *                                double const *inv_d, int32_t *dots, double *best,
 *                                nk_prefetch_stream_t *prefetch)
 *       For rows r < NK_INTEGER_ROWS and documents j < docs, D[r][j] = (accumulate ?
 *       dots[r * NK_INTEGER_BLOCK + j] : 0) + the exact dot product of query row r's and document j's
 *       codes over stored words [first_word, first_word + count) (uint1: their Hamming distance);
 *       a kernel that multiplies the biased document codes as stored subtracts bias[r]. D is kept in
 *       dots unless `finish`, when best[r] becomes the larger of itself and max over j of
 *       ((double)D[r][j] * inv_q[r]) * inv_d[j] (uint1: the smaller of itself and min over j of D[r][j]).
 *       It takes a line of `prefetch` (the next document) per word of a 16-document tile it reads.
 * Stack: 16 KB of words, 16 KB of dots, 4 KB of inverse norms, 2 KB of best cosines.
 */
#ifndef NUMKONG_INTEGER_MAXSIM_H
#define NUMKONG_INTEGER_MAXSIM_H

#include "maxsim_internal.h"

#define NK_INTEGER_CHUNK_WORDS 256u  /* stored words per prepared chunk: depth 1024 of int8 */
#define NK_INTEGER_QUERY_CHUNK 256u  /* query rows whose best cosines one pass over the documents keeps */

static inline uint32_t nk_integer_load_word(uint8_t const *at) {
    uint32_t word;
    memcpy(&word, at, 4);
    return word;
}

/* The 4 bytes of `nibbles` (each 0..15, a code q + 8) as 4 signed bytes q. */
static inline uint32_t nk_integer_nibbles_to_bytes(uint32_t nibbles) {
    uint32_t out = 0;
    for (int b = 0; b < 4; ++b) out |= (uint32_t)(uint8_t)(int8_t)((int)((nibbles >> (8 * b)) & 0x0Fu) - 8) << (8 * b);
    return out;
}

/* Sum of the 4 signed bytes of a word. */
static inline int32_t nk_integer_byte_sum(uint32_t word) {
    return (int32_t)(int8_t)word + (int8_t)(word >> 8) + (int8_t)(word >> 16) + (int8_t)(word >> 24);
}

/* Words [first_word, first_word + count) of query rows [first, first + rows) as the kernels take them
 * (rows past `rows` are zeros), and each row's bias over those words: what the dot product from
 * biased document codes gains, 128 (int8) or 8 (int4) times the row's sum of q; 0 for uint1.
 * `first` is a multiple of NK_INTEGER_ROWS, so the group's rows are adjacent lanes of one tile and
 * each stored word of theirs is 4 x rows adjacent bytes. */
#ifndef nk_family_integer_prepare
static void nk_integer_prepare_portable(int dtype, uint8_t const *source, uint64_t step, uint64_t rows, uint64_t count,
                                        int32_t *words, int32_t *bias) {
    int32_t sums[NK_INTEGER_ROWS] = {0};
    for (uint64_t w = 0; w < count; ++w, source += step) {
        uint32_t raw[NK_INTEGER_ROWS] = {0};
        memcpy(raw, source, 4 * rows);
        int32_t *out = words + w * (dtype == nk_dtype_int4_k ? 2 : 1) * NK_INTEGER_ROWS;
        for (uint64_t r = 0; r < NK_INTEGER_ROWS; ++r) {
            if (dtype == nk_dtype_int8_k) {
                uint32_t signed_bytes = r < rows ? raw[r] ^ 0x80808080u : 0u;
                out[r] = (int32_t)signed_bytes;
                sums[r] += nk_integer_byte_sum(signed_bytes);
            }
            else if (dtype == nk_dtype_int4_k) {
                uint32_t low = r < rows ? nk_integer_nibbles_to_bytes(raw[r] & 0x0F0F0F0Fu) : 0u;
                uint32_t high = r < rows ? nk_integer_nibbles_to_bytes((raw[r] >> 4) & 0x0F0F0F0Fu) : 0u;
                out[r] = (int32_t)low, out[NK_INTEGER_ROWS + r] = (int32_t)high;
                sums[r] += nk_integer_byte_sum(low) + nk_integer_byte_sum(high);
            }
            else
                out[r] = (int32_t)raw[r];
        }
    }
    int32_t offset = dtype == nk_dtype_int8_k ? 128 : dtype == nk_dtype_int4_k ? 8 : 0;
    for (uint64_t r = 0; r < NK_INTEGER_ROWS; ++r) bias[r] = offset * sums[r];
}
#define nk_family_integer_prepare nk_integer_prepare_portable
#endif

#ifndef nk_family_integer_block
/* Portable: per 16-document tile, per query row, 16 lane sums over the stored words; then, on the
 * last chunk, each row's best over the block. */
static void nk_integer_block_portable(int dtype, int32_t const *words, nk_maxsim_view_t const *d, uint64_t first_doc,
                                      uint64_t docs, uint64_t first_word, uint64_t count, int accumulate, int finish,
                                      int32_t const *bias, double const *inv_q, double const *inv_d, int32_t *dots,
                                      double *best, nk_prefetch_stream_t *prefetch) {
    for (uint64_t t0 = 0; t0 < docs; t0 += NK_SCREEN_TILE) {
        uint64_t tile = (first_doc + t0) / NK_SCREEN_TILE, n = d->vectors - tile * NK_SCREEN_TILE;
        if (n > NK_SCREEN_TILE) n = NK_SCREEN_TILE;
        uint8_t const *base = (uint8_t const *)d->values + tile * NK_SCREEN_TILE * d->row_bytes + first_word * 4 * n;
        nk_prefetch_lines(prefetch, count); /* the next document: a line per word of a tile screened */
        for (uint64_t r = 0; r < NK_INTEGER_ROWS; ++r) {
            int32_t acc[NK_SCREEN_TILE];
            int32_t *out = dots + r * NK_INTEGER_BLOCK + t0;
            for (uint64_t l = 0; l < NK_SCREEN_TILE; ++l) acc[l] = (accumulate ? out[l] : 0) - bias[r];
            for (uint64_t w = 0; w < count; ++w) {
                uint8_t const *at = base + w * 4 * n;
                if (dtype == nk_dtype_uint1_k) {
                    uint32_t query = (uint32_t)words[w * NK_INTEGER_ROWS + r];
                    for (uint64_t l = 0; l < n; ++l) acc[l] += nk_popcount32(query ^ nk_integer_load_word(at + 4 * l));
                    continue;
                }
                int shifts = dtype == nk_dtype_int4_k ? 2 : 1;
                for (int half = 0; half < shifts; ++half) {
                    uint32_t query = (uint32_t)words[(w * shifts + half) * NK_INTEGER_ROWS + r];
                    int8_t q0 = (int8_t)query, q1 = (int8_t)(query >> 8), q2 = (int8_t)(query >> 16),
                           q3 = (int8_t)(query >> 24);
                    unsigned shift = dtype == nk_dtype_int4_k ? 4u * (unsigned)half : 0u;
                    uint8_t mask = dtype == nk_dtype_int4_k ? 0x0Fu : 0xFFu;
                    for (uint64_t l = 0; l < n; ++l) {
                        uint8_t const *b = at + 4 * l;
                        acc[l] += q0 * ((b[0] >> shift) & mask) + q1 * ((b[1] >> shift) & mask) +
                                  q2 * ((b[2] >> shift) & mask) + q3 * ((b[3] >> shift) & mask);
                    }
                }
            }
            for (uint64_t l = 0; l < n && t0 + l < docs; ++l) out[l] = acc[l];
        }
    }
    for (uint64_t r = 0; r < NK_INTEGER_ROWS && finish; ++r) {
        int32_t const *row = dots + r * NK_INTEGER_BLOCK;
        double value = best[r];
        for (uint64_t j = 0; j < docs; ++j) {
            double candidate = dtype == nk_dtype_uint1_k ? (double)row[j] : (double)row[j] * inv_q[r] * inv_d[j];
            if (dtype == nk_dtype_uint1_k ? candidate < value : candidate > value) value = candidate;
        }
        best[r] = value;
    }
}
#define nk_family_integer_block nk_integer_block_portable
#endif

static double nk_integer_maxsim(nk_maxsim_view_t const *q, nk_maxsim_view_t const *d) {
    _Alignas(64) int32_t words[2 * NK_INTEGER_CHUNK_WORDS * NK_INTEGER_ROWS];
    _Alignas(64) int32_t dots[NK_INTEGER_ROWS * NK_INTEGER_BLOCK];
    _Alignas(64) double inv_d[NK_INTEGER_BLOCK];
    double best[NK_INTEGER_QUERY_CHUNK + NK_INTEGER_ROWS]; /* uint1: the least Hamming distance */
    double inv_q[NK_INTEGER_ROWS];
    int32_t bias[NK_INTEGER_ROWS];
    int dtype = (int)q->dtype, binary = dtype == nk_dtype_uint1_k;
    uint64_t stored_words = q->row_bytes / 4;
    double total = 0.0;
    nk_prefetch_stream_t prefetch = d->next;
    for (uint64_t chunk = 0; chunk < q->vectors; chunk += NK_INTEGER_QUERY_CHUNK) {
        uint64_t chunk_rows = q->vectors - chunk < NK_INTEGER_QUERY_CHUNK ? q->vectors - chunk : NK_INTEGER_QUERY_CHUNK;
        for (uint64_t r = 0; r < chunk_rows + NK_INTEGER_ROWS; ++r) best[r] = binary ? (double)INT32_MAX : -2.0;
        for (uint64_t first_doc = 0; first_doc < d->vectors; first_doc += NK_INTEGER_BLOCK) {
            uint64_t docs = d->vectors - first_doc < NK_INTEGER_BLOCK ? d->vectors - first_doc : NK_INTEGER_BLOCK;
            if (!binary)
                for (uint64_t j = 0; j < docs; ++j) { /* nk_integer_inv_norm's bits, branch-free to vectorize */
                    uint32_t norm2 = d->norms2[first_doc + j];
                    double present = (double)(norm2 != 0);
                    inv_d[j] = present / sqrt((double)norm2 + (1.0 - present));
                }
            for (uint64_t first = chunk; first < chunk + chunk_rows; first += NK_INTEGER_ROWS) {
                uint64_t rows = chunk + chunk_rows - first < NK_INTEGER_ROWS ? chunk + chunk_rows - first : NK_INTEGER_ROWS;
                for (uint64_t r = 0; r < NK_INTEGER_ROWS; ++r) /* a zero row's cosines are 0: distance 1 below */
                    inv_q[r] = binary || r >= rows ? 0.0 : nk_integer_inv_norm(q->norms2[first + r]);
                for (uint64_t w0 = 0; w0 < stored_words; w0 += NK_INTEGER_CHUNK_WORDS) {
                    uint64_t count = stored_words - w0 < NK_INTEGER_CHUNK_WORDS ? stored_words - w0 : NK_INTEGER_CHUNK_WORDS;
                    uint64_t step;
                    uint8_t const *source = nk_integer_group_words(q, first, w0, &step);
                    nk_family_integer_prepare(dtype, source, step, rows, count, words, bias);
                    nk_family_integer_block(dtype, words, d, first_doc, docs, w0, count, w0 != 0,
                                            w0 + count == stored_words, bias, inv_q, inv_d, dots, best + (first - chunk),
                                            &prefetch);
                }
            }
        }
        for (uint64_t r = 0; r < chunk_rows; ++r) {
            if (binary) {
                double cos = ((double)q->depth - 2.0 * best[r]) / (double)q->depth;
                total += nk_row_distance(1.0, cos);
            }
            else
                total += nk_row_distance(nk_integer_inv_norm(q->norms2[chunk + r]), best[r]);
        }
        if (total > q->stop_above) return total; /* every row adds at least 0 */
    }
    return total;
}

#endif /* NUMKONG_INTEGER_MAXSIM_H */
