"""Cython core of numkong: the packed matrix type, packing, scoring, capabilities."""
import enum
import functools
import os
import pickle

import ml_dtypes
import numpy as np

from cpython.buffer cimport PyBUF_FORMAT, PyBUF_SIMPLE, PyBUF_WRITABLE, PyBuffer_Release, PyObject_GetBuffer
from libc.stdint cimport int64_t, uint32_t, uint64_t, uintptr_t
from libc.stdlib cimport free, malloc
from libc.string cimport memcmp, memcpy

cdef extern from "numkong/maxsim.h":
    uint32_t NK_MAXSIM_FORMAT_VERSION


cdef extern from *:
    """
    #include <stdlib.h>
    #include <sys/mman.h>
    /* 64-byte aligned memory for packed buffers; large ones are 2 MiB aligned and offered huge
     * pages, because scoring a corpus touches scattered rows and TLB misses would dominate. */
    static void *nk_packed_alloc(size_t nbytes) {
        void *data = NULL;
        size_t huge = (size_t)2 << 20;
        if (posix_memalign(&data, nbytes >= huge ? huge : 64, nbytes ? nbytes : 1) != 0) return NULL;
    #ifdef MADV_HUGEPAGE
        if (nbytes >= huge) madvise(data, (nbytes + huge - 1) / huge * huge, MADV_HUGEPAGE);
    #endif
        return data;
    }
    """
    void *nk_packed_alloc(size_t nbytes) nogil


class Capability(enum.IntFlag):
    """Kernel families, one bit each (the bits stored in packed buffers)."""
    SERIAL = 1 << 0
    HASWELL = 1 << 1
    SKYLAKE = 1 << 2
    ICELAKE = 1 << 3
    SAPPHIRE = 1 << 4
    SAPPHIREAMX = 1 << 5
    NEON = 1 << 6
    SVE = 1 << 7
    SVE2 = 1 << 8


cdef uint64_t _known_capabilities = (1 << 9) - 1


def _capability_names(uint64_t mask):
    return [c.name.lower() for c in Capability if mask & c.value]


def get_capabilities(kind="available"):
    """Kernel families as a Capability mask.

    kind: "available" (compiled, supported by this CPU, not disabled: what calls may use),
    "compiled" (built into this package) or "cpu" (supported by this CPU and OS).
    """
    if kind == "available":
        return Capability(nk_capabilities_available())
    if kind == "compiled":
        return Capability(nk_capabilities_compiled())
    if kind == "cpu":
        return Capability(nk_capabilities_cpu() & _known_capabilities)
    raise ValueError(f"kind must be 'available', 'compiled' or 'cpu', not {kind!r}")


def _disable_capabilities(spec):
    """Apply a NUMKONG_DISABLE-style comma-separated list of family names; strict."""
    cdef uint64_t mask = 0
    for raw in spec.split(","):
        name = raw.strip().lower()
        if not name:
            continue
        if name == "serial":
            raise ValueError("NUMKONG_DISABLE cannot remove 'serial', the portable fallback")
        try:
            mask |= Capability[name.upper()].value
        except KeyError:
            valid = ", ".join(c.name.lower() for c in Capability if c is not Capability.SERIAL)
            raise ValueError(f"NUMKONG_DISABLE names unknown kernel family {name!r}; valid names: {valid}") from None
    nk_capabilities_disable(mask)


cdef uint64_t _resolve_capabilities(object capabilities, uint64_t default) except? 0:
    if capabilities is None:
        return default
    if isinstance(capabilities, bool) or not isinstance(capabilities, int):
        raise TypeError(f"capabilities must be a Capability, an int mask or None, not {type(capabilities).__name__}")
    value = int(capabilities)
    if value <= 0 or value & ~_known_capabilities:
        raise ValueError(f"capabilities={value:#x} is not a mask of Capability bits (1 .. {_known_capabilities:#x})")
    cdef uint64_t mask = value
    cdef uint64_t missing = mask & ~nk_capabilities_available()
    if missing:
        raise ValueError(
            f"capabilities include {', '.join(_capability_names(missing))}, not available on this CPU and build "
            f"(available: {', '.join(_capability_names(nk_capabilities_available()))})")
    return mask


