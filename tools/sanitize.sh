#!/usr/bin/env bash
# Build numkong with AddressSanitizer + UndefinedBehaviorSanitizer (meson's b_sanitize option) into its
# own virtual environment and run the whole pytest suite against it.
# Usage: bash tools/sanitize.sh [pytest args...]
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
venv="${NUMKONG_SANITIZE_VENV:-$root/.venv-sanitize}"
python3 -m venv "$venv"
"$venv/bin/pip" install -q meson-python meson ninja cython numpy ml_dtypes pytest pytest-xdist hypothesis 'dask[distributed]'
# b_lundef=false: extension modules leave Python's symbols undefined, which sanitizers otherwise reject.
"$venv/bin/pip" install -q --no-build-isolation --force-reinstall --no-deps \
    -Csetup-args=-Db_sanitize=address,undefined -Csetup-args=-Db_lundef=false \
    -Csetup-args=-Dc_args=-fno-sanitize-recover=undefined "$root"
libasan="$(gcc -print-file-name=libasan.so)"
libubsan="$(gcc -print-file-name=libubsan.so)"
cd "$root"
# CPython's own allocations are not instrumented: leak checking belongs to tools/valgrind.sh.
LD_PRELOAD="$libasan $libubsan" \
ASAN_OPTIONS=detect_leaks=0:abort_on_error=1:strict_init_order=1:allocator_may_return_null=1 \
UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
NUMKONG_SANITIZED=1 \
    "$venv/bin/python" -m pytest tests -p no:cacheprovider "$@"
