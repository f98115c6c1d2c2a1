/* Sapphire Rapids AMX family: AMX-INT8 tiles for the screening, AVX-512 for everything else.
 *
 * Certified screening as in the other families: an int8 GEMM estimates every cosine from the packed
 * screening copy, the error bound of maxsim_internal.h turns each estimate into [LB, UB], each row's
 * largest UB of a block is rescored exactly in float64 first, and then only the documents whose UB
 * reaches the best exact cosine (or a candidate's LB) are. The result is the exact MaxSim.
 *
 * The screen section is already an AMX B operand: one 64-byte line holds the same 4 depths of the 16
 * rows of a tile, so 16 consecutive lines (1 KB) are a 64-deep, 16-column B tile. Documents are used
 * straight from memory (unsigned, biased by 128); each query tile (16 rows) is transposed once into
 * signed row-major A tiles on the stack. TDPBSUD then gives dot + 128 * (sum of the query's values),
 * and the epilogue removes that per-row bias with screen_sums.
 *
 * Candidates are rescored best-first, the best of every row together; before an exact float64 dot
 * product, a float32 one with a proven rounding bound rules out most of the others (section below).
 *
 * Stack: 64 KB of screening results (two groups), 24 KB of A tiles, 12 KB padded copy of the last document tile,
 * 8 + 4 KB of one decoded query row and about 24 KB of per-row state and candidates. Nothing is allocated.
 */
#include <immintrin.h>
#include <math.h>

#include "avx512_shared.h"
#include "maxsim_internal.h"

#define NK_SAMX_BLOCK_DOCS 512u   /* document rows per block (a multiple of 64): 32 KB of u per 16 rows */
#define NK_SAMX_CHUNK_STEPS 12u   /* 64-deep steps per pass over the A buffer: depth 768 in one pass */
#define NK_SAMX_STEP_BYTES 1024u  /* one 16 x 64-byte tile */
#define NK_SAMX_LIST 48u          /* candidates kept per row until the end (at least 16) */
#define NK_SAMX_DECODED_DEPTH 1024u



/* ---- Screening. ----
 * Bounds are kept in units of the query's screening step s_q, so only per-row constants remain:
 * with p_j = dot_j * s_d[j] (the estimate is s_q p_j), b = (1 + e_q) / s_q and a = e_q + slack,
 *   UB_j = s_q u_j + a  with u_j = p_j + b e_j,     LB_j = s_q l_j - a  with l_j = p_j - b e_j.
 * A row's threshold is max(best exact cosine, best LB of its candidates) and its cut is
 * (threshold - a) / s_q rounded down, so document j is a candidate exactly when u_j >= cut.
 *
 * A group is one query tile (16 rows); documents go by blocks of NK_SAMX_BLOCK_DOCS. The AMX unit
 * computes the whole block, four 16 x 16 tiles of dot products at a time, into the block buffer;
 * then the vector units turn those sums into u in place, with tagged per-lane maxima of u
 * (interleaving the two measured slower than running them one after the other). Once a block is
 * done, each row's largest u is rescored exactly, and one pass over u collects the documents that
 * can still beat that cosine. */

/* LDTILECFG's 64-byte operand, palette 1. */
typedef struct nk_samx_tile_config {
    uint8_t palette;
    uint8_t start_row;
    uint8_t reserved[14];
    uint16_t bytes_per_row[16];
    uint8_t rows[16];
} nk_samx_tile_config_t;

/* Per query group: the constants of each row, what the screening has seen so far, and each row's
 * candidates (u, l and document index relative to list_base), rescored only after the whole
 * document matrix has been screened, so that a later, higher threshold still prunes them. */
typedef struct nk_samx_group {
    _Alignas(64) int32_t bias[16]; /* -128 * screen_sums[q]; _Alignas: the type is whole lines */
    float top[16][16];     /* this block: per lane, the largest u tagged with its tile (nk_x512_tag) */
    float list_upper[16][NK_SAMX_LIST];
    float list_lower[16][NK_SAMX_LIST];
    uint32_t list_doc[16][NK_SAMX_LIST];
    unsigned count[16];
    unsigned counted[16];  /* entries whose l already raised the threshold */
    float growth[16];      /* b = (1 + e_q) / s_q */
    float cut[16];         /* candidates need u >= cut; +inf for rows that take no part */
    double scale[16];      /* s_q */
    double inv_scale[16];  /* 1 / s_q */
    double offset[16];     /* a = e_q + slack */
    double threshold[16];  /* max(best lower bound, best exact cosine) */
    double best[16];       /* best exact cosine so far */
    uint64_t list_base;    /* list_doc entries are relative to this document */
} nk_samx_group_t;

/* What rescoring needs. */
typedef struct nk_samx_context {
    nk_maxsim_view_t const *q, *d;
    size_t row_bytes;
    double *decoded; /* room for one query row in float64 */
    float *decoded32; /* room for one query row in float32 (nk_x512_decode_f32) */
    uint64_t first_query;
} nk_samx_context_t;