cdef inline int _check_stream(object stream) except -1:
    if stream is not None:
        raise ValueError("stream must be None: this numkong build has CPU kernels only")
    return 0


# ---- dtypes ----

_DTYPE_CODES = {
    "float64": 1, "float32": 2, "float16": 3, "bfloat16": 4,
    "e4m3": 5, "e5m2": 6, "e2m3": 7, "e3m2": 8,
}
_DTYPE_NAMES = {code: name for name, code in _DTYPE_CODES.items()}
_DTYPE_ALIASES = {
    "f64": "float64", "f32": "float32", "f16": "float16", "bf16": "bfloat16",
    "float8_e4m3": "e4m3", "float8_e5m2": "e5m2", "float6_e2m3": "e2m3", "float6_e3m2": "e3m2",
}
# NumPy dtype of each packing dtype's storage.
_NUMPY_DTYPES = {
    "float64": np.dtype(np.float64), "float32": np.dtype(np.float32), "float16": np.dtype(np.float16),
    "bfloat16": np.dtype(ml_dtypes.bfloat16), "e4m3": np.dtype(ml_dtypes.float8_e4m3fn),
    "e5m2": np.dtype(ml_dtypes.float8_e5m2), "e2m3": np.dtype(ml_dtypes.float6_e2m3fn),
    "e3m2": np.dtype(ml_dtypes.float6_e3m2fn),
}
_NAME_BY_NUMPY = {dt: name for name, dt in _NUMPY_DTYPES.items()}
# Narrowest first: the order in which a dtype is chosen to hold an input format exactly.
_BY_WIDTH = ["e2m3", "e3m2", "e4m3", "e5m2", "float16", "bfloat16", "float32", "float64"]


def _format_range(dt):
    """(mantissa bits, exponent bound of max finite, exponent of smallest subnormal) of a float dtype."""
    info = ml_dtypes.finfo(dt)  # also knows NumPy's own float types
    return int(info.nmant), int(info.maxexp), int(info.minexp) - int(info.nmant)


def _holds(target, source):
    t, s = _format_range(_NUMPY_DTYPES[target]), _format_range(source)
    return t[0] >= s[0] and t[1] >= s[1] and t[2] <= s[2]


def _is_float_dtype(dt):
    if dt.kind == "f":
        return True
    if dt.kind == "V":
        try:
            ml_dtypes.finfo(dt)
            return True
        except Exception:
            return False
    return False


@functools.lru_cache(maxsize=None)
def _narrowest_holding(*dts):
    """Packing dtype name that represents every value of every given float dtype exactly."""
    for name in _BY_WIDTH:
        if all(_holds(name, dt) for dt in dts):
            return name
    return "float64"


def _dtype_name(dtype):
    """Canonical packing dtype name for a user's `dtype=` argument."""
    if isinstance(dtype, str):
        key = dtype.lower()
        key = _DTYPE_ALIASES.get(key, key)
        if key in _DTYPE_CODES:
            return key
        raise ValueError(f"unknown dtype {dtype!r}; use one of {', '.join(_DTYPE_CODES)} "
                         f"(aliases {', '.join(_DTYPE_ALIASES)})")
    try:
        dt = np.dtype(dtype)
    except TypeError:
        raise TypeError(f"dtype must be a name like 'float32' or a scalar type like numkong.bfloat16, "
                        f"not {dtype!r}") from None
    if dt.newbyteorder("=") in _NAME_BY_NUMPY:
        return _NAME_BY_NUMPY[dt.newbyteorder("=")]
    raise ValueError(f"unknown dtype {dtype!r}: numkong packs {', '.join(_DTYPE_CODES)}")


