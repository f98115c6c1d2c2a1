/* numkong MaxSim: public C API.
 *
 * maxsim(Q, D) = sum over query rows q of min over document rows d of max(0, 1 - cos(q, d)),
 * with cos computed on the values as stored in the packing dtype and accumulated in float64.
 * A zero-norm row has cos = 0 with every row.
 *
 * Packed matrices are portable byte buffers (same endianness): a 128-byte header followed by
 * 64-byte aligned sections. Build them with nk_maxsim_pack(); check foreign bytes with
 * nk_maxsim_load() before scoring them.
 *
 * Memory: no function here allocates; callers own every buffer. All functions are thread-safe
 * and reentrant; scoring only reads its inputs.
 */
#ifndef NUMKONG_MAXSIM_H
#define NUMKONG_MAXSIM_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Version of the packed byte format, stored in every header (a native-endian uint32 at byte 8):
 * bytes of another version do not load (nk_error_version_k). 2: minifloat rows may have power-of-two
 * screening steps. 3: the stored capability mask is the caller's restriction, NK_CAPABILITIES_ANY
 * when there is none. */
#define NK_MAXSIM_FORMAT_VERSION 3u
/* Version of the packed corpus format (same rules). 3: documents first and the table after them
 * (a corpus can be written before its document count is known), and a checksum of everything after
 * the header. 4: each float-format document's packed matrix is followed by its prescreen, a 4-bit
 * copy of its screen that a top-k search reads first. 5: the prescreen's codes row-major in each tile
 * (format 4 had them in the screen's column layout). */
#define NK_CORPUS_FORMAT_VERSION 5u

/* Packing dtypes. The numeric codes are stored in packed buffers: never renumber. */
typedef enum nk_dtype {
    nk_dtype_float64_k = 1,
    nk_dtype_float32_k = 2,
    nk_dtype_float16_k = 3,
    nk_dtype_bfloat16_k = 4,
    nk_dtype_e4m3_k = 5, /* OCP FP8 E4M3 (finite-only, max 448) */
    nk_dtype_e5m2_k = 6, /* OCP FP8 E5M2 */
    nk_dtype_e2m3_k = 7, /* OCP MX FP6 E2M3 in the low 6 bits of a byte */
    nk_dtype_e3m2_k = 8, /* OCP MX FP6 E3M2 in the low 6 bits of a byte */
    /* Integer formats: dot products are exact integer sums, so the score needs no float rescoring.
     * Values are stored tiled for the kernels (maxsim_internal.h), not row-major. */
    nk_dtype_int8_k = 9,  /* symmetric int8: value = scale x q, q in -127..127, one float32 scale per row */
    nk_dtype_int4_k = 10, /* symmetric 4-bit: value = scale x q, q in -7..7, two per byte */
    nk_dtype_uint1_k = 11, /* one bit per dimension: +1 where set, -1 where not */
} nk_dtype_t;

/* Kernel families, one bit each. Stored in packed buffers: never renumber. Bit 8 is reserved (for
 * an SVE2 family that has no kernels yet). */
enum {
    nk_cap_serial_k = 1u << 0,      /* portable C */
    nk_cap_haswell_k = 1u << 1,     /* AVX2 + FMA + F16C */
    nk_cap_skylake_k = 1u << 2,     /* AVX-512 F/CD/BW/DQ/VL */
    nk_cap_icelake_k = 1u << 3,     /* + VNNI, VBMI, VBMI2, BITALG, VPOPCNTDQ */
    nk_cap_genoa_k = 1u << 4,       /* icelake + AVX512_BF16 (bfloat16 screening of raw float32 rows) */
    nk_cap_sapphireamx_k = 1u << 5, /* icelake + AMX-TILE, AMX-INT8 */
    nk_cap_neon_k = 1u << 6,        /* Arm Advanced SIMD + dotprod + fp16 */
    nk_cap_sve_k = 1u << 7,         /* Arm SVE */
    nk_cap_families_k = nk_cap_serial_k | nk_cap_haswell_k | nk_cap_skylake_k | nk_cap_icelake_k | nk_cap_genoa_k |
                        nk_cap_sapphireamx_k | nk_cap_neon_k | nk_cap_sve_k, /* every named family */
};
/* The mask an unrestricted pack stores: scoring elsewhere uses that machine's best families. */
#define NK_CAPABILITIES_ANY (~(uint64_t)0)
/* Most threads nk_maxsim_score_corpus runs on; larger requests are capped. */
#define NK_CORPUS_MAX_THREADS 256u
/* Largest int8 / int4 depth: the exact sum of q^2 per row, 127^2 * depth, is stored as a uint32. */
#define NK_INTEGER_MAX_DEPTH 262144u

