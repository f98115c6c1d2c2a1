/* Packing, layout, validation and the derived sections (norms, screening copy). Baseline ISA. */
#include <float.h>
#include <math.h>

#include "maxsim_internal.h"

#define NK_PACK_ROWS_NAME nk_pack_rows_serial
#include "pack_rows.h"

size_t nk_dtype_itemsize(int dtype) {
    switch (dtype) {
    case nk_dtype_float64_k: return 8;
    case nk_dtype_float32_k: return 4;
    case nk_dtype_float16_k:
    case nk_dtype_bfloat16_k: return 2;
    case nk_dtype_e4m3_k:
    case nk_dtype_e5m2_k:
    case nk_dtype_e2m3_k:
    case nk_dtype_e3m2_k:
    case nk_dtype_int8_k: return 1;
    default: return 0;
    }
}

/* Inlined into nk_maxsim_view_init, which runs per call: only the offsets it reads are computed. */
NK_INLINE nk_status_t nk_row_bytes(int dtype, uint64_t depth, uint64_t *bytes) {
    if (nk_dtype_is_integer(dtype)) {
        uint64_t per_word = nk_integer_word_depths(dtype), words = depth / per_word + (depth % per_word != 0);
        return nk_u64_mul(words, 4, bytes) ? nk_ok_k : nk_error_overflow_k;
    }
    size_t itemsize = nk_dtype_itemsize(dtype);
    if (!itemsize) return nk_error_argument_k;
    return nk_u64_mul(depth, itemsize, bytes) ? nk_ok_k : nk_error_overflow_k;
}

nk_status_t nk_maxsim_row_bytes(int dtype, uint64_t depth, uint64_t *bytes) { return nk_row_bytes(dtype, depth, bytes); }

static int nk_align(uint64_t a, uint64_t *out) {
    if (!nk_u64_add(a, NK_SECTION_ALIGN - 1, out)) return 0;
    *out &= ~(uint64_t)(NK_SECTION_ALIGN - 1);
    return 1;
}

/* Append a section of count * item bytes at *cursor (aligned), return its offset. */
static int nk_section(uint64_t *cursor, uint64_t count, uint64_t item, uint64_t *offset) {
    uint64_t bytes;
    if (!nk_align(*cursor, offset) || !nk_u64_mul(count, item, &bytes) || !nk_u64_add(*offset, bytes, cursor)) return 0;
    return 1;
}

/* The whole layout as a function of (vectors, depth, dtype): the single source of every offset. */
NK_INLINE nk_status_t nk_layout(uint64_t vectors, uint64_t depth, int dtype, nk_maxsim_header_t *h) {
    uint64_t cursor = NK_HEADER_BYTES, row_bytes;
    nk_status_t status = nk_row_bytes(dtype, depth, &row_bytes);
    if (status != nk_ok_k) return status;
    memset(h, 0, sizeof(*h));
    memcpy(h->magic, NK_MAXSIM_MAGIC, 8);
    h->version = NK_MAXSIM_FORMAT_VERSION;
    h->dtype = (uint32_t)dtype;
    h->vectors = vectors;
    h->depth = depth;
    if (nk_dtype_is_integer(dtype)) { /* tiled values, then norms2 and scales (none for uint1) */
        uint64_t per_row = dtype == nk_dtype_uint1_k ? 0 : vectors;
        if (dtype != nk_dtype_uint1_k && depth > NK_INTEGER_MAX_DEPTH) return nk_error_argument_k;
        h->screen_depth = row_bytes / 4 * nk_integer_word_depths(dtype);
        if (!nk_section(&cursor, vectors, row_bytes, &h->values_offset) ||
            !nk_section(&cursor, per_row, sizeof(uint32_t), &h->inv_norms_offset) ||
            !nk_section(&cursor, 0, 1, &h->screen_offset) ||
            !nk_section(&cursor, per_row, sizeof(float), &h->screen_scales_offset) ||
            !nk_section(&cursor, 0, 1, &h->screen_errors_offset) || !nk_section(&cursor, 0, 1, &h->screen_sums_offset) ||
            !nk_align(cursor, &h->nbytes))
            return nk_error_overflow_k;
        if (h->nbytes > (uint64_t)INT64_MAX || h->nbytes > (uint64_t)SIZE_MAX) return nk_error_overflow_k;
        return nk_ok_k;
    }
    if (!nk_u64_add(depth, 3, &h->screen_depth)) return nk_error_overflow_k;
    h->screen_depth &= ~(uint64_t)3;
    if (!nk_section(&cursor, vectors, row_bytes, &h->values_offset) ||
        !nk_section(&cursor, vectors, sizeof(double), &h->inv_norms_offset) ||
        !nk_section(&cursor, vectors, h->screen_depth, &h->screen_offset) ||
        !nk_section(&cursor, vectors, sizeof(float), &h->screen_scales_offset) ||
        !nk_section(&cursor, vectors, sizeof(float), &h->screen_errors_offset) ||
        !nk_section(&cursor, vectors, sizeof(int32_t), &h->screen_sums_offset) || !nk_align(cursor, &h->nbytes))
        return nk_error_overflow_k;
    /* Keep every size addressable and every count a valid signed index for the kernels. */
    if (h->nbytes > (uint64_t)INT64_MAX || h->nbytes > (uint64_t)SIZE_MAX) return nk_error_overflow_k;
    return nk_ok_k;
}

