"""Hostile and extreme input, fuzzing of the loaders, leaks, threads, determinism."""
import gc
import os
import pickle
import threading
import time

import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import numkong as nk
from conftest import SANITIZED

FAMILIES = [c for c in nk.Capability if c & nk.get_capabilities()]
DTYPES = ["float64", "float32", "float16", "bfloat16", "e4m3", "e5m2", "e2m3", "e3m2"]


NUMPY_TYPES = {
    "float64": np.float64, "float32": np.float32, "float16": np.float16, "bfloat16": ml_dtypes.bfloat16,
    "e4m3": ml_dtypes.float8_e4m3fn, "e5m2": ml_dtypes.float8_e5m2, "e2m3": ml_dtypes.float6_e2m3fn,
    "e3m2": ml_dtypes.float6_e3m2fn,
}


def _unit_scaled(x):
    """Rows scaled by an exact power of two to a largest magnitude in [0.5, 1): same cosines, no overflow."""
    x = np.asarray(x, np.float64)
    _, exponent = np.frexp(np.abs(x).max(axis=1, keepdims=True))
    return np.ldexp(x, -exponent)


def _reference(queries, documents):
    """float64 MaxSim of already-stored values."""
    q = _unit_scaled(queries)
    d = _unit_scaled(documents)
    qn, dn = np.linalg.norm(q, axis=1), np.linalg.norm(d, axis=1)
    cos = (q @ d.T) / np.where(qn == 0, 1, qn)[:, None] / np.where(dn == 0, 1, dn)[None, :]
    cos[qn == 0, :] = 0
    cos[:, dn == 0] = 0
    return float(np.maximum(0.0, 1.0 - cos.max(axis=1)).sum())


# ---- fuzzing the loaders: arbitrary bytes are a ValueError or a valid matrix, never a crash ----

@pytest.fixture(scope="module")
def packed_bytes():
    rng = np.random.default_rng(0)
    return bytes(memoryview(nk.maxsim_pack(rng.standard_normal((5, 13)).astype(np.float32))))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_fuzz_matrix_loader_with_mutations(packed_bytes, data):
    blob = bytearray(packed_bytes)
    for _ in range(data.draw(st.integers(1, 8))):
        position = data.draw(st.integers(0, len(blob) - 1))
        blob[position] = data.draw(st.integers(0, 255))
    cut = data.draw(st.one_of(st.none(), st.integers(0, len(blob))))
    if cut is not None:
        blob = blob[:cut]
    try:
        loaded = nk._maxsim._load_packed(bytes(blob))
    except ValueError as error:
        assert "corrupt" in str(error)
        return
    # Whatever loads must score finitely against itself.
    if loaded.vectors:
        assert np.isfinite(nk.maxsim_packed(loaded, loaded))


@settings(max_examples=200, deadline=None)
@given(blob=st.binary(max_size=600))
def test_fuzz_loaders_with_random_bytes(blob):
    for loader in (nk._maxsim._load_packed, nk._maxsim._load_corpus):
        with pytest.raises(ValueError, match="corrupt"):
            loader(b"NKMAXSIM" + blob if loader is nk._maxsim._load_packed else b"NKCORPUS" + blob)


@settings(max_examples=150, deadline=None)
@given(
    rows=st.integers(0, 6),
    depth=st.integers(1, 40),
    dtype=st.sampled_from(DTYPES),
    values=st.sampled_from(["normal", "huge", "tiny", "subnormal", "equal", "mixed"]),
    seed=st.integers(0, 2 ** 32 - 1),
)
def test_fuzz_packing_arbitrary_arrays(rows, depth, dtype, values, seed):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((rows, depth))
    x *= {"normal": 1.0, "huge": 1e300, "tiny": 1e-300, "subnormal": 5e-324, "equal": 0.0, "mixed": 1.0}[values]
    if values == "equal":
        x[:] = 3.0
    if values == "mixed" and rows:
        x[0, 0] = 1e200
    packed = nk.maxsim_pack(x, dtype=dtype)
    assert packed.shape == (rows, depth)
    if rows:
        score = nk.maxsim_packed(packed, packed)
        assert np.isfinite(score) and 0.0 <= score <= 2.0 * rows


# ---- sizes ----

@pytest.mark.parametrize("vectors, depth", [(2 ** 63, 2), (2 ** 40, 2 ** 40), (1, 2 ** 64 - 1), (2 ** 64 - 1, 1)])
def test_pack_size_overflow_is_value_error(vectors, depth):
    with pytest.raises(ValueError, match="overflows 64 bits"):
        nk.MaxSimPackedMatrix.pack_size(vectors, depth, dtype="float32")


def test_pack_size_rejects_out_of_range_counts():
    with pytest.raises(ValueError, match="64 bits"):
        nk.MaxSimPackedMatrix.pack_size(2 ** 64, 1, dtype="float32")
    with pytest.raises(ValueError, match="non-negative"):
        nk.MaxSimPackedMatrix.pack_size(-1, 1, dtype="float32")
    with pytest.raises(TypeError):
        nk.MaxSimPackedMatrix.pack_size(1.5, 1, dtype="float32")


