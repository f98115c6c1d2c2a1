# DLPack input: a tensor of any library that exports __dlpack__ (PyTorch, JAX, CuPy, ...) read as a
# read-only NumPy view of the same memory, without copying. Included into _maxsim.pyx.
#
# Decisions:
# - Only kDLCPU memory is read. Pinned host memory (kDLCUDAHost, kDLROCMHost) and managed memory are
#   CPU-addressable, but the protocol gives a CPU consumer no stream to wait on, so pending GPU writes
#   could still be in flight: they are refused like device memory, with the advice to call .cpu().
# - A PyTorch tensor that requires grad is read through tensor.detach() (same storage, no copy): a
#   MaxSim score is a Python float, so no gradient could flow through it anyway.
# - Sub-byte formats (fp6, fp4) are read only when the producer pads each element to a byte.
# - A PyTorch CPU tensor of float16/32/64 is read through tensor.numpy() instead (same memory, same
#   checks downstream, a quarter of the cost); see _torch_numpy_view.
from cpython.pycapsule cimport PyCapsule_GetPointer, PyCapsule_IsValid, PyCapsule_SetName
from libc.stdint cimport int32_t, int64_t, uint8_t, uint16_t, uint32_t, uint64_t


cdef extern from *:
    """
    /* The DLPack ABI (dlpack.h, major version 1), under numkong's own names. */
    typedef struct { int32_t device_type; int32_t device_id; } nk_dl_device_t;
    typedef struct { uint8_t code; uint8_t bits; uint16_t lanes; } nk_dl_dtype_t;
    typedef struct {
        void *data;
        nk_dl_device_t device;
        int32_t ndim;
        nk_dl_dtype_t dtype;
        const int64_t *shape;
        const int64_t *strides; /* in elements; NULL means C-contiguous */
        uint64_t byte_offset;
    } nk_dl_tensor_t;
    typedef struct nk_dl_managed {
        nk_dl_tensor_t dl_tensor;
        void *manager_ctx;
        void (*deleter)(struct nk_dl_managed *self);
    } nk_dl_managed_t;
    typedef struct nk_dl_versioned {
        uint32_t major, minor;
        void *manager_ctx;
        void (*deleter)(struct nk_dl_versioned *self);
        uint64_t flags;
        nk_dl_tensor_t dl_tensor;
    } nk_dl_versioned_t;
    static void nk_dl_release(void *managed, int versioned) {
        if (versioned) {
            nk_dl_versioned_t *tensor = (nk_dl_versioned_t *)managed;
            if (tensor->deleter) tensor->deleter(tensor);
        } else {
            nk_dl_managed_t *tensor = (nk_dl_managed_t *)managed;
            if (tensor->deleter) tensor->deleter(tensor);
        }
    }
    """
    ctypedef struct nk_dl_device_t:
        int32_t device_type
        int32_t device_id
    ctypedef struct nk_dl_dtype_t:
        uint8_t code
        uint8_t bits
        uint16_t lanes
    ctypedef struct nk_dl_tensor_t:
        void *data
        nk_dl_device_t device
        int32_t ndim
        nk_dl_dtype_t dtype
        const int64_t *shape
        const int64_t *strides
        uint64_t byte_offset
    ctypedef struct nk_dl_managed_t:
        nk_dl_tensor_t dl_tensor
    ctypedef struct nk_dl_versioned_t:
        uint32_t major
        uint32_t minor
        uint64_t flags
        nk_dl_tensor_t dl_tensor
    void nk_dl_release(void *managed, int versioned)


cdef int _DL_CPU = 1
cdef uint64_t _DL_SUBBYTE_PADDED = 1 << 2  # DLPACK_FLAG_BITMASK_IS_SUBBYTE_TYPE_PADDED (DLPack 1.1)
# max_version asked of producers: 1.1 is the first with the float8 / float6 / float4 type codes.
_DL_MAX_VERSION = (1, 1)