typedef enum nk_status {
    nk_ok_k = 0,
    nk_error_argument_k = 1,       /* unknown dtype, null pointer, bad stride */
    nk_error_overflow_k = 2,       /* byte size does not fit in 64 bits / the header fields */
    nk_error_nonfinite_k = 3,      /* NaN or infinity in a row; *bad_row says which */
    nk_error_corrupt_k = 4,        /* bytes are not a valid packed matrix */
    nk_error_buffer_small_k = 5,   /* output buffer smaller than nk_maxsim_pack_size() */
    nk_error_depth_mismatch_k = 6, /* queries and documents have different depths */
    nk_error_dtype_mismatch_k = 7, /* queries and documents were packed in different dtypes */
    nk_error_empty_k = 8,          /* documents have no rows while queries have some; a corpus without
                                    * documents or with a 0-row document */
    nk_error_version_k = 9,        /* bytes of another format version (nk_maxsim_format_version says which) */
    nk_error_range_k = 10,         /* an int8 input holds -128, outside the symmetric range; *bad_row says which */
} nk_status_t;

/* What a packed buffer's header says, after validation. */
typedef struct nk_maxsim_info {
    uint64_t vectors;
    uint64_t depth;
    uint64_t nbytes;
    uint64_t capabilities; /* the restriction it was packed with, or NK_CAPABILITIES_ANY */
    uint32_t dtype;        /* an nk_dtype_t */
} nk_maxsim_info_t;

/* A validated packed matrix: its bytes and what validation found in its header. Scoring a matrix
 * reads its sections at offsets derived from `info`, never its header bytes again, so the bytes may
 * be shared (a memory map, another process's buffer): a writer can change values, but cannot send
 * a read out of bounds. */
typedef struct nk_maxsim_matrix {
    void const *data; /* 64-byte aligned */
    nk_maxsim_info_t info;
} nk_maxsim_matrix_t;

/* Bytes per stored element of a dtype, or 0 for an unknown code and for the sub-byte formats
 * (int4, uint1: see nk_maxsim_row_bytes). */
size_t nk_dtype_itemsize(int dtype);

/* Bytes one stored row of `depth` elements takes (integer formats: padded to their 4-byte words)
 * into *bytes. nk_error_argument_k for an unknown dtype, nk_error_overflow_k when it does not fit. */
nk_status_t nk_maxsim_row_bytes(int dtype, uint64_t depth, uint64_t *bytes);

/* Exact byte size of a packed matrix. nk_error_overflow_k when it does not fit 64 bits. */
nk_status_t nk_maxsim_pack_size(uint64_t vectors, uint64_t depth, int dtype, uint64_t *nbytes);

/* Pack `vectors` rows of `depth` elements into `out` (64-byte aligned, out_nbytes >= pack size).
 * `src` holds rows of `source_dtype`, which is either `dtype` itself (stored bit-exact, unless
 * the row is outside the kernels' safe range) or nk_dtype_float64_k (cast with round-to-nearest-
 * even after scaling each row by a power of two); the float formats also cast float32, float16 and
 * bfloat16 rows, to the same bytes as their exact float64 copy. Integer formats: int8 rows (source int8) are
 * stored bit-exact with scale 1 (-128 is nk_error_range_k); float64 rows are scaled per row so that
 * the largest magnitude maps to 127 (int8) or 7 (int4) and rounded to nearest even; uint1 keeps the
 * sign (zero counts as +1). Rows are `row_stride` bytes apart (any sign).
 * `capabilities` is the caller's restriction, NK_CAPABILITIES_ANY for none. Each row is checked as
 * stored, so a source changing under the packer cannot plant a NaN or infinity: on
 * nk_error_nonfinite_k, *bad_row is the first row holding one. */
nk_status_t nk_maxsim_pack(void const *src, int source_dtype, int64_t row_stride, uint64_t vectors, uint64_t depth,
                           int dtype, uint64_t capabilities, void *out, uint64_t out_nbytes, uint64_t *bad_row);

/* Validate `nbytes` of untrusted bytes in place (64-byte aligned, writable) and rebuild every
 * derived section from the stored values, so a loaded buffer is as trustworthy as a fresh one.
 * Fills *info. nk_error_corrupt_k for anything inconsistent, nk_error_version_k for bytes of
 * another format version. */
