/* C-level check of the AVX-512 families' tops readout (nk_x512_read_tops, x86/avx512_shared.h)
 * against one row at a time in scalar code: the largest of a row's 16 tagged per-lane maxima, the
 * first lane holding it and the tile in its tag, or -1 when that names no document of the block.
 * The scores cannot show a wrong readout (a row without a top is scanned whole), so it is checked
 * here. Built with skylake's flags by tests/c/run.sh; exit code 0 when all agree. */
#include <stdio.h>
#include <string.h>

#include "x86/avx512_shared.h"

static uint64_t state = 0x2545F4914F6CDD1Dull;
static uint32_t next32(void) {
    state ^= state << 13, state ^= state >> 7, state ^= state << 17;
    return (uint32_t)(state >> 32);
}

/* The readout of one row, lane by lane. */
static int32_t reference(float const *lanes, uint64_t docs) {
    float largest = lanes[0];
    for (int l = 1; l < 16; ++l)
        if (lanes[l] > largest) largest = lanes[l];
    int lane = 0;
    while (lane < 16 && lanes[lane] != largest) ++lane;
    uint32_t bits;
    memcpy(&bits, &largest, sizeof bits);
    uint64_t doc = 16u * (bits & NK_X512_TAG_BITS) + (uint64_t)lane;
    return lane < 16 && doc < docs ? (int32_t)doc : -1;
}

int main(void) {
    if (!__builtin_cpu_supports("avx512f") || !__builtin_cpu_supports("avx512cd") ||
        !__builtin_cpu_supports("avx512bw") || !__builtin_cpu_supports("avx512dq") ||
        !__builtin_cpu_supports("avx512vl")) {
        printf("tops readout: not available\n");
        return 0;
    }
    static _Alignas(64) float tops[32][16];
    int failures = 0, checks = 0;
    for (int trial = 0; trial < 20000; ++trial) {
        uint64_t rows = 1 + next32() % 32, docs = 1 + next32() % 1024;
        int kind = trial % 4; /* 0: distinct values, 1: ties, 2: absent lanes (-inf), 3: every lane absent */
        for (uint64_t r = 0; r < rows; ++r)
            for (int l = 0; l < 16; ++l) {
                float value = kind == 1 ? (float)(next32() % 4) - 1.5f : (float)(int32_t)next32() * 0x1p-20f;
                if (kind == 3 || (kind == 2 && next32() % 3 == 0)) value = -INFINITY;
                else value = _mm512_cvtss_f32(nk_x512_tag(_mm512_set1_ps(value), next32() % 64));
                tops[r][l] = value;
            }
        int32_t top[32];
        nk_x512_read_tops(tops, rows, docs, top);
        for (uint64_t r = 0; r < rows; ++r, ++checks) {
            int32_t expected = reference(tops[r], docs);
            if (top[r] != expected && failures++ < 10)
                printf("tops readout: trial %d row %llu of %llu, %llu documents: %d, expected %d\n", trial,
                       (unsigned long long)r, (unsigned long long)rows, (unsigned long long)docs, top[r], expected);
        }
    }
    /* NaN (a section changed after validation): any document of the block, or none. */
    for (int l = 0; l < 16; ++l) tops[0][l] = l == 5 ? NAN : (float)l;
    int32_t top[1];
    nk_x512_read_tops(tops, 1, 100, top);
    if (top[0] < -1 || top[0] >= 100) ++failures, printf("tops readout: NaN row gave %d\n", top[0]);
    printf("tops readout: %d rows checked, %d failed\n", checks + 1, failures);
    return failures != 0;
}
