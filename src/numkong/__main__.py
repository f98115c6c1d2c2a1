"""python -m numkong: show the build and CPU capabilities, then score a built-in ColBERT-shaped sample.

The sample is synthetic and deterministic: 32 query tokens and ~300 documents of 60..300 tokens at
depth 128, rows drawn from a normal distribution with a few large outlier dimensions (as transformer
embeddings have), and a few documents seeded with noisy copies of the query tokens so that the
ranking has clear winners. Every available kernel family scores every document in float32 and in
bfloat16 packing and is checked against a NumPy float64 reference computed on the same stored
values. Exits 1 if any family is off by more than 1e-12 relative (float64 accumulation rounding).
"""
import contextlib
import sys
import time

import ml_dtypes
import numpy as np

import numkong as nk

SEED = 20260101
DEPTH = 128
QUERY_TOKENS = 32
DOCUMENTS = 300
RELEVANT = (17, 123, 256)  # documents that contain noisy copies of query tokens
TOLERANCE = 1e-12  # relative, per document: float64 accumulation rounding, as the tests hold
TIMED = 50  # documents per timing pass (every document is scored and checked)
DTYPES = {"float32": np.float32, "bfloat16": ml_dtypes.bfloat16}


def sample():
    """Deterministic (queries, [documents]) in float32, shaped like ColBERT token embeddings."""
    rng = np.random.default_rng(SEED)
    outliers = rng.choice(DEPTH, size=4, replace=False)

    def tokens(count):
        rows = rng.standard_normal((count, DEPTH))
        rows[:, outliers] += rng.normal(6.0, 1.0, size=(count, outliers.size))
        return rows

    queries = tokens(QUERY_TOKENS)
    documents = []
    for index in range(DOCUMENTS):
        rows = tokens(int(rng.integers(60, 301)))
        if index in RELEVANT:
            picked = rng.choice(QUERY_TOKENS, size=QUERY_TOKENS // 2, replace=False)
            rows[: picked.size] = queries[picked] + 0.5 * rng.standard_normal((picked.size, DEPTH))
        documents.append(rows.astype(np.float32))
    return queries.astype(np.float32), documents


def reference(queries, document):
    """MaxSim in float64: sum over query rows of min over document rows of max(0, 1 - cos)."""
    def unit(x):
        norms = np.linalg.norm(x, axis=1, keepdims=True)
        return np.divide(x, norms, out=np.zeros_like(x), where=norms > 0)

    best = (unit(queries) @ unit(document).T).max(axis=1)
    return float(np.maximum(0.0, 1.0 - best).sum())


def best_time(function, repeats=3):
    """Best wall time of `function()` over a few repetitions, in seconds."""
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        function()
        best = min(best, time.perf_counter() - start)
    return best


def family_names(mask):
    """Lower-case names of the Capability bits set in `mask`."""
    return ", ".join(c.name.lower() for c in nk.Capability if mask & c) or "none"


def single_threaded_blas():
    """Limit NumPy's BLAS to one thread (threadpoolctl, when installed): small matmuls run faster so."""
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        return contextlib.nullcontext()
    return threadpool_limits(1)


def main():
    print(f"numkong {nk.__version__}")
    print(f"  compiled:  {family_names(nk.get_capabilities('compiled'))}")
    print(f"  this CPU:  {family_names(nk.get_capabilities('cpu'))}")
    print(f"  available: {family_names(nk.get_capabilities('available'))}")

    queries, documents = sample()
    tokens = sum(len(d) for d in documents)
    print(f"\nSample: {QUERY_TOKENS} query tokens x {len(documents)} documents "
          f"({tokens} tokens, {min(map(len, documents))}..{max(map(len, documents))} each), depth {DEPTH}\n")
    print(f"{'family':<12} {'dtype':<9} {'total score':>18} {'us/call':>9} {'max |diff|':>11}  top-5 documents")

    failures = 0
    families = [c for c in nk.Capability if nk.get_capabilities("available") & c]
    for dtype_name, dtype in DTYPES.items():
        # Cast once: a row already in the packing format is stored bit-exact, so the reference
        # below sees exactly the values the kernels see.
        stored_q = queries.astype(dtype)
        stored_d = [d.astype(dtype) for d in documents]
        wide_q = stored_q.astype(np.float64)
        wide_d = [d.astype(np.float64) for d in stored_d]
        expected = np.array([reference(wide_q, d) for d in wide_d])
        unit_q = wide_q / np.linalg.norm(wide_q, axis=1, keepdims=True)
        unit_d = [d / np.linalg.norm(d, axis=1, keepdims=True) for d in wide_d]
        seconds = best_time(lambda: [np.maximum(0.0, 1.0 - (unit_q @ d.T).max(axis=1)).sum()
                                     for d in unit_d[:TIMED]])
        rows = [("numpy-f64", expected, seconds)]

        for family in families:
            packed_q = nk.maxsim_pack(stored_q, dtype=dtype_name, capabilities=family)
            packed_d = [nk.maxsim_pack(d, dtype=dtype_name, capabilities=family) for d in stored_d]
            scores = np.array([nk.maxsim_packed(packed_q, d, capabilities=family) for d in packed_d])
            seconds = best_time(lambda: [nk.maxsim_packed(packed_q, d, capabilities=family)
                                         for d in packed_d[:TIMED]])
            rows.append((family.name.lower(), scores, seconds))
            bad = np.abs(scores - expected) > TOLERANCE * np.maximum(1.0, np.abs(expected))
            if bad.any():
                failures += 1
                worst = int(np.argmax(np.abs(scores - expected)))
                print(f"MISMATCH {family.name.lower()} {dtype_name}: {int(bad.sum())} documents differ, "
                      f"e.g. document {worst}: {scores[worst]!r} vs reference {expected[worst]!r}")

        for name, scores, seconds in rows:
            top = ", ".join(str(i) for i in np.argsort(scores, kind="stable")[:5])
            print(f"{name:<12} {dtype_name:<9} {scores.sum():>18.12f} {seconds / TIMED * 1e6:>9.2f} "
                  f"{np.abs(scores - expected).max():>11.2e}  {top}")

    print("\nScore = sum over query tokens of min over document tokens of max(0, 1 - cos); lower is closer "
          f"(ColBERT similarity = {QUERY_TOKENS} - score). Top-5 lists the closest documents; "
          f"documents {', '.join(map(str, RELEVANT))} were seeded with query tokens.")
    if failures:
        print(f"FAILED: {failures} family/dtype combinations disagree with the reference beyond {TOLERANCE:g}")
        return 1
    print(f"OK: every family agrees with the float64 reference within {TOLERANCE:g} relative")
    return 0


if __name__ == "__main__":
    with single_threaded_blas():
        status = main()
    sys.exit(status)
