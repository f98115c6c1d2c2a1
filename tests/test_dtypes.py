"""Dtype handling: names, aliases and scalar types, inference from the input, bit-exact storage of
inputs already in the packing format, round-to-nearest-even casts, overflow / underflow scaling,
and the format chosen by maxsim() for two different inputs."""
import ml_dtypes
import numpy as np
import pytest

import numkong as nk
from conftest import (
    FAMILY_PARAMS,
    FORMAT_BITS,
    MAX_FINITE,
    NUMPY_DTYPES,
    RTOL,
    assert_score_close,
    dtype_params,
    native_matrix,
    random_matrix,
    reference_maxsim,
    round_to_nearest_even,
    row_scale_exponents,
    stored_bytes,
    stored_values,
    values_section,
)

# ---------------------------------------------------------------------------------------------
# Names, aliases, scalar types

ALIASES = [
    ("float64", "float64"), ("f64", "float64"), ("float32", "float32"), ("f32", "float32"),
    ("float16", "float16"), ("f16", "float16"), ("bfloat16", "bfloat16"), ("bf16", "bfloat16"),
    ("e4m3", "e4m3"), ("float8_e4m3", "e4m3"), ("e5m2", "e5m2"), ("float8_e5m2", "e5m2"),
    ("e2m3", "e2m3"), ("float6_e2m3", "e2m3"), ("e3m2", "e3m2"), ("float6_e3m2", "e3m2"),
    ("FLOAT32", "float32"), ("BF16", "bfloat16"), ("E4M3", "e4m3"),
]


@pytest.mark.parametrize("alias, name", ALIASES, ids=[a for a, _ in ALIASES])
def test_dtype_names_and_aliases(alias, name):
    x = random_matrix(4, 10, 1)
    packed = nk.maxsim_pack(x, alias)
    assert packed.dtype == name
    assert bytes(memoryview(packed)) == bytes(memoryview(nk.maxsim_pack(x, name)))
    assert nk.maxsim(x, x[::-1], alias) == nk.maxsim(x, x[::-1], name)


SCALAR_TYPES = [
    (nk.bfloat16, "bfloat16"), (nk.float16, "float16"), (nk.float8_e4m3, "e4m3"), (nk.float8_e5m2, "e5m2"),
    (nk.float6_e2m3, "e2m3"), (nk.float6_e3m2, "e3m2"), (np.float32, "float32"), (np.float64, "float64"),
    (np.float16, "float16"), (ml_dtypes.bfloat16, "bfloat16"), (ml_dtypes.float8_e4m3fn, "e4m3"),
    (np.dtype("float32"), "float32"), (np.dtype(">f4"), "float32"), (np.dtype(ml_dtypes.float6_e3m2fn), "e3m2"),
]


@pytest.mark.parametrize("scalar, name", SCALAR_TYPES, ids=[f"{getattr(s, '__name__', s)}-{n}" for s, n in SCALAR_TYPES])
def test_dtype_scalar_types(scalar, name):
    x = random_matrix(4, 10, 1)
    packed = nk.maxsim_pack(x, scalar)
    assert packed.dtype == name
    assert bytes(memoryview(packed)) == bytes(memoryview(nk.maxsim_pack(x, name)))
    assert nk.maxsim(x, x[::-1], scalar) == nk.maxsim(x, x[::-1], name)


def test_scalar_types_are_the_ml_dtypes_types():
    assert np.dtype(nk.bfloat16) == np.dtype(ml_dtypes.bfloat16)
    assert np.dtype(nk.float16) == np.dtype(np.float16)
    assert np.dtype(nk.float8_e4m3) == np.dtype(ml_dtypes.float8_e4m3fn)
    assert np.dtype(nk.float8_e5m2) == np.dtype(ml_dtypes.float8_e5m2)
    assert np.dtype(nk.float6_e2m3) == np.dtype(ml_dtypes.float6_e2m3fn)
    assert np.dtype(nk.float6_e3m2) == np.dtype(ml_dtypes.float6_e3m2fn)


# ---------------------------------------------------------------------------------------------
# Inference from the input (dtype=None keeps the input's format)


