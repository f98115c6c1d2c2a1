"""PyLate-shaped entry points on numkong's exact MaxSim: rerank() and colbert_scores().

    from numkong import pylate as nkp
    results = nkp.rerank(documents_ids, queries_embeddings, documents_embeddings)

take the arguments of pylate.rank.rerank and pylate.scores.colbert_scores and return their structures,
with ColBERT similarities as scores: for each query row the largest cosine over the document's rows,
summed over query rows (query_count - numkong's MaxSim distance).

Differences from PyLate, all deliberate:
- Cosines, not dot products: the same numbers for the unit-normalized embeddings ColBERT models emit;
  rows that are not normalized are compared by angle.
- Padding never counts. PyLate pads documents with zero rows and multiplies masked similarities by 0,
  so a query row whose cosines are all negative scores 0 against a padded document rather than its
  true (negative) best. Here rows masked out by documents_mask are dropped, and a document given
  alone is never padded. An unmasked all-zero row still has cosine 0 with everything, as in PyLate.
- Scores are float64 (PyLate: float32), exact to float64 accumulation on the values as stored; ties
  keep the input order of the documents.
- Lengths must agree: documents_ids and documents_embeddings of different lengths are a ValueError,
  where PyLate's zip() silently drops the extra ones.
- device may be None or "cpu" only: numkong scores on the CPU.

Neither torch nor pylate is imported: inputs are anything numkong packs (NumPy arrays, torch and other
DLPack tensors read zero-copy, nested lists of floats).
"""
import os as _os
import threading as _threading
from concurrent.futures import ThreadPoolExecutor as _ThreadPoolExecutor

import numpy as _np

import numkong as _nk
from numkong._maxsim import _dtype_name, _from_dlpack, _infer_dtype_name, _maxsim_unpacked, _narrowest_holding

__all__ = ["colbert_scores", "pack_documents", "rerank"]


def rerank(documents_ids, queries_embeddings, documents_embeddings, device=None, *, queries_mask=None,
           documents_mask=None, dtype=None, threads=None):
    """Rerank each query's candidate documents by ColBERT similarity, best first (pylate.rank.rerank).

    documents_ids: per query, the ids of its candidate documents.
    queries_embeddings: one query [tokens, dim], a padded batch [queries, tokens, dim], or a list of
        per-query matrices.
    documents_embeddings: per query, its documents as a list of [tokens, dim] matrices, a padded
        [documents, tokens, dim] batch, or a MaxSimPackedCorpus from pack_documents(); or one padded
        [queries, documents, tokens, dim] batch.
    queries_mask / documents_mask: optional masks (nonzero keeps a row) shaped like the embeddings
        without their last axis, e.g. PyLate's [documents, tokens] documents_mask for each query.
    dtype: packing dtype as in numkong.maxsim_pack (None keeps the embeddings' format).
    threads: worker threads for the scoring (default: every core this process may use).

    Returns, per query, a list of {"id": ..., "score": float} sorted by descending score.
    """
    _check_device(device)
    queries = _queries(queries_embeddings, queries_mask)
    documents = _per_query(documents_embeddings, "documents_embeddings")
    document_masks = [None] * len(documents) if documents_mask is None else _per_query(documents_mask,
                                                                                          "documents_mask")
    ids = _per_query(documents_ids, "documents_ids")
    if not len(queries) == len(ids) == len(documents) == len(document_masks):
        raise ValueError(f"got {len(queries)} queries, {len(ids)} lists of documents_ids, {len(documents)} of "
                         f"documents_embeddings and {len(document_masks)} of documents_mask; pass one per query")
    results = []
    for position, (query, query_ids, candidates, masks) in enumerate(zip(queries, ids, documents, document_masks)):
        if len(query_ids) != len(candidates):
            raise ValueError(f"query {position} has {len(query_ids)} documents_ids but {len(candidates)} documents; "
                             f"pass one id per document")
        if len(query_ids) == 0:
            results.append([])
            continue
        similarity = _similarities([query], candidates, masks, dtype, threads, f"query {position}: ")[0]
        order = _np.argsort(-similarity, kind="stable")  # ties keep the documents' order
        results.append([{"id": query_ids[index], "score": float(similarity[index])} for index in order.tolist()])
    return results