/* Transpose a 16 x 16 matrix of 32-bit words held in 16 registers. */
NK_INLINE void nk_samx_transpose16(__m512i r[16]) {
    __m512i t[16];
#pragma GCC unroll 16
    for (int i = 0; i < 16; i += 2) {
        t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
        t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
    }
#pragma GCC unroll 16
    for (int i = 0; i < 16; i += 4) {
        r[i] = _mm512_unpacklo_epi64(t[i], t[i + 2]);
        r[i + 1] = _mm512_unpackhi_epi64(t[i], t[i + 2]);
        r[i + 2] = _mm512_unpacklo_epi64(t[i + 1], t[i + 3]);
        r[i + 3] = _mm512_unpackhi_epi64(t[i + 1], t[i + 3]);
    }
#pragma GCC unroll 16
    for (int i = 0; i < 4; ++i) {
        t[i] = _mm512_shuffle_i32x4(r[i], r[i + 4], 0x88);
        t[i + 4] = _mm512_shuffle_i32x4(r[i], r[i + 4], 0xDD);
        t[i + 8] = _mm512_shuffle_i32x4(r[i + 8], r[i + 12], 0x88);
        t[i + 12] = _mm512_shuffle_i32x4(r[i + 8], r[i + 12], 0xDD);
    }
#pragma GCC unroll 16
    for (int i = 0; i < 4; ++i) {
        r[i] = _mm512_shuffle_i32x4(t[i], t[i + 8], 0x88);
        r[i + 8] = _mm512_shuffle_i32x4(t[i], t[i + 8], 0xDD);
        r[i + 4] = _mm512_shuffle_i32x4(t[i + 4], t[i + 12], 0x88);
        r[i + 12] = _mm512_shuffle_i32x4(t[i + 4], t[i + 12], 0xDD);
    }
}

/* Depth steps: G groups of 4 depths make ceil(G / 16) steps of 16 groups. When G is not a multiple
 * of 16 (and G >= 16), the last step is aligned to end at group G: it covers groups [G - 16, G), the
 * `pad` = 16 steps - G groups it shares with the step before carry zero query bytes, and a document
 * tile's last step reads its own last 16 lines, never past the tile. Below 16 groups every document
 * tile is copied into a padded buffer instead. */
typedef struct nk_samx_depth {
    uint64_t groups, steps, pad;
    int tiny; /* fewer than 16 groups */
} nk_samx_depth_t;

static nk_samx_depth_t nk_samx_depth_of(uint64_t screen_depth) {
    nk_samx_depth_t depth;
    depth.groups = screen_depth / 4;
    depth.steps = (depth.groups + 15) / 16;
    depth.tiny = depth.groups < 16;
    depth.pad = depth.tiny ? 0 : 16 * depth.steps - depth.groups;
    return depth;
}

/* Signed A tiles of the query tile starting at row `first` (a multiple of 16) for steps
 * [step0, step0 + steps): out[s][row][4 k + b] = byte b of group 16 (step0 + s) + k (or of the
 * end-aligned last step), minus 128. Rows past the end, groups past the depth and shared groups are
 * zero, so they add nothing. */
static void nk_samx_build_query_tiles(nk_maxsim_view_t const *q, nk_samx_depth_t const *depth, uint64_t first,
                                      uint64_t step0, uint64_t steps, int8_t *out) {
    uint64_t present = q->vectors - first;
    uint64_t lanes = present < 16 ? present : 16;
    __mmask16 rows = nk_x512_tail_mask(lanes);
    uint8_t const *tile = q->screen + first * q->screen_depth;
    __m512i flip = _mm512_set1_epi32((int)0x80808080u);
    for (uint64_t s = 0; s < steps; ++s) {
        __m512i r[16];
        int last = step0 + s + 1 == depth->steps;
        uint64_t g = last && depth->pad ? depth->groups - 16 : 16 * (step0 + s);
        uint64_t skip = last ? depth->pad : 0; /* leading groups the step before already covered */
#pragma GCC unroll 16
        for (int k = 0; k < 16; ++k)
            r[k] = g + (uint64_t)k < depth->groups && (uint64_t)k >= skip
                       ? _mm512_maskz_xor_epi32(
                             rows, _mm512_maskz_loadu_epi32(rows, tile + (g + (uint64_t)k) * 4 * lanes), flip)
                       : _mm512_setzero_si512();
        nk_samx_transpose16(r);
#pragma GCC unroll 16
        for (int k = 0; k < 16; ++k) _mm512_store_si512(out + s * NK_SAMX_STEP_BYTES + 64 * k, r[k]);
    }
}

/* Document tile t in B layout with 64-byte lines, groups [g0, g0 + lines) (g0 may be negative):
 * absent lanes and groups outside the depth read as value 0 (byte 0x80); nothing outside the section
 * is read. For the partial last tile of the matrix and for tiny depths. */
static void nk_samx_copy_doc_tile(nk_maxsim_view_t const *d, uint64_t t, int64_t g0, uint64_t lines, uint8_t *out) {
    int64_t groups = (int64_t)(d->screen_depth / 4);
    uint64_t first = 16 * t, lanes = d->vectors - first < 16 ? d->vectors - first : 16;
    __mmask16 rows = nk_x512_tail_mask(lanes);
    uint8_t const *tile = d->screen + first * d->screen_depth;
    __m512i zero = _mm512_set1_epi32((int)0x80808080u);
    for (int64_t g = g0; g < g0 + (int64_t)lines; ++g, out += 64)
        _mm512_store_si512(out, g >= 0 && g < groups ? _mm512_mask_loadu_epi32(zero, rows, tile + g * 4 * (int64_t)lanes)
                                                     : zero);
}

/* Tile registers (GCC's tile intrinsics need literal numbers): 0-3 accumulate four document tiles,
 * 4 and 5 hold the query tile of even and odd steps, 6 and 7 take turns with the document tiles. */

/* Start the DT (1..4, compile-time) accumulators from `init` (int32 partial sums, tile t at
 * init + 256 t) or from zero, then run `steps` 64-deep steps. Document tile t's step s is at
 * doc[t] + 1024 s, except the last, which `tail_back` bytes earlier is end-aligned; the query tile's
 * is at a_tiles + 1024 s. With `stationary` the query tiles are already in registers 4 and 5 (at
 * most two steps). */
