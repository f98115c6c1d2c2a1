/* C-level check: every compiled family that this CPU runs against serial, on adversarial data.
 * Every family follows the canonical dot (maxsim_internal.h), so scores must be the same bits; so
 * must float32 documents scored unpacked (nk_maxsim_unpacked_f32), by both of its screenings.
 * Build and run with tests/c/run.sh. Exit code 0 when all agree. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "maxsim_internal.h"

#ifdef NK_AMX_EMULATE /* the AMX family with its tile instructions in C (tests/c/run.sh) */
double nk_maxsim_sapphireamx_emulated(nk_maxsim_view_t const *q, nk_maxsim_view_t const *d);
int nk_prescreen_prepare_sapphireamx_emulated(nk_maxsim_view_t const *q, void *state);
double nk_prescreen_bound_sapphireamx_emulated(void const *state, uint8_t const *document,
                                               nk_prescreen_layout_t const *layout, nk_prefetch_stream_t prefetch);
#endif


static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static uint64_t next53(void) {
    rng_state ^= rng_state << 13, rng_state ^= rng_state >> 7, rng_state ^= rng_state << 17;
    return rng_state >> 11;
}
/* Roughly normal (Irwin-Hall: 12 uniforms - 6) without libm, whose log and cos differ by an ulp
 * between C libraries: the inputs, and so the digest, are the same bits under glibc and mingw. The
 * uniforms are summed as integers: one conversion and two float operations a value. Under qemu at SVE
 * vector lengths above 128 bits the driver's own float arithmetic ran far slower (the quick list took
 * 160 s at 256 bits against 8 s at 128, most of it filling the inputs); now 81 s at 256 bits. */
static double normal(void) {
    uint64_t sum = 0; /* at most 12 x 2^53 */
    for (int i = 0; i < 12; ++i) sum += next53();
    return (double)sum * (1.0 / 9007199254740992.0) - 6.0;
}

enum { kind_random, kind_near_ties, kind_outliers, kind_zero_rows, kind_negative, kind_zero_docs, kind_all_candidates, kind_mostly_zero, kind_wide_range, kind_count };
static char const *kind_names[] = {"random", "near_ties", "outliers", "zero_rows", "negative", "zero_docs", "all_candidates", "mostly_zero", "wide_range"};

static void fill(double *x, uint64_t rows, uint64_t depth, int kind, double const *anchor) {
    for (uint64_t r = 0; r < rows; ++r)
        for (uint64_t k = 0; k < depth; ++k) {
            double v = normal();
            if (kind == kind_near_ties && anchor) v = anchor[k] + 1e-3 * v; /* many rows within ~1e-4 of the best */
            if (kind == kind_outliers && (k % 37 == 5)) v *= 100.0;         /* transformer-like outlier dims */
            if (kind == kind_zero_rows && r % 3 == 1) v = 0.0;
            if (kind == kind_negative) v = -fabs(v); /* every cosine of a pair of such rows is positive... */
            if (kind == kind_negative && r % 2) v = -v; /* ...except across halves, so negatives occur */
            if (kind == kind_zero_docs && anchor) v = 0.0;                          /* every document row zero */
            if (kind == kind_all_candidates && anchor) v = anchor[k] + 1e-7 * v; /* every row a candidate */
            if (kind == kind_mostly_zero && r % 7 != 3) v = 0.0;                  /* a few nonzero rows */
            if (kind == kind_wide_range) v = ldexp(v, 70 * ((int)(r % 3) - 1)); /* products beyond float32's range */
            x[r * depth + k] = v;
        }
}

static void *pack(double const *x, uint64_t rows, uint64_t depth, int dtype) {
    uint64_t nbytes;
    if (nk_maxsim_pack_size(rows, depth, dtype, &nbytes) != nk_ok_k) abort();
    void *buf = aligned_alloc(64, (nbytes + 63) / 64 * 64);
    uint64_t bad;
    nk_status_t s = nk_maxsim_pack(x, nk_dtype_float64_k, (int64_t)(depth * sizeof(double)), rows, depth, dtype,
                                   nk_capabilities_available(), buf, nbytes, &bad);
    if (s != nk_ok_k) {
        fprintf(stderr, "pack failed: %d\n", (int)s);
        abort();
    }
    return buf;
}

/* Fills the stack below the caller with junk (alternating patterns), so that a family that reads
 * scratch it never wrote (a dropped tail) does not find the previous family's correct values in the
 * same stack slots. 64 KB: deeper than any kernel's scratch. */
static NK_NOINLINE void scrub_stack(void) {
    static uint64_t calls;
    volatile uint64_t junk[8192];
    uint64_t pattern = ++calls % 2 ? 0x7F7F7F7F7F7F7F7Full : 0x8080808080808080ull;
    for (size_t i = 0; i < sizeof junk / sizeof junk[0]; ++i) junk[i] = pattern;
}

