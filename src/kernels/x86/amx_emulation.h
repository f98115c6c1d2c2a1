/* The AMX tile instructions sapphireamx.c uses, as C functions over a thread-local tile file, for
 * checking that family's logic on CPUs without AMX (tests/c builds it with NK_AMX_EMULATE; the
 * package never does). Semantics as in the Intel SDM (LDTILECFG palette 1, TILELOADD, TILESTORED,
 * TILEZERO, TDPBSUD: signed bytes of A times unsigned bytes of B, four per 32-bit sum). */
#ifndef NUMKONG_X86_AMX_EMULATION_H
#define NUMKONG_X86_AMX_EMULATION_H

#include <stdint.h>
#include <string.h>

typedef struct nk_amx_tiles {
    uint8_t data[8][16][64];
    uint8_t rows[8];
    uint16_t bytes_per_row[8];
} nk_amx_tiles_t;

static _Thread_local nk_amx_tiles_t nk_amx_state;

static void nk_amx_loadconfig(void const *config) {
    uint8_t const *bytes = (uint8_t const *)config;
    memset(&nk_amx_state, 0, sizeof(nk_amx_state));
    for (int t = 0; t < 8; ++t) {
        memcpy(&nk_amx_state.bytes_per_row[t], bytes + 16 + 2 * t, 2);
        nk_amx_state.rows[t] = bytes[48 + t];
    }
}

static void nk_amx_loadd(int tile, void const *base, int64_t stride) {
    for (int m = 0; m < nk_amx_state.rows[tile]; ++m)
        memcpy(nk_amx_state.data[tile][m], (char const *)base + m * stride, nk_amx_state.bytes_per_row[tile]);
}

static void nk_amx_stored(int tile, void *base, int64_t stride) {
    for (int m = 0; m < nk_amx_state.rows[tile]; ++m)
        memcpy((char *)base + m * stride, nk_amx_state.data[tile][m], nk_amx_state.bytes_per_row[tile]);
}

static void nk_amx_zero(int tile) { memset(nk_amx_state.data[tile], 0, sizeof(nk_amx_state.data[tile])); }

/* TDPB[SU][SU]D: bytes of A (signed when a_signed) times bytes of B (signed when b_signed). */
static void nk_amx_dot(int c, int a, int b, int a_signed, int b_signed) {
    for (int m = 0; m < nk_amx_state.rows[c]; ++m)
        for (int n = 0; n < nk_amx_state.bytes_per_row[c] / 4; ++n) {
            uint32_t sum; /* wraps, as the hardware's 32-bit sums do */
            memcpy(&sum, &nk_amx_state.data[c][m][4 * n], 4);
            for (int k = 0; k < nk_amx_state.bytes_per_row[a] / 4; ++k)
                for (int i = 0; i < 4; ++i) {
                    uint8_t x = nk_amx_state.data[a][m][4 * k + i], y = nk_amx_state.data[b][k][4 * n + i];
                    sum += (uint32_t)((a_signed ? (int32_t)(int8_t)x : (int32_t)x) *
                                      (b_signed ? (int32_t)(int8_t)y : (int32_t)y));
                }
            memcpy(&nk_amx_state.data[c][m][4 * n], &sum, 4);
        }
}

/* Replace the compiler's own definitions (immintrin.h comes first). */
#undef _tile_loadconfig
#undef _tile_loadd
#undef _tile_stored
#undef _tile_zero
#undef _tile_dpbsud
#undef _tile_dpbusd
#undef _tile_release
#define _tile_loadconfig(config) nk_amx_loadconfig(config)
#define _tile_loadd(tile, base, stride) nk_amx_loadd(tile, base, stride)
#define _tile_stored(tile, base, stride) nk_amx_stored(tile, base, stride)
#define _tile_zero(tile) nk_amx_zero(tile)
#define _tile_dpbsud(c, a, b) nk_amx_dot(c, a, b, 1, 0)
#define _tile_dpbusd(c, a, b) nk_amx_dot(c, a, b, 0, 1)
#define _tile_release() memset(&nk_amx_state, 0, sizeof(nk_amx_state))

#endif /* NUMKONG_X86_AMX_EMULATION_H */
