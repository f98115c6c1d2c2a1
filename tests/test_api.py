"""The published API (spec maxsim-api.md): signatures, positional-only and keyword-only parameters,
MaxSimPackedMatrix attributes and pack_size, the quickstart, capabilities, input kinds."""
import array
import functools
import inspect
import operator
import threading

import numpy as np
import pytest

import numkong as nk
from conftest import (
    FAMILY_PARAMS,
    ITEMSIZE,
    NUMPY_DTYPES,
    RTOL,
    assert_score_close,
    dtype_params,
    random_matrix,
    reference_maxsim,
)

# ---------------------------------------------------------------------------------------------
# The spec's quickstart, verbatim.

QUICKSTART = '''
import numpy as np
import numkong as nk

queries = np.random.randn(32, 128).astype(np.float32)
documents = np.random.randn(192, 128).astype(np.float32)

q = nk.maxsim_pack(queries, dtype="float32")
d = nk.maxsim_pack(documents, dtype="float32")
score = nk.maxsim_packed(q, d)

assert np.isfinite(score)
assert q.nbytes == nk.MaxSimPackedMatrix.pack_size(32, 128, dtype="float32")
'''


def test_spec_quickstart_runs_unchanged():
    namespace = {}
    exec(compile(QUICKSTART, "maxsim-api.md quickstart", "exec"), namespace)
    score = namespace["score"]
    assert isinstance(score, float)
    assert_score_close(score, reference_maxsim(namespace["queries"], namespace["documents"], "float32"),
                       RTOL["float32"], "quickstart")


def test_spec_imports():
    from numkong import MaxSimPackedMatrix  # noqa: F401
    for name in ("MaxSimPackedMatrix", "maxsim_pack", "maxsim_packed", "maxsim", "Capability",
                 "get_capabilities", "bfloat16", "float16", "float8_e4m3", "float8_e5m2", "float6_e2m3",
                 "float6_e3m2"):
        assert hasattr(nk, name), name
        assert name in nk.__all__, name


# ---------------------------------------------------------------------------------------------
# Signatures


def _parameters(function):
    try:
        return inspect.signature(function).parameters
    except (TypeError, ValueError):
        pytest.skip(f"{function.__name__} has no introspectable signature")


@pytest.mark.parametrize("function, expected", [
    (nk.maxsim_pack, [("b", "POSITIONAL_ONLY"), ("dtype", "POSITIONAL_OR_KEYWORD"), ("capabilities", "KEYWORD_ONLY"),
                      ("stream", "KEYWORD_ONLY")]),
    (nk.maxsim_packed, [("queries", "POSITIONAL_ONLY"), ("documents", "POSITIONAL_ONLY"),
                        ("capabilities", "KEYWORD_ONLY"), ("stream", "KEYWORD_ONLY")]),
    (nk.maxsim, [("queries", "POSITIONAL_ONLY"), ("documents", "POSITIONAL_ONLY"), ("dtype", "POSITIONAL_OR_KEYWORD"),
                 ("capabilities", "KEYWORD_ONLY"), ("stream", "KEYWORD_ONLY")]),
    (nk.MaxSimPackedMatrix.pack_size, [("vectors", "POSITIONAL_ONLY"), ("depth", "POSITIONAL_ONLY"),
                                       ("dtype", "POSITIONAL_OR_KEYWORD")]),
], ids=["maxsim_pack", "maxsim_packed", "maxsim", "pack_size"])
def test_signatures_match_the_spec(function, expected):
    parameters = _parameters(function)
    assert [(name, p.kind.name) for name, p in parameters.items()] == expected
    if function == nk.MaxSimPackedMatrix.pack_size:  # bound classmethods compare equal, are not identical
        assert parameters["dtype"].default is inspect.Parameter.empty  # dtype is required
        return
    for name in ("dtype", "capabilities", "stream"):
        if name in parameters:
            assert parameters[name].default is None, name


X = np.ones((3, 4), dtype=np.float32)


def test_maxsim_pack_positional_only_and_keyword_only():
    with pytest.raises(TypeError):
        nk.maxsim_pack(b=X)
    with pytest.raises(TypeError):
        nk.maxsim_pack(X, "float32", nk.Capability.SERIAL)  # capabilities is keyword-only
    with pytest.raises(TypeError):
        nk.maxsim_pack(X, "float32", None, None)
    with pytest.raises(TypeError):
        nk.maxsim_pack()
    with pytest.raises(TypeError):
        nk.maxsim_pack(X, unknown=1)
    assert nk.maxsim_pack(X, "bf16").dtype == "bfloat16"
    assert nk.maxsim_pack(X, dtype="bf16").dtype == "bfloat16"
    assert nk.maxsim_pack(X, capabilities=nk.Capability.SERIAL, stream=None).capabilities == nk.Capability.SERIAL