def colbert_scores(queries_embeddings, documents_embeddings, queries_mask=None, documents_mask=None, *,
                   dtype=None, threads=None):
    """ColBERT similarity of every query with every document (pylate.scores.colbert_scores).

    queries_embeddings: [queries, tokens, dim] (padded) or a list of [tokens, dim] matrices.
    documents_embeddings: [documents, tokens, dim] (padded), a list of [tokens, dim] matrices, or a
        MaxSimPackedCorpus from pack_documents().
    queries_mask / documents_mask: optional [queries, tokens] / [documents, tokens] masks; rows where the
        mask is 0 are left out (a masked query row adds 0).

    Returns a float64 NumPy array [queries, documents] of sums over query rows of the largest cosine.
    """
    queries = _queries(queries_embeddings, queries_mask, single=False)
    return _similarities(queries, documents_embeddings, documents_mask, dtype, threads)


def pack_documents(documents_embeddings, documents_mask=None, *, dtype=None):
    """Pack documents once for rerank() / colbert_scores(): a MaxSimPackedCorpus without their padding.

    documents_embeddings: a list of [tokens, dim] matrices or a padded [documents, tokens, dim] batch;
    documents_mask: None or [documents, tokens] (nonzero keeps a row). Queries scored against it are
    packed in its dtype.
    """
    matrices = _documents(documents_embeddings, documents_mask)
    return _pack_corpus(matrices, dtype or _common_dtype(matrices))


# ---- helpers ----

def _check_device(device):
    if device is not None and str(device) != "cpu":
        raise ValueError(f"device={device!r}: numkong scores on the CPU; pass device=None or 'cpu' and CPU tensors")


def _array(obj, what):
    """A NumPy view (DLPack tensors, arrays) or array (nested lists of numbers) of `obj`; None for a list
    of matrices or tensors, which the caller takes one by one (so tensors stay zero-copy)."""
    if isinstance(obj, _np.ndarray):
        return obj
    if hasattr(obj, "__dlpack__"):
        return _from_dlpack(obj, what)
    if isinstance(obj, (list, tuple)):
        if not obj or isinstance(obj[0], _np.ndarray) or hasattr(obj[0], "__dlpack__"):
            return None
        try:
            return _np.asarray(obj, dtype=_np.float32)  # PyLate makes float32 tensors of lists
        except ValueError:  # ragged: a list of matrices of different lengths
            return None
    return _np.asarray(obj)


def _mask_rows(matrix, mask, what):
    """`matrix` without the rows whose mask is 0: a slice when the kept rows are a prefix (no copy)."""
    if mask is None:
        return matrix
    keep = _np.asarray(_array(mask, what)).reshape(-1) != 0
    if keep.shape[0] != matrix.shape[0]:
        raise ValueError(f"{what} has {keep.shape[0]} entries for {matrix.shape[0]} rows; the mask needs one "
                         f"entry per token")
    count = int(keep.sum())
    if keep[:count].all():
        return matrix[:count]
    return matrix[keep]


def _matrices(embeddings, mask, role, item, shape_hint, single=False):
    """The list of [tokens, dim] matrices of `embeddings` (a [n, tokens, dim] batch or a list of
    matrices; with `single`, one [tokens, dim] matrix too), their masked rows removed."""
    arr = _array(embeddings, f"{role}_embeddings")
    if arr is not None and arr.ndim == 2 and single:
        arr = arr[None]  # one query, as pylate.rank.rerank takes it
    if arr is not None:
        if arr.ndim != 3:
            raise ValueError(f"{role}_embeddings has shape {arr.shape}; pass {shape_hint}")
        matrices = list(arr)
    else:
        matrices = [_matrix(matrix, f"{item} {i}") for i, matrix in enumerate(embeddings)]
    if mask is None:
        return matrices
    masks = _per_query(mask, f"{role}_mask")
    if len(masks) != len(matrices):
        raise ValueError(f"{role}_mask has {len(masks)} entries for {len(matrices)} {role}")
    return [_mask_rows(matrix, m, f"{role}_mask[{i}]") for i, (matrix, m) in enumerate(zip(matrices, masks))]


def _queries(embeddings, mask, single=True):
    """The list of query matrices (2-D, masked rows removed)."""
    hint = f"[queries, tokens, dim], a list of [tokens, dim] matrices{' or one [tokens, dim] query' if single else ''}"
    return _matrices(embeddings, mask, "queries", "query", hint, single)


def _documents(embeddings, mask, what=""):
    """The list of document matrices (2-D, masked rows removed) of one query's documents."""
    return _matrices(embeddings, mask, f"{what}documents", f"{what}document",
                     "[documents, tokens, dim] or a list of [tokens, dim] matrices")


