"""Pickling (protocols 2-5, protocol 5 with an out-of-band buffer), copying and the read-only buffer."""
import copy
import ctypes
import pickle

import numpy as np
import pytest

import numkong as nk
from conftest import FAMILY_PARAMS, dtype_params, random_matrix


def _pair(name, capabilities=None):
    kwargs = {} if capabilities is None else {"capabilities": capabilities}
    q = nk.maxsim_pack(random_matrix(17, 96, 1), name, **kwargs)
    d = nk.maxsim_pack(random_matrix(130, 96, 2), name, **kwargs)
    return q, d


def _assert_same(loaded, original):
    assert type(loaded) is nk.MaxSimPackedMatrix
    assert loaded is not original
    assert (loaded.vectors, loaded.depth, loaded.dtype, loaded.nbytes, loaded.shape) == (
        original.vectors, original.depth, original.dtype, original.nbytes, original.shape)
    assert loaded.capabilities == original.capabilities
    assert bytes(memoryview(loaded)) == bytes(memoryview(original))


@pytest.mark.parametrize("protocol", [2, 3, 4, 5])
@pytest.mark.parametrize("name", dtype_params())
def test_pickle_round_trip(name, protocol):
    q, d = _pair(name)
    expected = nk.maxsim_packed(q, d)
    q2, d2 = pickle.loads(pickle.dumps((q, d), protocol=protocol))
    _assert_same(q2, q)
    _assert_same(d2, d)
    assert nk.maxsim_packed(q2, d2) == expected
    assert nk.maxsim_packed(q, d2) == expected
    assert nk.maxsim_packed(q2, d) == expected


@pytest.mark.parametrize("name", dtype_params())
def test_pickle_protocol_5_out_of_band(name):
    q, d = _pair(name)
    expected = nk.maxsim_packed(q, d)
    buffers = []
    stream = pickle.dumps((q, d), protocol=5, buffer_callback=buffers.append)
    assert len(buffers) == 2
    assert all(isinstance(b, pickle.PickleBuffer) for b in buffers)
    # The buffers are the packed matrices themselves, not copies, and the stream holds no payload.
    assert bytes(buffers[0].raw()) == bytes(memoryview(q))
    assert bytes(buffers[1].raw()) == bytes(memoryview(d))
    assert len(stream) < 1024 < q.nbytes + d.nbytes
    q2, d2 = pickle.loads(stream, buffers=buffers)
    _assert_same(q2, q)
    _assert_same(d2, d)
    assert nk.maxsim_packed(q2, d2) == expected
    # Out-of-band buffers can be any bytes-like object, e.g. bytes received over a network.
    q3, d3 = pickle.loads(stream, buffers=[bytes(b.raw()) for b in buffers])
    assert nk.maxsim_packed(q3, d3) == expected
    # Or unaligned memory: loading copies into an aligned allocation.
    raw = np.zeros(q.nbytes + 1, dtype=np.uint8)
    raw[1:] = np.frombuffer(memoryview(q), dtype=np.uint8)
    q4, _ = pickle.loads(stream, buffers=[raw[1:], bytes(buffers[1].raw())])
    _assert_same(q4, q)


def test_loaded_matrix_does_not_alias_its_source():
    q, d = _pair("float32")
    expected = nk.maxsim_packed(q, d)
    buffers = []
    stream = pickle.dumps(q, protocol=5, buffer_callback=buffers.append)
    source = bytearray(buffers[0].raw())
    loaded = pickle.loads(stream, buffers=[source])
    source[200:] = b"\xff" * (len(source) - 200)  # scribble over the source after loading
    assert nk.maxsim_packed(loaded, d) == expected


@pytest.mark.parametrize("family", FAMILY_PARAMS)
def test_pickle_keeps_the_packing_mask(family):
    q, d = _pair("bfloat16", capabilities=family)
    q2 = pickle.loads(pickle.dumps(q, protocol=4))
    assert q2.capabilities == family
    assert nk.maxsim_packed(q2, d) == nk.maxsim_packed(q, d, capabilities=family)


