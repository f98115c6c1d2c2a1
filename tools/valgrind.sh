#!/usr/bin/env bash
# valgrind memcheck over a short pack / score / pickle / corpus run of the installed numkong.
# Fails when valgrind reports a definite leak or an invalid access in numkong's own code.
# Valgrind (3.19) cannot decode AVX-512, so the AVX-512 families are disabled for this run; the
# haswell family (AVX2) and the shared C code (packing, loading, corpus, dispatch) are checked.
# Usage: bash tools/valgrind.sh [python]
set -euo pipefail
python="${1:-python3}"
log="$(mktemp)"
trap 'rm -f "$log"' EXIT
NUMKONG_DISABLE=skylake,icelake,genoa,sapphireamx PYTHONMALLOC=malloc \
valgrind --tool=memcheck --leak-check=full --show-leak-kinds=definite --errors-for-leak-kinds=definite \
    --num-callers=30 --log-file="$log" "$python" - <<'PY'
import pickle
import numpy as np
import numkong as nk

rng = np.random.default_rng(0)
for dtype in ["float64", "float32", "float16", "bfloat16", "e4m3", "e5m2", "e2m3", "e3m2"]:
    queries = nk.maxsim_pack(rng.standard_normal((7, 33)), dtype=dtype)
    documents = nk.maxsim_pack(rng.standard_normal((40, 33)), dtype=dtype)
    score = nk.maxsim_packed(queries, documents)
    again = pickle.loads(pickle.dumps(documents, protocol=5))
    assert nk.maxsim_packed(queries, again) == score
    corpus = nk.maxsim_pack_corpus([rng.standard_normal((n, 33)) for n in (3, 17, 40)], dtype=dtype)
    nk.maxsim_packed_corpus(queries, corpus, threads=2, top_k=2)
    try:
        nk.maxsim_pack(np.array([[1.0, np.nan]]), dtype=dtype)
    except ValueError:
        pass
print("valgrind workload done")
PY
# Only numkong's frames matter: CPython and NumPy keep some allocations alive until exit.
if grep -E "Invalid (read|write)|uninitialised|definitely lost" -A30 "$log" | grep -q "_maxsim"; then
    grep -E "Invalid|uninitialised|definitely lost" -A30 "$log" | head -120
    echo "valgrind: errors or definite leaks in numkong" >&2
    exit 1
fi
grep -E "definitely lost|ERROR SUMMARY" "$log" || true
echo "valgrind: no definite leaks or invalid accesses in numkong"
