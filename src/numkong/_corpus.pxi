# Packed corpora and batched scoring; included into _maxsim.pyx (one extension, one dispatcher).
import stat as _stat
import tempfile as _tempfile

from cpython.buffer cimport PyBUF_WRITE
from cpython.memoryview cimport PyMemoryView_FromMemory
from libc.stdlib cimport realloc


cdef class MaxSimPackedCorpus:
    """Many packed documents of different lengths in one portable, 64-byte aligned buffer.

    Built by maxsim_pack_corpus(); scored by maxsim_packed_corpus(). Each document is stored exactly
    as maxsim_pack() would store it, so per-document scores equal maxsim_packed() bit for bit.
    save(path) writes it atomically; MaxSimPackedCorpus.load(path) maps it back read-only without
    copying. Pickles with protocol 5 as one out-of-band buffer.

    What is shared and what is private: the header and document table are validated once and kept in
    memory this object owns, so nothing another holder of the bytes does can send a read out of bounds.
    The stored values are shared only with a file this object maps (load) or a read-only buffer it was
    unpickled from; a writable buffer is copied.
    """

    def __cinit__(self):
        self.corpus.data = NULL
        self.corpus.table = NULL
        self.corpus.info.documents = 0
        self._table = NULL
        self._owned = NULL
        self._owned_reserved = 0
        self._mapping = NULL
        self._mapping_bytes = 0
        self._has_view = False

    def __init__(self, *args, **kwargs):
        raise TypeError("MaxSimPackedCorpus cannot be created directly; use numkong.maxsim_pack_corpus(documents)")

    def __dealloc__(self):
        if self._has_view:
            PyBuffer_Release(&self._view)
        if self._mapping != NULL:
            nk_unmap_file(self._mapping, <size_t>self._mapping_bytes)
        cdef nk_region_t region
        region.base, region.reserved, region.committed = <char *>self._owned, <size_t>self._owned_reserved, 0
        nk_region_release(&region)
        free(self._table)

    @classmethod
    def pack_size(cls, lengths, depth, /, dtype):
        """Packed corpus size in bytes for documents of the given row counts, `depth` and `dtype`."""
        code = _DTYPE_CODES[_dtype_name(dtype)]
        _count(depth, "depth")
        if depth == 0:
            raise ValueError("depth must be at least 1")
        counts = _lengths_array(lengths)
        return _corpus_size(counts, depth, code)

    @property
    def documents(self):
        """Number of documents."""
        return self.corpus.info.documents

    @property
    def depth(self):
        """Number of dimensions per vector."""
        return self.corpus.info.depth

    @property
    def total_vectors(self):
        """Rows of all documents together."""
        return self.corpus.info.total_vectors

    @property
    def nbytes(self):
        """Size of the packed corpus in bytes."""
        return self.corpus.info.nbytes

    @property
    def owns_data(self):
        """False when the bytes are shared: a mapped file or another object's read-only buffer."""
        return self._owned != NULL

    @property
    def dtype(self):
        """Data type of the packed vectors (canonical name)."""
        _require_packed(self.corpus.data, self)
        return _DTYPE_NAMES[self.corpus.info.dtype]

    @property
    def lengths(self):
        """Rows of each document, as an int64 NumPy array."""
        cdef uint64_t i
        out = np.empty(self.corpus.info.documents, dtype=np.int64)
        cdef int64_t[::1] view = out
        for i in range(self.corpus.info.documents):
            view[i] = <int64_t>self._table[i].vectors
        return out

    @property
    def capabilities(self):
        """The Capability mask this corpus was packed with (every family when unrestricted)."""
        return Capability(self.corpus.info.capabilities & _known_capabilities)

    def __len__(self):
        return self.corpus.info.documents

    def __getitem__(self, index):
        """Document `index` as a MaxSimPackedMatrix that shares this corpus's buffer (and keeps it alive):
        the same bytes as packing that document alone."""
        return self._item(self._index(index))

    cdef MaxSimPackedMatrix _item(self, uint64_t i):
        """Document i (a checked index) as a MaxSimPackedMatrix sharing this corpus's buffer."""
        cdef MaxSimPackedMatrix document = MaxSimPackedMatrix.__new__(MaxSimPackedMatrix)
        document.matrix = nk_corpus_document(&self.corpus, i, NULL)
        document._base = self
        return document

    def __iter__(self):
        for index in range(self.corpus.info.documents):
            yield self[index]

    def document(self, index):
        """The stored values of document `index`: a read-only array [rows, depth] of the stored dtype
        (float32, ml_dtypes.bfloat16, ...) that shares this corpus's buffer. The integer formats are
        stored tiled: for them a float64 copy of the values they stand for (scale x q, or +-1)."""
        cdef uint64_t i = self._index(index)
        cdef MaxSimPackedMatrix item = self._item(i)
        cdef nk_maxsim_matrix_t document = item.matrix
        shape = (document.info.vectors, document.info.depth)
        if _DTYPE_NAMES[self.corpus.info.dtype] in _INTEGER_NAMES:  # stored tiled: a float64 copy of the values
            values = np.empty(shape, dtype=np.float64)
            _raise_for(nk_maxsim_dequantize(&document, 0, shape[0],
                                            <double *>_data_address(values)),
                       {"what": f"document {i}"})
            values.flags.writeable = False
            return values
        # Through the document's own export, not the corpus's: that would seal a fresh corpus (a checksum
        # of every byte) for one document's values.
        cdef uintptr_t start = <uintptr_t>nk_maxsim_values(&document) - <uintptr_t>document.data
        dtype = _NUMPY_DTYPES[_DTYPE_NAMES[self.corpus.info.dtype]]
        return np.frombuffer(item, dtype=dtype, count=shape[0] * shape[1], offset=start).reshape(shape)

    cdef uint64_t _index(self, object index) except? 0:
        _require_packed(self.corpus.data, self)
        if isinstance(index, bool):
            raise TypeError("corpus indices are integers, not bool")
        try:
            index = operator.index(index)
        except TypeError:
            raise TypeError(f"corpus indices are integers, not {type(index).__name__}") from None
        documents = self.corpus.info.documents
        if index < 0:
            index += documents
        if not 0 <= index < documents:
            raise IndexError(f"document index out of range for a corpus of {documents} documents")
        return index

    def __repr__(self):
        if self.corpus.data == NULL:
            return "MaxSimPackedCorpus(<empty: not built by maxsim_pack_corpus>)"
        return (f"MaxSimPackedCorpus(documents={self.documents}, total_vectors={self.total_vectors}, "
                f"depth={self.depth}, dtype={self.dtype!r}, nbytes={self.nbytes})")

    def __getbuffer__(self, Py_buffer *buffer, int flags):
        if self._unsealed:  # every export (save, pickle, memoryview) sees a complete header
            nk_corpus_seal(&self.corpus)
            self._unsealed = False
        _export_bytes(self, buffer, flags, self.corpus.data, self.corpus.info.nbytes, self._buffer_shape,
                      self._buffer_strides)

    def __releasebuffer__(self, Py_buffer *buffer):
        pass

    def __reduce_ex__(self, protocol):
        if protocol >= 5:
            return (_load_corpus, (pickle.PickleBuffer(self),))
        return (_load_corpus, (bytes(memoryview(self)),))

    def save(self, path):
        """Write the corpus to `path` (load it back with MaxSimPackedCorpus.load), or to a binary file object.

        A path is written atomically: the bytes go to a temporary file in the same directory, which is
        flushed, synced and renamed over `path`. A crash leaves the old file intact, and every process
        that has the old file mapped (this one included) keeps scoring its old contents.
        """
        _require_packed(self.corpus.data, self)
        if hasattr(path, "write"):
            path.write(memoryview(self))
            return
        path = os.fspath(path)
        directory = os.path.dirname(os.path.abspath(path))
        handle, temporary = _tempfile.mkstemp(prefix="." + os.path.basename(path) + ".", suffix=".tmp",
                                              dir=directory)
        try:
            with open(handle, "wb") as file:
                try:
                    os.chmod(temporary, _stat.S_IMODE(os.stat(path).st_mode))  # keep an existing file's mode
                except OSError:
                    os.chmod(temporary, 0o666 & ~_UMASK)
                file.write(memoryview(self))
                file.flush()
                os.fsync(file.fileno())
            os.replace(temporary, path)
        except BaseException:
            try:
                os.unlink(temporary)
            except OSError:
                pass
            raise
        _sync_directory(directory)

    @classmethod
    def load(cls, path, *, mmap=True, verify=True):
        """Load a saved corpus from a path or a binary file object; ValueError if it is corrupt.

        A path must name a regular file. With mmap=True (default) the file is mapped read-only without
        copying (no file descriptor stays open); mmap=False, or a file object, reads it into memory.
        verify: True (default) checks the header, the document table and the checksum of every byte
        save() wrote (any corruption since then is refused, at memory speed); "all" also re-derives every
        document's sections from its stored values, as packing would (for bytes from an untrusted
        source); False checks only the header and table, what memory safety needs (for trusted files).
        A mapped file must not be truncated or edited in place while it is loaded (as with
        numpy.memmap); replacing it, e.g. by save(), is safe.
        """
        cdef int level = _verify_level(verify)
        if hasattr(path, "read"):
            return _open_corpus(path.read(), level)
        flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_BINARY", 0)
        descriptor = os.open(path, flags)  # non-blocking: a FIFO without a writer cannot hang the open
        try:
            status = os.fstat(descriptor)
            if not _stat.S_ISREG(status.st_mode):
                raise ValueError(f"{os.fspath(path)!r} is not a regular file; MaxSimPackedCorpus.load reads files "
                                 f"written by MaxSimPackedCorpus.save (or pass a binary file object)")
            if status.st_size == 0:
                raise ValueError(f"corrupt packed corpus: {os.fspath(path)!r} is empty")
            if mmap:
                return _map_corpus(descriptor, status.st_size, os.fspath(path), level)
            return _read_corpus(descriptor, status.st_size, os.fspath(path), level)
        finally:
            os.close(descriptor)


