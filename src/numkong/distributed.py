"""Exact MaxSim top-k over a sharded corpus on a Dask cluster.

A sharded corpus is a directory: ``manifest.json`` and shard files, each a corpus file written by
MaxSimCorpusWriter. Every Dask worker memory-maps the shards it is given from storage that all
hosts see (a shared filesystem, an object store mount), so nothing large goes through the scheduler:
only shard paths, the packed queries and the per-shard top-k lists travel.

    from numkong import distributed
    distributed.write_sharded_corpus("corpus/", documents, shard_documents=100_000)

    from dask.distributed import Client
    client = Client("tcp://scheduler:8786")
    indices, scores = distributed.search(client, "corpus/", queries, k=10)

Install with ``pip install 'numkong[dask]'``. Results equal numkong.maxsim_packed_corpus(query,
whole_corpus, top_k=k) bit for bit: every shard scores its documents exactly, and the shard lists
merge by (score, global document index).
"""
import json
import os
import tempfile

import numpy as np

import numkong as _nk

__all__ = ["ShardedCorpus", "write_sharded_corpus", "search"]

MANIFEST = "manifest.json"
MANIFEST_FORMAT = "numkong-sharded-corpus"
MANIFEST_VERSION = 1


def write_sharded_corpus(directory, documents, *, shard_documents=100_000, dtype=None, threads=None, progress=None,
                         capabilities=None):
    """Pack `documents` (any iterable of 2-D matrices, streamed) into shards of `shard_documents` in
    `directory`, created if needed, and write its manifest last. progress: as in maxsim_pack_corpus
    (a callable gets (done, None)). Returns the ShardedCorpus."""
    if isinstance(shard_documents, bool) or not isinstance(shard_documents, (int, np.integer)) or shard_documents < 1:
        raise ValueError(f"shard_documents must be a positive int, not {shard_documents!r}")
    os.makedirs(directory, exist_ok=True)
    done = 0

    def report(count):
        nonlocal done
        done += count
        if progress is None:
            return
        progress.update(count) if hasattr(progress, "update") else progress(done, None)

    class _Counter:  # the writers' progress, added up over the shards
        update = staticmethod(report)

    shards, writer, batch, first = [], None, [], 0

    def flush():
        writer.append(batch)
        batch.clear()

    def finish():
        nonlocal writer, first, dtype
        count = writer.documents
        writer.close()
        shards.append({"file": f"shard-{len(shards):05d}.nkc", "first_document": first, "documents": count})
        if dtype is None:  # every shard in the format the first one inferred
            dtype = _nk.MaxSimPackedCorpus.load(os.path.join(directory, shards[0]["file"]), verify=False).dtype
        first += count
        writer = None

    try:
        for document in documents:
            if writer is None:
                writer = _nk.MaxSimCorpusWriter(os.path.join(directory, f"shard-{len(shards):05d}.nkc"), dtype=dtype,
                                                threads=threads, capabilities=capabilities, progress=_Counter())
            batch.append(document)
            if writer.documents + len(batch) == shard_documents:
                flush()
                finish()
            elif len(batch) == 4096:
                flush()
        if writer is not None:
            flush()
            finish()
    except BaseException:
        if writer is not None:
            writer.abort()
        raise
    if not shards:
        raise ValueError("the corpus has no documents; pass at least one")
    first_shard = _nk.MaxSimPackedCorpus.load(os.path.join(directory, shards[0]["file"]), verify=False)
    manifest = {"format": MANIFEST_FORMAT, "version": MANIFEST_VERSION, "documents": first, "depth": first_shard.depth,
                "dtype": first_shard.dtype, "shards": shards}
    _write_atomically(os.path.join(directory, MANIFEST), json.dumps(manifest, indent=1).encode())
    return ShardedCorpus(directory)


def _write_atomically(path, data):
    handle, temporary = tempfile.mkstemp(prefix="." + os.path.basename(path) + ".", dir=os.path.dirname(path) or ".")
    try:
        with open(handle, "wb") as file:
            file.write(data)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, path)
    except BaseException:
        try:
            os.unlink(temporary)
        except OSError:
            pass
        raise