@pytest.mark.parametrize("name", dtype_params(["float32", "e4m3"]))
def test_copy_and_deepcopy(name):
    q, d = _pair(name)
    for clone in (copy.copy(q), copy.deepcopy(q)):
        _assert_same(clone, q)
        assert nk.maxsim_packed(clone, d) == nk.maxsim_packed(q, d)


def test_empty_matrix_round_trip():
    empty = nk.maxsim_pack(np.zeros((0, 16)), "float16")
    for protocol in (2, 5):
        loaded = pickle.loads(pickle.dumps(empty, protocol=protocol))
        _assert_same(loaded, empty)
        assert loaded.shape == (0, 16)


@pytest.mark.parametrize("name", dtype_params())
def test_memoryview_is_read_only_bytes(name):
    packed = nk.maxsim_pack(random_matrix(9, 33, 1), name)
    view = memoryview(packed)
    assert view.readonly
    assert view.nbytes == len(view) == packed.nbytes
    assert view.ndim == 1 and view.itemsize == 1 and view.format == "B"
    assert view.shape == (packed.nbytes,) and view.strides == (1,)
    assert view.contiguous
    assert bytes(view[:8]) == b"NKMAXSIM"
    with pytest.raises(TypeError):
        view[0] = 0
    array = np.frombuffer(packed, dtype=np.uint8)
    assert array.size == packed.nbytes and not array.flags.writeable
    with pytest.raises(ValueError):
        array[0] = 0
    with pytest.raises((BufferError, TypeError)):
        ctypes.c_char.from_buffer(packed)  # asks for a writable buffer
    # The memory is 64-byte aligned.
    assert array.__array_interface__["data"][0] % 64 == 0
    # Bytes are deterministic: packing the same input twice gives the same buffer.
    assert bytes(view) == bytes(memoryview(nk.maxsim_pack(random_matrix(9, 33, 1), name)))


def test_buffer_keeps_the_matrix_alive():
    packed = nk.maxsim_pack(random_matrix(4, 8, 1), "float32")
    expected = bytes(memoryview(packed))
    view = memoryview(packed)
    del packed
    assert bytes(view) == expected


def _non_canonical_float6(dtype):
    """float6 values given as raw bytes with the two unused top bits set (ml_dtypes reads them)."""
    raw = np.array([[0x48, 0x08, 0x10, 0x01], [0x08, 0x90, 0x08, 0xC3]], dtype=np.uint8)
    return raw.view(dtype)


PACK_THEN_LOAD = [
    pytest.param(lambda: _non_canonical_float6(nk.float6_e2m3), "e2m3", id="e2m3-unused-bits-set"),
    pytest.param(lambda: _non_canonical_float6(nk.float6_e3m2), "e3m2", id="e3m2-unused-bits-set"),
    pytest.param(lambda: np.array([[1.0, np.nan], [2.0, 3.0]]).astype(nk.float8_e4m3), "e4m3", id="e4m3-nan"),
]


@pytest.mark.parametrize("make, name", PACK_THEN_LOAD)
def test_whatever_packs_also_loads(make, name):
    """Packing never stores bytes the loader would call corrupt (e4m3 NaN bits, fp6 bytes with the
    unused top bits set): it either refuses such input (ValueError) or stores values that load."""
    x = make()
    try:
        packed = nk.maxsim_pack(x, name)
    except ValueError:
        return
    loaded = pickle.loads(pickle.dumps(packed, protocol=4))
    assert bytes(memoryview(loaded)) == bytes(memoryview(packed))
    values = x.astype(np.float64)
    assert np.all(np.isfinite(values))
    expected = nk.maxsim(values, values[::-1], "float64")
    assert abs(nk.maxsim_packed(packed, nk.maxsim_pack(values[::-1], name)) - expected) < 1e-6