nk_status_t nk_maxsim_layout(uint64_t vectors, uint64_t depth, int dtype, nk_maxsim_header_t *h) {
    return nk_layout(vectors, depth, dtype, h);
}

nk_status_t nk_maxsim_pack_size(uint64_t vectors, uint64_t depth, int dtype, uint64_t *nbytes) {
    nk_maxsim_header_t h;
    nk_status_t status = nk_maxsim_layout(vectors, depth, dtype, &h);
    if (status == nk_ok_k) *nbytes = h.nbytes;
    return status;
}

void nk_maxsim_view_init(nk_maxsim_matrix_t const *matrix, nk_maxsim_view_t *view) {
    /* The info was validated with this same layout, so it cannot fail here; zeroed all the same, for
     * compilers that cannot see that. */
    nk_maxsim_header_t h = {0};
    nk_layout(matrix->info.vectors, matrix->info.depth, (int)matrix->info.dtype, &h);
    char const *base = (char const *)matrix->data;
    view->dtype = h.dtype;
    view->vectors = h.vectors;
    view->depth = h.depth;
    view->screen_depth = h.screen_depth;
    nk_row_bytes((int)h.dtype, h.depth, &view->row_bytes);
    view->values = base + h.values_offset;
    view->norms2 = NULL, view->scales = NULL;
    if (nk_dtype_is_integer((int)h.dtype)) {
        int sized = h.dtype != nk_dtype_uint1_k;
        view->inv_norms = NULL, view->screen = NULL, view->screen_scales = NULL;
        view->screen_errors = NULL, view->screen_sums = NULL;
        view->norms2 = sized ? (uint32_t const *)(base + h.inv_norms_offset) : NULL;
        view->scales = sized ? (float const *)(base + h.screen_scales_offset) : NULL;
    }
    else {
        view->inv_norms = (double const *)(base + h.inv_norms_offset);
        view->screen = (uint8_t const *)(base + h.screen_offset);
        view->screen_scales = (float const *)(base + h.screen_scales_offset);
        view->screen_errors = (float const *)(base + h.screen_errors_offset);
        view->screen_sums = (int32_t const *)(base + h.screen_sums_offset);
    }
    view->cold = 0;
    view->next = nk_prefetch_stream(NULL, 0, NULL, 0);
    view->stop_above = INFINITY;
}

void const *nk_maxsim_values(nk_maxsim_matrix_t const *matrix) {
    nk_maxsim_header_t h;
    if (nk_dtype_is_integer((int)matrix->info.dtype) ||
        nk_maxsim_layout(matrix->info.vectors, matrix->info.depth, (int)matrix->info.dtype, &h) != nk_ok_k)
        return NULL;
    return (char const *)matrix->data + h.values_offset;
}

uint32_t nk_maxsim_format_version(void const *buf, uint64_t nbytes) {
    uint32_t version;
    if (!buf || nbytes < 12 || memcmp(buf, NK_MAXSIM_MAGIC, 8) != 0) return 0;
    memcpy(&version, (char const *)buf + 8, sizeof(version));
    return version;
}

