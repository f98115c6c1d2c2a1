"""numkong.pylate: PyLate's rerank / colbert_scores arguments and structures on exact MaxSim.

Most tests need neither pylate nor torch; the comparison with pylate.rank.rerank and
pylate.scores.colbert_scores runs where pylate is installed (tools/install_slow_tier.sh installs it)."""
import math

import numpy as np
import pytest

import numkong as nk
from conftest import reference_cosines
from numkong import pylate as nkp

DEPTH = 64


def unit_rows(x):
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


def embeddings(rows, seed, depth=DEPTH):
    """Unit-normalized float32 token embeddings, as ColBERT models emit them."""
    rng = np.random.default_rng([rows, depth, seed])
    return unit_rows(rng.standard_normal((rows, depth))).astype(np.float32)


def similarity(query, document):
    """Sum over query rows of the largest cosine over document rows, in float64 on the given values."""
    cosines = reference_cosines(np.asarray(query, dtype=np.float64), np.asarray(document, dtype=np.float64))
    return math.fsum(cosines.max(axis=1))


def pad(matrices):
    """A zero-padded [n, longest, depth] batch and its [n, longest] mask."""
    longest = max(m.shape[0] for m in matrices)
    batch = np.zeros((len(matrices), longest, matrices[0].shape[1]), dtype=matrices[0].dtype)
    mask = np.zeros((len(matrices), longest), dtype=np.int64)
    for i, m in enumerate(matrices):
        batch[i, :len(m)] = m
        mask[i, :len(m)] = 1
    return batch, mask


@pytest.fixture(scope="module")
def case():
    """Two queries with their own candidate documents (ids of mixed kinds, lengths 3..40)."""
    queries = [embeddings(8, 1), embeddings(5, 2)]
    documents = [[embeddings(n, 10 + n) for n in (3, 17, 40, 9)], [embeddings(n, 20 + n) for n in (12, 4, 25)]]
    ids = [["a", "b", "c", "d"], [7, 3, 11]]
    return ids, queries, documents


def expected_ranking(ids, queries, documents):
    out = []
    for query_ids, query, candidates in zip(ids, queries, documents):
        scores = [similarity(query, document) for document in candidates]
        order = sorted(range(len(scores)), key=lambda i: -scores[i])
        out.append([(query_ids[i], scores[i]) for i in order])
    return out


def assert_results(got, expected, rtol=1e-12):
    assert isinstance(got, list) and len(got) == len(expected)
    for query_results, query_expected in zip(got, expected):
        assert isinstance(query_results, list)
        assert [r["id"] for r in query_results] == [e[0] for e in query_expected]
        for result, (_, score) in zip(query_results, query_expected):
            assert set(result) == {"id", "score"} and isinstance(result["score"], float)
            assert abs(result["score"] - score) <= rtol * max(1.0, abs(score)), (result, score)
        scores = [r["score"] for r in query_results]
        assert scores == sorted(scores, reverse=True)


# ---- rerank without pylate ----

def test_rerank_lists_of_arrays(case):
    ids, queries, documents = case
    assert_results(nkp.rerank(ids, queries, documents), expected_ranking(ids, queries, documents))


def test_rerank_scores_are_query_count_minus_maxsim(case):
    ids, queries, documents = case
    results = nkp.rerank(ids, queries, documents, threads=1)
    for query_ids, query, candidates, query_results in zip(ids, queries, documents, results):
        by_id = {r["id"]: r["score"] for r in query_results}
        for document_id, document in zip(query_ids, candidates):
            assert by_id[document_id] == len(query) - nk.maxsim(query, document)


