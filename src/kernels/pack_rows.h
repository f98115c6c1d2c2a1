/* The packer's float-format row routines: rounding to the packing formats, the largest-magnitude
 * check, the screening copy and the derived sections of one row, and a corpus document's prescreen
 * tiles. Included by pack.c (the portable build, table nk_pack_rows_serial) and compiled again by
 * pack_rows.c with a SIMD family's flags:
 * the same C under -ffp-contract=off gives the same bytes, only in wider vectors, and under AVX-512
 * the span loops below are written with intrinsics doing the same float64 operations in the same
 * order (the compiler left the largest-magnitude scans scalar: float32 rows packed 1.9x faster in
 * place with them). NK_PACK_ROWS_NAME names the table this compilation exports. */
#ifndef NUMKONG_PACK_ROWS_H
#define NUMKONG_PACK_ROWS_H
#include <float.h>
#include <math.h>
#if defined(__F16C__) || defined(__AVX512F__)
#include <immintrin.h>
#endif

#include "maxsim_internal.h"

/* One compilation's row routines (the packer picks one table per call: nk_pack_rows_for). */
typedef struct nk_pack_rows {
    nk_status_t (*pack_float_row)(nk_maxsim_header_t const *h, char *base, uint64_t row, int source_dtype,
                                  void const *source_row);
    int (*derive_float_row)(nk_maxsim_header_t const *h, char *base, uint64_t row, int verify);
    int (*float_row_is_valid)(int dtype, void const *row, uint64_t depth);
    int (*prescreen_tile)(nk_maxsim_view_t const *d, uint64_t t, uint8_t *codes, float *scales, float *errors,
                          uint64_t pairs, int check);
} nk_pack_rows_t;

/* ---- Rounding float64 to the packing formats (round-to-nearest-even). ---- */

typedef struct nk_format {
    int exponent_bits, mantissa_bits, bias;
    double max_finite;
} nk_format_t;

static nk_format_t nk_format_of(int dtype) {
    switch (dtype) {
    case nk_dtype_float16_k: return (nk_format_t){5, 10, 15, 65504.0};
    case nk_dtype_bfloat16_k: return (nk_format_t){8, 7, 127, 3.3895313892515355e38};
    case nk_dtype_e4m3_k: return (nk_format_t){4, 3, 7, 448.0};
    case nk_dtype_e5m2_k: return (nk_format_t){5, 2, 15, 57344.0};
    case nk_dtype_e2m3_k: return (nk_format_t){2, 3, 1, 7.5};
    case nk_dtype_e3m2_k: return (nk_format_t){3, 2, 3, 28.0};
    default: return (nk_format_t){0, 0, 0, 0.0};
    }
}

/* Encode a finite value with |value| <= max_finite, given as its float64 bits: round-to-nearest-even in
 * integer arithmetic (no libm, one branch); returns sign-magnitude bits, sign at bit 1+e+m. */
static inline uint32_t nk_encode_minifloat(uint64_t bits, nk_format_t f) {
    uint32_t sign = (uint32_t)(bits >> 63) << (f.exponent_bits + f.mantissa_bits);
    uint64_t magnitude = bits & ~((uint64_t)1 << 63), biased = magnitude >> 52;
    if (biased >= (uint64_t)(1024 - f.bias)) {
        /* Normal result: round the 52-bit mantissa to nearest even; a carry moves into the exponent
         * by itself. */
        int drop = 52 - f.mantissa_bits;
        uint64_t rounded = (magnitude + (((uint64_t)1 << (drop - 1)) - 1) + ((magnitude >> drop) & 1)) >> drop;
        return sign | (uint32_t)(rounded - ((uint64_t)(1023 - f.bias) << f.mantissa_bits));
    }
    /* Subnormal result (or zero): the count of the smallest subnormal 2^(1-bias-m) in the value,
     * rounded to even; 2^m counts is the smallest normal code by itself. */
    uint64_t significand = (magnitude & (((uint64_t)1 << 52) - 1)) | (biased ? (uint64_t)1 << 52 : 0);
    int shift = 1076 - f.bias - f.mantissa_bits - (biased ? (int)biased : 1); /* >= 53 - m >= 1 */
    if (shift > 62) return sign; /* the significand is below 2^53, half a count */
    uint64_t counts = (significand + (((uint64_t)1 << (shift - 1)) - 1) + ((significand >> shift) & 1)) >> shift;
    return sign | (uint32_t)counts;
}

/* The same rounding from a float32 value (finite, |y| <= the format's max_finite), without branches so
 * that loops of it vectorize. Only for values whose float64 -> float32 conversion was exact or lands
 * below the format's smallest subnormal's half (both: the same code as nk_encode_minifloat). */