def _matrix(obj, what):
    """One [tokens, dim] matrix (tensors stay as they are: numkong reads them zero-copy)."""
    if hasattr(obj, "__dlpack__") and not isinstance(obj, _np.ndarray):
        obj = _from_dlpack(obj, what)
    arr = obj if isinstance(obj, _np.ndarray) else _np.asarray(obj, dtype=_np.float32)
    if arr.ndim != 2:
        raise ValueError(f"{what} has shape {arr.shape}; each query or document is a [tokens, dim] matrix")
    return arr


def _per_query(obj, what):
    """A sequence with one entry per query: a list as it is, an array or tensor split on its first axis."""
    if isinstance(obj, _nk.MaxSimPackedCorpus):
        raise TypeError(f"{what} is a single packed corpus; pass a list with one entry per query")
    if isinstance(obj, (list, tuple)):
        return obj
    arr = _array(obj, what)
    if arr is None or arr.ndim == 0:
        raise TypeError(f"{what} must be a list with one entry per query, not {type(obj).__name__}")
    return list(arr)


def _common_dtype(matrices):
    """The narrowest packing dtype that holds every matrix's format exactly (as numkong.maxsim picks)."""
    first = {}  # each distinct dtype and the first matrix that has it
    for index, matrix in enumerate(matrices):
        first.setdefault(matrix.dtype, index)
    for index in sorted(first.values()):
        _infer_dtype_name(matrices[index], f"embeddings {index}")  # TypeError for integers, with the fix
    return _narrowest_holding(*sorted(first, key=str))


def _check_rows(matrices, what):
    for index, matrix in enumerate(matrices):
        if matrix.shape[0] == 0:
            raise ValueError(f"{what}document {index} has no rows (or none left after its mask); every document "
                             f"needs at least one token vector")


def _pack_corpus(matrices, name, what=""):
    _check_rows(matrices, what)
    return _nk.maxsim_pack_corpus(matrices, dtype=name)


def _similarities(queries, documents, mask, dtype, threads, what=""):
    """ColBERT similarities [queries, documents] of query matrices against one set of documents: a packed
    corpus, or matrices / a padded batch with its mask, packed here in the narrowest common format."""
    if isinstance(documents, _nk.MaxSimPackedCorpus):
        if mask is not None:
            raise ValueError(f"{what}a packed corpus has no padding to mask; pass documents_mask=None with it")
        packed = [_pack_query(query, documents.dtype, position) for position, query in enumerate(queries)]
        distances = _distances(packed, documents, threads)
    else:
        distances = None if mask is not None else _streamed_distances(queries, documents, dtype, threads)
        if distances is None:
            matrices = _documents(documents, mask, what)
            name = _dtype_name(dtype) if dtype is not None else _common_dtype(queries + matrices)
            packed = [_pack_query(query, name, position) for position, query in enumerate(queries)]
            distances = _score_documents(packed, matrices, name, threads, what)
    counts = _np.array([query.shape[0] for query in queries], dtype=_np.float64)
    return counts[:, None] - distances


def _pack_query(query, name, position):
    try:
        return _nk.maxsim_pack(query, dtype=name)
    except ValueError as error:
        raise ValueError(f"query {position}: {error}") from None


def _distances(packed_queries, corpus, threads):
    return _nk.maxsim_packed_corpus(list(packed_queries), corpus, threads=threads)


def _thread_count(threads):
    if threads is None:
        return len(_os.sched_getaffinity(0)) if hasattr(_os, "sched_getaffinity") else (_os.cpu_count() or 1)
    if isinstance(threads, bool) or not isinstance(threads, (int, _np.integer)):
        raise TypeError(f"threads must be a positive int or None, not {type(threads).__name__}")
    if threads <= 0:
        raise ValueError(f"threads must be at least 1, got {threads}")
    return int(threads)


_POOLS = {}  # thread count -> executor of this process, kept between calls
_POOLS_LOCK = _threading.Lock()
_POOLS_PID = [_os.getpid()]


def _pool(threads):
    """A thread pool of `threads` workers kept for later calls: with a pool started per call, a traced
    1,000-document rerank had its second worker begin 2.3 ms late, a fifth of the call. A forked
    child starts its own (its parent's threads do not exist in it)."""
    with _POOLS_LOCK:
        if _POOLS_PID[0] != _os.getpid():
            _POOLS.clear()
            _POOLS_PID[0] = _os.getpid()
        pool = _POOLS.get(threads)
        if pool is None:
            pool = _POOLS[threads] = _ThreadPoolExecutor(threads, thread_name_prefix="numkong")
        return pool


# Below this many stored elements per thread, one corpus packed on the calling thread is faster.
_SHARD_ELEMENTS = 1 << 18


