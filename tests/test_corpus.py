"""Packed corpora: layout, persistence, batched scoring, top-k, threads, distribution, bad input."""
import os
import pickle
import subprocess
import sys

import numpy as np
import pytest

import numkong as nk

HERE = os.path.dirname(os.path.abspath(__file__))
FAMILIES = [c for c in nk.Capability if c & nk.get_capabilities()]


def _documents(count=40, depth=64, low=1, high=90, seed=0, dtype=np.float32):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal((int(n), depth)).astype(dtype) for n in rng.integers(low, high, count)]


@pytest.fixture(scope="module")
def corpus_case():
    documents = _documents()
    rng = np.random.default_rng(1)
    query = nk.maxsim_pack(rng.standard_normal((32, 64)).astype(np.float32))
    return documents, query, nk.maxsim_pack_corpus(documents)


def test_layout_attributes(corpus_case):
    documents, _, corpus = corpus_case
    lengths = [len(d) for d in documents]
    assert len(corpus) == corpus.documents == len(documents)
    assert corpus.lengths.tolist() == lengths
    assert corpus.total_vectors == sum(lengths)
    assert corpus.depth == 64 and corpus.dtype == "float32"
    assert corpus.nbytes == nk.MaxSimPackedCorpus.pack_size(lengths, 64, dtype="float32")
    assert memoryview(corpus).nbytes == corpus.nbytes and memoryview(corpus).readonly
    assert "documents=40" in repr(corpus) and "float32" in repr(corpus)
    # No padding to the longest document: bytes grow with the total row count, not documents x max length.
    padded = nk.MaxSimPackedCorpus.pack_size([max(lengths)] * len(lengths), 64, dtype="float32")
    assert corpus.nbytes < 0.75 * padded


@pytest.mark.parametrize("family", FAMILIES, ids=lambda c: c.name.lower())
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "e4m3", "float64"])
def test_scores_equal_pairwise_maxsim_packed(family, dtype):
    documents = _documents(count=25, depth=33, seed=3)
    rng = np.random.default_rng(4)
    query = nk.maxsim_pack(rng.standard_normal((7, 33)), dtype=dtype)
    corpus = nk.maxsim_pack_corpus(documents, dtype=dtype)
    scores = nk.maxsim_packed_corpus(query, corpus, capabilities=family, threads=2)
    expected = [nk.maxsim_packed(query, nk.maxsim_pack(d, dtype=dtype), capabilities=family) for d in documents]
    assert scores.dtype == np.float64 and scores.shape == (25,)
    assert scores.tolist() == expected  # bit-identical, not approximately equal


def test_flat_tokens_with_offsets_equal_list(corpus_case):
    documents, query, corpus = corpus_case
    offsets = np.cumsum([0] + [len(d) for d in documents])
    flat = nk.maxsim_pack_corpus(np.concatenate(documents), offsets=offsets)
    assert bytes(memoryview(flat)) == bytes(memoryview(corpus))


def test_several_queries_give_2d(corpus_case):
    documents, query, corpus = corpus_case
    other = nk.maxsim_pack(np.random.default_rng(9).standard_normal((5, 64)).astype(np.float32))
    scores = nk.maxsim_packed_corpus([query, other], corpus)
    assert scores.shape == (2, len(documents))
    assert scores[0].tolist() == nk.maxsim_packed_corpus(query, corpus).tolist()
    assert scores[1].tolist() == nk.maxsim_packed_corpus(other, corpus).tolist()
    indices, best = nk.maxsim_packed_corpus([query, other], corpus, top_k=4)
    assert indices.shape == best.shape == (2, 4)


def test_top_k_best_first_ties_by_index():
    rng = np.random.default_rng(5)
    base = [rng.standard_normal((3, 16)).astype(np.float32) for _ in range(4)]
    documents = [base[0], base[1], base[0], base[2], base[0].copy(), base[3]]  # documents 0, 2, 4 tie
    query = nk.maxsim_pack(base[0][:2])
    corpus = nk.maxsim_pack_corpus(documents)
    scores = nk.maxsim_packed_corpus(query, corpus)
    indices, best = nk.maxsim_packed_corpus(query, corpus, top_k=4)
    assert indices[:3].tolist() == [0, 2, 4]
    assert best.tolist() == sorted(scores.tolist())[:4]
    assert np.all(np.diff(best) >= 0)
    full, _ = nk.maxsim_packed_corpus(query, corpus, top_k=len(documents))
    assert sorted(full.tolist()) == list(range(len(documents)))


