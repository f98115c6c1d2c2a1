/* CPU feature probing: cpuid + xgetbv on x86, getauxval on Linux Arm. Probed once, cached. */
#define _GNU_SOURCE /* syscall() for the AMX permission request */
#include "maxsim_internal.h"

#if defined(__x86_64__) || defined(__i386__) || defined(_M_X64)
#define NK_TARGET_X86 1
#if defined(_MSC_VER) && !defined(__clang__)
#include <intrin.h>
#else
#include <cpuid.h>
#endif
#elif defined(__aarch64__) && defined(__linux__)
#define NK_TARGET_ARM_LINUX 1
#include <sys/auxv.h>
#endif

#ifdef NK_TARGET_X86
#if defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif

/* Linux hands out AMX tile state only after a per-process request; without it, tile instructions
 * fault. Returns 1 when the tile data state may be used. */
static int nk_request_amx(void) {
#if defined(__linux__) && defined(SYS_arch_prctl)
    enum { arch_req_xcomp_perm = 0x1023, xfeature_xtiledata = 18 };
    return syscall(SYS_arch_prctl, arch_req_xcomp_perm, xfeature_xtiledata) == 0;
#else
    return 0;
#endif
}

/* registers[0..3] = eax, ebx, ecx, edx of CPUID(leaf, subleaf). */
static void nk_cpuid(unsigned leaf, unsigned subleaf, unsigned registers[4]) {
#if defined(_MSC_VER) && !defined(__clang__)
    int values[4];
    __cpuidex(values, (int)leaf, (int)subleaf);
    for (int i = 0; i < 4; ++i) registers[i] = (unsigned)values[i];
#else
    __cpuid_count(leaf, subleaf, registers[0], registers[1], registers[2], registers[3]);
#endif
}

static uint64_t nk_xgetbv0(void) {
#if defined(_MSC_VER) && !defined(__clang__)
    return (uint64_t)_xgetbv(0);
#else
    uint32_t eax, edx;
    __asm__ volatile("xgetbv" : "=a"(eax), "=d"(edx) : "c"(0));
    return ((uint64_t)edx << 32) | eax;
#endif
}

static uint64_t nk_probe_cpu(void) {
    uint64_t caps = nk_cap_serial_k;
    unsigned registers[4];
    nk_cpuid(0, 0, registers);
    unsigned max_leaf = registers[0];
    if (max_leaf < 1) return caps;
    nk_cpuid(1, 0, registers);
    unsigned ecx = registers[2], ebx, edx;
    int fma = (ecx >> 12) & 1, osxsave = (ecx >> 27) & 1, avx = (ecx >> 28) & 1, f16c = (ecx >> 29) & 1;
    if (!osxsave || !avx) return caps;
    uint64_t xcr0 = nk_xgetbv0();
    int os_avx = (xcr0 & 0x6) == 0x6;             /* XMM and YMM state */
    int os_avx512 = os_avx && (xcr0 & 0xE0) == 0xE0; /* opmask, ZMM_Hi256, Hi16_ZMM */
    if (!os_avx || max_leaf < 7) return caps;
    nk_cpuid(7, 0, registers);
    ebx = registers[1], ecx = registers[2], edx = registers[3];
    int avx2 = (ebx >> 5) & 1;
    int avx512f = (ebx >> 16) & 1, avx512dq = (ebx >> 17) & 1, avx512cd = (ebx >> 28) & 1;
    int avx512bw = (ebx >> 30) & 1, avx512vl = (ebx >> 31) & 1;
    int vbmi = (ecx >> 1) & 1, vbmi2 = (ecx >> 6) & 1, vnni = (ecx >> 11) & 1, bitalg = (ecx >> 12) & 1;
    int vpopcntdq = (ecx >> 14) & 1;
    unsigned leaf7_subleaves = registers[0];
    if (avx2 && fma && f16c) caps |= nk_cap_haswell_k;
    int amx_tile = (edx >> 24) & 1, amx_int8 = (edx >> 25) & 1;
    int os_amx = (xcr0 & 0x60000) == 0x60000; /* XTILECFG and XTILEDATA */
    if (os_avx512 && avx512f && avx512cd && avx512bw && avx512dq && avx512vl) {
        caps |= nk_cap_skylake_k;
        if (vnni && vbmi && vbmi2 && bitalg && vpopcntdq) {
            caps |= nk_cap_icelake_k;
            if (leaf7_subleaves >= 1) { /* AVX512_BF16: CPUID(7, 1).EAX bit 5 */
                nk_cpuid(7, 1, registers);
                if ((registers[0] >> 5) & 1) caps |= nk_cap_genoa_k;
            }
            if (amx_tile && amx_int8 && os_amx && nk_request_amx()) caps |= nk_cap_sapphireamx_k;
        }
    }
    return caps;
}
#elif defined(NK_TARGET_ARM_LINUX)
#ifndef HWCAP_ASIMDDP
#define HWCAP_ASIMDDP (1 << 20)
#endif
#ifndef HWCAP_ASIMDHP
#define HWCAP_ASIMDHP (1 << 10)
#endif
#ifndef HWCAP_SVE
#define HWCAP_SVE (1 << 22)
#endif
static uint64_t nk_probe_cpu(void) {
    uint64_t caps = nk_cap_serial_k;
    unsigned long hwcap = getauxval(AT_HWCAP);
    if ((hwcap & HWCAP_ASIMDDP) && (hwcap & HWCAP_ASIMDHP)) caps |= nk_cap_neon_k;
    if (hwcap & HWCAP_SVE) caps |= nk_cap_sve_k;
    return caps;
}
#else
static uint64_t nk_probe_cpu(void) { return nk_cap_serial_k; }
#endif

uint64_t nk_capabilities_compiled(void) {
    uint64_t caps = nk_cap_serial_k;
#ifdef NK_HAVE_HASWELL
    caps |= nk_cap_haswell_k;
#endif
#ifdef NK_HAVE_SKYLAKE
    caps |= nk_cap_skylake_k;
#endif
#ifdef NK_HAVE_ICELAKE
    caps |= nk_cap_icelake_k;
#endif
#ifdef NK_HAVE_GENOA
    caps |= nk_cap_genoa_k;
#endif
#ifdef NK_HAVE_SAPPHIREAMX
    caps |= nk_cap_sapphireamx_k;
#endif
#ifdef NK_HAVE_NEON
    caps |= nk_cap_neon_k;
#endif
#ifdef NK_HAVE_SVE
    caps |= nk_cap_sve_k;
#endif
    return caps;
}

/* Cached probe; racing first calls compute the same value, so relaxed atomics suffice. */
static uint64_t nk_cpu_cache = 0;
static uint64_t nk_disabled = 0;

uint64_t nk_capabilities_cpu(void) {
    uint64_t caps = nk_atomic_load_u64(&nk_cpu_cache);
    if (!caps) {
        caps = nk_probe_cpu();
        nk_atomic_store_u64(&nk_cpu_cache, caps);
    }
    return caps;
}

void nk_capabilities_disable(uint64_t mask) {
    nk_atomic_fetch_or_u64(&nk_disabled, mask & ~(uint64_t)nk_cap_serial_k);
}

uint64_t nk_capabilities_available(void) {
    return (nk_capabilities_compiled() & nk_capabilities_cpu() & ~nk_atomic_load_u64(&nk_disabled)) |
           nk_cap_serial_k;
}
