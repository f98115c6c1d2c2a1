/* Packed corpora (many variable-length documents in one buffer) and multi-threaded scoring. */
#include <pthread.h>

#include "maxsim_internal.h"

static int nk_add_u64(uint64_t a, uint64_t b, uint64_t *out) { return !__builtin_add_overflow(a, b, out); }
static int nk_align_u64(uint64_t a, uint64_t *out) {
    if (!nk_add_u64(a, NK_SECTION_ALIGN - 1, out)) return 0;
    *out &= ~(uint64_t)(NK_SECTION_ALIGN - 1);
    return 1;
}

/* Lay out the corpus into *h: the one source of every offset, shared by sizing, packing and
 * verification. lengths[i * stride] is document i's row count. The table is written (mode 1),
 * compared (mode 2: nk_error_corrupt_k on the first difference) or ignored (mode 0). */
enum { nk_table_ignore_k = 0, nk_table_write_k = 1, nk_table_compare_k = 2 };
static nk_status_t nk_corpus_layout(uint64_t const *lengths, size_t stride, uint64_t documents, uint64_t depth,
                                    int dtype, nk_corpus_header_t *h, nk_corpus_entry_t *table, int mode) {
    if (!nk_dtype_itemsize(dtype) || (documents && !lengths)) return nk_error_argument_k;
    memset(h, 0, sizeof(*h));
    memcpy(h->magic, NK_CORPUS_MAGIC, 8);
    h->version = NK_CORPUS_VERSION;
    h->dtype = (uint32_t)dtype;
    h->depth = depth;
    h->documents = documents;
    h->table_offset = NK_HEADER_BYTES;
    uint64_t table_bytes, cursor;
    if (__builtin_mul_overflow(documents, (uint64_t)sizeof(nk_corpus_entry_t), &table_bytes) ||
        !nk_add_u64(NK_HEADER_BYTES, table_bytes, &cursor))
        return nk_error_overflow_k;
    for (uint64_t i = 0; i < documents; ++i) {
        uint64_t offset, bytes, vectors = lengths[i * stride];
        nk_status_t status = nk_maxsim_pack_size(vectors, depth, dtype, &bytes);
        if (status != nk_ok_k) return status;
        if (!nk_align_u64(cursor, &offset) || !nk_add_u64(offset, bytes, &cursor) ||
            !nk_add_u64(h->total_vectors, vectors, &h->total_vectors))
            return nk_error_overflow_k;
        if (mode == nk_table_write_k) table[i] = (nk_corpus_entry_t){offset, vectors};
        if (mode == nk_table_compare_k && table[i].offset != offset) return nk_error_corrupt_k;
    }
    if (!nk_align_u64(cursor, &h->nbytes) || h->nbytes > (uint64_t)INT64_MAX || h->nbytes > (uint64_t)SIZE_MAX)
        return nk_error_overflow_k;
    return nk_ok_k;
}

nk_status_t nk_corpus_pack_size(uint64_t const *lengths, uint64_t documents, uint64_t depth, int dtype,
                                uint64_t *nbytes) {
    nk_corpus_header_t h;
    nk_status_t status = nk_corpus_layout(lengths, 1, documents, depth, dtype, &h, NULL, nk_table_ignore_k);
    if (status == nk_ok_k) *nbytes = h.nbytes;
    return status;
}

nk_status_t nk_corpus_init(uint64_t const *lengths, uint64_t documents, uint64_t depth, int dtype,
                           uint64_t capabilities, void *out, uint64_t out_nbytes) {
    nk_corpus_header_t h;
    nk_status_t status = nk_corpus_layout(lengths, 1, documents, depth, dtype, &h, NULL, nk_table_ignore_k);
    if (status != nk_ok_k) return status;
    if (!out || ((uintptr_t)out) % NK_SECTION_ALIGN != 0) return nk_error_argument_k;
    if (out_nbytes < h.nbytes) return nk_error_buffer_small_k;
    h.capabilities = capabilities;
    memset(out, 0, h.nbytes);
    memcpy(out, &h, sizeof(h));
    nk_corpus_layout(lengths, 1, documents, depth, dtype, &h, (nk_corpus_entry_t *)((char *)out + NK_HEADER_BYTES),
                     nk_table_write_k);
    return nk_ok_k;
}

void *nk_corpus_document(void const *corpus, uint64_t index, uint64_t *nbytes) {
    nk_corpus_header_t const *h = (nk_corpus_header_t const *)corpus;
    nk_corpus_entry_t const *table = (nk_corpus_entry_t const *)((char const *)corpus + h->table_offset);
    if (nbytes) nk_maxsim_pack_size(table[index].vectors, h->depth, (int)h->dtype, nbytes);
    return (char *)(uintptr_t)corpus + table[index].offset;
}