def test_maxsim_packed_positional_only_and_keyword_only():
    p = nk.maxsim_pack(X)
    with pytest.raises(TypeError):
        nk.maxsim_packed(queries=p, documents=p)
    with pytest.raises(TypeError):
        nk.maxsim_packed(p, documents=p)
    with pytest.raises(TypeError):
        nk.maxsim_packed(p, p, nk.Capability.SERIAL)
    with pytest.raises(TypeError):
        nk.maxsim_packed(p)
    assert isinstance(nk.maxsim_packed(p, p, capabilities=nk.Capability.SERIAL, stream=None), float)


def test_maxsim_positional_only_and_keyword_only():
    with pytest.raises(TypeError):
        nk.maxsim(queries=X, documents=X)
    with pytest.raises(TypeError):
        nk.maxsim(X, documents=X)
    with pytest.raises(TypeError):
        nk.maxsim(X, X, "float32", nk.Capability.SERIAL)
    with pytest.raises(TypeError):
        nk.maxsim(X)
    assert nk.maxsim(X, X, "float32") == nk.maxsim(X, X, dtype="float32")


def test_maxsim_packed_needs_packed_operands():
    p = nk.maxsim_pack(X)
    for a, b in ((X, p), (p, X), (None, p), (p, None), (memoryview(p), p)):
        with pytest.raises(TypeError):
            nk.maxsim_packed(a, b)


def test_maxsim_refuses_packed_operands():
    p = nk.maxsim_pack(X)
    with pytest.raises(TypeError, match="maxsim_packed"):
        nk.maxsim(p, X)
    with pytest.raises(TypeError, match="maxsim_packed"):
        nk.maxsim(X, p)
    with pytest.raises(TypeError, match="maxsim_packed"):
        nk.maxsim_pack(p)


# ---------------------------------------------------------------------------------------------
# MaxSimPackedMatrix


def test_cannot_be_constructed_directly():
    with pytest.raises(TypeError):
        nk.MaxSimPackedMatrix()
    with pytest.raises(TypeError):
        nk.MaxSimPackedMatrix(X)
    with pytest.raises(TypeError):
        nk.MaxSimPackedMatrix(vectors=3, depth=4)


def test_bare_instance_from_new_is_safe():
    """MaxSimPackedMatrix.__new__ bypasses __init__; the resulting empty object must either be refused
    or be safe (regression: .shape used to read an uninitialized nk_maxsim_info_t, repr() raised
    KeyError)."""
    try:
        bare = nk.MaxSimPackedMatrix.__new__(nk.MaxSimPackedMatrix)
    except TypeError:
        return
    assert bare.nbytes == 0 and len(memoryview(bare)) == 0
    assert bare.shape == (bare.vectors, bare.depth) == (0, 0)
    repr(bare)
    with pytest.raises((TypeError, ValueError)):
        nk.maxsim_packed(bare, bare)


SHAPES = [(0, 1), (1, 1), (3, 17), (16, 128), (17, 129), (33, 7), (300, 5), (5, 1000)]


@pytest.mark.parametrize("shape", SHAPES, ids=[f"{v}x{d}" for v, d in SHAPES])
@pytest.mark.parametrize("name", dtype_params())
def test_pack_size_and_attributes(name, shape):
    vectors, depth = shape
    packed = nk.maxsim_pack(np.ones(shape), name)
    size = nk.MaxSimPackedMatrix.pack_size(vectors, depth, name)
    assert packed.nbytes == size
    assert nk.MaxSimPackedMatrix.pack_size(vectors, depth, dtype=name) == size
    assert packed.pack_size(vectors, depth, name) == size  # a classmethod, also via an instance
    assert len(memoryview(packed)) == size
    assert packed.shape == (vectors, depth)
    assert isinstance(packed.shape, tuple)
    assert (packed.vectors, packed.depth, packed.dtype) == (vectors, depth, name)
    assert all(type(v) is int for v in (packed.vectors, packed.depth, packed.nbytes, size))
    # Room for the header and the values at least; 64-byte granularity.
    assert size >= 128 + vectors * depth * ITEMSIZE[name]
    assert size % 64 == 0
    text = repr(packed)
    assert text.startswith("MaxSimPackedMatrix(")
    for fragment in (f"vectors={vectors}", f"depth={depth}", f"dtype='{name}'", f"nbytes={size}"):
        assert fragment in text


