/* Packed corpora (many variable-length documents in one buffer) and multi-threaded scoring. */
#ifdef _WIN32
#include <windows.h>
#else
#include <pthread.h>
#endif

#include <math.h>
#include <stdlib.h>

#include "maxsim_internal.h"


/* ---- Checksum: four 64-bit lanes, each taking every fourth 8-byte word (multiply, rotate,
 * multiply), folded with the length at the end; several words per cycle. ---- */
#define NK_CHECKSUM_PRIME_A 0x9E3779B97F4A7C15ull
#define NK_CHECKSUM_PRIME_B 0xD6E8FEB86659FD93ull

static inline uint64_t nk_rotl64(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }
static inline uint64_t nk_checksum_mix(uint64_t lane, uint64_t word) {
    return nk_rotl64(lane + word * NK_CHECKSUM_PRIME_B, 29) * NK_CHECKSUM_PRIME_A;
}

void nk_checksum_init(nk_checksum_t *state) {
    memset(state, 0, sizeof(*state));
    for (int i = 0; i < 4; ++i) state->lanes[i] = NK_CHECKSUM_PRIME_A * (uint64_t)(2 * i + 1);
}

static void nk_checksum_blocks(nk_checksum_t *state, uint8_t const *data, uint64_t blocks) {
    uint64_t l0 = state->lanes[0], l1 = state->lanes[1], l2 = state->lanes[2], l3 = state->lanes[3];
    for (uint64_t b = 0; b < blocks; ++b, data += 32) {
        uint64_t w[4];
        memcpy(w, data, 32);
        l0 = nk_checksum_mix(l0, w[0]), l1 = nk_checksum_mix(l1, w[1]);
        l2 = nk_checksum_mix(l2, w[2]), l3 = nk_checksum_mix(l3, w[3]);
    }
    state->lanes[0] = l0, state->lanes[1] = l1, state->lanes[2] = l2, state->lanes[3] = l3;
}

void nk_checksum_update(nk_checksum_t *state, void const *data, uint64_t nbytes) {
    uint8_t const *bytes = (uint8_t const *)data;
    state->length += nbytes;
    if (state->pending_bytes) { /* complete the partial block of an earlier update first */
        uint64_t take = 32 - state->pending_bytes < nbytes ? 32 - state->pending_bytes : nbytes;
        memcpy(state->pending + state->pending_bytes, bytes, (size_t)take);
        state->pending_bytes += (uint32_t)take, bytes += take, nbytes -= take;
        if (state->pending_bytes < 32) return;
        nk_checksum_blocks(state, state->pending, 1);
        state->pending_bytes = 0;
    }
    nk_checksum_blocks(state, bytes, nbytes / 32);
    bytes += nbytes / 32 * 32;
    state->pending_bytes = (uint32_t)(nbytes % 32);
    memcpy(state->pending, bytes, state->pending_bytes);
}

uint64_t nk_checksum_final(nk_checksum_t const *state) {
    nk_checksum_t copy = *state;
    if (copy.pending_bytes) { /* the last partial block, zero-padded (the length tells it apart) */
        memset(copy.pending + copy.pending_bytes, 0, 32 - copy.pending_bytes);
        nk_checksum_blocks(&copy, copy.pending, 1);
    }
    uint64_t h = nk_rotl64(copy.lanes[0], 1) + nk_rotl64(copy.lanes[1], 7) + nk_rotl64(copy.lanes[2], 12) +
                 nk_rotl64(copy.lanes[3], 18);
    h ^= copy.length * NK_CHECKSUM_PRIME_B;
    h ^= h >> 31, h *= NK_CHECKSUM_PRIME_A, h ^= h >> 29, h *= NK_CHECKSUM_PRIME_B, h ^= h >> 32;
    return h;
}

static uint64_t nk_checksum_of(void const *data, uint64_t nbytes) {
    nk_checksum_t state;
    nk_checksum_init(&state);
    nk_checksum_update(&state, data, nbytes);
    return nk_checksum_final(&state);
}

/* A document's bytes: its packed matrix, then its prescreen. */
static nk_status_t nk_corpus_document_bytes(uint64_t vectors, uint64_t depth, int dtype, uint64_t *nbytes,
                                            nk_prescreen_layout_t *layout) {
    uint64_t matrix_bytes;
    nk_status_t status = nk_maxsim_pack_size(vectors, depth, dtype, &matrix_bytes);
    if (status != nk_ok_k) return status;
    if (!nk_prescreen_layout(vectors, depth, dtype, matrix_bytes, layout)) return nk_error_overflow_k;
    *nbytes = layout->end;
    return nk_ok_k;
}

/* ---- Layout: documents from byte 128 on, the table after them. ---- */

static int nk_align_u64(uint64_t a, uint64_t *out) {
    if (!nk_u64_add(a, NK_SECTION_ALIGN - 1, out)) return 0;
    *out &= ~(uint64_t)(NK_SECTION_ALIGN - 1);
    return 1;
}

/* nk_corpus_plan over lengths[i * stride]; entries may be NULL (sizes only). */
static nk_status_t nk_corpus_plan_strided(uint64_t const *lengths, size_t stride, uint64_t count, uint64_t depth,
                                          int dtype, uint64_t *end, nk_corpus_entry_t *entries) {
    if (!nk_dtype_is_known(dtype) || (count && !lengths) || !end) return nk_error_argument_k;
    uint64_t cursor = *end;
    for (uint64_t i = 0; i < count; ++i) {
        uint64_t offset, bytes, vectors = lengths[i * stride];
        if (vectors == 0) return nk_error_empty_k;
        nk_prescreen_layout_t layout;
        nk_status_t status = nk_corpus_document_bytes(vectors, depth, dtype, &bytes, &layout);
        if (status != nk_ok_k) return status;
        if (!nk_align_u64(cursor, &offset) || !nk_u64_add(offset, bytes, &cursor)) return nk_error_overflow_k;
        if (entries) entries[i] = (nk_corpus_entry_t){offset, vectors};
    }
    *end = cursor;
    return nk_ok_k;
}