def test_rerank_single_query_matrix_and_padded_batches(case):
    ids, queries, documents = case
    expected = expected_ranking(ids, queries, documents)
    assert_results(nkp.rerank(ids[:1], queries[0], documents[:1]), expected[:1])  # one [tokens, dim] query
    batches = [pad(candidates) for candidates in documents]
    assert_results(nkp.rerank(ids[:1], np.stack(queries[:1]), [batches[0][0]], documents_mask=[batches[0][1]]),
                   expected[:1])
    assert_results(nkp.rerank(ids, queries, [b for b, _ in batches], documents_mask=[m for _, m in batches]),
                   expected)


def test_padding_rows_never_count_when_masked():
    # Every cosine of the query row with the real document rows is negative: a zero padding row (cosine 0)
    # would win the max if it counted, as it does in PyLate's own padding.
    query = np.array([[1.0, 0.0]], dtype=np.float32)
    document = np.array([[-1.0, 0.2], [-0.5, -1.0]], dtype=np.float32)
    other = np.array([[-1.0, 0.1], [-1.0, 0.0], [-0.9, -0.1]], dtype=np.float32)
    batch, mask = pad([document, other])
    masked = nkp.rerank([["short", "long"]], [query], [batch], documents_mask=[mask])
    alone = nkp.rerank([["short", "long"]], [query], [[document, other]])
    assert masked == alone
    assert masked[0][0]["score"] == pytest.approx(similarity(query, document), abs=1e-12)
    assert masked[0][0]["score"] < 0
    unmasked = nkp.rerank([["short", "long"]], [query], [batch])  # the padding row is a real zero row here
    assert {r["id"]: r["score"] for r in unmasked[0]}["short"] == 0.0


def test_masks_that_are_not_a_prefix_and_torch_style_float_masks():
    document = embeddings(6, 3)
    query = embeddings(4, 4)
    mask = np.array([1.0, 0.0, 1.0, 1.0, 0.0, 1.0])
    result = nkp.colbert_scores(query[None], document[None], documents_mask=mask[None])
    assert result[0, 0] == pytest.approx(similarity(query, document[mask != 0]), abs=1e-12)


def test_query_mask_rows_add_nothing():
    query, document = embeddings(6, 5), embeddings(9, 6)
    mask = np.array([[1, 1, 0, 1, 0, 0]])
    got = nkp.colbert_scores(query[None], [document], queries_mask=mask)
    assert got[0, 0] == pytest.approx(similarity(query[[0, 1, 3]], document), abs=1e-12)
    ranked = nkp.rerank([["x"]], query[None], [[document]], queries_mask=mask)
    assert ranked[0][0]["score"] == pytest.approx(got[0, 0], abs=1e-12)


def test_four_dimensional_padded_documents(case):
    ids, queries, documents = case
    batches = [pad(candidates) for candidates in documents[:1]] * 2
    stacked = np.stack([b for b, _ in batches])
    masks = np.stack([m for _, m in batches])
    ids2 = [ids[0], ids[0]]
    expected = expected_ranking(ids2, queries, [documents[0], documents[0]])
    assert_results(nkp.rerank(ids2, np.stack([queries[0], queries[0]]), stacked, documents_mask=masks),
                   [expected[0], expected[0]])


def test_ties_keep_the_documents_order():
    query, document = embeddings(4, 7), embeddings(10, 8)
    result = nkp.rerank([[5, 1, 9]], [query], [[document, document.copy(), document[::-1].copy()]])
    assert [r["id"] for r in result[0]] == [5, 1, 9]


def test_nested_lists_of_floats():
    query, document = embeddings(3, 9), embeddings(5, 10)
    result = nkp.rerank([["only"]], query.tolist(), [[document.tolist()]])
    assert result[0][0]["score"] == pytest.approx(similarity(query, document), abs=1e-12)


def test_packed_documents_are_reused(case):
    ids, queries, documents = case
    corpora = [nkp.pack_documents(candidates) for candidates in documents]
    assert all(isinstance(c, nk.MaxSimPackedCorpus) for c in corpora)
    assert nkp.rerank(ids, queries, corpora) == nkp.rerank(ids, queries, documents)
    batch, mask = pad(documents[0])
    assert bytes(memoryview(nkp.pack_documents(batch, mask))) == bytes(memoryview(corpora[0]))