_DL_DEVICES = {
    1: "cpu", 2: "cuda", 3: "cuda pinned host", 4: "opencl", 7: "vulkan", 8: "metal", 9: "vpi",
    10: "rocm", 11: "rocm pinned host", 12: "ext_dev", 13: "cuda managed", 14: "oneapi",
    15: "webgpu", 16: "hexagon", 17: "maia", 18: "trainium",
}
# (type code, bits) -> NumPy or ml_dtypes type name; ml_dtypes names are looked up when used.
_DL_DTYPES = {
    (0, 8): "int8", (0, 16): "int16", (0, 32): "int32", (0, 64): "int64",
    (1, 8): "uint8", (1, 16): "uint16", (1, 32): "uint32", (1, 64): "uint64",
    (2, 16): "float16", (2, 32): "float32", (2, 64): "float64",
    (4, 16): "bfloat16",
    (5, 64): "complex64", (5, 128): "complex128",
    (6, 8): "bool",
    (7, 8): "float8_e3m4", (8, 8): "float8_e4m3", (9, 8): "float8_e4m3b11fnuz", (10, 8): "float8_e4m3fn",
    (11, 8): "float8_e4m3fnuz", (12, 8): "float8_e5m2", (13, 8): "float8_e5m2fnuz", (14, 8): "float8_e8m0fnu",
    (15, 6): "float6_e2m3fn", (16, 6): "float6_e3m2fn", (17, 4): "float4_e2m1fn",
}


cdef class _DLPackOwner:
    """Owns a consumed DLPack tensor; the base of the NumPy view. Its deallocation calls the deleter,
    which lets the producer free (or stop pinning) the memory."""
    cdef void *managed
    cdef int versioned
    cdef dict _interface

    def __cinit__(self):
        self.managed = NULL

    def __dealloc__(self):
        if self.managed != NULL:
            nk_dl_release(self.managed, self.versioned)
            self.managed = NULL

    @property
    def __array_interface__(self):
        return self._interface


def _dl_device_name(device_type):
    return _DL_DEVICES.get(device_type, f"DLPack device type {device_type}")


cdef _dl_device_error(str role, object where):
    return ValueError(f"{role} is in {where} memory; numkong reads CPU memory only: move it to the CPU first "
                      f"(e.g. tensor.cpu() or tensor.to('cpu'))")


# torch.dtype -> whether tensor.numpy() reads it (float16/32/64); filled as dtypes are met, so that
# torch is never imported here.
_TORCH_NUMPY_FLOATS = {}
_TORCH_TYPES = {}  # type -> whether it comes from torch (its module read once per type)


cdef object _torch_numpy_view(object obj):
    """PyTorch's own zero-copy NumPy view of a CPU tensor of a NumPy float type, read-only; else None.
    tensor.numpy() takes 1.0 us where __dlpack_device__ + __dlpack__ take 3.9 us, most of the time
    spent reading a list of 1,000 document tensors; bfloat16, float8 and every other case go through
    DLPack. Only the checks .numpy() does not make itself come first: it refuses (and DLPack then
    decides) a tensor that is not on the CPU, requires grad or has its negative bit set."""
    cls = type(obj)
    from_torch = _TORCH_TYPES.get(cls)
    if from_torch is None:
        from_torch = _TORCH_TYPES[cls] = str(getattr(cls, "__module__", "")).startswith("torch")
    if not from_torch:
        return None
    dtype = getattr(obj, "dtype", None)
    readable = _TORCH_NUMPY_FLOATS.get(dtype)
    if readable is None:
        readable = str(dtype) in ("torch.float16", "torch.float32", "torch.float64")
        _TORCH_NUMPY_FLOATS[dtype] = readable
    if not readable:
        return None
    try:
        view = obj.numpy()  # shares the tensor's memory and keeps the tensor alive
    except (RuntimeError, TypeError):
        return None
    view.setflags(write=False)
    return view


def _from_dlpack(obj, role="array"):
    """A read-only NumPy view (no copy) of the CPU memory of an object exporting __dlpack__.

    bfloat16 and the float8 / float6 formats come back as the ml_dtypes types, integers and IEEE floats as
    NumPy's. Raises ValueError for memory that is not on the CPU, TypeError for what cannot be exported.
    """
    view = _torch_numpy_view(obj)
    if view is not None:
        return view
    if getattr(obj, "requires_grad", False) is True and callable(getattr(obj, "detach", None)):
        obj = obj.detach()  # PyTorch refuses to export a tensor that requires grad; same storage
        view = _torch_numpy_view(obj)
        if view is not None:
            return view
    is_neg = getattr(obj, "is_neg", None)
    if callable(is_neg) and is_neg() is True:
        obj = obj.resolve_neg()  # PyTorch exports a lazily negated view's memory without its sign: a copy
        view = _torch_numpy_view(obj)
        if view is not None:
            return view
    exporter = getattr(obj, "__dlpack__", None)
    if exporter is None:
        raise TypeError(f"{role} ({type(obj).__name__}) does not export __dlpack__")
    device_of = getattr(obj, "__dlpack_device__", None)
    if device_of is not None:
        try:
            device = device_of()
        except Exception as error:  # e.g. PyTorch's 'meta' device has no DLPack device type
            where = getattr(obj, "device", None)
            raise _dl_device_error(role, f"{where}" if where is not None else f"a non-CPU ({error})") from error
        if int(device[0]) != _DL_CPU:
            raise _dl_device_error(role, _dl_device_name(int(device[0])))
    try:
        capsule = exporter(max_version=_DL_MAX_VERSION)
    except TypeError:  # a producer from before DLPack 1.0 takes no max_version
        capsule = exporter()
    except BufferError as error:
        raise TypeError(f"{role} ({type(obj).__name__}) cannot be exported through DLPack: {error}; pass a CPU "
                        f"tensor or NumPy array of a real floating-point type") from error
    return _view_capsule(capsule, role)