def _score_documents(packed_queries, matrices, name, threads, what=""):
    """Distances [queries, documents] of raw documents. Packing costs far more than scoring, so with
    several threads the documents are split into contiguous shards of about equal rows, each scored on
    its own worker thread (the GIL is released while packing and scoring): float32 documents where they
    are (numkong._maxsim_unpacked, on AVX-512), the others, and any it leaves, packed first."""
    threads = _thread_count(threads)
    rows = _np.cumsum([matrix.shape[0] for matrix in matrices])
    shards = min(threads, len(matrices), int(rows[-1] * matrices[0].shape[1]) // _SHARD_ELEMENTS) if matrices else 1
    _check_rows(matrices, what)
    if shards <= 1:
        return _shard_distances(packed_queries, matrices, name, threads, what)
    cuts = [0] + [int(_np.searchsorted(rows, rows[-1] * k / shards)) + 1 for k in range(1, shards)] + [len(matrices)]
    bounds = [(lo, hi) for lo, hi in zip(cuts, cuts[1:]) if hi > lo]

    def shard(bound):
        return _shard_distances(packed_queries, matrices[bound[0]:bound[1]], name, 1)

    try:
        parts = list(_pool(threads).map(shard, bounds))
    except ValueError:
        _pack_corpus(matrices, name, what)  # the same error, naming the document by its index in the call
        raise
    return _np.concatenate(parts, axis=1)


# Documents per task of the streamed path (64: 1.22x the general path, 128: 1.33x, 256: 1.31x on
# 1,000 x 180 x 128 tensors, 2 threads).
_STREAM_DOCUMENTS = 128


class _Unusual(Exception):
    """A streamed task met a case the general path decides (another format, a document without rows)."""


def _streamed_distances(queries, documents, dtype, threads):
    """Distances [queries, documents] of a list of float32 document matrices or tensors, read and scored in
    chunks by worker threads: reading a chunk holds the GIL (1-2 us per tensor) while the other workers
    score theirs without it (about 10 us per 180-row document), so the reading no longer runs before all
    the scoring. None when the call is not such a case or a chunk holds anything unusual: the general
    path then takes the whole call again and raises any error with its context."""
    threads = _thread_count(threads)
    if threads < 2 or not isinstance(documents, (list, tuple)) or len(documents) < 2 * _STREAM_DOCUMENTS:
        return None
    if isinstance(documents[0], _np.ndarray) or not hasattr(documents[0], "__dlpack__"):
        return None  # arrays and lists cost little to take as they are: the general path's shards
    name = _dtype_name(dtype) if dtype is not None else "float32"
    if name != "float32" or (dtype is None and any(query.dtype != _np.float32 for query in queries)):
        return None
    packed = [_pack_query(query, name, position) for position, query in enumerate(queries)]

    def read(obj):
        matrix = _matrix(obj, "")
        if matrix.shape[0] == 0 or (dtype is None and matrix.dtype != _np.float32):
            raise _Unusual
        return matrix

    def chunk(start):
        return _shard_distances(packed, list(documents[start:start + _STREAM_DOCUMENTS]), name, 1, read=read)

    try:
        parts = list(_pool(threads).map(chunk, range(0, len(documents), _STREAM_DOCUMENTS)))
    except (_Unusual, ValueError, TypeError):
        return None
    return _np.concatenate(parts, axis=1)


def _shard_distances(packed_queries, documents, name, threads, what="", read=None):
    """Distances [queries, documents] of one shard of raw documents: matrices (rows checked), or the
    caller's objects with `read` making a checked matrix of each one the unpacked path leaves (torch
    float32 tensors are read in place). float32 ones are scored unpacked where that is available, the
    rest packed into a corpus and scored."""
    distances = _np.full((len(packed_queries), len(documents)), _np.nan)
    if name == "float32":
        for row, query in enumerate(packed_queries):
            unpacked = _maxsim_unpacked(query, documents)
            if unpacked is None:
                break
            distances[row] = unpacked
    left = _np.flatnonzero(_np.isnan(distances).any(axis=0))
    matrices = [documents[i] if read is None else read(documents[i]) for i in left]
    if left.size == len(documents):  # every one (or none at all: packing says there are no documents)
        return _distances(packed_queries, _pack_corpus(matrices, name, what), threads)
    if left.size:
        try:
            corpus = _pack_corpus(matrices, name, what)
        except ValueError:
            if read is None:
                _pack_corpus(documents, name, what)  # the same error, naming the document by its index here
            raise
        distances[:, left] = _distances(packed_queries, corpus, threads)
    return distances