def test_colbert_scores_matrix(case):
    _, queries, documents = case
    got = nkp.colbert_scores(queries, documents[0])
    assert got.shape == (2, 4) and got.dtype == np.float64
    for i, query in enumerate(queries):
        for j, document in enumerate(documents[0]):
            assert got[i, j] == pytest.approx(similarity(query, document), abs=1e-12)
    batch, mask = pad(documents[0])
    assert np.array_equal(nkp.colbert_scores(np.stack([queries[0]]), batch, documents_mask=mask), got[:1])


def test_no_queries_give_an_empty_matrix():
    documents = [embeddings(5, 21), embeddings(3, 22)]
    assert nkp.colbert_scores([], documents).shape == (0, 2)
    assert nkp.colbert_scores([], nkp.pack_documents(documents)).shape == (0, 2)
    with pytest.raises(ValueError, match="no documents"):
        nkp.colbert_scores([embeddings(2, 23)], [])


def test_empty_candidate_lists_and_wider_dtypes():
    query = embeddings(4, 11).astype(np.float64)
    assert nkp.rerank([[]], [query], [[]]) == [[]]
    document = embeddings(6, 12).astype(np.float16)
    result = nkp.rerank([["d"]], [query], [[document]])  # packed in float64, holding both exactly
    assert result[0][0]["score"] == pytest.approx(similarity(query, document), abs=1e-12)


@pytest.mark.parametrize("call, match", [
    (lambda q, d: nkp.rerank([["a"]], [q, q], [[d], [d]]), "2 queries, 1 lists of documents_ids"),
    (lambda q, d: nkp.rerank([["a", "b"]], [q], [[d]]), "2 documents_ids but 1 documents"),
    (lambda q, d: nkp.rerank([["a"]], [q], [[d]], device="cuda"), "numkong scores on the CPU"),
    (lambda q, d: nkp.rerank([["a"]], [q], [[d[:0]]]), "document 0 has no rows"),
    (lambda q, d: nkp.rerank([["a"]], [q], [d[None]], documents_mask=[np.zeros((1, 5))]), "no rows"),
    (lambda q, d: nkp.rerank([["a"]], [q], [d[None]], documents_mask=[np.ones((1, 4))]), "one entry per token"),
    (lambda q, d: nkp.colbert_scores(q, d[None]), "pass \\[queries, tokens, dim\\]"),
    (lambda q, d: nkp.colbert_scores(q[None], d), "pass \\[documents, tokens, dim\\]"),
    (lambda q, d: nkp.colbert_scores(q[None], d[None], documents_mask=np.ones((2, 5))), "2 entries for 1"),
])
def test_errors_say_how_to_fix_the_call(call, match):
    with pytest.raises(ValueError, match=match):
        call(embeddings(3, 13), embeddings(5, 14))


def test_integer_embeddings_need_a_dtype():
    q = np.ones((2, 4), dtype=np.int8)
    with pytest.raises(TypeError, match="pass dtype="):
        nkp.rerank([["a"]], [q], [[q]])
    assert nkp.rerank([["a"]], [q], [[q]], dtype="float32")[0][0]["score"] == pytest.approx(2.0)


def test_no_torch_or_pylate_import():
    import subprocess
    import sys
    code = ("import sys, numkong.pylate; "
            "print(sorted(m for m in ('torch', 'pylate') if m in sys.modules))")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "[]"


# ---- torch inputs (skipped without torch) ----

