"""Exact top-k over a corpus: equal to scoring every document and a stable sort, for every family,
thread count, query count and k, on data where pruning bites (clustered tokens, near ties, ties)."""
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import numkong as nk

FAMILIES = [c for c in nk.Capability if c & nk.get_capabilities()]


def _clustered(documents, depth=64, centroids=96, seed=0, dtype=np.float32):
    """Tokens near shared centroids (as ColBERT embeddings are), documents of 2-60 tokens."""
    rng = np.random.default_rng(seed)
    center = rng.standard_normal((centroids, depth))
    center /= np.linalg.norm(center, axis=1, keepdims=True)
    out = []
    for n in rng.integers(2, 61, documents):
        tokens = center[rng.integers(0, centroids, n)] + 0.3 * rng.standard_normal((n, depth)) / np.sqrt(depth)
        out.append(tokens.astype(dtype))
    return out


def _queries(documents, count, rows=16, seed=1):
    rng = np.random.default_rng(seed)
    queries = []
    for _ in range(count):
        source = documents[int(rng.integers(0, len(documents)))]
        tokens = source[rng.integers(0, len(source), rows)].astype(np.float64)
        queries.append(tokens + 0.05 * rng.standard_normal(tokens.shape) / np.sqrt(tokens.shape[1]))
    return queries


def _expected(scores, k):
    order = np.argsort(scores, axis=-1, kind="stable")[..., :k]
    return order, np.take_along_axis(scores, order, axis=-1)


@pytest.fixture(scope="module")
def clustered_case():
    documents = _clustered(700)
    return documents, nk.maxsim_pack_corpus(documents), _queries(documents, 5)


@pytest.mark.parametrize("family", FAMILIES, ids=lambda c: c.name.lower())
@pytest.mark.parametrize("k", [1, 3, 10, 699, 700])
def test_top_k_equals_full_scores_and_a_stable_sort(clustered_case, family, k):
    documents, corpus, queries = clustered_case
    packed = [nk.maxsim_pack(q, dtype="float32") for q in queries]
    full = nk.maxsim_packed_corpus(packed, corpus, capabilities=family)
    expected_indices, expected_scores = _expected(full, k)
    for threads in (1, 2, 3):
        indices, scores = nk.maxsim_packed_corpus(packed, corpus, top_k=k, threads=threads, capabilities=family)
        assert np.array_equal(indices, expected_indices) and np.array_equal(scores, expected_scores)
        one_indices, one_scores = nk.maxsim_packed_corpus(packed[2], corpus, top_k=k, threads=threads,
                                                          capabilities=family)
        assert np.array_equal(one_indices, expected_indices[2]) and np.array_equal(one_scores, expected_scores[2])


@pytest.mark.parametrize("dtype", ["float64", "float32", "float16", "bfloat16", "e4m3", "e5m2", "e2m3", "e3m2"])
def test_top_k_in_every_format(clustered_case, dtype):
    documents, _, queries = clustered_case
    corpus = nk.maxsim_pack_corpus(documents, dtype=dtype)
    packed = [nk.maxsim_pack(q, dtype=dtype) for q in queries]
    expected = _expected(nk.maxsim_packed_corpus(packed, corpus), 7)
    indices, scores = nk.maxsim_packed_corpus(packed, corpus, top_k=7, threads=2)
    assert np.array_equal(indices, expected[0]) and np.array_equal(scores, expected[1])