nk_status_t nk_corpus_plan(uint64_t const *lengths, uint64_t count, uint64_t depth, int dtype, uint64_t *end,
                           nk_corpus_entry_t *entries) {
    return nk_corpus_plan_strided(lengths, 1, count, depth, dtype, end, entries);
}

nk_status_t nk_corpus_table_place(uint64_t end, uint64_t documents, uint64_t *table_offset, uint64_t *nbytes) {
    uint64_t table_bytes, table_end;
    if (end < NK_CORPUS_DOCUMENTS_OFFSET) end = NK_CORPUS_DOCUMENTS_OFFSET;
    if (!nk_align_u64(end, table_offset) || !nk_u64_mul(documents, (uint64_t)sizeof(nk_corpus_entry_t), &table_bytes) ||
        !nk_u64_add(*table_offset, table_bytes, &table_end) || !nk_align_u64(table_end, nbytes) ||
        *nbytes > (uint64_t)INT64_MAX || *nbytes > (uint64_t)SIZE_MAX)
        return nk_error_overflow_k;
    return nk_ok_k;
}

nk_status_t nk_corpus_pack_size(uint64_t const *lengths, uint64_t documents, uint64_t depth, int dtype,
                                uint64_t *nbytes) {
    uint64_t end = NK_CORPUS_DOCUMENTS_OFFSET, table_offset;
    nk_status_t status = nk_corpus_plan(lengths, documents, depth, dtype, &end, NULL);
    if (status != nk_ok_k) return status;
    return nk_corpus_table_place(end, documents, &table_offset, nbytes);
}

static void nk_corpus_info_from(nk_corpus_header_t const *h, nk_corpus_info_t *info) {
    info->documents = h->documents;
    info->depth = h->depth;
    info->total_vectors = h->total_vectors;
    info->nbytes = h->nbytes;
    info->capabilities = h->capabilities;
    info->table_offset = h->table_offset;
    info->checksum = h->checksum;
    info->dtype = h->dtype;
}

void nk_corpus_header_write(nk_corpus_info_t const *info, void *header) {
    nk_corpus_header_t h;
    memset(&h, 0, sizeof(h));
    memcpy(h.magic, NK_CORPUS_MAGIC, 8);
    h.version = NK_CORPUS_FORMAT_VERSION;
    h.dtype = info->dtype;
    h.depth = info->depth;
    h.documents = info->documents;
    h.total_vectors = info->total_vectors;
    h.capabilities = info->capabilities;
    h.nbytes = info->nbytes;
    h.table_offset = info->table_offset;
    h.checksum = info->checksum;
    memcpy(header, &h, sizeof(h));
}

/* ---- Threads: a worker function runs on the calling thread and up to threads - 1 helpers. ---- */

/* The kernels keep their scratch on the stack (under 256 KB): more than some C libraries give a new
 * thread by default (musl: 128 KB), so ask for it. */
#define NK_THREAD_STACK_BYTES (1u << 20)

typedef void *(*nk_worker_t)(void *);

#ifdef _WIN32
typedef HANDLE nk_thread_t;
typedef struct nk_thread_start_args {
    nk_worker_t worker;
    void *job;
} nk_thread_start_args_t;
static DWORD WINAPI nk_thread_main(LPVOID argument) {
    nk_thread_start_args_t const *start = (nk_thread_start_args_t const *)argument;
    start->worker(start->job);
    return 0;
}
#else
typedef pthread_t nk_thread_t;
#endif

/* Run worker(job) on min(threads, items, NK_CORPUS_MAX_THREADS) threads, the caller's included; a
 * helper that cannot be started is simply not there (the workers share the items). */
static void nk_run_threads(nk_worker_t worker, void *job, uint64_t threads, uint64_t items) {
    if (threads > items) threads = items;
    if (threads > NK_CORPUS_MAX_THREADS) threads = NK_CORPUS_MAX_THREADS;
    nk_thread_t helpers[NK_CORPUS_MAX_THREADS];
    uint64_t started = 0;
#ifdef _WIN32
    nk_thread_start_args_t start = {worker, job};
    for (; started + 1 < threads; ++started) {
        helpers[started] = CreateThread(NULL, NK_THREAD_STACK_BYTES, nk_thread_main, &start, 0, NULL);
        if (!helpers[started]) break;
    }
    worker(job);
    for (uint64_t i = 0; i < started; ++i) WaitForSingleObject(helpers[i], INFINITE), CloseHandle(helpers[i]);
#else
    pthread_attr_t attributes;
    int have_attributes = pthread_attr_init(&attributes) == 0;
    if (have_attributes) pthread_attr_setstacksize(&attributes, NK_THREAD_STACK_BYTES);
    for (; started + 1 < threads; ++started)
        if (pthread_create(&helpers[started], have_attributes ? &attributes : NULL, worker, job) != 0) break;
    if (have_attributes) pthread_attr_destroy(&attributes);
    worker(job);
    for (uint64_t i = 0; i < started; ++i) pthread_join(helpers[i], NULL);
#endif
}

/* ---- Packing documents, in parallel. ---- */

typedef struct nk_pack_job {
    nk_corpus_entry_t const *entries;
    nk_pack_source_t const *sources;
    uint64_t count, depth, capabilities, out_offset, out_nbytes;
    int dtype;
    char *out;
    uint64_t next;       /* atomic: the next document to claim */
    int status;          /* atomic: the first error */
    uint64_t bad_document, bad_row; /* where it happened (written by the thread that set status) */
} nk_pack_job_t;

/* Documents are claimed this many at a time: neighbours share the output's (huge) pages, and the
 * thread that touches a page first clears all of it while another writing into it waits. */
#define NK_PACK_CLAIM 64u