@pytest.mark.extras
def test_torch_tensors_and_masks():
    torch = pytest.importorskip("torch")
    queries = [embeddings(8, 15)]
    documents = [embeddings(n, 16 + n) for n in (5, 30)]
    batch, mask = pad(documents)
    expected = nkp.rerank([["x", "y"]], queries, [documents])
    got = nkp.rerank([["x", "y"]], torch.from_numpy(np.stack(queries)), [torch.from_numpy(batch)],
                     documents_mask=[torch.from_numpy(mask).bool()])
    assert got == expected
    listed = nkp.rerank([["x", "y"]], [torch.from_numpy(queries[0])], [[torch.from_numpy(d) for d in documents]])
    assert listed == expected
    bf16 = nkp.colbert_scores([torch.from_numpy(queries[0]).bfloat16()], [torch.from_numpy(d).bfloat16()
                                                                           for d in documents])
    stored = [t.float().numpy() for t in [torch.from_numpy(m).bfloat16() for m in queries + documents]]
    assert bf16[0, 1] == pytest.approx(similarity(stored[0], stored[2]), abs=1e-12)


# ---- against pylate itself (skipped without pylate) ----

def pylate_case(seed, queries=3, documents=40):
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(seed)
    query_list = [torch.from_numpy(embeddings(32, seed * 100 + i, 128)) for i in range(queries)]
    document_lists = [[torch.from_numpy(embeddings(int(rng.integers(30, 181)), seed * 1000 + 50 * i + j, 128))
                       for j in range(documents)] for i in range(queries)]
    ids = [[f"q{i}d{j}" for j in range(documents)] for i in range(queries)]
    return ids, query_list, document_lists


def float32_tolerance(query_rows, depth):
    """Float32 rounding of PyLate's sum of max dot products of unit rows: each dot is within depth * 2^-24
    (relative, |q||d| = 1), the sum of query_rows of them within query_rows * 2^-24 more."""
    return query_rows * (depth + query_rows) * 2.0 ** -24


@pytest.mark.parametrize("seed", [1, 2, 3])
@pytest.mark.extras
def test_rerank_matches_pylate(seed):
    rank = pytest.importorskip("pylate.rank")
    ids, queries, documents = pylate_case(seed)
    theirs = rank.rerank(documents_ids=ids, queries_embeddings=queries, documents_embeddings=documents)
    ours = nkp.rerank(ids, queries, documents, threads=2)
    tolerance = float32_tolerance(32, 128)
    for their_results, our_results in zip(theirs, ours):
        assert [r["id"] for r in our_results] == [r["id"] for r in their_results]
        for mine, reference in zip(our_results, their_results):
            assert abs(mine["score"] - reference["score"]) <= tolerance, (mine, reference)


@pytest.mark.extras
def test_colbert_scores_match_pylate_with_masks():
    scores = pytest.importorskip("pylate.scores")
    torch = pytest.importorskip("torch")
    ids, queries, documents = pylate_case(4, queries=2, documents=12)
    batch, mask = pad([d.numpy() for d in documents[0]])
    theirs = scores.colbert_scores(torch.stack(queries), torch.from_numpy(batch),
                                   documents_mask=torch.from_numpy(mask).float())
    ours = nkp.colbert_scores(torch.stack(queries), torch.from_numpy(batch), documents_mask=torch.from_numpy(mask))
    assert ours.shape == tuple(theirs.shape)
    assert np.max(np.abs(ours - theirs.double().numpy())) <= float32_tolerance(32, 128)


# ---- packing on several threads ----

def test_sharded_packing_gives_the_same_scores():
    # 60 documents x 100..139 rows x 128: enough stored elements for shards on 2 and 3 threads.
    query = embeddings(32, 17, 128)
    documents = [embeddings(100 + n % 40, 100 + n, 128) for n in range(60)]
    ids = [list(range(60))]
    single = nkp.rerank(ids, [query], [documents], threads=1)
    for threads in (2, 3):
        assert nkp.rerank(ids, [query], [documents], threads=threads) == single
    scores = nkp.colbert_scores([query, query[:5]], documents, threads=3)
    assert np.array_equal(scores[0], [r["score"] for r in sorted(single[0], key=lambda r: r["id"])])


