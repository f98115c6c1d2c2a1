"""Edge cases and every error path: zero rows, empty matrices, NaN / inf, shape and layout errors,
dtype and capability validation, streams, and corrupt buffers given to unpickling."""
import pickle
import struct

import ml_dtypes
import numpy as np
import pytest

import numkong as nk
from conftest import (
    FAMILY_PARAMS,
    HEADER_BYTES,
    ITEMSIZE,
    NUMPY_DTYPES,
    RTOL,
    assert_score_close,
    dtype_params,
    random_matrix,
    reference_maxsim,
    values_section,
)

# ---------------------------------------------------------------------------------------------
# Zero rows


@pytest.mark.parametrize("family", FAMILY_PARAMS)
@pytest.mark.parametrize("name", dtype_params())
def test_zero_query_row_contributes_one(name, family):
    q = np.array(random_matrix(5, 24, 1))
    q[2] = 0.0
    d = random_matrix(40, 24, 2)
    got = nk.maxsim(q, d, name, capabilities=family)
    assert_score_close(got, reference_maxsim(q, d, name), RTOL[name], name)
    single = nk.maxsim(q[2:3], d, name, capabilities=family)
    assert single == 1.0
    assert nk.maxsim(np.zeros((3, 24)), d, name, capabilities=family) == 3.0


@pytest.mark.parametrize("family", FAMILY_PARAMS)
@pytest.mark.parametrize("name", dtype_params())
def test_zero_document_row_has_cosine_zero(name, family):
    """A zero document row has cos 0 with every query: it wins over documents with negative cosines."""
    q = np.array([[1.0, 0.5, 0.0, 0.0], [0.0, 0.0, 1.0, 1.0]])
    d = np.array([[-1.0, -0.5, -1.0, -1.0], [0.0, 0.0, 0.0, 0.0], [-1.0, -0.5, -0.5, -0.5]])
    assert nk.maxsim(q, d, name, capabilities=family) == 2.0
    # Without the zero row every cosine is negative and both distances exceed 1.
    without = nk.maxsim(q, d[[0, 2]], name, capabilities=family)
    assert without > 2.5
    assert_score_close(without, reference_maxsim(q, d[[0, 2]], name), RTOL[name], name)
    # Only zero documents: every query row is at distance 1.
    assert nk.maxsim(q, np.zeros((7, 4)), name, capabilities=family) == 2.0
    # Zero against zero: cos 0, distance 1.
    assert nk.maxsim(np.zeros((2, 4)), np.zeros((3, 4)), name, capabilities=family) == 2.0


@pytest.mark.parametrize("family", FAMILY_PARAMS)
@pytest.mark.parametrize("name", dtype_params())
def test_zero_rows_mixed_into_larger_matrices(name, family):
    q = np.array(random_matrix(20, 130, 3))
    d = np.array(random_matrix(70, 130, 4))
    q[[0, 7, 19]] = 0.0
    q[10] = -0.0  # negative zeros are zero rows too
    d[[0, 15, 16, 69]] = 0.0
    d[30] = -0.0
    got = nk.maxsim(q, d, name, capabilities=family)
    assert_score_close(got, reference_maxsim(q, d, name), RTOL[name], name)
    assert nk.maxsim(q[10:11], d, name, capabilities=family) == 1.0


# ---------------------------------------------------------------------------------------------
# Empty matrices


@pytest.mark.parametrize("name", dtype_params())
def test_empty_queries_score_zero(name):
    d = random_matrix(5, 8, 1)
    got = nk.maxsim(np.zeros((0, 8)), d, name)
    assert got == 0.0 and isinstance(got, float)
    assert nk.maxsim(np.zeros((0, 8)), np.zeros((0, 8)), name) == 0.0
    packed = nk.maxsim_pack(np.zeros((0, 8)), name)
    assert packed.shape == (0, 8)
    assert nk.maxsim_packed(packed, nk.maxsim_pack(d, name)) == 0.0


