/* Portable reference kernel: every pair scored exactly, float64 accumulation. Built without
 * auto-vectorization so it stays an independent baseline for the SIMD families. */
#include "maxsim_internal.h"

/* float64 dot product of two stored rows; one loop per dtype keeps the switch out of the loop. */
static double nk_dot_serial(int dtype, void const *a, void const *b, uint64_t depth) {
    double sum = 0.0;
    switch (dtype) {
    case nk_dtype_float64_k:
        for (uint64_t k = 0; k < depth; ++k) sum += ((double const *)a)[k] * ((double const *)b)[k];
        return sum;
    case nk_dtype_float32_k:
        for (uint64_t k = 0; k < depth; ++k) sum += (double)((float const *)a)[k] * (double)((float const *)b)[k];
        return sum;
    default:
        for (uint64_t k = 0; k < depth; ++k) sum += nk_decode(dtype, a, k) * nk_decode(dtype, b, k);
        return sum;
    }
}

double nk_maxsim_serial(nk_maxsim_view_t const *q, nk_maxsim_view_t const *d) {
    size_t row_bytes = q->row_bytes;
    double total = 0.0;
    for (uint64_t i = 0; i < q->vectors; ++i) {
        double inv_q = q->inv_norms[i];
        void const *q_row = (char const *)q->values + i * row_bytes;
        double best = -2.0; /* a zero query row has no cosine: nk_row_distance counts it as 1 */
        for (uint64_t j = 0; j < d->vectors && inv_q != 0.0; ++j) {
            double inv_d = d->inv_norms[j];
            double cos = inv_d == 0.0 ? 0.0
                                      : nk_dot_serial((int)q->dtype, q_row, (char const *)d->values + j * row_bytes,
                                                      q->depth) * inv_q * inv_d;
            if (cos > best) best = cos;
        }
        total += nk_row_distance(inv_q, best);
        if (total > q->stop_above) return total; /* a top-k caller needs no more */
    }
    return total;
}