def _read_umask():
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


_UMASK = _read_umask()


def _sync_directory(directory):
    """Make a rename in `directory` durable (POSIX; a no-op where directories cannot be opened)."""
    try:
        handle = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return
    try:
        os.fsync(handle)
    except OSError:
        pass
    finally:
        os.close(handle)


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
    _check_depth(_DTYPE_NAMES[code], depth)
    _raise_for(nk_corpus_pack_size(&view[0] if view.shape[0] else NULL, view.shape[0], depth, code, &nbytes),
               {"what": f"a corpus of {view.shape[0]} documents x depth {depth} {_DTYPE_NAMES[code]}"})
    return nbytes


_CORPUS_EMPTY = "corrupt packed corpus: it holds no documents, or a document with no rows"


cdef int _verify_level(object verify) except -1:
    if verify is True:
        return NK_CORPUS_VERIFY_CHECKSUM
    if verify is False:
        return NK_CORPUS_VERIFY_LAYOUT
    if verify == "all":
        return NK_CORPUS_VERIFY_ALL
    raise ValueError(f"verify must be True (header, table and checksum), 'all' (also every derived section) or "
                     f"False (header and table only), not {verify!r}")


cdef int _validate_corpus(MaxSimPackedCorpus corpus, const void *data, uint64_t nbytes, int level) except -1:
    """Validate untrusted corpus bytes: the header and table are read once, into memory `corpus` owns."""
    cdef nk_corpus_info_t info
    cdef nk_status_t status
    cdef uint32_t version
    with nogil:
        status = nk_corpus_header(data, nbytes, &info)
        version = nk_corpus_format_version(data, nbytes)
    context = {"kind": "corpus", "found": version, "expected": NK_CORPUS_FORMAT_VERSION, "empty": _CORPUS_EMPTY}
    _raise_for(status, context)
    corpus._table = <nk_corpus_entry_t *>malloc(max(info.documents, 1) * sizeof(nk_corpus_entry_t))
    if corpus._table == NULL:
        raise MemoryError(f"cannot allocate the table of {info.documents} documents")
    with nogil:
        status = nk_corpus_verify(data, &info, corpus._table, level)
    _raise_for(status, context)
    corpus.corpus.data = data
    corpus.corpus.info = info
    corpus.corpus.table = corpus._table
    return 0


