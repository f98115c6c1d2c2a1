# Packed corpora and batched scoring; included into _maxsim.pyx (one extension, one dispatcher).
import mmap as _mmap


cdef class MaxSimPackedCorpus:
    """Many packed documents of different lengths in one portable, 64-byte aligned buffer.

    Built by maxsim_pack_corpus(); scored by maxsim_packed_corpus(). Each document is stored exactly
    as maxsim_pack() would store it, so per-document scores equal maxsim_packed() bit for bit.
    save(path) writes it; MaxSimPackedCorpus.load(path) memory-maps it back without copying.
    Pickles with protocol 5 as one out-of-band buffer.
    """

    def __cinit__(self):
        self.data = NULL
        self.owns_data = False
        self._has_view = False

    def __init__(self, *args, **kwargs):
        raise TypeError("MaxSimPackedCorpus cannot be created directly; use numkong.maxsim_pack_corpus(documents)")

    def __dealloc__(self):
        if self._has_view:
            PyBuffer_Release(&self._view)
        if self.owns_data:
            free(self.data)

    @classmethod
    def pack_size(cls, lengths, depth, /, dtype):
        """Packed corpus size in bytes for documents of the given row counts, `depth` and `dtype`."""
        code = _DTYPE_CODES[_dtype_name(dtype)]
        _check_count(depth, "depth")
        if depth == 0:
            raise ValueError("depth must be at least 1")
        counts = _lengths_array(lengths)
        return _corpus_size(counts, depth, code)

    @property
    def dtype(self):
        """Data type of the packed vectors (canonical name)."""
        _require_packed(self.data, self)
        return _DTYPE_NAMES[self.dtype_code]

    @property
    def lengths(self):
        """Rows of each document, as an int64 NumPy array."""
        cdef uint64_t i, nbytes
        out = np.empty(self.documents, dtype=np.int64)
        cdef nk_maxsim_info_t info
        for i in range(self.documents):
            nk_maxsim_info(nk_corpus_document(self.data, i, &nbytes), &info)
            out[i] = info.vectors
        return out

    @property
    def capabilities(self):
        """The Capability mask that packed this corpus."""
        return Capability(self.packed_capabilities & _known_capabilities)

    def __len__(self):
        return self.documents

    def __repr__(self):
        if self.data == NULL:
            return "MaxSimPackedCorpus(<empty: not built by maxsim_pack_corpus>)"
        return (f"MaxSimPackedCorpus(documents={self.documents}, total_vectors={self.total_vectors}, "
                f"depth={self.depth}, dtype={self.dtype!r}, nbytes={self.nbytes})")

    def __getbuffer__(self, Py_buffer *buffer, int flags):
        _export_bytes(self, buffer, flags, self.data, self.nbytes, self._buffer_shape, self._buffer_strides)

    def __releasebuffer__(self, Py_buffer *buffer):
        pass

    def __reduce_ex__(self, protocol):
        if protocol >= 5:
            return (_load_corpus, (pickle.PickleBuffer(self),))
        return (_load_corpus, (bytes(memoryview(self)),))

    def save(self, path):
        """Write the corpus bytes to `path` (load it back with MaxSimPackedCorpus.load)."""
        with open(path, "wb") as file:
            file.write(memoryview(self))

    @classmethod
    def load(cls, path, *, mmap=True):
        """Load a saved corpus: memory-mapped read-only without copying (mmap=True) or read into memory.

        Every byte is verified (header, table, stored values, derived sections): ValueError if corrupt.
        """
        with open(path, "rb") as file:
            if not mmap:
                return _load_corpus(file.read())
            try:
                mapped = _mmap.mmap(file.fileno(), 0, access=_mmap.ACCESS_READ)
            except ValueError:  # an empty file cannot be mapped
                raise ValueError(f"corrupt packed corpus: {path} is empty") from None
        return _load_corpus(mapped)


def _lengths_array(lengths):
    counts = np.asarray(lengths)
    if counts.ndim != 1 or not (counts.dtype.kind in "iu" or counts.size == 0):
        raise TypeError("lengths must be a 1-D sequence of non-negative integers")
    if counts.size and counts.min() < 0:
        raise ValueError("lengths must be non-negative")
    return np.ascontiguousarray(counts, dtype=np.uint64)


cdef uint64_t _corpus_size(object counts, uint64_t depth, int code) except? 0:
    cdef uint64_t[::1] view = counts
    cdef uint64_t nbytes = 0
    cdef nk_status_t status = nk_corpus_pack_size(&view[0] if view.shape[0] else NULL, view.shape[0], depth,
                                                  code, &nbytes)
    if status != nk_ok_k:
        raise ValueError(f"a corpus of {view.shape[0]} documents x depth {depth} {_DTYPE_NAMES[code]} does not fit "
                         f"a packed buffer (byte size overflows 64 bits)")
    return nbytes