@pytest.mark.parametrize("name", dtype_params())
def test_empty_documents_are_an_error(name):
    q = random_matrix(3, 8, 1)
    with pytest.raises(ValueError, match="documents have no rows"):
        nk.maxsim(q, np.zeros((0, 8)), name)
    with pytest.raises(ValueError, match="documents have no rows"):
        nk.maxsim_packed(nk.maxsim_pack(q, name), nk.maxsim_pack(np.zeros((0, 8)), name))


def test_zero_depth_is_an_error():
    with pytest.raises(ValueError, match="depth 0"):
        nk.maxsim_pack(np.zeros((3, 0)))
    with pytest.raises(ValueError, match="depth 0"):
        nk.maxsim(np.zeros((3, 0)), np.zeros((3, 0)), "float32")


# ---------------------------------------------------------------------------------------------
# NaN and infinity

BAD_VALUES = [pytest.param(np.nan, id="nan"), pytest.param(np.inf, id="inf"), pytest.param(-np.inf, id="-inf")]


@pytest.mark.parametrize("bad", BAD_VALUES)
@pytest.mark.parametrize("name", dtype_params())
def test_nonfinite_cast_input_names_the_row(name, bad):
    x = np.array(random_matrix(6, 10, 1))
    x[3, 7] = bad
    with pytest.raises(ValueError, match="row 3"):
        nk.maxsim_pack(x, name)
    with pytest.raises(ValueError, match="queries: row 3"):
        nk.maxsim(x, random_matrix(4, 10, 2), name)
    with pytest.raises(ValueError, match="documents: row 3"):
        nk.maxsim(random_matrix(4, 10, 2), x, name)


# Formats that can hold NaN (float8_e4m3fn has no infinity; float6 formats have neither).
NATIVE_NONFINITE = [
    pytest.param("float64", np.nan, id="float64-nan"),
    pytest.param("float64", np.inf, id="float64-inf"),
    pytest.param("float32", np.nan, id="float32-nan"),
    pytest.param("float32", -np.inf, id="float32--inf"),
    pytest.param("float16", np.nan, id="float16-nan"),
    pytest.param("float16", np.inf, id="float16-inf"),
    pytest.param("bfloat16", np.nan, id="bfloat16-nan"),
    pytest.param("bfloat16", -np.inf, id="bfloat16--inf"),
    pytest.param("e5m2", np.nan, id="e5m2-nan"),
    pytest.param("e5m2", np.inf, id="e5m2-inf"),
    # float8_e4m3fn NaN (bytes 0x7F / 0xFF) decodes like a finite value through the half mapping,
    # so the packer must recognise the bit pattern itself.
    pytest.param("e4m3", np.nan, id="e4m3-nan"),
    pytest.param("e4m3", -np.nan, id="e4m3-negative-nan"),
]


@pytest.mark.parametrize("name, bad", NATIVE_NONFINITE)
def test_nonfinite_native_input_names_the_row(name, bad):
    """Input already in the packing dtype (the bit-exact path) is checked too."""
    x = np.array(random_matrix(6, 10, 1)).astype(NUMPY_DTYPES[name])
    x[3, 7] = bad
    if name == "e4m3":
        assert x.view(np.uint8)[3, 7] & 0x7F == 0x7F  # the e4m3fn NaN encoding
    with pytest.raises(ValueError, match="row 3"):
        nk.maxsim_pack(x, name)
    with pytest.raises(ValueError, match="row 3"):
        nk.maxsim_pack(x)


def test_first_bad_row_is_named():
    x = np.ones((8, 4), dtype=np.float32)
    x[5, 0] = np.nan
    x[6, 1] = np.inf
    with pytest.raises(ValueError, match="row 5"):
        nk.maxsim_pack(x)


# ---------------------------------------------------------------------------------------------
# Shapes and layouts


def test_depth_mismatch():
    with pytest.raises(ValueError, match="depth"):
        nk.maxsim(np.ones((2, 4)), np.ones((3, 5)), "float32")
    q = nk.maxsim_pack(np.ones((2, 4), dtype=np.float32))
    d = nk.maxsim_pack(np.ones((3, 5), dtype=np.float32))
    with pytest.raises(ValueError, match="depth 4.*depth 5"):
        nk.maxsim_packed(q, d)