cdef bint _may_change(object data):
    """Whether anyone can write the bytes `data` exports: it, or any object a read-only view of it
    (memoryview.toreadonly(), a pickle's read-only out-of-band buffer) stands for, is writable."""
    cdef Py_buffer view
    for _ in range(64):  # views of views, but never an endless chain
        try:
            PyObject_GetBuffer(data, &view, PyBUF_WRITABLE)
        except Exception:  # BufferError, TypeError, NumPy's ValueError: not writable this way
            pass
        else:
            PyBuffer_Release(&view)
            return True
        if isinstance(data, pickle.PickleBuffer):
            data = data.raw()
        elif isinstance(data, memoryview) and data.obj is not None:
            data = data.obj
        else:
            return False
    return True


cdef void *_corpus_alloc(MaxSimPackedCorpus corpus, uint64_t nbytes) except NULL:
    """Owned, page-aligned memory of `nbytes` for `corpus` (released with it)."""
    cdef nk_region_t region
    if nbytes > <uint64_t>(<size_t>-1) or not nk_region_reserve(&region, <size_t>nbytes) or \
            not nk_region_commit(&region, <size_t>nbytes):
        nk_region_release(&region)
        raise MemoryError(f"cannot allocate {nbytes} bytes for a packed corpus")
    corpus._owned, corpus._owned_reserved = region.base, region.reserved
    return corpus._owned


def _open_corpus(data, int level=NK_CORPUS_VERIFY_CHECKSUM):
    """A corpus over bytes-like `data`, verified: a view of read-only, 64-byte aligned bytes that no one
    can write, else a private copy (writable bytes could be changed after they were verified)."""
    cdef MaxSimPackedCorpus corpus = MaxSimPackedCorpus.__new__(MaxSimPackedCorpus)
    cdef const void *bytes_at
    try:
        PyObject_GetBuffer(data, &corpus._view, PyBUF_SIMPLE)
    except TypeError:
        raise TypeError(f"a packed corpus loads from a bytes-like object, not {type(data).__name__}") from None
    corpus._has_view = True
    cdef uint64_t nbytes = <uint64_t>corpus._view.len
    if (<uintptr_t>corpus._view.buf) % 64 == 0 and corpus._view.readonly and not _may_change(data):
        bytes_at = corpus._view.buf
    else:
        bytes_at = _corpus_alloc(corpus, nbytes)
        memcpy(<void *>bytes_at, corpus._view.buf, <size_t>nbytes)
        PyBuffer_Release(&corpus._view)
        corpus._has_view = False
    _validate_corpus(corpus, bytes_at, nbytes, level)
    return corpus


cdef MaxSimPackedCorpus _map_corpus(int descriptor, uint64_t nbytes, str path, int level):
    cdef MaxSimPackedCorpus corpus = MaxSimPackedCorpus.__new__(MaxSimPackedCorpus)
    if nbytes > <uint64_t>(<size_t>-1):
        raise MemoryError(f"{path!r} ({nbytes} bytes) does not fit this process's address space")
    with nogil:
        corpus._mapping = nk_map_file(descriptor, <size_t>nbytes)
    if corpus._mapping == NULL:
        raise OSError(f"cannot map {path!r} ({nbytes} bytes) into memory; try load(..., mmap=False)")
    corpus._mapping_bytes = nbytes
    _validate_corpus(corpus, corpus._mapping, nbytes, level)
    return corpus


cdef MaxSimPackedCorpus _read_corpus(int descriptor, uint64_t nbytes, str path, int level):
    """Read exactly `nbytes` (the size the file had when opened) into owned memory, then verify."""
    cdef MaxSimPackedCorpus corpus = MaxSimPackedCorpus.__new__(MaxSimPackedCorpus)
    target = PyMemoryView_FromMemory(<char *>_corpus_alloc(corpus, nbytes), <Py_ssize_t>nbytes, PyBUF_WRITE)
    cdef uint64_t done = 0
    with open(descriptor, "rb", buffering=0, closefd=False) as file:
        while done < nbytes:
            got = file.readinto(target[done:])
            if not got:
                raise ValueError(f"corrupt packed corpus: {path!r} became shorter while it was read")
            done += got
    _validate_corpus(corpus, corpus._owned, nbytes, level)
    return corpus


def _load_corpus(data):
    """Rebuild a packed corpus from bytes (the pickle path): header, table and checksum verified."""
    return _open_corpus(data)