nk_status_t nk_maxsim_info(void const *buf, nk_maxsim_info_t *info) {
    nk_maxsim_header_t const *h = (nk_maxsim_header_t const *)buf;
    if (!buf || memcmp(h->magic, NK_MAXSIM_MAGIC, 8) != 0) return nk_error_corrupt_k;
    info->vectors = h->vectors;
    info->depth = h->depth;
    info->nbytes = h->nbytes;
    info->capabilities = h->capabilities;
    info->dtype = h->dtype;
    return nk_ok_k;
}

/* ---- Integer formats: tiled values, exact integer norms. ---- */

static uint64_t nk_integer_row_bytes(nk_maxsim_header_t const *h) { return h->screen_depth / nk_integer_word_depths((int)h->dtype) * 4; }

/* Store q (uint1: the sign, q > 0 sets the bit) as element k of `row`. */
static void nk_integer_put(nk_maxsim_header_t const *h, uint8_t *values, uint64_t row, uint64_t k, int q) {
    int dtype = (int)h->dtype;
    uint64_t per_word = nk_integer_word_depths(dtype), j = k % per_word;
    uint8_t *word = values + nk_tile_word_offset(h->vectors, nk_integer_row_bytes(h), row, k / per_word);
    switch (dtype) {
    case nk_dtype_int8_k: word[j] = (uint8_t)(q + 128); break;
    case nk_dtype_int4_k:
        if (j < 4) word[j] = (uint8_t)((word[j] & 0xF0u) | (uint8_t)(q + 8));
        else word[j - 4] = (uint8_t)((word[j - 4] & 0x0Fu) | (uint8_t)((q + 8) << 4));
        break;
    default:
        if (q > 0) word[j / 8] |= (uint8_t)(1u << (j % 8));
        else word[j / 8] &= (uint8_t)~(1u << (j % 8));
        break;
    }
}

/* Row `row` of an integer format from `source` (int8 rows for int8: bit-exact, scale 1; otherwise
 * float64 rows, scaled so that the largest magnitude maps to the top code). Reads each source element
 * once, so a source changing meanwhile cannot store an out-of-range code. */
static nk_status_t nk_pack_integer_row(nk_maxsim_header_t const *h, char *base, uint64_t row, int source_dtype,
                                       void const *source) {
    int dtype = (int)h->dtype;
    uint8_t *values = (uint8_t *)base + h->values_offset;
    float scale = 1.0f;
    if (source_dtype == nk_dtype_int8_k) {
        for (uint64_t k = 0; k < h->depth; ++k) {
            int q = ((int8_t const *)source)[k];
            if (q == -128) return nk_error_range_k;
            nk_integer_put(h, values, row, k, q);
        }
    }
    else {
        double const *x = (double const *)source;
        double absmax;
        double span[NK_SPAN];
        if (!nk_row_absmax(nk_dtype_float64_k, x, h->depth, &absmax, span)) return nk_error_nonfinite_k;
        double limit = dtype == nk_dtype_int8_k ? 127.0 : 7.0, multiplier = 0.0;
        int shift = 0;
        if (dtype != nk_dtype_uint1_k && absmax > 0.0) {
            /* A scale outside float32's normal range: the row is first scaled by a power of two
             * (cosine is scale-free), as the narrow float formats are. By ldexp, not by a factor:
             * 2^-exponent overflows a double for subnormal rows. */
            if (!(absmax / limit >= FLT_MIN && absmax / limit <= FLT_MAX / 2)) {
                int exponent;
                frexp(absmax, &exponent);
                shift = -exponent; /* absmax * 2^shift in [0.5, 1) */
            }
            scale = (float)(ldexp(absmax, shift) / limit);
            multiplier = 1.0 / (double)scale;
        }
        else if (dtype != nk_dtype_uint1_k)
            scale = 0.0f;
        for (uint64_t k = 0; k < h->depth; ++k) {
            double v = x[k];
            if (!(fabs(v) <= DBL_MAX)) return nk_error_nonfinite_k; /* changed since absmax */
            int q;
            if (dtype == nk_dtype_uint1_k) q = v >= 0.0 ? 1 : -1; /* zero counts as +1 */
            else {
                double r = nk_round_even((shift ? ldexp(v, shift) : v) * multiplier);
                q = (int)(r > limit ? limit : r < -limit ? -limit : r);
            }
            nk_integer_put(h, values, row, k, q);
        }
    }
    for (uint64_t k = h->depth; k < h->screen_depth; ++k) nk_integer_put(h, values, row, k, 0); /* padding */
    if (dtype != nk_dtype_uint1_k) memcpy(base + h->screen_scales_offset + row * sizeof(float), &scale, sizeof(float));
    return nk_ok_k;
}

