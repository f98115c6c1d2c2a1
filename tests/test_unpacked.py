"""Float32 documents scored where they are (numkong._maxsim_unpacked, used by numkong.pylate): the same
bits as packing each document as float32 and scoring it, on every AVX-512 family; NaN for a document it
leaves to packing; None where no AVX-512 family is available."""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import numkong as nk
from numkong import pylate as nkp
from numkong._maxsim import _maxsim_unpacked
from conftest import AVAILABLE_FAMILIES

AVX512 = nk.Capability.SKYLAKE | nk.Capability.ICELAKE | nk.Capability.GENOA | nk.Capability.SAPPHIREAMX
SCREENING = [cap for cap in AVAILABLE_FAMILIES if cap & AVX512]
OTHERS = [cap for cap in AVAILABLE_FAMILIES if not cap & AVX512]
needs_avx512 = pytest.mark.skipif(not SCREENING, reason="no AVX-512 family on this CPU")


def _packed_scores(query, documents):
    packed = nk.maxsim_pack(query)
    return np.array([nk.maxsim_packed(packed, nk.maxsim_pack(np.ascontiguousarray(d))) for d in documents])


def _assert_same_bits(query, documents, family=None):
    """Unpacked scores of every document equal, byte for byte, those of packing it."""
    got = _maxsim_unpacked(nk.maxsim_pack(query), documents, capabilities=family)
    assert got.tobytes() == _packed_scores(query, documents).tobytes()


def _near_ties(rng, query, rows):
    """Document rows whose cosines with some query row differ from each other by about 1e-7, below what
    float32 screening tells apart: picking the largest takes the exact rescoring of every close one."""
    depth = query.shape[1]
    out = rng.standard_normal((rows, depth)).astype(np.float32)
    for i in range(0, rows - 1, 2):
        base = query[rng.integers(0, query.shape[0])].astype(np.float64)
        for j in (i, i + 1):
            out[j] = (base + 3e-4 * rng.standard_normal(depth)).astype(np.float32)
    return out


@needs_avx512
@pytest.mark.parametrize("family", SCREENING, ids=lambda c: c.name.lower())
@pytest.mark.parametrize("depth", [1, 3, 17, 129, 1000])
@pytest.mark.parametrize("query_rows", [1, 16, 17, 33, 70])
def test_same_bits_as_packing(family, depth, query_rows):
    rng = np.random.default_rng(depth * 100 + query_rows)
    query = rng.standard_normal((query_rows, depth)).astype(np.float32)
    query[query_rows // 2] = 0.0  # a zero query row adds exactly 1
    documents = [rng.standard_normal((rows, depth)).astype(np.float32) for rows in (1, 7, 8, 9, 180)]
    documents[1][3] = 0.0  # a zero document row has cosine 0
    documents[2] = np.concatenate([documents[2], query[:3]])  # exact ties: cosine 1
    documents[3] = _near_ties(rng, query, 24)
    documents.append(rng.standard_normal((40, depth)).astype(np.float32) * np.float32(2.0 ** -30))
    documents.append(rng.standard_normal((5, depth)).astype(np.float32) * np.float32(2.0 ** 50))
    _assert_same_bits(query, documents, family)


@needs_avx512
@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2 ** 32 - 1), depth=st.integers(1, 160), query_rows=st.integers(1, 40),
       rows=st.lists(st.integers(1, 40), min_size=1, max_size=4), ties=st.booleans())
def test_property_same_bits(seed, depth, query_rows, rows, ties):
    rng = np.random.default_rng(seed)
    query = rng.standard_normal((query_rows, depth)).astype(np.float32)
    documents = [_near_ties(rng, query, n) if ties else rng.standard_normal((n, depth)).astype(np.float32)
                 for n in rows]
    _assert_same_bits(query, documents)


@needs_avx512
def test_strided_documents():
    """Rows in reverse order (a negative stride) and rows inside wider ones (a row stride above the depth)."""
    rng = np.random.default_rng(5)
    query = rng.standard_normal((20, 24)).astype(np.float32)
    wide = rng.standard_normal((50, 40)).astype(np.float32)
    _assert_same_bits(query, [wide[::-1, :24], wide[:, 8:32], wide[::3, 16:], np.ascontiguousarray(wide[:, :24])])