def _batch_documents(batch, lengths, mask):
    """The documents of a padded batch [documents, tokens, depth]: the first lengths[i] rows of each, or
    the rows where mask[i] is true (views when the true rows are a prefix)."""
    if (lengths is None) == (mask is None):
        raise ValueError(f"a padded batch of shape {batch.shape} needs lengths= (tokens per document) or mask= "
                         f"(true for real tokens, PyLate's documents_mask), exactly one, so that padding rows "
                         f"never count")
    if mask is not None:
        keep = np.asarray(_as_array(mask, "mask")).astype(bool, copy=False)
        if keep.shape != batch.shape[:2]:
            raise ValueError(f"mask has shape {keep.shape} but the batch has {batch.shape[:2]} documents x tokens")
        counts = keep.sum(axis=1)
        prefix = np.arange(batch.shape[1])[None, :] < counts[:, None]
        if np.array_equal(keep, prefix):
            return [batch[i, :counts[i]] for i in range(batch.shape[0])]
        return [batch[i][keep[i]] for i in range(batch.shape[0])]
    counts = np.asarray(lengths)
    if counts.shape != (batch.shape[0],) or counts.dtype.kind not in "iu":
        raise TypeError(f"lengths must be {batch.shape[0]} integers, one per document of the batch")
    if counts.size and (counts.min() < 0 or counts.max() > batch.shape[1]):
        raise ValueError(f"lengths must be between 0 and the batch's {batch.shape[1]} tokens")
    return [batch[i, :counts[i]] for i in range(batch.shape[0])]


# ---- Building corpora: documents are packed in batches, in parallel, into consecutive bytes. ----

# A batch ends at this many documents or source bytes: the working set beside the output.
DEF _BATCH_DOCUMENTS = 4096
DEF _BATCH_BYTES = 64 << 20


cdef bint _is_plain_matrix(object obj) except -1:
    """Whether `obj` is a NumPy matrix that _as_matrix returns as it is (2-D, depth > 0, rows contiguous
    along depth): one buffer request instead of building each document's error context (a role string
    and several attribute reads cost about 1 us a document, serially, before packing starts)."""
    cdef Py_buffer view
    if type(obj) is not np.ndarray:
        return False
    PyObject_GetBuffer(obj, &view, PyBUF_STRIDES)
    plain = view.ndim == 2 and view.shape[1] > 0 and (view.shape[0] == 0 or view.shape[1] == 1 or
                                                      view.strides[1] == view.itemsize)
    PyBuffer_Release(&view)
    return plain


cdef object _checked_matrix(object document, uint64_t index):
    """Document `index` as _as_matrix checks it, its error context built only when it is not plain."""
    return document if _is_plain_matrix(document) else _as_matrix(document, f"document {index}")


cdef list _matrices_of(object documents):
    """The checked 2-D arrays of an iterable of documents."""
    matrices = []
    for document in documents:
        matrices.append(_checked_matrix(document, len(matrices)))
    return matrices


def _documents_of(documents, offsets, lengths, mask):
    """(iterator of the documents as given, their count or None, whether they are all at hand) for every
    input kind maxsim_pack_corpus takes."""
    if _is_array_like(documents) or (lengths is not None or mask is not None):
        batch = _as_array(documents, "documents")
        if batch.ndim == 3:
            if offsets is not None:
                raise TypeError("offsets= is for a flat token matrix; a padded batch takes lengths= or mask=")
            items = _batch_documents(batch, lengths, mask)
            return iter(items), len(items), True
        if lengths is not None or mask is not None:
            raise TypeError(f"lengths= and mask= are for a padded 3-D batch, not a {batch.ndim}-D array")
        if offsets is None:
            raise TypeError("documents must be an iterable of 2-D matrices, one token matrix with offsets=, or a "
                            "padded 3-D batch with lengths= or mask=")
        documents = batch
    if offsets is not None:
        tokens = _as_matrix(documents, "documents")
        bounds = np.asarray(offsets)
        if bounds.ndim != 1 or bounds.dtype.kind not in "iu" or bounds.size < 1:
            raise TypeError("offsets must be a 1-D integer sequence of document boundaries [0, ..., total_rows]")
        if bounds[0] != 0 or bounds[-1] != tokens.shape[0] or np.any(np.diff(bounds) < 0):
            raise ValueError(f"offsets must start at 0, be non-decreasing and end at the token count "
                             f"{tokens.shape[0]}")
        return (tokens[bounds[i]:bounds[i + 1]] for i in range(bounds.size - 1)), bounds.size - 1, True
    if isinstance(documents, (str, bytes)) or not hasattr(documents, "__iter__"):
        raise TypeError("documents must be an iterable of 2-D matrices (a list, a generator ...), one token matrix "
                        "with offsets=, or a padded 3-D batch with lengths= or mask=")
    sized = hasattr(documents, "__len__") and hasattr(documents, "__getitem__")
    return iter(documents), len(documents) if sized else None, sized


cdef class _Progress:
    """Reports packed documents to a callable (done, total or None) or a tqdm-style object (update(n))."""
    cdef object target
    cdef object total
    cdef uint64_t done

    def __init__(self, target, total):
        if target is not None and not (hasattr(target, "update") or callable(target)):
            raise TypeError("progress must be a callable (done, total) or an object with update(n), like tqdm")
        self.target, self.total, self.done = target, total, 0

    cdef int advance(self, uint64_t count) except -1:
        self.done += count
        if self.target is None:
            return 0
        if hasattr(self.target, "update"):
            self.target.update(count)
        else:
            self.target(self.done, self.total)
        return 0


