"""Cython core of numkong: the packed matrix type, packing, scoring, capabilities."""
import difflib
import enum
import functools
import operator
import os
import pickle

import ml_dtypes
import numpy as np

from cpython.buffer cimport PyBUF_FORMAT, PyBUF_SIMPLE, PyBUF_STRIDES, PyBUF_WRITABLE, PyBuffer_Release, PyObject_GetBuffer
from libc.stdint cimport int64_t, uint32_t, uint64_t, uintptr_t
from libc.stdlib cimport free, malloc
from libc.string cimport memcpy


cdef extern from *:
    """
    #include <stdlib.h>
    #ifdef _WIN32
    #include <io.h>
    #include <windows.h>
    #else
    #include <sys/mman.h>
    #endif
    /* 64-byte aligned memory for packed buffers (freed with nk_packed_free); large ones are 2 MiB
     * aligned and offered huge pages, because scoring a corpus touches scattered rows and TLB misses
     * would dominate. */
    static void *nk_packed_alloc(size_t nbytes) {
    #ifdef _WIN32
        return _aligned_malloc(nbytes ? nbytes : 1, 64);
    #else
        void *data = NULL;
        size_t huge = (size_t)2 << 20;
        if (posix_memalign(&data, nbytes >= huge ? huge : 64, nbytes ? nbytes : 1) != 0) return NULL;
    #ifdef MADV_HUGEPAGE
        if (nbytes >= huge) madvise(data, (nbytes + huge - 1) / huge * huge, MADV_HUGEPAGE);
    #endif
        return data;
    #endif
    }
    static void nk_packed_free(void *data) {
    #ifdef _WIN32
        _aligned_free(data);
    #else
        free(data);
    #endif
    }
    /* A read-only shared mapping of the first nbytes of an open file; the descriptor may be closed
     * afterwards (the mapping keeps the file's contents, even once the path is replaced). NULL on
     * failure. Page-aligned, so 64-byte aligned. */
    static void *nk_map_file(int fd, size_t nbytes) {
    #ifdef _WIN32
        HANDLE file = (HANDLE)_get_osfhandle(fd);
        HANDLE mapping = CreateFileMappingW(file, NULL, PAGE_READONLY, 0, 0, NULL);
        if (!mapping) return NULL;
        void *view = MapViewOfFile(mapping, FILE_MAP_READ, 0, 0, nbytes);
        CloseHandle(mapping); /* the view keeps the mapping object alive */
        return view;
    #else
        void *view = mmap(NULL, nbytes, PROT_READ, MAP_SHARED, fd, 0);
        return view == MAP_FAILED ? NULL : view;
    #endif
    }
    static void nk_unmap_file(void *view, size_t nbytes) {
    #ifdef _WIN32
        (void)nbytes;
        UnmapViewOfFile(view);
    #else
        munmap(view, nbytes);
    #endif
    }
    /* Memory that grows in place: address space reserved up front (no memory behind it), committed
     * as it fills, so a corpus of unknown final size is built without copying (and without holding
     * twice its size). Page-aligned. */
    typedef struct nk_region { char *base; size_t reserved, committed; } nk_region_t;
    static int nk_region_reserve(nk_region_t *region, size_t bytes) {
        region->committed = 0;
        if (!bytes) bytes = 1;
    #ifdef _WIN32
        region->base = (char *)VirtualAlloc(NULL, bytes, MEM_RESERVE, PAGE_NOACCESS);
    #else
        void *base = mmap(NULL, bytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        region->base = base == MAP_FAILED ? NULL : (char *)base;
    #ifdef MADV_HUGEPAGE
        if (region->base && bytes >= ((size_t)2 << 20)) madvise(region->base, bytes, MADV_HUGEPAGE);
    #endif
    #endif
        region->reserved = region->base ? bytes : 0;
        return region->base != NULL;
    }
    /* Make the first `bytes` usable (growing in steps of at least 1/8 of what is there). */
    static int nk_region_commit(nk_region_t *region, size_t bytes) {
        if (bytes <= region->committed) return 1;
        if (bytes > region->reserved) return 0;
        size_t step = region->committed / 8 > ((size_t)1 << 20) ? region->committed / 8 : ((size_t)1 << 20);
        size_t target = bytes + step < region->reserved && bytes + step > bytes ? bytes + step : region->reserved;
    #ifdef _WIN32
        if (!VirtualAlloc(region->base, target, MEM_COMMIT, PAGE_READWRITE)) return 0;
    #else
        if (mprotect(region->base, target, PROT_READ | PROT_WRITE) != 0) return 0;
    #endif
        region->committed = target;
        return 1;
    }
    static void nk_region_release(nk_region_t *region) {
        if (!region->base) return;
    #ifdef _WIN32
        VirtualFree(region->base, 0, MEM_RELEASE);
    #else
        munmap(region->base, region->reserved);
    #endif
        region->base = NULL, region->reserved = region->committed = 0;
    }
    """
    void *nk_packed_alloc(size_t nbytes) nogil
    void nk_packed_free(void *data) nogil
    void *nk_map_file(int fd, size_t nbytes) nogil
    void nk_unmap_file(void *view, size_t nbytes) nogil
    ctypedef struct nk_region_t:
        char *base
        size_t reserved
        size_t committed
    int nk_region_reserve(nk_region_t *region, size_t bytes) nogil
    int nk_region_commit(nk_region_t *region, size_t bytes) nogil
    void nk_region_release(nk_region_t *region) nogil