NK_INLINE void nk_samx_quad_dots(int8_t const *a_tiles, uint8_t const *const doc[4], uint64_t steps,
                                      uint64_t tail_back, int32_t const *init, int stationary, int const DT) {
    if (init) {
        _tile_loadd(0, init, 64);
        if (DT > 1) _tile_loadd(1, init + 256, 64);
        if (DT > 2) _tile_loadd(2, init + 512, 64);
        if (DT > 3) _tile_loadd(3, init + 768, 64);
    } else {
        _tile_zero(0);
        if (DT > 1) _tile_zero(1);
        if (DT > 2) _tile_zero(2);
        if (DT > 3) _tile_zero(3);
    }
/* Both steps of document tile T (a literal) against query tiles 4 and 5. */
#define NK_SAMX_BOTH_STEPS(T) \
    do { \
        _tile_loadd(6, doc[T], 64); \
        _tile_loadd(7, doc[T] + second, 64); \
        _tile_dpbsud(T, 4, 6); \
        _tile_dpbsud(T, 5, 7); \
    } while (0)
    if (stationary && steps == 2) { /* both steps of one document tile back to back: fewer stalls */
        uint64_t second = NK_SAMX_STEP_BYTES - tail_back;
        NK_SAMX_BOTH_STEPS(0);
        if (DT > 1) NK_SAMX_BOTH_STEPS(1);
        if (DT > 2) NK_SAMX_BOTH_STEPS(2);
        if (DT > 3) NK_SAMX_BOTH_STEPS(3);
        return;
    }
#undef NK_SAMX_BOTH_STEPS
/* One step of query tile A (a literal) against the DT document tiles at doc[t] + `at`, their
 * loads alternating between tiles 6 and 7. */
#define NK_SAMX_ONE_STEP(A, at) \
    do { \
        _tile_loadd(6, doc[0] + (at), 64); \
        _tile_dpbsud(0, A, 6); \
        if (DT > 1) { \
            _tile_loadd(7, doc[1] + (at), 64); \
            _tile_dpbsud(1, A, 7); \
        } \
        if (DT > 2) { \
            _tile_loadd(6, doc[2] + (at), 64); \
            _tile_dpbsud(2, A, 6); \
        } \
        if (DT > 3) { \
            _tile_loadd(7, doc[3] + (at), 64); \
            _tile_dpbsud(3, A, 7); \
        } \
    } while (0)
    for (uint64_t s = 0, a_offset = 0; s < steps; s += 2, a_offset += 2 * NK_SAMX_STEP_BYTES) {
        uint64_t offset = s + 1 == steps ? a_offset - tail_back : a_offset;
        if (!stationary) _tile_loadd(4, a_tiles + a_offset, 64);
        NK_SAMX_ONE_STEP(4, offset);
        if (s + 1 == steps) break;
        uint64_t odd = a_offset + NK_SAMX_STEP_BYTES - (s + 2 == steps ? tail_back : 0);
        if (!stationary) _tile_loadd(5, a_tiles + a_offset + NK_SAMX_STEP_BYTES, 64);
        NK_SAMX_ONE_STEP(5, odd);
    }
#undef NK_SAMX_ONE_STEP
}

/* Store the DT accumulators contiguously: tile t at out + 256 t. */
NK_INLINE void nk_samx_quad_store(int32_t *out, int const DT) {
    _tile_stored(0, out, 64);
    if (DT > 1) _tile_stored(1, out + 256, 64);
    if (DT > 2) _tile_stored(2, out + 512, 64);
    if (DT > 3) _tile_stored(3, out + 768, 64);
}

/* Turn DT stored tiles of biased sums (tile t at sums + 256 t, row r at + 16 r; all lanes present but
 * possibly the last tile's `last_lanes`; the first is tile `first_tile` of the block) into u in place
 * (absent lanes hold junk that the scan masks off), raising the tagged per-lane maxima of u. */
NK_INLINE void nk_samx_quad_epilogue(int32_t *sums, uint64_t rows, float const *scales_d, float const *errors_d,
                                          __mmask16 last_lanes, nk_samx_group_t *group, unsigned first_tile,
                                          int const DT) {
    __m512 scale[4], error[4];
    __mmask16 lanes[4];
#pragma GCC unroll 4
    for (int t = 0; t < DT; ++t) {
        lanes[t] = t + 1 < DT ? (__mmask16)0xFFFF : last_lanes;
        scale[t] = _mm512_maskz_loadu_ps(lanes[t], scales_d + 16 * t);
        error[t] = _mm512_maskz_loadu_ps(lanes[t], errors_d + 16 * t);
    }
    for (uint64_t r = 0; r < rows; ++r) {
        __m512 growth = _mm512_set1_ps(group->growth[r]), top = _mm512_load_ps(group->top[r]);
        __m512i bias = _mm512_set1_epi32(group->bias[r]);
#pragma GCC unroll 4
        for (int t = 0; t < DT; ++t) {
            int32_t *at = sums + 256 * t + 16 * r;
            __m512 p = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(_mm512_load_si512(at), bias)), scale[t]);
            __m512 upper = _mm512_fmadd_ps(growth, error[t], p);
            _mm512_store_ps((float *)(void *)at, upper);
            top = _mm512_mask_max_ps(top, lanes[t], top, nk_x512_tag(upper, first_tile + (unsigned)t));
        }
        _mm512_store_ps(group->top[r], top);
    }
}

/* Rescore row r's candidates, the largest u first, until none reaches the cut; empties the list. */
static void nk_samx_drain_row(nk_samx_context_t const *context, nk_samx_group_t *group, unsigned r);