static void *nk_pack_worker(void *argument) {
    nk_pack_job_t *job = (nk_pack_job_t *)argument;
    for (;;) {
        uint64_t first = nk_atomic_fetch_add_u64(&job->next, NK_PACK_CLAIM);
        if (first >= job->count) return NULL;
        uint64_t end = job->count - first < NK_PACK_CLAIM ? job->count : first + NK_PACK_CLAIM;
        for (uint64_t i = first; i < end; ++i) {
            nk_corpus_entry_t entry = job->entries[i];
            uint64_t nbytes, bad_row = 0;
            nk_prescreen_layout_t layout;
            nk_status_t status = nk_corpus_document_bytes(entry.vectors, job->depth, job->dtype, &nbytes, &layout);
            if (status == nk_ok_k &&
                (entry.offset < job->out_offset || entry.offset - job->out_offset > job->out_nbytes ||
                 nbytes > job->out_nbytes - (entry.offset - job->out_offset)))
                status = nk_error_buffer_small_k;
            char *document = job->out + (entry.offset - job->out_offset);
            if (status == nk_ok_k)
                status = nk_maxsim_pack(job->sources[i].rows, job->sources[i].dtype, job->sources[i].row_stride,
                                        entry.vectors, job->depth, job->dtype, job->capabilities, document,
                                        layout.codes_offset ? layout.codes_offset : nbytes, &bad_row);
            if (status == nk_ok_k && layout.pairs) {
                nk_maxsim_matrix_t matrix = {document, {entry.vectors, job->depth, layout.codes_offset,
                                                        job->capabilities, (uint32_t)job->dtype}};
                nk_maxsim_view_t view;
                nk_maxsim_view_init(&matrix, &view);
                nk_prescreen_build(&view, (uint8_t *)document, &layout, job->capabilities, 0);
            }
            if (status != nk_ok_k) {
                if (nk_atomic_set_if_zero_i32(&job->status, (int)status)) job->bad_document = i, job->bad_row = bad_row;
                nk_atomic_store_u64(&job->next, job->count); /* stop the others early */
                return NULL;
            }
        }
    }
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

nk_status_t nk_corpus_finish(void *data, nk_corpus_entry_t const *entries, uint64_t documents, uint64_t depth, int dtype,
                             uint64_t capabilities, uint64_t table_offset, uint64_t nbytes, nk_corpus_t *corpus) {
    nk_status_t status =
        nk_corpus_finish_table(data, entries, documents, depth, dtype, capabilities, table_offset, nbytes, corpus);
    if (status == nk_ok_k) nk_corpus_seal(corpus);
    return status;
}

void nk_corpus_seal(nk_corpus_t *corpus) {
    char const *bytes = (char const *)corpus->data;
    corpus->info.checksum = nk_checksum_of(bytes + NK_HEADER_BYTES, corpus->info.nbytes - NK_HEADER_BYTES);
    nk_corpus_header_write(&corpus->info, (void *)(uintptr_t)corpus->data);
}

nk_status_t nk_corpus_finish_table(void *data, nk_corpus_entry_t const *entries, uint64_t documents, uint64_t depth,
                                   int dtype, uint64_t capabilities, uint64_t table_offset, uint64_t nbytes,
                                   nk_corpus_t *corpus) {
    if (!data || ((uintptr_t)data) % NK_SECTION_ALIGN != 0 || !corpus || (documents && !entries))
        return nk_error_argument_k;
    if (documents == 0) return nk_error_empty_k;
    uint64_t table_bytes = documents * sizeof(nk_corpus_entry_t), total = 0;
    if (table_offset < NK_CORPUS_DOCUMENTS_OFFSET || table_offset > nbytes || table_bytes > nbytes - table_offset)
        return nk_error_argument_k;
    for (uint64_t i = 0; i < documents; ++i) total += entries[i].vectors;
    char *bytes = (char *)data;
    memcpy(bytes + table_offset, entries, (size_t)table_bytes);
    memset(bytes + table_offset + table_bytes, 0, (size_t)(nbytes - table_offset - table_bytes));
    nk_corpus_info_t info = {documents, depth, total, nbytes, capabilities, table_offset, 0, (uint32_t)dtype};
    nk_corpus_header_write(&info, data); /* checksum 0 until nk_corpus_seal */
    corpus->data = data;
    corpus->info = info;
    corpus->table = (nk_corpus_entry_t const *)(void const *)(bytes + table_offset);
    return nk_ok_k;
}

nk_status_t nk_corpus_pack_documents(nk_corpus_entry_t const *entries, nk_pack_source_t const *sources, uint64_t count,
                                     uint64_t depth, int dtype, uint64_t capabilities, void *out, uint64_t out_offset,
                                     uint64_t out_nbytes, uint64_t threads, uint64_t *bad_document, uint64_t *bad_row) {
    if ((count && (!entries || !sources)) || !out || ((uintptr_t)out) % NK_SECTION_ALIGN != 0 ||
        out_offset % NK_SECTION_ALIGN != 0 || !nk_dtype_is_known(dtype))
        return nk_error_argument_k;
    nk_pack_job_t job = {entries, sources, count, depth, capabilities, out_offset, out_nbytes, dtype, (char *)out,
                         0, nk_ok_k, 0, 0};
    nk_run_threads(nk_pack_worker, &job, threads, count);
    if (job.status != nk_ok_k) {
        if (bad_document) *bad_document = job.bad_document;
        if (bad_row) *bad_row = job.bad_row;
    }
    return (nk_status_t)job.status;
}


nk_status_t nk_corpus_header(void const *buf, uint64_t nbytes, nk_corpus_info_t *info) {
    if (!buf || !info || ((uintptr_t)buf) % NK_SECTION_ALIGN != 0) return nk_error_argument_k;
    if (nbytes < NK_HEADER_BYTES) return nk_error_corrupt_k;
    nk_corpus_header_t given;
    memcpy(&given, buf, sizeof(given)); /* one read: later checks look at this copy only */
    if (memcmp(given.magic, NK_CORPUS_MAGIC, 8) != 0) return nk_error_corrupt_k;
    if (given.version != NK_CORPUS_FORMAT_VERSION) return nk_error_version_k;
    /* The fields the table cannot confirm: the table must fit where the sizes say. */
    uint64_t table_offset, expected_nbytes;
    if (!nk_dtype_is_known((int)given.dtype) || given.nbytes != nbytes || given.table_offset % NK_SECTION_ALIGN ||
        given.table_offset < NK_CORPUS_DOCUMENTS_OFFSET ||
        nk_corpus_table_place(given.table_offset, given.documents, &table_offset, &expected_nbytes) != nk_ok_k ||
        table_offset != given.table_offset || expected_nbytes != nbytes)
        return nk_error_corrupt_k;
    for (size_t i = 0; i < sizeof(given.reserved); ++i)
        if (given.reserved[i]) return nk_error_corrupt_k;
    if (given.documents == 0) return nk_error_empty_k;
    nk_corpus_info_from(&given, info);
    return nk_ok_k;
}

nk_status_t nk_corpus_verify(void const *buf, nk_corpus_info_t const *info, nk_corpus_entry_t *table, int level) {
    if (!buf || !info || !table) return nk_error_argument_k;
    char const *bytes = (char const *)buf;
    memcpy(table, bytes + info->table_offset, (size_t)(info->documents * sizeof(nk_corpus_entry_t)));
    /* The offsets must be the plan of the lengths: documents in order, none overlapping the table. */
    uint64_t end = NK_CORPUS_DOCUMENTS_OFFSET, total = 0, table_offset, nbytes;
    for (uint64_t i = 0; i < info->documents; ++i) {
        nk_corpus_entry_t expected;
        nk_status_t status = nk_corpus_plan_strided(&table[i].vectors, 2, 1, info->depth, (int)info->dtype, &end,
                                                    &expected);
        if (status == nk_error_empty_k) return status;
        if (status != nk_ok_k || expected.offset != table[i].offset || !nk_u64_add(total, table[i].vectors, &total))
            return nk_error_corrupt_k;
    }
    if (nk_corpus_table_place(end, info->documents, &table_offset, &nbytes) != nk_ok_k ||
        table_offset != info->table_offset || nbytes != info->nbytes || total != info->total_vectors)
        return nk_error_corrupt_k;
    if (level >= NK_CORPUS_VERIFY_CHECKSUM &&
        nk_checksum_of(bytes + NK_HEADER_BYTES, info->nbytes - NK_HEADER_BYTES) != info->checksum)
        return nk_error_corrupt_k;
    nk_corpus_t corpus = {buf, *info, table};
    for (uint64_t i = 0; level >= NK_CORPUS_VERIFY_ALL && i < info->documents; ++i) {
        uint64_t document_bytes;
        nk_maxsim_matrix_t document = nk_corpus_document(&corpus, i, &document_bytes);
        nk_maxsim_info_t found;
        nk_status_t status = nk_maxsim_verify(document.data, document_bytes, &found);
        if (status == nk_error_version_k) return status;
        if (status != nk_ok_k || found.dtype != info->dtype || found.depth != info->depth ||
            found.vectors != table[i].vectors || found.capabilities != info->capabilities)
            return nk_error_corrupt_k;
        nk_prescreen_layout_t layout;
        nk_prescreen_layout(found.vectors, found.depth, (int)found.dtype, document_bytes, &layout);
        nk_maxsim_view_t view;
        nk_maxsim_view_init(&document, &view);
        if (layout.pairs &&
            !nk_prescreen_build(&view, (uint8_t *)(uintptr_t)document.data, &layout, info->capabilities, 1))
            return nk_error_corrupt_k;
    }
    return nk_ok_k;
}

/* Query views are kept on the stack in batches of this many. */
#define NK_CORPUS_QUERY_BATCH 64u

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
 * screening sections (and, scoring every document in full, its values) while it scores the current
 * one: a corpus comes from memory, not from cache. */
#define NK_CORPUS_CLAIM 4u

static void nk_corpus_prefetch_range(void const *first, void const *end) {
    for (char const *at = (char const *)first; at < (char const *)end; at += 64) nk_prefetch_l2(at);
}

/* What a walk prefetches of the next document while it scores one. */
typedef enum nk_walk_reads {
    nk_walk_screen_k,    /* its screen: most documents of a top-k search stop there */
    nk_walk_values_k,    /* its screen and values: every document is scored in full */
    nk_walk_prescreen_k, /* its prescreen: a top-k search with a prescreen pass */
} nk_walk_reads_t;

/* A document of a walk: its view, its first byte and where its prescreen is. */
typedef struct nk_corpus_doc {
    nk_maxsim_view_t view;
    uint8_t const *bytes;
    nk_prescreen_layout_t prescreen;
} nk_corpus_doc_t;

/* Prefetch the small per-row sections of `next`, the successor of `previous` in a walk, and name its
 * bulk (what its kernel reads first; with nk_walk_values_k its values after it, what full scoring's
 * rescoring reads; with nk_walk_prescreen_k its prescreen alone) in previous->next: the pass scoring
 * `previous` prefetches those a line at a time. */
static void nk_corpus_prefetch(nk_corpus_doc_t const *next, nk_maxsim_view_t *previous, nk_walk_reads_t reads) {
    nk_maxsim_view_t const *document = &next->view;
    uint64_t n = document->vectors;
    if (reads == nk_walk_prescreen_k && next->prescreen.pairs) {
        uint64_t start = next->prescreen.codes_offset;
        previous->next = nk_prefetch_stream(next->bytes + start, next->prescreen.end - start, NULL, 0);
        return;
    }
    int values_too = reads == nk_walk_values_k;
    if (document->inv_norms) { /* float formats: inv_norms, then (after the screen) scales, errors, sums */
        nk_corpus_prefetch_range(document->inv_norms, document->inv_norms + n);
        nk_corpus_prefetch_range(document->screen_scales, document->screen_sums + n);
        uint64_t values_bytes = values_too ? n * document->row_bytes : 0;
        previous->next = nk_prefetch_stream(document->screen, n * document->screen_depth, document->values, values_bytes);
        return;
    }
    if (document->norms2) /* int8, int4: the norms and scales, after the values (uint1 has neither) */
        nk_corpus_prefetch_range(document->norms2, document->scales + n);
    previous->next = nk_prefetch_stream(document->values, n * document->row_bytes, NULL, 0);
}

static void nk_corpus_view(nk_corpus_t const *corpus, uint64_t index, nk_corpus_doc_t *doc) {
    uint64_t nbytes;
    nk_maxsim_matrix_t document = nk_corpus_document(corpus, index, &nbytes);
    nk_maxsim_view_init(&document, &doc->view);
    doc->view.cold = 1;
    doc->bytes = (uint8_t const *)document.data;
    nk_prescreen_layout(document.info.vectors, document.info.depth, (int)document.info.dtype, nbytes, &doc->prescreen);
}

/* A worker's walk over the documents it claims, a few at a time from a shared counter (the next
 * claim taken while the last document of the current one is scored), each one's successor's
 * sections prefetched while it is scored. */
typedef struct nk_corpus_walk {
    nk_corpus_t const *corpus;
    uint64_t *next;             /* the shared counter */
    uint64_t document, end;     /* the current document and the end of its claim */
    uint64_t claimed;           /* the first document of the next claim (>= documents: none) */
    nk_corpus_doc_t current, upcoming;
    nk_walk_reads_t reads;
} nk_corpus_walk_t;

static void nk_corpus_walk_start(nk_corpus_walk_t *walk, nk_corpus_t const *corpus, uint64_t *next,
                                 nk_walk_reads_t reads) {
    walk->corpus = corpus, walk->next = next, walk->reads = reads;
    walk->claimed = nk_atomic_fetch_add_u64(next, NK_CORPUS_CLAIM);
    walk->document = walk->end = 0;
    if (walk->claimed < corpus->info.documents) nk_corpus_view(corpus, walk->claimed, &walk->upcoming);
}

/* The next document into walk->current (its index walk->document); 0 when all are claimed. */
static int nk_corpus_walk_next(nk_corpus_walk_t *walk) {
    uint64_t documents = walk->corpus->info.documents;
    if (walk->document + 1 < walk->end)
        ++walk->document;
    else {
        uint64_t first = walk->claimed;
        if (first >= documents) return 0;
        walk->end = documents - first < NK_CORPUS_CLAIM ? documents : first + NK_CORPUS_CLAIM;
        walk->document = first;
    }
    walk->current = walk->upcoming; /* the view of walk->document */
    uint64_t successor = walk->document + 1;
    if (successor == walk->end) { /* claim ahead, so the successor is known now */
        walk->claimed = nk_atomic_fetch_add_u64(walk->next, NK_CORPUS_CLAIM);
        successor = walk->claimed;
    }
    if (successor < documents) {
        nk_corpus_view(walk->corpus, successor, &walk->upcoming);
        nk_corpus_prefetch(&walk->upcoming, &walk->current.view, walk->reads);
    }
    return 1;
}

static void *nk_corpus_worker(void *argument) {
    nk_corpus_job_t *job = (nk_corpus_job_t *)argument;
    uint64_t documents = job->corpus->info.documents;
    nk_corpus_walk_t walk;
    nk_corpus_walk_start(&walk, job->corpus, &job->next, nk_walk_values_k);
    while (nk_corpus_walk_next(&walk))
        for (uint64_t i = 0; i < job->query_count; ++i) { /* every query while the document is in cache */
            nk_status_t status = nk_maxsim_score_views(job->kernel, &job->queries[i], &walk.current.view,
                                                       &job->scores[i * documents + walk.document]);
            if (status != nk_ok_k) nk_atomic_set_if_zero_i32(&job->status, (int)status);
        }
    return NULL;
}

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
    /* One kernel for the whole call (every document shares the corpus depth). */
    nk_maxsim_kernel_t kernel = nk_maxsim_kernel_for(capabilities, corpus->info.depth);
    nk_maxsim_view_t views[NK_CORPUS_QUERY_BATCH];
    for (uint64_t batch = 0; batch < query_count; batch += NK_CORPUS_QUERY_BATCH) {
        uint64_t count = query_count - batch < NK_CORPUS_QUERY_BATCH ? query_count - batch : NK_CORPUS_QUERY_BATCH;
        for (uint64_t i = 0; i < count; ++i) nk_maxsim_view_init(&queries[batch + i], &views[i]);
        nk_corpus_job_t job = {views, count, corpus, kernel, scores + batch * documents, 0, nk_ok_k};
        nk_run_threads(nk_corpus_worker, &job, threads, documents);
        if (job.status != nk_ok_k) return (nk_status_t)job.status;
    }
    return nk_ok_k;
}

