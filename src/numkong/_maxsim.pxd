# C-level interface of numkong's MaxSim extension, for `cimport` from other Cython modules.
# Every constant (statuses, dtype codes, capability bits, format versions) comes from the C header.
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
        nk_error_version_k
        nk_error_range_k

    ctypedef enum nk_dtype_t:
        nk_dtype_float64_k
        nk_dtype_float32_k
        nk_dtype_float16_k
        nk_dtype_bfloat16_k
        nk_dtype_e4m3_k
        nk_dtype_e5m2_k
        nk_dtype_e2m3_k
        nk_dtype_e3m2_k
        nk_dtype_int8_k
        nk_dtype_int4_k
        nk_dtype_uint1_k

    enum:
        nk_cap_serial_k
        nk_cap_haswell_k
        nk_cap_skylake_k
        nk_cap_icelake_k
        nk_cap_genoa_k
        nk_cap_sapphireamx_k
        nk_cap_neon_k
        nk_cap_sve_k
        nk_cap_families_k

    uint64_t NK_CAPABILITIES_ANY
    uint64_t NK_CORPUS_MAX_THREADS
    uint64_t NK_INTEGER_MAX_DEPTH
    uint32_t NK_MAXSIM_FORMAT_VERSION
    uint32_t NK_CORPUS_FORMAT_VERSION

    ctypedef struct nk_maxsim_info_t:
        uint64_t vectors
        uint64_t depth
        uint64_t nbytes
        uint64_t capabilities
        uint32_t dtype

    ctypedef struct nk_maxsim_matrix_t:
        const void *data
        nk_maxsim_info_t info

    size_t nk_dtype_itemsize(int dtype)
    nk_status_t nk_maxsim_pack_size(uint64_t vectors, uint64_t depth, int dtype, uint64_t *nbytes)
    nk_status_t nk_maxsim_pack(const void *src, int source_dtype, int64_t row_stride, uint64_t vectors,
                               uint64_t depth, int dtype, uint64_t capabilities, void *out, uint64_t out_nbytes,
                               uint64_t *bad_row)
    nk_status_t nk_maxsim_load(void *buf, uint64_t nbytes, nk_maxsim_info_t *info)
    nk_status_t nk_maxsim_verify(const void *buf, uint64_t nbytes, nk_maxsim_info_t *info)
    nk_status_t nk_maxsim_info(const void *buf, nk_maxsim_info_t *info)
    const void *nk_maxsim_values(const nk_maxsim_matrix_t *matrix)
    nk_status_t nk_maxsim_dequantize(const nk_maxsim_matrix_t *matrix, uint64_t first, uint64_t count, double *out)
    uint32_t nk_maxsim_format_version(const void *buf, uint64_t nbytes)
    uint32_t nk_corpus_format_version(const void *buf, uint64_t nbytes)
    nk_status_t nk_maxsim_score_matrices(const nk_maxsim_matrix_t *queries, const nk_maxsim_matrix_t *documents,
                                         uint64_t capabilities, double *result)
    nk_status_t nk_maxsim_score(const void *queries, const void *documents, uint64_t capabilities, double *result)
    int nk_maxsim_unpacked_available(uint64_t capabilities)
    uint64_t nk_maxsim_unpacked_scratch_bytes(uint64_t query_vectors, uint64_t depth, uint64_t max_rows)
    nk_status_t nk_maxsim_unpacked_f32(const nk_maxsim_matrix_t *query, const float *const *documents,
                                       const uint64_t *rows, const int64_t *strides, uint64_t count,
                                       uint64_t capabilities, void *scratch, uint64_t scratch_bytes,
                                       double *scores) nogil

    ctypedef struct nk_corpus_entry_t:
        uint64_t offset
        uint64_t vectors

    ctypedef struct nk_corpus_info_t:
        uint64_t documents
        uint64_t depth
        uint64_t total_vectors
        uint64_t nbytes
        uint64_t capabilities
        uint64_t table_offset
        uint64_t checksum
        uint32_t dtype

    ctypedef struct nk_corpus_t:
        const void *data
        nk_corpus_info_t info
        const nk_corpus_entry_t *table

    ctypedef struct nk_checksum_t:
        pass
    void nk_checksum_init(nk_checksum_t *state)
    void nk_checksum_update(nk_checksum_t *state, const void *data, uint64_t nbytes)
    uint64_t nk_checksum_final(const nk_checksum_t *state)

    uint64_t NK_CORPUS_DOCUMENTS_OFFSET
    nk_status_t nk_corpus_plan(const uint64_t *lengths, uint64_t count, uint64_t depth, int dtype, uint64_t *end,
                               nk_corpus_entry_t *entries)

    ctypedef struct nk_pack_source_t:
        const void *rows
        int64_t row_stride
        int dtype

    nk_status_t nk_corpus_pack_documents(const nk_corpus_entry_t *entries, const nk_pack_source_t *sources,
                                         uint64_t count, uint64_t depth, int dtype, uint64_t capabilities, void *out,
                                         uint64_t out_offset, uint64_t out_nbytes, uint64_t threads,
                                         uint64_t *bad_document, uint64_t *bad_row)
    nk_status_t nk_corpus_table_place(uint64_t end, uint64_t documents, uint64_t *table_offset, uint64_t *nbytes)
    void nk_corpus_header_write(const nk_corpus_info_t *info, void *header)
    nk_status_t nk_corpus_pack_size(const uint64_t *lengths, uint64_t documents, uint64_t depth, int dtype,
                                    uint64_t *nbytes)
    nk_status_t nk_corpus_finish(void *data, const nk_corpus_entry_t *entries, uint64_t documents, uint64_t depth,
                                 int dtype, uint64_t capabilities, uint64_t table_offset, uint64_t nbytes,
                                 nk_corpus_t *corpus)
    nk_status_t nk_corpus_finish_table(void *data, const nk_corpus_entry_t *entries, uint64_t documents,
                                       uint64_t depth, int dtype, uint64_t capabilities, uint64_t table_offset,
                                       uint64_t nbytes, nk_corpus_t *corpus)
    void nk_corpus_seal(nk_corpus_t *corpus)
    nk_maxsim_matrix_t nk_corpus_document(const nk_corpus_t *corpus, uint64_t index, uint64_t *nbytes)
    nk_status_t nk_corpus_header(const void *buf, uint64_t nbytes, nk_corpus_info_t *info)
    enum:
        NK_CORPUS_VERIFY_LAYOUT
        NK_CORPUS_VERIFY_CHECKSUM
        NK_CORPUS_VERIFY_ALL
    nk_status_t nk_corpus_verify(const void *buf, const nk_corpus_info_t *info, nk_corpus_entry_t *table, int level)
    nk_status_t nk_maxsim_score_corpus(const nk_maxsim_matrix_t *queries, uint64_t query_count,
                                       const nk_corpus_t *corpus, uint64_t capabilities, uint64_t threads,
                                       double *scores)
    uint64_t nk_corpus_top_k_scratch_bytes(uint64_t query_count, uint64_t documents, uint64_t threads, uint64_t k)
    nk_status_t nk_maxsim_top_k_corpus(const nk_maxsim_matrix_t *queries, uint64_t query_count,
                                       const nk_corpus_t *corpus, uint64_t capabilities, uint64_t threads, uint64_t k,
                                       void *scratch, uint64_t scratch_bytes, int64_t *indices, double *scores)

    uint64_t nk_capabilities_compiled()
    uint64_t nk_capabilities_cpu()
    uint64_t nk_capabilities_available()
    void nk_capabilities_disable(uint64_t mask)
    uint64_t nk_capabilities_best(uint64_t mask)