def _as_matrix(obj, role):
    """A 2-D NumPy view of a user's matrix, rows contiguous along depth."""
    if not isinstance(obj, np.ndarray) and hasattr(obj, "__dlpack__"):
        obj = _from_dlpack(obj, role)  # torch, JAX, ...: zero-copy, bfloat16 and float8 too
    if isinstance(obj, MaxSimPackedMatrix):
        raise TypeError(f"{role} is already packed; use maxsim_packed() for packed operands")
    if not isinstance(obj, np.ndarray):
        if not (hasattr(obj, "__array_interface__") or hasattr(obj, "__array__") or _has_buffer(obj)):
            raise TypeError(f"{role} must support the buffer protocol or __array__ (a NumPy array, for example), "
                            f"not {type(obj).__name__}")
        obj = np.asarray(obj)
    if obj.ndim != 2:
        raise ValueError(f"{role} must be a 2-D matrix of shape [vectors, depth], got {obj.ndim}-D with shape "
                         f"{obj.shape}; reshape a single vector with x[None, :]")
    if obj.shape[1] == 0:
        raise ValueError(f"{role} has depth 0; each vector needs at least one dimension")
    if obj.shape[0] and obj.shape[1] > 1 and obj.strides[1] != obj.itemsize:
        raise ValueError(f"{role} rows are not contiguous along depth (strides {obj.strides}); packing fuses no "
                         f"transposition, so pass np.ascontiguousarray({role}) of shape [vectors, depth]")
    return obj


cdef bint _has_buffer(object obj):
    try:
        memoryview(obj)
        return True
    except TypeError:
        return False


def _infer_dtype_name(arr, role):
    if _is_float_dtype(arr.dtype):
        return _narrowest_holding(arr.dtype)
    if arr.dtype.kind in "iub":
        raise TypeError(f"{role} has integer dtype {arr.dtype}; pass dtype= (e.g. dtype='float32') to pack integers")
    raise TypeError(f"{role} has dtype {arr.dtype}, which is not a real floating-point or integer type")


# ---- packed matrix ----

cdef class MaxSimPackedMatrix:
    """Opaque pre-packed matrix for MaxSim late-interaction scoring.

    Built by maxsim_pack(). Holds the stored values (in the packing dtype), per-row inverse norms and
    a certified int8 screening copy in one 64-byte aligned, portable buffer. Exposes the buffer
    read-only (memoryview(packed)) and pickles with protocol 5 as one out-of-band buffer.
    """

    def __cinit__(self):
        self.data = NULL

    def __init__(self, *args, **kwargs):
        raise TypeError("MaxSimPackedMatrix cannot be created directly; use numkong.maxsim_pack(matrix)")

    def __dealloc__(self):
        free(self.data)

    @classmethod
    def pack_size(cls, vectors, depth, /, dtype):
        """Packed buffer size in bytes for `vectors` rows of `depth` elements of `dtype`."""
        cdef uint64_t nbytes = 0
        code = _DTYPE_CODES[_dtype_name(dtype)]
        _check_count(vectors, "vectors")
        _check_count(depth, "depth")
        if depth == 0:
            raise ValueError("depth must be at least 1")
        status = nk_maxsim_pack_size(vectors, depth, code, &nbytes)
        if status == nk_error_overflow_k:
            raise ValueError(f"{vectors} x {depth} {_DTYPE_NAMES[code]} does not fit a packed buffer (byte size "
                             f"overflows 64 bits)")
        return nbytes

    @property
    def dtype(self):
        """Data type of the packed vectors (canonical name, e.g. 'float32', 'bfloat16', 'e4m3')."""
        _require_packed(self.data, self)
        return _DTYPE_NAMES[self.dtype_code]

    @property
    def shape(self):
        """(vectors, depth), read from the packed buffer header."""
        cdef nk_maxsim_info_t info
        if self.data == NULL or nk_maxsim_info(self.data, &info) != nk_ok_k:
            return (0, 0)
        return (info.vectors, info.depth)

    @property
    def capabilities(self):
        """The Capability mask that packed this matrix."""
        return Capability(self.packed_capabilities & _known_capabilities)

    def __repr__(self):
        if self.data == NULL:
            return "MaxSimPackedMatrix(<empty: not built by maxsim_pack>)"
        return (f"MaxSimPackedMatrix(vectors={self.vectors}, depth={self.depth}, dtype={self.dtype!r}, "
                f"nbytes={self.nbytes})")

    def __getbuffer__(self, Py_buffer *buffer, int flags):
        _export_bytes(self, buffer, flags, self.data, self.nbytes, self._buffer_shape, self._buffer_strides)

    def __releasebuffer__(self, Py_buffer *buffer):
        pass

    def __reduce_ex__(self, protocol):
        if protocol >= 5:
            return (_load_packed, (pickle.PickleBuffer(self),))
        return (_load_packed, (bytes(memoryview(self)),))