class Capability(enum.IntFlag):
    """Kernel families, one bit each (the bits stored in packed buffers; values from the C header)."""
    SERIAL = nk_cap_serial_k
    HASWELL = nk_cap_haswell_k
    SKYLAKE = nk_cap_skylake_k
    ICELAKE = nk_cap_icelake_k
    GENOA = nk_cap_genoa_k
    SAPPHIREAMX = nk_cap_sapphireamx_k
    NEON = nk_cap_neon_k
    SVE = nk_cap_sve_k

    def __str__(self):
        """Family names joined by '|' (e.g. 'serial|haswell|skylake'), the names NUMKONG_DISABLE takes."""
        return "|".join(_capability_names(self.value)) or "none"


cdef uint64_t _known_capabilities = nk_cap_families_k


def _capability_names(uint64_t mask):
    return [c.name.lower() for c in Capability if mask & c.value]


def get_capabilities(kind="available"):
    """Kernel families as a Capability mask.

    kind: "available" (compiled, supported by this CPU, not disabled: what calls may use),
    "compiled" (built into this package) or "cpu" (supported by this CPU and OS).
    """
    if kind == "available":
        return Capability(nk_capabilities_available() & _known_capabilities)
    if kind == "compiled":
        return Capability(nk_capabilities_compiled() & _known_capabilities)
    if kind == "cpu":
        return Capability(nk_capabilities_cpu() & _known_capabilities)
    raise ValueError(f"kind must be 'available', 'compiled' or 'cpu', not {kind!r}")


def _disable_capabilities(spec):
    """Apply a NUMKONG_DISABLE-style comma-separated list of family names; strict, ASCII names only
    (case-insensitive), so that Unicode case folding cannot turn another word into a family name."""
    cdef uint64_t mask = 0
    valid = ", ".join(c.name.lower() for c in Capability if c is not Capability.SERIAL)
    for raw in spec.split(","):
        name = raw.strip(" \t\r\n")
        if not name:
            continue
        if not name.isascii():
            raise ValueError(f"NUMKONG_DISABLE names {name!r}, which is not an ASCII family name; valid names: {valid}")
        name = name.lower()
        if name == "serial":
            raise ValueError("NUMKONG_DISABLE cannot remove 'serial', the portable fallback")
        family = Capability.__members__.get(name.upper())
        if family is None:
            raise ValueError(f"NUMKONG_DISABLE names unknown kernel family {name!r}; valid names: {valid}")
        mask |= family.value
    nk_capabilities_disable(mask)


cdef uint64_t _resolve_capabilities(object capabilities, uint64_t default) except? 0:
    """The mask a call runs within: `default` for None, else a checked mask of available families."""
    if capabilities is None:
        return default
    if isinstance(capabilities, bool):
        raise TypeError("capabilities must be a Capability, an int mask or None, not bool")
    try:
        value = operator.index(capabilities)
    except TypeError:
        raise TypeError(f"capabilities must be a Capability, an int mask or None, "
                        f"not {type(capabilities).__name__}") from None
    known = int(_known_capabilities)
    if value <= 0 or value & ~known:
        raise ValueError(f"capabilities={value:#x} is not a mask of Capability bits "
                         f"({', '.join(f'{c.name}={c.value:#x}' for c in Capability)})")
    cdef uint64_t mask = value
    cdef uint64_t missing = mask & ~nk_capabilities_available()
    if missing:
        raise ValueError(
            f"capabilities include {', '.join(_capability_names(missing))}, not available on this CPU and build "
            f"(available: {', '.join(_capability_names(nk_capabilities_available()))})")
    return mask


cdef inline uint64_t _stored_mask(uint64_t stored) noexcept:
    """The families a call on operands packed with the `stored` masks (ANDed) defaults to here:
    the available ones among them (all of them for unrestricted packs), serial at least."""
    return (stored & nk_capabilities_available()) | nk_cap_serial_k


def _default_capabilities(*operands):
    """The Capability mask scoring these packed operands runs within when capabilities=None."""
    cdef uint64_t stored = NK_CAPABILITIES_ANY
    for operand in operands:
        if isinstance(operand, MaxSimPackedCorpus):
            stored &= (<MaxSimPackedCorpus>operand).corpus.info.capabilities
        else:
            stored &= (<MaxSimPackedMatrix?>operand).matrix.info.capabilities
    return Capability(_stored_mask(stored) & _known_capabilities)


