/* Packed corpora (many variable-length documents in one buffer) and multi-threaded scoring. */
#ifdef _WIN32
#include <windows.h>
#else
#include <pthread.h>
#endif

#include "maxsim_internal.h"

static int nk_align_u64(uint64_t a, uint64_t *out) {
    if (!nk_u64_add(a, NK_SECTION_ALIGN - 1, out)) return 0;
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
    h->version = NK_CORPUS_FORMAT_VERSION;
    h->dtype = (uint32_t)dtype;
    h->depth = depth;
    h->documents = documents;
    h->table_offset = NK_HEADER_BYTES;
    uint64_t table_bytes, cursor;
    if (!nk_u64_mul(documents, (uint64_t)sizeof(nk_corpus_entry_t), &table_bytes) ||
        !nk_u64_add(NK_HEADER_BYTES, table_bytes, &cursor))
        return nk_error_overflow_k;
    for (uint64_t i = 0; i < documents; ++i) {
        uint64_t offset, bytes, vectors = lengths[i * stride];
        nk_status_t status = nk_maxsim_pack_size(vectors, depth, dtype, &bytes);
        if (status != nk_ok_k) return status;
        if (!nk_align_u64(cursor, &offset) || !nk_u64_add(offset, bytes, &cursor) ||
            !nk_u64_add(h->total_vectors, vectors, &h->total_vectors))
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

static void nk_corpus_info_from(nk_corpus_header_t const *h, nk_corpus_info_t *info) {
    info->documents = h->documents;
    info->depth = h->depth;
    info->total_vectors = h->total_vectors;
    info->nbytes = h->nbytes;
    info->capabilities = h->capabilities;
    info->dtype = h->dtype;
}

nk_status_t nk_corpus_init(uint64_t const *lengths, uint64_t documents, uint64_t depth, int dtype,
                           uint64_t capabilities, void *out, uint64_t out_nbytes, nk_corpus_t *corpus) {
    nk_corpus_header_t h;
    nk_status_t status = nk_corpus_layout(lengths, 1, documents, depth, dtype, &h, NULL, nk_table_ignore_k);
    if (status != nk_ok_k) return status;
    if (!out || ((uintptr_t)out) % NK_SECTION_ALIGN != 0 || !corpus) return nk_error_argument_k;
    if (documents == 0) return nk_error_empty_k;
    for (uint64_t i = 0; i < documents; ++i)
        if (lengths[i] == 0) return nk_error_empty_k;
    if (out_nbytes < h.nbytes) return nk_error_buffer_small_k;
    h.capabilities = capabilities;
    memset(out, 0, h.nbytes);
    memcpy(out, &h, sizeof(h));
    nk_corpus_entry_t *table = (nk_corpus_entry_t *)((char *)out + NK_HEADER_BYTES);
    nk_corpus_header_t written;
    nk_corpus_layout(lengths, 1, documents, depth, dtype, &written, table, nk_table_write_k);
    corpus->data = out;
    nk_corpus_info_from(&h, &corpus->info);
    corpus->table = table;
    return nk_ok_k;
}

nk_maxsim_matrix_t nk_corpus_document(nk_corpus_t const *corpus, uint64_t index, uint64_t *nbytes) {
    nk_corpus_entry_t entry = corpus->table[index];
    nk_maxsim_matrix_t document = {(char const *)corpus->data + entry.offset, {0}};
    nk_maxsim_header_t layout;
    nk_maxsim_layout(entry.vectors, corpus->info.depth, (int)corpus->info.dtype, &layout);
    document.info.vectors = entry.vectors;
    document.info.depth = corpus->info.depth;
    document.info.nbytes = layout.nbytes;
    document.info.capabilities = corpus->info.capabilities;
    document.info.dtype = corpus->info.dtype;
    if (nbytes) *nbytes = layout.nbytes;
    return document;
}

uint32_t nk_corpus_format_version(void const *buf, uint64_t nbytes) {
    uint32_t version;
    if (!buf || nbytes < 12 || memcmp(buf, NK_CORPUS_MAGIC, 8) != 0) return 0;
    memcpy(&version, (char const *)buf + 8, sizeof(version));
    return version;
}

nk_status_t nk_corpus_header(void const *buf, uint64_t nbytes, nk_corpus_info_t *info) {
    if (!buf || !info || ((uintptr_t)buf) % NK_SECTION_ALIGN != 0) return nk_error_argument_k;
    if (nbytes < NK_HEADER_BYTES) return nk_error_corrupt_k;
    nk_corpus_header_t given;
    memcpy(&given, buf, sizeof(given)); /* one read: later checks look at this copy only */
    if (memcmp(given.magic, NK_CORPUS_MAGIC, 8) != 0) return nk_error_corrupt_k;
    if (given.version != NK_CORPUS_FORMAT_VERSION) return nk_error_version_k;
    /* The fields the table cannot confirm: the table must fit, sizes must match what was given. */
    uint64_t table_end;
    if (!nk_dtype_itemsize((int)given.dtype) || given.table_offset != NK_HEADER_BYTES || given.nbytes != nbytes ||
        !nk_u64_mul(given.documents, (uint64_t)sizeof(nk_corpus_entry_t), &table_end) ||
        !nk_u64_add(table_end, NK_HEADER_BYTES, &table_end) || table_end > nbytes)
        return nk_error_corrupt_k;
    for (size_t i = 0; i < sizeof(given.reserved); ++i)
        if (given.reserved[i]) return nk_error_corrupt_k;
    if (given.documents == 0) return nk_error_empty_k;
    nk_corpus_info_from(&given, info);
    return nk_ok_k;
}

nk_status_t nk_corpus_verify(void const *buf, nk_corpus_info_t const *info, nk_corpus_entry_t *table,
                             int verify_documents) {
    if (!buf || !info || !table) return nk_error_argument_k;
    memcpy(table, (char const *)buf + NK_HEADER_BYTES, info->documents * sizeof(nk_corpus_entry_t));
    nk_corpus_header_t expected;
    if (nk_corpus_layout(&table[0].vectors, 2, info->documents, info->depth, (int)info->dtype, &expected, table,
                         nk_table_compare_k) != nk_ok_k ||
        expected.nbytes != info->nbytes || expected.total_vectors != info->total_vectors)
        return nk_error_corrupt_k;
    for (uint64_t i = 0; i < info->documents; ++i)
        if (table[i].vectors == 0) return nk_error_empty_k;
    nk_corpus_t corpus = {buf, *info, table};
    for (uint64_t i = 0; verify_documents && i < info->documents; ++i) {
        uint64_t bytes;
        nk_maxsim_matrix_t document = nk_corpus_document(&corpus, i, &bytes);
        nk_maxsim_info_t found;
        nk_status_t status = nk_maxsim_verify(document.data, bytes, &found);
        if (status == nk_error_version_k) return status;
        if (status != nk_ok_k || found.dtype != info->dtype || found.depth != info->depth ||
            found.vectors != table[i].vectors || found.capabilities != info->capabilities)
            return nk_error_corrupt_k;
    }
    return nk_ok_k;
}

/* ---- scoring: documents are handed out a few at a time (lengths vary) through an atomic counter ---- */

typedef struct nk_corpus_job {
    nk_maxsim_view_t const *queries;
    uint64_t query_count;
    nk_corpus_t const *corpus;
    nk_maxsim_kernel_t kernel;
    double *scores;
    uint64_t next;  /* atomic */
    int status;     /* atomic: the first error any worker met */
} nk_corpus_job_t;

/* Documents are claimed a few at a time so that a worker knows its next one and can ask for its
 * screening sections (everything after the values, which only candidates touch) while it scores
 * the current one: a corpus comes from memory, not from cache. */
#define NK_CORPUS_CLAIM 4u

static void nk_corpus_prefetch(nk_maxsim_view_t const *document) {
    char const *first = (char const *)document->inv_norms, *end = (char const *)(document->screen_sums + document->vectors);
    for (char const *at = first; at < end; at += 64) nk_prefetch_l2(at);
}

static void nk_corpus_view(nk_corpus_t const *corpus, uint64_t index, nk_maxsim_view_t *view) {
    nk_maxsim_matrix_t document = nk_corpus_document(corpus, index, NULL);
    nk_maxsim_view_init(&document, view);
    view->cold = 1;
}

static void *nk_corpus_worker(void *argument) {
    nk_corpus_job_t *job = (nk_corpus_job_t *)argument;
    uint64_t documents = job->corpus->info.documents;
    for (;;) {
        uint64_t first = nk_atomic_fetch_add_u64(&job->next, NK_CORPUS_CLAIM);
        if (first >= documents) return NULL;
        uint64_t end = documents - first < NK_CORPUS_CLAIM ? documents : first + NK_CORPUS_CLAIM;
        nk_maxsim_view_t current, next;
        nk_corpus_view(job->corpus, first, &next);
        for (uint64_t document = first; document < end; ++document) {
            current = next;
            if (document + 1 < end) {
                nk_corpus_view(job->corpus, document + 1, &next);
                nk_corpus_prefetch(&next);
            }
            /* All queries against one document while it is hot in cache. */
            for (uint64_t i = 0; i < job->query_count; ++i) {
                nk_status_t status = nk_maxsim_score_views(job->kernel, &job->queries[i], &current,
                                                           &job->scores[i * documents + document]);
                if (status != nk_ok_k) nk_atomic_set_if_zero_i32(&job->status, (int)status);
            }
        }
    }
}

/* The kernels keep their scratch on the stack (under 256 KB): more than some C libraries give a new
 * thread by default (musl: 128 KB), so ask for it. */
#define NK_CORPUS_STACK_BYTES (1u << 20)
/* Query views are kept on the stack in batches of this many. */
#define NK_CORPUS_QUERY_BATCH 64u

#ifdef _WIN32
typedef HANDLE nk_thread_t;
static DWORD WINAPI nk_thread_main(LPVOID job) {
    nk_corpus_worker(job);
    return 0;
}
static int nk_thread_start(nk_thread_t *thread, nk_corpus_job_t *job) {
    *thread = CreateThread(NULL, NK_CORPUS_STACK_BYTES, nk_thread_main, job, 0, NULL);
    return *thread != NULL;
}
static void nk_thread_join(nk_thread_t thread) {
    WaitForSingleObject(thread, INFINITE);
    CloseHandle(thread);
}
#else
typedef pthread_t nk_thread_t;
static int nk_thread_start(nk_thread_t *thread, nk_corpus_job_t *job) {
    pthread_attr_t attributes;
    int have_attributes = pthread_attr_init(&attributes) == 0;
    if (have_attributes) pthread_attr_setstacksize(&attributes, NK_CORPUS_STACK_BYTES);
    int started = pthread_create(thread, have_attributes ? &attributes : NULL, nk_corpus_worker, job) == 0;
    if (have_attributes) pthread_attr_destroy(&attributes);
    return started;
}
static void nk_thread_join(nk_thread_t thread) { pthread_join(thread, NULL); }
#endif

nk_status_t nk_maxsim_score_corpus(nk_maxsim_matrix_t const *queries, uint64_t query_count, nk_corpus_t const *corpus,
                                   uint64_t capabilities, uint64_t threads, double *scores) {
    if ((query_count && !queries) || !corpus || !corpus->data || !corpus->table || (!scores && query_count))
        return nk_error_argument_k;
    uint64_t documents = corpus->info.documents;
    if (documents == 0) return nk_error_empty_k;
    for (uint64_t i = 0; i < query_count; ++i) {
        if (!queries[i].data) return nk_error_argument_k;
        if (queries[i].info.dtype != corpus->info.dtype) return nk_error_dtype_mismatch_k;
        if (queries[i].info.depth != corpus->info.depth) return nk_error_depth_mismatch_k;
    }
    if (threads < 1) threads = 1;
    if (threads > NK_CORPUS_MAX_THREADS) threads = NK_CORPUS_MAX_THREADS;
    if (threads > documents) threads = documents;
    /* One kernel for the whole call (every document shares the corpus depth). */
    nk_maxsim_kernel_t kernel = nk_maxsim_kernel_for(capabilities, corpus->info.depth);
    nk_maxsim_view_t views[NK_CORPUS_QUERY_BATCH];
    for (uint64_t batch = 0; batch < query_count; batch += NK_CORPUS_QUERY_BATCH) {
        uint64_t count = query_count - batch < NK_CORPUS_QUERY_BATCH ? query_count - batch : NK_CORPUS_QUERY_BATCH;
        for (uint64_t i = 0; i < count; ++i) nk_maxsim_view_init(&queries[batch + i], &views[i]);
        nk_corpus_job_t job = {views, count, corpus, kernel, scores + batch * documents, 0, nk_ok_k};
        nk_thread_t helpers[NK_CORPUS_MAX_THREADS];
        uint64_t started = 0;
        while (started + 1 < threads && nk_thread_start(&helpers[started], &job)) ++started; /* fewer is fine */
        nk_corpus_worker(&job);
        for (uint64_t i = 0; i < started; ++i) nk_thread_join(helpers[i]);
        if (job.status != nk_ok_k) return (nk_status_t)job.status;
    }
    return nk_ok_k;
}
