"""python -m numkong: show the build and CPU capabilities, then score a built-in ColBERT-shaped sample.

    python -m numkong [--families] [--json] [--version] [--help]

The sample is synthetic and deterministic: 32 query tokens and ~300 documents of 60..300 tokens at
depth 128, rows drawn from a normal distribution with a few large outlier dimensions (as transformer
embeddings have), and a few documents seeded with noisy copies of the query tokens so that the
ranking has clear winners. Every available kernel family scores every document in float32 and in
bfloat16 packing and is checked against a NumPy float64 reference computed on the same stored
values. Exits 1 if any family is off by more than 1e-12 relative (float64 accumulation rounding).
"""
import argparse
import contextlib
import json
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
# Instruction sets of each kernel family (the flags in src/kernels/family_flags.txt).
FAMILY_ISA = {
    "serial": "portable C reference",
    "haswell": "AVX2, FMA, F16C",
    "skylake": "haswell + AVX-512 F/CD/BW/DQ/VL",
    "icelake": "skylake + AVX-512 VNNI, VBMI, VBMI2, BITALG, VPOPCNTDQ",
    "genoa": "icelake + AVX512-BF16 (bfloat16 screening of raw float32 documents; packed ones as icelake)",
    "sapphire": "icelake + AVX512-FP16, AVX512-BF16 (no kernels yet)",
    "sapphireamx": "icelake + AMX-TILE, AMX-INT8",
    "neon": "Armv8.2-A Advanced SIMD with dotprod and fp16",
    "sve": "Armv8.2-A SVE (vector-length agnostic)",
    "sve2": "SVE2 (no kernels yet)",
}


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


def single_threaded_blas():
    """Limit NumPy's BLAS to one thread (threadpoolctl, when installed): small matmuls run faster so."""
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        return contextlib.nullcontext()
    return threadpool_limits(1)


def families():
    """Every kernel family: its instruction sets and whether this build, this CPU and this process have it."""
    kinds = {kind: nk.get_capabilities(kind) for kind in ("compiled", "cpu", "available")}
    return [{"family": c.name.lower(), "bit": int(c), "isa": FAMILY_ISA.get(c.name.lower(), ""),
             **{kind: bool(mask & c) for kind, mask in kinds.items()}} for c in nk.Capability]


def print_families(as_json):
    rows = families()
    if as_json:
        print(json.dumps({"numkong": nk.__version__, "families": rows}, indent=1))
        return 0
    print(f"{'family':<12} {'compiled':<9} {'this CPU':<9} {'available':<10} instruction sets")
    for row in rows:
        marks = ["yes" if row[kind] else "-" for kind in ("compiled", "cpu", "available")]
        print(f"{row['family']:<12} {marks[0]:<9} {marks[1]:<9} {marks[2]:<10} {row['isa']}")
    print("\navailable = compiled, supported by this CPU and OS, and not removed by NUMKONG_DISABLE")
    return 0


def main(as_json=False):
    """Score the sample with every available family and dtype; print a table (or, as_json, one JSON object)."""
    out = (lambda *args, **kwargs: None) if as_json else print
    report = {"numkong": nk.__version__, "tolerance": TOLERANCE, "results": [], "mismatches": []}
    out(f"numkong {nk.__version__}")
    for kind, label in (("compiled", "compiled:"), ("cpu", "this CPU:"), ("available", "available:")):
        report[kind] = [c.name.lower() for c in nk.Capability if nk.get_capabilities(kind) & c]
        out(f"  {label:<10} {', '.join(report[kind]) or 'none'}")

    queries, documents = sample()
    tokens = sum(len(d) for d in documents)
    out(f"\nSample: {QUERY_TOKENS} query tokens x {len(documents)} documents "
        f"({tokens} tokens, {min(map(len, documents))}..{max(map(len, documents))} each), depth {DEPTH}\n")
    out(f"{'family':<12} {'dtype':<9} {'total score':>18} {'us/call':>9} {'max |diff|':>11}  top-5 documents")

    active = [c for c in nk.Capability if nk.get_capabilities("available") & c]
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

        for family in active:
            packed_q = nk.maxsim_pack(stored_q, dtype=dtype_name, capabilities=family)
            packed_d = [nk.maxsim_pack(d, dtype=dtype_name, capabilities=family) for d in stored_d]
            scores = np.array([nk.maxsim_packed(packed_q, d, capabilities=family) for d in packed_d])
            seconds = best_time(lambda: [nk.maxsim_packed(packed_q, d, capabilities=family)
                                         for d in packed_d[:TIMED]])
            rows.append((family.name.lower(), scores, seconds))
            bad = np.abs(scores - expected) > TOLERANCE * np.maximum(1.0, np.abs(expected))
            if bad.any():
                worst = int(np.argmax(np.abs(scores - expected)))
                report["mismatches"].append({"family": family.name.lower(), "dtype": dtype_name,
                                             "documents": int(bad.sum()), "worst_document": worst})
                out(f"MISMATCH {family.name.lower()} {dtype_name}: {int(bad.sum())} documents differ, "
                    f"e.g. document {worst}: {scores[worst]!r} vs reference {expected[worst]!r}")

        for name, scores, seconds in rows:
            top = [int(i) for i in np.argsort(scores, kind="stable")[:5]]
            difference = float(np.abs(scores - expected).max())
            report["results"].append({"implementation": name, "dtype": dtype_name, "total_score": float(scores.sum()),
                                      "us_per_call": seconds / TIMED * 1e6, "max_abs_difference": difference,
                                      "top5": top})
            out(f"{name:<12} {dtype_name:<9} {scores.sum():>18.12f} {seconds / TIMED * 1e6:>9.2f} "
                f"{difference:>11.2e}  {', '.join(map(str, top))}")

    out("\nScore = sum over query tokens of min over document tokens of max(0, 1 - cos); lower is closer "
        f"(ColBERT similarity = {QUERY_TOKENS} - score). Top-5 lists the closest documents; "
        f"documents {', '.join(map(str, RELEVANT))} were seeded with query tokens.")
    failures = len(report["mismatches"])
    report["ok"] = not failures
    if as_json:
        print(json.dumps(report, indent=1))
    elif failures:
        out(f"FAILED: {failures} family/dtype combinations disagree with the reference beyond {TOLERANCE:g}")
    else:
        out(f"OK: every family agrees with the float64 reference within {TOLERANCE:g} relative")
    return 1 if failures else 0


def parse_arguments(argv=None):
    parser = argparse.ArgumentParser(
        prog="python -m numkong",
        description="Show this build's kernel families and score a built-in ColBERT-shaped sample with each, "
                    "checked against a float64 NumPy reference (exit status 1 on any mismatch).")
    parser.add_argument("--families", action="store_true",
                        help="list the kernel families (compiled, this CPU, available) and exit without scoring")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of tables")
    parser.add_argument("--version", action="version", version=f"numkong {nk.__version__}")
    return parser.parse_args(argv)


if __name__ == "__main__":
    arguments = parse_arguments()
    if arguments.families:
        sys.exit(print_families(arguments.json))
    with single_threaded_blas():
        status = main(arguments.json)
    sys.exit(status)