def test_results_independent_of_thread_count(corpus_case):
    _, query, corpus = corpus_case
    reference = nk.maxsim_packed_corpus(query, corpus, threads=1)
    for threads in (2, 3, 64):
        assert nk.maxsim_packed_corpus(query, corpus, threads=threads).tolist() == reference.tolist()


@pytest.mark.parametrize("protocol", [2, 4, 5])
def test_pickle_round_trip(corpus_case, protocol):
    _, query, corpus = corpus_case
    loaded = pickle.loads(pickle.dumps(corpus, protocol=protocol))
    assert bytes(memoryview(loaded)) == bytes(memoryview(corpus))
    assert nk.maxsim_packed_corpus(query, loaded).tolist() == nk.maxsim_packed_corpus(query, corpus).tolist()


def test_pickle_protocol5_buffer_is_out_of_band_and_not_copied(corpus_case):
    _, _, corpus = corpus_case
    buffers = []
    stream = pickle.dumps(corpus, protocol=5, buffer_callback=buffers.append)
    assert len(buffers) == 1 and len(stream) < 1024  # the payload is not in the stream
    raw = buffers[0].raw()
    assert np.shares_memory(np.frombuffer(raw, np.uint8), np.frombuffer(memoryview(corpus), np.uint8))
    # Loading from an aligned out-of-band buffer views it instead of copying.
    aligned = np.frombuffer(memoryview(corpus), np.uint8)
    loaded = pickle.loads(stream, buffers=[aligned])
    assert not loaded.owns_data
    assert np.shares_memory(np.frombuffer(memoryview(loaded), np.uint8), aligned)


def test_save_and_memory_map(tmp_path, corpus_case):
    _, query, corpus = corpus_case
    path = tmp_path / "corpus.nkc"
    corpus.save(path)
    mapped = nk.MaxSimPackedCorpus.load(path)
    assert not mapped.owns_data  # a view of the memory map, not a copy
    in_memory = nk.MaxSimPackedCorpus.load(path, mmap=False)
    expected = nk.maxsim_packed_corpus(query, corpus).tolist()
    assert nk.maxsim_packed_corpus(query, mapped).tolist() == expected
    assert nk.maxsim_packed_corpus(query, in_memory).tolist() == expected


# nk_corpus_header_t (format version 3): magic[8], version u32, dtype u32, then u64 depth, documents,
# total_vectors, capabilities, nbytes, table_offset, checksum; documents from byte 128, the table after.
OFFSET_DOCUMENTS, OFFSET_TABLE, OFFSET_CHECKSUM = 24, 56, 64


def _u64(data, at):
    return int.from_bytes(data[at:at + 8], "little")


def _damaged(corpus, damage):
    data = bytearray(memoryview(corpus))
    table = _u64(data, OFFSET_TABLE)
    first_document = _u64(data, table)
    if damage == "magic":
        data[0] ^= 0xFF
    elif damage == "documents":
        data[OFFSET_DOCUMENTS:OFFSET_DOCUMENTS + 8] = (10 ** 12).to_bytes(8, "little")
    elif damage == "table_offset":
        data[table + 16:table + 24] = (5).to_bytes(8, "little")  # document 1's offset
    elif damage == "length":
        data[table + 8:table + 16] = (10 ** 15).to_bytes(8, "little")  # document 0's row count
    elif damage == "value_nan":
        data[first_document + 128:first_document + 132] = np.array([np.nan], np.float32).tobytes()
    elif damage == "screen":
        errors_offset = _u64(data, first_document + 80)
        data[first_document + errors_offset + 2] ^= 0x40  # document 0's first screening error bound
    elif damage in ("prescreen_code", "prescreen_error"):  # after document 0's matrix (maxsim_internal.h)
        matrix_bytes, vectors, screen_depth = (_u64(data, first_document + at) for at in (40, 16, 96))
        tiles, pairs = (vectors + 15) // 16, ((screen_depth // 4 + 15) // 16 + 1) // 2
        at = first_document + matrix_bytes + (5 if damage == "prescreen_code" else tiles * (1024 * pairs + 64) + 2)
        data[at] ^= 0x01 if damage == "prescreen_code" else 0x40
    elif damage == "checksum":
        data[OFFSET_CHECKSUM] ^= 0x01
    elif damage == "truncate":
        data = data[:-64]
    elif damage == "extend":
        data += bytes(64)
    elif damage == "empty":
        data = bytearray()
    return data


