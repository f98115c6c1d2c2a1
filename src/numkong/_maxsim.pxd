# C-level interface of numkong's MaxSim extension, for `cimport` from other Cython modules.
from libc.stdint cimport int64_t, uint32_t, uint64_t


cdef extern from "numkong/maxsim.h" nogil:
    ctypedef enum nk_status_t:
        nk_ok_k
        nk_error_argument_k
        nk_error_overflow_k
        nk_error_nonfinite_k
        nk_error_corrupt_k
        nk_error_buffer_small_k
        nk_error_depth_mismatch_k
        nk_error_dtype_mismatch_k
        nk_error_empty_k

    ctypedef struct nk_maxsim_info_t:
        uint64_t vectors
        uint64_t depth
        uint64_t nbytes
        uint64_t capabilities
        uint32_t dtype

    size_t nk_dtype_itemsize(int dtype)
    nk_status_t nk_maxsim_pack_size(uint64_t vectors, uint64_t depth, int dtype, uint64_t *nbytes)
    nk_status_t nk_maxsim_pack(const void *src, int source_dtype, int64_t row_stride, uint64_t vectors,
                               uint64_t depth, int dtype, uint64_t capabilities, void *out, uint64_t out_nbytes,
                               uint64_t *bad_row)
    nk_status_t nk_maxsim_load(void *buf, uint64_t nbytes, nk_maxsim_info_t *info)
    nk_status_t nk_maxsim_info(const void *buf, nk_maxsim_info_t *info)
    nk_status_t nk_maxsim_score(const void *queries, const void *documents, uint64_t capabilities, double *result)
    nk_status_t nk_maxsim_verify(const void *buf, uint64_t nbytes, nk_maxsim_info_t *info)

    ctypedef struct nk_corpus_info_t:
        uint64_t documents
        uint64_t depth
        uint64_t total_vectors
        uint64_t nbytes
        uint64_t capabilities
        uint32_t dtype

    nk_status_t nk_corpus_pack_size(const uint64_t *lengths, uint64_t documents, uint64_t depth, int dtype,
                                    uint64_t *nbytes)
    nk_status_t nk_corpus_init(const uint64_t *lengths, uint64_t documents, uint64_t depth, int dtype,
                               uint64_t capabilities, void *out, uint64_t out_nbytes)
    void *nk_corpus_document(const void *corpus, uint64_t index, uint64_t *nbytes)
    nk_status_t nk_corpus_verify(const void *buf, uint64_t nbytes, nk_corpus_info_t *info)
    nk_status_t nk_corpus_info(const void *buf, nk_corpus_info_t *info)
    nk_status_t nk_maxsim_score_corpus(const void *const *queries, uint64_t query_count, const void *corpus,
                                       uint64_t capabilities, uint64_t threads, double *scores)

    uint64_t nk_capabilities_compiled()
    uint64_t nk_capabilities_cpu()
    uint64_t nk_capabilities_available()
    void nk_capabilities_disable(uint64_t mask)
    uint64_t nk_capabilities_best(uint64_t mask)


cdef class MaxSimPackedMatrix:
    # One 64-byte aligned allocation holding the whole packed buffer; owned, never resized.
    # Treat every field as read-only: they describe `data` and are set once at construction.
    cdef void *data
    cdef readonly uint64_t vectors
    cdef readonly uint64_t depth
    cdef readonly uint64_t nbytes
    # C-level only (Python reads .dtype and .capabilities): an nk_dtype_t and the packing mask.
    cdef uint32_t dtype_code
    cdef uint64_t packed_capabilities
    cdef Py_ssize_t _buffer_shape[1]
    cdef Py_ssize_t _buffer_strides[1]


cdef class MaxSimPackedCorpus:
    # The corpus bytes: an owned 64-byte aligned allocation, or a read-only view of another object
    # (a memory-mapped file, an out-of-band pickle buffer) kept alive through `_view`.
    cdef void *data
    cdef readonly bint owns_data  # False when viewing a memory map or another object's buffer
    cdef bint _has_view
    cdef Py_buffer _view
    cdef readonly uint64_t documents
    cdef readonly uint64_t depth
    cdef readonly uint64_t total_vectors
    cdef readonly uint64_t nbytes
    cdef uint32_t dtype_code  # C-level only, as in MaxSimPackedMatrix
    cdef uint64_t packed_capabilities
    cdef Py_ssize_t _buffer_shape[1]
    cdef Py_ssize_t _buffer_strides[1]


# Score two packed matrices without the GIL. Returns an nk_status_t; the score goes to *result.
cdef nk_status_t maxsim_packed_nogil(MaxSimPackedMatrix queries, MaxSimPackedMatrix documents,
                                     uint64_t capabilities, double *result) noexcept nogil


# Score packed queries against every document of a corpus without the GIL (see nk_maxsim_score_corpus).
cdef nk_status_t maxsim_packed_corpus_nogil(MaxSimPackedMatrix queries, MaxSimPackedCorpus corpus,
                                            uint64_t capabilities, uint64_t threads, double *scores) noexcept nogil