class ShardedCorpus:
    """A sharded corpus directory, read from its manifest (the shards themselves are opened by whoever
    scores them)."""

    def __init__(self, directory):
        self.directory = os.fspath(directory)
        path = os.path.join(self.directory, MANIFEST)
        try:
            with open(path) as file:
                manifest = json.load(file)
        except FileNotFoundError:
            raise ValueError(f"{self.directory!r} has no {MANIFEST}; write it with write_sharded_corpus") from None
        if manifest.get("format") != MANIFEST_FORMAT or manifest.get("version") != MANIFEST_VERSION:
            raise ValueError(f"{path!r} is not a version {MANIFEST_VERSION} {MANIFEST_FORMAT} manifest")
        self.documents, self.depth, self.dtype = manifest["documents"], manifest["depth"], manifest["dtype"]
        self.shards = manifest["shards"]
        if sum(shard["documents"] for shard in self.shards) != self.documents:
            raise ValueError(f"{path!r} is inconsistent: its shards do not add up to {self.documents} documents")

    def __len__(self):
        return self.documents

    def shard_path(self, index):
        return os.path.join(self.directory, self.shards[index]["file"])

    def __repr__(self):
        return (f"ShardedCorpus({self.directory!r}, documents={self.documents}, shards={len(self.shards)}, "
                f"depth={self.depth}, dtype={self.dtype!r})")


# Shards a worker process has mapped, by path (a mapping holds no file descriptor; a replaced file
# keeps its old mapping until the entry is reloaded because its identity changed).
_MAPPED = {}


def _mapped_shard(path, verify):
    status = os.stat(path)
    key = (path, status.st_ino, status.st_size, status.st_mtime_ns)
    corpus = _MAPPED.get(path)
    if corpus is None or corpus[0] != key:
        corpus = (key, _nk.MaxSimPackedCorpus.load(path, verify=verify))
        _MAPPED[path] = corpus
    return corpus[1]


def _search_shard(path, first_document, queries, k, threads, verify):
    """On a worker: the top-k of each packed query over one shard, with global document indices."""
    shard = _mapped_shard(path, verify)
    indices, scores = _nk.maxsim_packed_corpus(list(queries), shard, top_k=min(k, len(shard)), threads=threads)
    return indices + first_document, scores


def merge_top_k(results, k):
    """Merge per-shard (indices [queries, k_s], scores [queries, k_s]) into the global k best per query:
    lowest score first, ties by global index."""
    indices = np.concatenate([part for part, _ in results], axis=1)
    scores = np.concatenate([part for _, part in results], axis=1)
    merged_indices = np.empty((indices.shape[0], min(k, indices.shape[1])), dtype=np.int64)
    merged_scores = np.empty(merged_indices.shape, dtype=np.float64)
    for row in range(indices.shape[0]):
        order = np.lexsort((indices[row], scores[row]))[:merged_indices.shape[1]]
        merged_indices[row], merged_scores[row] = indices[row, order], scores[row, order]
    return merged_indices, merged_scores


def search(client, corpus, queries, k, *, threads_per_shard=1, verify=True, query_batch=64):
    """Exact top-k of every query over a sharded corpus on a Dask cluster.

    client: a dask.distributed.Client. corpus: a ShardedCorpus or its directory, at the same path on
    every worker. queries: one query matrix or a list of them (arrays, tensors, or MaxSimPackedMatrix);
    packed here in the corpus's dtype and sent to the workers in batches of `query_batch`. Each shard
    is scored by one task on the worker that first mapped it (shard i goes to worker i modulo the
    workers, so repeated searches reuse the mapping). Returns (indices, scores) as
    maxsim_packed_corpus(top_k=k) would over the whole corpus: [k] for one query, [queries, k] for a list.
    """
    if not isinstance(corpus, ShardedCorpus):
        corpus = ShardedCorpus(corpus)
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or not 1 <= k <= len(corpus):
        raise ValueError(f"k must be between 1 and the corpus's {len(corpus)} documents, got {k!r}")
    single = not isinstance(queries, (list, tuple))
    packed = [query if isinstance(query, _nk.MaxSimPackedMatrix) else _nk.maxsim_pack(query, dtype=corpus.dtype)
              for query in ([queries] if single else queries)]
    workers = sorted(client.scheduler_info()["workers"])
    batches = []
    for start in range(0, len(packed), query_batch):
        # hash=False: content-derived keys would let a later search reuse the key of an earlier one's
        # scattered query, which the scheduler may be releasing meanwhile ('lost dependencies').
        remote = client.scatter(packed[start:start + query_batch], broadcast=True, hash=False)
        # Shards spread over the workers the scheduler knows, a hint only; with none known at the moment
        # (a worker restarting), the scheduler places them.
        futures = [client.submit(_search_shard, corpus.shard_path(i), shard["first_document"], remote, k,
                                 threads_per_shard, verify, pure=False,
                                 **({"workers": [workers[i % len(workers)]], "allow_other_workers": True}
                                    if workers else {}))
                   for i, shard in enumerate(corpus.shards)]
        batches.append(merge_top_k(client.gather(futures), k))
    indices = np.concatenate([part for part, _ in batches])
    scores = np.concatenate([part for _, part in batches])
    return (indices[0], scores[0]) if single else (indices, scores)
