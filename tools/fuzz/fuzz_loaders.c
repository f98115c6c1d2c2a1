/* libFuzzer target for everything that reads bytes: the packed-matrix loader, the corpus verifier
 * and the packer (an array made from the bytes). Built and run by tools/fuzz/run.sh.
 * Every input must be refused with a status, or load into something that scores finitely. */
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

static void check_score(void const *q, void const *d, uint64_t rows) {
    double score;
    if (nk_maxsim_score(q, d, ~(uint64_t)0, &score) == nk_ok_k && rows &&
        !(isfinite(score) && score >= 0.0 && score <= 2.0 * (double)rows + 1e-9)) {
        fprintf(stderr, "bad score %g for %llu rows\n", score, (unsigned long long)rows);
        abort();
    }
}

int LLVMFuzzerTestOneInput(uint8_t const *data, size_t size) {
    if (size < 1) return 0;
    uint8_t target = data[0] % 3;
    data++, size--;
    void *buffer = aligned_copy(data, size);
    if (!buffer) return 0;
    if (target == 0) {
        nk_maxsim_info_t info;
        if (nk_maxsim_load(buffer, size, &info) == nk_ok_k) check_score(buffer, buffer, info.vectors);
    }
    else if (target == 1) {
        nk_corpus_info_t info;
        if (nk_corpus_verify(buffer, size, &info) == nk_ok_k && info.documents) {
            uint64_t bytes;
            void const *first = nk_corpus_document(buffer, 0, &bytes);
            nk_maxsim_info_t query;
            nk_maxsim_info(first, &query);
            double *scores = malloc(info.documents * sizeof(double));
            if (scores && nk_maxsim_score_corpus(&first, 1, buffer, ~(uint64_t)0, 2, scores) == nk_ok_k)
                for (uint64_t i = 0; i < info.documents; ++i)
                    if (!isfinite(scores[i])) abort();
            free(scores);
        }
    }
    else if (size >= 3) {
        /* Pack rows of any source format from the raw bytes, then score the result. */
        int dtype = 1 + data[0] % 8, source = data[1] % 2 ? dtype : nk_dtype_float64_k;
        uint64_t depth = 1 + data[2] % 40, itemsize = nk_dtype_itemsize(source);
        uint64_t rows = (size - 3) / (depth * itemsize);
        uint64_t nbytes, bad;
        if (nk_maxsim_pack_size(rows, depth, dtype, &nbytes) == nk_ok_k) {
            void *packed = aligned_alloc(64, (nbytes + 63) / 64 * 64);
            void *source_rows = aligned_copy(data + 3, size - 3);
            if (packed && source_rows &&
                nk_maxsim_pack(source_rows, source, (int64_t)(depth * itemsize), rows, depth, dtype, ~(uint64_t)0,
                               packed, nbytes, &bad) == nk_ok_k) {
                nk_maxsim_info_t info;
                if (nk_maxsim_verify(packed, nbytes, &info) != nk_ok_k) abort(); /* packing must verify */
                check_score(packed, packed, rows);
            }
            free(packed);
            free(source_rows);
        }
    }
    free(buffer);
    return 0;
}