/* `check_kernels quick`: fewer, smaller cases that still cross every tail and blocking boundary
 * (for slow emulated runs: tests/c/run_arm.sh at SVE vector lengths above 128 bits). */
/* The prescreen passes this build can run here: each bound must be at most the exact score (and, on
 * random rows, more than half of it: a bound of 0 would pass the first test). */
static nk_prescreen_ops_t prescreens[2];
static char const *prescreen_names[2];
static size_t prescreen_count;

static void find_prescreens(uint64_t available) {
#ifdef NK_HAVE_SAPPHIREAMX
    if (available & nk_cap_sapphireamx_k) {
        prescreens[prescreen_count] = (nk_prescreen_ops_t){nk_prescreen_prepare_sapphireamx, nk_prescreen_bound_sapphireamx};
        prescreen_names[prescreen_count++] = "sapphireamx";
    }
#endif
#ifdef NK_AMX_EMULATE
    prescreens[prescreen_count] =
        (nk_prescreen_ops_t){nk_prescreen_prepare_sapphireamx_emulated, nk_prescreen_bound_sapphireamx_emulated};
    prescreen_names[prescreen_count++] = "sapphireamx (emulated)";
#endif
    (void)available;
}

/* Checks of the prescreen of packed document d against the exact score `reference`; failures returned. */
static int check_prescreens(void const *q, void const *d, uint64_t nq, uint64_t nd, uint64_t depth, int dtype,
                            char const *dtype_name, int kind, double reference, int *checks) {
    uint64_t matrix_bytes;
    nk_prescreen_layout_t layout;
    if (nq == 0 || nk_maxsim_pack_size(nd, depth, dtype, &matrix_bytes) != nk_ok_k ||
        !nk_prescreen_layout(nd, depth, dtype, matrix_bytes, &layout) || !layout.pairs)
        return 0;
    uint8_t *document = aligned_alloc(64, layout.end);
    void *state = aligned_alloc(64, NK_PRESCREEN_STATE_BYTES);
    memcpy(document, d, matrix_bytes);
    nk_maxsim_matrix_t qm = {q, {0}}, dm = {document, {0}};
    nk_maxsim_view_t qv, dv;
    nk_maxsim_info(q, &qm.info), nk_maxsim_info(d, &dm.info);
    nk_maxsim_view_init(&qm, &qv), nk_maxsim_view_init(&dm, &dv);
    nk_prescreen_build(&dv, document, &layout, NK_CAPABILITIES_ANY, 0);
    int failures = 0;
    ++*checks;
    if (!nk_prescreen_build(&dv, document, &layout, NK_CAPABILITIES_ANY, 1)) {
        ++failures;
        printf("MISMATCH prescreen of %s depth=%llu x%llu: rebuilt bytes differ\n", dtype_name,
               (unsigned long long)depth, (unsigned long long)nd);
    }
    for (size_t p = 0; p < prescreen_count; ++p) {
        ++*checks;
        scrub_stack();
        double bound = prescreens[p].prepare(&qv, state)
                           ? prescreens[p].bound(state, document, &layout, nk_prefetch_stream(NULL, 0, NULL, 0))
                           : NAN;
        /* the prescreen bounds the first 32 query rows */
        int tight_enough = kind != kind_random || depth < 16 || nq < 5 ||
                           bound > 0.5 * reference * (double)(nq < 32 ? nq : 32) / (double)nq;
        if (!(bound <= reference) || !tight_enough) {
            ++failures;
            printf("MISMATCH prescreen %s %s depth=%llu %llux%llu %s: bound %a above %a or loose\n", prescreen_names[p],
                   dtype_name, (unsigned long long)depth, (unsigned long long)nq, (unsigned long long)nd,
                   kind_names[kind], bound, reference);
        }
    }
    free(state), free(document);
    return failures;
}

