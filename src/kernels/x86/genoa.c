/* genoa: icelake + AVX512_BF16 (AMD Zen 4 and later; Intel Sapphire Rapids has it too). What only
 * this instruction set adds is the unpacked path's bfloat16 screening (avx512_unpacked.h): packed
 * operands score with icelake's kernels (dispatch.c). */
#include "maxsim_internal.h"

#define NK_UNP_BF16
#include "avx512_unpacked.h"

int nk_maxsim_unpacked_genoa(nk_maxsim_view_t const *q, float const *const *documents, uint64_t const *rows,
                             int64_t const *strides, uint64_t count, uint64_t max_rows, void *scratch, double *scores) {
    return nk_unp_score(q, documents, rows, strides, count, max_rows, scratch, scores);
}
