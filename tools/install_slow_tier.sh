#!/usr/bin/env bash
# Install what the slow tier (python -m pytest tests --slow) needs, printing every command it runs:
#   Debian packages (as root): cross compilers and emulators for the Arm and Windows builds of the C
#     check driver, clang with its fuzzer runtime for tools/fuzz/run.sh;
#   into the virtual environment given (default .venv): torch and pylate, for tests/test_torch.py and
#     the comparison in tests/test_pylate.py.
# Usage: bash tools/install_slow_tier.sh [venv]   (NUMKONG_TORCH="" skips torch and pylate)
#
# pylate is installed without its dependencies, then with the ones pylate.rank and pylate.scores import:
# its full set pins torch==2.11.0 through fast-plaid (a CUDA build of several GB from PyPI) and brings
# usearch, which requires the unrelated numkong>=7.8.6 from PyPI and would replace this package.
# torch==2.13.0: this project's machines hold its CPU build; elsewhere pip may fetch a CUDA build, so
# set NUMKONG_TORCH to a requirement your index serves as a CPU build, or to "" to skip.
set -euo pipefail
venv="${1:-.venv}"
torch="${NUMKONG_TORCH-torch==2.13.0}"
debian=(gcc-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user gcc-mingw-w64-x86-64 wine64 clang libclang-rt-14-dev)
run() { echo "+ $*"; "$@"; }

missing=()
for package in "${debian[@]}"; do
    dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed" || missing+=("$package")
done
if [ "${#missing[@]}" -gt 0 ]; then
    if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
        echo "the slow tier needs these Debian packages: ${missing[*]}; install them as root (apt-get install)" >&2
        exit 1
    fi
    run apt-get update -q
    run env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}"
else
    echo "Debian packages present: ${debian[*]}"
fi

[ -x "$venv/bin/python" ] || { echo "no virtual environment at $venv: create it with the README's test command" >&2; exit 1; }
if [ -n "$torch" ]; then
    run "$venv/bin/pip" install -q "$torch"
    run "$venv/bin/pip" install -q --no-deps pylate==1.6.0
    run "$venv/bin/pip" install -q tqdm 'transformers>=4.41.0,<=5.3.0' 'datasets>=2.20.0'
    run "$venv/bin/python" -c "import numkong, pylate.rank, torch; print('numkong', numkong.__version__, 'torch', torch.__version__, 'pylate', __import__('pylate').__version__)"
fi
