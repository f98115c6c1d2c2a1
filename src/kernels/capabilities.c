/* CPU feature probing: cpuid + xgetbv on x86, getauxval on Linux Arm. Probed once, cached. */
#define _GNU_SOURCE /* syscall() for the AMX permission request */
#include "maxsim_internal.h"

#if defined(__x86_64__) || defined(__i386__) || defined(_M_X64)
#define NK_TARGET_X86 1
#include <cpuid.h>
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

static uint64_t nk_xgetbv0(void) {
    uint32_t eax, edx;
    __asm__ volatile("xgetbv" : "=a"(eax), "=d"(edx) : "c"(0));
    return ((uint64_t)edx << 32) | eax;
}

static uint64_t nk_probe_cpu(void) {
    uint64_t caps = nk_cap_serial_k;
    unsigned eax, ebx, ecx, edx;
    if (!__get_cpuid(1, &eax, &ebx, &ecx, &edx)) return caps;
    int fma = (ecx >> 12) & 1, osxsave = (ecx >> 27) & 1, avx = (ecx >> 28) & 1, f16c = (ecx >> 29) & 1;
    if (!osxsave || !avx) return caps;
    uint64_t xcr0 = nk_xgetbv0();
    int os_avx = (xcr0 & 0x6) == 0x6;             /* XMM and YMM state */
    int os_avx512 = os_avx && (xcr0 & 0xE0) == 0xE0; /* opmask, ZMM_Hi256, Hi16_ZMM */
    if (!os_avx || __get_cpuid_max(0, 0) < 7) return caps;
    __cpuid_count(7, 0, eax, ebx, ecx, edx);
    int avx2 = (ebx >> 5) & 1;
    int avx512f = (ebx >> 16) & 1, avx512dq = (ebx >> 17) & 1, avx512cd = (ebx >> 28) & 1;
    int avx512bw = (ebx >> 30) & 1, avx512vl = (ebx >> 31) & 1;
    int vbmi = (ecx >> 1) & 1, vbmi2 = (ecx >> 6) & 1, vnni = (ecx >> 11) & 1, bitalg = (ecx >> 12) & 1;
    int vpopcntdq = (ecx >> 14) & 1;
    if (avx2 && fma && f16c) caps |= nk_cap_haswell_k;
    int amx_tile = (edx >> 24) & 1, amx_int8 = (edx >> 25) & 1;
    int os_amx = (xcr0 & 0x60000) == 0x60000; /* XTILECFG and XTILEDATA */
    if (os_avx512 && avx512f && avx512cd && avx512bw && avx512dq && avx512vl) {
        caps |= nk_cap_skylake_k;
        if (vnni && vbmi && vbmi2 && bitalg && vpopcntdq) {
            caps |= nk_cap_icelake_k;
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
    uint64_t caps = __atomic_load_n(&nk_cpu_cache, __ATOMIC_RELAXED);
    if (!caps) {
        caps = nk_probe_cpu();
        __atomic_store_n(&nk_cpu_cache, caps, __ATOMIC_RELAXED);
    }
    return caps;
}

void nk_capabilities_disable(uint64_t mask) {
    __atomic_fetch_or(&nk_disabled, mask & ~(uint64_t)nk_cap_serial_k, __ATOMIC_RELAXED);
}

uint64_t nk_capabilities_available(void) {
    return (nk_capabilities_compiled() & nk_capabilities_cpu() & ~__atomic_load_n(&nk_disabled, __ATOMIC_RELAXED)) |
           nk_cap_serial_k;
}