@pytest.mark.parametrize("name", dtype_params())
def test_pack_size_grows_with_both_dimensions(name):
    size = nk.MaxSimPackedMatrix.pack_size
    assert size(101, 64, name) >= size(100, 64, name)
    assert size(1000, 64, name) > size(100, 64, name)
    assert size(100, 1000, name) > size(100, 64, name)


@pytest.mark.parametrize("alias, name", [("f32", "float32"), ("bf16", "bfloat16"), ("float8_e4m3", "e4m3"),
                                         (nk.float16, "float16"), (nk.bfloat16, "bfloat16"), (np.float64, "float64")])
def test_pack_size_accepts_aliases_and_types(alias, name):
    assert nk.MaxSimPackedMatrix.pack_size(7, 33, alias) == nk.MaxSimPackedMatrix.pack_size(7, 33, name)


def test_pack_size_argument_errors():
    size = nk.MaxSimPackedMatrix.pack_size
    with pytest.raises(TypeError):
        size(vectors=3, depth=4, dtype="float32")
    with pytest.raises(TypeError):
        size(3, depth=4, dtype="float32")
    with pytest.raises(TypeError):
        size(3, 4)  # dtype is required
    with pytest.raises(TypeError):
        size(3.0, 4, "float32")
    with pytest.raises(TypeError):
        size(True, 4, "float32")
    with pytest.raises(TypeError):
        size("3", 4, "float32")
    with pytest.raises(ValueError):
        size(-1, 4, "float32")
    with pytest.raises(ValueError):
        size(3, -4, "float32")
    with pytest.raises(ValueError):
        size(3, 0, "float32")
    with pytest.raises(ValueError):
        size(2 ** 40, 2 ** 40, "float64")  # byte size overflows 64 bits
    with pytest.raises(ValueError):
        size(2 ** 64, 1, "float32")
    with pytest.raises(ValueError, match="not a packing format"):
        size(3, 4, "int32")
    with pytest.raises(ValueError, match="unknown dtype"):
        size(3, 4, "int9")
    assert size(np.int64(3), np.uint16(4), "float32") == size(3, 4, "float32")


def test_attributes_are_read_only():
    packed = nk.maxsim_pack(X)
    for attribute, value in (("vectors", 5), ("depth", 5), ("dtype", "float64"), ("nbytes", 1), ("shape", (1, 1))):
        with pytest.raises(AttributeError):
            setattr(packed, attribute, value)
    assert packed.shape == (3, 4)


def test_result_is_a_python_float():
    got = nk.maxsim(X, X)
    assert type(got) is float
    assert type(nk.maxsim_packed(nk.maxsim_pack(X), nk.maxsim_pack(X))) is float


# ---------------------------------------------------------------------------------------------
# Capabilities


def test_capability_is_an_int_flag_with_one_bit_per_family():
    import enum
    assert issubclass(nk.Capability, enum.IntFlag)
    names = [c.name for c in nk.Capability]
    # Only families that have kernels are public; their bits never change (they are stored in buffers).
    assert {c.name: c.value for c in nk.Capability} == {
        "SERIAL": 1, "HASWELL": 2, "SKYLAKE": 4, "ICELAKE": 8, "GENOA": 16, "SAPPHIREAMX": 32, "NEON": 64, "SVE": 128}
    values = [c.value for c in nk.Capability]
    assert all(v and v & (v - 1) == 0 for v in values)


def test_capability_str_names_the_families():
    assert str(nk.Capability.SERIAL | nk.Capability.ICELAKE) == "serial|icelake"
    assert str(nk.get_capabilities()) == "|".join(c.name.lower() for c in nk.Capability if c & nk.get_capabilities())


def test_get_capabilities_kinds():
    available = nk.get_capabilities()
    compiled = nk.get_capabilities("compiled")
    cpu = nk.get_capabilities("cpu")
    assert nk.get_capabilities("available") == available
    for mask in (available, compiled, cpu):
        assert isinstance(mask, nk.Capability)
        assert mask & nk.Capability.SERIAL
    assert available & ~(compiled & cpu) == 0  # available within compiled and cpu
    with pytest.raises(ValueError):
        nk.get_capabilities("gpu")


def test_architecture_specific_families():
    import platform
    machine = platform.machine().lower()
    compiled = nk.get_capabilities("compiled")
    arm = nk.Capability.NEON | nk.Capability.SVE
    if machine in ("x86_64", "amd64"):
        assert not compiled & arm
    elif machine in ("aarch64", "arm64"):
        assert not compiled & (nk.Capability.HASWELL | nk.Capability.SKYLAKE | nk.Capability.ICELAKE)