@needs_avx512
def test_query_longer_than_every_document():
    """The query's rows are checked into scratch sized by its row count too (1-row documents)."""
    rng = np.random.default_rng(9)
    _assert_same_bits(rng.standard_normal((300, 16)).astype(np.float32),
                      [rng.standard_normal((1, 16)).astype(np.float32) for _ in range(3)])


@needs_avx512
def test_every_row_a_candidate():
    """Rows that tie for every query row: thousands of candidate pairs per group, rescored in batches."""
    rng = np.random.default_rng(13)
    query = rng.standard_normal((40, 64)).astype(np.float32)
    query[5] = 0.0
    row = rng.standard_normal(64).astype(np.float32)
    ties = np.repeat(row[None], 150, axis=0)
    ties[::7] *= np.float32(2.0)  # the same direction, other norms
    _assert_same_bits(query, [ties, np.concatenate([ties, query[:3]])])


@needs_avx512
def test_left_to_packing():
    """NaN for every document it cannot screen exactly or read in place; the others are scored."""
    rng = np.random.default_rng(7)
    query = rng.standard_normal((4, 8)).astype(np.float32)
    good = rng.standard_normal((3, 8)).astype(np.float32)
    raw = np.zeros(3 * 8 * 4 + 1, np.uint8)
    unaligned = raw[1:].view(np.float32).reshape(3, 8)
    unaligned[...] = good
    with_nan = good.copy()
    with_nan[1, 2] = np.nan
    with_inf = good.copy()
    with_inf[0, 0] = np.inf
    tiny_row = good.copy()  # one tiny row beside a zero row: the zero row is scored, the tiny one is not
    tiny_row[0] = -0.0
    tiny_row[2] *= np.float32(2.0 ** -61)
    documents = [good, good * np.float32(2.0 ** 60), good * np.float32(2.0 ** -61), tiny_row, with_nan, with_inf,
                 good.astype(np.float64), good[:, :4], np.asfortranarray(good), unaligned, good[:0],
                 good.tolist(), good.astype('>f4'), good]
    got = _maxsim_unpacked(nk.maxsim_pack(query), documents)
    expected = _packed_scores(query, [good])[0]
    assert got[0] == got[-1] == expected
    zero_row = good.copy()
    zero_row[1] = -0.0
    _assert_same_bits(query, [zero_row, np.zeros((2, 8), np.float32)])
    # Every value below 2^56 but a row's sum of squares above 2^120 (1024 x 1.5^2 x 2^110 = 2^121.2).
    deep_query = rng.standard_normal((4, 1024)).astype(np.float32)
    loud = np.full((2, 1024), np.float32(1.5 * 2.0 ** 55))
    assert np.isnan(_maxsim_unpacked(nk.maxsim_pack(deep_query), [loud])).all()
    _assert_same_bits(deep_query, [loud * np.float32(2.0 ** -2)])  # 2^117.2: screened
    assert np.isnan(got[1:-1]).all()
    # The query itself out of range: nothing is scored.
    assert np.isnan(_maxsim_unpacked(nk.maxsim_pack(query * np.float32(2.0 ** 62)), [good])).all()
    # Queries packed in another format, or capabilities without AVX-512: not this path.
    assert _maxsim_unpacked(nk.maxsim_pack(query, dtype="float16"), [good]) is None
    for family in OTHERS:
        assert _maxsim_unpacked(nk.maxsim_pack(query), [good], capabilities=family) is None
    assert _maxsim_unpacked(nk.maxsim_pack(query), []).shape == (0,)


@pytest.mark.parametrize("threads", [1, 2])
def test_pylate_scores_unpacked_and_packed_alike(threads):
    """numkong.pylate scores raw float32 documents (unpacked where it can, packed otherwise) with the
    bits of documents packed ahead, and a NaN document still names its index."""
    rng = np.random.default_rng(3)
    queries = [rng.standard_normal((n, 64)).astype(np.float32) for n in (5, 32)]
    documents = [rng.standard_normal((int(n), 64)).astype(np.float32) for n in rng.integers(1, 300, 60)]
    documents[7] = documents[7] * np.float32(2.0 ** 70)  # packed instead, same bits
    ahead = nkp.colbert_scores(queries, nkp.pack_documents(documents), threads=threads)
    raw = nkp.colbert_scores(queries, documents, threads=threads)
    assert raw.tobytes() == ahead.tobytes()
    documents[41] = documents[41].copy()
    documents[41][0, 0] = np.nan
    with pytest.raises(ValueError, match="document 41"):
        nkp.colbert_scores(queries, documents, threads=threads)