@pytest.mark.parametrize("family", FAMILIES, ids=lambda c: c.name.lower())
def test_queries_of_any_row_count_with_zero_rows(clustered_case, family):
    """The prescreen pass (sapphireamx) bounds a query's first 32 rows; longer queries, zero rows (distance
    1) and one-row queries must still rank exactly."""
    documents, corpus, _ = clustered_case
    queries = []
    for rows, seed in ((1, 2), (31, 3), (33, 4), (40, 5), (64, 6)):
        query = _queries(documents, 1, rows=rows, seed=seed)[0]
        query[rows // 2] = 0.0
        queries.append(nk.maxsim_pack(query, dtype="float32"))
    full = nk.maxsim_packed_corpus(queries, corpus, capabilities=family)
    for k in (1, 10, 40):
        indices, scores = nk.maxsim_packed_corpus(queries, corpus, top_k=k, threads=2, capabilities=family)
        expected = _expected(full, k)
        assert np.array_equal(indices, expected[0]) and np.array_equal(scores, expected[1])


def test_more_queries_than_one_pass_takes(clustered_case):
    """Queries go in passes of at most 64 (fewer for corpora of over 524,288 documents): 70 queries in
    one call rank as each alone."""
    documents, corpus, _ = clustered_case
    queries = [nk.maxsim_pack(q, dtype="float32") for q in _queries(documents, 70, seed=9)]
    full = nk.maxsim_packed_corpus(queries, corpus)
    indices, scores = nk.maxsim_packed_corpus(queries, corpus, top_k=5, threads=2)
    expected = _expected(full, 5)
    assert np.array_equal(indices, expected[0]) and np.array_equal(scores, expected[1])


@pytest.mark.parametrize("family", FAMILIES, ids=lambda c: c.name.lower())
def test_top_k_beyond_the_documents_with_the_lowest_bounds(family):
    """Near copies of one document: their scores differ by far less than the prescreen's quantization
    moves their bounds, so the k + 32 documents with the lowest bounds (scored first on sapphireamx)
    miss most of the k best, and the rest of the search, pruned by the caps those seeds set, must find
    them."""
    rng = np.random.default_rng(12)
    base = rng.standard_normal((20, 64))
    documents = [(base + 1e-3 * rng.standard_normal(base.shape)).astype(np.float32) for _ in range(300)]
    documents += [rng.standard_normal((int(n), 64)).astype(np.float32) for n in rng.integers(3, 40, 100)]
    corpus = nk.maxsim_pack_corpus(documents)
    queries = [nk.maxsim_pack(base[rng.integers(0, 20, rows)] + 0.05 * rng.standard_normal((rows, 64)),
                              dtype="float32") for rows in (8, 32, 40)]
    full = nk.maxsim_packed_corpus(queries, corpus, capabilities=family)
    for k in (1, 5, 20):
        for threads in (1, 2):
            indices, scores = nk.maxsim_packed_corpus(queries, corpus, top_k=k, threads=threads, capabilities=family)
            expected = _expected(full, k)
            assert np.array_equal(indices, expected[0]) and np.array_equal(scores, expected[1])


def test_ties_go_to_the_lower_index():
    rng = np.random.default_rng(3)
    base = [rng.standard_normal((5, 32)).astype(np.float32) for _ in range(6)]
    documents = [base[i % 6] for i in range(120)]  # 20 copies of each document: many exact ties
    corpus = nk.maxsim_pack_corpus(documents)
    query = nk.maxsim_pack(base[2][:3] + 0.01)
    full = nk.maxsim_packed_corpus(query, corpus)
    for k in (1, 5, 20, 21, 45):
        for threads in (1, 2, 4):
            indices, scores = nk.maxsim_packed_corpus(query, corpus, top_k=k, threads=threads)
            expected = _expected(full, k)
            assert np.array_equal(indices, expected[0]) and np.array_equal(scores, expected[1])
    assert nk.maxsim_packed_corpus(query, corpus, top_k=20)[0].tolist() == list(range(2, 120, 6))


def test_long_documents_and_empty_queries():
    rng = np.random.default_rng(4)
    documents = [rng.standard_normal((int(n), 24)).astype(np.float32) for n in (3, 1500, 40, 2100, 7)]
    corpus = nk.maxsim_pack_corpus(documents)  # documents longer than a block: no screening pass
    query = nk.maxsim_pack(documents[3][:6] + 0.01)
    full = nk.maxsim_packed_corpus(query, corpus)
    indices, scores = nk.maxsim_packed_corpus(query, corpus, top_k=3)
    assert np.array_equal(indices, _expected(full, 3)[0]) and np.array_equal(scores, _expected(full, 3)[1])
    empty = nk.maxsim_pack(np.zeros((0, 24), np.float32))
    indices, scores = nk.maxsim_packed_corpus(empty, corpus, top_k=2)
    assert indices.tolist() == [0, 1] and scores.tolist() == [0.0, 0.0]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10 ** 6), k=st.integers(1, 40), threads=st.integers(1, 3),
       spread=st.sampled_from([0.0, 0.01, 0.3, 3.0]), rows=st.integers(1, 40))
def test_top_k_property(seed, k, threads, spread, rows):
    rng = np.random.default_rng(seed)
    center = rng.standard_normal((8, 20))
    documents = [(center[rng.integers(0, 8, int(n))] + spread * rng.standard_normal((int(n), 20))).astype(np.float32)
                 for n in rng.integers(1, 30, 180)]  # k + 32 <= 40 % of them: sapphireamx's prescreen pass
    corpus = nk.maxsim_pack_corpus(documents)
    query = nk.maxsim_pack((center[rng.integers(0, 8, rows)] + spread * rng.standard_normal((rows, 20))), "float32")
    full = nk.maxsim_packed_corpus(query, corpus)
    indices, scores = nk.maxsim_packed_corpus(query, corpus, top_k=k, threads=threads)
    expected = _expected(full, k)
    assert np.array_equal(indices, expected[0]) and np.array_equal(scores, expected[1])