cdef MaxSimPackedCorpus _wrap_corpus(object data):
    """A corpus over verified bytes: zero-copy when 64-byte aligned, else one aligned copy."""
    cdef MaxSimPackedCorpus corpus = MaxSimPackedCorpus.__new__(MaxSimPackedCorpus)
    cdef nk_corpus_info_t info
    cdef nk_status_t status
    cdef void *copy = NULL
    try:
        PyObject_GetBuffer(data, &corpus._view, PyBUF_SIMPLE)
    except TypeError:
        raise TypeError(f"a packed corpus loads from a bytes-like object, not {type(data).__name__}") from None
    corpus._has_view = True
    corpus.nbytes = <uint64_t>corpus._view.len
    if (<uintptr_t>corpus._view.buf) % 64 == 0:
        corpus.data = corpus._view.buf
    else:
        copy = _packed_alloc(corpus.nbytes, "corpus")
        memcpy(copy, corpus._view.buf, <size_t>corpus.nbytes)
        corpus.data = copy
        corpus.owns_data = True
        PyBuffer_Release(&corpus._view)
        corpus._has_view = False
    with nogil:
        status = nk_corpus_verify(corpus.data, corpus.nbytes, &info)
    if status != nk_ok_k:
        raise ValueError("corrupt packed corpus: header, document table, sizes or stored values are invalid "
                         "or truncated")
    _adopt_corpus_header(corpus)
    return corpus


cdef void _adopt_corpus_header(MaxSimPackedCorpus corpus):
    cdef nk_corpus_info_t info
    nk_corpus_info(corpus.data, &info)
    corpus.documents = info.documents
    corpus.depth = info.depth
    corpus.total_vectors = info.total_vectors
    corpus.dtype_code = info.dtype
    corpus.packed_capabilities = info.capabilities


def _load_corpus(data):
    """Rebuild a packed corpus from bytes (pickle, files); verifies everything."""
    return _wrap_corpus(data)


def maxsim_pack_corpus(documents, /, dtype=None, *, offsets=None, capabilities=None, stream=None):
    """Pack many documents of different lengths into one MaxSimPackedCorpus.

    documents: a sequence of 2-D matrices [rows_i, depth], or (with offsets=) one flat token matrix
       [total_rows, depth] where document i is rows offsets[i] .. offsets[i+1] (offsets[0] == 0,
       offsets[-1] == total_rows, non-decreasing).
    dtype: packing dtype as in maxsim_pack(); None keeps the inputs' format (the narrowest holding all).
    Every document needs at least one row and the same depth.
    """
    _check_stream(stream)
    cdef uint64_t mask = _resolve_capabilities(capabilities, nk_capabilities_available())
    if offsets is not None:
        tokens = _as_matrix(documents, "documents")
        bounds = np.asarray(offsets)
        if bounds.ndim != 1 or bounds.dtype.kind not in "iu" or bounds.size < 1:
            raise TypeError("offsets must be a 1-D integer sequence of document boundaries [0, ..., total_rows]")
        if bounds[0] != 0 or bounds[-1] != tokens.shape[0] or np.any(np.diff(bounds) < 0):
            raise ValueError(f"offsets must start at 0, be non-decreasing and end at the token count "
                             f"{tokens.shape[0]}")
        matrices = [tokens[bounds[i]:bounds[i + 1]] for i in range(bounds.size - 1)]
    else:
        if isinstance(documents, np.ndarray) or not hasattr(documents, "__len__"):
            raise TypeError("documents must be a sequence of 2-D matrices, or one token matrix with offsets=")
        matrices = [_as_matrix(document, f"document {i}") for i, document in enumerate(documents)]
    if not matrices:
        raise ValueError("the corpus has no documents; pass at least one")
    depth = matrices[0].shape[1]
    for position, matrix in enumerate(matrices):
        if matrix.shape[1] != depth:
            raise ValueError(f"document {position} has depth {matrix.shape[1]} but document 0 has depth {depth}")
        if matrix.shape[0] == 0:
            raise ValueError(f"document {position} has no rows; every document needs at least one token vector")
    if dtype is None:
        for position, matrix in enumerate(matrices):
            _infer_dtype_name(matrix, f"document {position}")
        name = _narrowest_holding(*sorted({matrix.dtype for matrix in matrices}, key=str))
    else:
        name = _dtype_name(dtype)
    cdef int code = _DTYPE_CODES[name]
    counts = np.array([matrix.shape[0] for matrix in matrices], dtype=np.uint64)
    cdef uint64_t[::1] lengths = counts
    cdef uint64_t nbytes = _corpus_size(counts, depth, code)
    cdef void *data = _packed_alloc(nbytes, "corpus")
    cdef MaxSimPackedCorpus corpus = MaxSimPackedCorpus.__new__(MaxSimPackedCorpus)
    corpus.data = data
    corpus.owns_data = True
    corpus.nbytes = nbytes
    nk_corpus_init(&lengths[0], lengths.shape[0], depth, code, mask, data, nbytes)
    cdef uint64_t index, capacity
    cdef void *target
    for index in range(lengths.shape[0]):
        target = nk_corpus_document(data, index, &capacity)
        try:
            _pack_into(matrices[index], name, mask, target, capacity)
        except ValueError as error:
            raise ValueError(f"document {index}: {error}") from None
    _adopt_corpus_header(corpus)
    return corpus


