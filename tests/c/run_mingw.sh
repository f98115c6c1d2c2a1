#!/usr/bin/env bash
# Cross-compile the kernels and tests/c/check_kernels.c for Windows x86-64 with mingw-w64 and run the
# driver under wine: every family this CPU has against serial, as tests/c/run.sh does natively.
# Usage: tests/c/run_mingw.sh [build-dir]. Needs x86_64-w64-mingw32-gcc and wine64 (Debian:
# gcc-mingw-w64-x86-64 wine64; bash tools/install_slow_tier.sh installs them).
# A family whose source this compiler cannot build is left out with its first error printed, as
# meson's compile probes leave it out of a Windows build; NK_MINGW_REQUIRE="haswell skylake" makes
# those families mandatory (the test suite requires every family but the ones it names as known).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
out="${1:-$(mktemp -d)}"
mkdir -p "$out"
cc="${CC_MINGW:-x86_64-w64-mingw32-gcc}"
wine="$(command -v wine64 || command -v /usr/lib/wine/wine64 || command -v wine || true)"
if ! command -v "$cc" >/dev/null || [ -z "$wine" ]; then
    echo "run_mingw.sh needs $cc and wine64: run 'bash tools/install_slow_tier.sh' as root, or" \
         "apt-get install gcc-mingw-w64-x86-64 wine64" >&2
    exit 2
fi
echo "compiler: $("$cc" --version | head -n 1); wine: $("$wine" --version 2>/dev/null || echo "?")"

common=(-O2 -std=c11 -ffp-contract=off -fno-math-errno -Wall -Wextra -I"$root/src/kernels" -I"$root/src/kernels/include")
objects=() defines=() built=()
compile() { # name flags...
    local name="$1"; shift
    "$cc" "${common[@]}" "$@" -c "$root/src/kernels/$name.c" -o "$out/$name.o"
    objects+=("$out/$name.o")
}
source "$here/family_flags.sh"
compile serial -fno-tree-vectorize
for family in haswell skylake icelake genoa sapphireamx; do
    mapfile -t flags < <(family_flags "$family")
    if "$cc" "${common[@]}" "${flags[@]}" -c "$root/src/kernels/x86/$family.c" -o "$out/$family.o" 2>"$out/$family.err"; then
        objects+=("$out/$family.o") defines+=("-DNK_HAVE_${family^^}") built+=("$family")
    else
        echo "$family: does not compile with $cc, left out; first errors:"
        grep -m 3 -E 'error|Error' "$out/$family.err" | sed 's/^/  | /'
    fi
done
for family in ${NK_MINGW_REQUIRE:-}; do
    [[ " ${built[*]} " == *" $family "* ]] || { echo "FAILED: $family is required (NK_MINGW_REQUIRE)"; exit 1; }
done
for base in capabilities corpus dispatch pack; do compile "$base" "${defines[@]}"; done
# Static, so wine needs no mingw runtime DLLs (libwinpthread for corpus.c's threads).
"$cc" "${common[@]}" "${defines[@]}" -include "$here/mingw_compat.h" "$here/check_kernels.c" "${objects[@]}" \
    -static -lm -lpthread -o "$out/check_kernels.exe"
echo "built families: serial ${built[*]}"
# A fresh wine prefix in the build directory: nothing is written to the user's ~/.wine.
WINEPREFIX="$out/wineprefix" WINEDEBUG=-all "$wine" "$out/check_kernels.exe" ${NK_MINGW_ARGS:-} | tr -d '\r'