cdef int _require_packed(void *data, object owner) except -1:
    """Objects made with __new__ (bypassing maxsim_pack) hold no buffer: refuse to use them."""
    if data == NULL:
        raise ValueError(f"this {type(owner).__name__} is empty (made without maxsim_pack); pack a matrix first")
    return 0


cdef int _export_bytes(object owner, Py_buffer *buffer, int flags, void *data, uint64_t nbytes,
                       Py_ssize_t *shape, Py_ssize_t *strides) except -1:
    """Expose `nbytes` at `data` as a read-only 1-D unsigned-byte buffer owned by `owner`."""
    if flags & PyBUF_WRITABLE:
        raise BufferError(f"a {type(owner).__name__} buffer is read-only")
    shape[0] = <Py_ssize_t>nbytes
    strides[0] = 1
    buffer.buf = data
    buffer.obj = owner
    buffer.len = <Py_ssize_t>nbytes
    buffer.readonly = 1
    buffer.itemsize = 1
    buffer.format = NULL
    if flags & PyBUF_FORMAT:
        buffer.format = b"B"
    buffer.ndim = 1
    buffer.shape = shape
    buffer.strides = strides
    buffer.suboffsets = NULL
    buffer.internal = NULL
    return 0


cdef int _check_count(object value, str name) except -1:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an int, not {type(value).__name__}")
    if value < 0:
        raise ValueError(f"{name} must be non-negative, got {value}")
    if value >= 2 ** 64:
        raise ValueError(f"{name}={value} does not fit in 64 bits")
    return 0


cdef void *_packed_alloc(uint64_t nbytes, str what) except NULL:
    """An aligned allocation for packed bytes (freed with free()); MemoryError when it fails."""
    cdef void *data = NULL
    if nbytes <= <uint64_t>(<size_t>-1):
        data = nk_packed_alloc(<size_t>nbytes)
    if data == NULL:
        raise MemoryError(f"cannot allocate {nbytes} bytes for a packed {what}")
    return data


cdef MaxSimPackedMatrix _allocate(uint64_t nbytes):
    cdef MaxSimPackedMatrix packed = MaxSimPackedMatrix.__new__(MaxSimPackedMatrix)
    packed.data = _packed_alloc(nbytes, "matrix")
    packed.nbytes = nbytes
    return packed


cdef void _adopt_header(MaxSimPackedMatrix packed):
    cdef nk_maxsim_info_t info
    nk_maxsim_info(packed.data, &info)
    packed.vectors = info.vectors
    packed.depth = info.depth
    packed.dtype_code = info.dtype
    packed.packed_capabilities = info.capabilities


