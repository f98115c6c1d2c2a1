"""DLPack input without any tensor library: producers built here with ctypes check the capsule protocol
(renaming, ownership, the deleter on every path), dtype codes, strides, byte offsets and devices."""
import ctypes
import gc
import weakref

import ml_dtypes
import numpy as np
import pytest

import numkong as nk
from conftest import RTOL, assert_score_close, random_matrix, reference_maxsim
from numkong._maxsim import _from_dlpack


class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", DLDevice), ("ndim", ctypes.c_int32), ("dtype", DLDataType),
                ("shape", ctypes.POINTER(ctypes.c_int64)), ("strides", ctypes.POINTER(ctypes.c_int64)),
                ("byte_offset", ctypes.c_uint64)]


class DLManagedTensorVersioned(ctypes.Structure):
    pass


class DLManagedTensor(ctypes.Structure):
    pass


VERSIONED_DELETER = ctypes.CFUNCTYPE(None, ctypes.POINTER(DLManagedTensorVersioned))
LEGACY_DELETER = ctypes.CFUNCTYPE(None, ctypes.POINTER(DLManagedTensor))
DLManagedTensorVersioned._fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32),
                                     ("manager_ctx", ctypes.c_void_p), ("deleter", VERSIONED_DELETER),
                                     ("flags", ctypes.c_uint64), ("dl_tensor", DLTensor)]
DLManagedTensor._fields_ = [("dl_tensor", DLTensor), ("manager_ctx", ctypes.c_void_p), ("deleter", LEGACY_DELETER)]

_capsule_new = ctypes.pythonapi.PyCapsule_New
_capsule_new.restype = ctypes.py_object
_capsule_new.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
_capsule_name = ctypes.pythonapi.PyCapsule_GetName
_capsule_name.restype = ctypes.c_char_p
_capsule_name.argtypes = [ctypes.py_object]
NAMES = {True: b"dltensor_versioned", False: b"dltensor"}  # alive as long as the module: capsules keep the pointer
# Every exported struct and deleter stays alive for the whole session: a real producer frees them in its
# deleter, but a ctypes callback cannot free itself while it runs.
_EXPORTED = []

FLOAT_CODES = {"float64": (2, 64), "float32": (2, 32), "float16": (2, 16), "bfloat16": (4, 16),
               "float8_e4m3fn": (10, 8), "float8_e5m2": (12, 8), "float6_e2m3fn": (15, 6),
               "float6_e3m2fn": (16, 6), "int8": (0, 8), "uint16": (1, 16)}