cdef class _CorpusBuilder:
    """Documents packed batch by batch into consecutive corpus bytes (documents from byte 128 on, in
    order), with the entries of every document so far. `sink` receives each packed batch: None packs
    straight into a growing region of memory, a file object gets the bytes written."""
    cdef object sink
    cdef nk_checksum_t checksum   # of the bytes written to a sink so far (after the header)
    cdef nk_region_t region       # in memory: the corpus bytes
    cdef nk_corpus_entry_t *entries
    cdef uint64_t capacity, documents, end, depth, restriction, threads
    cdef int code
    cdef str name
    cdef bint name_fixed          # dtype given, or inferred from every document up front
    cdef _Progress progress

    def __cinit__(self):
        self.region.base = NULL
        self.region.reserved = self.region.committed = 0
        self.entries = NULL
        self.capacity = self.documents = self.depth = 0
        self.end = NK_CORPUS_DOCUMENTS_OFFSET
        nk_checksum_init(&self.checksum)

    def __dealloc__(self):
        nk_region_release(&self.region)
        free(self.entries)

    cdef int setup(self, object sink, object name, uint64_t restriction, object threads, _Progress progress,
                   uint64_t expected_bytes) except -1:
        self.sink, self.restriction, self.progress = sink, restriction, progress
        self.threads = _thread_count(threads)
        self.name = name
        self.name_fixed = name is not None
        if sink is None:
            # In memory: the exact size when it is known, else address space to grow into without copying.
            for size in ([expected_bytes] if expected_bytes else [1 << 40, 1 << 36, 1 << 32]):
                if nk_region_reserve(&self.region, <size_t>size):
                    return 0
            raise MemoryError(f"cannot reserve address space for a packed corpus")
        return 0

    cdef int add(self, list matrices, uint64_t first_index) except -1:
        """Pack one batch of checked 2-D arrays (documents first_index, first_index + 1, ...)."""
        cdef uint64_t count = len(matrices), i, start = self.end, end = self.end, bad_document = 0, bad_row = 0
        if not count:
            return 0
        if self.depth == 0:
            self.depth = matrices[0].shape[1]
        if self.name is None:  # inferred from the first document; later ones must fit it exactly
            self.name = _infer_dtype_name(matrices[0], f"document {first_index}")
        _check_depth(self.name, self.depth)
        self.code = _DTYPE_CODES[self.name]
        if self.documents + count > self.capacity:
            grown = max(2 * self.capacity, self.documents + count, 1024)
            table = <nk_corpus_entry_t *>realloc(self.entries, grown * sizeof(nk_corpus_entry_t))
            if table == NULL:
                raise MemoryError(f"cannot grow the table of a corpus to {grown} documents")
            self.entries, self.capacity = table, grown
        rows = np.empty(count, dtype=np.uint64)
        cdef uint64_t[::1] row_counts = rows
        # The sources: rows in the packing format are read in place, anything else through float64.
        sources_memory = np.empty(count * sizeof(nk_pack_source_t), dtype=np.uint8)
        cdef nk_pack_source_t *sources = <nk_pack_source_t *>_data_address(sources_memory)
        cdef Py_buffer view
        cdef uint64_t vectors, width, alignment
        cdef uintptr_t address
        cdef int64_t stride, step
        in_place = {}  # dtype -> its packing code, for dtypes _packing_source read in place in this batch
        kept = []
        for i in range(count):
            matrix = matrices[i]
            PyObject_GetBuffer(matrix, &view, PyBUF_STRIDES)  # a NumPy array from _as_matrix
            vectors, width, address = view.shape[0], view.shape[1], <uintptr_t>view.buf
            stride, step = view.strides[0], view.strides[1]
            PyBuffer_Release(&view)
            if width != self.depth:
                raise ValueError(f"document {first_index + i} has depth {width} but document 0 has depth "
                                 f"{self.depth}")
            if vectors == 0:
                raise ValueError(f"document {first_index + i} has no rows; every document needs at least one token "
                                 f"vector")
            dt = matrix.dtype
            if not self.name_fixed and not (_is_float_dtype(dt) and _holds(self.name, dt)):
                _infer_dtype_name(matrix, f"document {first_index + i}")  # the integer / non-float messages
                raise ValueError(f"document {first_index + i} is {dt}, which {self.name} (inferred from "
                                 f"the first document) does not hold exactly; pass dtype= to pack every document in "
                                 f"one format")
            row_counts[i] = vectors
            code = in_place.get(dt)
            alignment = dt.alignment if code is not None else 1
            if code is None or address % alignment or (vectors > 1 and stride % <int64_t>alignment) or \
                    (width > 1 and step % <int64_t>alignment):  # numpy's `aligned`, which _packing_source asks
                source, code = _packing_source(matrix, self.name)
                if source is matrix:
                    in_place[dt] = code
                else:
                    matrix = source
                    address, stride = _data_address(source), source.strides[0]
            kept.append(matrix)
            sources[i].dtype = code
            sources[i].rows = <const void *>address
            sources[i].row_stride = stride
        cdef nk_corpus_entry_t *batch = self.entries + self.documents
        _raise_for(nk_corpus_plan(&row_counts[0], count, self.depth, self.code, &end, batch),
                   {"what": f"a corpus of {self.documents + count} documents x depth {self.depth} {self.name}"})
        cdef void *out
        cdef uint64_t out_offset, out_nbytes = end - start
        buffer = None
        if self.sink is None:
            if end > self.region.reserved:
                raise MemoryError(f"a packed corpus of {end} bytes does not fit the {self.region.reserved} bytes "
                                  f"reserved for it; pack it in parts")
            if not nk_region_commit(&self.region, <size_t>end):
                raise MemoryError(f"cannot allocate {end} bytes for a packed corpus")
            out, out_offset = self.region.base, 0
            out_nbytes = end
        else:
            buffer = _aligned_bytes(out_nbytes)
            out = <void *>_data_address(buffer)
            out_offset = start
        cdef nk_status_t status
        with nogil:
            status = nk_corpus_pack_documents(batch, sources, count, self.depth, self.code, self.restriction, out,
                                              out_offset, out_nbytes, self.threads, &bad_document, &bad_row)
        if status != nk_ok_k:
            try:
                _raise_for(status, {"what": "packing the corpus", "row": bad_row})
            except ValueError as error:
                raise ValueError(f"document {first_index + bad_document}: {error}") from None
        if buffer is not None:
            self.sink.write(memoryview(buffer))
            nk_checksum_update(&self.checksum, out, out_nbytes)
        self.documents += count
        self.end = end
        self.progress.advance(count)
        return 0

    cdef int feed(self, object items, bint checked=False) except -1:
        """Pack every document of an iterator (of checked matrices: `checked`), batch by batch."""
        batch, batch_bytes = [], 0
        for document in items:
            matrix = document if checked else _checked_matrix(document, self.documents + len(batch))
            batch.append(matrix)
            batch_bytes += matrix.nbytes
            if len(batch) >= _BATCH_DOCUMENTS or batch_bytes >= _BATCH_BYTES:
                self.add(batch, self.documents)
                batch, batch_bytes = [], 0
        self.add(batch, self.documents)
        return 0

    cdef MaxSimPackedCorpus finish_in_memory(self):
        cdef uint64_t table_offset = 0, nbytes = 0
        if not self.documents:
            raise ValueError("the corpus has no documents; pass at least one")
        _raise_for(nk_corpus_table_place(self.end, self.documents, &table_offset, &nbytes),
                   {"what": f"a corpus of {self.documents} documents"})
        if nbytes > self.region.reserved or not nk_region_commit(&self.region, <size_t>nbytes):
            raise MemoryError(f"cannot allocate {nbytes} bytes for a packed corpus")
        cdef MaxSimPackedCorpus corpus = MaxSimPackedCorpus.__new__(MaxSimPackedCorpus)
        with nogil:
            status = nk_corpus_finish_table(self.region.base, self.entries, self.documents, self.depth, self.code,
                                            self.restriction, table_offset, nbytes, &corpus.corpus)
        _raise_for(status, {"what": "finishing the corpus"})
        # The corpus takes the memory and the entries (its private table).
        corpus._owned, corpus._owned_reserved = self.region.base, self.region.reserved
        self.region.base = NULL
        self.region.reserved = 0
        corpus._table, self.entries = self.entries, NULL
        corpus.corpus.table = corpus._table
        corpus._unsealed = True  # the file checksum waits for the first export (a serial pass over every byte)
        return corpus

    cdef bytes finish_stream(self):
        """Write the table and padding to the sink; the header (with the checksum) to write at byte 0."""
        cdef uint64_t table_offset = 0, nbytes = 0, i
        cdef nk_corpus_info_t info
        if not self.documents:
            raise ValueError("the corpus has no documents; append at least one")
        _raise_for(nk_corpus_table_place(self.end, self.documents, &table_offset, &nbytes),
                   {"what": f"a corpus of {self.documents} documents"})
        tail = bytearray(nbytes - self.end)  # zeros up to the table (none: documents end aligned), table, padding
        cdef uint64_t table_bytes = self.documents * sizeof(nk_corpus_entry_t)
        tail[table_offset - self.end:table_offset - self.end + table_bytes] = \
            (<char *>self.entries)[:table_bytes]
        self.sink.write(tail)
        cdef const unsigned char[::1] view = tail
        if tail:
            nk_checksum_update(&self.checksum, &view[0], len(tail))
        info.documents, info.depth, info.dtype = self.documents, self.depth, self.code
        info.total_vectors = 0
        for i in range(self.documents):
            info.total_vectors += self.entries[i].vectors
        info.nbytes, info.capabilities, info.table_offset = nbytes, self.restriction, table_offset
        info.checksum = nk_checksum_final(&self.checksum)
        header = bytearray(NK_CORPUS_DOCUMENTS_OFFSET)
        cdef unsigned char[::1] header_view = header
        nk_corpus_header_write(&info, &header_view[0])
        return bytes(header)


