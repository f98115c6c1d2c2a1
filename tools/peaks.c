/* Per-core peaks of the instructions the kernels are built on, for tools/bench.py to print beside
 * its GSO/s: int8 VNNI (vpdpbusd zmm), float32 FMA (vfmadd231ps zmm) and, where the CPU and kernel
 * allow it, AMX-INT8 (tdpbusd). Each is 16 (AMX: 3 tiles' worth of) independent chains in a loop,
 * timed on one thread; figures are G ops/s with a multiply-add counted as 2 ops, as bench.py counts.
 * Build: cc -O3 -mavx512f -mavx512vnni -mamx-tile -mamx-int8 tools/peaks.c (bench.py does).
 * Prints one line per instruction: "<name> <G ops/s>" or "<name> n/a <why>"; with AMX also
 * "amx_wakeup_ns <ns>", the extra cost of a tile multiply on an AMX unit that has gone idle. */
#define _GNU_SOURCE
#include <cpuid.h>
#include <immintrin.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static int has(unsigned leaf, unsigned sub, int reg, unsigned bit) {
    unsigned r[4];
    if (!__get_cpuid_count(leaf, sub, &r[0], &r[1], &r[2], &r[3])) return 0;
    return (r[reg] >> bit) & 1u;
}

/* Best of 5 runs of `iterations` x 16 instructions of `ops` each. */
#define NK_PEAK(name, type, zero, step, ops)                                                                   \
    static double name(long iterations) {                                                                    \
        double best = 0.0;                                                                                   \
        for (int run = 0; run < 5; ++run) {                                                                  \
            type acc[16];                                                                                    \
            _Pragma("GCC unroll 16") for (int i = 0; i < 16; ++i) acc[i] = zero;                            \
            type a = step##_a(), b = step##_b();                                                             \
            double start = now();                                                                            \
            for (long n = 0; n < iterations; ++n) {                                                          \
                _Pragma("GCC unroll 16") for (int i = 0; i < 16; ++i) acc[i] = step(acc[i], a, b);          \
                __asm__ volatile("" : "+v"(acc[0]), "+v"(acc[1]), "+v"(acc[2]), "+v"(acc[3]), "+v"(acc[4]),   \
                                 "+v"(acc[5]), "+v"(acc[6]), "+v"(acc[7]));                                  \
                __asm__ volatile("" : "+v"(acc[8]), "+v"(acc[9]), "+v"(acc[10]), "+v"(acc[11]),             \
                                 "+v"(acc[12]), "+v"(acc[13]), "+v"(acc[14]), "+v"(acc[15]));                \
            }                                                                                                \
            double rate = (double)iterations * 16.0 * (ops) / (now() - start) / 1e9;                          \
            if (rate > best) best = rate;                                                                    \
        }                                                                                                    \
        return best;                                                                                         \
    }

static __m512i vnni_a(void) { return _mm512_set1_epi8(1); }
static __m512i vnni_b(void) { return _mm512_set1_epi8(1); }
static __m512i vnni(__m512i acc, __m512i a, __m512i b) { return _mm512_dpbusd_epi32(acc, a, b); }
NK_PEAK(peak_vnni, __m512i, _mm512_setzero_si512(), vnni, 2.0 * 64)

static __m512 fma32_a(void) { return _mm512_set1_ps(1.0f); }
static __m512 fma32_b(void) { return _mm512_set1_ps(1e-9f); }
static __m512 fma32(__m512 acc, __m512 a, __m512 b) { return _mm512_fmadd_ps(a, b, acc); }
NK_PEAK(peak_fma, __m512, _mm512_setzero_ps(), fma32, 2.0 * 16)

typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t bytes_per_row[16];
    uint8_t rows[16];
} tile_config_t;

/* tdpbusd into 3 accumulator tiles from 16 x 64-byte operands: 16 x 16 x 64 multiply-adds each. */
static double peak_amx(long iterations) {
    static _Alignas(64) uint8_t a[1024], b[1024];
    memset(a, 1, sizeof a), memset(b, 1, sizeof b);
    tile_config_t config;
    memset(&config, 0, sizeof config);
    config.palette = 1;
    for (int t = 0; t < 8; ++t) config.bytes_per_row[t] = 64, config.rows[t] = 16;
    _tile_loadconfig(&config);
    _tile_loadd(4, a, 64);
    _tile_loadd(5, b, 64);
    double best = 0.0;
    for (int run = 0; run < 5; ++run) {
        _tile_zero(0);
        _tile_zero(1);
        _tile_zero(2);
        _tile_zero(3);
        double start = now();
        for (long n = 0; n < iterations; ++n) {
            _tile_dpbusd(0, 4, 5);
            _tile_dpbusd(1, 4, 5);
            _tile_dpbusd(2, 4, 5);
            _tile_dpbusd(3, 4, 5);
        }
        double rate = (double)iterations * 4.0 * 2.0 * 16 * 16 * 64 / (now() - start) / 1e9;
        if (rate > best) best = rate;
    }
    return best; /* the tiles stay configured for amx_wakeup_ns */
}

/* One tile multiply and the store of its result, then the clock. */
static double amx_multiply_then_now(void) {
    static _Alignas(64) int32_t out[256];
    _tile_dpbusd(0, 4, 5);
    _tile_stored(0, out, 64);
    (void)*(int32_t volatile *)out; /* the clock is read after the stored result is read back */
    return now();
}

/* What the first tile multiply (and the store of its result) costs after 2 us without tile
 * instructions, beyond what it costs right after another: the AMX unit idles down after about a
 * microsecond, so every call that screens with tiles meets it so, a reranking loop's calls included
 * (the rest of each call is vector work). Median of 101, in ns. Expects peak_amx's tile set-up. */
static double amx_wakeup_ns(void) {
    double extra[101];
    for (int i = 0; i < 101; ++i) {
        double spin = now();
        while (now() - spin < 2e-6) continue;
        double t0 = now(), t1 = amx_multiply_then_now(), t2 = amx_multiply_then_now();
        extra[i] = ((t1 - t0) - (t2 - t1)) * 1e9;
    }
    for (int i = 1; i < 101; ++i) /* insertion sort: the median */
        for (int j = i; j > 0 && extra[j - 1] > extra[j]; --j) {
            double swap = extra[j];
            extra[j] = extra[j - 1], extra[j - 1] = swap;
        }
    return extra[50];
}

int main(void) {
    int avx512 = has(7, 0, 1, 16), vnni_ok = has(7, 0, 2, 11);
    if (avx512) printf("fma_f32_zmm %.0f\n", peak_fma(20000000));
    else printf("fma_f32_zmm n/a no AVX-512F\n");
    if (avx512 && vnni_ok) printf("vnni_int8_zmm %.0f\n", peak_vnni(20000000));
    else printf("vnni_int8_zmm n/a no AVX-512 VNNI\n");
    int amx = has(7, 0, 3, 24) && has(7, 0, 3, 25);
    /* Linux grants the AMX tile state on request (ARCH_REQ_XCOMP_PERM = 0x1023, XFEATURE 18). */
    if (amx && syscall(SYS_arch_prctl, 0x1023, 18) == 0) {
        printf("amx_int8 %.0f\n", peak_amx(2000000));
        printf("amx_wakeup_ns %.0f\n", amx_wakeup_ns());
        _tile_release();
    } else
        printf("amx_int8 n/a %s\n", amx ? "the kernel refused the AMX tile state" : "no AMX-INT8 on this CPU");
    return 0;
}