@pytest.mark.parametrize("damage", ["magic", "documents", "table_offset", "length", "value_nan", "screen",
                                    "prescreen_code", "prescreen_error", "checksum", "truncate", "extend", "empty"])
def test_corrupt_files_are_clear_errors(tmp_path, corpus_case, damage):
    _, _, corpus = corpus_case
    data = _damaged(corpus, damage)
    path = tmp_path / "bad.nkc"
    path.write_bytes(bytes(data))
    for verify in (True, "all"):
        with pytest.raises(ValueError, match="corrupt packed corpus"):
            nk.MaxSimPackedCorpus.load(path, verify=verify)
    stream = pickle.dumps(corpus, protocol=5, buffer_callback=lambda buffer: None)
    with pytest.raises(ValueError, match="corrupt packed corpus"):
        pickle.loads(stream, buffers=[bytes(data)])


@pytest.mark.parametrize("damage", ["value_nan", "screen", "prescreen_code", "prescreen_error"])
def test_full_verification_refuses_damage_behind_a_valid_checksum(tmp_path, corpus_case, damage):
    """A checksum recomputed over damaged bytes (not corruption: forgery) passes verify=True, but
    verify="all" re-derives every section from the stored values and refuses it."""
    _, _, corpus = corpus_case
    data = _damaged(corpus, damage)
    data[OFFSET_CHECKSUM:OFFSET_CHECKSUM + 8] = nk._maxsim._checksum(bytes(data[128:])).to_bytes(8, "little")
    path = tmp_path / "forged.nkc"
    path.write_bytes(bytes(data))
    nk.MaxSimPackedCorpus.load(path)  # the checksum matches
    with pytest.raises(ValueError, match="corrupt packed corpus"):
        nk.MaxSimPackedCorpus.load(path, verify="all")


@pytest.mark.parametrize("damage", ["magic", "documents", "table_offset", "length", "truncate", "extend"])
def test_unverified_load_still_checks_the_layout(tmp_path, corpus_case, damage):
    _, _, corpus = corpus_case
    path = tmp_path / "bad.nkc"
    path.write_bytes(bytes(_damaged(corpus, damage)))
    with pytest.raises(ValueError, match="corrupt packed corpus"):
        nk.MaxSimPackedCorpus.load(path, verify=False)


def test_verify_levels(tmp_path, corpus_case):
    _, query, corpus = corpus_case
    path = tmp_path / "corpus.nkc"
    corpus.save(path)
    expected = nk.maxsim_packed_corpus(query, corpus).tolist()
    for verify in (True, False, "all"):
        assert nk.maxsim_packed_corpus(query, nk.MaxSimPackedCorpus.load(path, verify=verify)).tolist() == expected
    with pytest.raises(ValueError, match="verify must be"):
        nk.MaxSimPackedCorpus.load(path, verify="checksum")


def _unaligned(matrix, offset=1):
    """A copy of `matrix` at `offset` bytes into a byte buffer (rows contiguous, not aligned)."""
    raw = np.zeros(matrix.nbytes + offset, np.uint8)
    view = raw[offset:].view(matrix.dtype).reshape(matrix.shape)
    view[...] = matrix
    return view