/* Append the lanes (documents base .. base + 15) set in `hit` to row r's list, with their u and l. */
static void nk_samx_append(nk_samx_context_t const *context, nk_samx_group_t *group, unsigned r, __m512 upper,
                           __m512 lower, __mmask16 hit, uint32_t base) {
    if (NK_UNLIKELY(group->count[r] + 16 > NK_SAMX_LIST)) {
        nk_samx_drain_row(context, group, r);
        hit = _mm512_mask_cmp_ps_mask(hit, upper, _mm512_set1_ps(group->cut[r]), _CMP_GE_OQ);
    }
    unsigned count = group->count[r];
    __m512i docs = _mm512_add_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                    _mm512_set1_epi32((int)base));
    _mm512_storeu_ps(group->list_upper[r] + count, _mm512_maskz_compress_ps(hit, upper));
    _mm512_storeu_ps(group->list_lower[r] + count, _mm512_maskz_compress_ps(hit, lower));
    _mm512_storeu_si512(group->list_doc[r] + count, _mm512_maskz_compress_epi32(hit, docs));
    group->count[r] = count + nk_popcount32(hit);
    /* Candidates are rescored after the whole matrix is screened: in a corpus, which streams from
     * memory, their rows arrive in the meantime (for cached documents this only costs time). */
    if (!context->d->cold) return;
    for (unsigned lanes = hit; lanes; lanes &= lanes - 1)
        nk_x512_prefetch_row((char const *)context->d->values +
                                 (group->list_base + base + nk_ctz32(lanes)) * context->row_bytes,
                             context->row_bytes);
}

/* Raise row r's threshold with the lower bounds of its newest candidates, s_q l - a. */
static void nk_samx_raise_row(nk_samx_group_t *group, unsigned r) {
    if (group->counted[r] >= group->count[r]) return;
    float lower = -INFINITY;
    for (unsigned c = group->counted[r]; c < group->count[r]; ++c)
        lower = group->list_lower[r][c] > lower ? group->list_lower[r][c] : lower;
    group->counted[r] = group->count[r];
    nk_x512_raise((double)lower * group->scale[r] - group->offset[r], group->offset[r], group->inv_scale[r],
                  &group->threshold[r], &group->cut[r]);
}

/* Rescore every row's largest u of the block first, one batch of independent float64 dot products,
 * so that the scan starts from an exact cosine (usually the row's winner) and collects only the
 * documents within the error bound of it. The rescored document's u becomes -inf. */
static void nk_samx_block_tops(nk_samx_context_t const *context, nk_samx_group_t *group, uint64_t rows,
                               uint64_t first_doc, uint64_t docs, float *upper_block) {
    nk_maxsim_view_t const *q = context->q, *d = context->d;
    nk_x512_batch_t batch;
    batch.n = 0;
    for (unsigned r = 0; r < rows; ++r) {
        if (group->cut[r] == INFINITY) continue; /* takes no part */
        nk_x512_queue_top(&batch, q, d, context->first_query, context->row_bytes, r, _mm512_load_ps(group->top[r]),
                          group->cut[r], upper_block, 256, 16, first_doc, docs);
    }
    nk_x512_rescore_batch(q, d, context->first_query, &batch, group->best, group->offset, group->inv_scale,
                          group->threshold, group->cut);
}

/* The scan found candidates among the 16 documents at upper (block tile t) of row r. */
static NK_NOINLINE void nk_samx_scan_hit(nk_samx_context_t const *context, nk_samx_group_t *group,
                                                       unsigned r, float const *upper, __mmask16 hit, uint64_t first_doc,
                                                       uint64_t t) {
    __m512 twice_growth = _mm512_set1_ps(2.0f * group->growth[r]), values = _mm512_load_ps(upper);
    __m512 error = _mm512_maskz_loadu_ps(hit, context->d->screen_errors + first_doc + 16 * t);
    nk_samx_append(context, group, r, values, _mm512_fnmadd_ps(twice_growth, error, values), hit,
                   (uint32_t)(first_doc - group->list_base + 16 * t));
}

/* Collect every document of the block whose u reaches its row's cut. Candidates are rare, so the
 * common path is four compares and one branch per 64 documents. */
static void nk_samx_scan_block(nk_samx_context_t const *context, nk_samx_group_t *group, uint64_t rows,
                               uint64_t first_doc, uint64_t docs, float const *upper_block) {
    uint64_t full = docs / 16, tiles = (docs + 15) / 16;
    __mmask16 tail = (__mmask16)((1u << (docs % 16)) - 1u);
    for (unsigned r = 0; r < rows; ++r) {
        if (group->cut[r] == INFINITY) continue;
        float const *row = upper_block + 16 * r; /* tile t of the row at row + 256 t */
        __m512 cut = _mm512_set1_ps(group->cut[r]);
        uint64_t t = 0;
        for (; t + 4 <= full; t += 4) {
            __mmask16 hit0 = _mm512_cmp_ps_mask(_mm512_load_ps(row + 256 * t), cut, _CMP_GE_OQ);
            __mmask16 hit1 = _mm512_cmp_ps_mask(_mm512_load_ps(row + 256 * t + 256), cut, _CMP_GE_OQ);
            __mmask16 hit2 = _mm512_cmp_ps_mask(_mm512_load_ps(row + 256 * t + 512), cut, _CMP_GE_OQ);
            __mmask16 hit3 = _mm512_cmp_ps_mask(_mm512_load_ps(row + 256 * t + 768), cut, _CMP_GE_OQ);
            if (_kortestz_mask16_u8(_kor_mask16(hit0, hit1), _kor_mask16(hit2, hit3))) continue;
            if (hit0) nk_samx_scan_hit(context, group, r, row + 256 * t, hit0, first_doc, t);
            if (hit1) nk_samx_scan_hit(context, group, r, row + 256 * t + 256, hit1, first_doc, t + 1);
            if (hit2) nk_samx_scan_hit(context, group, r, row + 256 * t + 512, hit2, first_doc, t + 2);
            if (hit3) nk_samx_scan_hit(context, group, r, row + 256 * t + 768, hit3, first_doc, t + 3);
            cut = _mm512_set1_ps(group->cut[r]); /* a full list was rescored: the cut may have risen */
        }
        for (; t < tiles; ++t) {
            __mmask16 lanes = t < full ? (__mmask16)0xFFFF : tail;
            __mmask16 hit = _mm512_mask_cmp_ps_mask(lanes, _mm512_load_ps(row + 256 * t), cut, _CMP_GE_OQ);
            if (hit) nk_samx_scan_hit(context, group, r, row + 256 * t, hit, first_doc, t);
            cut = _mm512_set1_ps(group->cut[r]);
        }
        group->counted[r] = group->count[r];
    }
}