nk_status_t nk_maxsim_load(void *buf, uint64_t nbytes, nk_maxsim_info_t *info);

/* Validate read-only untrusted bytes (e.g. memory-mapped): header, layout, stored values, and every
 * derived section equal to what the packer would compute. nk_error_corrupt_k (or
 * nk_error_version_k) otherwise. */
nk_status_t nk_maxsim_verify(void const *buf, uint64_t nbytes, nk_maxsim_info_t *info);

/* The stored values of a validated matrix: info.vectors rows of info.depth elements of its dtype,
 * row-major, no padding. NULL for the integer formats, which are stored tiled: read their values
 * with nk_maxsim_dequantize. */
void const *nk_maxsim_values(nk_maxsim_matrix_t const *matrix);

/* Rows [first, first + count) of a validated matrix as the float64 values they stand for (for the
 * integer formats scale x q, or +-1), row-major into `out` (count x depth doubles). Exact. */
nk_status_t nk_maxsim_dequantize(nk_maxsim_matrix_t const *matrix, uint64_t first, uint64_t count, double *out);

/* Read the header of a buffer produced by nk_maxsim_pack() or nk_maxsim_load(). */
nk_status_t nk_maxsim_info(void const *buf, nk_maxsim_info_t *info);

/* The format version in the first `nbytes` bytes if they start like a packed matrix (or, for
 * nk_corpus_format_version, a corpus); 0 otherwise. For the message of nk_error_version_k. */
uint32_t nk_maxsim_format_version(void const *buf, uint64_t nbytes);
uint32_t nk_corpus_format_version(void const *buf, uint64_t nbytes);

/* Score validated packed queries against validated packed documents into *result, using the best
 * kernel family within `capabilities` & nk_capabilities_available() (serial is always allowed).
 * Does not allocate, does not touch the GIL, safe to call from many threads on the same buffers.
 * Its scratch is on the calling thread's stack, up to about 140 KB (the AMX family): a thread you
 * create for it needs a stack of at least 256 KB (glibc gives 8 MB by default, musl only 128 KB). */
nk_status_t nk_maxsim_score_matrices(nk_maxsim_matrix_t const *queries, nk_maxsim_matrix_t const *documents,
                                     uint64_t capabilities, double *result);
/* The same for buffers that only this caller can write (from nk_maxsim_pack() or nk_maxsim_load()):
 * reads both headers, then scores as nk_maxsim_score_matrices. */
nk_status_t nk_maxsim_score(void const *queries, void const *documents, uint64_t capabilities, double *result);

/* ---- Documents scored where they are (unpacked float32 rows). ----
 * MaxSim of a packed float32 query against each of `count` float32 documents given as rows in the
 * caller's memory (document i: rows[i] rows of the query's depth, strides[i] bytes apart, 4-byte
 * aligned), without packing them: scores[i] has the bits nk_maxsim_score gives for the document
 * packed as float32. It screens with float32 FMAs and needs an AVX-512 family within `capabilities`
 * (nk_maxsim_unpacked_available; otherwise nk_error_argument_k). A document it cannot screen exactly
 * (a value that is not finite or not below 2^56 in magnitude, or a nonzero row whose sum of squares
 * is below 2^-80 or above 2^120, in it or in the query; a depth above 65,536) or one without rows gets
 * NaN: pack it and score it (or report its error). The genoa family, when the mask allows it, screens
 * in bfloat16 pairs; every family returns the same bits.
 * scratch: nk_maxsim_unpacked_scratch_bytes(query vectors, depth, the most rows of a document),
 * any alignment; UINT64_MAX when that does not fit. Does not allocate; one thread per call. */
int nk_maxsim_unpacked_available(uint64_t capabilities);
uint64_t nk_maxsim_unpacked_scratch_bytes(uint64_t query_vectors, uint64_t depth, uint64_t max_rows);
nk_status_t nk_maxsim_unpacked_f32(nk_maxsim_matrix_t const *query, float const *const *documents,
                                   uint64_t const *rows, int64_t const *strides, uint64_t count,
                                   uint64_t capabilities, void *scratch, uint64_t scratch_bytes, double *scores);

/* ---- Packed corpora: many documents of different lengths in one portable buffer. ----
 * Layout (format version 5): a 128-byte header; the documents, each a complete packed matrix (then,
 * for the float formats, its prescreen) at a 64-byte aligned offset, in order, the first at byte 128; the table (one nk_corpus_entry_t per
 * document) at table_offset, the first aligned byte after the last document; zero padding to a
 * multiple of 64 bytes. The header holds a checksum (nk_checksum) of bytes [128, nbytes). Because
 * the table comes last, a corpus is built document by document (nk_corpus_plan, then
 * nk_corpus_pack_documents, then nk_corpus_finish), in memory or streamed to a file. */

