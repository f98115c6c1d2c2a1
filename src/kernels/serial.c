/* Portable reference kernel: every pair scored exactly, float64 accumulation. Built without
 * auto-vectorization so it stays an independent baseline for the SIMD families. */
#include "maxsim_internal.h"

/* A float64 product kept apart from the sum it feeds: a fused multiply-add would change the bits.
 * In ISO C mode (-std=c11, as meson builds) GCC fuses nothing; the empty asm also stops a build
 * that would (-ffp-contract=fast, or -std=gnu11 on Arm, where fused instructions are baseline). */
static inline double nk_product_f64(double x, double y) {
    double p = x * y;
#if defined(__GNUC__) && defined(__SSE2_MATH__)
    __asm__("" : "+x"(p));
#elif defined(__GNUC__) && defined(__aarch64__)
    __asm__("" : "+w"(p));
#endif
    return p;
}

/* The reference canonical dot (maxsim_internal.h) of two stored rows, any depth: element k goes to
 * lane k % 16, then the halving tree. One loop per dtype keeps the switch out of the loop. */
static double nk_dot_serial(int dtype, void const *a, void const *b, uint64_t depth) {
    double s[16] = {0};
    switch (dtype) {
    case nk_dtype_float64_k:
        for (uint64_t k = 0; k < depth; ++k) s[k % 16] += nk_product_f64(((double const *)a)[k], ((double const *)b)[k]);
        break;
    case nk_dtype_float32_k: /* exact products */
        for (uint64_t k = 0; k < depth; ++k) s[k % 16] += (double)((float const *)a)[k] * (double)((float const *)b)[k];
        break;
    default: /* exact products */
        for (uint64_t k = 0; k < depth; ++k) s[k % 16] += nk_decode(dtype, a, k) * nk_decode(dtype, b, k);
        break;
    }
    double t[8], u[4];
    for (int i = 0; i < 8; ++i) t[i] = s[i] + s[i + 8];
    for (int i = 0; i < 4; ++i) u[i] = t[i] + t[i + 4];
    return (u[0] + u[2]) + (u[1] + u[3]);
}

/* The integer formats: exact integer dot products of the stored codes, one element at a time
 * through the tiled layout; cosines as maxsim_internal.h states. */
static double nk_maxsim_serial_integer(nk_maxsim_view_t const *q, nk_maxsim_view_t const *d) {
    int dtype = (int)q->dtype;
    uint8_t const *q_values = (uint8_t const *)q->values, *d_values = (uint8_t const *)d->values;
    double total = 0.0;
    for (uint64_t i = 0; i < q->vectors; ++i) {
        double inv_q = dtype == nk_dtype_uint1_k ? 1.0 : nk_integer_inv_norm(q->norms2[i]);
        double best = -2.0;
        for (uint64_t j = 0; j < d->vectors && inv_q != 0.0; ++j) {
            int64_t dot = 0;
            for (uint64_t k = 0; k < q->depth; ++k)
                dot += (int64_t)nk_integer_at(dtype, q_values, q->vectors, q->row_bytes, i, k) *
                       nk_integer_at(dtype, d_values, d->vectors, d->row_bytes, j, k);
            double cos;
            if (dtype == nk_dtype_uint1_k) cos = (double)dot / (double)q->depth;
            else cos = nk_exact_cosine((double)dot, inv_q, nk_integer_inv_norm(d->norms2[j]));
            if (cos > best) best = cos;
        }
        total += nk_row_distance(inv_q, best);
        if (total > q->stop_above) return total;
    }
    return total;
}

double nk_maxsim_serial(nk_maxsim_view_t const *q, nk_maxsim_view_t const *d) {
    if (nk_dtype_is_integer((int)q->dtype)) return nk_maxsim_serial_integer(q, d);
    size_t row_bytes = q->row_bytes;
    double total = 0.0;
    for (uint64_t i = 0; i < q->vectors; ++i) {
        double inv_q = q->inv_norms[i];
        void const *q_row = (char const *)q->values + i * row_bytes;
        double best = -2.0; /* a zero query row has no cosine: nk_row_distance counts it as 1 */
        for (uint64_t j = 0; j < d->vectors && inv_q != 0.0; ++j) {
            double cos = nk_exact_cosine(
                nk_dot_serial((int)q->dtype, q_row, (char const *)d->values + j * row_bytes, q->depth), inv_q,
                d->inv_norms[j]);
            if (cos > best) best = cos;
        }
        total += nk_row_distance(inv_q, best);
        if (total > q->stop_above) return total; /* a top-k caller needs no more */
    }
    return total;
}
