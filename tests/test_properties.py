"""Hypothesis properties of MaxSim, for a few packing dtypes and every kernel family:
document-row permutation invariance, additivity over query rows, maxsim(Q, Q) ~ 0, and invariance
to scaling a row by a positive factor (exactly for powers of two, within rounding otherwise)."""
import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import numkong as nk
from conftest import FAMILY_PARAMS, RTOL, assert_score_close, dtype_params, inverse_norms, reference_maxsim, stored_values

PROPERTY_DTYPES = dtype_params(["float64", "float32", "bfloat16", "float16", "e4m3", "e2m3"])

# Modest and reproducible (derandomized): the same examples on every run.
PROPERTY_SETTINGS = settings(max_examples=25, deadline=None, derandomize=True,
                             suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@st.composite
def problems(draw, zero_rows=True):
    """(queries, documents) float64 matrices: random shapes and depths, a seed, optional zero rows,
    optional per-row magnitudes over many orders of magnitude."""
    queries = draw(st.integers(1, 12))
    documents = draw(st.integers(1, 40))
    depth = draw(st.sampled_from([1, 2, 3, 4, 5, 8, 15, 16, 17, 31, 64, 100, 130]))
    seed = draw(st.integers(0, 2 ** 32 - 1))
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((queries, depth))
    d = rng.standard_normal((documents, depth))
    if draw(st.booleans()):
        q *= 10.0 ** rng.uniform(-6, 6, (queries, 1))
        d *= 10.0 ** rng.uniform(-6, 6, (documents, 1))
    if zero_rows and draw(st.booleans()):
        q[rng.integers(queries)] = 0.0
        d[rng.integers(documents)] = 0.0
    return q, d


def _score(q, d, name, family):
    return nk.maxsim(q, d, name, capabilities=family)


@pytest.mark.parametrize("family", FAMILY_PARAMS)
@pytest.mark.parametrize("name", PROPERTY_DTYPES)
@PROPERTY_SETTINGS
@given(problem=problems(), permutation_seed=st.integers(0, 2 ** 32 - 1))
def test_document_permutation_invariance(name, family, problem, permutation_seed):
    q, d = problem
    permutation = np.random.default_rng(permutation_seed).permutation(len(d))
    expected = _score(q, d, name, family)
    assert_score_close(_score(q, d[permutation], name, family), expected, 1e-12, "permuted documents")
    assert_score_close(expected, reference_maxsim(q, d, name), RTOL[name], "reference")


@pytest.mark.parametrize("family", FAMILY_PARAMS)
@pytest.mark.parametrize("name", PROPERTY_DTYPES)
@PROPERTY_SETTINGS
@given(problem=problems())
def test_sum_over_single_row_queries(name, family, problem):
    q, d = problem
    total = _score(q, d, name, family)
    rows = [_score(q[i:i + 1], d, name, family) for i in range(len(q))]
    assert all(0.0 <= r <= 2.0 for r in rows)
    assert_score_close(total, math.fsum(rows), 1e-12, "sum of single-row queries")
    # Query order does not matter either.
    assert_score_close(_score(q[::-1], d, name, family), total, 1e-12, "reversed queries")


@pytest.mark.parametrize("family", FAMILY_PARAMS)
@pytest.mark.parametrize("name", PROPERTY_DTYPES)
@PROPERTY_SETTINGS
@given(problem=problems())
def test_self_similarity_is_near_zero(name, family, problem):
    """maxsim(Q, Q): every nonzero row finds itself (cos 1); a zero row contributes exactly 1."""
    q, _ = problem
    zero = int(np.sum(~np.any(q != 0, axis=1)))
    got = _score(q, q, name, family)
    assert got >= zero
    assert got - zero <= len(q) * RTOL[name]
    # Against a superset of documents as well.
    assert _score(q, np.concatenate([problem[1], q]), name, family) - zero <= len(q) * RTOL[name]


@st.composite
def row_scalings(draw, power_of_two):
    problem = draw(problems(zero_rows=False))
    side = draw(st.sampled_from(["queries", "documents"]))
    rows = len(problem[0] if side == "queries" else problem[1])
    row = draw(st.integers(0, rows - 1))
    if power_of_two:
        factor = 2.0 ** draw(st.integers(-30, 30))
    else:
        factor = draw(st.floats(0.01, 100.0, allow_nan=False, allow_infinity=False).filter(lambda f: f != 1.0))
    return problem, side, row, factor


def _scaled(problem, side, row, factor):
    q, d = (np.array(m) for m in problem)
    (q if side == "queries" else d)[row] *= factor
    return q, d


@pytest.mark.parametrize("family", FAMILY_PARAMS)
@pytest.mark.parametrize("name", PROPERTY_DTYPES)
@PROPERTY_SETTINGS
@given(case=row_scalings(power_of_two=True))
def test_power_of_two_row_scaling_is_exact(name, family, case):
    problem, side, row, factor = case
    q, d = _scaled(*case)
    assert _score(q, d, name, family) == _score(*problem, name, family)


@pytest.mark.parametrize("family", FAMILY_PARAMS)
@pytest.mark.parametrize("name", PROPERTY_DTYPES)
@PROPERTY_SETTINGS
@given(case=row_scalings(power_of_two=False))
def test_row_scaling_within_rounding(name, family, case):
    """Scaling a row by any positive factor changes only how it rounds: the score moves by at most
    the change of that row's stored direction (distance is 1-Lipschitz in each cosine, and a cosine
    with a unit vector moves by at most the distance between the two unit rows)."""
    problem, side, row, factor = case
    q, d = _scaled(*case)
    before = _score(*problem, name, family)
    after = _score(q, d, name, family)
    original = problem[0] if side == "queries" else problem[1]
    changed = q if side == "queries" else d
    a = stored_values(original[row:row + 1], name)
    b = stored_values(changed[row:row + 1], name)
    moved = float(np.linalg.norm(a * inverse_norms(a)[:, None] - b * inverse_norms(b)[:, None]))
    affected = 1 if side == "queries" else len(q)  # a document row can be the best for every query
    bound = affected * moved + len(q) * 4 * RTOL[name]
    assert abs(after - before) <= bound, f"moved {abs(after - before):.3g} > bound {bound:.3g}"
    if name in ("float64", "float32"):
        assert abs(after - before) <= len(q) * 1e-6