@pytest.mark.parametrize("name", dtype_params())
def test_inferred_dtype_keeps_the_input_format(name):
    x = native_matrix(6, 20, 1, name)
    assert x.dtype == NUMPY_DTYPES[name]
    packed = nk.maxsim_pack(x)
    assert packed.dtype == name
    assert values_section(packed) == x.tobytes()
    d = native_matrix(9, 20, 2, name)
    assert nk.maxsim(x, d) == nk.maxsim(x, d, name)
    assert_score_close(nk.maxsim(x, d), reference_maxsim(x, d, name), RTOL[name], name)


@pytest.mark.parametrize("source, name", [
    (ml_dtypes.float8_e4m3fnuz, "float16"),  # smaller subnormals than e4m3fn: float16 holds it
    (ml_dtypes.float8_e5m2fnuz, "float16"),
    (ml_dtypes.float8_e4m3b11fnuz, "float16"),
    (np.longdouble, "float64"),
], ids=["e4m3fnuz", "e5m2fnuz", "e4m3b11fnuz", "longdouble"])
def test_inferred_dtype_for_other_float_formats(source, name):
    """Other float formats pack in the narrowest supported format that holds every value exactly."""
    x = random_matrix(5, 8, 1).astype(source)
    packed = nk.maxsim_pack(x)
    assert packed.dtype == name
    assert values_section(packed) == stored_bytes(x.astype(np.float64), name)


# ---------------------------------------------------------------------------------------------
# Bit-exact storage


def _random_bit_patterns(name, shape, seed):
    """Uniformly random encodings of `name` (subnormals, zeros, -0, extremes), minus NaN / inf."""
    rng = np.random.default_rng(seed)
    dt = NUMPY_DTYPES[name]
    if dt.itemsize == 1:
        bits = rng.integers(0, 256, shape, dtype=np.uint8)
        if name in ("e2m3", "e3m2"):
            bits &= 0x3F
        x = bits.view(dt)
    else:
        unsigned = {2: np.uint16, 4: np.uint32, 8: np.uint64}[dt.itemsize]
        x = rng.integers(0, np.iinfo(unsigned).max, shape, dtype=unsigned, endpoint=True).view(dt)
    with np.errstate(invalid="ignore"):
        finite = np.isfinite(x.astype(np.float64))
    x = np.where(finite, x, np.zeros((), dt)).astype(dt)
    if name == "float64":  # keep float64 rows within the range stored without scaling
        x = np.where(np.abs(x) < 2.0 ** 300, x, 1.5)
        x = np.where((np.abs(x) > 2.0 ** -300) | (x == 0), x, 0.75)
    return x


@pytest.mark.parametrize("name", dtype_params())
def test_input_in_the_packing_format_is_stored_bit_exact(name):
    x = _random_bit_patterns(name, (40, 37), 1)
    packed = nk.maxsim_pack(x, name)
    assert values_section(packed) == x.tobytes()
    # Also through maxsim(): rescored against the reference on exactly these values.
    d = _random_bit_patterns(name, (25, 37), 2)
    assert_score_close(nk.maxsim(x, d, name), reference_maxsim(x, d, name), RTOL[name], name)


@pytest.mark.parametrize("family", FAMILY_PARAMS)
@pytest.mark.parametrize("name", dtype_params())
def test_extreme_bit_patterns_score_exactly(name, family):
    """Subnormals, maxima and mixed magnitudes in one row, in every family."""
    q = _random_bit_patterns(name, (20, 70), 3)
    d = _random_bit_patterns(name, (90, 70), 4)
    got = nk.maxsim(q, d, name, capabilities=family)
    assert_score_close(got, reference_maxsim(q, d, name), RTOL[name], f"{family.name.lower()} {name}")