def maxsim_packed_corpus(queries, MaxSimPackedCorpus corpus not None, /, *, top_k=None, threads=None,
                         capabilities=None, stream=None):
    """MaxSim of packed queries against every document of a packed corpus.

    queries: one MaxSimPackedMatrix -> scores of shape [documents]; a sequence of them -> [len(queries),
       documents]. Each score equals maxsim_packed(query, document) exactly (lower is better).
    top_k: None, or k in 1 .. documents: returns (indices, scores) of the k best documents per query,
       lowest score first, ties by ascending index (int64 and float64 arrays).
    threads: worker threads (default: every core this process may use); the GIL is released.
    capabilities: defaults to the intersection of the masks that packed the corpus and the queries.
    """
    _check_stream(stream)
    _require_packed(corpus.data, corpus)
    single = isinstance(queries, MaxSimPackedMatrix)
    query_list = [queries] if single else list(queries) if isinstance(queries, (list, tuple)) else None
    if query_list is None or not all(isinstance(q, MaxSimPackedMatrix) for q in query_list):
        raise TypeError("queries must be a MaxSimPackedMatrix or a list of them (from maxsim_pack)")
    cdef uint64_t available = nk_capabilities_available()
    cdef uint64_t default = corpus.packed_capabilities & available
    cdef MaxSimPackedMatrix query
    for query in query_list:
        _require_packed(query.data, query)
        if query.dtype_code != corpus.dtype_code:
            raise TypeError(f"queries were packed as {query.dtype} but the corpus as {corpus.dtype}; "
                            f"pack both with the same dtype")
        if query.depth != corpus.depth:
            raise ValueError(f"queries have depth {query.depth} but the corpus has depth {corpus.depth}")
        default &= query.packed_capabilities
    cdef uint64_t mask = _resolve_capabilities(capabilities, default | 1)
    if threads is None:
        threads = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    elif isinstance(threads, bool) or not isinstance(threads, (int, np.integer)):
        raise TypeError(f"threads must be a positive int or None, not {type(threads).__name__}")
    elif threads <= 0:
        raise ValueError(f"threads must be at least 1, got {threads}")
    if top_k is not None:
        if isinstance(top_k, bool) or not isinstance(top_k, (int, np.integer)):
            raise TypeError(f"top_k must be a positive int or None, not {type(top_k).__name__}")
        if top_k <= 0 or top_k > corpus.documents:
            raise ValueError(f"top_k must be between 1 and the corpus's {corpus.documents} documents, got {top_k}")
    scores = np.empty((len(query_list), corpus.documents), dtype=np.float64)
    cdef double[:, ::1] out = scores
    cdef uint64_t n_queries = len(query_list), n_threads = min(threads, 1 << 16)
    cdef const void **pointers = <const void **>malloc(max(n_queries, 1) * sizeof(void *))
    if pointers == NULL:
        raise MemoryError("cannot allocate the query table")
    cdef nk_status_t status
    cdef uint64_t i
    try:
        for i in range(n_queries):
            pointers[i] = (<MaxSimPackedMatrix>query_list[i]).data
        with nogil:
            status = nk_maxsim_score_corpus(pointers, n_queries, corpus.data, mask, n_threads,
                                            &out[0, 0] if out.shape[0] and out.shape[1] else NULL)
    finally:
        free(pointers)
    if status != nk_ok_k:
        raise RuntimeError(f"corpus scoring failed with status {status}")
    if top_k is not None:
        order = np.argsort(scores, axis=1, kind="stable")[:, :top_k]  # stable: ties by index
        best = np.take_along_axis(scores, order, axis=1)
        return (order[0], best[0]) if single else (order, best)
    return scores[0] if single else scores


cdef nk_status_t maxsim_packed_corpus_nogil(MaxSimPackedMatrix queries, MaxSimPackedCorpus corpus,
                                            uint64_t capabilities, uint64_t threads, double *scores) noexcept nogil:
    cdef const void *query = queries.data
    return nk_maxsim_score_corpus(&query, 1, corpus.data, capabilities, threads, scores)
