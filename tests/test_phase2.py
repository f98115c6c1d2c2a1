"""The issue's items for the Cython core: dtype spellings, readable masks, clearer errors, corpus
access and padded batches."""
import gc
import io

import numpy as np
import pytest

import numkong as nk
from conftest import random_matrix

# ---- dtype aliases and suggestions ----

@pytest.mark.parametrize("alias, name", [("fp16", "float16"), ("half", "float16"), ("double", "float64"), ("float8_e4m3fn", "e4m3"), ("fp8_e5m2", "e5m2"),
                                         ("float6_e2m3fn", "e2m3"), ("fp32", "float32")])
def test_every_spelling_of_a_format_is_a_dtype_alias(alias, name):
    assert nk.maxsim_pack(random_matrix(3, 8, 0), dtype=alias).dtype == name


@pytest.mark.extras
def test_torch_dtypes_are_dtype_aliases():
    torch = pytest.importorskip("torch")
    for dtype, name in ((torch.bfloat16, "bfloat16"), (torch.float16, "float16"), (torch.float8_e4m3fn, "e4m3")):
        assert nk.maxsim_pack(random_matrix(3, 8, 0), dtype=dtype).dtype == name


def test_float_alone_is_ambiguous():
    with pytest.raises(ValueError, match="ambiguous"):
        nk.maxsim_pack(random_matrix(3, 8, 0), dtype="float")


def test_unknown_dtype_suggests_the_closest_name():
    with pytest.raises(ValueError, match="bfloat16"):
        nk.maxsim_pack(random_matrix(3, 8, 0), dtype="bfloat61")
    with pytest.raises(ValueError, match="did you mean"):
        nk.maxsim_pack(random_matrix(3, 8, 0), dtype="flaot32")


# ---- readable capability masks ----

def test_capability_str_names_the_families():
    mask = nk.get_capabilities()
    text = str(mask)
    assert not text.isdigit()
    for capability in nk.Capability:
        assert (capability.name.lower() in text.lower()) == bool(mask & capability)


# ---- clearer errors ----

def test_maxsim_packed_of_arrays_says_to_pack_first():
    x = np.ones((2, 4), dtype=np.float32)
    with pytest.raises(TypeError, match=r"maxsim_pack\(\)|maxsim\("):
        nk.maxsim_packed(x, x)


def test_three_dimensional_input_gets_no_single_vector_advice():
    with pytest.raises(ValueError) as error:
        nk.maxsim(np.ones((2, 3, 4)), np.ones((3, 4)))
    assert "x[None, :]" not in str(error.value)


# ---- corpus access ----

def corpus_and_documents():
    documents = [np.asarray(random_matrix(n, 16, 40 + n), dtype=np.float32) for n in (3, 9, 1)]
    return nk.maxsim_pack_corpus(documents), documents


def test_corpus_item_is_the_packed_document_sharing_the_buffer():
    corpus, documents = corpus_and_documents()
    base = np.frombuffer(memoryview(corpus), dtype=np.uint8).__array_interface__["data"][0]
    for index in range(len(corpus)):
        item = corpus[index]
        assert isinstance(item, nk.MaxSimPackedMatrix)
        assert bytes(memoryview(item)) == bytes(memoryview(nk.maxsim_pack(documents[index])))
        address = np.frombuffer(memoryview(item), dtype=np.uint8).__array_interface__["data"][0]
        assert base <= address < base + corpus.nbytes
    assert bytes(memoryview(corpus[-1])) == bytes(memoryview(corpus[2]))
    with pytest.raises(IndexError):
        corpus[3]


def test_corpus_iterates_over_its_documents():
    corpus, documents = corpus_and_documents()
    assert [item.shape for item in corpus] == [d.shape for d in documents]


def test_corpus_document_returns_the_stored_values():
    corpus, documents = corpus_and_documents()
    for index, document in enumerate(documents):
        stored = corpus.document(index)
        assert stored.dtype == np.float32 and np.array_equal(stored, document)
        assert not stored.flags.writeable
        with pytest.raises(ValueError):
            stored[0, 0] = 1.0


def test_corpus_document_shares_the_document_and_outlives_the_corpus():
    # The values come through the document's buffer (corpus[i]), not the whole corpus's: exporting the
    # corpus would first checksum every byte of a corpus built in memory.
    corpus, documents = corpus_and_documents()
    stored = corpus.document(1)
    owner = stored
    while isinstance(owner, (np.ndarray, memoryview)):
        owner = owner.base if isinstance(owner, np.ndarray) else owner.obj
    assert isinstance(owner, nk.MaxSimPackedMatrix)
    assert bytes(memoryview(owner)) == bytes(memoryview(nk.maxsim_pack(documents[1])))
    start = np.frombuffer(owner, dtype=np.uint8).__array_interface__["data"][0]
    assert start <= stored.__array_interface__["data"][0] < start + owner.nbytes
    del corpus
    gc.collect()
    assert np.array_equal(stored, documents[1])


def test_corpus_save_and_load_binary_files():
    corpus, _ = corpus_and_documents()
    buffer = io.BytesIO()
    corpus.save(buffer)
    buffer.seek(0)
    loaded = nk.MaxSimPackedCorpus.load(buffer)
    assert bytes(memoryview(loaded)) == bytes(memoryview(corpus))


# ---- padded 3-D batches ----

def test_padded_batch_with_lengths_drops_the_padding():
    documents = [np.asarray(random_matrix(n, 16, 50 + n), dtype=np.float32) for n in (3, 7)]
    batch = np.zeros((2, 7, 16), dtype=np.float32)
    for index, document in enumerate(documents):
        batch[index, :len(document)] = document
    corpus = nk.maxsim_pack_corpus(batch, lengths=[3, 7])
    assert bytes(memoryview(corpus)) == bytes(memoryview(nk.maxsim_pack_corpus(documents)))


@pytest.mark.extras
def test_padded_batch_is_treated_alike_for_numpy_and_torch():
    torch = pytest.importorskip("torch")
    batch = np.zeros((2, 5, 8), dtype=np.float32)
    batch[:, :3] = 1.0
    outcomes = []
    for value in (batch, torch.from_numpy(batch)):
        try:
            outcomes.append(bytes(memoryview(nk.maxsim_pack_corpus(value))))
        except (TypeError, ValueError) as error:
            outcomes.append(type(error))
    assert outcomes[0] == outcomes[1]
    assert outcomes[0] in (TypeError, ValueError), "padding rows must not be packed as document rows"
