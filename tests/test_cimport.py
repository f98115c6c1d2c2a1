"""A small Cython extension compiled against the installed package: cimport, nogil scoring, threads."""
import os
import threading

import numpy as np
import pytest

import numkong as nk
from conftest import build_cython_extension

CONSUMER = r'''
# cython: language_level=3
from libc.stdint cimport uint64_t
from numkong cimport MaxSimPackedMatrix, maxsim_packed_nogil, nk_status_t

def fields(MaxSimPackedMatrix packed):
    """C-level fields, read without Python attribute lookups."""
    info = packed.matrix.info
    return info.vectors, info.depth, info.dtype, info.nbytes, packed.matrix.data != NULL

def score_repeatedly(MaxSimPackedMatrix queries, MaxSimPackedMatrix documents, int repeats, uint64_t mask):
    """Score `repeats` times without the GIL; returns (last score, last status)."""
    cdef double score = -1.0
    cdef nk_status_t status = <nk_status_t>0
    cdef int i
    with nogil:
        for i in range(repeats):
            status = maxsim_packed_nogil(queries, documents, mask, &score)
    return score, <int>status
'''


@pytest.fixture(scope="module")
def consumer(tmp_path_factory):
    return build_cython_extension(CONSUMER, "consumer", tmp_path_factory.mktemp("consumer"))


def test_header_is_installed():
    assert os.path.isfile(os.path.join(nk.get_include(), "numkong", "maxsim.h"))


def test_fields_match_python_attributes(consumer):
    packed = nk.maxsim_pack(np.ones((5, 7), dtype=np.float32), dtype="bf16")
    assert consumer.fields(packed) == (5, 7, 4, packed.nbytes, True)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "e4m3", "int8", "int4", "uint1"])
def test_nogil_scoring_from_threads_matches_python(consumer, dtype):
    rng = np.random.default_rng(7)
    queries = nk.maxsim_pack(rng.standard_normal((32, 128)), dtype=dtype)
    documents = nk.maxsim_pack(rng.standard_normal((180, 128)), dtype=dtype)
    expected = nk.maxsim_packed(queries, documents)
    results = []

    def work():
        results.append(consumer.score_repeatedly(queries, documents, 50, int(nk.get_capabilities())))

    threads = [threading.Thread(target=work) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert results == [(expected, 0)] * 4


def test_nogil_status_reports_mismatch(consumer):
    queries = nk.maxsim_pack(np.ones((2, 8), dtype=np.float32))
    documents = nk.maxsim_pack(np.ones((2, 9), dtype=np.float32))
    score, status = consumer.score_repeatedly(queries, documents, 1, 1)
    assert status == 6  # nk_error_depth_mismatch_k