def test_sharded_packing_names_the_bad_document_by_its_index():
    documents = [embeddings(120, 200 + n, 128) for n in range(40)]
    documents[33] = documents[33].copy()
    documents[33][7, 3] = np.nan
    with pytest.raises(ValueError, match="document 33: row 7 contains NaN"):
        nkp.rerank([list(range(40))], [embeddings(8, 18, 128)], [documents], threads=2)


@pytest.mark.parametrize("threads, error", [(0, ValueError), (-1, ValueError), (1.5, TypeError), (True, TypeError)])
def test_threads_must_be_a_positive_int(threads, error):
    documents = [embeddings(5, 19)]
    with pytest.raises(error, match="threads"):
        nkp.rerank([["a"]], [embeddings(3, 20)], [documents], threads=threads)


# ---- tensors read and scored in chunks by the worker threads ----

def streamed_case(torch, count=None):
    count = count or 2 * nkp._STREAM_DOCUMENTS + 5
    query = torch.from_numpy(embeddings(32, 21, 128))
    documents = [torch.from_numpy(embeddings(1 + n % 90, 300 + n, 128)) for n in range(count)]
    return query, documents, [list(range(count))]


@pytest.mark.extras
def test_streamed_tensors_score_as_the_general_path(monkeypatch):
    torch = pytest.importorskip("torch")
    query, documents, ids = streamed_case(torch)
    streamed = nkp._streamed_distances([query.numpy()], documents, None, 2)
    assert streamed is not None and streamed.shape == (1, len(documents))
    ranked = nkp.rerank(ids, [query], [documents], threads=2)
    monkeypatch.setattr(nkp, "_STREAM_DOCUMENTS", 10 ** 9)  # the general path only
    assert nkp._streamed_distances([query.numpy()], documents, None, 2) is None
    assert nkp.rerank(ids, [query], [documents], threads=2) == ranked
    general = nkp.colbert_scores([query], documents, threads=2)
    assert np.array_equal(32.0 - streamed, general)


@pytest.mark.extras
def test_streamed_path_leaves_unusual_calls_to_the_general_path():
    torch = pytest.importorskip("torch")
    query, documents, ids = streamed_case(torch)
    mixed = list(documents)
    mixed[70] = mixed[70].half()  # float16 among float32: packed as float32 by the general path
    assert nkp._streamed_distances([query.numpy()], mixed, None, 2) is None
    expected = nkp.colbert_scores([query.numpy()], [d.numpy() for d in mixed], threads=1)
    assert np.array_equal(nkp.colbert_scores([query], mixed, threads=2), expected)
    assert nkp._streamed_distances([query.numpy()], documents, None, 1) is None  # one thread: nothing to overlap
    assert nkp._streamed_distances([query.numpy()], documents, "float16", 2) is None
    bad = list(documents)
    bad[77] = bad[77].clone()
    bad[77][0, 5] = float("nan")
    with pytest.raises(ValueError, match="document 77"):
        nkp.rerank(ids, [query], [bad], threads=2)
    bad[77] = documents[77][:0]
    with pytest.raises(ValueError, match="document 77 has no rows"):
        nkp.rerank(ids, [query], [bad], threads=2)


def test_numpy_dtype_objects_choose_the_packing_dtype():
    query = embeddings(8, 22)
    documents = [embeddings(n, 23 + n) for n in (3, 9)]
    named = nkp.colbert_scores([query], documents, dtype="float16")
    assert np.array_equal(nkp.colbert_scores([query], documents, dtype=np.dtype("float16")), named)
    assert not np.array_equal(nkp.colbert_scores([query], documents), named)


def test_thread_pools_are_kept_and_a_forked_child_starts_its_own(monkeypatch):
    pool = nkp._pool(2)
    assert nkp._pool(2) is pool
    monkeypatch.setattr(nkp, "_POOLS_PID", [-1])  # as a forked child sees its parent's pid
    assert nkp._pool(2) is not pool
