"""numkong: exact MaxSim (ColBERT late interaction) on CPUs, with C SIMD kernels behind Cython.

    maxsim(Q, D) = sum over query rows q of min over document rows d of max(0, 1 - cos(q, d))

computed on the values as stored in the packing dtype, exact to float64 accumulation.
The ColBERT similarity is sum_q max_d cos = query_count - maxsim (1 - cos is never negative).
"""
import os as _os

import ml_dtypes as _ml_dtypes
import numpy as _np

from numkong._maxsim import (
    Capability,
    MaxSimCorpusWriter,
    MaxSimPackedCorpus,
    MaxSimPackedMatrix,
    get_capabilities,
    maxsim,
    maxsim_pack,
    maxsim_pack_corpus,
    maxsim_packed,
    maxsim_packed_corpus,
)
from numkong._maxsim import _disable_capabilities

__version__ = "0.1.0"

# Scalar types accepted by `dtype=` (the NumPy / ml_dtypes types themselves).
bfloat16 = _ml_dtypes.bfloat16
float16 = _np.float16
float8_e4m3 = _ml_dtypes.float8_e4m3fn
float8_e5m2 = _ml_dtypes.float8_e5m2
float6_e2m3 = _ml_dtypes.float6_e2m3fn
float6_e3m2 = _ml_dtypes.float6_e3m2fn


def get_include():
    """Directory of the installed C headers (numkong/maxsim.h), for building other extensions."""
    return _os.path.join(_os.path.dirname(__file__), "include")


_disable_capabilities(_os.environ.get("NUMKONG_DISABLE", ""))

__all__ = [
    "Capability",
    "MaxSimCorpusWriter",
    "MaxSimPackedCorpus",
    "MaxSimPackedMatrix",
    "bfloat16",
    "float16",
    "float6_e2m3",
    "float6_e3m2",
    "float8_e4m3",
    "float8_e5m2",
    "get_capabilities",
    "get_include",
    "maxsim",
    "maxsim_pack",
    "maxsim_pack_corpus",
    "maxsim_packed",
    "maxsim_packed_corpus",
]