/* ---- top-k: per thread and query, a max-heap of the k best (score, index) pairs seen; a shared cap
 * per query (the lowest of the threads' k-th best, an upper bound of the global k-th best) lets a
 * document stop as soon as it is proven worse. ---- */

typedef struct nk_ranked {
    double score;
    int64_t index;
} nk_ranked_t;

/* a ranks after b: higher score, or the same score and a higher index. */
static inline int nk_ranked_after(nk_ranked_t a, nk_ranked_t b) {
    return a.score > b.score || (a.score == b.score && a.index > b.index);
}

/* A heap of at most k entries, the worst (latest-ranked) at entries[0]. */
typedef struct nk_heap {
    nk_ranked_t *entries;
    uint64_t count, k;
} nk_heap_t;

static void nk_heap_offer(nk_heap_t *heap, nk_ranked_t item) {
    nk_ranked_t *e = heap->entries;
    uint64_t at;
    if (heap->count < heap->k) { /* sift up */
        at = heap->count++;
        while (at && nk_ranked_after(item, e[(at - 1) / 2])) e[at] = e[(at - 1) / 2], at = (at - 1) / 2;
        e[at] = item;
        return;
    }
    if (!nk_ranked_after(e[0], item)) return; /* no better than the worst kept */
    at = 0; /* sift down from the root */
    for (;;) {
        uint64_t child = 2 * at + 1;
        if (child >= heap->count) break;
        if (child + 1 < heap->count && nk_ranked_after(e[child + 1], e[child])) ++child;
        if (!nk_ranked_after(e[child], item)) break;
        e[at] = e[child], at = child;
    }
    e[at] = item;
}

