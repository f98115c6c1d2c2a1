#!/usr/bin/env bash
# Build tools/fuzz/fuzz_loaders.c with clang's libFuzzer + ASan + UBSan and fuzz for a fixed time.
# Usage: [FAMILIES="haswell icelake"] bash tools/fuzz/run.sh [seconds=60] [corpus-dir]
# (needs clang; Debian: apt-get install clang)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
seconds="${1:-60}"
corpus="${2:-$(mktemp -d)}"
mkdir -p "$corpus"
cc="$(command -v clang || command -v clang-14 || true)"
[ -n "$cc" ] || { echo "clang is needed (apt-get install clang)" >&2; exit 2; }
out="$(mktemp -d)"
flags=(-g -O1 -std=c11 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined
       -I"$root/src/kernels" -I"$root/src/kernels/include")
source "$root/tests/c/family_flags.sh"
mapfile -t x86 < <(family_flags sapphireamx; family_flags genoa) # every x86 family's flags, for every source
sources=(serial capabilities corpus dispatch pack)
defines=()
for family in ${FAMILIES:-haswell skylake icelake genoa sapphireamx}; do
    [ -f "$root/src/kernels/x86/$family.c" ] && sources+=("x86/$family") && defines+=("-DNK_HAVE_${family^^}")
done
# The family files get ASan without UBSan: clang took 111 s for x86/icelake.c with both, 28 s with
# either, and their arithmetic is checked under UBSan by the C driver's and the suite's sanitizer runs.
# Sources compile side by side.
compile() { # name under src/kernels, its -fsanitize flag
    local name="$1" sanitize="$2"
    "$cc" "${flags[@]/-fsanitize=fuzzer,address,undefined/$sanitize}" "${x86[@]}" "${defines[@]}" \
        -c "$root/src/kernels/$name.c" -o "$out/${name##*/}.o"
}
pids=()
for name in "${sources[@]}"; do
    case "$name" in
    x86/*) compile "$name" -fsanitize=fuzzer-no-link,address & ;;
    *) compile "$name" -fsanitize=fuzzer-no-link,address,undefined & ;;
    esac
    pids+=($!)
done
for pid in "${pids[@]}"; do wait "$pid"; done
"$cc" "${flags[@]}" "${defines[@]}" "$here/fuzz_loaders.c" "$out"/*.o -lm -lpthread -o "$out/fuzz_loaders"
# Seeds: valid buffers from the C check driver's packer would be best; an empty corpus also works.
"$out/fuzz_loaders" -max_total_time="$seconds" -rss_limit_mb=4096 -print_final_stats=1 -artifact_prefix="$corpus/" "$corpus"