cdef inline int _check_stream(object stream) except -1:
    if stream is not None:
        raise ValueError("stream must be None: this numkong build has CPU kernels only")
    return 0


cdef int _count(object value, str name) except -1:
    """A non-negative integer argument (anything with __index__ but bool) that fits 64 bits."""
    if isinstance(value, bool):
        raise TypeError(f"{name} must be an int, not bool")
    try:
        value = operator.index(value)
    except TypeError:
        raise TypeError(f"{name} must be an int, not {type(value).__name__}") from None
    if value < 0:
        raise ValueError(f"{name} must be non-negative, got {value}")
    if value >= 2 ** 64:
        raise ValueError(f"{name}={value} does not fit in 64 bits")
    return 0


# ---- C statuses to Python exceptions: the one place where they are mapped ----

_STATUS_ERRORS = {
    nk_error_argument_k: (ValueError, "{what}: invalid argument"),
    nk_error_overflow_k: (ValueError, "{what} does not fit a packed buffer (its byte size overflows 64 bits)"),
    nk_error_nonfinite_k: (ValueError, "row {row} contains NaN or infinity; MaxSim needs finite values"),
    nk_error_corrupt_k: (ValueError, "corrupt packed {kind}: header, sizes or stored values are invalid or truncated"),
    nk_error_buffer_small_k: (ValueError, "{what}: the output buffer is smaller than the packed size"),
    nk_error_depth_mismatch_k: (ValueError, "{left} have depth {left_depth} but {right} {right_verb} depth "
                                            "{right_depth}"),
    nk_error_dtype_mismatch_k: (TypeError, "{left} were packed as {left_dtype} but {right} as {right_dtype}; "
                                           "pack both with the same dtype"),
    nk_error_empty_k: (ValueError, "{empty}"),
    nk_error_version_k: (ValueError, "corrupt packed {kind}: it is in format version {found}, this numkong reads "
                                     "version {expected}; pack the source arrays again"),
    nk_error_range_k: (ValueError, "row {row} holds -128, outside int8's symmetric range -127..127: clip it "
                                   "(np.clip(x, -127, 127)), or pass it as floats to be rescaled per row"),
}


cdef int _raise_for(nk_status_t status, dict context) except -1:
    """Raise the exception of a C status, its message filled from `context` (no-op for nk_ok_k)."""
    if status == nk_ok_k:
        return 0
    exception, template = _STATUS_ERRORS.get(status, (ValueError, "{what}: unexpected status " + str(<int>status)))
    try:
        message = template.format(**context)
    except KeyError:  # a status this call site does not expect: still a named, explained error
        message = f"{context.get('what', 'numkong')}: {template.split('{')[0].strip() or 'error'} (status {<int>status})"
    raise exception(message)


cdef dict _pair_context(MaxSimPackedMatrix left, MaxSimPackedMatrix right, str left_name, str right_name,
                        str right_verb):
    return {"what": "scoring", "left": left_name, "right": right_name, "right_verb": right_verb,
            "left_depth": left.matrix.info.depth, "right_depth": right.matrix.info.depth,
            "left_dtype": left.dtype, "right_dtype": right.dtype,
            "empty": f"{right_name} have no rows: the MaxSim of a non-empty query needs at least one document row"}


# ---- dtypes ----