static int nk_ranked_compare(void const *a, void const *b) {
    nk_ranked_t x = *(nk_ranked_t const *)a, y = *(nk_ranked_t const *)b;
    return nk_ranked_after(x, y) ? 1 : nk_ranked_after(y, x) ? -1 : 0;
}

typedef struct nk_top_k_job {
    nk_maxsim_view_t const *queries;
    uint64_t query_count, k;
    nk_corpus_t const *corpus;
    nk_maxsim_kernel_t kernel;
    nk_prescreen_ops_t const *prescreen; /* NULL: one pass (nk_top_k_worker) */
    uint8_t const *states;               /* [query]: NK_PRESCREEN_STATE_BYTES each */
    uint8_t const *ready;                /* [query]: its state was prepared */
    double *bounds;                      /* [query][document]: prescreen bounds (NaN: a seed) */
    nk_ranked_t *seeds;                  /* [query][nk_top_k_seeds]: the documents scored first */
    nk_ranked_t *heaps;   /* [thread][query][k] */
    uint64_t *counts;     /* [thread][query] */
    uint64_t *caps;       /* [query]: the bits of a double, atomic */
    uint64_t next, next_thread; /* atomic */
    int status;           /* atomic */
} nk_top_k_job_t;

static inline double nk_bits_to_double(uint64_t bits) {
    double value;
    memcpy(&value, &bits, sizeof(value));
    return value;
}