@pytest.mark.parametrize("family", FAMILY_PARAMS)
@pytest.mark.parametrize("name", ["e4m3", "e5m2", "e2m3", "e3m2"])
def test_every_minifloat_code_decodes_exactly(name, family):
    """Rows holding every finite code of the format, in several orders: every winning row is
    rescored in full, so a wrong decoding of any one code (even the smallest subnormal) moves the
    score far beyond the float64 accumulation rounding this test allows."""
    codes = np.arange(256 if name in ("e4m3", "e5m2") else 64, dtype=np.uint8).view(NUMPY_DTYPES[name])
    with np.errstate(invalid="ignore"):
        row = codes[np.isfinite(codes.astype(np.float64))]
    q = np.stack([row, np.roll(row, 7), row[::-1]])
    d = np.stack([np.roll(row, 1), row[::-1], np.roll(row, -5), row])
    got = nk.maxsim(q, d, name, capabilities=family)
    assert_score_close(got, reference_maxsim(q, d, name), 1e-12, f"{family.name.lower()} {name}")


def test_float64_rows_outside_the_safe_range_are_scaled_even_without_a_cast():
    x = random_matrix(4, 16, 1) * np.array([[1e200], [1e-200], [1.0], [2.0 ** 390]])
    packed = nk.maxsim_pack(x)
    assert packed.dtype == "float64"
    k = row_scale_exponents(x, "float64", casting=False)
    assert list(k != 0) == [True, True, False, False]
    assert values_section(packed) == stored_bytes(x, "float64")
    assert values_section(packed)[2 * 16 * 8:] == x[2:].tobytes()
    d = random_matrix(6, 16, 2)
    assert_score_close(nk.maxsim(x, d), reference_maxsim(x, d, "float64"), RTOL["float64"], "float64")
    assert_score_close(nk.maxsim(x, d), nk.maxsim(random_matrix(4, 16, 1), d), 1e-12, "scale-free")


@pytest.mark.parametrize("family", FAMILY_PARAMS)
@pytest.mark.parametrize("name", dtype_params())
def test_float64_subnormal_rows(name, family):
    """Rows made of float64 subnormals are scaled up, not treated as zero rows."""
    q = np.array([[5e-324, 1e-310, -2e-320, 0.0], [1e-315, 1e-315, 0.0, -1e-315]])
    d = np.array([[1.0, 2.0, -1.0, 0.0], [1.0, 1.0, 0.0, -1.0], [-1.0, 0.0, 0.0, 0.0]])
    assert np.all(np.abs(stored_values(q, name)).max(axis=1) > 0)
    assert values_section(nk.maxsim_pack(q, name)) == stored_bytes(q, name)
    got = nk.maxsim(q, d, name, capabilities=family)
    assert_score_close(got, reference_maxsim(q, d, name), RTOL[name], name)
    assert nk.maxsim(q[1:], d, name, capabilities=family) < 1e-6  # a scaled copy of document 1


# ---------------------------------------------------------------------------------------------
# Casts: power-of-two row scaling, then round-to-nearest-even

CAST_TARGETS = ["float32", "float16", "bfloat16", "e4m3", "e5m2", "e2m3", "e3m2"]


@pytest.mark.parametrize("scale", [1.0, 1e-3, 3e4, 1e6, 1e-30, 1e30], ids=lambda s: f"scale{s:g}")
@pytest.mark.parametrize("name", dtype_params(CAST_TARGETS))
def test_cast_matches_ml_dtypes_on_scaled_rows(name, scale):
    """Stored bytes = ml_dtypes astype of each row times 2**k. The input is float32, so ml_dtypes
    (which converts through float32) rounds only once, directly to the target format."""
    x = (random_matrix(30, 50, 1) * scale).astype(np.float32)
    k = row_scale_exponents(x.astype(np.float64), name, casting=x.dtype != NUMPY_DTYPES[name])
    scaled = np.ldexp(x.astype(np.float64), k[:, None])
    expected = scaled.astype(NUMPY_DTYPES[name]).tobytes()
    packed = nk.maxsim_pack(x, name)
    assert values_section(packed) == expected
    assert values_section(packed) == stored_bytes(x, name)
    if name in MAX_FINITE:  # narrow formats: every row's largest value is scaled to within a factor 2 of the maximum
        absmax = np.abs(stored_values(x, name)).max(axis=1)
        assert np.all(absmax <= MAX_FINITE[name]) and np.all(absmax >= MAX_FINITE[name] / 2)