_DTYPE_CODES = {  # the nk_dtype_t codes of the C header
    "float64": nk_dtype_float64_k, "float32": nk_dtype_float32_k, "float16": nk_dtype_float16_k,
    "bfloat16": nk_dtype_bfloat16_k, "e4m3": nk_dtype_e4m3_k, "e5m2": nk_dtype_e5m2_k, "e2m3": nk_dtype_e2m3_k,
    "e3m2": nk_dtype_e3m2_k, "int8": nk_dtype_int8_k, "int4": nk_dtype_int4_k, "uint1": nk_dtype_uint1_k,
}
# Integer formats: values stored tiled with a per-row scale (int8, int4) or as bits (uint1).
_INTEGER_NAMES = ("int8", "int4", "uint1")
# Integer spellings of the API that are not packing formats, and what to use instead.
_INTEGER_REFUSED = ("uint4", "int64", "int32", "int16", "uint64", "uint32", "uint16", "uint8")
_DTYPE_NAMES = {code: name for name, code in _DTYPE_CODES.items()}
# Every NumPy, ml_dtypes and torch spelling of a packing format (torch dtypes by their str() without
# "torch."). "float" is refused: NumPy reads it as float64, torch as float32.
_DTYPE_ALIASES = {
    "f64": "float64", "fp64": "float64", "double": "float64",
    "f32": "float32", "fp32": "float32", "single": "float32",
    "f16": "float16", "fp16": "float16", "half": "float16",
    "bf16": "bfloat16",
    "float8_e4m3": "e4m3", "float8_e4m3fn": "e4m3", "fp8_e4m3": "e4m3", "f8e4m3": "e4m3", "f8e4m3fn": "e4m3",
    "float8_e5m2": "e5m2", "fp8_e5m2": "e5m2", "f8e5m2": "e5m2",
    "float6_e2m3": "e2m3", "float6_e2m3fn": "e2m3", "fp6_e2m3": "e2m3", "f6e2m3": "e2m3", "f6e2m3fn": "e2m3",
    "float6_e3m2": "e3m2", "float6_e3m2fn": "e3m2", "fp6_e3m2": "e3m2", "f6e3m2": "e3m2", "f6e3m2fn": "e3m2",
}
# NumPy dtype of each packing dtype's storage.
_NUMPY_DTYPES = {
    "float64": np.dtype(np.float64), "float32": np.dtype(np.float32), "float16": np.dtype(np.float16),
    "bfloat16": np.dtype(ml_dtypes.bfloat16), "e4m3": np.dtype(ml_dtypes.float8_e4m3fn),
    "e5m2": np.dtype(ml_dtypes.float8_e5m2), "e2m3": np.dtype(ml_dtypes.float6_e2m3fn),
    "e3m2": np.dtype(ml_dtypes.float6_e3m2fn), "int8": np.dtype(np.int8),
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
    """Canonical packing dtype name for a user's `dtype=` argument (a name, a NumPy / ml_dtypes scalar
    type or dtype, or a torch dtype)."""
    if type(dtype).__module__ == "torch":  # torch.bfloat16 etc., without importing torch
        dtype = str(dtype).rpartition(".")[2]
    if isinstance(dtype, str):
        key = dtype.strip().lower()
        key = _DTYPE_ALIASES.get(key, key)
        if key in _DTYPE_CODES:
            return key
        if key == "float":
            raise ValueError("dtype 'float' is ambiguous (NumPy reads it as float64, torch as float32); "
                             "say 'float32' or 'float64'")
        if key in _INTEGER_REFUSED:
            raise ValueError(f"dtype {dtype!r} is not a packing format: numkong packs integers as 'int8' (symmetric, "
                             f"-127..127 with a scale per row), 'int4' (-7..7) or 'uint1' (one sign bit); any "
                             f"integer or float input packs into them")
        spellings = list(_DTYPE_CODES) + list(_DTYPE_ALIASES)
        close = difflib.get_close_matches(key, spellings, n=1, cutoff=0.6)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise ValueError(f"unknown dtype {dtype!r}{hint} numkong packs {', '.join(_DTYPE_CODES)} "
                         f"(also spelled {', '.join(_DTYPE_ALIASES)})")
    try:
        dt = np.dtype(dtype)
    except TypeError:
        raise TypeError(f"dtype must be a name like 'float32' or a scalar type like numkong.bfloat16, "
                        f"not {dtype!r}") from None
    if dt.newbyteorder("=") in _NAME_BY_NUMPY:
        return _NAME_BY_NUMPY[dt.newbyteorder("=")]
    if dt.kind in "iu" and dt.name in _INTEGER_REFUSED:
        return _dtype_name(dt.name)  # the message for integer names
    raise ValueError(f"unknown dtype {dtype!r}: numkong packs {', '.join(_DTYPE_CODES)}")


def _check_depth(name, depth):
    """The integer formats' depth limit, as an error that says what to do."""
    if name in ("int8", "int4") and depth > NK_INTEGER_MAX_DEPTH:
        raise ValueError(f"{name} packs depth up to {NK_INTEGER_MAX_DEPTH:,} (its exact sum of squares per row is a "
                         f"uint32); depth {depth:,} needs dtype='uint1' or a float format")


# Sources the C packer casts to a float format in place: each decodes exactly to float64.
_WIDE_SOURCES = {np.dtype(np.float64): "float64", np.dtype(np.float32): "float32", np.dtype(np.float16): "float16",
                 np.dtype(ml_dtypes.bfloat16): "bfloat16"}


def _packing_source(arr, name):
    """(rows the C packer reads, their nk_dtype_t code): rows already in the packing format (int8 for
    int8) in place, float32 / float16 / bfloat16 rows for a float format in place (no copy, no GIL: the
    packer decodes them exactly), anything else through float64, which holds every input exactly
    (integers beyond 2**53 round once); the packer then rounds. uint1 from bool: True is +1, False -1."""
    if arr.flags.aligned:
        if name in _NUMPY_DTYPES and arr.dtype == _NUMPY_DTYPES[name]:
            return arr, _DTYPE_CODES[name]
        if arr.dtype in _WIDE_SOURCES and name not in _INTEGER_NAMES:
            return arr, _DTYPE_CODES[_WIDE_SOURCES[arr.dtype]]
    if name == "uint1" and arr.dtype == np.bool_:
        return np.where(arr, 1.0, -1.0), nk_dtype_float64_k
    return arr.astype(np.float64), nk_dtype_float64_k


cdef bint _is_array_like(object obj):
    return isinstance(obj, np.ndarray) or hasattr(obj, "__dlpack__") or hasattr(obj, "__array_interface__") or \
        hasattr(obj, "__array__")


def _as_array(obj, role):
    """A NumPy view of a user's array of any rank: NumPy arrays as they are, DLPack exporters (torch,
    JAX ...) zero-copy, anything else with the buffer protocol or __array__ through np.asarray."""
    if isinstance(obj, np.ndarray):
        return obj
    if isinstance(obj, (MaxSimPackedMatrix, MaxSimPackedCorpus)):
        raise TypeError(f"{role} is already packed; use maxsim_packed() or maxsim_packed_corpus() for packed operands")
    if hasattr(obj, "__dlpack__"):
        return _from_dlpack(obj, role)  # torch, JAX, ...: zero-copy, bfloat16 and float8 too
    if not (hasattr(obj, "__array_interface__") or hasattr(obj, "__array__") or _has_buffer(obj)):
        raise TypeError(f"{role} must support the buffer protocol, __dlpack__ or __array__ (a NumPy array or a "
                        f"torch tensor, for example), not {type(obj).__name__}")
    return np.asarray(obj)


def _as_matrix(obj, role):
    """A 2-D NumPy view of a user's matrix, rows contiguous along depth."""
    obj = _as_array(obj, role)
    if obj.ndim == 1:
        raise ValueError(f"{role} must be a 2-D matrix of shape [vectors, depth], got 1-D with shape {obj.shape}; "
                         f"reshape a single vector with x[None, :]")
    if obj.ndim == 3:
        raise ValueError(f"{role} must be a 2-D matrix of shape [vectors, depth], got a 3-D batch of shape "
                         f"{obj.shape}; score one matrix at a time, or pack a padded batch of documents with "
                         f"maxsim_pack_corpus(batch, lengths=...) or mask=...")
    if obj.ndim != 2:
        raise ValueError(f"{role} must be a 2-D matrix of shape [vectors, depth], got {obj.ndim}-D with shape "
                         f"{obj.shape}")
    if obj.shape[1] == 0:
        raise ValueError(f"{role} has depth 0; each vector needs at least one dimension")
    if obj.shape[0] and obj.shape[1] > 1 and obj.strides[1] != obj.itemsize:
        raise ValueError(f"{role} rows are not contiguous along depth (strides {obj.strides}); packing fuses no "
                         f"transposition, so pass a contiguous copy of shape [vectors, depth] "
                         f"(np.ascontiguousarray(x), or x.contiguous() for a torch tensor)")
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
        self.matrix.data = NULL
        self._owned = NULL
        self._base = None

    def __init__(self, *args, **kwargs):
        raise TypeError("MaxSimPackedMatrix cannot be created directly; use numkong.maxsim_pack(matrix)")

    def __dealloc__(self):
        nk_packed_free(self._owned)

    @classmethod
    def pack_size(cls, vectors, depth, /, dtype):
        """Packed buffer size in bytes for `vectors` rows of `depth` elements of `dtype`."""
        cdef uint64_t nbytes = 0
        code = _DTYPE_CODES[_dtype_name(dtype)]
        _count(vectors, "vectors")
        _count(depth, "depth")
        if depth == 0:
            raise ValueError("depth must be at least 1")
        _check_depth(_DTYPE_NAMES[code], depth)
        _raise_for(nk_maxsim_pack_size(vectors, depth, code, &nbytes),
                   {"what": f"{vectors} x {depth} {_DTYPE_NAMES[code]}"})
        return nbytes

    @property
    def vectors(self):
        """Number of vectors (rows)."""
        return self.matrix.info.vectors

    @property
    def depth(self):
        """Number of dimensions per vector."""
        return self.matrix.info.depth

    @property
    def nbytes(self):
        """Size of the packed buffer in bytes."""
        return self.matrix.info.nbytes

    @property
    def dtype(self):
        """Data type of the packed vectors (canonical name, e.g. 'float32', 'bfloat16', 'e4m3')."""
        _require_packed(self.matrix.data, self)
        return _DTYPE_NAMES[self.matrix.info.dtype]

    @property
    def shape(self):
        """(vectors, depth), read from the packed buffer header."""
        return (self.matrix.info.vectors, self.matrix.info.depth)

    @property
    def capabilities(self):
        """The Capability mask this matrix was packed with: the families scoring it defaults to. A pack
        without capabilities= is unrestricted and reports every family (each machine uses its best)."""
        return Capability(self.matrix.info.capabilities & _known_capabilities)

    def __repr__(self):
        if self.matrix.data == NULL:
            return "MaxSimPackedMatrix(<empty: not built by maxsim_pack>)"
        return (f"MaxSimPackedMatrix(vectors={self.vectors}, depth={self.depth}, dtype={self.dtype!r}, "
                f"nbytes={self.nbytes})")

    def __getbuffer__(self, Py_buffer *buffer, int flags):
        _export_bytes(self, buffer, flags, self.matrix.data, self.matrix.info.nbytes, self._buffer_shape,
                      self._buffer_strides)

    def __releasebuffer__(self, Py_buffer *buffer):
        pass

    def __reduce_ex__(self, protocol):
        if protocol >= 5:
            return (_load_packed, (pickle.PickleBuffer(self),))
        return (_load_packed, (bytes(memoryview(self)),))


cdef int _require_packed(const void *data, object owner) except -1:
    """Objects made with __new__ (bypassing maxsim_pack) hold no buffer: refuse to use them."""
    if data == NULL:
        raise ValueError(f"this {type(owner).__name__} is empty (made without maxsim_pack); pack a matrix first")
    return 0


cdef int _export_bytes(object owner, Py_buffer *buffer, int flags, const void *data, uint64_t nbytes,
                       Py_ssize_t *shape, Py_ssize_t *strides) except -1:
    """Expose `nbytes` at `data` as a read-only 1-D unsigned-byte buffer owned by `owner`."""
    if flags & PyBUF_WRITABLE:
        raise BufferError(f"a {type(owner).__name__} buffer is read-only")
    shape[0] = <Py_ssize_t>nbytes
    strides[0] = 1
    buffer.buf = <void *>data
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


cdef void *_packed_alloc(uint64_t nbytes, str what) except NULL:
    """An aligned allocation for packed bytes (freed with nk_packed_free()); MemoryError when it fails."""
    cdef void *data = NULL
    if nbytes <= <uint64_t>(<size_t>-1):
        data = nk_packed_alloc(<size_t>nbytes)
    if data == NULL:
        raise MemoryError(f"cannot allocate {nbytes} bytes for a packed {what}")
    return data


cdef MaxSimPackedMatrix _allocate(uint64_t nbytes):
    cdef MaxSimPackedMatrix packed = MaxSimPackedMatrix.__new__(MaxSimPackedMatrix)
    packed._owned = _packed_alloc(nbytes, "matrix")
    packed.matrix.data = packed._owned
    packed.matrix.info.nbytes = nbytes
    return packed


def _load_packed(data):
    """Rebuild a packed matrix from its bytes (the pickle path): always a private copy, validated and
    its derived sections rebuilt, so nothing another holder of `data` does can change it later."""
    cdef Py_buffer view
    cdef nk_status_t status
    cdef uint32_t version
    try:
        PyObject_GetBuffer(data, &view, PyBUF_SIMPLE)
    except TypeError:
        raise TypeError(f"a packed matrix loads from a bytes-like object, not {type(data).__name__}") from None
    try:
        packed = _allocate(<uint64_t>view.len)
        memcpy(packed._owned, view.buf, <size_t>view.len)
    finally:
        PyBuffer_Release(&view)
    with nogil:
        status = nk_maxsim_load(packed._owned, packed.matrix.info.nbytes, &packed.matrix.info)
        version = nk_maxsim_format_version(packed._owned, packed.matrix.info.nbytes)
    _raise_for(status, {"kind": "matrix", "found": version, "expected": NK_MAXSIM_FORMAT_VERSION})
    return packed


def maxsim_pack(b, /, dtype=None, *, capabilities=None, stream=None):
    """Pack a matrix for MaxSim late-interaction scoring with maxsim_packed().

    b: matrix of shape [vectors, depth], rows contiguous along depth (any row stride); any real float
       dtype of NumPy or ml_dtypes, or integers when `dtype` is given.
    dtype: packing dtype ('float64', 'float32', 'float16', 'bfloat16', 'e4m3', 'e5m2', 'e2m3', 'e3m2',
       aliases, or the scalar types); None keeps the input's float format. A cast rounds to nearest even,
       after scaling each row by a power of two so that narrow formats neither overflow nor flush.
    capabilities: a Capability mask to restrict scoring of this matrix to (recorded in the buffer);
       None (default) records no restriction, so every machine scores it with its best families.
    stream: must be None (CPU build).
    Raises ValueError naming the row for NaN or infinity.
    """
    _check_stream(stream)
    cdef uint64_t mask = _resolve_capabilities(capabilities, NK_CAPABILITIES_ANY)
    arr = _as_matrix(b, "b")
    name = _infer_dtype_name(arr, "b") if dtype is None else _dtype_name(dtype)
    if dtype is not None and not (_is_float_dtype(arr.dtype) or arr.dtype.kind in "iub"):
        raise TypeError(f"b has dtype {arr.dtype}, which is not a real floating-point or integer type")
    return _pack(arr, name, mask)


cdef uintptr_t _data_address(object arr) except? 0:
    """Address of a NumPy array's first element (any dtype, any strides) through the buffer protocol: a
    tenth of the cost of arr.__array_interface__, which builds a dict each time. The caller keeps arr
    (alive, and from being resized) while it uses the address."""
    cdef Py_buffer view
    PyObject_GetBuffer(arr, &view, PyBUF_STRIDES)
    cdef uintptr_t address = <uintptr_t>view.buf
    PyBuffer_Release(&view)
    return address


cdef int _pack_into(object arr, str name, uint64_t mask, void *out, uint64_t capacity,
                    nk_maxsim_info_t *info) except -1:
    """Pack a checked 2-D array into `capacity` bytes at `out` (64-byte aligned); fill *info."""
    cdef int code = _DTYPE_CODES[name]
    cdef int source_code
    arr, source_code = _packing_source(arr, name)
    cdef uint64_t vectors = arr.shape[0], depth = arr.shape[1], bad_row = 0
    cdef uintptr_t source = _data_address(arr)
    cdef int64_t row_stride = arr.strides[0]
    cdef nk_status_t status
    with nogil:
        status = nk_maxsim_pack(<const void *>source, source_code, row_stride, vectors, depth, code, mask,
                                out, capacity, &bad_row)
        if status == nk_ok_k:
            status = nk_maxsim_info(out, info)
    _raise_for(status, {"what": f"{vectors} x {depth} {name}", "row": bad_row})
    return 0


cdef MaxSimPackedMatrix _pack(object arr, str name, uint64_t mask):
    cdef uint64_t nbytes = 0
    _check_depth(name, arr.shape[1])
    _raise_for(nk_maxsim_pack_size(arr.shape[0], arr.shape[1], _DTYPE_CODES[name], &nbytes),
               {"what": f"{arr.shape[0]} x {arr.shape[1]} {name}"})
    cdef MaxSimPackedMatrix packed = _allocate(nbytes)
    _pack_into(arr, name, mask, packed._owned, nbytes, &packed.matrix.info)
    return packed


cdef nk_status_t maxsim_packed_nogil(MaxSimPackedMatrix queries, MaxSimPackedMatrix documents,
                                     uint64_t capabilities, double *result) noexcept nogil:
    return nk_maxsim_score_matrices(&queries.matrix, &documents.matrix, capabilities, result)


# Below this many multiply-adds (query rows x document rows x depth, about a microsecond) a call keeps
# the GIL: releasing and taking it back costs more than the kernel (NumPy thresholds the same way).
DEF _NOGIL_WORK = 1 << 16


cdef double _score(MaxSimPackedMatrix queries, MaxSimPackedMatrix documents, uint64_t mask) except? -1:
    cdef double result = 0.0
    cdef nk_status_t status
    _require_packed(queries.matrix.data, queries)
    _require_packed(documents.matrix.data, documents)
    cdef double work = <double>queries.matrix.info.vectors * <double>documents.matrix.info.vectors * \
        <double>queries.matrix.info.depth
    if work < _NOGIL_WORK:
        status = nk_maxsim_score_matrices(&queries.matrix, &documents.matrix, mask, &result)
    else:
        with nogil:
            status = nk_maxsim_score_matrices(&queries.matrix, &documents.matrix, mask, &result)
    if status != nk_ok_k:
        _raise_for(status, _pair_context(queries, documents, "queries", "documents", "have"))
    return result


cdef int _require_matrix(object operand, str role) except -1:
    if not isinstance(operand, MaxSimPackedMatrix):
        raise TypeError(f"{role} must be a MaxSimPackedMatrix from numkong.maxsim_pack(), not "
                        f"{type(operand).__name__}; to score arrays directly use numkong.maxsim(queries, documents)")
    return 0


def maxsim_packed(queries, documents, /, *, capabilities=None, stream=None):
    """MaxSim late-interaction score of two packed matrices, as a Python float.

    Returns sum over query rows of min over document rows of max(0, 1 - cos): the sum of per-query minimum
    angular distances (query_count - maxsim is the ColBERT similarity, sum of max cos). capabilities
    defaults to the families both operands were packed for (every available one unless restricted).
    """
    _require_matrix(queries, "queries")
    _require_matrix(documents, "documents")
    _check_stream(stream)
    cdef MaxSimPackedMatrix q = queries, d = documents
    cdef uint64_t default = _stored_mask(q.matrix.info.capabilities & d.matrix.info.capabilities)
    return _score(q, d, _resolve_capabilities(capabilities, default))


cdef object _TORCH_TENSOR = None   # torch.Tensor and torch.float32 once seen (torch is never imported)
cdef object _TORCH_FLOAT32 = None
cdef object _TORCH_STRIDED = None


cdef bint _torch_rows(object tensor, uint64_t depth, size_t *address, uint64_t *rows, int64_t *stride):
    """Whether `tensor` is a torch CPU float32 tensor [rows > 0, depth] with rows contiguous along depth,
    read from the tensor's own attributes (about 0.6 us; a NumPy view first costs about 1.1 us): its
    address, rows and row stride in bytes. False for anything else, which the caller reads another way."""
    global _TORCH_TENSOR, _TORCH_FLOAT32, _TORCH_STRIDED
    cls = type(tensor)
    if cls is not _TORCH_TENSOR:
        if _TORCH_TENSOR is not None or cls.__module__ != "torch" or cls.__name__ != "Tensor":
            return False
        _TORCH_TENSOR = cls
    try:
        dtype, layout = tensor.dtype, tensor.layout
        if dtype is not _TORCH_FLOAT32:
            if _TORCH_FLOAT32 is not None or str(dtype) != "torch.float32":
                return False
            _TORCH_FLOAT32 = dtype
        if layout is not _TORCH_STRIDED:
            if _TORCH_STRIDED is not None or str(layout) != "torch.strided":
                return False
            _TORCH_STRIDED = layout
        if tensor.is_cpu is not True or tensor.is_neg():  # a lazily negated view's memory lacks its sign
            return False
        shape, strides = tensor.shape, tensor.stride()
        if len(shape) != 2 or shape[0] <= 0 or shape[1] != depth or strides[1] != 1 or strides[0] < 0:
            return False
        address[0], rows[0], stride[0] = <size_t>tensor.data_ptr(), shape[0], strides[0] * 4
    except Exception:  # no storage (e.g. inside a torch.func transform), and the like
        return False
    return address[0] % 4 == 0


def _maxsim_unpacked(MaxSimPackedMatrix query, list documents, capabilities=None):
    """MaxSim of a packed float32 query against float32 documents scored where they are, without packing
    them (nk_maxsim_unpacked_f32): float64 [documents], each with the bits of packing that document as
    float32 and scoring it, or NaN for one to pack instead (not a float32 NumPy array or torch CPU tensor
    of the query's depth with aligned rows contiguous along depth, a value not finite, a row outside the
    screened range, no rows). None when no AVX-512 family is available within `capabilities` (default:
    the query's)."""
    cdef uint64_t mask = _resolve_capabilities(capabilities, _stored_mask(query.matrix.info.capabilities))
    if query.matrix.info.dtype != nk_dtype_float32_k or not nk_maxsim_unpacked_available(mask):
        return None
    cdef uint64_t count = len(documents), i, taken = 0, depth = query.matrix.info.depth, max_rows = 0
    scores = np.full(count, np.nan)
    if not count:
        return scores
    pointers = np.empty(count, dtype=np.uintp)
    rows = np.empty(count, dtype=np.uint64)
    strides = np.empty(count, dtype=np.int64)
    positions = np.empty(count, dtype=np.intp)
    cdef size_t[::1] pointer_view = pointers
    cdef uint64_t[::1] row_view = rows
    cdef int64_t[::1] stride_view = strides
    cdef Py_buffer view
    cdef size_t address
    cdef uint64_t document_rows
    cdef int64_t row_stride
    for i in range(count):
        document = documents[i]
        if type(document) is not np.ndarray:
            if _torch_rows(document, depth, &address, &document_rows, &row_stride):
                pointer_view[taken], row_view[taken], stride_view[taken] = address, document_rows, row_stride
                positions[taken] = i
                max_rows = max(max_rows, document_rows)
                taken += 1
            continue
        PyObject_GetBuffer(document, &view, PyBUF_STRIDES | PyBUF_FORMAT)  # format "f": native float32
        usable = view.ndim == 2 and view.itemsize == 4 and view.format[0] == b'f' and view.format[1] == 0 and \
            <uint64_t>view.shape[1] == depth and view.shape[0] > 0 and view.strides[1] == 4 and \
            (<uintptr_t>view.buf | <uint64_t>view.strides[0]) % 4 == 0
        if usable:
            pointer_view[taken], row_view[taken], stride_view[taken] = <size_t>view.buf, view.shape[0], view.strides[0]
            positions[taken] = i
            max_rows = max(max_rows, <uint64_t>view.shape[0])
            taken += 1
        PyBuffer_Release(&view)
    if not taken:
        return scores
    cdef uint64_t scratch_bytes = nk_maxsim_unpacked_scratch_bytes(query.matrix.info.vectors, depth, max_rows)
    if scratch_bytes == <uint64_t>-1:
        return scores  # too large to screen so: packing says what is wrong, or scores
    scratch = np.empty(scratch_bytes, dtype=np.uint8)
    found = np.empty(taken, dtype=np.float64)
    cdef double[::1] found_view = found
    cdef void *scratch_address = <void *>_data_address(scratch)
    cdef nk_status_t status
    with nogil:
        status = nk_maxsim_unpacked_f32(&query.matrix, <const float *const *>&pointer_view[0], &row_view[0],
                                        &stride_view[0], taken, mask, scratch_address, scratch_bytes,
                                        &found_view[0])
    _raise_for(status, {"what": "scoring unpacked documents"})
    scores[positions[:taken]] = found
    return scores


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