typedef struct nk_corpus_entry {
    uint64_t offset;  /* byte offset of the document's packed matrix inside the corpus */
    uint64_t vectors; /* its rows */
} nk_corpus_entry_t;

typedef struct nk_corpus_info {
    uint64_t documents;
    uint64_t depth;
    uint64_t total_vectors;
    uint64_t nbytes;
    uint64_t capabilities; /* as in nk_maxsim_info_t */
    uint64_t table_offset;
    uint64_t checksum;     /* of bytes [128, nbytes) */
    uint32_t dtype;
} nk_corpus_info_t;

/* A validated corpus: its bytes, its header as validated, and its document table in memory the
 * caller owns (a private copy for shared bytes). Scoring reads documents at table offsets, never
 * the header or table bytes inside `data` again. */
typedef struct nk_corpus {
    void const *data;
    nk_corpus_info_t info;
    nk_corpus_entry_t const *table; /* info.documents entries */
} nk_corpus_t;

/* A 64-bit checksum of bytes, computed incrementally (init, any number of updates, final); the same
 * value for any split of the same bytes. Fast (several GB/s), not cryptographic: it catches
 * corruption, not forgery. */
typedef struct nk_checksum {
    uint64_t lanes[4];
    uint64_t length;
    uint8_t pending[32];
    uint32_t pending_bytes;
} nk_checksum_t;
void nk_checksum_init(nk_checksum_t *state);
void nk_checksum_update(nk_checksum_t *state, void const *data, uint64_t nbytes);
uint64_t nk_checksum_final(nk_checksum_t const *state);

/* Where `count` documents of lengths[0 .. count) go when the previous document ends at byte `end`
 * (NK_CORPUS_DOCUMENTS_OFFSET for the first): fills entries[i] and moves *end past the last one.
 * nk_error_empty_k for a 0-row document, nk_error_overflow_k when offsets overflow. */
#define NK_CORPUS_DOCUMENTS_OFFSET 128u
nk_status_t nk_corpus_plan(uint64_t const *lengths, uint64_t count, uint64_t depth, int dtype, uint64_t *end,
                           nk_corpus_entry_t *entries);

/* One document's source rows for nk_corpus_pack_documents: as nk_maxsim_pack() takes them. */
typedef struct nk_pack_source {
    void const *rows;
    int64_t row_stride;
    int dtype; /* as nk_maxsim_pack() takes it */
} nk_pack_source_t;

/* Pack documents with entries[0 .. count) (from nk_corpus_plan) from sources[0 .. count) into `out`,
 * which holds corpus bytes [out_offset, out_offset + out_nbytes) (out 64-byte aligned, out_offset a
 * multiple of 64), on up to `threads` threads. On nk_error_nonfinite_k, *bad_document and *bad_row
 * say where. */
nk_status_t nk_corpus_pack_documents(nk_corpus_entry_t const *entries, nk_pack_source_t const *sources, uint64_t count,
                                     uint64_t depth, int dtype, uint64_t capabilities, void *out, uint64_t out_offset,
                                     uint64_t out_nbytes, uint64_t threads, uint64_t *bad_document, uint64_t *bad_row);

/* Where the table goes after documents ending at byte `end`, and the corpus's total size. */
nk_status_t nk_corpus_table_place(uint64_t end, uint64_t documents, uint64_t *table_offset, uint64_t *nbytes);

/* The 128-byte header of a finished corpus described by *info (documents, depth, total_vectors,
 * nbytes, capabilities, table_offset, checksum, dtype). */
void nk_corpus_header_write(nk_corpus_info_t const *info, void *header);

/* Exact byte size of a corpus of documents with lengths[0 .. documents). */
nk_status_t nk_corpus_pack_size(uint64_t const *lengths, uint64_t documents, uint64_t depth, int dtype,
                                uint64_t *nbytes);
/* Finish a corpus built in memory: `data` (64-byte aligned, nbytes from nk_corpus_table_place) holds the
 * packed documents; write the table, the padding, the checksum and the header, and describe it in
 * *corpus (its table points into `data`). */
nk_status_t nk_corpus_finish(void *data, nk_corpus_entry_t const *entries, uint64_t documents, uint64_t depth, int dtype,
                             uint64_t capabilities, uint64_t table_offset, uint64_t nbytes, nk_corpus_t *corpus);
