"""Corpora at scale: streaming and parallel packing, progress, the appendable writer, memory bounds."""
import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import numkong as nk


def _documents(count=300, depth=24, seed=0, dtype=np.float32):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal((int(n), depth)).astype(dtype) for n in rng.integers(1, 60, count)]


@pytest.fixture(scope="module")
def documents():
    return _documents()


@pytest.fixture(scope="module")
def packed(documents):
    return bytes(memoryview(nk.maxsim_pack_corpus(documents, threads=1)))


@pytest.mark.parametrize("threads", [1, 2, 3, 64])
def test_parallel_packing_gives_the_same_bytes(documents, packed, threads):
    assert bytes(memoryview(nk.maxsim_pack_corpus(documents, threads=threads))) == packed


@pytest.mark.parametrize("kind", ["generator", "iterator", "tuple", "map"])
def test_any_iterable(documents, packed, kind):
    source = {"generator": lambda: (d for d in documents), "iterator": lambda: iter(documents),
              "tuple": lambda: tuple(documents), "map": lambda: map(np.asarray, documents)}[kind]()
    assert bytes(memoryview(nk.maxsim_pack_corpus(source, threads=2))) == packed


def test_generators_longer_than_a_batch():
    """Several batches (a batch ends at 4,096 documents) append in order."""
    documents = _documents(count=9000, depth=8, seed=3)
    streamed = nk.maxsim_pack_corpus((d for d in documents), threads=2)
    assert bytes(memoryview(streamed)) == bytes(memoryview(nk.maxsim_pack_corpus(documents)))
    assert streamed.lengths.tolist() == [len(d) for d in documents]


def test_generator_format_comes_from_its_first_document():
    rows = np.random.default_rng(1).standard_normal((3, 8))
    corpus = nk.maxsim_pack_corpus(d for d in [rows.astype(np.float16), rows.astype(np.float16)])
    assert corpus.dtype == "float16"
    with pytest.raises(ValueError, match="document 1 is float32, which float16 .* does not hold exactly; pass dtype="):
        nk.maxsim_pack_corpus(d for d in [rows.astype(np.float16), rows.astype(np.float32)])
    assert nk.maxsim_pack_corpus((d for d in [rows.astype(np.float16), rows.astype(np.float32)]),
                                 dtype="float32").dtype == "float32"


def test_generator_errors_name_the_document():
    rows = np.ones((2, 8), np.float32)
    with pytest.raises(ValueError, match="document 2 has no rows"):
        nk.maxsim_pack_corpus(d for d in [rows, rows, rows[:0]])
    with pytest.raises(ValueError, match="document 1 has depth 9 but document 0 has depth 8"):
        nk.maxsim_pack_corpus(d for d in [rows, np.ones((2, 9), np.float32)])
    bad = rows.copy()
    bad[1, 3] = np.nan
    with pytest.raises(ValueError, match="document 5: row 1 contains NaN or infinity"):
        nk.maxsim_pack_corpus((d for d in [rows] * 5 + [bad]), threads=2)
    with pytest.raises(ValueError, match="no documents"):
        nk.maxsim_pack_corpus(d for d in [])


def test_progress_callable_and_update_objects(documents):
    calls = []
    nk.maxsim_pack_corpus(documents, progress=lambda done, total: calls.append((done, total)))
    assert calls[-1] == (len(documents), len(documents))

    class Bar:
        n = 0

        def update(self, count):
            self.n += count

    bar = Bar()
    nk.maxsim_pack_corpus((d for d in documents), progress=bar)
    assert bar.n == len(documents)
    seen = []
    nk.maxsim_pack_corpus((d for d in documents), progress=lambda done, total: seen.append(total))
    assert seen and all(total is None for total in seen)  # a generator has no length
    with pytest.raises(TypeError, match="progress must be"):
        nk.maxsim_pack_corpus(documents, progress=42)


def test_threads_are_checked(documents):
    for threads in (0, -1):
        with pytest.raises(ValueError, match="threads must be at least 1"):
            nk.maxsim_pack_corpus(documents, threads=threads)
    with pytest.raises(TypeError, match="threads"):
        nk.maxsim_pack_corpus(documents, threads=1.5)


def test_writer_builds_the_same_file_batch_by_batch(tmp_path, documents, packed):
    path = tmp_path / "corpus.nkc"
    with nk.MaxSimCorpusWriter(path, threads=2) as writer:
        for start in range(0, len(documents), 70):
            writer.append(documents[start:start + 70])
        assert writer.documents == len(documents)
        assert not path.exists()  # it appears when finished
    assert path.read_bytes() == packed
    loaded = nk.MaxSimPackedCorpus.load(path)
    assert len(loaded) == len(documents)


def test_writer_takes_every_input_kind(tmp_path):
    rng = np.random.default_rng(2)
    batch = rng.standard_normal((3, 5, 16)).astype(np.float32)
    tokens = rng.standard_normal((9, 16)).astype(np.float32)
    path = tmp_path / "mixed.nkc"
    with nk.MaxSimCorpusWriter(path, dtype="bfloat16") as writer:
        writer.append(batch, lengths=[5, 2, 4])
        writer.append(tokens, offsets=[0, 4, 9])
        writer.append(d for d in [tokens[:1]])
    expected = [batch[0, :5], batch[1, :2], batch[2, :4], tokens[:4], tokens[4:], tokens[:1]]
    assert path.read_bytes() == bytes(memoryview(nk.maxsim_pack_corpus(expected, dtype="bfloat16")))


def test_writer_discards_on_error_and_keeps_the_old_file(tmp_path, documents):
    path = tmp_path / "corpus.nkc"
    path.write_bytes(b"old contents")
    bad = np.full((2, 24), np.nan, np.float32)
    with pytest.raises(ValueError, match="contains NaN"):
        with nk.MaxSimCorpusWriter(path) as writer:
            writer.append(documents[:10])
            writer.append([bad])
    assert path.read_bytes() == b"old contents"
    assert sorted(os.listdir(tmp_path)) == ["corpus.nkc"]
    writer = nk.MaxSimCorpusWriter(tmp_path / "never.nkc")
    writer.append(documents[:3])
    writer.abort()
    assert sorted(os.listdir(tmp_path)) == ["corpus.nkc"]
    with pytest.raises(ValueError, match="closed"):
        writer.append(documents[:3])
    with pytest.raises(ValueError, match="no documents"):
        with nk.MaxSimCorpusWriter(tmp_path / "empty.nkc"):
            pass
    assert sorted(os.listdir(tmp_path)) == ["corpus.nkc"]


PEAK = r"""
import json, resource, sys
import numpy as np
import numkong as nk
documents, depth = int(sys.argv[1]), 128
rng = np.random.default_rng(0)
lengths = rng.integers(32, 96, documents)
warm = nk.maxsim_pack_corpus([rng.standard_normal((4, depth)).astype(np.float16)])  # imports, first calls
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
corpus = nk.maxsim_pack_corpus((rng.standard_normal((int(n), depth)).astype(np.float16) for n in lengths), threads=2)
after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
print(json.dumps({"packed": corpus.nbytes, "grew": after - before}))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads the peak RSS of a Linux process")
def test_streaming_a_generator_holds_little_more_than_the_output(tmp_path):
    """A generator of 8,000 documents (about 130 MB packed): the process grows by at most 1.25x the
    packed size (the output, one batch of input and its packing, no second copy of the output)."""
    run = subprocess.run([sys.executable, "-c", PEAK, "8000"], capture_output=True, text=True, cwd=str(tmp_path),
                         timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    result = json.loads(run.stdout)
    assert result["grew"] <= 1.25 * result["packed"], result