@pytest.mark.parametrize("name", dtype_params(["bfloat16", "float16", "e4m3", "e5m2", "e2m3", "e3m2"]))
def test_cast_rounds_ties_to_even(name):
    """Exact ties between two representable values round to the one with an even last bit."""
    mantissa_bits, _ = FORMAT_BITS[name]
    ulp = 2.0 ** -mantissa_bits  # spacing of the format in [1, 2)
    # Row of values in [1, 2): the largest, 2 - ulp, sets the scale; the rest sit exactly half-way.
    steps = np.arange(2 ** mantissa_bits - 1)
    row = np.concatenate([[2.0 - ulp], 1.0 + (steps + 0.5) * ulp, -(1.0 + (steps + 0.5) * ulp)])
    k = int(row_scale_exponents(row[None, :], name, casting=True)[0])
    packed = nk.maxsim_pack(row[None, :], name)
    stored = np.frombuffer(values_section(packed), dtype=NUMPY_DTYPES[name]).astype(np.float64)
    ties = np.abs(np.ldexp(stored[1:], -k))
    lower = 1.0 + np.concatenate([steps, steps]) * ulp
    rounded_up = ties > lower
    assert np.all((ties == lower) | (ties == lower + ulp))
    # Even last mantissa bit: the chosen neighbour has an even number of ulps above 1.
    assert np.all(((ties - 1.0) / ulp) % 2 == 0)
    assert rounded_up.any() and (~rounded_up).any()


@pytest.mark.parametrize("name", dtype_params(["bfloat16", "float16", "e4m3", "e5m2", "e2m3", "e3m2"]))
def test_cast_rounds_once_directly_from_float64(name):
    """Values a hair above a tie must round up. Rounding through float32 first would make them ties
    and round them down to even (double rounding)."""
    mantissa_bits, _ = FORMAT_BITS[name]
    ulp = 2.0 ** -mantissa_bits
    hair = 2.0 ** -40  # lost when rounding to float32
    row = np.array([[2.0 - ulp, 1.0 + 0.5 * ulp + hair, 1.0 + 2.5 * ulp + hair if mantissa_bits > 2 else 1.5 + hair]])
    k = int(row_scale_exponents(row, name, casting=True)[0])
    stored = np.frombuffer(values_section(nk.maxsim_pack(row, name)), dtype=NUMPY_DTYPES[name]).astype(np.float64)
    got = np.ldexp(stored, -k)
    expected = round_to_nearest_even(np.ldexp(row[0], k), name) * 2.0 ** -k
    assert list(got) == list(expected)
    assert got[1] == 1.0 + ulp  # up, not down to 1.0


@pytest.mark.parametrize("name", dtype_params(CAST_TARGETS))
def test_cast_from_float64_matches_the_reference(name):
    x = random_matrix(50, 64, 1) * np.logspace(-20, 20, 50)[:, None]
    assert values_section(nk.maxsim_pack(x, name)) == stored_bytes(x, name)


@pytest.mark.parametrize("family", FAMILY_PARAMS)
@pytest.mark.parametrize("name", dtype_params(["float16", "e4m3", "e5m2", "e2m3", "e3m2"]))
def test_values_beyond_the_format_maximum_do_not_overflow(name, family):
    q = random_matrix(8, 40, 1) * 1e6
    d = random_matrix(30, 40, 2) * 1e6
    packed = nk.maxsim_pack(q, name)
    stored = np.frombuffer(values_section(packed), dtype=NUMPY_DTYPES[name]).astype(np.float64)
    assert np.all(np.isfinite(stored)) and np.abs(stored).max() <= MAX_FINITE[name]
    assert values_section(packed) == stored_bytes(q, name)
    got = nk.maxsim(q, d, name, capabilities=family)
    assert_score_close(got, reference_maxsim(q, d, name), RTOL[name], name)
    # The scale is gone: a power-of-two multiple of the data stores the very same values.
    assert values_section(nk.maxsim_pack(q * 2.0 ** 20, name)) == values_section(packed)
    assert nk.maxsim(q * 2.0 ** 20, d * 2.0 ** 30, name, capabilities=family) == got