/* Stored codes in range (int8 never -128, int4 never -8), padding the zero code, a finite scale >= 0. */
static int nk_integer_row_is_valid(nk_maxsim_header_t const *h, char const *base, uint64_t row) {
    int dtype = (int)h->dtype, lowest = dtype == nk_dtype_int8_k ? -128 : dtype == nk_dtype_int4_k ? -8 : -2;
    uint8_t const *values = (uint8_t const *)base + h->values_offset;
    uint64_t row_bytes = nk_integer_row_bytes(h);
    for (uint64_t k = 0; k < h->screen_depth; ++k) {
        int q = nk_integer_at(dtype, values, h->vectors, row_bytes, row, k);
        if (q == lowest) return 0;
        if (k >= h->depth && q != (dtype == nk_dtype_uint1_k ? -1 : 0)) return 0; /* padding: bit 0 or q = 0 */
    }
    if (dtype == nk_dtype_uint1_k) return 1;
    float scale;
    memcpy(&scale, base + h->screen_scales_offset + row * sizeof(float), sizeof(float));
    return scale >= 0.0f && scale <= FLT_MAX;
}

/* norms2 of one int8 / int4 row (uint1 has none): written, or (verify) compared. */
static int nk_derive_integer_row(nk_maxsim_header_t const *h, char *base, uint64_t row, int verify) {
    int dtype = (int)h->dtype;
    if (dtype == nk_dtype_uint1_k) return 1;
    uint64_t norm2 = 0, row_bytes = nk_integer_row_bytes(h);
    for (uint64_t k = 0; k < h->depth; ++k) {
        int q = nk_integer_at(dtype, (uint8_t const *)base + h->values_offset, h->vectors, row_bytes, row, k);
        norm2 += (uint64_t)(q * q);
    }
    uint32_t stored = (uint32_t)norm2; /* <= 127^2 x NK_INTEGER_MAX_DEPTH < 2^32 */
    return nk_put(base + h->inv_norms_offset + row * sizeof(uint32_t), &stored, sizeof(uint32_t), verify);
}

nk_status_t nk_maxsim_dequantize(nk_maxsim_matrix_t const *matrix, uint64_t first, uint64_t count, double *out) {
    if (!matrix || !matrix->data || (count && !out) || first > matrix->info.vectors ||
        count > matrix->info.vectors - first)
        return nk_error_argument_k;
    nk_maxsim_view_t view;
    nk_maxsim_view_init(matrix, &view);
    int dtype = (int)view.dtype;
    for (uint64_t r = 0; r < count; ++r) {
        uint64_t row = first + r;
        double *target = out + r * view.depth;
        if (!nk_dtype_is_integer(dtype)) {
            nk_decode_span(dtype, (char const *)view.values + row * view.row_bytes, 0, view.depth, target);
            continue;
        }
        double scale = view.scales ? (double)view.scales[row] : 1.0;
        for (uint64_t k = 0; k < view.depth; ++k)
            target[k] = scale * nk_integer_at(dtype, (uint8_t const *)view.values, view.vectors, view.row_bytes, row, k);
    }
    return nk_ok_k;
}

#ifdef NK_HAVE_PACK_HASWELL
extern nk_pack_rows_t const nk_pack_rows_haswell;
#endif
#ifdef NK_HAVE_PACK_SKYLAKE
extern nk_pack_rows_t const nk_pack_rows_skylake;
#endif

/* The row routines to pack with under `capabilities` (the caller's restriction, or every family): the
 * widest compilation that one of the allowed families covers and this CPU runs, else the portable
 * one; all store the same bytes. */