def test_dtype_mismatch_between_packed_operands():
    q = nk.maxsim_pack(np.ones((2, 4)), "float32")
    d = nk.maxsim_pack(np.ones((3, 4)), "bfloat16")
    with pytest.raises(TypeError) as info:
        nk.maxsim_packed(q, d)
    assert "float32" in str(info.value) and "bfloat16" in str(info.value)
    with pytest.raises(TypeError, match="e4m3.*float16"):
        nk.maxsim_packed(nk.maxsim_pack(np.ones((2, 4)), "e4m3"), nk.maxsim_pack(np.ones((3, 4)), "float16"))


@pytest.mark.parametrize("shape", [(4,), (2, 3, 4), (1, 1, 1, 1)], ids=["1-D", "3-D", "4-D"])
def test_wrong_ndim(shape):
    x = np.ones(shape, dtype=np.float32)
    with pytest.raises(ValueError, match="2-D"):
        nk.maxsim_pack(x)
    with pytest.raises(ValueError, match="2-D"):
        nk.maxsim(x, np.ones((2, 4), dtype=np.float32))
    with pytest.raises(ValueError, match="2-D"):
        nk.maxsim(np.ones((2, 4), dtype=np.float32), x)


def test_zero_dimensional_input():
    with pytest.raises(ValueError, match="2-D"):
        nk.maxsim_pack(np.float32(1.0))


NOT_CONTIGUOUS = [
    pytest.param(lambda x: x.T, id="transposed"),
    pytest.param(np.asfortranarray, id="fortran-order"),
    pytest.param(lambda x: x[:, ::2], id="strided-columns"),
    pytest.param(lambda x: x[:, ::-1], id="reversed-columns"),
]


@pytest.mark.parametrize("layout", NOT_CONTIGUOUS)
def test_depth_axis_not_contiguous(layout):
    x = layout(np.array(random_matrix(6, 6, 1), dtype=np.float32))
    with pytest.raises(ValueError, match="contiguous"):
        nk.maxsim_pack(x)
    with pytest.raises(ValueError, match="contiguous"):
        nk.maxsim(x, np.ones((2, x.shape[1])), "float32")
    with pytest.raises(ValueError, match="contiguous"):
        nk.maxsim(np.ones((2, x.shape[1])), x, "float32")


ROW_VIEWS = [
    pytest.param(lambda x: x[::2], id="every-second-row"),
    pytest.param(lambda x: x[1::3], id="every-third-row"),
    pytest.param(lambda x: x[::-1], id="reversed-rows"),
    pytest.param(lambda x: x[::-2], id="reversed-every-second-row"),
    pytest.param(lambda x: x[:, 1:25], id="column-window"),  # rows contiguous, row stride > depth
    pytest.param(lambda x: np.broadcast_to(x[0], (7, x.shape[1])), id="broadcast-row-stride-0"),
]


@pytest.mark.parametrize("view", ROW_VIEWS)
@pytest.mark.parametrize("family", FAMILY_PARAMS)
@pytest.mark.parametrize("name", dtype_params(["float64", "float32", "bfloat16", "e4m3"]))
def test_row_strided_views_are_fine(name, family, view):
    base = random_matrix(40, 32, 1).astype(NUMPY_DTYPES[name])
    x = view(base)
    d = random_matrix(30, x.shape[1], 2)
    expected = reference_maxsim(np.ascontiguousarray(x), d, name)
    assert_score_close(nk.maxsim(x, d, name, capabilities=family), expected, RTOL[name], "queries")
    assert nk.maxsim(x, d, name, capabilities=family) == nk.maxsim(np.ascontiguousarray(x), d, name,
                                                                    capabilities=family)
    packed = nk.maxsim_pack(x, name)
    assert memoryview(packed).tobytes() == memoryview(nk.maxsim_pack(np.ascontiguousarray(x), name)).tobytes()
    expected_docs = reference_maxsim(d[:5], np.ascontiguousarray(x), name)
    assert_score_close(nk.maxsim(d[:5], x, name, capabilities=family), expected_docs, RTOL[name], "documents")