nk_status_t nk_corpus_verify(void const *buf, uint64_t nbytes, nk_corpus_info_t *info) {
    if (!buf || ((uintptr_t)buf) % NK_SECTION_ALIGN != 0) return nk_error_argument_k;
    if (nbytes < NK_HEADER_BYTES) return nk_error_corrupt_k;
    nk_corpus_header_t given, expected;
    memcpy(&given, buf, sizeof(given));
    /* The table must lie inside the bytes before any length in it is read. */
    uint64_t table_end;
    if (memcmp(given.magic, NK_CORPUS_MAGIC, 8) != 0 || given.version != NK_CORPUS_VERSION ||
        __builtin_mul_overflow(given.documents, (uint64_t)sizeof(nk_corpus_entry_t), &table_end) ||
        !nk_add_u64(table_end, NK_HEADER_BYTES, &table_end) || table_end > nbytes)
        return nk_error_corrupt_k;
    nk_corpus_entry_t *table = (nk_corpus_entry_t *)((char *)(uintptr_t)buf + NK_HEADER_BYTES);
    if (nk_corpus_layout(&table[0].vectors, 2, given.documents, given.depth, (int)given.dtype, &expected, table,
                         nk_table_compare_k) != nk_ok_k)
        return nk_error_corrupt_k;
    expected.capabilities = given.capabilities;
    if (memcmp(&expected, &given, sizeof(given)) != 0 || given.nbytes != nbytes) return nk_error_corrupt_k;
    for (uint64_t i = 0; i < given.documents; ++i) {
        uint64_t bytes;
        void const *document = nk_corpus_document(buf, i, &bytes);
        nk_maxsim_info_t document_info;
        if (nk_maxsim_verify(document, bytes, &document_info) != nk_ok_k || document_info.dtype != given.dtype ||
            document_info.depth != given.depth || document_info.vectors != table[i].vectors)
            return nk_error_corrupt_k;
    }
    return nk_corpus_info(buf, info);
}

nk_status_t nk_corpus_info(void const *buf, nk_corpus_info_t *info) {
    nk_corpus_header_t const *h = (nk_corpus_header_t const *)buf;
    if (!buf || memcmp(h->magic, NK_CORPUS_MAGIC, 8) != 0) return nk_error_corrupt_k;
    info->documents = h->documents;
    info->depth = h->depth;
    info->total_vectors = h->total_vectors;
    info->nbytes = h->nbytes;
    info->capabilities = h->capabilities;
    info->dtype = h->dtype;
    return nk_ok_k;
}

/* ---- scoring: documents are handed out one at a time (lengths vary) through an atomic counter ---- */

typedef struct nk_corpus_job {
    void const *const *queries;
    uint64_t query_count;
    void const *corpus;
    uint64_t documents;
    uint64_t capabilities;
    double *scores;
    uint64_t next; /* atomic */
} nk_corpus_job_t;

/* Documents are claimed a few at a time so that a worker knows its next one and can ask for its
 * screening sections (everything after the values, which only candidates touch) while it scores
 * the current one: a corpus comes from memory, not from cache. */
#define NK_CORPUS_CLAIM 4u

static void nk_corpus_prefetch(void const *corpus, uint64_t index) {
    uint64_t nbytes;
    char const *document = (char const *)nk_corpus_document(corpus, index, &nbytes);
    uint64_t first = ((nk_maxsim_header_t const *)(void const *)document)->inv_norms_offset;
    for (uint64_t at = first; at < nbytes; at += 64) __builtin_prefetch(document + at, 0, 2);
}

static void *nk_corpus_worker(void *argument) {
    nk_corpus_job_t *job = (nk_corpus_job_t *)argument;
    for (;;) {
        uint64_t first = __atomic_fetch_add(&job->next, NK_CORPUS_CLAIM, __ATOMIC_RELAXED);
        if (first >= job->documents) return NULL;
        uint64_t end = job->documents - first < NK_CORPUS_CLAIM ? job->documents : first + NK_CORPUS_CLAIM;
        for (uint64_t document = first; document < end; ++document) {
            if (document + 1 < end) nk_corpus_prefetch(job->corpus, document + 1);
            void const *packed = nk_corpus_document(job->corpus, document, NULL);
            /* All queries against one document while it is hot in cache. */
            for (uint64_t i = 0; i < job->query_count; ++i)
                nk_maxsim_score_cold(job->queries[i], packed, job->capabilities,
                                     &job->scores[i * job->documents + document]);
        }
    }
}

#define NK_MAX_THREADS 256
#define NK_CORPUS_STACK_BYTES (1u << 20)

nk_status_t nk_maxsim_score_corpus(void const *const *queries, uint64_t query_count, void const *corpus,
                                   uint64_t capabilities, uint64_t threads, double *scores) {
    if ((query_count && !queries) || !corpus || (!scores && query_count)) return nk_error_argument_k;
    nk_corpus_header_t const *h = (nk_corpus_header_t const *)corpus;
    for (uint64_t i = 0; i < query_count; ++i) {
        nk_maxsim_info_t info;
        nk_maxsim_info(queries[i], &info);
        if (info.dtype != h->dtype) return nk_error_dtype_mismatch_k;
        if (info.depth != h->depth) return nk_error_depth_mismatch_k;
    }
    nk_corpus_entry_t const *table = (nk_corpus_entry_t const *)((char const *)corpus + h->table_offset);
    for (uint64_t i = 0; i < h->documents; ++i)
        if (table[i].vectors == 0) return nk_error_empty_k;
    nk_corpus_job_t job = {queries, query_count, corpus, h->documents, capabilities, scores, 0};
    if (threads < 1) threads = 1;
    if (threads > NK_MAX_THREADS) threads = NK_MAX_THREADS;
    if (threads > h->documents) threads = h->documents ? h->documents : 1;
    pthread_t helpers[NK_MAX_THREADS];
    uint64_t started = 0;
    /* The kernels keep their scratch on the stack (under 256 KB): more than some C libraries give a
     * new thread by default (musl: 128 KB), so ask for it. */
    pthread_attr_t attributes;
    int have_attributes = pthread_attr_init(&attributes) == 0;
    if (have_attributes) pthread_attr_setstacksize(&attributes, NK_CORPUS_STACK_BYTES);
    for (; started + 1 < threads; ++started)
        if (pthread_create(&helpers[started], have_attributes ? &attributes : NULL, nk_corpus_worker, &job) != 0)
            break; /* fewer threads is fine */
    if (have_attributes) pthread_attr_destroy(&attributes);
    nk_corpus_worker(&job);
    for (uint64_t i = 0; i < started; ++i) pthread_join(helpers[i], NULL);
    return nk_ok_k;
}