def _load_packed(data):
    """Rebuild a packed matrix from its bytes (the pickle path); validates everything."""
    cdef Py_buffer view
    cdef nk_maxsim_info_t info
    cdef nk_status_t status
    try:
        PyObject_GetBuffer(data, &view, PyBUF_SIMPLE)
    except TypeError:
        raise TypeError(f"a packed matrix loads from a bytes-like object, not {type(data).__name__}") from None
    try:
        if view.len < 128:
            raise ValueError(f"corrupt packed matrix: {view.len} bytes is shorter than the 128-byte header")
        packed = _allocate(<uint64_t>view.len)
        memcpy(packed.data, view.buf, <size_t>view.len)
    finally:
        PyBuffer_Release(&view)
    with nogil:
        status = nk_maxsim_load(packed.data, packed.nbytes, &info)
    cdef uint32_t version
    if status != nk_ok_k:
        memcpy(&version, <char *>packed.data + 8, 4)
        if memcmp(packed.data, b"NKMAXSIM", 8) == 0 and version != NK_MAXSIM_FORMAT_VERSION:
            raise ValueError(f"corrupt packed matrix: it is in format version {version}, this numkong reads version "
                             f"{NK_MAXSIM_FORMAT_VERSION}; pack the source arrays again")
        raise ValueError("corrupt packed matrix: header, sizes or stored values are invalid or truncated")
    _adopt_header(packed)
    return packed


def maxsim_pack(b, /, dtype=None, *, capabilities=None, stream=None):
    """Pack a matrix for MaxSim late-interaction scoring with maxsim_packed().

    b: matrix of shape [vectors, depth], rows contiguous along depth (any row stride); any real float
       dtype of NumPy or ml_dtypes, or integers when `dtype` is given.
    dtype: packing dtype ('float64', 'float32', 'float16', 'bfloat16', 'e4m3', 'e5m2', 'e2m3', 'e3m2',
       aliases, or the scalar types); None keeps the input's float format. A cast rounds to nearest even,
       after scaling each row by a power of two so that narrow formats neither overflow nor flush.
    capabilities: Capability mask recorded in the packed matrix (default: every available family).
    stream: must be None (CPU build).
    Raises ValueError naming the row for NaN or infinity.
    """
    _check_stream(stream)
    cdef uint64_t mask = _resolve_capabilities(capabilities, nk_capabilities_available())
    arr = _as_matrix(b, "b")
    name = _infer_dtype_name(arr, "b") if dtype is None else _dtype_name(dtype)
    if dtype is not None and not (_is_float_dtype(arr.dtype) or arr.dtype.kind in "iub"):
        raise TypeError(f"b has dtype {arr.dtype}, which is not a real floating-point or integer type")
    return _pack(arr, name, mask)


cdef int _pack_into(object arr, str name, uint64_t mask, void *out, uint64_t capacity) except -1:
    """Pack a checked 2-D array into `capacity` bytes at `out` (64-byte aligned)."""
    cdef int code = _DTYPE_CODES[name]
    cdef int source_code = code
    if arr.dtype != _NUMPY_DTYPES[name] or not arr.flags.aligned:
        # Any other format goes through float64, which holds every supported input exactly
        # (integers beyond 2**53 round once); the C packer then rounds to nearest even.
        arr = arr.astype(np.float64)
        source_code = 1
    cdef uint64_t vectors = arr.shape[0], depth = arr.shape[1], bad_row = 0
    cdef uintptr_t source = arr.__array_interface__["data"][0]
    cdef int64_t row_stride = arr.strides[0]
    cdef nk_status_t status
    with nogil:
        status = nk_maxsim_pack(<const void *>source, source_code, row_stride, vectors, depth, code, mask,
                                out, capacity, &bad_row)
    if status == nk_error_nonfinite_k:
        raise ValueError(f"row {bad_row} contains NaN or infinity; MaxSim needs finite values")
    if status != nk_ok_k:
        raise RuntimeError(f"packing failed with status {status}")
    return 0