/* Before a block: keep list entries 32-bit and reset the tagged per-lane maxima of u. */
static void nk_samx_start_block(nk_samx_context_t const *context, nk_samx_group_t *group, uint64_t rows,
                                uint64_t first_doc, uint64_t docs) {
    if (first_doc + docs - group->list_base > UINT32_MAX) {
        for (unsigned r = 0; r < rows; ++r) nk_samx_drain_row(context, group, r);
        group->list_base = first_doc;
    }
    for (unsigned r = 0; r < 16; ++r) _mm512_store_ps(group->top[r], _mm512_set1_ps(-INFINITY));
}

/* After the AMX pass over a block: turn its sums into u, derive the cuts, collect the candidates. */
static void nk_samx_finish_block(nk_samx_context_t const *context, nk_samx_group_t *group, uint64_t rows,
                                 uint64_t first_doc, uint64_t docs, float *block_buffer) {
    nk_maxsim_view_t const *d = context->d;
    uint64_t tiles = (docs + 15) / 16, partial = docs % 16;
    __mmask16 last_lanes = partial ? (__mmask16)((1u << partial) - 1u) : (__mmask16)0xFFFF;
    float const *scales_d = d->screen_scales + first_doc, *errors_d = d->screen_errors + first_doc;
    int32_t *sums = (int32_t *)(void *)block_buffer;
    for (uint64_t t = 0; t < tiles; t += 4) {
        int32_t *at = sums + 256 * t;
        float const *scales = scales_d + 16 * t, *errors = errors_d + 16 * t;
        unsigned first_tile = (unsigned)t;
        switch (tiles - t < 4 ? tiles - t : 4) {
        case 4:
            nk_samx_quad_epilogue(at, rows, scales, errors, t + 4 == tiles ? last_lanes : 0xFFFF, group, first_tile, 4);
            break;
        case 3: nk_samx_quad_epilogue(at, rows, scales, errors, last_lanes, group, first_tile, 3); break;
        case 2: nk_samx_quad_epilogue(at, rows, scales, errors, last_lanes, group, first_tile, 2); break;
        default: nk_samx_quad_epilogue(at, rows, scales, errors, last_lanes, group, first_tile, 1); break;
        }
    }
    nk_samx_block_tops(context, group, rows, first_doc, docs, block_buffer);
    nk_samx_scan_block(context, group, rows, first_doc, docs, block_buffer);
}

/* Screen documents [first_doc, first_doc + docs) (first_doc a multiple of NK_SAMX_BLOCK_DOCS) against
 * the query group and collect the block's candidates. `query_tiles` / `last_tile` hold the whole
 * depth when `single_pass`, else they are rebuilt per pass over NK_SAMX_CHUNK_STEPS steps. */
static void nk_samx_screen_block(nk_samx_context_t const *context, uint64_t rows, uint64_t first_doc, uint64_t docs,
                                 int8_t *query_tiles, uint8_t *last_tile, int single_pass, float *block_buffer,
                                 nk_samx_group_t *group) {
    nk_maxsim_view_t const *q = context->q, *d = context->d;
    nk_samx_depth_t depth = nk_samx_depth_of(d->screen_depth);
    uint64_t total_steps = depth.steps, tile_bytes = NK_SCREEN_TILE * d->screen_depth;
    uint64_t tiles = (docs + 15) / 16, partial = docs % 16;
    /* A partial last tile of the matrix (rows 4 n bytes apart) is read from its padded copy. */
    int last_is_copy = !depth.tiny && first_doc + docs == d->vectors && partial;
    uint64_t direct_tiles = last_is_copy ? tiles - 1 : tiles;
    uint8_t const *block = d->screen + first_doc * d->screen_depth;
    int32_t *sums = (int32_t *)(void *)block_buffer;
    nk_samx_start_block(context, group, rows, first_doc, docs);

    for (uint64_t step0 = 0; step0 < total_steps; step0 += NK_SAMX_CHUNK_STEPS) {
        uint64_t steps = total_steps - step0 < NK_SAMX_CHUNK_STEPS ? total_steps - step0 : NK_SAMX_CHUNK_STEPS;
        int accumulate = step0 != 0, finish = step0 + steps == total_steps;
        uint64_t tail_back = finish ? 64 * depth.pad : 0;
        uint8_t const *last_copy = last_tile;
        if (!single_pass) {
            nk_samx_build_query_tiles(q, &depth, context->first_query, step0, steps, query_tiles);
            /* One step of lines before the pass too, for an end-aligned last step that reaches back. */
            if (last_is_copy)
                nk_samx_copy_doc_tile(d, (d->vectors - 1) / 16, 16 * (int64_t)step0 - 16, 16 * steps + 16, last_tile);
            last_copy = last_tile + NK_SAMX_STEP_BYTES;
        }
        /* At most two steps: the query tiles stay in registers for the whole pass. */
        int stationary = steps <= 2;
        if (stationary) {
            _tile_loadd(4, query_tiles, 64);
            if (steps == 2) _tile_loadd(5, query_tiles + NK_SAMX_STEP_BYTES, 64);
        }
        uint64_t line0 = step0 * NK_SAMX_STEP_BYTES;
        /* The AMX unit first, then the vector units: interleaving them costs more than it overlaps. */
        for (uint64_t t = 0; t < tiles; t += 4) {
            uint8_t const *doc[4];
            uint64_t quad = tiles - t < 4 ? tiles - t : 4;
            for (unsigned u = 0; u < 4; ++u) {
                if (depth.tiny) { /* a single step of fewer than 16 lines: pad every tile */
                    if (u < quad) nk_samx_copy_doc_tile(d, first_doc / 16 + t + u, 0, 16, last_tile + u * NK_SAMX_STEP_BYTES);
                    doc[u] = last_tile + u * NK_SAMX_STEP_BYTES;
                } else
                    doc[u] = t + u < direct_tiles ? block + (t + u) * tile_bytes + line0 : last_copy;
            }
            int32_t *out = sums + 256 * t;
            int32_t const *init = accumulate ? out : NULL;
            switch (quad) {
            case 4: nk_samx_quad_dots(query_tiles, doc, steps, tail_back, init, stationary, 4); nk_samx_quad_store(out, 4); break;
            case 3: nk_samx_quad_dots(query_tiles, doc, steps, tail_back, init, stationary, 3); nk_samx_quad_store(out, 3); break;
            case 2: nk_samx_quad_dots(query_tiles, doc, steps, tail_back, init, stationary, 2); nk_samx_quad_store(out, 2); break;
            default: nk_samx_quad_dots(query_tiles, doc, steps, tail_back, init, stationary, 1); nk_samx_quad_store(out, 1); break;
            }
        }
    }
    nk_samx_finish_block(context, group, rows, first_doc, docs, block_buffer);
}