cdef class MaxSimPackedMatrix:
    # The packed bytes and their validated header (matrix.info). Scoring reads sections at offsets
    # derived from matrix.info, never the header bytes again. Set once at construction: read-only.
    cdef nk_maxsim_matrix_t matrix
    cdef void *_owned       # the allocation holding the bytes, or NULL when they belong to _base
    cdef object _base       # what keeps borrowed bytes alive (a corpus, for corpus[i])
    cdef Py_ssize_t _buffer_shape[1]
    cdef Py_ssize_t _buffer_strides[1]


cdef class MaxSimPackedCorpus:
    # The corpus bytes (owned, a private read-only file mapping, or a read-only buffer of another
    # object kept in _view), with the header and document table as validated, in memory this object
    # owns: corpus.table points to _table, never into the bytes.
    cdef nk_corpus_t corpus
    cdef nk_corpus_entry_t *_table
    cdef void *_owned               # page-aligned memory this object owns (see _corpus.pxi), or NULL
    cdef uint64_t _owned_reserved
    cdef void *_mapping
    cdef uint64_t _mapping_bytes
    cdef bint _has_view
    cdef Py_buffer _view
    cdef Py_ssize_t _buffer_shape[1]
    cdef Py_ssize_t _buffer_strides[1]
    cdef bint _unsealed             # built in memory, its header's checksum not computed yet (_corpus.pxi)
    cdef uint64_t _index(self, object index) except? 0
    cdef MaxSimPackedMatrix _item(self, uint64_t i)


# Score two packed matrices without the GIL. Returns an nk_status_t; the score goes to *result.
cdef nk_status_t maxsim_packed_nogil(MaxSimPackedMatrix queries, MaxSimPackedMatrix documents,
                                     uint64_t capabilities, double *result) noexcept nogil


# Score packed queries against every document of a corpus without the GIL (see nk_maxsim_score_corpus).
cdef nk_status_t maxsim_packed_corpus_nogil(MaxSimPackedMatrix queries, MaxSimPackedCorpus corpus,
                                            uint64_t capabilities, uint64_t threads, double *scores) noexcept nogil