cdef object _view_capsule(object capsule, str role):
    cdef _DLPackOwner owner = _DLPackOwner.__new__(_DLPackOwner)
    cdef nk_dl_tensor_t *tensor
    cdef nk_dl_versioned_t *versioned
    cdef uint64_t flags = 0
    if PyCapsule_IsValid(capsule, b"dltensor_versioned"):
        versioned = <nk_dl_versioned_t *>PyCapsule_GetPointer(capsule, b"dltensor_versioned")
        # The consumer owns the tensor from here on: renamed, the capsule's destructor leaves it alone.
        PyCapsule_SetName(capsule, b"used_dltensor_versioned")
        owner.managed = versioned
        owner.versioned = 1
        if versioned.major != 1:
            raise TypeError(f"{role} was exported as DLPack {versioned.major}.{versioned.minor}; numkong reads "
                            f"DLPack 1.x: pass a NumPy array instead")
        tensor = &versioned.dl_tensor
        flags = versioned.flags
    elif PyCapsule_IsValid(capsule, b"dltensor"):
        owner.managed = PyCapsule_GetPointer(capsule, b"dltensor")
        PyCapsule_SetName(capsule, b"used_dltensor")
        owner.versioned = 0
        tensor = &(<nk_dl_managed_t *>owner.managed).dl_tensor
    else:
        raise TypeError(f"{role}.__dlpack__() returned {capsule!r}, not an unused DLPack capsule "
                        f"('dltensor' or 'dltensor_versioned')")

    if tensor.device.device_type != _DL_CPU:
        raise _dl_device_error(role, _dl_device_name(tensor.device.device_type))
    code, bits, lanes = tensor.dtype.code, tensor.dtype.bits, tensor.dtype.lanes
    name = _DL_DTYPES.get((code, bits))
    if name is None or lanes != 1:
        raise TypeError(f"{role} has DLPack type code {code} with {bits} bits x {lanes} lanes, which numkong "
                        f"does not read; pass real floating-point values (float32, bfloat16, float8_e4m3fn, ...)")
    if bits % 8 and not flags & _DL_SUBBYTE_PADDED:
        raise TypeError(f"{role} is {name} with its {bits}-bit elements packed; numkong reads sub-byte formats "
                        f"with one element per byte (ml_dtypes.{name})")
    dtype = np.dtype(getattr(ml_dtypes, name)) if hasattr(ml_dtypes, name) else np.dtype(name)
    if tensor.ndim < 0:
        raise TypeError(f"{role} has a negative DLPack dimension count {tensor.ndim}")
    cdef int32_t axis
    shape, strides = [], None if tensor.strides == NULL else []
    for axis in range(tensor.ndim):
        if tensor.shape[axis] < 0:
            raise TypeError(f"{role} has a negative DLPack extent {tensor.shape[axis]} on axis {axis}")
        shape.append(tensor.shape[axis])
        if strides is not None:
            strides.append(tensor.strides[axis] * dtype.itemsize)  # DLPack counts strides in elements
    shape = tuple(shape)
    if 0 in shape:
        return np.empty(shape, dtype=dtype)  # nothing to view; the owner releases the tensor now
    if tensor.data == NULL:
        raise TypeError(f"{role} was exported through DLPack with no data pointer for shape {shape}")
    owner._interface = {
        "version": 3,
        "shape": shape,
        "strides": None if strides is None else tuple(strides),
        "typestr": f"|V{dtype.itemsize}",  # raw bytes; the view below gives them their type
        "data": (<uintptr_t>tensor.data + <uintptr_t>tensor.byte_offset, True),
    }
    return np.asarray(owner).view(dtype)