/* Two query groups (32 rows) against up to two document tiles, one pass over the whole depth:
 * accumulators 0/1 take group 0 against documents 0/1, 2/3 group 1. Each document tile loaded from L2
 * serves both groups, which halves the document traffic of one stationary group; the query tiles come
 * from L1. */
NK_INLINE void nk_samx_pair_dots(int8_t const *a0, int8_t const *a1, uint8_t const *const doc[2], uint64_t steps,
                                      uint64_t tail_back, int const DT) {
    _tile_zero(0);
    _tile_zero(2);
    if (DT > 1) {
        _tile_zero(1);
        _tile_zero(3);
    }
    for (uint64_t s = 0, a_offset = 0; s < steps; ++s, a_offset += NK_SAMX_STEP_BYTES) {
        uint64_t offset = s + 1 == steps ? a_offset - tail_back : a_offset;
        _tile_loadd(4, a0 + a_offset, 64);
        _tile_loadd(6, doc[0] + offset, 64);
        _tile_loadd(5, a1 + a_offset, 64);
        _tile_dpbsud(0, 4, 6);
        _tile_dpbsud(2, 5, 6);
        if (DT > 1) {
            _tile_loadd(7, doc[1] + offset, 64);
            _tile_dpbsud(1, 4, 7);
            _tile_dpbsud(3, 5, 7);
        }
    }
}

/* The paired form of nk_samx_screen_block for a depth of 16 groups or more in a single pass: both
 * groups' query tiles are built, `last_tile` holds the padded last document tile, and each group's
 * sums go to its half of block_buffer (NK_SAMX_BLOCK_DOCS documents each). */
static void nk_samx_screen_block_pair(nk_samx_context_t const context[2], uint64_t const rows[2], uint64_t first_doc,
                                      uint64_t docs, int8_t const *query_tiles[2], uint8_t const *last_tile,
                                      float *block_buffer, nk_samx_group_t group[2]) {
    nk_maxsim_view_t const *d = context[0].d;
    nk_samx_depth_t depth = nk_samx_depth_of(d->screen_depth);
    uint64_t tile_bytes = NK_SCREEN_TILE * d->screen_depth, tiles = (docs + 15) / 16;
    uint64_t direct_tiles = first_doc + docs == d->vectors && docs % 16 ? tiles - 1 : tiles;
    uint64_t tail_back = 64 * depth.pad;
    uint8_t const *block = d->screen + first_doc * d->screen_depth;
    int32_t *sums0 = (int32_t *)(void *)block_buffer, *sums1 = sums0 + 16 * NK_SAMX_BLOCK_DOCS;
    nk_samx_start_block(&context[0], &group[0], rows[0], first_doc, docs);
    nk_samx_start_block(&context[1], &group[1], rows[1], first_doc, docs);
    for (uint64_t t = 0; t < tiles; t += 2) {
        uint8_t const *doc[2];
        for (unsigned u = 0; u < 2; ++u) doc[u] = t + u < direct_tiles ? block + (t + u) * tile_bytes : last_tile;
        if (t + 1 < tiles) {
            nk_samx_pair_dots(query_tiles[0], query_tiles[1], doc, depth.steps, tail_back, 2);
            _tile_stored(0, sums0 + 256 * t, 64);
            _tile_stored(1, sums0 + 256 * t + 256, 64);
            _tile_stored(2, sums1 + 256 * t, 64);
            _tile_stored(3, sums1 + 256 * t + 256, 64);
        } else {
            nk_samx_pair_dots(query_tiles[0], query_tiles[1], doc, depth.steps, tail_back, 1);
            _tile_stored(0, sums0 + 256 * t, 64);
            _tile_stored(2, sums1 + 256 * t, 64);
        }
    }
    nk_samx_finish_block(&context[0], &group[0], rows[0], first_doc, docs, (float *)(void *)sums0);
    nk_samx_finish_block(&context[1], &group[1], rows[1], first_doc, docs, (float *)(void *)sums1);
}

/* ---- Candidates. ---- */

/* Rescore one document for row r; raise best, threshold and cut. */
static void nk_samx_rescore(nk_samx_context_t const *context, nk_samx_group_t *group, unsigned r, uint64_t doc,
                            double const *decoded) {
    nk_maxsim_view_t const *q = context->q;
    uint64_t i = context->first_query + r;
    void const *q_row = (char const *)q->values + i * context->row_bytes;
    double cos = nk_x512_cosine(q, context->d, q_row, decoded, q->inv_norms[i], doc, context->row_bytes);
    nk_x512_take(cos, &group->best[r], group->offset[r], group->inv_scale[r], &group->threshold[r], &group->cut[r]);
}

/* Index of the largest of upper[0 .. count), count > 0, without data-dependent branches (they would
 * mispredict half the time). */