static inline uint16_t nk_bf16_from_f32(float y) {
    uint32_t bits;
    memcpy(&bits, &y, 4);
    return (uint16_t)((bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16); /* float32's subnormals align too */
}

static inline uint16_t nk_f16_from_f32(float y) {
    uint32_t bits, sign, magnitude, aligned_bits;
    memcpy(&bits, &y, 4);
    sign = (bits >> 16) & 0x8000u, magnitude = bits & 0x7FFFFFFFu;
    /* Normal half: drop 13 mantissa bits to nearest even and rebias (a carry moves into the exponent). */
    uint32_t normal = (magnitude + 0xFFFu + ((magnitude >> 13) & 1u) - ((uint32_t)(127 - 15) << 23)) >> 13;
    /* Below 2^-14: adding 0.5 makes float32 itself round |y| to a multiple of 2^-24 (its ulp there), to
     * nearest even; the count lands in the low bits, 1024 being the smallest normal half. */
    float aligned = fabsf(y) + 0.5f;
    memcpy(&aligned_bits, &aligned, 4);
    uint32_t below = 0u - (uint32_t)(magnitude < 0x38800000u); /* a mask: the compiler vectorizes it */
    return (uint16_t)(sign | ((aligned_bits - 0x3F000000u) & below) | (normal & ~below));
}

/* Largest magnitudes whose products and norms stay safe in float64 accumulation. */
#define NK_F64_SAFE_LOG2 400
#define NK_F32_SAFE_LOG2 100

/* Power-of-two exponent to scale a row with largest magnitude `absmax` by (0: leave as is).
 * Wide formats are only rescaled when outside their safe range (to [1, 2)); narrow formats
 * being cast are always brought to the top of their range so nothing overflows or flushes. */
static int nk_row_scale_exponent(int dtype, int casting, double absmax) {
    if (absmax == 0.0) return 0;
    int exponent;
    frexp(absmax, &exponent); /* absmax in [2^(exponent-1), 2^exponent) */
    int log2_floor = exponent - 1;
    switch (dtype) {
    case nk_dtype_float64_k:
        return (log2_floor < -NK_F64_SAFE_LOG2 || log2_floor >= NK_F64_SAFE_LOG2) ? -log2_floor : 0;
    case nk_dtype_float32_k:
    case nk_dtype_bfloat16_k:
        if (!casting) return 0;
        return (log2_floor < -NK_F32_SAFE_LOG2 || log2_floor >= NK_F32_SAFE_LOG2) ? -log2_floor : 0;
    default: {
        if (!casting) return 0;
        nk_format_t f = nk_format_of(dtype);
        int top;
        frexp(f.max_finite, &top);
        int shift = (top - 1) - log2_floor;
        if (ldexp(absmax, shift) > f.max_finite) shift -= 1;
        return shift;
    }
    }
}

/* Elements [start, start + count) of a row, decoded exactly to double (the switch outside the loop). */
#define NK_SPAN 256
static void nk_decode_span(int dtype, void const *row, uint64_t start, uint64_t count, double *out) {
    uint8_t const *bytes = (uint8_t const *)row + start * nk_dtype_itemsize(dtype);
    uint16_t const *halves = (uint16_t const *)bytes;
    switch (dtype) {
    case nk_dtype_float64_k: memcpy(out, bytes, count * sizeof(double)); break;
    case nk_dtype_float32_k:
        for (uint64_t i = 0; i < count; ++i) out[i] = ((float const *)bytes)[i];
        break;
    case nk_dtype_float16_k: {
        uint64_t i = 0;
#if defined(__F16C__)
        /* The hardware conversion is exact too (a NaN stays a NaN: only finite rows are kept), and the
         * compiler leaves the portable decoder scalar: float16 rows decode 8 at a time. */
        for (; i + 8 <= count; i += 8) {
            __m256 wide = _mm256_cvtph_ps(_mm_loadu_si128((__m128i const *)(halves + i)));
            _mm256_storeu_pd(out + i, _mm256_cvtps_pd(_mm256_castps256_ps128(wide)));
            _mm256_storeu_pd(out + i + 4, _mm256_cvtps_pd(_mm256_extractf128_ps(wide, 1)));
        }
#endif
        for (; i < count; ++i) out[i] = nk_half_to_f32(halves[i]);
        break;
    }
    case nk_dtype_bfloat16_k:
        for (uint64_t i = 0; i < count; ++i) out[i] = nk_f32_from_bits((uint32_t)halves[i] << 16);
        break;
    default: /* 8- and 6-bit formats: a 256-entry table would need global state; decode per element */
        for (uint64_t i = 0; i < count; ++i) out[i] = nk_decode(dtype, bytes, i);
        break;
    }
}

/* Round to nearest even for |x| < 2^51 without a libm call: adding 1.5 * 2^52 leaves no fraction bits. */
static inline double nk_round_even(double x) { return (x + 6755399441055744.0) - 6755399441055744.0; }

/* One element of a unit row quantized for the screening copy: round(u * multiplier) in [-127, 127]. */
static inline double nk_quantize(double u, double multiplier) {
    double q = nk_round_even(u * multiplier);
    return q > 127.0 ? 127.0 : q < -127.0 ? -127.0 : q;
}

/* A row decoded span by span; a row of at most NK_SPAN elements is decoded once and then kept. */
typedef struct nk_span {
    double values[NK_SPAN];
    int holds_row;
} nk_span_t;

/* Elements [start, start + padded) of a row (zeros past depth) into span->values; padded is a
 * multiple of 4, at most NK_SPAN. */
static void nk_row_span(int dtype, void const *row, uint64_t depth, uint64_t start, uint64_t padded, nk_span_t *span) {
    uint64_t count = start >= depth ? 0 : (depth - start < padded ? depth - start : padded);
    if (!span->holds_row) {
        nk_decode_span(dtype, row, start, count, span->values);
        span->holds_row = depth <= NK_SPAN;
    }
    for (uint64_t i = count; i < padded; ++i) span->values[i] = 0.0;
}

/* The loops over one decoded span of a row. The derived sections' two, over `padded` (a multiple of 4)
 * values, are each a fixed sequence of float64 operations, so that every table writes the same bytes:
 *   nk_span_squares: squares[j] += v[i + j] * v[i + j] for i = 0, 4, 8, ... in turn, and
 *       *largest = the larger of itself and every |v| (a maximum: exact in any order);
 *   nk_span_quantize: u = v * inv_norm, q = nk_quantize(u, multiplier), codes[i] = q, and
 *       lanes[j] += (u - q * step)^2 for i = 0, 4, 8, ... in turn;
 * and the packer's check, nk_span_largest: the same maximum over `count` values, and whether all of
 * them are finite.
 * The AVX-512 bodies do the same operations 8 at a time; a 4-lane sum is one 256-bit chain fed the
 * low, then the high half of each 8-value vector, which is the portable order. */
#if defined(__AVX512F__) && defined(__AVX512VL__) && defined(__AVX512DQ__) && defined(__AVX512BW__)

static void nk_span_squares(double const *v, uint64_t padded, double squares[4], double *largest) {
    __m256d sum = _mm256_loadu_pd(squares);
    __m512d top = _mm512_set1_pd(*largest), other = top; /* two maxima: a shorter chain */
    uint64_t i = 0;
    for (; i + 16 <= padded; i += 16) {
        __m512d x = _mm512_loadu_pd(v + i), y = _mm512_loadu_pd(v + i + 8);
        __m512d square = _mm512_mul_pd(x, x), next = _mm512_mul_pd(y, y);
        sum = _mm256_add_pd(sum, _mm512_castpd512_pd256(square));
        sum = _mm256_add_pd(sum, _mm512_extractf64x4_pd(square, 1));
        sum = _mm256_add_pd(sum, _mm512_castpd512_pd256(next));
        sum = _mm256_add_pd(sum, _mm512_extractf64x4_pd(next, 1));
        top = _mm512_max_pd(top, _mm512_abs_pd(x));
        other = _mm512_max_pd(other, _mm512_abs_pd(y));
    }
    for (; i < padded; i += 4) {
        __m512d x = _mm512_maskz_loadu_pd(0x0F, v + i), square = _mm512_mul_pd(x, x);
        sum = _mm256_add_pd(sum, _mm512_castpd512_pd256(square));
        top = _mm512_max_pd(top, _mm512_abs_pd(x));
    }
    _mm256_storeu_pd(squares, sum);
    *largest = _mm512_reduce_max_pd(_mm512_max_pd(top, other));
}

static void nk_span_quantize(double const *v, uint64_t padded, double inv_norm, double multiplier, double step,
                             double lanes[4], int8_t *codes) {
    __m512d scale = _mm512_set1_pd(inv_norm), times = _mm512_set1_pd(multiplier), size = _mm512_set1_pd(step);
    __m512d shift = _mm512_set1_pd(6755399441055744.0), low = _mm512_set1_pd(-127.0), high = _mm512_set1_pd(127.0);
    __m256d sum = _mm256_loadu_pd(lanes);
    for (uint64_t i = 0; i < padded; i += 8) {
        __mmask8 present = padded - i >= 8 ? (__mmask8)0xFF : (__mmask8)0x0F;
        __m512d u = _mm512_mul_pd(_mm512_maskz_loadu_pd(present, v + i), scale);
        __m512d q = _mm512_sub_pd(_mm512_add_pd(_mm512_mul_pd(u, times), shift), shift); /* nk_round_even */
        q = _mm512_min_pd(_mm512_max_pd(q, low), high);
        __m512d residual = _mm512_sub_pd(u, _mm512_mul_pd(q, size)), square = _mm512_mul_pd(residual, residual);
        sum = _mm256_add_pd(sum, _mm512_castpd512_pd256(square));
        if (present == 0xFF) sum = _mm256_add_pd(sum, _mm512_extractf64x4_pd(square, 1));
        _mm_mask_storeu_epi8(codes + i, present, _mm256_cvtepi32_epi8(_mm512_cvtpd_epi32(q)));
    }
    _mm256_storeu_pd(lanes, sum);
}
/* *largest = the larger of itself and every |v| of `count` values; 0 when one is a NaN or infinite. */
static int nk_span_largest(double const *v, uint64_t count, double *largest) {
    __m512d top = _mm512_set1_pd(*largest), limit = _mm512_set1_pd(DBL_MAX);
    __mmask8 finite = 0xFF;
    for (uint64_t i = 0; i < count; i += 8) {
        __mmask8 present = count - i >= 8 ? (__mmask8)0xFF : (__mmask8)((1u << (count - i)) - 1u);
        __m512d x = _mm512_abs_pd(_mm512_maskz_loadu_pd(present, v + i));
        finite &= _mm512_cmp_pd_mask(x, limit, _CMP_LE_OQ); /* NaN and infinity fail */
        top = _mm512_max_pd(top, x);
    }
    *largest = _mm512_reduce_max_pd(top);
    return finite == 0xFF;
}
#else
static void nk_span_squares(double const *v, uint64_t padded, double squares[4], double *largest) {
    double top[4] = {*largest, *largest, *largest, *largest};
    for (uint64_t i = 0; i < padded; i += 4) /* apart, so that the compiler vectorizes both chains */
        for (int j = 0; j < 4; ++j) {
            double magnitude = fabs(v[i + j]);
            squares[j] += v[i + j] * v[i + j];
            top[j] = magnitude > top[j] ? magnitude : top[j];
        }
    for (int j = 0; j < 4; ++j) *largest = top[j] > *largest ? top[j] : *largest;
}

static void nk_span_quantize(double const *v, uint64_t padded, double inv_norm, double multiplier, double step,
                             double lanes[4], int8_t *codes) {
    double residuals[NK_SPAN];
    for (uint64_t i = 0; i < padded; ++i) { /* two flat loops that the compiler vectorizes */
        double u = v[i] * inv_norm, q = nk_quantize(u, multiplier), residual = u - q * step;
        residuals[i] = residual * residual;
        codes[i] = (int8_t)q;
    }
    for (uint64_t i = 0; i < padded; i += 4)
        for (int j = 0; j < 4; ++j) lanes[j] += residuals[i + j];
}

static int nk_span_largest(double const *v, uint64_t count, double *largest) {
    double top[16];
    int finite = 1;
    for (int j = 0; j < 16; ++j) top[j] = *largest;
    uint64_t i = 0;
    for (; i + 16 <= count; i += 16) /* branch-free in 16 lanes: it vectorizes, with short chains */
        for (int j = 0; j < 16; ++j) {
            double x = fabs(v[i + j]);
            finite &= x <= DBL_MAX; /* NaN and infinity fail */
            top[j] = x > top[j] ? x : top[j];
        }
    for (; i < count; ++i) {
        double x = fabs(v[i]);
        finite &= x <= DBL_MAX;
        top[0] = x > top[0] ? x : top[0];
    }
    for (int j = 0; j < 16; ++j) *largest = top[j] > *largest ? top[j] : *largest;
    return finite;
}
#endif

/* Quantize the unit row u = values * inv_norm with each step (steps[1] == 0: only the first): the codes
 * q = round(u / step) in [-127, 127] of elements [0, depth) go to codes[s] (which hold NK_SPAN), and
 * the squared norms of u - q * step, summed in 4 lanes in a fixed order (packing and verification
 * agree bit for bit), to squares[s]. Of a row longer than NK_SPAN only the first span's codes are kept. */
static void nk_quantize_row(int dtype, void const *values, uint64_t depth, double inv_norm, float const steps[2],
                            nk_span_t *span, int8_t codes[2][NK_SPAN], double squares[2]) {
    double errors[2][4] = {{0.0, 0.0, 0.0, 0.0}, {0.0, 0.0, 0.0, 0.0}};
    double multipliers[2] = {steps[0] > 0.0f ? 1.0 / (double)steps[0] : 0.0,
                             steps[1] > 0.0f ? 1.0 / (double)steps[1] : 0.0};
    int count_steps = steps[1] > 0.0f ? 2 : 1;
    int8_t dropped[NK_SPAN];
    for (uint64_t start = 0; start < depth; start += NK_SPAN) {
        uint64_t count = depth - start < NK_SPAN ? depth - start : NK_SPAN, padded = (count + 3) / 4 * 4;
        nk_row_span(dtype, values, depth, start, padded, span);
        for (int s = 0; s < count_steps; ++s)
            nk_span_quantize(span->values, padded, inv_norm, multipliers[s], (double)steps[s], errors[s],
                             start ? dropped : codes[s]);
    }
    for (int s = 0; s < 2; ++s) squares[s] = (errors[s][0] + errors[s][1]) + (errors[s][2] + errors[s][3]);
}

/* Write `bytes` of derived data, or (verify) compare them with what is stored; 0 on mismatch. */
static int nk_put(void *target, void const *value, size_t bytes, int verify) {
    if (verify) return memcmp(target, value, bytes) == 0;
    memcpy(target, value, bytes);
    return 1;
}

/* Largest magnitude of a row into *absmax; 0 if an element is not a finite value of its format
 * (NaN/inf, or the bit patterns the decoder would misread: the e4m3 NaN encoding and the unused
 * top bits of fp6 bytes). Decodes span by span into `span`: a row of at most NK_SPAN elements is
 * left there whole. */
static int nk_row_absmax(int dtype, void const *row, uint64_t depth, double *absmax, double span[NK_SPAN]) {
    uint8_t const *bytes = (uint8_t const *)row;
    uint8_t forbidden_mask = dtype == nk_dtype_e4m3_k ? 0x7Fu : (dtype == nk_dtype_e2m3_k || dtype == nk_dtype_e3m2_k) ? 0xC0u : 0;
    *absmax = 0.0;
    for (uint64_t start = 0; start < depth; start += NK_SPAN) {
        uint64_t count = depth - start < NK_SPAN ? depth - start : NK_SPAN;
        if (forbidden_mask == 0x7Fu) {
            for (uint64_t i = 0; i < count; ++i)
                if ((bytes[start + i] & 0x7Fu) == 0x7Fu) return 0;
        }
        else if (forbidden_mask) {
            for (uint64_t i = 0; i < count; ++i)
                if (bytes[start + i] & forbidden_mask) return 0;
        }
        nk_decode_span(dtype, row, start, count, span);
        if (!nk_span_largest(span, count, absmax)) return 0;
    }
    return 1;
}

static int nk_float_row_is_valid(int dtype, void const *row, uint64_t depth) {
    double absmax, span[NK_SPAN];
    /* float64 rows were brought into the safe range by the packer. */
    return nk_row_absmax(dtype, row, depth, &absmax, span) && nk_row_scale_exponent(dtype, 0, absmax) == 0;
}

/* A code that no valid row holds (infinity, the e4m3 NaN, fp6 bytes with the unused bits set): what
 * a value beyond the format's range is stored as, so that the check of the stored row refuses it.
 * Packing scales rows into range first: only a source changing while it is packed gets here. */
static uint32_t nk_invalid_code(int dtype) {
    switch (dtype) {
    case nk_dtype_float16_k: return 0x7C00u;
    case nk_dtype_bfloat16_k: return 0x7F80u;
    case nk_dtype_e4m3_k: return 0x7Fu;
    case nk_dtype_e5m2_k: return 0x7Cu;
    default: return 0xC0u;
    }
}

/* Whether |values[i] * factor| <= limit for every i (false for a NaN). The flag is a double: the
 * vectorizer handles that beside doubles. */
static int nk_span_fits(double const *restrict values, double factor, uint64_t count, double limit) {
    double over = 0.0;
    for (uint64_t i = 0; i < count; ++i) {
        double x = fabs(values[i] * factor);
        over = x <= limit ? over : 1.0;
    }
    return over == 0.0;
}

static inline uint64_t nk_f64_bits(double x) {
    uint64_t bits;
    memcpy(&bits, &x, 8);
    return bits;
}

/* Round float64 `values` times 2^shift into elements [start, start + count) of a row of `dtype` (the
 * dtype switch outside the loops). `narrow`: the values have at most 24 significant bits (float32,
 * float16 or bfloat16 sources). Returns 0 if a stored value is one no valid row holds (non-finite,
 * beyond the format's range: stored as such so that nothing scores it), else 1; float64 also reports
 * the largest stored magnitude into *largest for the range check of the row. */
static int nk_store_span(int dtype, void *row, uint64_t start, uint64_t count, double const *values, int shift,
                         int narrow, double *largest) {
    /* A power of two as a double covers |shift| <= 1000; beyond, ldexp avoids overflowing it (apart,
     * so that the loops below stay branch-free and vectorize). */
    int finite = 1;
    double factor = 1.0, scaled[NK_SPAN];
    if (shift >= -1000 && shift <= 1000) factor = ldexp(1.0, shift);
    else {
        for (uint64_t i = 0; i < count; ++i) scaled[i] = ldexp(values[i], shift);
        values = scaled;
    }
    nk_format_t f = nk_format_of(dtype);
    uint32_t invalid = nk_invalid_code(dtype);
    uint64_t encoded = 0; /* elements a hardware conversion already stored */
#define NK_SCALED(i) (values[i] * factor)
/* Encode every element, then (apart, so that both loops vectorize) check that each fit the format; a
 * value that did not (only from a source changing meanwhile) is stored as the invalid code. */
#define NK_STORE_CODES(type, code)                                                                                    \
    do {                                                                                                               \
        for (uint64_t i = encoded; i < count; ++i) {                                                                   \
            double x = NK_SCALED(i);                                                                                   \
            ((type *)row)[start + i] = (type)(code);                                                                   \
        }                                                                                                              \
        finite = nk_span_fits(values, factor, count, f.max_finite);                                                    \
        for (uint64_t i = 0; i < count && !finite; ++i)                                                                \
            if (!(fabs(NK_SCALED(i)) <= f.max_finite)) ((type *)row)[start + i] = (type)invalid;                       \
    } while (0)
    switch (dtype) {
    case nk_dtype_float64_k: {
        double *out = (double *)row + start, top = *largest;
        for (uint64_t i = 0; i < count; ++i) {
            double x = NK_SCALED(i);
            out[i] = x;
            top = fabs(x) > top || x != x ? fabs(x) : top; /* a NaN stays */
        }
        *largest = top;
        break;
    }
    case nk_dtype_float32_k: {
        float *out = (float *)row + start;
        for (uint64_t i = 0; i < count; ++i) {
            out[i] = (float)NK_SCALED(i); /* C conversion rounds to nearest even */
            finite &= fabsf(out[i]) <= FLT_MAX;
        }
        break;
    }
    case nk_dtype_float16_k:
        /* x of at most 24 bits converts to float32 exactly, or (below 2^-126) to a float32 that rounds
         * to the same zero: the branch-free float32 encoder applies. */
        if (narrow) {
#if defined(__F16C__)
            /* The hardware rounds float32 to float16 to nearest even as nk_f16_from_f32 does; an
             * overflow (only from a source changing meanwhile) becomes the invalid code either way. */
            __m256d scale = _mm256_set1_pd(factor);
            for (; encoded + 8 <= count; encoded += 8) {
                __m128 low = _mm256_cvtpd_ps(_mm256_mul_pd(_mm256_loadu_pd(values + encoded), scale));
                __m128 high = _mm256_cvtpd_ps(_mm256_mul_pd(_mm256_loadu_pd(values + encoded + 4), scale));
                _mm_storeu_si128((__m128i *)((uint16_t *)row + start + encoded),
                                 _mm256_cvtps_ph(_mm256_set_m128(high, low), _MM_FROUND_TO_NEAREST_INT));
            }
#endif
            NK_STORE_CODES(uint16_t, nk_f16_from_f32((float)x));
        }
        else NK_STORE_CODES(uint16_t, nk_encode_minifloat(nk_f64_bits(x), f));
        break;
    case nk_dtype_bfloat16_k:
        /* Unscaled, x is the float32 value itself (bfloat16 has float32's subnormals: exactness matters). */
        if (narrow && shift == 0) NK_STORE_CODES(uint16_t, nk_bf16_from_f32((float)x));
        else NK_STORE_CODES(uint16_t, nk_encode_minifloat(nk_f64_bits(x), f));
        break;
    default: NK_STORE_CODES(uint8_t, nk_encode_minifloat(nk_f64_bits(x), f)); break;
    }
#undef NK_STORE_CODES
#undef NK_SCALED
    return finite;
}

/* Derive inv_norms and the screening sections of one float-format row from its stored values: written, or
 * (verify) compared bit for bit, which is how read-only buffers are trusted. 0 on mismatch.
 * `span` may hold the row already decoded (holds_row): the packer's check of the row decoded it. */
static int nk_derive_float_row_from(nk_maxsim_header_t const *h, char *base, uint64_t row, int verify, nk_span_t *span) {
    int dtype = (int)h->dtype;
    void const *values = base + h->values_offset + row * h->depth * nk_dtype_itemsize(dtype);
    /* Spans are padded with zeros to a multiple of 4 and summed in 4 lanes, to break the
     * dependency chain; the order is fixed, so packing and verification agree bit for bit. */
    double squares[4] = {0.0, 0.0, 0.0, 0.0}, absmax = 0.0; /* stored values are finite */
    for (uint64_t start = 0; start < h->depth; start += NK_SPAN) {
        uint64_t count = h->depth - start < NK_SPAN ? h->depth - start : NK_SPAN, padded = (count + 3) / 4 * 4;
        nk_row_span(dtype, values, h->depth, start, padded, span);
        nk_span_squares(span->values, padded, squares, &absmax);
    }
    double sum_squares = (squares[0] + squares[1]) + (squares[2] + squares[3]);
    double inv_norm = sum_squares > 0.0 ? 1.0 / sqrt(sum_squares) : 0.0;
    int same = nk_put(base + h->inv_norms_offset + row * sizeof(double), &inv_norm, sizeof(double), verify);

    /* int8 copy of the unit row u: q = round(u / step), with step = max|u| / 127 as float32 or, for
     * the minifloats, a power of two times inv_norm when that quantizes with a smaller error: their
     * values are multiples of a power of two that grows with their exponent, so a power-of-two step
     * just above max|x| / 127 reproduces every value but the smallest ones exactly (all of them for
     * e2m3). A smaller error means fewer candidates for the kernels to rescore. */
    float steps[2] = {(float)(absmax * inv_norm / 127.0), 0.0f};
    if (dtype >= nk_dtype_e4m3_k && absmax > 0.0) {
        int exponent;
        double mantissa = frexp(absmax / 127.0, &exponent); /* in [0.5, 1) */
        steps[1] = (float)(ldexp(1.0, mantissa == 0.5 ? exponent - 1 : exponent) * inv_norm);
    }
    double error_squares[2];
    int8_t codes[2][NK_SPAN];
    nk_quantize_row(dtype, values, h->depth, inv_norm, steps, span, codes, error_squares);
    int grid = steps[1] > 0.0f && error_squares[1] < error_squares[0];
    float step = steps[grid];
    double multiplier = step > 0.0f ? 1.0 / (double)step : 0.0;
    /* The row's 4-byte groups are 4 x (rows in its tile) bytes apart in the screen section. */
    uint64_t group_start = nk_screen_offset(h->vectors, h->screen_depth, row, 0);
    uint64_t group_stride = h->screen_depth > 4 ? nk_screen_offset(h->vectors, h->screen_depth, row, 4) - group_start : 0;
    uint8_t *screen = (uint8_t *)base + h->screen_offset + group_start;
    int64_t sum = 0;
    for (uint64_t start = 0; start < h->screen_depth; start += NK_SPAN) {
        uint64_t count = h->screen_depth - start < NK_SPAN ? h->screen_depth - start : NK_SPAN;
        int8_t const *row_codes = codes[grid];
        int8_t fresh[NK_SPAN];
        if (start) { /* only rows longer than a span are quantized again, span by span */
            nk_row_span(dtype, values, h->depth, start, count, span); /* depth padding is value 0 */
            for (uint64_t i = 0; i < count; ++i) fresh[i] = (int8_t)nk_quantize(span->values[i] * inv_norm, multiplier);
            row_codes = fresh;
        }
        uint8_t biased[NK_SPAN];
        for (uint64_t i = 0; i < count; ++i) { /* a flat loop (it vectorizes), then one 4-byte put a group */
            sum += row_codes[i];
            biased[i] = (uint8_t)(row_codes[i] + 128);
        }
        for (uint64_t i = 0; i < count; i += 4, screen += group_stride) same &= nk_put(screen, biased + i, 4, verify);
    }
    /* Round the error bound up: the relative margin dwarfs float64 and float32 rounding. */
    float error = (float)(sqrt(error_squares[grid]) * (1.0 + 1e-6) + 1e-30);
    int32_t sum32 = (int32_t)sum;
    same &= nk_put(base + h->screen_scales_offset + row * sizeof(float), &step, sizeof(float), verify);
    same &= nk_put(base + h->screen_errors_offset + row * sizeof(float), &error, sizeof(float), verify);
    same &= nk_put(base + h->screen_sums_offset + row * sizeof(int32_t), &sum32, sizeof(int32_t), verify);
    return same;
}

/* The same with nothing decoded yet: verification's entry (the table's derive_float_row). */
static int nk_derive_float_row(nk_maxsim_header_t const *h, char *base, uint64_t row, int verify) {
    nk_span_t span;
    span.holds_row = 0;
    return nk_derive_float_row_from(h, base, row, verify, &span);
}

/* Row `row` of a float format from `source_row` (source_dtype: the format itself, or float64, float32,
 * float16 or bfloat16), then its derived sections. A row of the packing format is copied first and
 * then only the copy is read, so a source that changes meanwhile cannot make the scale and the stored
 * values disagree. nk_error_nonfinite_k for a row with a NaN or inf. */
static nk_status_t nk_pack_float_row(nk_maxsim_header_t const *h, char *base, uint64_t row, int source_dtype,
                                     void const *source_row) {
    int dtype = (int)h->dtype, casting = source_dtype != dtype;
    uint64_t depth = h->depth;
    size_t itemsize = nk_dtype_itemsize(dtype);
    void *target_row = base + h->values_offset + row * depth * itemsize;
    nk_span_t row_span;
    double absmax, *decoded = row_span.values;
    if (!casting) memcpy(target_row, source_row, depth * itemsize);
    void const *row_values = casting ? source_row : target_row;
    if (!nk_row_absmax(source_dtype, row_values, depth, &absmax, decoded)) return nk_error_nonfinite_k;
    int shift = nk_row_scale_exponent(dtype, casting, absmax), valid = 1;
    double largest = 0.0;
    for (uint64_t start = 0; start < depth && (casting || shift); start += NK_SPAN) {
        uint64_t count = depth - start < NK_SPAN ? depth - start : NK_SPAN;
        if (depth > NK_SPAN) nk_decode_span(source_dtype, row_values, start, count, decoded); /* else still there */
        valid &= nk_store_span(dtype, target_row, start, count, decoded, shift, source_dtype != nk_dtype_float64_k,
                               &largest);
    }
    /* What is stored is what scoring reads: a cast source that changed while it was read could
     * have overflowed the format (stored as a non-finite code), so check the row as stored (as
     * nk_float_row_is_valid would, from the values the stores saw). */
    if (casting && !(valid && largest <= DBL_MAX && nk_row_scale_exponent(dtype, 0, largest) == 0))
        return nk_error_nonfinite_k;
    /* While the row is in cache; a stored row that is the source, unscaled and one span long is
     * still decoded in row_span. */
    row_span.holds_row = !casting && !shift && depth <= NK_SPAN;
    nk_derive_float_row_from(h, base, row, 0, &row_span);
    return nk_ok_k;
}

/* ---- The prescreen of a corpus document (maxsim_internal.h), from its screen alone. ---- */

/* Tile t of d's prescreen, written or (check) compared: 1 when equal. The screen tile holds one line of
 * 4 n bytes per 4-depth group (n rows); a byte's lane is its position / 4 in the line. */
static int nk_prescreen_tile(nk_maxsim_view_t const *d, uint64_t t, uint8_t *codes, float *scales, float *errors,
                             uint64_t pairs, int check) {
    uint64_t groups = d->screen_depth / 4, n = d->vectors - 16 * t < 16 ? d->vectors - 16 * t : 16, line = 4 * n;
    uint8_t const *tile = d->screen + 16 * t * d->screen_depth;
    uint8_t largest[64] = {0}, code[NK_PRESCREEN_MAX_PAIRS * 32][64]; /* c + 8, as the screen; 8 past rows, depth */
    uint32_t rows[16][NK_PRESCREEN_MAX_PAIRS * 32];                   /* the same, a row's 4-depth words in order */
    uint16_t divisor[64] = {0}, inverse[64] = {0};
    uint32_t wrong[64] = {0}, squares[64] = {0}; /* sums of (v - m c)^2 and c^2 */
    memset(code, 8, (size_t)(32 * pairs * 64));
    for (uint64_t g = 0; g < groups; ++g)
        for (uint64_t i = 0; i < line; ++i) {
            int v = (int)tile[g * line + i] - 128;
            uint8_t magnitude = (uint8_t)(v < 0 ? -v : v);
            largest[i] = magnitude > largest[i] ? magnitude : largest[i];
        }
    for (uint64_t r = 0; r < n; ++r) {
        uint8_t most = largest[4 * r];
        for (unsigned b = 1; b < 4; ++b) most = largest[4 * r + b] > most ? largest[4 * r + b] : most;
        uint16_t m = (uint16_t)(most > 7 ? (most + 6u) / 7u : 1u);
        /* floor(x / m) = (x ceil(2^15 / m)) >> 15 for x <= 136 and m <= 19: the excess stays below 1/m */
        for (unsigned b = 0; b < 4; ++b) divisor[4 * r + b] = m, inverse[4 * r + b] = (uint16_t)((32767u + m) / m);
    }
    for (uint64_t g = 0; g < groups; ++g)
        for (uint64_t i = 0; i < line; ++i) {
            int v = (int)tile[g * line + i] - 128;
            uint32_t magnitude = (uint32_t)(v < 0 ? -v : v);
            int c = (int)(((magnitude + divisor[i] / 2u) * inverse[i]) >> 15); /* |v| / m, half away from 0 */
            c = v < 0 ? -c : c;
            int gap = v - (int)divisor[i] * c;
            wrong[i] += (uint32_t)(gap * gap), squares[i] += (uint32_t)(c * c);
            code[g][i] = (uint8_t)(c + 8);
        }
    int equal = 1;
    for (uint64_t g = 0; g < 32 * pairs; ++g) /* a transpose of 4-byte words: stores stay contiguous above */
        for (uint64_t r = 0; r < 16; ++r) memcpy(&rows[r][g], &code[g][4 * r], 4);
    for (uint64_t p = 0; p < pairs; ++p)
        for (uint64_t r = 0; r < 16; ++r) {
            uint8_t const *low = (uint8_t const *)rows[r] + 128 * p, *high = low + 64;
            uint8_t *out = codes + 1024 * p + 64 * r;
            uint8_t bytes[64];
            for (uint64_t i = 0; i < 64; ++i) bytes[i] = (uint8_t)(low[i] | high[i] << 4);
            if (check) equal &= memcmp(out, bytes, 64) == 0;
            else memcpy(out, bytes, 64);
        }
    for (uint64_t r = 0; r < 16; ++r) {
        float scale = 0.0f, error = -INFINITY;
        if (r < n) {
            uint32_t m = divisor[4 * r], off = 0, sum = 0;
            for (unsigned b = 0; b < 4; ++b) off += wrong[4 * r + b], sum += squares[4 * r + b];
            double step = d->screen_scales[16 * t + r], exact_scale = step * m; /* exact in float64 */
            scale = (float)exact_scale;
            /* ||u - scale c|| <= ||u - step v|| + step ||v - m c|| + |step m - scale| ||c|| */
            double bound = (double)d->screen_errors[16 * t + r] + step * sqrt((double)off) +
                           fabs(exact_scale - (double)scale) * sqrt((double)sum);
            error = nk_f32_at_least(bound * (1.0 + 0x1p-40)); /* covers the roundings above */
        }
        if (check) equal &= memcmp(&scales[r], &scale, 4) == 0 && memcmp(&errors[r], &error, 4) == 0;
        else scales[r] = scale, errors[r] = error;
    }
    return equal;
}

nk_pack_rows_t const NK_PACK_ROWS_NAME = {nk_pack_float_row, nk_derive_float_row, nk_float_row_is_valid,
                                         nk_prescreen_tile};

#endif /* NUMKONG_PACK_ROWS_H */