static nk_pack_rows_t const *nk_pack_rows_for(uint64_t capabilities) {
    uint64_t available = nk_capabilities_available();
    (void)available;
#ifdef NK_HAVE_PACK_SKYLAKE
    if ((capabilities & (nk_cap_skylake_k | nk_cap_icelake_k | nk_cap_genoa_k | nk_cap_sapphireamx_k)) &&
        (available & nk_cap_skylake_k))
        return &nk_pack_rows_skylake;
#endif
#ifdef NK_HAVE_PACK_HASWELL
    if ((capabilities & (nk_cap_haswell_k | nk_cap_skylake_k | nk_cap_icelake_k | nk_cap_genoa_k | nk_cap_sapphireamx_k)) &&
        (available & nk_cap_haswell_k))
        return &nk_pack_rows_haswell;
#endif
    (void)capabilities;
    return &nk_pack_rows_serial;
}

int nk_prescreen_build(nk_maxsim_view_t const *d, uint8_t *document, nk_prescreen_layout_t const *layout,
                       uint64_t capabilities, int check) {
    nk_pack_rows_t const *rows = nk_pack_rows_for(capabilities);
    int equal = 1;
    for (uint64_t t = 0; t < layout->tiles; ++t)
        equal &= rows->prescreen_tile(d, t, document + layout->codes_offset + t * 1024 * layout->pairs,
                                        (float *)(void *)(document + layout->scales_offset) + 16 * t,
                                        (float *)(void *)(document + layout->errors_offset) + 16 * t, layout->pairs,
                                        check);
    return equal;
}

/* Derive one row's sections: written, or (verify) compared bit for bit; 0 on mismatch. */
static int nk_derive_row(nk_pack_rows_t const *rows, nk_maxsim_header_t const *h, char *base, uint64_t row,
                         int verify) {
    if (nk_dtype_is_integer((int)h->dtype)) return nk_derive_integer_row(h, base, row, verify);
    return rows->derive_float_row(h, base, row, verify);
}

static int nk_derive_all(nk_maxsim_header_t const *h, char *base, int verify) {
    nk_pack_rows_t const *rows = nk_pack_rows_for(nk_cap_families_k);
    for (uint64_t row = 0; row < h->vectors; ++row)
        if (!nk_derive_row(rows, h, base, row, verify)) return 0;
    return 1;
}

/* Zero the bytes of a float format's buffer that no row writes: the header's tail, the alignment gaps
 * between sections and after the last. */
static void nk_zero_gaps(nk_maxsim_header_t const *h, char *base) {
    uint64_t n = h->vectors, row_bytes = h->depth * nk_dtype_itemsize((int)h->dtype), cursor = sizeof(*h);
    uint64_t const sections[6][2] = {{h->values_offset, n * row_bytes},
                                     {h->inv_norms_offset, n * sizeof(double)},
                                     {h->screen_offset, n * h->screen_depth},
                                     {h->screen_scales_offset, n * sizeof(float)},
                                     {h->screen_errors_offset, n * sizeof(float)},
                                     {h->screen_sums_offset, n * sizeof(int32_t)}};
    for (int i = 0; i < 6; ++i) { /* sizes checked by nk_maxsim_layout */
        memset(base + cursor, 0, (size_t)(sections[i][0] - cursor));
        cursor = sections[i][0] + sections[i][1];
    }
    memset(base + cursor, 0, (size_t)(h->nbytes - cursor));
}