@pytest.mark.parametrize("tiny", [1e-30, 1e-8, 1e-300], ids=lambda t: f"{t:g}")
@pytest.mark.parametrize("family", FAMILY_PARAMS)
@pytest.mark.parametrize("name", dtype_params(CAST_TARGETS))
def test_tiny_values_do_not_flush_a_row_to_zero(name, family, tiny):
    q = np.array([[1.0, 2.0, 3.0, -1.0], [0.5, -0.25, 0.0, 1.0]]) * tiny
    d = np.array([[1.0, 2.0, 3.0, -1.0], [0.5, -0.25, 0.0, 1.0], [-1.0, 0.0, 0.0, 0.0]])
    stored = stored_values(q, name)
    assert np.all(np.abs(stored).max(axis=1) > 0)
    packed = nk.maxsim_pack(q, name)
    assert values_section(packed) == stored_bytes(q, name)
    got = nk.maxsim(q, d, name, capabilities=family)
    # Each query row is a scaled copy of a document row: distance ~0, not 1 as for a zero row.
    assert got < 0.1
    assert_score_close(got, reference_maxsim(q, d, name), RTOL[name], name)


def test_large_and_tiny_float32_inputs_into_bfloat16():
    """float32 and bfloat16 share the exponent range; rows far outside [2**-100, 2**100] are scaled."""
    x = random_matrix(3, 16, 1) * np.array([[1e-35], [1.0], [1e35]])
    packed = nk.maxsim_pack(x.astype(np.float32), "bfloat16")
    assert values_section(packed) == stored_bytes(x.astype(np.float32), "bfloat16")
    packed64 = nk.maxsim_pack(x * 1e-200, "bfloat16")
    assert values_section(packed64) == stored_bytes(x * 1e-200, "bfloat16")
    assert np.all(np.abs(stored_values(x * 1e-200, "bfloat16")).max(axis=1) > 0)


# ---------------------------------------------------------------------------------------------
# maxsim() with two different input formats

MIXED = [
    (np.float32, np.float16, "float32"),
    (np.float16, np.float32, "float32"),
    (np.float64, np.float32, "float64"),
    (np.float16, ml_dtypes.bfloat16, "float32"),  # neither holds the other: float32 holds both
    (ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e5m2, "float16"),
    (ml_dtypes.float6_e2m3fn, ml_dtypes.float6_e3m2fn, "float16"),
    (ml_dtypes.float6_e2m3fn, ml_dtypes.float8_e4m3fn, "e4m3"),
    (ml_dtypes.float6_e3m2fn, ml_dtypes.float8_e5m2, "e5m2"),
    (ml_dtypes.bfloat16, np.float32, "float32"),
    (ml_dtypes.float8_e4m3fn, np.float16, "float16"),
]


@pytest.mark.parametrize("query_type, document_type, name", MIXED,
                         ids=[f"{np.dtype(a).name}+{np.dtype(b).name}" for a, b, _ in MIXED])
def test_mixed_inputs_pack_in_the_narrowest_format_holding_both(query_type, document_type, name):
    q = random_matrix(7, 24, 1).astype(query_type)
    d = random_matrix(19, 24, 2).astype(document_type)
    got = nk.maxsim(q, d)
    expected = nk.maxsim_packed(nk.maxsim_pack(q, name), nk.maxsim_pack(d, name))
    assert got == expected
    assert_score_close(got, reference_maxsim(q, d, name), RTOL[name], name)
    # Both inputs are stored exactly in that format (up to each row's power-of-two scale).
    for x in (q, d):
        x64 = x.astype(np.float64)
        k = row_scale_exponents(x64, name, casting=x.dtype != NUMPY_DTYPES[name])
        assert np.array_equal(np.ldexp(stored_values(x, name), -k[:, None]), x64)


def test_mixed_float32_float16_is_not_packed_as_float16():
    """float32 + float16 -> float32: the float32 input keeps its precision."""
    q = (np.ones((1, 3)) + np.array([[0.0, 2.0 ** -20, 0.0]])).astype(np.float32)
    d = np.array([[1.0, 1.0, 1.0], [1.0, 1.0, 1.0 + 2.0 ** -9]], dtype=np.float16)
    assert nk.maxsim(q, d) == nk.maxsim(q, d, "float32")
    assert nk.maxsim(q, d) != nk.maxsim(q, d, "float16")
