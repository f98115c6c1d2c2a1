#!/usr/bin/env bash
# Build the kernels and tests/c/check_kernels.c with gcc and run every family this CPU has
# against serial. Usage: tests/c/run.sh [build-dir]
# Memory checking: CFLAGS="-fsanitize=address,undefined" (valgrind 3.19 cannot decode AVX-512).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
out="${1:-$(mktemp -d)}"
mkdir -p "$out"
cc="${CC:-gcc}"
# CFLAGS adds flags, e.g. CFLAGS="-fsanitize=address,undefined" for a sanitizer run.
common=(-O2 -std=c11 -ffp-contract=off -fno-math-errno -Wall -Wextra ${CFLAGS:-} -I"$root/src/kernels" -I"$root/src/kernels/include")
objects=()
defines=()
pids=()
# Sources compile side by side (a sanitizer build of one family file takes half a minute).
compile() { # path under src/kernels without .c, flags...
    local name="$1"; shift
    "$cc" "${common[@]}" "$@" -c "$root/src/kernels/$name.c" -o "$out/${name##*/}.o" &
    pids+=($!)
    objects+=("$out/${name##*/}.o")
}
compile serial -fno-tree-vectorize
case "$("$cc" -dumpmachine)" in
x86_64*)
    source "$here/family_flags.sh"
    for family in haswell skylake icelake genoa sapphireamx; do
        if [ -f "$root/src/kernels/x86/$family.c" ]; then
            mapfile -t flags < <(family_flags "$family")
            compile "x86/$family" "${flags[@]}"
            defines+=("-DNK_HAVE_${family^^}")
        fi
    done ;;
esac
for base in capabilities corpus dispatch pack; do compile "$base" "${defines[@]}"; done
# The AMX family once more with its tile instructions in C (x86/amx_emulation.h), so that its logic
# is checked on CPUs without AMX too; the driver calls it directly.
case "$("$cc" -dumpmachine)" in
x86_64*)
    mapfile -t flags < <(family_flags icelake)
    "$cc" "${common[@]}" "${flags[@]}" -DNK_AMX_EMULATE -Dnk_maxsim_sapphireamx=nk_maxsim_sapphireamx_emulated \
        -Dnk_prescreen_prepare_sapphireamx=nk_prescreen_prepare_sapphireamx_emulated \
        -Dnk_prescreen_bound_sapphireamx=nk_prescreen_bound_sapphireamx_emulated \
        -c "$root/src/kernels/x86/sapphireamx.c" -o "$out/sapphireamx_emulated.o" &
    pids+=($!)
    objects+=("$out/sapphireamx_emulated.o")
    defines+=("-DNK_AMX_EMULATE") ;;
esac
for pid in "${pids[@]}"; do wait "$pid"; done
"$cc" "${common[@]}" "${defines[@]}" "$here/check_kernels.c" "${objects[@]}" -lm -lpthread -o "$out/check_kernels"
${RUNNER:-} "$out/check_kernels" ${NK_CHECK_ARGS:-}
# The AVX-512 families' tops readout, which the scores cannot show (check_tops.c), built for the
# first of them (skylake), whose features it checks for before it runs.
case "$("$cc" -dumpmachine)" in
x86_64*)
    mapfile -t flags < <(family_flags skylake)
    "$cc" "${common[@]}" "${flags[@]}" "$here/check_tops.c" -o "$out/check_tops"
    ${RUNNER:-} "$out/check_tops" ;;
esac
