#!/usr/bin/env bash
# Cross-compile the kernels and tests/c/check_kernels.c for aarch64 and run the driver under
# qemu-user on several CPU models; every run compares neon and sve against serial.
# Usage: tests/c/run_arm.sh [build-dir]. Needs aarch64-linux-gnu-gcc and qemu-aarch64 (Debian:
# gcc-aarch64-linux-gnu qemu-user; bash tools/install_slow_tier.sh installs them).
#
# Runs ("-cpu model|driver arguments"), two at a time:
#   max,sve128=on                           SVE at 128 bits, the full driver (covers neon too)
#   max,sve=off                   quick     NEON only: sve must report "not available"
#   max,sve256=on                 quick     SVE at 256 bits
#   max                           quick     qemu's default, SVE at 512 bits (same as sve512=on)
#   max,sve-default-vector-length=256 quick SVE at 2048 bits
# qemu-user runs a process at its default vector length (512 bits) capped by the largest enabled
# one, hence sve-default-vector-length (in bytes) for 2048. Above 128 bits qemu on x86 hosts runs
# every floating-point operation after the first wide SVE one 10-20x slower (its 256-bit host
# vector code leaves AVX state dirty), so those runs use the driver's reduced "quick" case list.
# Overrides: NK_ARM_RUNS (space-separated "cpu|args" entries), NK_ARM_JOBS (parallel runs).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
out="${1:-$(mktemp -d)}"
mkdir -p "$out"
cc="${CC_AARCH64:-aarch64-linux-gnu-gcc}"

if ! command -v "$cc" >/dev/null || ! command -v qemu-aarch64 >/dev/null; then
    echo "run_arm.sh needs $cc and qemu-aarch64: run 'bash tools/install_slow_tier.sh' as root, or" \
         "apt-get install gcc-aarch64-linux-gnu qemu-user" >&2
    exit 2
fi

common=(-O2 -std=c11 -ffp-contract=off -fno-math-errno -Wall -Wextra -I"$root/src/kernels" -I"$root/src/kernels/include")
defines=(-DNK_HAVE_NEON -DNK_HAVE_SVE)
objects=()
compile() { # path under src/kernels without .c, flags...
    local name="$1"; shift
    "$cc" "${common[@]}" "$@" -c "$root/src/kernels/$name.c" -o "$out/${name##*/}.o"
    objects+=("$out/${name##*/}.o")
}
source "$here/family_flags.sh"
compile serial -fno-tree-vectorize
for family in neon sve; do
    mapfile -t flags < <(family_flags "$family")
    compile "arm/$family" "${flags[@]}"
done
for base in capabilities dispatch pack; do compile "$base" "${defines[@]}"; done
# Static, so qemu-aarch64 needs no aarch64 sysroot.
"$cc" "${common[@]}" "${defines[@]}" -static "$here/check_kernels.c" "${objects[@]}" -lm -o "$out/check_kernels"

read -r -a runs <<<"${NK_ARM_RUNS:-max,sve128=on| max,sve=off|quick max,sve256=on|quick max|quick max,sve-default-vector-length=256|quick}"
jobs="${NK_ARM_JOBS:-2}"

run_one() { # index cpu args
    local log="$out/run$1.log" rc=0 start=$SECONDS
    # shellcheck disable=SC2086 # args is a word list
    qemu-aarch64 -cpu "$2" "$out/check_kernels" $3 >"$log" 2>&1 || rc=$?
    echo "$rc" >"$log.rc"
    echo $((SECONDS - start)) >"$log.seconds"
}
cpu_of() { echo "${1%%|*}"; }
args_of() { case "$1" in *"|"*) echo "${1#*|}" ;; esac; }
pids=()
for i in "${!runs[@]}"; do
    run_one "$i" "$(cpu_of "${runs[$i]}")" "$(args_of "${runs[$i]}")" &
    pids+=($!)
    # qemu is CPU-bound: keep at most $jobs emulators running.
    while [ "$(jobs -rp | wc -l)" -ge "$jobs" ]; do sleep 0.2; done
done
wait "${pids[@]}" || true

status=0 total_passed=0 total_failed=0
for i in "${!runs[@]}"; do
    cpu="$(cpu_of "${runs[$i]}")" args="$(args_of "${runs[$i]}")" log="$out/run$i.log"
    summary="$(grep -E '^[0-9]+ passed, [0-9]+ failed$' "$log" | tail -n 1 || true)"
    echo "qemu -cpu $cpu${args:+ ($args)}: ${summary:-no summary} [$(cat "$log.seconds") s]"
    grep MISMATCH "$log" | head -n 20 || true
    expect_sve=checked
    case "$cpu" in *sve=off*) expect_sve="not available" ;; esac
    passed="${summary%% passed*}" failed="${summary#*passed, }" failed="${failed%% failed*}"
    total_passed=$((total_passed + ${passed:-0})) total_failed=$((total_failed + ${failed:-0}))
    if [ "$(cat "$log.rc")" != 0 ] || [ -z "$summary" ] || [ "${passed:-0}" -le 0 ] || [ "${failed:-1}" != 0 ] ||
        ! grep -qx 'neon: checked' "$log" || ! grep -qx "sve: $expect_sve" "$log"; then
        echo "  FAILED (exit $(cat "$log.rc"); expected neon checked, sve $expect_sve); log: $log"
        tail -n 5 "$log" | sed 's/^/  | /'
        status=1
    fi
done
echo "${total_passed} passed, ${total_failed} failed"
exit $status