def test_single_column_fortran_order_is_fine():
    """With depth 1 every layout has contiguous rows."""
    x = np.asfortranarray(np.arange(1, 6, dtype=np.float32)[:, None])
    assert nk.maxsim_pack(x).shape == (5, 1)
    assert nk.maxsim(x, -x) == 5 * 2.0  # every cosine is -1


# ---------------------------------------------------------------------------------------------
# Inputs and dtypes


@pytest.mark.parametrize("obj", [[[1.0, 2.0], [3.0, 4.0]], 3, 2.5, {"a": 1}, None, "text", object()],
                         ids=["list", "int", "float", "dict", "None", "str", "object"])
def test_objects_without_a_buffer(obj):
    with pytest.raises(TypeError):
        nk.maxsim_pack(obj)
    with pytest.raises(TypeError):
        nk.maxsim(obj, np.ones((2, 2)), "float32")
    with pytest.raises(TypeError):
        nk.maxsim(np.ones((2, 2)), obj, "float32")


@pytest.mark.parametrize("dtype", ["float8", "int9", "complex64", "float128", "", "e4m3fn", "f8"])
def test_unknown_dtype_names(dtype):
    with pytest.raises(ValueError, match="unknown dtype"):
        nk.maxsim_pack(np.ones((2, 2)), dtype)
    with pytest.raises(ValueError, match="unknown dtype"):
        nk.maxsim(np.ones((2, 2)), np.ones((2, 2)), dtype)
    with pytest.raises(ValueError, match="unknown dtype"):
        nk.MaxSimPackedMatrix.pack_size(2, 2, dtype)


@pytest.mark.parametrize("dtype", [np.complex64, ml_dtypes.float8_e4m3fnuz], ids=["complex64", "e4m3fnuz"])
def test_unsupported_dtype_types(dtype):
    with pytest.raises(ValueError, match="unknown dtype"):
        nk.maxsim_pack(np.ones((2, 2)), dtype)


@pytest.mark.parametrize("dtype", ["uint4", "int32", "uint8", np.int16, np.uint64], ids=str)
def test_integer_types_that_are_not_packing_formats(dtype):
    with pytest.raises(ValueError, match="not a packing format.*'int8'.*'int4'.*'uint1'"):
        nk.maxsim_pack(np.ones((2, 2)), dtype)


@pytest.mark.parametrize("dtype", [object(), 3.5, [1]], ids=["object", "float", "list"])
def test_dtype_that_is_not_a_type(dtype):
    with pytest.raises(TypeError, match="dtype"):
        nk.maxsim_pack(np.ones((2, 2)), dtype)


@pytest.mark.parametrize("int_dtype", [np.int8, np.uint8, np.int32, np.int64, np.bool_])
def test_integer_input_needs_a_dtype(int_dtype):
    x = np.ones((3, 4), dtype=int_dtype)
    with pytest.raises(TypeError, match="dtype"):
        nk.maxsim_pack(x)
    with pytest.raises(TypeError, match="dtype"):
        nk.maxsim(x, np.ones((2, 4), dtype=int_dtype))
    with pytest.raises(TypeError, match="dtype"):
        nk.maxsim(np.ones((2, 4), dtype=np.float32), x)


@pytest.mark.parametrize("int_dtype", [np.int8, np.uint8, np.int16, np.int32, np.int64, np.uint64])
@pytest.mark.parametrize("name", dtype_params())
def test_integer_input_with_a_dtype(name, int_dtype):
    rng = np.random.default_rng(5)
    high = 100 if np.dtype(int_dtype).itemsize == 1 else 10 ** 6
    low = 0 if np.dtype(int_dtype).kind == "u" else -high
    q = rng.integers(low, high, (6, 20)).astype(int_dtype)
    d = rng.integers(low, high, (9, 20)).astype(int_dtype)
    got = nk.maxsim(q, d, name)
    assert_score_close(got, reference_maxsim(q.astype(np.float64), d.astype(np.float64), name), RTOL[name], name)
    assert nk.maxsim_pack(q, name).dtype == name


def test_complex_input_is_rejected():
    x = np.ones((2, 3), dtype=np.complex64)
    with pytest.raises(TypeError):
        nk.maxsim_pack(x)
    with pytest.raises(TypeError):
        nk.maxsim_pack(x, "float32")
    with pytest.raises(TypeError):
        nk.maxsim(x, x, "float32")


