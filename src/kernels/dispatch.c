/* Picks the best kernel family within a capability mask. Compiled at the baseline ISA. */
#include "maxsim_internal.h"

typedef struct nk_family {
    uint64_t cap;
    nk_maxsim_kernel_t kernel;
} nk_family_t;

#if defined(NK_HAVE_SAPPHIREAMX) && defined(NK_HAVE_ICELAKE)
/* The AMX family's tiles pay for their set-up (tile configuration, the query's A tiles, a padded last
 * document tile) only on enough document bytes; below, the family scores a float format with its
 * vector units alone, the icelake kernel (every CPU with AMX has its instructions; same bits).
 * Measured, 15-25 rounds per shape, bfloat16 (float32 and e4m3 alike): icelake is 1.15-2.5x as fast
 * at depth 32 (up to 4,096 documents) and below 8 KB of document screen (1x32x128 0.20 against
 * 0.30 us), AMX from 64 documents or 16 query rows on (32x64x128 1.16x, 32x16x768 0.98-1.09x). The
 * integer formats choose inside the family (nk_maxsim_sapphireamx). */
static double nk_maxsim_sapphireamx_sized(nk_maxsim_view_t const *q, nk_maxsim_view_t const *d) {
    uint64_t depth = q->screen_depth;
    int tiles_pay = depth >= 64 && d->vectors >= (8192 + depth - 1) / depth && (d->vectors >= 64 || q->vectors >= 16);
    return tiles_pay || nk_dtype_is_integer((int)q->dtype) ? nk_maxsim_sapphireamx(q, d) : nk_maxsim_icelake(q, d);
}
#define NK_SAPPHIREAMX_KERNEL nk_maxsim_sapphireamx_sized
#else
#define NK_SAPPHIREAMX_KERNEL nk_maxsim_sapphireamx
#endif

/* Best first. */
static nk_family_t const nk_families[] = {
#ifdef NK_HAVE_SAPPHIREAMX
    {nk_cap_sapphireamx_k, NK_SAPPHIREAMX_KERNEL},
#endif
#if defined(NK_HAVE_GENOA) && defined(NK_HAVE_ICELAKE)
    {nk_cap_genoa_k, nk_maxsim_icelake}, /* genoa adds only the unpacked path's screening (below) */
#endif
#ifdef NK_HAVE_ICELAKE
    {nk_cap_icelake_k, nk_maxsim_icelake},
#endif
#ifdef NK_HAVE_SKYLAKE
    {nk_cap_skylake_k, nk_maxsim_skylake},
#endif
#ifdef NK_HAVE_HASWELL
    {nk_cap_haswell_k, nk_maxsim_haswell},
#endif
#ifdef NK_HAVE_SVE
    {nk_cap_sve_k, nk_maxsim_sve},
#endif
#ifdef NK_HAVE_NEON
    {nk_cap_neon_k, nk_maxsim_neon},
#endif
    {nk_cap_serial_k, nk_maxsim_serial},
};

static nk_family_t const *nk_pick(uint64_t mask) {
    mask &= nk_capabilities_available();
    size_t count = sizeof(nk_families) / sizeof(nk_families[0]);
    for (size_t i = 0; i + 1 < count; ++i)
        if (mask & nk_families[i].cap) return &nk_families[i];
    return &nk_families[count - 1];
}

uint64_t nk_capabilities_best(uint64_t mask) { return nk_pick(mask)->cap; }

nk_maxsim_kernel_t nk_maxsim_kernel_for(uint64_t capabilities, uint64_t depth) {
    /* Beyond int8 screening's depth (and at depth 0) every pair is scored exactly: rare, so one
     * shared loop rather than a fallback in every family. */
    if (depth == 0 || depth > NK_SCREEN_MAX_DEPTH) return nk_maxsim_serial;
    return nk_pick(capabilities)->kernel;
}

nk_prescreen_ops_t const *nk_prescreen_for(uint64_t capabilities, uint64_t depth) {
#ifdef NK_HAVE_SAPPHIREAMX
    static nk_prescreen_ops_t const sapphireamx = {nk_prescreen_prepare_sapphireamx, nk_prescreen_bound_sapphireamx};
    if (nk_maxsim_kernel_for(capabilities, depth) == NK_SAPPHIREAMX_KERNEL) return &sapphireamx;
#endif
    (void)capabilities, (void)depth;
    return NULL;
}

nk_status_t nk_maxsim_score_views(nk_maxsim_kernel_t kernel, nk_maxsim_view_t const *q, nk_maxsim_view_t const *d,
                                  double *result) {
    if (q->dtype != d->dtype) return nk_error_dtype_mismatch_k;
    if (q->depth != d->depth) return nk_error_depth_mismatch_k;
    if (q->vectors == 0) {
        *result = 0.0;
        return nk_ok_k;
    }
    if (d->vectors == 0) return nk_error_empty_k;
    *result = kernel(q, d);
    return nk_ok_k;
}