def _checksum(data):
    """nk_checksum of a bytes-like object (what a corpus header stores for bytes [128, nbytes))."""
    cdef const unsigned char[::1] view = memoryview(data).cast("B")
    cdef nk_checksum_t state
    nk_checksum_init(&state)
    if view.shape[0]:
        nk_checksum_update(&state, &view[0], view.shape[0])
    return nk_checksum_final(&state)


def _aligned_bytes(uint64_t nbytes):
    """A 64-byte aligned uint8 NumPy array of nbytes (its memory freed with it)."""
    raw = np.empty(nbytes + 64, dtype=np.uint8)
    start = (64 - _data_address(raw) % 64) % 64
    return raw[start:start + nbytes]


def maxsim_pack_corpus(documents, /, dtype=None, *, offsets=None, lengths=None, mask=None, threads=None,
                       progress=None, capabilities=None, stream=None):
    """Pack many documents of different lengths into one MaxSimPackedCorpus.

    documents: any iterable of 2-D matrices [rows_i, depth] (a list, a generator ...); or (with offsets=)
       one flat token matrix [total_rows, depth] where document i is rows offsets[i] .. offsets[i+1]
       (offsets[0] == 0, offsets[-1] == total_rows, non-decreasing); or a padded batch [documents,
       tokens, depth] (NumPy, torch, any DLPack or buffer object) with lengths= (tokens per document) or
       mask= (documents x tokens, true for real tokens, as PyLate's documents_mask), so that padding
       rows never count. Documents are packed in batches as they come: a generator is never held whole.
    dtype: packing dtype as in maxsim_pack(); None keeps the inputs' format (the narrowest holding all;
       for a generator, the first document's format, which every later one must fit exactly).
    threads: packing threads (default: every core this process may use); the GIL is released.
    progress: a callable progress(done, total) (total None for a generator) or an object with
       update(n) such as a tqdm bar, told after every batch.
    capabilities: a Capability mask to restrict scoring to (as in maxsim_pack); None for no restriction.
    Every document needs at least one row and the same depth.
    """
    _check_stream(stream)
    cdef uint64_t restriction = _resolve_capabilities(capabilities, NK_CAPABILITIES_ANY)
    items, total, at_hand = _documents_of(documents, offsets, lengths, mask)
    name = None if dtype is None else _dtype_name(dtype)
    cdef uint64_t expected_bytes = 0
    cdef _CorpusBuilder builder = _CorpusBuilder()
    if at_hand:  # every document is here: the format that holds them all, and the exact size up front
        matrices = _matrices_of(items)
        if not matrices:
            raise ValueError("the corpus has no documents; pass at least one")
        if name is None:
            first_of = {}  # the first document of each dtype: the one an error names
            for position, matrix in enumerate(matrices):
                first_of.setdefault(matrix.dtype, position)
            for position in sorted(first_of.values()):
                _infer_dtype_name(matrices[position], f"document {position}")
            name = _narrowest_holding(*sorted(first_of, key=str))
        if all(matrix.shape[0] and matrix.shape[1] == matrices[0].shape[1] for matrix in matrices):
            expected_bytes = _corpus_size(np.array([m.shape[0] for m in matrices], dtype=np.uint64),
                                          matrices[0].shape[1], _DTYPE_CODES[name])
        items = iter(matrices)
    builder.setup(None, name, restriction, threads, _Progress(progress, total), expected_bytes)
    builder.feed(items, at_hand)
    return builder.finish_in_memory()