# ---------------------------------------------------------------------------------------------
# Capabilities and streams


def _unavailable_family():
    for cap in nk.Capability:
        if not cap & nk.get_capabilities():
            return cap
    pytest.skip("every kernel family is available on this machine")


def test_capability_not_available():
    cap = _unavailable_family()
    x = np.ones((2, 3), dtype=np.float32)
    packed = nk.maxsim_pack(x)
    for call in (lambda: nk.maxsim(x, x, capabilities=cap),
                 lambda: nk.maxsim_pack(x, capabilities=cap),
                 lambda: nk.maxsim_packed(packed, packed, capabilities=cap),
                 lambda: nk.maxsim(x, x, capabilities=cap | nk.Capability.SERIAL)):
        with pytest.raises(ValueError, match="not available") as info:
            call()
        assert cap.name.lower() in str(info.value)


@pytest.mark.parametrize("mask", [0, -1, 1 << 20, 1 << 9, -(1 << 3)], ids=["0", "-1", "1<<20", "1<<9", "negative-bit"])
def test_invalid_capability_masks(mask):
    x = np.ones((2, 3), dtype=np.float32)
    packed = nk.maxsim_pack(x)
    with pytest.raises(ValueError):
        nk.maxsim(x, x, capabilities=mask)
    with pytest.raises(ValueError):
        nk.maxsim_pack(x, capabilities=mask)
    with pytest.raises(ValueError):
        nk.maxsim_packed(packed, packed, capabilities=mask)


@pytest.mark.parametrize("mask", [True, 1.0, "serial", [1]], ids=["bool", "float", "str", "list"])
def test_capability_masks_of_the_wrong_type(mask):
    x = np.ones((2, 3), dtype=np.float32)
    with pytest.raises(TypeError):
        nk.maxsim(x, x, capabilities=mask)
    with pytest.raises(TypeError):
        nk.maxsim_pack(x, capabilities=mask)


def test_plain_int_masks_work():
    x = random_matrix(4, 16, 1)
    assert nk.maxsim(x, x, "float32", capabilities=1) == nk.maxsim(x, x, "float32", capabilities=nk.Capability.SERIAL)
    everything = int(nk.get_capabilities())
    assert nk.maxsim(x, x, "float32", capabilities=everything) == nk.maxsim(x, x, "float32")


@pytest.mark.parametrize("stream", [0, 1, 12345, "cuda"], ids=["0", "1", "pointer", "str"])
def test_stream_must_be_none(stream):
    x = np.ones((2, 3), dtype=np.float32)
    packed = nk.maxsim_pack(x)
    with pytest.raises(ValueError, match="stream"):
        nk.maxsim(x, x, stream=stream)
    with pytest.raises(ValueError, match="stream"):
        nk.maxsim_pack(x, stream=stream)
    with pytest.raises(ValueError, match="stream"):
        nk.maxsim_packed(packed, packed, stream=stream)
    assert nk.maxsim(x, x, stream=None) == nk.maxsim(x, x)


# ---------------------------------------------------------------------------------------------
# Corrupt and truncated buffers given to unpickling

# Header fields (maxsim_internal.h nk_maxsim_header_t): magic[8], version u32, dtype u32, vectors,
# depth, capabilities, nbytes, values/inv_norms/screen/... offsets (u64 each).
OFFSET_VERSION, OFFSET_DTYPE, OFFSET_VECTORS, OFFSET_DEPTH, OFFSET_NBYTES, OFFSET_VALUES = 8, 12, 16, 24, 40, 48


def _packed(name="float32", shape=(5, 12)):
    return nk.maxsim_pack(random_matrix(shape[0], shape[1], 9), name)


def _load_out_of_band(data):
    """Unpickle a protocol-5 pickle of a packed matrix with `data` as its out-of-band buffer."""
    buffers = []
    stream = pickle.dumps(_packed(), protocol=5, buffer_callback=buffers.append)
    assert len(buffers) == 1
    return pickle.loads(stream, buffers=[data])


