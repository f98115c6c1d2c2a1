/* libFuzzer target for everything that reads bytes: the packed-matrix loader, the corpus verifier
 * and the packer (an array made from the bytes). Built and run by tools/fuzz/run.sh.
 * Every input must be refused with a status, or load into something that scores finitely. Then the
 * bytes are changed after validation, as a writer sharing them could (a mapped file, a shared
 * buffer): scoring the validated object must still neither crash nor read out of bounds.
 *
 * Input: byte 0 picks the target, byte 1 the number m < 16 of later changes, the last 3 m bytes are
 * the changes (2-byte position, modulo the buffer size, and the new byte), the rest is the buffer. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "maxsim_internal.h"

static void *aligned_copy(uint8_t const *data, size_t size) {
    void *buffer = aligned_alloc(64, (size + 64) / 64 * 64);
    if (buffer && size) memcpy(buffer, data, size);
    return buffer;
}

static void check_score(nk_maxsim_matrix_t const *q, nk_maxsim_matrix_t const *d) {
    double score;
    uint64_t rows = q->info.vectors;
    if (nk_maxsim_score_matrices(q, d, ~(uint64_t)0, &score) == nk_ok_k && rows &&
        !(isfinite(score) && score >= 0.0 && score <= 2.0 * (double)rows + 1e-9)) {
        fprintf(stderr, "bad score %g for %llu rows\n", score, (unsigned long long)rows);
        abort();
    }
}

/* Apply the changes; the scores that follow may be anything, but must be computed safely. */
static void change(uint8_t *buffer, size_t size, uint8_t const *changes, size_t count) {
    for (size_t i = 0; i < count && size; ++i) {
        size_t position = ((size_t)changes[3 * i] | (size_t)changes[3 * i + 1] << 8) % size;
        buffer[position] = changes[3 * i + 2];
    }
}

static void score_corpus(nk_corpus_t const *corpus, int check) {
    nk_maxsim_matrix_t query = nk_corpus_document(corpus, 0, NULL);
    double *scores = malloc(corpus->info.documents * sizeof(double));
    if (scores && nk_maxsim_score_corpus(&query, 1, corpus, ~(uint64_t)0, 2, scores) == nk_ok_k && check)
        for (uint64_t i = 0; i < corpus->info.documents; ++i)
            if (!isfinite(scores[i])) abort();
    free(scores);
}

int LLVMFuzzerTestOneInput(uint8_t const *data, size_t size) {
    if (size < 2) return 0;
    uint8_t target = data[0] % 3;
    size_t changes = (size_t)(data[1] % 16);
    data += 2, size -= 2;
    if (size < 3 * changes) return 0;
    size -= 3 * changes;
    uint8_t const *change_list = data + size;
    uint8_t *buffer = aligned_copy(data, size);
    if (!buffer) return 0;
    if (target == 0) {
        nk_maxsim_matrix_t matrix = {buffer, {0}};
        if (nk_maxsim_load(buffer, size, &matrix.info) == nk_ok_k) {
            check_score(&matrix, &matrix);
            change(buffer, size, change_list, changes);
            double score;
            nk_maxsim_score_matrices(&matrix, &matrix, ~(uint64_t)0, &score);
        }
    }
    else if (target == 1) {
        nk_corpus_info_t info;
        if (nk_corpus_header(buffer, size, &info) == nk_ok_k) {
            nk_corpus_entry_t *table = malloc(info.documents * sizeof(nk_corpus_entry_t));
            if (table && nk_corpus_verify(buffer, &info, table, 1) == nk_ok_k) {
                nk_corpus_t corpus = {buffer, info, table};
                score_corpus(&corpus, 1);
                change(buffer, size, change_list, changes);
                score_corpus(&corpus, 0);
            }
            free(table);
        }
    }
    else if (size >= 3) {
        /* Pack rows of any source format from the raw bytes, then score the result. */
        /* The packing format itself, or one the packer casts: float64, float32, float16, bfloat16. */
        int dtype = 1 + data[0] % 8, source = data[1] % 2 ? dtype : 1 + (data[1] / 2) % 4;
        uint64_t depth = 1 + data[2] % 40, itemsize = nk_dtype_itemsize(source);
        uint64_t rows = (size - 3) / (depth * itemsize);
        uint64_t nbytes, bad;
        if (nk_maxsim_pack_size(rows, depth, dtype, &nbytes) == nk_ok_k) {
            void *packed = aligned_alloc(64, (nbytes + 63) / 64 * 64);
            void *source_rows = aligned_copy(data + 3, size - 3);
            if (packed && source_rows &&
                nk_maxsim_pack(source_rows, source, (int64_t)(depth * itemsize), rows, depth, dtype,
                               NK_CAPABILITIES_ANY, packed, nbytes, &bad) == nk_ok_k) {
                nk_maxsim_matrix_t matrix = {packed, {0}};
                if (nk_maxsim_verify(packed, nbytes, &matrix.info) != nk_ok_k) abort(); /* packing must verify */
                check_score(&matrix, &matrix);
                change(packed, nbytes, change_list, changes);
                double score;
                nk_maxsim_score_matrices(&matrix, &matrix, ~(uint64_t)0, &score);
            }
            free(packed);
            free(source_rows);
        }
    }
    free(buffer);
    return 0;
}
