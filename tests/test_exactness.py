"""Exactness of every kernel family against the independent float64 reference (conftest.py).

For each packing dtype, each family forced through capabilities=, each depth and row-count pair:
the score must match the reference computed on the stored values to float64 accumulation rounding
(RTOL), and the family's score must match the serial family's.
"""
import functools

import numpy as np
import pytest

import numkong as nk
from conftest import (
    FAMILY_PARAMS,
    RTOL,
    assert_score_close,
    dtype_params,
    native_matrix,
    random_matrix,
    reference_maxsim,
)

DEPTHS = [1, 3, 17, 128, 129, 1000]
SHAPES = [(1, 1), (1, 300), (7, 33), (32, 180), (300, 5)]
SHAPE_PARAMS = [pytest.param(shape, id=f"{shape[0]}x{shape[1]}") for shape in SHAPES]
DEPTH_PARAMS = [pytest.param(depth, id=f"depth{depth}") for depth in DEPTHS]


def _inputs(shape, depth, source, name):
    queries, documents = shape
    if source == "cast":  # float64 input cast to the packing dtype
        return random_matrix(queries, depth, 1), random_matrix(documents, depth, 2)
    return native_matrix(queries, depth, 1, name), native_matrix(documents, depth, 2, name)


@functools.lru_cache(maxsize=None)
def _reference(shape, depth, source, name):
    return reference_maxsim(*_inputs(shape, depth, source, name), name)


@functools.lru_cache(maxsize=None)
def _serial(shape, depth, source, name):
    q, d = _inputs(shape, depth, source, name)
    return nk.maxsim(q, d, name, capabilities=nk.Capability.SERIAL)


def _check(family, name, depth, shape, source):
    q, d = _inputs(shape, depth, source, name)
    got = nk.maxsim(q, d, name, capabilities=family)
    what = f"{family.name.lower()} {name} {shape[0]}x{shape[1]} depth {depth} ({source})"
    assert_score_close(got, _reference(shape, depth, source, name), RTOL[name], what + " vs reference")
    assert_score_close(got, _serial(shape, depth, source, name), RTOL[name], what + " vs serial")


@pytest.mark.parametrize("shape", SHAPE_PARAMS)
@pytest.mark.parametrize("depth", DEPTH_PARAMS)
@pytest.mark.parametrize("family", FAMILY_PARAMS)
@pytest.mark.parametrize("name", dtype_params())
def test_cast_input_matches_reference(name, family, depth, shape):
    """float64 input packed in every dtype (the cast path, rows scaled by powers of two)."""
    _check(family, name, depth, shape, "cast")


@pytest.mark.parametrize("shape", SHAPE_PARAMS)
@pytest.mark.parametrize("depth", [pytest.param(17, id="depth17"), pytest.param(129, id="depth129")])
@pytest.mark.parametrize("family", FAMILY_PARAMS)
@pytest.mark.parametrize("name", dtype_params())
def test_native_input_matches_reference(name, family, depth, shape):
    """Input already in the packing dtype (stored bit-exact, spread over the format's whole range)."""
    _check(family, name, depth, shape, "native")


# Shapes that cross the kernels' internal blocking: > 1024 document rows (score-buffer blocks),
# depth > 1024 (several depth chunks), query counts that are not multiples of 8 or 16, and
# depth > 65536 (beyond the int8 screening limit: exhaustive path).
BOUNDARY_SHAPES = [
    pytest.param((9, 1100, 64), id="9x1100-depth64"),
    pytest.param((17, 1040, 40), id="17x1040-depth40"),
    pytest.param((3, 40, 1100), id="3x40-depth1100"),
    pytest.param((5, 33, 2049), id="5x33-depth2049"),
    pytest.param((2, 3, 65536), id="2x3-depth65536"),
    pytest.param((2, 3, 70001), id="2x3-depth70001"),
]


@pytest.mark.parametrize("problem", BOUNDARY_SHAPES)
@pytest.mark.parametrize("family", FAMILY_PARAMS)
@pytest.mark.parametrize("name", dtype_params(["float64", "float32", "float16", "bfloat16", "e4m3", "e2m3"]))
def test_blocking_boundaries_match_reference(name, family, problem):
    queries, documents, depth = problem
    q = random_matrix(queries, depth, 3)
    d = random_matrix(documents, depth, 4)
    got = nk.maxsim(q, d, name, capabilities=family)
    assert_score_close(got, reference_maxsim(q, d, name), RTOL[name], f"{family.name.lower()} {name} {problem}")


@pytest.mark.parametrize("depth", [64, 2048, 4100])
@pytest.mark.parametrize("family", FAMILY_PARAMS)
def test_e4m3_largest_values_over_long_rows(family, depth):
    """e4m3 rows made of the format's largest values (+-448 and the next three codes) with random
    signs: the integer dot products of the AVX-512 families come closest to their int32 lane limits
    here, and rows longer than 2,048 elements cross their accumulation chunks."""
    rng = np.random.default_rng(depth)
    top_codes = np.array([448.0, 416.0, 384.0, 352.0])
    q = rng.choice(top_codes, (4, depth)) * rng.choice([-1.0, 1.0], (4, depth))
    d = rng.choice(top_codes, (40, depth)) * rng.choice([-1.0, 1.0], (40, depth))
    # Each query's best match is itself with 2 % of the signs flipped: products mostly of one sign,
    # the largest sums these dot products reach.
    d[:4] = q * np.where(rng.random((4, depth)) < 0.02, -1.0, 1.0)
    d[4] = 448.0
    got = nk.maxsim(q, d, "e4m3", capabilities=family)
    assert_score_close(got, reference_maxsim(q, d, "e4m3"), RTOL["e4m3"], f"{family.name.lower()} depth {depth}")


@pytest.mark.parametrize("family", FAMILY_PARAMS)
@pytest.mark.parametrize("name", dtype_params())
def test_packed_path_equals_one_call_path(name, family):
    """maxsim_packed on maxsim_pack results is the same computation as maxsim()."""
    q, d = random_matrix(32, 128, 5), random_matrix(180, 128, 6)
    packed_q = nk.maxsim_pack(q, name, capabilities=family)
    packed_d = nk.maxsim_pack(d, name, capabilities=family)
    assert packed_q.capabilities == family
    expected = nk.maxsim(q, d, name, capabilities=family)
    # Forced explicitly, and by default (the intersection of the masks that packed both operands).
    assert nk.maxsim_packed(packed_q, packed_d, capabilities=family) == expected
    assert nk.maxsim_packed(packed_q, packed_d) == expected


@pytest.mark.parametrize("family", FAMILY_PARAMS)
@pytest.mark.parametrize("name", dtype_params())
def test_positive_data_with_tiny_distances(name, family):
    """All-positive rows: every cosine is large and distances are small, so relative errors show."""
    q = random_matrix(16, 64, 7, "positive")
    d = np.concatenate([random_matrix(100, 64, 8, "positive"), q[::3] * 1.5])
    got = nk.maxsim(q, d, name, capabilities=family)
    assert_score_close(got, reference_maxsim(q, d, name), RTOL[name], f"{family.name.lower()} {name}")
