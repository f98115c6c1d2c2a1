"""The same bits on every kernel family.

Every family follows one canonical evaluation of the exact float64 dot product (16 lane sums, one
halving tree: src/kernels/maxsim_internal.h), so for the same packed operands every family forced
through capabilities= returns the identical float64, on x86 and Arm alike: shards of one corpus
served by different machines rank near-ties the same way. Checked bit for bit (float.hex) for every
dtype, on awkward depths (around and between 16-element steps, many steps, a long row) and row
counts (one and many query rows, one, three and 1,100 document rows), on random, near-tie, outlier and
zero-row data, through maxsim_packed and through a packed corpus; every score also matches the
independent float64 reference.
"""
import functools

import numpy as np
import pytest

import numkong as nk
from conftest import (AVAILABLE_FAMILIES, RTOL, SANITIZED, assert_score_close, dtype_params, reference_maxsim,
                      row_scale_exponents)

DEPTHS = [1, 3, 17, 129, 1000, 4100]
# (query rows, document rows). 32 x 1, and 5 x 3 up to depth 51, are scored pair by pair without the
# screening (src/kernels/driver.h, NK_DRIVER_ALL_PAIRS); 37 x 1 and 5 x 3 deeper are screened.
SHAPES = [(1, 1), (1, 1100), (32, 1), (37, 1), (5, 3), (37, 1100)]
KINDS = ["random", "near_tie", "outlier", "zero_rows"]
# The corpus splits 1,100 document rows into documents of these lengths (one row stays one document).
CORPUS_LENGTHS = [1, 3, 16, 17, 33, 130, 900]


@functools.lru_cache(maxsize=None)
def _data(kind, depth, queries, documents):
    """float64 (queries, documents) of one kind, read-only."""
    rng = np.random.default_rng([KINDS.index(kind), depth, queries, documents])
    q = rng.standard_normal((queries, depth))
    d = rng.standard_normal((documents, depth))
    if kind == "near_tie":
        # Document rows are query rows nudged by 2^-52 .. 2^-10 of themselves (or not at all): the best
        # cosines of a query row differ only in their last bits, where summation order shows.
        nudge = np.ldexp(1.0, -rng.integers(10, 53, size=(documents, 1)))
        nudge[rng.random(documents) < 0.1] = 0.0
        d = q[np.arange(documents) % queries] * (1.0 + nudge * rng.standard_normal((documents, depth)))
    elif kind == "outlier":
        # Transformer-like outlier dimensions, and rows of very different magnitudes.
        for x in (q, d):
            x[:, 5::37] *= 100.0
            x *= np.ldexp(1.0, rng.integers(-30, 31, size=(x.shape[0], 1)))
    elif kind == "zero_rows":
        q[1::3] = 0.0
        d[1::3] = 0.0
        d[2::7] = q[0]  # and exact ties with a query row
    q.setflags(write=False)
    d.setflags(write=False)
    return q, d


def _hex_scores(values):
    return [float(v).hex() for v in values]


def _split(documents):
    lengths = CORPUS_LENGTHS if len(documents) == sum(CORPUS_LENGTHS) else [len(documents)]
    bounds = np.cumsum([0] + lengths)
    return [documents[start:end] for start, end in zip(bounds[:-1], bounds[1:])]


# Under the sanitizers (tools/sanitize.sh) one deep case per dtype is enough to walk the deep paths;
# the bits of the others are checked in the quick tier (the deep cases were 153 of its 381 s there).
_SANITIZED_SKIP = pytest.mark.skipif(SANITIZED, reason="sanitized run: one deep case per dtype")

CASES = [
    pytest.param(depth, shape, kind, id=f"depth{depth}-{shape[0]}x{shape[1]}-{kind}",
                 marks=[_SANITIZED_SKIP] if depth > 1000 and (shape, kind) != ((37, 1100), "random") else [])
    for depth in DEPTHS
    for shape in SHAPES
    for kind in KINDS
] + [
    # Two 64-deep screening steps (the last end-aligned), the query tiles held in sapphireamx's tile
    # registers, and a block of 1,024 documents: its epilogue fused into its tile loop (blocks of 320
    # documents or more, at most two steps); the last 76 documents take the separate epilogue.
    pytest.param(100, (37, 1100), kind, id=f"depth100-37x1100-{kind}")
    for kind in ("random", "near_tie")
]


def _assert_pair_bits(q, d, name):
    """Every available family scores the packed pair with serial's bits, and serial is near the reference."""
    packed_q, packed_d = nk.maxsim_pack(q, name), nk.maxsim_pack(d, name)
    scores = {family.name.lower(): nk.maxsim_packed(packed_q, packed_d, capabilities=family)
              for family in AVAILABLE_FAMILIES}
    serial = scores["serial"]
    assert_score_close(serial, reference_maxsim(q, d, name), RTOL[name], f"serial {name} vs reference")
    different = {family: score.hex() for family, score in scores.items() if score.hex() != serial.hex()}
    assert not different, f"{name}: serial gives {serial.hex()}, but {different}"


@pytest.mark.parametrize("depth, shape, kind", CASES)
@pytest.mark.parametrize("name", dtype_params())
def test_every_family_returns_the_same_bits(name, depth, shape, kind):
    _assert_pair_bits(*_data(kind, depth, *shape), name)


@pytest.mark.parametrize("depth, shape, kind", CASES)
@pytest.mark.parametrize("name", dtype_params())
def test_every_family_returns_the_same_corpus_bits(name, depth, shape, kind):
    q, d = _data(kind, depth, *shape)
    documents = _split(d)
    packed_q = nk.maxsim_pack(q, name)
    corpus = nk.maxsim_pack_corpus(documents, name)
    scores = {family.name.lower(): _hex_scores(nk.maxsim_packed_corpus(packed_q, corpus, capabilities=family))
              for family in AVAILABLE_FAMILIES}
    serial = scores["serial"]
    # The corpus path scores each document as maxsim_packed does (here with the best family, which the
    # test above holds to serial's bits), bit for bit, and near the reference.
    pairs = [nk.maxsim_packed(packed_q, nk.maxsim_pack(document, name)) for document in documents]
    assert serial == _hex_scores(pairs)
    for document, score in zip(documents, pairs):
        assert_score_close(score, reference_maxsim(q, document, name), RTOL[name], f"serial {name} vs reference")
    different = {family: s for family, s in scores.items() if s != serial}
    assert not different, f"{name}: serial gives {serial}, but {different}"


@pytest.mark.parametrize("depth", [1, 17, 129, 1000])
@pytest.mark.parametrize("name", ["bfloat16", "float32"])
def test_products_beyond_float32_range_keep_the_bits(name, depth):
    """Rows of magnitude 2^-70, 1 and 2^70 (stored unscaled in these formats): products of two of them
    over- and underflow float32, where the AVX-512 families multiply bfloat16 pairs before widening
    them (and redo such dot products in float64)."""
    rng = np.random.default_rng(depth)
    scales = np.ldexp(1.0, 70 * (np.arange(40) % 3 - 1))[:, None]
    q = rng.standard_normal((40, depth)) * scales
    d = rng.standard_normal((300, depth)) * np.repeat(scales, 8, axis=0)[:300]
    d[::5] = q[np.arange(60) % 40] * 1.001  # near the query rows: winners at every magnitude
    assert not row_scale_exponents(q, name, casting=True).any()  # the magnitudes are the stored ones
    _assert_pair_bits(q, d, name)
