import enum
import os
from typing import Any, BinaryIO, Iterator, Literal, Sequence, Tuple, Union, overload

import numpy as np
import numpy.typing as npt

__version__: str

_FloatTypeName = Literal[
    "float64", "f64", "float32", "f32", "float16", "f16", "bfloat16", "bf16",
    "e4m3", "float8_e4m3", "e5m2", "float8_e5m2", "e2m3", "float6_e2m3", "e3m2", "float6_e3m2",
]
_IntegerTypeName = Literal["int8", "int4", "uint1"]  # exact integer packings (a scale per row; sign bits)
_MiniFloatType = type
_ComplexTypeName = Literal["complex32", "complex64", "complex128"]
_BufferType = Any  # anything with the buffer protocol, __array_interface__ or __array__
_DTypeArg = Union[_FloatTypeName, _IntegerTypeName, _MiniFloatType, None]  # None: the input's own type
_CapabilitiesArg = Union["Capability", int, None]
_StreamArg = Union[int, None]

bfloat16: type
float16: type[np.float16]
float8_e4m3: type
float8_e5m2: type
float6_e2m3: type
float6_e3m2: type

class Capability(enum.IntFlag):
    """Kernel families, one bit each; str() names them, e.g. 'serial|haswell'."""
    SERIAL = 1
    HASWELL = 2
    SKYLAKE = 4
    ICELAKE = 8
    GENOA = 16
    SAPPHIREAMX = 32
    NEON = 64
    SVE = 128

class MaxSimPackedMatrix:
    """Opaque pre-packed matrix for MaxSim late-interaction scoring."""

    @classmethod
    def pack_size(
        cls, vectors: int, depth: int, /, dtype: Union[_FloatTypeName, _IntegerTypeName, _MiniFloatType]
    ) -> int: ...
    @property
    def vectors(self) -> int: ...
    @property
    def depth(self) -> int: ...
    @property
    def dtype(
        self,
    ) -> Union[
        Literal["uint1", "int4", "uint4", "int64", "int32", "int16", "int8", "uint64", "uint32", "uint16", "uint8"],
        _FloatTypeName,
        _ComplexTypeName,
    ]: ...
    @property
    def nbytes(self) -> int: ...
    @property
    def shape(self) -> tuple[int, int]: ...
    @property
    def capabilities(self) -> Capability: ...
    def __buffer__(self, flags: int, /) -> memoryview: ...
    def __repr__(self) -> str: ...

class MaxSimPackedCorpus:
    """Many packed documents of different lengths in one portable buffer."""

    @classmethod
    def pack_size(
        cls, lengths: Sequence[int], depth: int, /, dtype: Union[_FloatTypeName, _IntegerTypeName, _MiniFloatType]
    ) -> int: ...
    @classmethod
    def load(
        cls, path: Union[str, os.PathLike[str], BinaryIO], *, mmap: bool = True, verify: Union[bool, Literal["all"]] = True
    ) -> "MaxSimPackedCorpus": ...
    def save(self, path: Union[str, os.PathLike[str], BinaryIO]) -> None: ...
    def __repr__(self) -> str: ...
    def __len__(self) -> int: ...
    @property
    def documents(self) -> int: ...
    @property
    def lengths(self) -> npt.NDArray[np.int64]: ...
    @property
    def total_vectors(self) -> int: ...
    def __getitem__(self, index: int) -> MaxSimPackedMatrix: ...
    def __iter__(self) -> Iterator[MaxSimPackedMatrix]: ...
    def document(self, index: int) -> npt.NDArray[Any]: ...
    @property
    def depth(self) -> int: ...
    @property
    def dtype(self) -> _FloatTypeName: ...
    @property
    def nbytes(self) -> int: ...
    @property
    def capabilities(self) -> Capability: ...
    @property
    def owns_data(self) -> bool: ...
    def __buffer__(self, flags: int, /) -> memoryview: ...

class MaxSimCorpusWriter:
    """Builds a corpus file document batch by batch, for collections larger than memory."""

    def __init__(
        self,
        path: Union[str, os.PathLike[str]],
        *,
        dtype: _DTypeArg = None,
        threads: Union[int, None] = None,
        capabilities: Union[Capability, int, None] = None,
        progress: Any = None,
    ) -> None: ...
    @property
    def documents(self) -> int: ...
    def append(
        self,
        documents: Any,
        /,
        *,
        offsets: Union[Sequence[int], npt.NDArray[np.integer[Any]], None] = None,
        lengths: Union[Sequence[int], npt.NDArray[np.integer[Any]], None] = None,
        mask: Union[_BufferType, None] = None,
    ) -> None: ...
    def close(self) -> None: ...
    def abort(self) -> None: ...
    def __enter__(self) -> "MaxSimCorpusWriter": ...
    def __exit__(self, kind: Any, value: Any, traceback: Any) -> bool: ...

def get_capabilities(kind: Literal["available", "compiled", "cpu"] = "available") -> Capability: ...
def get_include() -> str: ...
def maxsim_pack(
    b: _BufferType,
    /,
    dtype: _DTypeArg = None,
    *, capabilities: _CapabilitiesArg = ..., stream: _StreamArg = ...,
) -> MaxSimPackedMatrix: ...
def maxsim_packed(
    queries: MaxSimPackedMatrix,
    documents: MaxSimPackedMatrix,
    /,
    *, capabilities: _CapabilitiesArg = ..., stream: _StreamArg = ...,
) -> float: ...
def maxsim(
    queries: _BufferType,
    documents: _BufferType,
    /,
    dtype: _DTypeArg = None,
    *, capabilities: _CapabilitiesArg = ..., stream: _StreamArg = ...,
) -> float: ...
def maxsim_pack_corpus(
    documents: Union[Sequence[_BufferType], _BufferType],
    /,
    dtype: _DTypeArg = None,
    *,
    offsets: Union[Sequence[int], npt.NDArray[np.integer[Any]], None] = None,
    lengths: Union[Sequence[int], npt.NDArray[np.integer[Any]], None] = None,
    mask: Union[_BufferType, None] = None,
    threads: Union[int, None] = None,
    progress: Any = None,
    capabilities: _CapabilitiesArg = ..., stream: _StreamArg = ...,
) -> MaxSimPackedCorpus: ...
@overload
def maxsim_packed_corpus(
    queries: Union[MaxSimPackedMatrix, Sequence[MaxSimPackedMatrix]],
    corpus: MaxSimPackedCorpus,
    /,
    *,
    top_k: None = None,
    threads: Union[int, None] = None,
    capabilities: _CapabilitiesArg = ..., stream: _StreamArg = ...,
) -> npt.NDArray[np.float64]: ...
@overload
def maxsim_packed_corpus(
    queries: Union[MaxSimPackedMatrix, Sequence[MaxSimPackedMatrix]],
    corpus: MaxSimPackedCorpus,
    /,
    *,
    top_k: int,
    threads: Union[int, None] = None,
    capabilities: _CapabilitiesArg = ..., stream: _StreamArg = ...,
) -> Tuple[npt.NDArray[np.int64], npt.NDArray[np.float64]]: ...