class MaxSimCorpusWriter:
    """Builds a corpus file document batch by batch, for collections larger than memory.

        with numkong.MaxSimCorpusWriter("corpus.nkc") as writer:
            for batch in batches:
                writer.append(batch)      # anything maxsim_pack_corpus takes, packed and written now
        corpus = numkong.MaxSimPackedCorpus.load("corpus.nkc")

    The file appears at `path` only when close() (or the end of the with block) finishes it, atomically,
    as save() writes; an exception inside the block discards it. dtype, threads and capabilities are as
    in maxsim_pack_corpus (dtype=None: the first document's format). Memory: one batch at a time.
    """

    def __init__(self, path, *, dtype=None, threads=None, capabilities=None, progress=None):
        self._path = os.fspath(path)
        restriction = _resolve_capabilities(capabilities, NK_CAPABILITIES_ANY)
        directory = os.path.dirname(os.path.abspath(self._path))
        handle, self._temporary = _tempfile.mkstemp(prefix="." + os.path.basename(self._path) + ".", suffix=".tmp",
                                                    dir=directory)
        self._file = open(handle, "w+b")
        self._file.write(bytes(NK_CORPUS_DOCUMENTS_OFFSET))  # the header, written last
        self._builder = _CorpusBuilder()
        (<_CorpusBuilder>self._builder).setup(self._file, None if dtype is None else _dtype_name(dtype), restriction,
                                              threads, _Progress(progress, None), 0)

    @property
    def documents(self):
        """Documents appended so far."""
        return (<_CorpusBuilder>self._builder).documents if self._builder is not None else 0

    def append(self, documents, /, *, offsets=None, lengths=None, mask=None):
        """Pack `documents` (anything maxsim_pack_corpus takes) and write them after the earlier ones."""
        if self._builder is None:
            raise ValueError("this MaxSimCorpusWriter is closed")
        items, _, _ = _documents_of(documents, offsets, lengths, mask)
        try:
            (<_CorpusBuilder>self._builder).feed(items)
        except BaseException:
            self.abort()
            raise

    def close(self):
        """Finish the file: table, checksum and header, flushed, synced and renamed to `path`."""
        if self._builder is None:
            return
        try:
            header = (<_CorpusBuilder>self._builder).finish_stream()
            self._file.seek(0)
            self._file.write(header)
            self._file.flush()
            os.fsync(self._file.fileno())
            self._file.close()
            os.chmod(self._temporary, 0o666 & ~_UMASK)
            os.replace(self._temporary, self._path)
        except BaseException:
            self.abort()
            raise
        self._builder = None
        _sync_directory(os.path.dirname(os.path.abspath(self._path)))

    def abort(self):
        """Discard what was written (the temporary file); `path` is left as it was."""
        if self._builder is None:
            return
        self._builder = None
        self._file.close()
        try:
            os.unlink(self._temporary)
        except OSError:
            pass

    def __enter__(self):
        return self

    def __exit__(self, kind, value, traceback):
        if kind is None:
            self.close()
        else:
            self.abort()
        return False

    def __del__(self):
        if getattr(self, "_builder", None) is not None:
            self.abort()