def _load_in_band(original, data, protocol):
    """Unpickle an in-band pickle whose payload bytes were replaced by `data` (same length)."""
    good = bytes(memoryview(original))
    assert len(data) == len(good)
    if protocol < 3:  # bytes pickle as _codecs.encode(str, 'latin1'): the payload is UTF-8 text
        good, data = good.decode("latin1").encode("utf-8"), bytes(data).decode("latin1").encode("utf-8")
        assert len(data) == len(good)
    stream = pickle.dumps(original, protocol=protocol)
    assert stream.count(good) == 1
    return pickle.loads(stream.replace(good, bytes(data)))


def _tampered(packed, offset, fmt, value):
    data = bytearray(memoryview(packed))
    struct.pack_into(fmt, data, offset, value)
    return data


CORRUPTIONS = {
    "magic": lambda p: _tampered(p, 0, "8s", b"NKMAXSIN"),
    "magic-first-byte": lambda p: _tampered(p, 0, "B", memoryview(p)[0] ^ 0xFF),
    "version": lambda p: _tampered(p, OFFSET_VERSION, "<I", 2),  # the previous format
    "version-next": lambda p: _tampered(p, OFFSET_VERSION, "<I", 4),
    "dtype-code-other-size": lambda p: _tampered(p, OFFSET_DTYPE, "<I", 1),  # float32 -> float64
    "dtype-code-same-size": lambda p: _tampered(p, OFFSET_DTYPE, "<I", 2 if p.dtype != "float32" else 99),
    "dtype-code-unknown": lambda p: _tampered(p, OFFSET_DTYPE, "<I", 0),
    "dtype-code-huge": lambda p: _tampered(p, OFFSET_DTYPE, "<I", 0xFFFFFFFF),
    "vectors-plus-one": lambda p: _tampered(p, OFFSET_VECTORS, "<Q", p.vectors + 1),
    "vectors-minus-one": lambda p: _tampered(p, OFFSET_VECTORS, "<Q", p.vectors - 1),
    "vectors-huge": lambda p: _tampered(p, OFFSET_VECTORS, "<Q", 2 ** 63),
    "depth": lambda p: _tampered(p, OFFSET_DEPTH, "<Q", p.depth + 1),
    "depth-zero": lambda p: _tampered(p, OFFSET_DEPTH, "<Q", 0),
    "nbytes": lambda p: _tampered(p, OFFSET_NBYTES, "<Q", p.nbytes + 64),
    "values-offset": lambda p: _tampered(p, OFFSET_VALUES, "<Q", 64),
    "reserved-bytes": lambda p: _tampered(p, HEADER_BYTES - 1, "B", 1),
}


@pytest.mark.parametrize("corruption", list(CORRUPTIONS))
def test_corrupt_header_out_of_band(corruption):
    data = CORRUPTIONS[corruption](_packed())
    with pytest.raises(ValueError, match="corrupt"):
        _load_out_of_band(data)


@pytest.mark.parametrize("version", [1, 2, 4, 0xFFFFFFFF])
def test_other_format_version_says_so(version):
    data = _tampered(_packed(), OFFSET_VERSION, "<I", version)
    with pytest.raises(ValueError, match=rf"corrupt packed matrix: it is in format version {version}, this numkong "
                                         r"reads version 3; pack the source arrays again"):
        _load_out_of_band(data)


@pytest.mark.parametrize("protocol", [2, 3, 4, 5])
@pytest.mark.parametrize("corruption", ["magic", "dtype-code-same-size", "vectors-plus-one", "depth", "version"])
def test_corrupt_header_in_band(corruption, protocol):
    packed = _packed()
    with pytest.raises(ValueError, match="corrupt"):
        _load_in_band(packed, CORRUPTIONS[corruption](packed), protocol)


@pytest.mark.parametrize("keep", [0, 1, 64, 127, 128, 129, -64, -1], ids=lambda k: f"keep{k}")
def test_truncated_buffer(keep):
    good = bytes(memoryview(_packed()))
    data = good[:keep] if keep >= 0 else good[:len(good) + keep]
    with pytest.raises(ValueError, match="corrupt"):
        _load_out_of_band(data)