nk_status_t nk_maxsim_pack(void const *src, int source_dtype, int64_t row_stride, uint64_t vectors, uint64_t depth,
                           int dtype, uint64_t capabilities, void *out, uint64_t out_nbytes, uint64_t *bad_row) {
    nk_maxsim_header_t h;
    nk_status_t status = nk_maxsim_layout(vectors, depth, dtype, &h);
    if (status != nk_ok_k) return status;
    /* Float formats take their own rows and float64, float32, float16 or bfloat16 rows (each decodes
     * exactly to float64); integer formats take float64 rows, and int8 takes int8 rows as they are. */
    int wide_source = source_dtype >= nk_dtype_float64_k && source_dtype <= nk_dtype_bfloat16_k;
    int accepted = nk_dtype_is_integer(dtype)
                       ? source_dtype == nk_dtype_float64_k || (source_dtype == nk_dtype_int8_k && dtype == nk_dtype_int8_k)
                       : source_dtype == dtype || wide_source;
    if (!accepted) return nk_error_argument_k;
    if (!out || (((uintptr_t)out) % NK_SECTION_ALIGN) != 0 || (!src && vectors && depth)) return nk_error_argument_k;
    if (out_nbytes < h.nbytes) return nk_error_buffer_small_k;
    h.capabilities = capabilities;

    char *base = (char *)out;
    /* Padding bytes are deterministic: zeros. Float formats write every byte of their sections, so
     * only the gaps are cleared (the output is often fresh memory, faulted in by the first write). */
    if (nk_dtype_is_integer(dtype)) memset(base, 0, h.nbytes);
    else nk_zero_gaps(&h, base);
    memcpy(base, &h, sizeof(h));
    /* A float row derives its sections as it is stored; integer rows get their norms afterwards. */
    nk_status_t (*pack_row)(nk_maxsim_header_t const *, char *, uint64_t, int, void const *) =
        nk_dtype_is_integer(dtype) ? nk_pack_integer_row : nk_pack_rows_for(capabilities)->pack_float_row;
    for (uint64_t row = 0; row < vectors; ++row) {
        status = pack_row(&h, base, row, source_dtype, (char const *)src + (int64_t)row * row_stride);
        if (status != nk_ok_k) {
            if (bad_row) *bad_row = row;
            return status;
        }
    }
    if (nk_dtype_is_integer(dtype)) nk_derive_all(&h, base, 0);
    return nk_ok_k;
}

/* Header, layout and stored values of untrusted bytes; fills *header. */
static nk_status_t nk_check(void const *buf, uint64_t nbytes, nk_maxsim_header_t *header) {
    if (!buf || ((uintptr_t)buf) % NK_SECTION_ALIGN != 0) return nk_error_argument_k;
    if (nbytes < NK_HEADER_BYTES) return nk_error_corrupt_k;
    nk_maxsim_header_t expected;
    memcpy(header, buf, sizeof(*header));
    if (memcmp(header->magic, NK_MAXSIM_MAGIC, 8) != 0) return nk_error_corrupt_k;
    if (header->version != NK_MAXSIM_FORMAT_VERSION) return nk_error_version_k;
    if (nk_maxsim_layout(header->vectors, header->depth, (int)header->dtype, &expected) != nk_ok_k) return nk_error_corrupt_k;
    expected.capabilities = header->capabilities;
    if (memcmp(header, &expected, sizeof(expected)) != 0 || expected.nbytes != nbytes) return nk_error_corrupt_k;
    char const *base = (char const *)buf;
    if (nk_dtype_is_integer((int)header->dtype)) {
        for (uint64_t row = 0; row < header->vectors; ++row)
            if (!nk_integer_row_is_valid(header, base, row)) return nk_error_corrupt_k;
        return nk_ok_k;
    }
    size_t row_bytes = (size_t)(header->depth * nk_dtype_itemsize((int)header->dtype));
    nk_pack_rows_t const *rows = nk_pack_rows_for(nk_cap_families_k);
    for (uint64_t row = 0; row < header->vectors; ++row)
        if (!rows->float_row_is_valid((int)header->dtype, base + header->values_offset + row * row_bytes, header->depth))
            return nk_error_corrupt_k;
    return nk_ok_k;
}

nk_status_t nk_maxsim_load(void *buf, uint64_t nbytes, nk_maxsim_info_t *info) {
    nk_maxsim_header_t header;
    nk_status_t status = nk_check(buf, nbytes, &header);
    if (status != nk_ok_k) return status;
    nk_derive_all(&header, (char *)buf, 0);
    return nk_maxsim_info(buf, info);
}

nk_status_t nk_maxsim_verify(void const *buf, uint64_t nbytes, nk_maxsim_info_t *info) {
    nk_maxsim_header_t header;
    nk_status_t status = nk_check(buf, nbytes, &header);
    if (status != nk_ok_k) return status;
    /* Verification only reads: the cast drops const for the shared derive/compare routine. */
    if (!nk_derive_all(&header, (char *)(uintptr_t)buf, 1)) return nk_error_corrupt_k;
    return nk_maxsim_info(buf, info);
}