@pytest.mark.parametrize("family", FAMILY_PARAMS)
def test_packing_records_the_mask(family):
    packed = nk.maxsim_pack(X, capabilities=family)
    assert packed.capabilities == family
    # Unrestricted: every family, so another machine scores it with its own best ones.
    assert nk.maxsim_pack(X).capabilities == functools.reduce(operator.or_, nk.Capability)
    both = family | nk.Capability.SERIAL
    assert nk.maxsim_pack(X, capabilities=both).capabilities == both


@pytest.mark.parametrize("family", FAMILY_PARAMS)
def test_packed_default_is_the_intersection_of_both_masks(family):
    """Scoring defaults to the families both operands were packed with; an explicit mask overrides it."""
    q = nk.maxsim_pack(random_matrix(20, 64, 1), "float32", capabilities=family)
    d = nk.maxsim_pack(random_matrix(70, 64, 2), "float32")
    forced = nk.maxsim_packed(q, d, capabilities=family)
    assert nk.maxsim_packed(q, d) == forced
    assert nk.maxsim_packed(d, q) == nk.maxsim_packed(d, q, capabilities=family)
    # Any available family may be requested explicitly, whatever packed the operands.
    for other in nk.Capability:
        if other & nk.get_capabilities():
            assert_score_close(nk.maxsim_packed(q, d, capabilities=other), forced, RTOL["float32"], other.name)


# ---------------------------------------------------------------------------------------------
# Kinds of input


class _ArrayInterface:
    def __init__(self, array):
        self._array = array
        self.__array_interface__ = array.__array_interface__


class _ArrayMethod:
    def __init__(self, array):
        self._array = array

    def __array__(self, dtype=None, copy=None):
        return self._array


INPUT_KINDS = [
    pytest.param(lambda a: a, id="ndarray"),
    pytest.param(lambda a: memoryview(a), id="memoryview"),
    pytest.param(lambda a: memoryview(a.tobytes()).cast("f", a.shape), id="memoryview-cast"),
    pytest.param(_ArrayInterface, id="array-interface"),
    pytest.param(_ArrayMethod, id="array-method"),
    pytest.param(np.asmatrix, id="np.matrix",
                 marks=pytest.mark.filterwarnings("ignore:the matrix subclass:PendingDeprecationWarning")),
]


@pytest.mark.parametrize("kind", INPUT_KINDS)
def test_input_kinds(kind):
    q = np.ascontiguousarray(random_matrix(5, 12, 1), dtype=np.float32)
    d = np.ascontiguousarray(random_matrix(9, 12, 2), dtype=np.float32)
    expected = nk.maxsim(q, d)
    assert nk.maxsim(kind(q), kind(d)) == expected
    assert nk.maxsim(kind(q), d, "float32") == expected
    assert nk.maxsim_packed(nk.maxsim_pack(kind(q)), nk.maxsim_pack(d)) == expected


def test_one_dimensional_buffer_is_refused():
    with pytest.raises(ValueError, match="2-D"):
        nk.maxsim_pack(array.array("f", [1.0, 2.0, 3.0]))


@pytest.mark.parametrize("name", dtype_params(["float32", "float16", "bfloat16", "float64"]))
def test_unaligned_input(name):
    """An unaligned view (offset 1 in a byte buffer) scores like an aligned copy."""
    x = random_matrix(6, 16, 1).astype(NUMPY_DTYPES[name])
    raw = np.zeros(x.nbytes + 1, dtype=np.uint8)
    unaligned = raw[1:].view(x.dtype).reshape(x.shape)
    unaligned[...] = x
    assert not unaligned.flags.aligned
    d = random_matrix(11, 16, 2)
    assert nk.maxsim(unaligned, d, name) == nk.maxsim(x, d, name)
    assert nk.maxsim(d, unaligned, name) == nk.maxsim(d, x, name)


def test_big_endian_input():
    q = random_matrix(5, 12, 1).astype(">f4")
    d = random_matrix(9, 12, 2).astype(">f4")
    assert nk.maxsim_pack(q).dtype == "float32"
    assert nk.maxsim(q, d) == nk.maxsim(q.astype("<f4"), d.astype("<f4"))


@pytest.mark.parametrize("family", FAMILY_PARAMS)
def test_scoring_from_threads(family):
    """Packed matrices are read-only while scoring: concurrent calls give identical results."""
    q = nk.maxsim_pack(random_matrix(32, 128, 1), "bfloat16")
    d = nk.maxsim_pack(random_matrix(300, 128, 2), "bfloat16")
    expected = nk.maxsim_packed(q, d, capabilities=family)
    results = []

    def work():
        for _ in range(20):
            results.append(nk.maxsim_packed(q, d, capabilities=family))

    threads = [threading.Thread(target=work) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert results == [expected] * 80