def test_extended_buffer():
    good = bytes(memoryview(_packed()))
    with pytest.raises(ValueError, match="corrupt"):
        _load_out_of_band(good + b"\0" * 64)


# Stored bit patterns no packing produces: NaN / inf encodings, unused float6 bits, and float64
# values outside the range the packer brings rows into.
BAD_VALUE_BITS = [
    pytest.param("float64", struct.pack("<d", float("nan")), id="float64-nan"),
    pytest.param("float64", struct.pack("<d", float("inf")), id="float64-inf"),
    pytest.param("float64", struct.pack("<d", 1e200), id="float64-out-of-range"),
    pytest.param("float32", struct.pack("<I", 0x7FC00000), id="float32-nan"),
    pytest.param("float32", struct.pack("<I", 0xFF800000), id="float32--inf"),
    pytest.param("float16", struct.pack("<H", 0x7E00), id="float16-nan"),
    pytest.param("float16", struct.pack("<H", 0x7C00), id="float16-inf"),
    pytest.param("bfloat16", struct.pack("<H", 0x7FC0), id="bfloat16-nan"),
    pytest.param("bfloat16", struct.pack("<H", 0xFF80), id="bfloat16--inf"),
    pytest.param("e4m3", bytes([0x7F]), id="e4m3-nan"),
    pytest.param("e4m3", bytes([0xFF]), id="e4m3-negative-nan"),
    pytest.param("e5m2", bytes([0x7C]), id="e5m2-inf"),
    pytest.param("e5m2", bytes([0x7E]), id="e5m2-nan"),
    pytest.param("e2m3", bytes([0x40]), id="e2m3-unused-bit6"),
    pytest.param("e2m3", bytes([0x80]), id="e2m3-unused-bit7"),
    pytest.param("e3m2", bytes([0xC1]), id="e3m2-unused-bits"),
]


@pytest.mark.parametrize("row", [0, 3])
@pytest.mark.parametrize("name, bits", BAD_VALUE_BITS)
def test_invalid_stored_values(name, bits, row):
    packed = _packed(name, (4, 10))
    data = bytearray(memoryview(packed))
    offset = HEADER_BYTES + (row * packed.depth + 5) * len(bits)
    data[offset:offset + len(bits)] = bits
    with pytest.raises(ValueError, match="corrupt"):
        _load_out_of_band(data)
    with pytest.raises(ValueError, match="corrupt"):
        _load_in_band(packed, data, 4)


def _sections(packed):
    """The derived sections (inverse norms, screening copy, scales, errors, sums) by header offsets."""
    data = bytes(memoryview(packed))
    vectors = packed.vectors
    inv_norms, screen, scales, errors, sums, screen_depth = struct.unpack_from("<6Q", data, 56)
    return (data[inv_norms:inv_norms + 8 * vectors], data[screen:screen + vectors * screen_depth],
            data[scales:scales + 4 * vectors], data[errors:errors + 4 * vectors], data[sums:sums + 4 * vectors])


@pytest.mark.parametrize("name", dtype_params())
def test_derived_sections_are_rebuilt_on_load(name):
    """Everything after the values section (norms, screening copy) is recomputed from the values, so
    scribbling over it changes nothing: the loaded matrix scores exactly like the original."""
    q, d = _packed(name, (6, 40)), _packed(name, (50, 40))
    expected = nk.maxsim_packed(q, d)
    values_end = HEADER_BYTES + d.vectors * d.depth * ITEMSIZE[name]
    data = bytearray(memoryview(d))
    rng = np.random.default_rng(0)
    data[values_end:] = rng.integers(0, 256, len(data) - values_end, dtype=np.uint8).tobytes()
    loaded = _load_out_of_band(data)
    assert nk.maxsim_packed(q, loaded) == expected
    assert nk.maxsim_packed(loaded, loaded) == nk.maxsim_packed(d, d)
    assert _sections(loaded) == _sections(d)
    assert values_section(loaded) == values_section(d)


def test_loading_from_something_that_is_not_bytes():
    buffers = []
    stream = pickle.dumps(_packed(), protocol=5, buffer_callback=buffers.append)
    with pytest.raises(TypeError):
        pickle.loads(stream, buffers=[12345])
