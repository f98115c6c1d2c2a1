/* Advanced SIMD code shared by the Arm families (neon.c, sve.c): exact cosines and rescoring. Each
 * including file compiles it with its own flags; nothing here needs more than armv8.2-a + fp16. */
#ifndef NUMKONG_ARM_NEON_SHARED_H
#define NUMKONG_ARM_NEON_SHARED_H
#include <arm_neon.h>
#include <math.h>

#include "maxsim_internal.h"
#include "neon_dot.h"

/* Exact cosine in the contract's order: dot * inv_q * inv_d, 0 for a zero document row. */
static inline double nk_arm_cosine(nk_maxsim_view_t const *q, nk_maxsim_view_t const *d, void const *q_row,
                                    double inv_q, uint64_t doc, size_t row_bytes) {
    double inv_d = d->inv_norms[doc];
    if (inv_d == 0.0) return 0.0;
    return nk_arm_dot((int)q->dtype, q_row, (char const *)d->values + doc * row_bytes, q->depth) * inv_q * inv_d;
}

/* Rescore candidate `doc` of a query row: raise its best exact cosine, and with it the float32
 * threshold the rest of its candidates are compared against. */
static inline void nk_arm_rescore(nk_maxsim_view_t const *q, nk_maxsim_view_t const *d, void const *q_row, double inv_q,
                                  uint64_t doc, size_t row_bytes, double *best, float *threshold) {
    double cos = nk_arm_cosine(q, d, q_row, inv_q, doc, row_bytes);
    if (cos > *best) {
        *best = cos;
        float raised = nk_f32_at_most(cos);
        if (raised > *threshold) *threshold = raised;
    }
}

#endif /* NUMKONG_ARM_NEON_SHARED_H */