def _odd_rows(matrix):
    """A copy of `matrix` whose rows are one byte more than their length apart (the first row aligned)."""
    row_bytes = matrix.shape[1] * matrix.itemsize
    raw = np.zeros(matrix.shape[0] * (row_bytes + 1), np.uint8)
    view = np.ndarray(matrix.shape, matrix.dtype, buffer=raw, strides=(row_bytes + 1, matrix.itemsize))
    view[...] = matrix
    return view


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.float64])
def test_sources_in_place_or_converted(dtype):
    """Aligned documents are read in place and unaligned ones through a copy (alone, after aligned ones of
    their dtype, rows an odd number of bytes apart, a 1-row document): every mix packs the same bytes."""
    documents = _documents(count=6, depth=12, dtype=dtype)
    documents[3] = documents[3][:1]
    expected = bytes(memoryview(nk.maxsim_pack_corpus(documents, dtype="float32")))
    mixes = [
        [_unaligned(d) for d in documents],
        documents[:2] + [_unaligned(d) for d in documents[2:]],
        [d if i % 2 else _unaligned(d, 3) for i, d in enumerate(documents)],
        documents[:4] + [_odd_rows(documents[4])] + documents[5:],
    ]
    # Formats mixed in one batch: each keeps its own source code (values that float16 holds exactly).
    halves = [d.astype(np.float16) for d in documents]
    expected_halves = bytes(memoryview(nk.maxsim_pack_corpus(halves, dtype="float32")))
    mixed = [h if i % 2 else h.astype(dtype) for i, h in enumerate(halves)]
    assert bytes(memoryview(nk.maxsim_pack_corpus(mixed, dtype="float32"))) == expected_halves
    for mix in mixes:
        assert all(np.array_equal(a, b) for a, b in zip(mix, documents))
        assert any(not d.flags.aligned for d in mix)
        assert bytes(memoryview(nk.maxsim_pack_corpus(mix, dtype="float32"))) == expected


def test_first_document_of_a_bad_dtype_is_named():
    documents = _documents(count=4, depth=8)
    with pytest.raises(TypeError, match="document 2 has integer dtype int32"):
        nk.maxsim_pack_corpus(documents[:2] + [np.ones((2, 8), np.int32), np.ones((2, 8), np.int64)])
    with pytest.raises(TypeError, match="document 1 has integer dtype int64"):
        nk.maxsim_pack_corpus([documents[0], np.ones((2, 8), np.int64), np.ones((2, 8), np.int32)])


def test_bad_input():
    documents = _documents(count=3, depth=8)
    corpus = nk.maxsim_pack_corpus(documents)
    query = nk.maxsim_pack(documents[0])
    with pytest.raises(ValueError, match="document 1 has depth 9 but document 0 has depth 8"):
        nk.maxsim_pack_corpus([documents[0], np.ones((2, 9), np.float32)])
    with pytest.raises(ValueError, match="no documents"):
        nk.maxsim_pack_corpus([])
    with pytest.raises(ValueError, match="document 1 has no rows"):
        nk.maxsim_pack_corpus([documents[0], np.ones((0, 8), np.float32)])
    with pytest.raises(ValueError, match="offsets"):
        nk.maxsim_pack_corpus(np.ones((5, 8), np.float32), offsets=[0, 2, 4])
    with pytest.raises(ValueError, match="row 2 contains NaN"):
        nk.maxsim_pack_corpus([documents[0], np.array([[1.0] * 8, [2.0] * 8, [np.nan] * 8], np.float32)])
    for top_k in (0, -1, 4):
        with pytest.raises(ValueError, match="top_k must be between 1 and the corpus's 3 documents"):
            nk.maxsim_packed_corpus(query, corpus, top_k=top_k)
    with pytest.raises(TypeError, match="top_k"):
        nk.maxsim_packed_corpus(query, corpus, top_k=1.5)
    for threads in (0, -2):
        with pytest.raises(ValueError, match="threads must be at least 1"):
            nk.maxsim_packed_corpus(query, corpus, threads=threads)
    with pytest.raises(TypeError, match="queries were packed as bfloat16 but the corpus as float32"):
        nk.maxsim_packed_corpus(nk.maxsim_pack(documents[0], dtype="bf16"), corpus)
    with pytest.raises(ValueError, match="depth"):
        nk.maxsim_packed_corpus(nk.maxsim_pack(np.ones((2, 9), np.float32)), corpus)
    with pytest.raises(TypeError, match="MaxSimPackedMatrix"):
        nk.maxsim_packed_corpus(documents[0], corpus)
    with pytest.raises(ValueError, match="stream"):
        nk.maxsim_packed_corpus(query, corpus, stream=1)
    with pytest.raises(TypeError):
        nk.MaxSimPackedCorpus()