/* nk_corpus_finish in two steps, for a caller that may never export the bytes: nk_corpus_finish_table
 * writes the table, the padding and a header whose checksum is 0 (the corpus scores at once);
 * nk_corpus_seal computes the checksum and writes it into the header, as nk_corpus_finish does,
 * before the bytes are saved or shared. */
nk_status_t nk_corpus_finish_table(void *data, nk_corpus_entry_t const *entries, uint64_t documents, uint64_t depth,
                                   int dtype, uint64_t capabilities, uint64_t table_offset, uint64_t nbytes,
                                   nk_corpus_t *corpus);
void nk_corpus_seal(nk_corpus_t *corpus);
/* Document i of a validated corpus, as a matrix (its bytes and info), and its byte size. */
nk_maxsim_matrix_t nk_corpus_document(nk_corpus_t const *corpus, uint64_t index, uint64_t *nbytes);
/* Step 1 of loading untrusted bytes: validate the header alone and copy it into *info (so the table
 * size is known before the table is read). nk_error_corrupt_k, nk_error_version_k or
 * nk_error_empty_k (no documents) otherwise. */
nk_status_t nk_corpus_header(void const *buf, uint64_t nbytes, nk_corpus_info_t *info);
/* Step 2: copy the document table into `table` (info->documents entries, caller-owned) and check it
 * against *info (offsets, lengths >= 1, sizes): enough for memory safety. Then by `level`:
 * NK_CORPUS_VERIFY_LAYOUT no more; NK_CORPUS_VERIFY_CHECKSUM also the checksum of every byte after
 * the header (fast: catches any corruption since it was written); NK_CORPUS_VERIFY_ALL also every
 * document as nk_maxsim_verify does (values finite, derived sections equal to what packing gives).
 * Never re-reads the header. */
enum { NK_CORPUS_VERIFY_LAYOUT = 0, NK_CORPUS_VERIFY_CHECKSUM = 1, NK_CORPUS_VERIFY_ALL = 2 };
nk_status_t nk_corpus_verify(void const *buf, nk_corpus_info_t const *info, nk_corpus_entry_t *table, int level);
/* scores[i * documents + j] = MaxSim of queries[i] against document j (each bit-identical to
 * nk_maxsim_score_matrices on that pair), on up to `threads` threads (the caller's included, at most
 * NK_CORPUS_MAX_THREADS). Creates and joins its own threads; no other allocation. */
nk_status_t nk_maxsim_score_corpus(nk_maxsim_matrix_t const *queries, uint64_t query_count, nk_corpus_t const *corpus,
                                   uint64_t capabilities, uint64_t threads, double *scores);

/* The k best documents of each query: indices[i * k + c] and scores[i * k + c] for c < k, lowest MaxSim
 * first, ties by lower index; the same as scoring every document and sorting, but a document whose
 * exact partial sum or screening bounds already prove it out of a query's current k best stops early.
 * With a family that has a prescreen pass (sapphireamx), every document's prescreen bound comes first,
 * the documents with the lowest bounds are scored next, and then only those whose bound does not
 * exceed the query's k-th best so far. 1 <= k <= documents. `scratch` (64-byte aligned) holds
 * nk_corpus_top_k_scratch_bytes(query_count, documents, threads, k) bytes (a float64 per document
 * for each query of a pass; a pass takes up to 64 queries, and fewer once that passes 256 MB). */
uint64_t nk_corpus_top_k_scratch_bytes(uint64_t query_count, uint64_t documents, uint64_t threads, uint64_t k);
nk_status_t nk_maxsim_top_k_corpus(nk_maxsim_matrix_t const *queries, uint64_t query_count, nk_corpus_t const *corpus,
                                   uint64_t capabilities, uint64_t threads, uint64_t k, void *scratch,
                                   uint64_t scratch_bytes, int64_t *indices, double *scores);

/* Families compiled into this build. */
uint64_t nk_capabilities_compiled(void);
/* Families this CPU and OS support (probed once, cached), including serial. */
uint64_t nk_capabilities_cpu(void);
/* compiled & cpu & ~disabled: what scoring may use. */
uint64_t nk_capabilities_available(void);
/* Remove families (e.g. from NUMKONG_DISABLE). serial cannot be removed. Call before scoring. */
void nk_capabilities_disable(uint64_t mask);
/* The single best family bit within a mask (serial when nothing else). */
uint64_t nk_capabilities_best(uint64_t mask);

#ifdef __cplusplus
}
#endif
#endif /* NUMKONG_MAXSIM_H */