static inline uint64_t nk_double_to_bits(double value) {
    uint64_t bits;
    memcpy(&bits, &value, sizeof(bits));
    return bits;
}

/* Lower the shared cap of a query to `value` if that is lower (a relaxed compare-and-swap loop; the
 * cap only falls, so a stale read only prunes less). Non-negative doubles order as their bits. */
static void nk_cap_lower(uint64_t *cap, double value) {
    uint64_t bits = nk_double_to_bits(value), seen = nk_atomic_load_u64(cap);
    while (bits < seen && !nk_atomic_cas_u64(cap, &seen, bits)) {
    }
}

/* Score `document` (index `index`) for query i below its current cap, and keep it among the k best
 * of this thread's heap (heaps, counts: the thread's rows) if it gets there. Returns the exact score,
 * or +inf when the document is proven out (or failed). */
static double nk_top_k_score(nk_top_k_job_t *job, nk_ranked_t *heaps, uint64_t *counts, uint64_t i,
                             nk_maxsim_view_t const *document, uint64_t index) {
    nk_maxsim_view_t query = job->queries[i];
    query.stop_above = nk_bits_to_double(nk_atomic_load_u64(&job->caps[i]));
    double score;
    nk_status_t status = nk_maxsim_score_views(job->kernel, &query, document, &score);
    if (status != nk_ok_k) {
        nk_atomic_set_if_zero_i32(&job->status, (int)status);
        return INFINITY;
    }
    if (score > query.stop_above) return INFINITY; /* proven out of the k best */
    nk_heap_t heap = {heaps + i * job->k, counts[i], job->k};
    nk_heap_offer(&heap, (nk_ranked_t){score, (int64_t)index});
    counts[i] = heap.count;
    if (heap.count == job->k) nk_cap_lower(&job->caps[i], heap.entries[0].score);
    return score;
}

/* Without a prescreen: one walk; most documents stop at their screening. */
static void *nk_top_k_worker(void *argument) {
    nk_top_k_job_t *job = (nk_top_k_job_t *)argument;
    uint64_t thread = nk_atomic_fetch_add_u64(&job->next_thread, 1);
    nk_ranked_t *heaps = job->heaps + thread * job->query_count * job->k;
    uint64_t *counts = job->counts + thread * job->query_count;
    nk_corpus_walk_t walk;
    nk_corpus_walk_start(&walk, job->corpus, &job->next, nk_walk_screen_k);
    while (nk_corpus_walk_next(&walk))
        for (uint64_t i = 0; i < job->query_count; ++i) /* every query while the document is in cache */
            nk_top_k_score(job, heaps, counts, i, &walk.current.view, walk.document);
    return NULL;
}

/* With a prescreen, pass 1: every document's prescreen bound for every query (0 for a query without
 * a prepared state: it proves nothing). */
static void *nk_top_k_bound_worker(void *argument) {
    nk_top_k_job_t *job = (nk_top_k_job_t *)argument;
    uint64_t documents = job->corpus->info.documents;
    nk_corpus_walk_t walk;
    nk_corpus_walk_start(&walk, job->corpus, &job->next, nk_walk_prescreen_k);
    while (nk_corpus_walk_next(&walk)) {
        nk_corpus_doc_t const *document = &walk.current;
        for (uint64_t i = 0; i < job->query_count; ++i)
            job->bounds[i * documents + walk.document] =
                job->ready[i] && document->prescreen.pairs
                    ? job->prescreen->bound(job->states + i * NK_PRESCREEN_STATE_BYTES, document->bytes,
                                            &document->prescreen, document->view.next)
                    : 0.0;
    }
    return NULL;
}

/* Pass 2 (after the seeds): a document is read only for the queries whose bound does not exceed their
 * cap (a NaN bound: a seed, scored already); usually none. */
static void *nk_top_k_rescore_worker(void *argument) {
    nk_top_k_job_t *job = (nk_top_k_job_t *)argument;
    uint64_t thread = nk_atomic_fetch_add_u64(&job->next_thread, 1), documents = job->corpus->info.documents;
    nk_ranked_t *heaps = job->heaps + thread * job->query_count * job->k;
    uint64_t *counts = job->counts + thread * job->query_count;
    for (;;) {
        uint64_t first = nk_atomic_fetch_add_u64(&job->next, NK_CORPUS_CLAIM * 16);
        if (first >= documents) return NULL;
        uint64_t end = documents - first < NK_CORPUS_CLAIM * 16 ? documents : first + NK_CORPUS_CLAIM * 16;
        for (uint64_t index = first; index < end; ++index) {
            nk_corpus_doc_t document;
            int viewed = 0;
            for (uint64_t i = 0; i < job->query_count; ++i) {
                double cap = nk_bits_to_double(nk_atomic_load_u64(&job->caps[i]));
                if (!(job->bounds[i * documents + index] <= cap)) continue;
                if (!viewed) nk_corpus_view(job->corpus, index, &document), viewed = 1;
                nk_top_k_score(job, heaps, counts, i, &document.view, index);
            }
        }
    }
}