static inline unsigned nk_samx_top(float const *upper, unsigned count) {
    if (count <= 4) {
        __m128 values = _mm_mask_loadu_ps(_mm_set1_ps(-INFINITY), (__mmask8)((1u << count) - 1u), upper);
        __m128 largest = _mm_max_ps(values, _mm_shuffle_ps(values, values, _MM_SHUFFLE(2, 3, 0, 1)));
        largest = _mm_max_ps(largest, _mm_shuffle_ps(largest, largest, _MM_SHUFFLE(1, 0, 3, 2)));
        return nk_ctz32(_mm_cmp_ps_mask(values, largest, _CMP_EQ_OQ));
    }
    __m512 largest = _mm512_set1_ps(-INFINITY);
    for (unsigned c = 0; c < count; c += 16)
        largest = _mm512_max_ps(largest, _mm512_mask_loadu_ps(largest, nk_x512_tail_mask(count - c), upper + c));
    __m512 top = _mm512_set1_ps(_mm512_reduce_max_ps(largest));
    for (unsigned c = 0;; c += 16) {
        __mmask16 lanes = nk_x512_tail_mask(count - c);
        __mmask16 at = _mm512_mask_cmp_ps_mask(lanes, _mm512_maskz_loadu_ps(lanes, upper + c), top, _CMP_EQ_OQ);
        if (at) return c + nk_ctz32(at);
    }
}

/* Take the largest u of row r's list (count > 0) out of it: its document, or UINT64_MAX when even
 * the largest misses the cut (the list is then emptied). */
static inline uint64_t nk_samx_pop(nk_samx_group_t *group, unsigned r) {
    float *upper = group->list_upper[r];
    uint32_t *doc = group->list_doc[r];
    unsigned last = group->count[r] - 1, top = nk_samx_top(upper, group->count[r]);
    if (!(upper[top] >= group->cut[r])) {
        group->count[r] = group->counted[r] = 0;
        return UINT64_MAX;
    }
    uint64_t chosen = group->list_base + doc[top];
    upper[top] = upper[last];
    group->list_lower[r][top] = group->list_lower[r][last];
    doc[top] = doc[last];
    group->count[r] = group->counted[r] = last;
    return chosen;
}

static void nk_samx_drain_row(nk_samx_context_t const *context, nk_samx_group_t *group, unsigned r) {
    double const *decoded = NULL;
    float const *decoded32 = NULL;
    unsigned exact = 0; /* exact dot products so far */
    nk_samx_raise_row(group, r); /* the list's lower bounds first: a free, higher cut */
    void const *q_row = (char const *)context->q->values + (context->first_query + r) * context->row_bytes;
    int screen = context->q->dtype != nk_dtype_float64_k; /* float64 rows have no float32 bound */
    while (group->count[r]) {
        uint64_t doc = nk_samx_pop(group, r);
        if (doc == UINT64_MAX) break;
        double inv_d = context->d->inv_norms[doc], slack;
        int check = screen && group->best[r] > -INFINITY && inv_d != 0.0;
        if (check && !decoded32 && context->q->dtype != nk_dtype_float32_k && !nk_x512_is_integer((int)context->q->dtype) &&
            context->q->depth <= NK_SAMX_DECODED_DEPTH) { /* integer formats: checked exactly, as stored */
            nk_x512_decode_f32((int)context->q->dtype, q_row, context->q->depth, context->decoded32);
            decoded32 = context->decoded32; /* a row with one check pays the same decoding either way */
        }
        if (check &&
            nk_x512_cosine_f32((int)context->q->dtype, decoded32 ? (void const *)decoded32 : q_row, decoded32 != NULL,
                               (char const *)context->d->values + doc * context->row_bytes, context->q->depth,
                               context->q->inv_norms[context->first_query + r], inv_d, &slack) +
                    slack <
                group->best[r])
            continue; /* provably below the best exact cosine */
        if (!decoded && exact++ && context->q->depth <= NK_SAMX_DECODED_DEPTH && !nk_x512_is_integer((int)context->q->dtype)) {
            /* a second exact dot product: decode the query row once (float64 rows are used in place) */
            if (context->q->dtype == nk_dtype_float64_k) decoded = (double const *)q_row;
            else {
                nk_x512_decode_row((int)context->q->dtype, q_row, context->q->depth, context->decoded);
                decoded = context->decoded;
            }
        }
        nk_samx_rescore(context, group, r, doc, decoded);
    }
}

/* Rescore the best remaining candidate of every row. One candidate per row per round keeps the exact
 * dot products of different rows independent work. */
static void nk_samx_rescore_round(nk_samx_context_t const *context, nk_samx_group_t *group, uint64_t rows) {
    nk_maxsim_view_t const *q = context->q, *d = context->d;
    nk_x512_batch_t batch;
    batch.n = 0;
    for (unsigned r = 0; r < rows; ++r) {
        if (!group->count[r]) continue;
        uint64_t doc = nk_samx_pop(group, r);
        if (doc == UINT64_MAX) continue;
            nk_x512_batch_add(&batch, q, d, context->first_query, context->row_bytes, r, doc);
    }
    nk_x512_rescore_batch(q, d, context->first_query, &batch, group->best, group->offset, group->inv_scale,
                          group->threshold, group->cut);
}

/* After the whole document matrix: every row's best candidate together, then each row's remaining
 * ones with its query row decoded once. */
static void nk_samx_finish_group(nk_samx_context_t const *context, nk_samx_group_t *group, uint64_t rows) {
    nk_samx_rescore_round(context, group, rows);
    /* Which rows still hold a candidate that reaches the cut, found without a branch per row: about
     * half of them do, so a branch would mispredict every other time. */
    unsigned pending = 0;
    for (unsigned r = 0; r < rows; ++r) {
        __m512 largest = _mm512_set1_ps(-INFINITY);
        for (unsigned c = 0; c < group->count[r]; c += 16)
            largest = _mm512_max_ps(
                largest, _mm512_mask_loadu_ps(largest, nk_x512_tail_mask(group->count[r] - c), group->list_upper[r] + c));
        pending |= (unsigned)(_mm512_reduce_max_ps(largest) >= group->cut[r]) << r;
    }
    for (; pending; pending &= pending - 1) nk_samx_drain_row(context, group, nk_ctz32(pending));
}