nk_status_t nk_maxsim_score_matrices(nk_maxsim_matrix_t const *queries, nk_maxsim_matrix_t const *documents,
                                     uint64_t capabilities, double *result) {
    if (!queries || !documents || !queries->data || !documents->data || !result) return nk_error_argument_k;
    nk_maxsim_view_t q, d;
    nk_maxsim_view_init(queries, &q);
    nk_maxsim_view_init(documents, &d);
    return nk_maxsim_score_views(nk_maxsim_kernel_for(capabilities, q.depth), &q, &d, result);
}

nk_status_t nk_maxsim_score(void const *queries, void const *documents, uint64_t capabilities, double *result) {
    nk_maxsim_matrix_t q = {queries, {0}}, d = {documents, {0}};
    if (!queries || !documents || nk_maxsim_info(queries, &q.info) != nk_ok_k ||
        nk_maxsim_info(documents, &d.info) != nk_ok_k)
        return nk_error_argument_k;
    return nk_maxsim_score_matrices(&q, &d, capabilities, result);
}

/* ---- Unpacked float32 documents: the AVX-512 families only (x86/avx512_unpacked.h). ---- */

int nk_maxsim_unpacked_available(uint64_t capabilities) {
#ifdef NK_HAVE_SKYLAKE
    return (capabilities & nk_capabilities_available() &
            (nk_cap_skylake_k | nk_cap_icelake_k | nk_cap_genoa_k | nk_cap_sapphireamx_k)) != 0;
#else
    (void)capabilities;
    return 0;
#endif
}

/* The transposed query groups ([depth][32] floats each), then per row (of the longest document, or
 * of the query if longer) a float32 and a float64 inverse norm and 32 estimates, each part 64-byte
 * aligned within the buffer. */
uint64_t nk_maxsim_unpacked_scratch_bytes(uint64_t query_vectors, uint64_t depth, uint64_t max_rows) {
    uint64_t groups = query_vectors / NK_UNPACKED_ROWS + (query_vectors % NK_UNPACKED_ROWS != 0), columns, per_row;
    if (query_vectors > max_rows) max_rows = query_vectors;
    if (depth > NK_UNPACKED_MAX_DEPTH) depth = NK_UNPACKED_MAX_DEPTH; /* deeper rows are not screened */
    uint64_t bfloat16_row = (depth + 15) / 16 * 16 * 2;              /* a row's bfloat16 copy, 32-byte blocks */
    if (!nk_u64_mul(groups, depth, &columns) || !nk_u64_mul(columns, NK_UNPACKED_ROWS * 4u, &columns) ||
        !nk_u64_mul(max_rows, 4u + 8u + NK_UNPACKED_ROWS * 4u + bfloat16_row, &per_row) ||
        !nk_u64_add(columns, per_row, &columns) || !nk_u64_add(columns, 5u * 64u, &columns))
        return UINT64_MAX;
    return columns;
}

nk_status_t nk_maxsim_unpacked_f32(nk_maxsim_matrix_t const *query, float const *const *documents,
                                   uint64_t const *rows, int64_t const *strides, uint64_t count,
                                   uint64_t capabilities, void *scratch, uint64_t scratch_bytes, double *scores) {
    if (!query || !query->data || (count && (!documents || !rows || !strides || !scores)) ||
        query->info.dtype != nk_dtype_float32_k || !nk_maxsim_unpacked_available(capabilities))
        return nk_error_argument_k;
    uint64_t max_rows = query->info.vectors; /* the query's rows are checked into the per-row scratch too */
    for (uint64_t i = 0; i < count; ++i) {
        if (!documents[i] || ((uintptr_t)documents[i] | (uint64_t)strides[i]) % 4u) return nk_error_argument_k;
        max_rows = rows[i] > max_rows ? rows[i] : max_rows;
    }
    uint64_t needed = nk_maxsim_unpacked_scratch_bytes(query->info.vectors, query->info.depth, max_rows);
    if (needed == UINT64_MAX) return nk_error_overflow_k;
    if (!scratch || scratch_bytes < needed) return nk_error_buffer_small_k;
    nk_maxsim_view_t q;
    nk_maxsim_view_init(query, &q);
    int scored = 0;
#ifdef NK_HAVE_SKYLAKE
    /* Deeper rows than its bound is worked out for are left to packing. */
    if (q.vectors && q.depth && q.depth <= NK_UNPACKED_MAX_DEPTH) {
#ifdef NK_HAVE_GENOA
        if (capabilities & nk_capabilities_available() & nk_cap_genoa_k)
            scored = nk_maxsim_unpacked_genoa(&q, documents, rows, strides, count, max_rows, scratch, scores);
        else
#endif
            scored = nk_maxsim_unpacked_skylake(&q, documents, rows, strides, count, max_rows, scratch, scores);
    }
#endif
    if (!scored)
        for (uint64_t i = 0; i < count; ++i) scores[i] = q.vectors && q.depth ? NAN : 0.0;
    return nk_ok_k;
}