/* Documents with the lowest prescreen bounds, k + 32 per query, scored before the others so that the
 * caps start low. */
#define NK_TOP_K_EXTRA_SEEDS 32u

/* Whether a search for the k best of `documents` takes the prescreen pass (where the family has one):
 * it pays while k is a small share of the documents. Clustered documents, best of 7, prescreen time
 * over the one-pass walk's on 1 / 2 threads: of 10,000, k = 3,000 0.99 / 0.96, k = 4,000 1.02 / 1.01,
 * k = 5,000 1.04 / 1.11; of 100,000, k = 20,000 0.99 / 0.91, k = 40,000 1.04 / 1.04, k = 50,000
 * 1.07 / 1.13. Without it a search needs no prescreen states, bounds or seeds. */
static int nk_top_k_prescreens(uint64_t documents, uint64_t k) {
    return k + NK_TOP_K_EXTRA_SEEDS <= documents / 5 * 2;
}

/* Seeds per query: k + 32 (fewer than the documents) with the prescreen pass, none without. */
static uint64_t nk_top_k_seeds(uint64_t documents, uint64_t k) {
    return nk_top_k_prescreens(documents, k) ? k + NK_TOP_K_EXTRA_SEEDS : 0;
}

/* Between the passes, on the calling thread: each query's seeds into its row of job->seeds, their
 * bounds set to NaN (pass 2 passes them by). */
static void nk_top_k_pick_seeds(nk_top_k_job_t *job) {
    uint64_t documents = job->corpus->info.documents, seeds = nk_top_k_seeds(documents, job->k);
    for (uint64_t i = 0; i < job->query_count; ++i) {
        double *bounds = job->bounds + i * documents;
        nk_heap_t lowest = {job->seeds + i * seeds, 0, seeds};
        for (uint64_t index = 0; index < documents; ++index)
            nk_heap_offer(&lowest, (nk_ranked_t){bounds[index], (int64_t)index});
        for (uint64_t c = 0; c < seeds; ++c) bounds[lowest.entries[c].index] = NAN;
    }
}

/* The seeds of every query, claimed one at a time, each one's score kept in its entry: with k in the
 * thousands they are most of the work (k = 5,000 of 10,000 documents took 38.7 ms on 2 threads scored
 * on the calling thread, 22.9 ms in the one-pass search). */
static void *nk_top_k_seed_worker(void *argument) {
    nk_top_k_job_t *job = (nk_top_k_job_t *)argument;
    uint64_t thread = nk_atomic_fetch_add_u64(&job->next_thread, 1);
    uint64_t seeds = nk_top_k_seeds(job->corpus->info.documents, job->k);
    nk_ranked_t *heaps = job->heaps + thread * job->query_count * job->k;
    uint64_t *counts = job->counts + thread * job->query_count;
    for (;;) {
        uint64_t item = nk_atomic_fetch_add_u64(&job->next, 1);
        if (item >= job->query_count * seeds) return NULL;
        nk_corpus_doc_t document;
        uint64_t index = (uint64_t)job->seeds[item].index;
        nk_corpus_view(job->corpus, index, &document);
        job->seeds[item].score = nk_top_k_score(job, heaps, counts, item / seeds, &document.view, index);
    }
}

/* After the seeds: each query's cap falls to the k-th best of its seeds' scores (the k-th best of some
 * real scores is at least the k-th best of all), which no thread's heap may hold alone when the
 * threads shared the seeds. That is the (seeds - k + 1)-th largest, kept negated in a small heap. */
static void nk_top_k_seed_caps(nk_top_k_job_t *job) {
    uint64_t seeds = nk_top_k_seeds(job->corpus->info.documents, job->k), keep = seeds - job->k + 1;
    for (uint64_t i = 0; i < job->query_count; ++i) {
        nk_ranked_t largest[NK_TOP_K_EXTRA_SEEDS + 1];
        nk_heap_t heap = {largest, 0, keep};
        for (uint64_t c = 0; c < seeds; ++c) {
            nk_ranked_t seed = job->seeds[i * seeds + c];
            nk_heap_offer(&heap, (nk_ranked_t){-seed.score, seed.index});
        }
        nk_cap_lower(&job->caps[i], -heap.entries[0].score); /* +inf (no change) if a seed was proven out */
    }
}

/* Queries per pass of a top-k search: their prescreen bounds take 8 bytes per (query, document), at
 * most 2^25 of them (256 MB) unless one query alone needs more. */
#define NK_TOP_K_BOUNDS_BUDGET (1ull << 25)

static uint64_t nk_top_k_batch(uint64_t query_count, uint64_t documents) {
    uint64_t batch = query_count < NK_CORPUS_QUERY_BATCH ? query_count : NK_CORPUS_QUERY_BATCH;
    uint64_t fit = documents > NK_TOP_K_BOUNDS_BUDGET ? 1 : NK_TOP_K_BOUNDS_BUDGET / (documents ? documents : 1);
    return batch < fit ? batch : fit;
}

uint64_t nk_corpus_top_k_scratch_bytes(uint64_t query_count, uint64_t documents, uint64_t threads, uint64_t k) {
    if (threads < 1) threads = 1;
    if (threads > NK_CORPUS_MAX_THREADS) threads = NK_CORPUS_MAX_THREADS;
    uint64_t batch = nk_top_k_batch(query_count, documents), heaps, bytes, bounds = 0, seeds, total;
    int prescreens = nk_top_k_prescreens(documents, k);
    if (!nk_u64_mul(threads * batch, k, &heaps) || !nk_u64_mul(heaps, sizeof(nk_ranked_t), &bytes) ||
        (prescreens && !nk_u64_mul(batch * sizeof(double), documents, &bounds)) ||
        !nk_u64_mul(batch * sizeof(nk_ranked_t), nk_top_k_seeds(documents, k), &seeds))
        return UINT64_MAX;
    /* The prescreen states (64-byte aligned), bounds, seeds, heaps, counts, caps and ready flags. */
    if (!nk_u64_add(prescreens ? batch * NK_PRESCREEN_STATE_BYTES : 0, bounds, &total) ||
        !nk_u64_add(total, seeds, &total) ||
        !nk_u64_add(total, bytes, &total) ||
        !nk_u64_add(total, threads * batch * sizeof(uint64_t) + batch * sizeof(uint64_t) + batch, &total))
        return UINT64_MAX;
    return total;
}