/* A query group's per-row constants and empty state for rows [first_query, first_query + rows). */
static void nk_samx_group_init(nk_maxsim_view_t const *q, uint64_t first_query, uint64_t rows, nk_samx_group_t *group) {
    for (unsigned half = 0; half < 2; ++half) {
        uint64_t done = 8u * half, left = rows > done ? rows - done : 0;
        nk_x512_row_constants_t c = nk_x512_row_constants(q, first_query + done, left);
        _mm256_storeu_si256((__m256i *)(group->bias + done), _mm256_sub_epi32(_mm256_setzero_si256(), c.bias));
        _mm256_storeu_ps(group->growth + done, c.growth);
        _mm256_storeu_ps(group->cut + done, _mm256_mask_blend_ps(c.live, _mm256_set1_ps(INFINITY), _mm256_set1_ps(-FLT_MAX)));
        _mm512_storeu_pd(group->scale + done, c.scale);
        _mm512_storeu_pd(group->inv_scale + done, c.inv_scale);
        _mm512_storeu_pd(group->offset + done, c.offset);
        _mm512_storeu_pd(group->threshold + done, _mm512_set1_pd(-INFINITY));
        _mm512_storeu_pd(group->best + done, _mm512_set1_pd(-INFINITY));
    }
    for (unsigned r = 0; r < 16; ++r) group->count[r] = group->counted[r] = 0;
    group->list_base = 0;
}

/* Rescore what the screening left and add the group's distances to *total, row by row (the same
 * order as every family, so results are bit-identical). */
static void nk_samx_group_total(nk_samx_context_t const *context, nk_samx_group_t *group, uint64_t rows,
                                double *total) {
    nk_samx_finish_group(context, group, rows);
    for (uint64_t r = 0; r < rows; ++r)
        *total += nk_row_distance(context->q->inv_norms[context->first_query + r], group->best[r]);
}

double nk_maxsim_sapphireamx(nk_maxsim_view_t const *q, nk_maxsim_view_t const *d) {

    _Alignas(64) float block_buffer[2 * 16 * NK_SAMX_BLOCK_DOCS]; /* one or two groups */
    /* One group's A tiles for a pass, or two groups' for a paired single pass. */
    _Alignas(64) int8_t query_tiles[2][NK_SAMX_CHUNK_STEPS * NK_SAMX_STEP_BYTES];
    /* The padded last document tile: one pass and one step before it (or four tiles of a tiny depth). */
    _Alignas(64) uint8_t last_tile[(NK_SAMX_CHUNK_STEPS + 1) * NK_SAMX_STEP_BYTES];
    _Alignas(64) double decoded_query[NK_SAMX_DECODED_DEPTH];
    _Alignas(64) float decoded_query32[NK_SAMX_DECODED_DEPTH];
    _Alignas(64) nk_samx_group_t group[2];
    size_t row_bytes = q->row_bytes;
    nk_samx_context_t context[2] = {{q, d, row_bytes, decoded_query, decoded_query32, 0},
                                    {q, d, row_bytes, decoded_query, decoded_query32, 0}};

    nk_samx_depth_t depth = nk_samx_depth_of(d->screen_depth);
    uint64_t total_steps = depth.steps;
    int single_pass = total_steps <= NK_SAMX_CHUNK_STEPS;
    if (single_pass && !depth.tiny && d->vectors % 16)
        nk_samx_copy_doc_tile(d, (d->vectors - 1) / 16, 0, 16 * total_steps, last_tile);

    nk_samx_tile_config_t config;
    memset(&config, 0, sizeof(config));
    config.palette = 1;
    for (int t = 0; t < 8; ++t) config.bytes_per_row[t] = 64, config.rows[t] = 16;
    _tile_loadconfig(&config);

    double total = 0.0;
    for (uint64_t first_query = 0; first_query < q->vectors;) {
        /* Two groups share every document tile load when the whole depth fits one pass. */
        uint64_t left = q->vectors - first_query;
        unsigned groups = single_pass && !depth.tiny && left > 16 ? 2 : 1;
        uint64_t rows[2] = {left < 16 ? left : 16, groups == 2 ? (left - 16 < 16 ? left - 16 : 16) : 0};
        int8_t const *tiles[2] = {query_tiles[0], query_tiles[1]};
        for (unsigned g = 0; g < groups; ++g) {
            context[g].first_query = first_query + 16 * g;
            nk_samx_group_init(q, context[g].first_query, rows[g], &group[g]);
            if (single_pass) nk_samx_build_query_tiles(q, &depth, context[g].first_query, 0, total_steps, query_tiles[g]);
        }
        for (uint64_t first_doc = 0; first_doc < d->vectors; first_doc += NK_SAMX_BLOCK_DOCS) {
            uint64_t docs = d->vectors - first_doc < NK_SAMX_BLOCK_DOCS ? d->vectors - first_doc : NK_SAMX_BLOCK_DOCS;
            if (groups == 2) nk_samx_screen_block_pair(context, rows, first_doc, docs, tiles, last_tile, block_buffer, group);
            else
                nk_samx_screen_block(&context[0], rows[0], first_doc, docs, query_tiles[0], last_tile, single_pass,
                                     block_buffer, &group[0]);
        }
        for (unsigned g = 0; g < groups; ++g) nk_samx_group_total(&context[g], &group[g], rows[g], &total);
        first_query += rows[0] + rows[1];
    }
    _tile_release();
    return total;
}
