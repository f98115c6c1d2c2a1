/* Compiler portability for the kernels: one spelling each of forced inlining, bit scans, overflow-
 * checked arithmetic, atomics and prefetching, for GCC / Clang and for MSVC. Everything else is C11
 * (alignment is _Alignas). */
#ifndef NUMKONG_COMPILER_H
#define NUMKONG_COMPILER_H

#include <stdint.h>

#if defined(_MSC_VER) && !defined(__clang__)
#include <intrin.h>
#define NK_INLINE static __forceinline
#define NK_NOINLINE __declspec(noinline)
#define NK_UNLIKELY(x) (x)

static __forceinline unsigned nk_ctz32(uint32_t x) { /* x != 0 */
    unsigned long index;
    _BitScanForward(&index, x);
    return (unsigned)index;
}
static __forceinline unsigned nk_ctz64(uint64_t x) { /* x != 0 */
    unsigned long index;
    _BitScanForward64(&index, x);
    return (unsigned)index;
}
static __forceinline unsigned nk_popcount32(uint32_t x) { return (unsigned)__popcnt(x); }
static __forceinline uint64_t nk_atomic_fetch_add_u64(uint64_t *at, uint64_t value) {
    return (uint64_t)_InterlockedExchangeAdd64((__int64 volatile *)at, (__int64)value);
}
static __forceinline uint64_t nk_atomic_fetch_or_u64(uint64_t *at, uint64_t value) {
    return (uint64_t)_InterlockedOr64((__int64 volatile *)at, (__int64)value);
}
static __forceinline uint64_t nk_atomic_load_u64(uint64_t *at) { return *(uint64_t volatile *)at; }
/* If *at still holds *expected, replace it with `value` (1); else load it into *expected (0). */
static __forceinline int nk_atomic_cas_u64(uint64_t *at, uint64_t *expected, uint64_t value) {
    uint64_t seen = (uint64_t)_InterlockedCompareExchange64((__int64 volatile *)at, (__int64)value, (__int64)*expected);
    if (seen == *expected) return 1;
    *expected = seen;
    return 0;
}
static __forceinline void nk_atomic_store_u64(uint64_t *at, uint64_t value) { *(uint64_t volatile *)at = value; }
/* Set *at to `value` if it is still 0; whether this call set it. */
static __forceinline int nk_atomic_set_if_zero_i32(int *at, int value) {
    return _InterlockedCompareExchange((long volatile *)at, (long)value, 0) == 0;
}
/* Prefetch for reading into all cache levels (l1) or into L2 and beyond (l2). */
#if defined(_M_X64) || defined(_M_IX86)
#define nk_prefetch_l1(address) _mm_prefetch((char const *)(address), _MM_HINT_T0)
#define nk_prefetch_l2(address) _mm_prefetch((char const *)(address), _MM_HINT_T1)
#else
#define nk_prefetch_l1(address) ((void)(address))
#define nk_prefetch_l2(address) ((void)(address))
#endif

#else /* GCC, Clang */
#define NK_INLINE static inline __attribute__((always_inline))
#define NK_NOINLINE __attribute__((noinline))
#define NK_UNLIKELY(x) __builtin_expect(!!(x), 0)

static inline unsigned nk_ctz32(uint32_t x) { return (unsigned)__builtin_ctz(x); }      /* x != 0 */
static inline unsigned nk_ctz64(uint64_t x) { return (unsigned)__builtin_ctzll(x); }    /* x != 0 */
static inline unsigned nk_popcount32(uint32_t x) { return (unsigned)__builtin_popcount(x); }
static inline uint64_t nk_atomic_fetch_add_u64(uint64_t *at, uint64_t value) {
    return __atomic_fetch_add(at, value, __ATOMIC_RELAXED);
}
static inline uint64_t nk_atomic_fetch_or_u64(uint64_t *at, uint64_t value) {
    return __atomic_fetch_or(at, value, __ATOMIC_RELAXED);
}
static inline uint64_t nk_atomic_load_u64(uint64_t *at) { return __atomic_load_n(at, __ATOMIC_RELAXED); }
/* If *at still holds *expected, replace it with `value` (1); else load it into *expected (0). */
static inline int nk_atomic_cas_u64(uint64_t *at, uint64_t *expected, uint64_t value) {
    return __atomic_compare_exchange_n(at, expected, value, 0, __ATOMIC_RELAXED, __ATOMIC_RELAXED);
}
static inline void nk_atomic_store_u64(uint64_t *at, uint64_t value) { __atomic_store_n(at, value, __ATOMIC_RELAXED); }
/* Set *at to `value` if it is still 0; whether this call set it. */
static inline int nk_atomic_set_if_zero_i32(int *at, int value) {
    int expected = 0;
    return __atomic_compare_exchange_n(at, &expected, value, 0, __ATOMIC_RELAXED, __ATOMIC_RELAXED);
}
/* Prefetch for reading into all cache levels (l1) or into L2 and beyond (l2). */
#define nk_prefetch_l1(address) __builtin_prefetch((address), 0, 3)
#define nk_prefetch_l2(address) __builtin_prefetch((address), 0, 2)
#endif

/* Overflow-checked 64-bit arithmetic: 1 and *out on success, 0 on overflow. */
static inline int nk_u64_add(uint64_t a, uint64_t b, uint64_t *out) {
    *out = a + b;
    return *out >= a;
}
static inline int nk_u64_mul(uint64_t a, uint64_t b, uint64_t *out) {
#if defined(__GNUC__) || defined(__clang__)
    return !__builtin_mul_overflow(a, b, out);
#elif defined(_M_X64)
    uint64_t high;
    *out = _umul128(a, b, &high);
    return high == 0;
#else
    if (a && b > UINT64_MAX / a) return 0;
    *out = a * b;
    return 1;
#endif
}

#endif /* NUMKONG_COMPILER_H */
