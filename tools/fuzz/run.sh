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
for name in "${sources[@]}"; do
    "$cc" "${flags[@]/-fsanitize=fuzzer,/-fsanitize=fuzzer-no-link,}" "${x86[@]}" "${defines[@]}" \
        -c "$root/src/kernels/$name.c" -o "$out/${name##*/}.o"
done
"$cc" "${flags[@]}" "${defines[@]}" "$here/fuzz_loaders.c" "$out"/*.o -lm -lpthread -o "$out/fuzz_loaders"
# Seeds: valid buffers from the C check driver's packer would be best; an empty corpus also works.
"$out/fuzz_loaders" -max_total_time="$seconds" -rss_limit_mb=4096 -print_final_stats=1 -artifact_prefix="$corpus/" "$corpus"