class Producer:
    """Exports `array`'s memory through a hand-built DLPack capsule and counts deleter calls.

    Overrides make it lie about one field at a time: device, major version, dtype, lanes, flags, strides."""

    def __init__(self, array, *, versioned=True, device=1, capsule_device=None, major=1, code=None, bits=None,
                 lanes=1, flags=0, strides="elements", byte_offset=0, shape=None, null_data=False):
        self.array = array
        self.versioned, self.device, self.major = versioned, device, major
        self.capsule_device = device if capsule_device is None else capsule_device
        name = array.dtype.name if array.dtype.name in FLOAT_CODES else str(array.dtype)
        default_code, default_bits = FLOAT_CODES.get(name, (2, array.dtype.itemsize * 8))
        self.code = default_code if code is None else code
        self.bits = default_bits if bits is None else bits
        self.lanes, self.flags, self.strides, self.byte_offset = lanes, flags, strides, byte_offset
        self.shape = array.shape if shape is None else shape
        self.null_data = null_data
        self.deleted = 0
        self.capsules = []

    def __dlpack_device__(self):
        return (self.device, 0)

    def __dlpack__(self, *, max_version=None, stream=None, dl_device=None, copy=None):
        self.max_version = max_version
        managed_type = DLManagedTensorVersioned if self.versioned else DLManagedTensor
        managed = managed_type()
        shape = (ctypes.c_int64 * len(self.shape))(*self.shape)
        tensor = managed.dl_tensor
        tensor.data = None if self.null_data else self.array.__array_interface__["data"][0] - self.byte_offset
        tensor.byte_offset = self.byte_offset
        tensor.device = DLDevice(self.capsule_device, 0)
        tensor.ndim = len(self.shape)
        tensor.dtype = DLDataType(self.code, self.bits, self.lanes)
        tensor.shape = shape
        strides = None
        if self.strides == "elements":
            strides = (ctypes.c_int64 * self.array.ndim)(*(s // self.array.itemsize for s in self.array.strides))
            tensor.strides = strides
        if self.versioned:
            managed.major, managed.minor, managed.flags = self.major, 1, self.flags

        def deleter(pointer):
            self.deleted += 1

        callback = (VERSIONED_DELETER if self.versioned else LEGACY_DELETER)(deleter)
        managed.deleter = callback
        _EXPORTED.append((managed, shape, strides, callback, self))
        capsule = _capsule_new(ctypes.addressof(managed), NAMES[self.versioned], None)
        self.capsules.append(capsule)
        return capsule


class NumPyExporter:
    """A non-ndarray object that forwards NumPy's own __dlpack__ (so NumPy's deleter runs)."""

    def __init__(self, array, legacy=False):
        self.array, self.legacy = array, legacy

    def __dlpack_device__(self):
        return self.array.__dlpack_device__()

    def __dlpack__(self, **kwargs):
        if self.legacy and kwargs:
            raise TypeError("__dlpack__() got an unexpected keyword argument")  # a pre-1.0 producer
        return self.array.__dlpack__(**kwargs)


def _address(array):
    return array.__array_interface__["data"][0]


# ---- views of NumPy-produced capsules ----

@pytest.mark.parametrize("legacy", [False, True], ids=["versioned", "legacy"])
def test_numpy_producer_is_viewed_without_copy_and_kept_alive(legacy):
    source = np.arange(24, dtype=np.float32).reshape(4, 6)
    alive = weakref.ref(source)
    view = _from_dlpack(NumPyExporter(source, legacy=legacy))
    assert _address(view) == _address(source)
    assert view.dtype == np.float32 and view.shape == (4, 6) and not view.flags.writeable
    del source
    gc.collect()
    assert alive() is not None, "the view must keep the producer's memory alive"
    assert view[3, 5] == 23.0
    del view
    gc.collect()
    assert alive() is None, "dropping the view must call the producer's deleter"


def test_numpy_producer_through_the_public_functions():
    q, d = random_matrix(7, 33, 1), random_matrix(40, 33, 2)
    expected = reference_maxsim(q, d, "float64")
    assert_score_close(nk.maxsim(NumPyExporter(q), NumPyExporter(d)), expected, RTOL["float64"], "maxsim")
    packed = nk.maxsim_pack(NumPyExporter(d))
    assert bytes(memoryview(packed)) == bytes(memoryview(nk.maxsim_pack(d)))
    corpus = nk.maxsim_pack_corpus([NumPyExporter(d), NumPyExporter(q)])
    scores = nk.maxsim_packed_corpus(nk.maxsim_pack(q), corpus)
    assert scores[0] == nk.maxsim_packed(nk.maxsim_pack(q), packed)
    tokens = nk.maxsim_pack_corpus(NumPyExporter(np.concatenate([d, q])), offsets=[0, 40, 47])
    assert bytes(memoryview(tokens)) == bytes(memoryview(corpus))


# ---- the capsule protocol ----

@pytest.mark.parametrize("versioned", [True, False], ids=["versioned", "legacy"])
def test_capsule_is_renamed_and_deleter_called_once(versioned):
    source = np.asarray(random_matrix(3, 5, 0))
    producer = Producer(source, versioned=versioned)
    view = _from_dlpack(producer)
    assert producer.max_version == (1, 1)
    assert _capsule_name(producer.capsules[0]) == b"used_" + NAMES[versioned]
    assert _address(view) == _address(source) and np.array_equal(view, source)
    assert producer.deleted == 0
    del view
    gc.collect()
    assert producer.deleted == 1


def test_used_capsule_is_refused():
    source = np.ones((2, 3))
    producer = Producer(source)
    _from_dlpack(producer)
    used = producer.capsules[0]

    class Replays:
        def __dlpack__(self, **kwargs):
            return used

    with pytest.raises(TypeError, match="unused DLPack capsule"):
        _from_dlpack(Replays())


@pytest.mark.parametrize("override, error, match", [
    ({"capsule_device": 2}, ValueError, r"cuda memory.*\.cpu\(\)"),
    ({"major": 2}, TypeError, "DLPack 2.1"),
    ({"lanes": 2}, TypeError, "2 lanes"),
    ({"code": 3, "bits": 64}, TypeError, "type code 3"),
    ({"code": 15, "bits": 6}, TypeError, "packed"),  # fp6 without the one-element-per-byte flag
    ({"null_data": True}, TypeError, "no data pointer"),
], ids=["device", "major-version", "lanes", "opaque-handle", "packed-fp6", "null-data"])
def test_refused_capsules_still_release_the_tensor(override, error, match):
    producer = Producer(np.ones((2, 3), dtype=np.float64 if "code" not in override else np.uint8), **override)
    with pytest.raises(error, match=match):
        _from_dlpack(producer, "queries")
    gc.collect()
    assert producer.deleted == 1


@pytest.mark.parametrize("device, name", [(2, "cuda"), (3, "cuda pinned host"), (10, "rocm"), (13, "cuda managed"),
                                          (99, "device type 99")])
def test_non_cpu_devices_are_refused_before_export(device, name):
    producer = Producer(np.ones((2, 3)), device=device)
    for call in (lambda: nk.maxsim(producer, np.ones((2, 3))), lambda: nk.maxsim_pack(producer),
                 lambda: nk.maxsim_pack_corpus([producer])):
        with pytest.raises(ValueError, match=rf"{name}.*move it to the CPU"):
            call()
    assert producer.capsules == [], "nothing is exported from a device numkong cannot read"


def test_device_query_failure_is_a_device_error():
    class Meta:
        device = "meta"

        def __dlpack_device__(self):
            raise ValueError("Unknown device type meta for Dlpack")

        def __dlpack__(self, **kwargs):
            raise AssertionError("not reached")

    with pytest.raises(ValueError, match=r"documents is in meta memory.*tensor\.cpu\(\)"):
        nk.maxsim(np.ones((2, 3)), Meta())


def test_buffer_error_from_the_producer_says_what_to_pass():
    class Refuses:
        def __dlpack_device__(self):
            return (1, 0)

        def __dlpack__(self, **kwargs):
            raise BufferError("cannot export this dtype")

    with pytest.raises(TypeError, match="cannot export this dtype.*CPU tensor or NumPy array"):
        nk.maxsim_pack(Refuses())


# ---- layout: strides, offsets, dtypes ----

def test_null_strides_mean_c_contiguous_and_byte_offset_is_applied():
    source = np.asarray(random_matrix(6, 10, 3)).copy()
    producer = Producer(source[2:], strides=None, byte_offset=64)
    view = _from_dlpack(producer)
    assert _address(view) == _address(source[2:])
    assert view.strides == (80, 8) and np.array_equal(view, source[2:])


def test_element_strides_become_byte_strides():
    source = np.asarray(random_matrix(8, 12, 4)).astype(np.float32)
    rows = source[::3]  # row stride 3 rows, depth contiguous
    view = _from_dlpack(Producer(rows))
    assert view.strides == rows.strides and np.array_equal(view, rows)
    assert nk.maxsim(Producer(rows), Producer(source)) == nk.maxsim(rows, source)
    with pytest.raises(ValueError, match="not contiguous along depth"):
        nk.maxsim_pack(Producer(source[:, ::2]))


@pytest.mark.parametrize("name", ["float64", "float32", "float16", "bfloat16", "float8_e4m3fn", "float8_e5m2",
                                  "int8", "uint16"])
def test_dtype_codes(name):
    dtype = np.dtype(getattr(ml_dtypes, name, None) or name)
    source = (np.arange(12).reshape(3, 4) % 7).astype(dtype)
    view = _from_dlpack(Producer(source))
    assert view.dtype == dtype and _address(view) == _address(source)
    assert view.tobytes() == source.tobytes()


@pytest.mark.parametrize("name, packing", [("float6_e2m3fn", "e2m3"), ("float6_e3m2fn", "e3m2")])
def test_padded_fp6_is_read_one_element_per_byte(name, packing):
    source = np.asarray(random_matrix(5, 9, 5)).astype(getattr(ml_dtypes, name))
    view = _from_dlpack(Producer(source, flags=1 << 2))
    assert view.dtype == source.dtype and _address(view) == _address(source)
    assert nk.maxsim_pack(Producer(source, flags=1 << 2)).dtype == packing


def test_empty_tensor_releases_at_once():
    producer = Producer(np.ones((0, 4)))
    view = _from_dlpack(producer)
    assert view.shape == (0, 4)
    gc.collect()
    assert producer.deleted == 1