int main(int argc, char **argv) {
    int quick = argc > 1 && strcmp(argv[1], "quick") == 0;
    static char const *dtype_names[] = {"",     "float64", "float32", "float16", "bfloat16", "e4m3",
                                        "e5m2", "e2m3",    "e3m2",    "int8",    "int4",     "uint1"};
    /* 15, 16, 31, 33: around one and two 16-lane steps of the canonical dot. */
    static uint64_t const depths[] = {1, 3, 4, 15, 16, 17, 31, 33, 64, 128, 129, 1000};
    static uint64_t const shapes[][2] = {{1, 1}, {1, 17}, {5, 3}, {32, 180}, {7, 33}, {40, 300}};
    /* genoa's packed entry is icelake's kernel; only its unpacked screening is its own. */
    static uint64_t const families[] = {nk_cap_haswell_k,     nk_cap_skylake_k, nk_cap_icelake_k,
                                        nk_cap_sapphireamx_k, nk_cap_neon_k,    nk_cap_sve_k};
    static char const *family_names[] = {"haswell", "skylake", "icelake", "sapphireamx", "neon", "sve"};
    /* The unpacked path's two screenings: float32 (skylake's, also taken by icelake and sapphireamx)
     * and bfloat16 (genoa's). */
    static uint64_t const unpacked_families[] = {nk_cap_skylake_k, nk_cap_genoa_k};
    static char const *unpacked_names[] = {"skylake", "genoa"};
    uint64_t available = nk_capabilities_available();
    /* Every depth x shape, plus cases that cross the kernels' internal blocking: many documents,
     * many query rows, depths that chunk the screening, and one depth beyond int8 screening.
     * 8200 chunks every integer format's depth (uint1 too: 257 words) with a short last chunk;
     * 260 query rows cross integer_maxsim.h's query chunk of 256. 96 and 100: two 64-deep AMX steps,
     * the last one end-aligned, with the query tiles in registers (330 documents: the fused epilogue). */
    static uint64_t const extra[][3] = {{64, 3, 1100}, {64, 70, 600}, {129, 130, 33}, {4100, 3, 40}, {65536, 2, 17}, {65537, 2, 5},
                                         {64, 1, 2000}, {33, 16, 23}, {33, 16, 40}, {1, 28, 28}, {1, 31, 33},
                                         {64, 33, 1100}, {128, 17, 513}, {1100, 9, 20}, {2049, 3, 34},
                                         {4100, 2, 17}, {4111, 3, 5}, {8200, 2, 5}, {9, 260, 21}, {96, 40, 330},
                                         {100, 33, 200}};
    /* Quick mode: odd and round depths, partial tiles, and extras that cross document blocks,
     * query groups and depth chunks (8200: of every integer format). */
    static uint64_t const quick_depths[] = {1, 3, 16, 17, 31, 129};
    static uint64_t const quick_shapes[][2] = {{5, 3}, {7, 33}, {19, 70}};
    static uint64_t const quick_extra[][3] = {{64, 3, 1100}, {20, 19, 40}, {1100, 2, 9}, {4100, 2, 5}, {8200, 2, 5}};
    uint64_t const *depth_list = quick ? quick_depths : depths;
    uint64_t const(*shape_list)[2] = quick ? quick_shapes : shapes;
    uint64_t const(*extra_list)[3] = quick ? quick_extra : extra;
    size_t depth_count = quick ? sizeof(quick_depths) / sizeof(quick_depths[0]) : sizeof(depths) / sizeof(depths[0]);
    size_t shape_count = quick ? sizeof(quick_shapes) / sizeof(quick_shapes[0]) : sizeof(shapes) / sizeof(shapes[0]);
    size_t extra_count = quick ? sizeof(quick_extra) / sizeof(quick_extra[0]) : sizeof(extra) / sizeof(extra[0]);
    size_t case_count = depth_count * shape_count + extra_count;
    int failures = 0, checks = 0;
    uint64_t digest = 0xCBF29CE484222325ull; /* FNV-1a of serial's score bits: equal across machines */
    for (size_t f = 0; f < sizeof(families) / sizeof(families[0]); ++f)
        printf("%s: %s\n", family_names[f], (available & families[f]) ? "checked" : "not available");
    find_prescreens(available);
    for (size_t p = 0; p < prescreen_count; ++p) printf("prescreen %s: checked\n", prescreen_names[p]);
#ifdef NK_AMX_EMULATE
    printf("sapphireamx (emulated tile instructions): checked\n");
#endif
    for (int dtype = 1; dtype <= nk_dtype_uint1_k; ++dtype)
        for (size_t c = 0; c < case_count; ++c)
            for (int kind = 0; kind < kind_count; ++kind) {
                /* rows of 2^-70 .. 2^70 stay unscaled in float32 and bfloat16, whose products there over- and
                 * underflow float32 (the AVX-512 bfloat16 dot products' fallback) */
                if (kind == kind_wide_range && dtype != nk_dtype_float32_k && dtype != nk_dtype_bfloat16_k) continue;
                size_t e = c - depth_count * shape_count;
                uint64_t depth = c < depth_count * shape_count ? depth_list[c / shape_count] : extra_list[e][0];
                uint64_t nq = c < depth_count * shape_count ? shape_list[c % shape_count][0] : extra_list[e][1];
                uint64_t nd = c < depth_count * shape_count ? shape_list[c % shape_count][1] : extra_list[e][2];
                double *xq = malloc(nq * depth * sizeof(double)), *xd = malloc(nd * depth * sizeof(double));
                fill(xq, nq, depth, kind, NULL);
                fill(xd, nd, depth, kind,
                     kind == kind_near_ties || kind == kind_zero_docs || kind == kind_all_candidates ? xq : NULL);
                void *q = pack(xq, nq, depth, dtype), *d = pack(xd, nd, depth, dtype);
                double reference;
                nk_maxsim_score(q, d, nk_cap_serial_k, &reference);
                uint64_t bits;
                memcpy(&bits, &reference, sizeof bits);
                for (int byte = 0; byte < 8; ++byte) digest = (digest ^ ((bits >> (8 * byte)) & 0xFF)) * 0x100000001B3ull;
                for (size_t f = 0; f < sizeof(families) / sizeof(families[0]) + 1; ++f) {
                    double got;
                    if (f == sizeof(families) / sizeof(families[0])) { /* the emulated AMX family, if built */
#ifdef NK_AMX_EMULATE
                        nk_maxsim_matrix_t qm = {q, {0}}, dm = {d, {0}};
                        nk_maxsim_view_t qv, dv;
                        nk_maxsim_info(q, &qm.info), nk_maxsim_info(d, &dm.info);
                        nk_maxsim_view_init(&qm, &qv), nk_maxsim_view_init(&dm, &dv);
                        if (depth == 0 || depth > NK_SCREEN_MAX_DEPTH || nq == 0) continue;
                        scrub_stack();
                        got = nk_maxsim_sapphireamx_emulated(&qv, &dv);
#else
                        continue;
#endif
                    }
                    else {
                        if (!(available & families[f])) continue;
                        scrub_stack();
                        nk_maxsim_score(q, d, families[f], &got);
                    }
                    ++checks;
                    if (memcmp(&got, &reference, sizeof got) != 0) { /* the same bits, not just close */
                        ++failures;
                        printf("MISMATCH %s %s depth=%llu %llux%llu %s: %a vs serial %a (%.3g)\n",
                               f < sizeof(families) / sizeof(families[0]) ? family_names[f] : "sapphireamx (emulated)",
                               dtype_names[dtype], (unsigned long long)depth, (unsigned long long)nq,
                               (unsigned long long)nd, kind_names[kind], got, reference, got - reference);
                    }
                }
                failures += check_prescreens(q, d, nq, nd, depth, dtype, dtype_names[dtype], kind, reference, &checks);
                /* Float32 documents scored where they are (nk_maxsim_unpacked_f32): the same bits, or NaN
                 * only where the rows are beyond what it screens. */
                for (size_t f = 0; dtype == nk_dtype_float32_k && f < sizeof(unpacked_families) / sizeof(unpacked_families[0]);
                     ++f) {
                    if (!(available & unpacked_families[f]) || !nk_maxsim_unpacked_available(unpacked_families[f]) ||
                        nq == 0)
                        continue;
                    float *rows = malloc(nd * depth * sizeof(float));
                    for (uint64_t i = 0; i < nd * depth; ++i) rows[i] = (float)xd[i];
                    float const *documents[1] = {rows};
                    uint64_t counts[1] = {nd};
                    int64_t strides[1] = {(int64_t)(depth * sizeof(float))};
                    uint64_t scratch_bytes = nk_maxsim_unpacked_scratch_bytes(nq, depth, nd);
                    void *scratch = malloc(scratch_bytes);
                    nk_maxsim_matrix_t qm = {q, {0}};
                    nk_maxsim_info(q, &qm.info);
                    double got;
                    scrub_stack();
                    nk_status_t status = nk_maxsim_unpacked_f32(&qm, documents, counts, strides, 1, unpacked_families[f],
                                                                scratch, scratch_bytes, &got);
                    /* NaN: left for the caller to pack (beyond the screened depth, or rows of 2^+-70) */
                    int expected_nan = depth > NK_UNPACKED_MAX_DEPTH || kind == kind_wide_range;
                    ++checks;
                    if (status != nk_ok_k || (expected_nan ? !isnan(got) : memcmp(&got, &reference, sizeof got) != 0)) {
                        ++failures;
                        printf("MISMATCH unpacked %s depth=%llu %llux%llu %s: status %d, %a vs serial %a\n",
                               unpacked_names[f], (unsigned long long)depth, (unsigned long long)nq,
                               (unsigned long long)nd, kind_names[kind], (int)status, got, reference);
                    }
                    free(scratch), free(rows);
                }
                free(xq), free(xd), free(q), free(d);
            }
    printf("serial digest %016llx (%s cases)\n", (unsigned long long)digest, quick ? "quick" : "full");
    printf("%d passed, %d failed\n", checks - failures, failures);
    return failures != 0;
}