cdef uint64_t _thread_count(object threads) except 0:
    """Worker threads for a corpus call: every core this process may use by default, at most the C cap."""
    if threads is None:
        threads = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    elif isinstance(threads, bool):
        raise TypeError("threads must be a positive int or None, not bool")
    else:
        try:
            threads = operator.index(threads)
        except TypeError:
            raise TypeError(f"threads must be a positive int or None, not {type(threads).__name__}") from None
        if threads <= 0:
            raise ValueError(f"threads must be at least 1, got {threads}")
    return min(threads, NK_CORPUS_MAX_THREADS)


def maxsim_packed_corpus(queries, corpus, /, *, top_k=None, threads=None, capabilities=None, stream=None):
    """MaxSim of packed queries against every document of a packed corpus.

    queries: one MaxSimPackedMatrix -> scores of shape [documents]; a sequence of them -> [len(queries),
       documents]. Each score equals maxsim_packed(query, document) exactly (lower is better).
    top_k: None, or k in 1 .. documents: returns (indices, scores) of the k best documents per query,
       lowest score first, ties by ascending index (int64 and float64 arrays), the same as scoring every
       document and sorting; a document stops as soon as its exact partial sum or its screening bounds
       prove it out of a query's current k best, so this is faster than scores plus a sort.
    threads: worker threads (default: every core this process may use); the GIL is released.
    capabilities: defaults to the families the corpus and the queries were packed for.
    """
    if not isinstance(corpus, MaxSimPackedCorpus):
        raise TypeError(f"corpus must be a MaxSimPackedCorpus from numkong.maxsim_pack_corpus(), "
                        f"not {type(corpus).__name__}")
    cdef MaxSimPackedCorpus packed_corpus = corpus
    _check_stream(stream)
    _require_packed(packed_corpus.corpus.data, packed_corpus)
    single = isinstance(queries, MaxSimPackedMatrix)
    query_list = [queries] if single else list(queries) if isinstance(queries, (list, tuple)) else None
    if query_list is None or not all(isinstance(q, MaxSimPackedMatrix) for q in query_list):
        raise TypeError("queries must be a MaxSimPackedMatrix or a list of them (from maxsim_pack)")
    cdef uint64_t stored = packed_corpus.corpus.info.capabilities
    cdef MaxSimPackedMatrix query
    for query in query_list:
        _require_packed(query.matrix.data, query)
        stored &= query.matrix.info.capabilities
    cdef uint64_t mask = _resolve_capabilities(capabilities, _stored_mask(stored))
    cdef uint64_t n_threads = _thread_count(threads)
    cdef uint64_t documents = packed_corpus.corpus.info.documents
    if top_k is not None:
        if isinstance(top_k, bool):
            raise TypeError("top_k must be a positive int or None, not bool")
        try:
            top_k = operator.index(top_k)
        except TypeError:
            raise TypeError(f"top_k must be a positive int or None, not {type(top_k).__name__}") from None
        if top_k <= 0 or top_k > documents:
            raise ValueError(f"top_k must be between 1 and the corpus's {documents} documents, got {top_k}")
    cdef uint64_t n_queries = len(query_list), i, k = 0 if top_k is None else top_k, scratch_bytes = 0
    cdef nk_status_t status
    scores = np.empty((n_queries, k if top_k is not None else documents), dtype=np.float64)
    indices = np.empty((n_queries, k), dtype=np.int64)
    cdef double[:, ::1] out = scores
    cdef int64_t[:, ::1] ranks = indices
    if top_k is not None:
        scratch_bytes = nk_corpus_top_k_scratch_bytes(n_queries, documents, n_threads, k)
        scratch = _aligned_bytes(scratch_bytes)
    cdef void *scratch_at = NULL if top_k is None else <void *>_data_address(scratch)
    cdef nk_maxsim_matrix_t *matrices = <nk_maxsim_matrix_t *>malloc(max(n_queries, 1) * sizeof(nk_maxsim_matrix_t))
    if matrices == NULL:
        raise MemoryError("cannot allocate the query table")
    try:
        for i in range(n_queries):
            matrices[i] = (<MaxSimPackedMatrix>query_list[i]).matrix
        with nogil:
            if k:
                status = nk_maxsim_top_k_corpus(matrices, n_queries, &packed_corpus.corpus, mask, n_threads, k,
                                                scratch_at, scratch_bytes, &ranks[0, 0] if n_queries else NULL,
                                                &out[0, 0] if n_queries else NULL)
            else:
                status = nk_maxsim_score_corpus(matrices, n_queries, &packed_corpus.corpus, mask, n_threads,
                                                &out[0, 0] if out.shape[0] else NULL)
    finally:
        free(matrices)
    if status != nk_ok_k:
        first = query_list[0]
        for query in query_list:  # name a query that does not match, when one does not
            if query.matrix.info.dtype != packed_corpus.corpus.info.dtype or \
                    query.matrix.info.depth != packed_corpus.corpus.info.depth:
                first = query
                break
        _raise_for(status, {"what": "corpus scoring", "left": "queries", "right": "the corpus", "right_verb": "has",
                            "left_depth": first.depth, "right_depth": packed_corpus.depth,
                            "left_dtype": first.dtype, "right_dtype": packed_corpus.dtype, "empty": _CORPUS_EMPTY})
    if top_k is not None:
        return (indices[0], scores[0]) if single else (indices, scores)
    return scores[0] if single else scores


cdef nk_status_t maxsim_packed_corpus_nogil(MaxSimPackedMatrix queries, MaxSimPackedCorpus corpus,
                                            uint64_t capabilities, uint64_t threads, double *scores) noexcept nogil:
    return nk_maxsim_score_corpus(&queries.matrix, 1, &corpus.corpus, capabilities, threads, scores)