def test_allocation_failure_is_memory_error():
    # A broadcast view claims 2**40 rows without memory behind it; its packed size (~1e15 bytes) fits
    # 64 bits but not this machine.
    huge = np.broadcast_to(np.ones((1, 64), np.float32), (2 ** 40, 64))
    with pytest.raises(MemoryError):
        nk.maxsim_pack(huge)


# ---- extreme values: exact or the documented error ----

@pytest.mark.parametrize("family", FAMILIES, ids=lambda c: c.name.lower())
@pytest.mark.parametrize("dtype", DTYPES)
def test_extreme_values(family, dtype):
    info = ml_dtypes.finfo(NUMPY_TYPES[dtype])
    top, sub = float(info.max), float(info.smallest_subnormal)
    cases = {
        "at max": np.array([[top, top / 2], [top, -top]]),
        "subnormal": np.array([[sub, 0.0], [sub, sub]]),
        "all equal": np.full((3, 5), 2.5),
        "depth 1 negative": np.array([[-3.0], [-1.0], [2.0]]),
    }
    for name, x in cases.items():
        native = x.astype(NUMPY_TYPES[dtype])
        stored = native.astype(np.float64)  # already in the format: stored bit-exact
        got = nk.maxsim(native, native[::-1].copy(), capabilities=family)
        assert got == pytest.approx(_reference(stored, stored[::-1]), rel=1e-9, abs=1e-12), name
    with pytest.raises(ValueError, match="row 1 contains NaN or infinity"):
        nk.maxsim_pack(np.array([[1.0, 2.0], [np.inf, 1.0]]), dtype=dtype)


def test_beyond_format_max_is_scaled_not_overflowed():
    x = np.array([[1e6, -3e5, 1.0], [2e6, 1e6, -5e5]])
    for dtype in ["float16", "e4m3", "e5m2", "e2m3", "e3m2"]:
        assert np.isfinite(nk.maxsim(x, x, dtype=dtype))
        assert nk.maxsim(x, x, dtype=dtype) < 1e-2


# ---- leaks ----

def _rss_bytes():
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * 4096


@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="needs /proc (Linux)")
@pytest.mark.skipif(SANITIZED, reason="AddressSanitizer's quarantine holds freed memory on purpose")
def test_100k_cycles_keep_memory_flat():
    rng = np.random.default_rng(0)
    queries = rng.standard_normal((4, 16)).astype(np.float32)
    documents = rng.standard_normal((6, 16)).astype(np.float32)

    def cycle():
        q = nk.maxsim_pack(queries)
        d = nk.maxsim_pack(documents, dtype="bf16")
        d = pickle.loads(pickle.dumps(nk.maxsim_pack(documents), protocol=5))
        nk.maxsim_packed(q, d)
        try:
            nk.maxsim_pack(np.array([[np.nan]]))
        except ValueError:
            pass

    for _ in range(5000):  # warm up allocator pools
        cycle()
    gc.collect()
    before = _rss_bytes()
    for _ in range(100_000):
        cycle()
    gc.collect()
    grown = _rss_bytes() - before
    # Leaking even the smallest buffer (~2 KB) per cycle would add ~200 MB.
    assert grown < 8 * 2 ** 20, f"resident memory grew by {grown / 2 ** 20:.1f} MiB"


# ---- threads and determinism ----

@pytest.mark.parametrize("family", FAMILIES, ids=lambda c: c.name.lower())
def test_eight_threads_bit_identical(family):
    rng = np.random.default_rng(3)
    q = nk.maxsim_pack(rng.standard_normal((32, 128)).astype(np.float32))
    d = nk.maxsim_pack(rng.standard_normal((180, 128)).astype(np.float32))
    expected = nk.maxsim_packed(q, d, capabilities=family)
    results = [[] for _ in range(8)]

    def work(slot):
        for _ in range(30):
            results[slot].append(nk.maxsim_packed(q, d, capabilities=family))

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert all(r == [expected] * 30 for r in results)


def test_gil_is_released_during_scoring():
    """Two threads scoring a long call overlap in time: each call's span covers the other's start."""
    rng = np.random.default_rng(4)
    q = nk.maxsim_pack(rng.standard_normal((400, 256)).astype(np.float32))
    d = nk.maxsim_pack(rng.standard_normal((3000, 256)).astype(np.float32))
    spans = []

    def work():
        start = time.perf_counter()
        nk.maxsim_packed(q, d, capabilities=nk.Capability.SERIAL)
        spans.append((start, time.perf_counter()))

    threads = [threading.Thread(target=work) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    (a0, a1), (b0, b1) = sorted(spans)
    # With the GIL held, the second call could only start after the first finished.
    assert b0 < a1, "the second scoring call did not start until the first ended"


@pytest.mark.parametrize("family", FAMILIES, ids=lambda c: c.name.lower())
def test_repeated_calls_bit_identical(family):
    rng = np.random.default_rng(5)
    q = nk.maxsim_pack(rng.standard_normal((17, 129)), dtype="e4m3")
    d = nk.maxsim_pack(rng.standard_normal((301, 129)), dtype="e4m3")
    first = nk.maxsim_packed(q, d, capabilities=family)
    assert all(nk.maxsim_packed(q, d, capabilities=family) == first for _ in range(50))