cdef MaxSimPackedMatrix _pack(object arr, str name, uint64_t mask):
    cdef uint64_t nbytes = 0
    cdef int code = _DTYPE_CODES[name]
    if nk_maxsim_pack_size(arr.shape[0], arr.shape[1], code, &nbytes) != nk_ok_k:
        raise ValueError(f"{arr.shape[0]} x {arr.shape[1]} {name} does not fit a packed buffer "
                         f"(byte size overflows 64 bits)")
    cdef MaxSimPackedMatrix packed = _allocate(nbytes)
    _pack_into(arr, name, mask, packed.data, nbytes)
    _adopt_header(packed)
    return packed


cdef nk_status_t maxsim_packed_nogil(MaxSimPackedMatrix queries, MaxSimPackedMatrix documents,
                                     uint64_t capabilities, double *result) noexcept nogil:
    return nk_maxsim_score(queries.data, documents.data, capabilities, result)


cdef double _score(MaxSimPackedMatrix queries, MaxSimPackedMatrix documents, uint64_t mask) except? -1:
    cdef double result = 0.0
    cdef nk_status_t status
    _require_packed(queries.data, queries)
    _require_packed(documents.data, documents)
    if queries.dtype_code != documents.dtype_code:
        raise TypeError(f"queries were packed as {queries.dtype} but documents as {documents.dtype}; "
                        f"pack both with the same dtype")
    if queries.depth != documents.depth:
        raise ValueError(f"queries have depth {queries.depth} but documents have depth {documents.depth}")
    if queries.vectors and not documents.vectors:
        raise ValueError("documents have no rows: the MaxSim of a non-empty query needs at least one document row")
    with nogil:
        status = nk_maxsim_score(queries.data, documents.data, mask, &result)
    if status != nk_ok_k:
        raise RuntimeError(f"scoring failed with status {status}")
    return result


def maxsim_packed(MaxSimPackedMatrix queries not None, MaxSimPackedMatrix documents not None, /, *,
                  capabilities=None, stream=None):
    """MaxSim late-interaction score of two packed matrices, as a Python float.

    Returns sum over query rows of min over document rows of max(0, 1 - cos): the sum of per-query minimum
    angular distances (query_count - maxsim is the ColBERT similarity sum of max cos while no cosine is
    negative). capabilities defaults to the intersection of the masks that packed both operands.
    """
    _check_stream(stream)
    cdef uint64_t available = nk_capabilities_available()
    cdef uint64_t default = (queries.packed_capabilities & documents.packed_capabilities & available) | 1
    return _score(queries, documents, _resolve_capabilities(capabilities, default))


def maxsim(queries, documents, /, dtype=None, *, capabilities=None, stream=None):
    """Pack both matrices and compute their MaxSim late-interaction score in one call.

    queries: [query_count, depth]; documents: [document_count, depth]. dtype=None packs in the input float
    format, or in the narrowest format holding both when they differ. Returns a Python float:
    sum over queries of min over documents of max(0, 1 - cos).
    """
    _check_stream(stream)
    cdef uint64_t mask = _resolve_capabilities(capabilities, nk_capabilities_available())
    q = _as_matrix(queries, "queries")
    d = _as_matrix(documents, "documents")
    if q.shape[1] != d.shape[1]:
        raise ValueError(f"queries have depth {q.shape[1]} but documents have depth {d.shape[1]}")
    if dtype is None:
        _infer_dtype_name(q, "queries")
        _infer_dtype_name(d, "documents")
        name = _narrowest_holding(q.dtype, d.dtype)
    else:
        name = _dtype_name(dtype)
        for arr, role in ((q, "queries"), (d, "documents")):
            if not (_is_float_dtype(arr.dtype) or arr.dtype.kind in "iub"):
                raise TypeError(f"{role} has dtype {arr.dtype}, which is not a real floating-point or integer type")
    try:
        packed_queries = _pack(q, name, mask)
    except ValueError as error:
        raise ValueError(f"queries: {error}") from None
    try:
        packed_documents = _pack(d, name, mask)
    except ValueError as error:
        raise ValueError(f"documents: {error}") from None
    return _score(packed_queries, packed_documents, mask)


include "_corpus.pxi"
include "_dlpack.pxi"
