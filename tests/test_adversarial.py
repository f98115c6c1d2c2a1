"""Adversarial data on which a rough proxy (an int8 copy of the rows, as a screening pass would use)
picks the wrong document row: near-ties, outlier dimensions and planted gaps.

For every query row, the score of the single-row query maxsim(q[i:i+1], D) must equal
max(0, 1 - max_j cos) of the reference within half the gap between the best and the second-best
distinct cosine, so a kernel that returns any other row than a true maximizer fails.
"""
import functools

import numpy as np
import pytest

import numkong as nk
from conftest import (
    DTYPES,
    FAMILY_PARAMS,
    RTOL,
    assert_score_close,
    dtype_params,
    inverse_norms,
    reference_cosines,
    reference_maxsim,
    stored_values,
)

KINDS = ["near_ties", "outliers", "planted"]
# Below this gap between the best and second-best cosine a row cannot tell a wrong argmax from
# float64 rounding, so it is not checked (the tests assert that most rows are far above it).
MIN_GAP = 1e-8


def _near_ties(rng, depth=128, queries=16, documents=200, outliers=False):
    """Every row is one base vector plus small noise, so many documents are within ~1e-4 of the
    best cosine; one document is an exact copy of query 0. With outliers, 4 dimensions are 100x
    larger than the rest and the differences between documents live in the small dimensions."""
    base = rng.standard_normal(depth)
    if outliers:
        base[rng.choice(depth, 4, replace=False)] *= 100
    sigma = 0.03 * np.linalg.norm(base) / np.sqrt(depth)
    q = base + sigma * rng.standard_normal((queries, depth))
    d = base + sigma * rng.standard_normal((documents, depth))
    d[documents // 3] = q[0]
    return q, d


def _planted(rng, depth=128, queries=16, per_query=24, gap=1e-5):
    """For each query, a block of documents with cosines planted at exactly 0.95 (one row at a random
    position) and 0.95 - gap - U(0, 1e-4) (the rest); other blocks are nearly orthogonal to it."""
    q = rng.standard_normal((queries, depth))
    blocks = []
    for row in q:
        unit = row / np.linalg.norm(row)
        cosines = 0.95 - gap - rng.uniform(0, 1e-4, per_query)
        cosines[rng.integers(per_query)] = 0.95
        other = rng.standard_normal((per_query, depth))
        other -= (other @ unit)[:, None] * unit
        other /= np.linalg.norm(other, axis=1)[:, None]
        blocks.append(cosines[:, None] * unit + np.sqrt(1 - cosines * cosines)[:, None] * other)
    return q, np.concatenate(blocks)


@functools.lru_cache(maxsize=None)
def _data(kind):
    rng = np.random.default_rng(["near_ties", "outliers", "planted"].index(kind))
    q, d = _planted(rng) if kind == "planted" else _near_ties(rng, outliers=kind == "outliers")
    q.setflags(write=False)
    d.setflags(write=False)
    return q, d


@functools.lru_cache(maxsize=None)
def _truth(kind, name):
    """Per query row: best cosine, second-best distinct cosine, on the stored values."""
    q, d = _data(kind)
    cos = reference_cosines(stored_values(q, name), stored_values(d, name))
    best = cos.max(axis=1)
    second = np.array([row[row < top].max() if (row < top).any() else -np.inf for row, top in zip(cos, best)])
    return cos, best, second


def _proxy_choice(q_stored, d_stored):
    """What a rough screening proxy would pick: int8 copies of the unit rows (scale absmax / 127)."""
    def quantize(rows):
        unit = rows * inverse_norms(rows)[:, None]
        step = np.abs(unit).max(axis=1) / 127
        step[step == 0] = 1
        return np.rint(unit / step[:, None]), step
    a, step_a = quantize(q_stored)
    b, step_b = quantize(d_stored)
    return ((a @ b.T) * step_a[:, None] * step_b[None, :]).argmax(axis=1)


def check_rows(scores, best, second):
    """Assert each per-row score is 1 - best cosine within half the gap to the second-best; returns
    the number of rows checked."""
    checked = 0
    for i, (score, top, runner_up) in enumerate(zip(scores, best, second)):
        gap = top - runner_up
        if not gap > MIN_GAP:
            continue
        expected = max(0.0, 1.0 - top)
        assert abs(score - expected) < gap / 2, (
            f"query row {i}: score {score!r} is not 1 - best cos = {expected!r} (gap to the second-best "
            f"cosine {gap:.3g}): a wrong document row was chosen")
        checked += 1
    return checked


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("name", dtype_params())
def test_data_is_adversarial(name, kind):
    """The data really defeats a rough proxy, and the gaps are wide enough for the per-row check."""
    q, d = _data(kind)
    cos, best, second = _truth(kind, name)
    choice = _proxy_choice(stored_values(q, name), stored_values(d, name))
    wrong = cos[np.arange(len(q)), choice] < best - MIN_GAP
    # 6-bit formats with outliers flush most small dimensions, leaving fewer near-ties to get wrong.
    needed = 1 if name in ("e2m3", "e3m2") else len(q) // 3
    assert wrong.sum() >= needed, f"the int8 proxy is wrong on only {wrong.sum()} of {len(q)} rows"
    assert np.sum(best - second > MIN_GAP) >= len(q) - 1
    if name in ("float64", "float32", "float16", "bfloat16"):
        # Near-ties: the median query row has several documents within 1e-4 of its best cosine.
        close = (cos >= best[:, None] - 1e-4).sum(axis=1)
        assert np.median(close) >= 8, f"median of {np.median(close)} documents within 1e-4 of the best"
        # Typical gap between best and second best is around 1e-5, far above rounding.
        assert 1e-6 < np.median(best - second) < 1e-4


def test_row_check_rejects_a_wrong_argmax():
    """Self-test of check_rows: the score of the second-best row must be rejected."""
    _, best, second = _truth("planted", "float64")
    check_rows(np.maximum(0.0, 1.0 - best), best, second)
    wrong = np.maximum(0.0, 1.0 - best)
    wrong[5] = 1.0 - second[5]
    with pytest.raises(AssertionError, match="wrong document row"):
        check_rows(wrong, best, second)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("family", FAMILY_PARAMS)
@pytest.mark.parametrize("name", dtype_params())
def test_per_row_best_document_is_the_true_argmax(name, family, kind):
    q, d = _data(kind)
    _, best, second = _truth(kind, name)
    scores = [nk.maxsim(q[i:i + 1], d, name, capabilities=family) for i in range(len(q))]
    checked = check_rows(scores, best, second)
    assert checked >= len(q) - 1
    # Query row 0 has an exact copy among the documents in the near-tie sets: distance 0.
    if kind != "planted":
        assert 0.0 <= scores[0] <= 1e-12
    total = nk.maxsim(q, d, name, capabilities=family)
    assert_score_close(total, reference_maxsim(q, d, name), RTOL[name], f"{family.name.lower()} {name}")
    assert_score_close(total, float(np.sum(scores)), 1e-12, "sum of the per-row scores")


@pytest.mark.parametrize("family", FAMILY_PARAMS)
@pytest.mark.parametrize("name", dtype_params(DTYPES))
def test_best_document_hidden_among_many(name, family):
    """One query, 5000 near-identical documents, the winner at a position no tile boundary helps."""
    rng = np.random.default_rng(11)
    q, d = _planted(rng, depth=96, queries=1, per_query=5000, gap=2e-6)
    cos = reference_cosines(stored_values(q, name), stored_values(d, name))[0]
    best = cos.max()
    runner_up = cos[cos < best].max()
    got = nk.maxsim(q, d, name, capabilities=family)
    if best - runner_up > MIN_GAP:
        assert abs(got - max(0.0, 1.0 - best)) < (best - runner_up) / 2
    assert_score_close(got, reference_maxsim(q, d, name), RTOL[name], name)