nk_status_t nk_maxsim_top_k_corpus(nk_maxsim_matrix_t const *queries, uint64_t query_count, nk_corpus_t const *corpus,
                                   uint64_t capabilities, uint64_t threads, uint64_t k, void *scratch,
                                   uint64_t scratch_bytes, int64_t *indices, double *scores) {
    if ((query_count && (!queries || !indices || !scores)) || !corpus || !corpus->data || !corpus->table ||
        (!scratch && query_count))
        return nk_error_argument_k;
    uint64_t documents = corpus->info.documents;
    if (documents == 0) return nk_error_empty_k;
    if (k < 1 || k > documents) return nk_error_argument_k;
    if (threads < 1) threads = 1;
    if (threads > NK_CORPUS_MAX_THREADS) threads = NK_CORPUS_MAX_THREADS;
    if (scratch_bytes < nk_corpus_top_k_scratch_bytes(query_count, documents, threads, k))
        return nk_error_buffer_small_k;
    for (uint64_t i = 0; i < query_count; ++i) {
        if (!queries[i].data) return nk_error_argument_k;
        if (queries[i].info.dtype != corpus->info.dtype) return nk_error_dtype_mismatch_k;
        if (queries[i].info.depth != corpus->info.depth) return nk_error_depth_mismatch_k;
    }
    nk_maxsim_kernel_t kernel = nk_maxsim_kernel_for(capabilities, corpus->info.depth);
    int prescreens = nk_top_k_prescreens(documents, k);
    nk_prescreen_ops_t const *prescreen = prescreens ? nk_prescreen_for(capabilities, corpus->info.depth) : NULL;
    uint64_t helpers = threads > documents ? documents : threads; /* the threads nk_run_threads starts */
    uint64_t batch_max = nk_top_k_batch(query_count, documents);
    uint8_t *states = (uint8_t *)scratch;
    double *bounds = (double *)(void *)(states + (prescreens ? batch_max * NK_PRESCREEN_STATE_BYTES : 0));
    nk_ranked_t *seeds = (nk_ranked_t *)(void *)(bounds + (prescreens ? batch_max * documents : 0));
    nk_ranked_t *heaps = seeds + batch_max * nk_top_k_seeds(documents, k);
    nk_maxsim_view_t views[NK_CORPUS_QUERY_BATCH];
    for (uint64_t batch = 0; batch < query_count; batch += batch_max) {
        uint64_t count = query_count - batch < batch_max ? query_count - batch : batch_max;
        for (uint64_t i = 0; i < count; ++i) nk_maxsim_view_init(&queries[batch + i], &views[i]);
        uint64_t *counts = (uint64_t *)(void *)(heaps + helpers * count * k), *caps = counts + helpers * count;
        uint8_t *ready = (uint8_t *)(caps + count);
        memset(counts, 0, (size_t)(helpers * count * sizeof(uint64_t)));
        int any_ready = 0;
        for (uint64_t i = 0; i < count; ++i) {
            caps[i] = nk_double_to_bits(INFINITY);
            ready[i] = prescreen && prescreen->prepare(&views[i], states + i * NK_PRESCREEN_STATE_BYTES);
            any_ready |= ready[i];
        }
        nk_top_k_job_t job = {views, count, k, corpus, kernel, any_ready ? prescreen : NULL, states, ready, bounds,
                              seeds, heaps, counts, caps, 0, 0, nk_ok_k};
        uint64_t started = 0; /* the most threads a pass ran: their heaps hold the k best */
        if (job.prescreen) { /* bounds, seeds, then the documents whose bound does not prove them out */
            nk_run_threads(nk_top_k_bound_worker, &job, helpers, documents);
            nk_top_k_pick_seeds(&job);
            job.next = 0;
            nk_run_threads(nk_top_k_seed_worker, &job, helpers, count * nk_top_k_seeds(documents, k));
            nk_top_k_seed_caps(&job);
            started = job.next_thread;
            job.next = job.next_thread = 0;
            nk_run_threads(nk_top_k_rescore_worker, &job, helpers, (documents + 63) / 64);
        }
        else
            nk_run_threads(nk_top_k_worker, &job, helpers, documents);
        if (job.next_thread > started) started = job.next_thread;
        if (job.status != nk_ok_k) return (nk_status_t)job.status;
        /* Every thread's k best of each query together hold the query's k best: sort them in place
         * (the heaps of one query are not adjacent, so gather them first into the first heap's row). */
        for (uint64_t i = 0; i < count; ++i) {
            nk_ranked_t *merged = heaps + i * k; /* thread 0's heap of query i ... */
            uint64_t total = counts[i];
            nk_ranked_t *pool = merged;
            /* ... holds k; gather the other threads' entries after the k best found so far */
            for (uint64_t t = 1; t < started; ++t) {
                nk_ranked_t const *other = heaps + (t * count + i) * k;
                for (uint64_t c = 0; c < counts[t * count + i]; ++c) {
                    nk_heap_t keep = {pool, total, k};
                    nk_heap_offer(&keep, other[c]);
                    total = keep.count;
                }
            }
            qsort(pool, (size_t)total, sizeof(nk_ranked_t), nk_ranked_compare);
            for (uint64_t c = 0; c < k; ++c) {
                indices[(batch + i) * k + c] = c < total ? pool[c].index : -1;
                scores[(batch + i) * k + c] = c < total ? pool[c].score : INFINITY;
            }
        }
    }
    return nk_ok_k;
}
