#!/usr/bin/env python3
"""Benchmark numkong's MaxSim against NumPy, torch, maxsim-cpu and (optionally) another numkong build.

Pairs (one query vs one document) run on one thread pinned to one CPU, the float formats against the
baselines and then the integer formats (int8, int4, uint1) against bfloat16, beside the core's peaks
measured by tools/peaks.c (built with the system C compiler); batched reranking (one query
vs a 1,000-document corpus) then runs in a fresh, unpinned process on 1 and on all cores, against
maxsim-cpu's maxsim_scores_variable (which uses all cores).

    python tools/bench.py [--quick] [--json PATH] [--families] [--anchor-python PATH/TO/python]
                          [--cpu-class icelake] [--datasets N] [--pylate-only]
    python tools/bench.py --markdown RUN.json [RUN.json ...]

Pairs run on one thread pinned to one CPU. For numkong the timed call is maxsim_packed() on
pre-packed operands (what a reranker does per query and document); NumPy is matmul + max + sum on
pre-normalized float32 rows; torch the same in its dtype; maxsim-cpu its maxsim_scores(), only at
32 query rows of depth 128 (the ColBERT shape: other query counts and depths gave garbage scores).

--anchor-python runs this same file as a worker (`--worker`) under another interpreter whose
`numkong` is timed as a black box through the same public names (maxsim_pack / maxsim_packed);
rounds alternate between ours and the anchor and the best of each is kept. A dtype the anchor does
not handle shows as n/a. Each round of a shape times every dtype and implementation once, so that
ratios between dtypes (fp8 / fp6 against bfloat16) and against the anchor come from the same rounds
rather than from moments seconds apart on a shared host.

--datasets N (default 4) times each case on N random normal data sets of the shape (seeds
[Q, D, depth] and [Q, D, depth, k] for k = 1 .. N - 1) and reports the mean of their times per call,
each set timed on its own (for a 1/N share of the target) so that its operands stay in cache as with
one set. How many candidates the screening leaves depends on the data, so one data set can favour
one format or implementation by a few percent that another set reverses.

--cpu-class icelake (or skylake, haswell) limits both numkong builds to the kernel families such a
CPU has (both packages name them the same way), e.g. to measure on an AMX machine what a CPU with
AVX-512 VNNI but no AVX512-BF16/FP16 or AMX would see. Ours goes through NUMKONG_DISABLE (so the
corpus run is limited too), the anchor through its disable_capability().

PyLate reranking (in the same fresh process, when pylate is importable): one 32-token query reranking
1,000 documents of 180 tokens (unit-normalized float32 torch tensors, depth 128) on 2 threads, timing
pylate.rank.rerank against numkong.pylate.rerank from the same tensors (packing included) and against
numkong.pylate.rerank of documents packed ahead with numkong.pylate.pack_documents; the ratios are
PyLate's time over ours. --pylate-only runs just that part.

Accuracy is |score - reference| / reference, the reference being float64 MaxSim on the values as
stored in the packing dtype (operands are handed over already in that dtype, so nothing is rounded
twice); with several data sets, the largest over them. Ratios are time / time of ours: above 1
means slower than ours. `t/ours` divides the best times; `paired` is the median over rounds of the
same division within each round (also in the JSON, with every round's time), which a host whose
speed drifts between rounds disturbs less.

--markdown prints the README's Performance tables from the --json files of earlier runs of one CPU
class: each time is the median over the runs of its best time, each ratio range spans the runs.
"""
import os

for _variable in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "VECLIB_MAXIMUM_THREADS",
                  "NUMEXPR_NUM_THREADS"):
    os.environ[_variable] = "1"

import argparse  # noqa: E402
import contextlib  # noqa: E402
import json  # noqa: E402
import shutil  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402

CPU_CLASSES = ["serial", "haswell", "skylake", "icelake", "genoa"]  # x86 families, each a superset of the last
CLASS_NAMES = {None: "all families", "haswell": "Haswell class", "skylake": "Skylake class",
               "icelake": "Ice Lake class", "genoa": "Genoa class"}  # --markdown's labels
SHAPES = [(32, 180, 128), (32, 1024, 128), (1024, 1024, 128), (32, 512, 768)]  # queries, documents, depth
DTYPES = ["float32", "bfloat16", "float16", "e4m3", "e5m2", "e2m3", "e3m2"]


def per_call_seconds(function, target):
    """Mean seconds per call of `function()` over a run of calls lasting at least `target` seconds."""
    function()
    calls = 1
    while True:
        start = time.perf_counter()
        for _ in range(calls):
            function()
        elapsed = time.perf_counter() - start
        if elapsed >= target:
            return elapsed / calls
        calls = max(2 * calls, int(calls * 1.2 * target / max(elapsed, 1e-9)))


def mean_seconds(functions, target):
    """Mean over `functions` of their seconds per call, each timed on its own for target / len(functions)."""
    return sum(per_call_seconds(function, target / len(functions)) for function in functions) / len(functions)


def paired_ratio(seconds, baseline):
    """Median over rounds of seconds[r] / baseline[r]: each round's two timings are seconds apart at most,
    so a host that speeds up or slows down between rounds moves both alike."""
    return float(np.median(np.asarray(seconds) / np.asarray(baseline)))


# ---- the worker: runs under the anchor's interpreter, needs only numpy and that numkong ----

def _anchor_cast(nk, matrix, dtype):
    """The float32 `matrix` (exactly representable in `dtype`) in a form the anchor packs as `dtype`."""
    if dtype == "float32":
        return matrix
    if dtype == "float16":
        return matrix.astype(np.float16)
    if hasattr(nk, "astype"):
        return nk.astype(matrix, dtype)
    import ml_dtypes  # builds before numkong.astype take ml_dtypes arrays

    names = {"bfloat16": "bfloat16", "e4m3": "float8_e4m3fn", "e5m2": "float8_e5m2", "e2m3": "float6_e2m3fn",
             "e3m2": "float6_e3m2fn"}
    return matrix.astype(getattr(ml_dtypes, names[dtype]))


def worker():
    """Answer JSON requests, one a line on stdin, with one JSON line each on stdout."""
    # --cpu-class names families an older build of this package may not have (it refuses to import
    # then): import with none switched off, then switch off the ones it knows.
    disabled = os.environ.pop("NUMKONG_DISABLE", "")
    import numkong as nk
    if disabled and hasattr(nk, "_disable_capabilities"):
        known = {member.name.lower() for member in nk.Capability}
        nk._disable_capabilities(",".join(name for name in disabled.split(",") if name in known))

    packed = {}  # dtype -> the packed operands
    for line in sys.stdin:
        request = json.loads(line)
        try:
            if request["op"] == "keep":  # switch off every family not named
                if hasattr(nk, "disable_capability"):  # numkong 7.x; this package reads NUMKONG_DISABLE
                    for name, enabled in dict(nk.get_capabilities()).items():
                        if enabled and name not in request["families"]:
                            nk.disable_capability(name)
                reply = {}
            elif request["op"] == "info":
                capabilities = nk.get_capabilities() if hasattr(nk, "get_capabilities") else {}
                if isinstance(capabilities, dict):  # numkong 7.x: {name: enabled}
                    names = sorted(k for k, v in capabilities.items() if v)
                else:  # this package: a Capability mask
                    names = [c.name.lower() for c in type(capabilities) if c & capabilities]
                reply = {"version": getattr(nk, "__version__", "?"), "capabilities": names}
            elif request["op"] == "pack":
                operands = [nk.maxsim_pack(_anchor_cast(nk, np.load(request[key]), request["dtype"]),
                                           dtype=request["dtype"]) for key in ("queries", "documents")]
                packed[request["key"]] = operands
                reply = {"score": float(nk.maxsim_packed(*operands)), "nbytes": [p.nbytes for p in operands]}
            elif request["op"] == "time":
                functions = [lambda p=packed[key]: nk.maxsim_packed(*p) for key in request["keys"]]
                reply = {"seconds": mean_seconds(functions, request["target"])}
            else:
                reply = {"error": f"unknown op {request['op']!r}"}
        except Exception as error:  # reported as n/a by the caller
            reply = {"error": f"{type(error).__name__}: {error}"}
        print(json.dumps(reply), flush=True)


class Anchor:
    """A worker process under another interpreter; data goes through .npy files in a temp directory."""

    def __init__(self, python, families=None):
        self.folder = tempfile.TemporaryDirectory(prefix="nk_bench_")
        self.process = subprocess.Popen([python, os.path.abspath(__file__), "--worker"], stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, text=True, cwd=self.folder.name)
        if families:
            reply = self.ask(op="keep", families=families)
            if "error" in reply:
                raise RuntimeError(f"the anchor cannot be limited to {families}: {reply['error']}")
        self.info = self.ask(op="info")

    def ask(self, **request):
        self.process.stdin.write(json.dumps(request) + "\n")
        self.process.stdin.flush()
        line = self.process.stdout.readline()
        if not line:
            raise RuntimeError("the anchor worker exited")
        return json.loads(line)

    def pack(self, queries, documents, dtype, key=None):
        """Pack both operands (float32 arrays exact in `dtype`) in the worker, kept under `key` (default
        the dtype) for op="time"; returns its reply."""
        paths = {}
        for name, matrix in (("queries", queries), ("documents", documents)):
            paths[name] = os.path.join(self.folder.name, name + ".npy")
            np.save(paths[name], np.ascontiguousarray(matrix, dtype=np.float32))
        return self.ask(op="pack", dtype=dtype, key=key or dtype, **paths)

    def close(self):
        self.process.stdin.close()
        self.process.wait(timeout=30)
        self.folder.cleanup()


# ---- the parent: ours, baselines, table ----

def stored(matrix, dtype):
    """`matrix` rounded to `dtype` (an ml_dtypes / NumPy array). For the narrow formats each row is first
    scaled by a power of two to sit just under the format's maximum, as a quantizing user would."""
    import ml_dtypes

    target = np.dtype({"float32": np.float32, "float16": np.float16, "bfloat16": ml_dtypes.bfloat16,
                       "e4m3": ml_dtypes.float8_e4m3fn, "e5m2": ml_dtypes.float8_e5m2,
                       "e2m3": ml_dtypes.float6_e2m3fn, "e3m2": ml_dtypes.float6_e3m2fn}[dtype])
    if target.itemsize == 1:
        largest = float(ml_dtypes.finfo(target).max)
        exponents = np.floor(np.log2(largest / np.abs(matrix).max(axis=1, keepdims=True)))
        matrix = matrix * np.exp2(exponents)
    return matrix.astype(target)


def unit_rows(matrix):
    return matrix / np.linalg.norm(matrix, axis=1, keepdims=True)


def reference(queries, documents):
    """Float64 MaxSim: sum over query rows of min over document rows of max(0, 1 - cos)."""
    best = (unit_rows(queries.astype(np.float64)) @ unit_rows(documents.astype(np.float64)).T).max(axis=1)
    return float(np.maximum(0.0, 1.0 - best).sum())


def baselines(queries, documents, dtype):
    """{name: score function} for the other libraries that handle `dtype` (operands prepared up front)."""
    found = {}
    unit_q, unit_d = unit_rows(queries.astype(np.float32)), unit_rows(documents.astype(np.float32))
    if dtype == "float32":
        found["numpy"] = lambda: float(np.maximum(0.0, 1.0 - (unit_q @ unit_d.T).max(axis=1)).sum())
    if dtype == "float32" and unit_q.shape == (32, 128):  # maxsim-cpu returns garbage for other shapes
        with contextlib.suppress(ImportError):
            import maxsim_cpu
            batch = unit_d[None]
            found["maxsim-cpu"] = lambda: len(unit_q) - float(maxsim_cpu.maxsim_scores(unit_q, batch)[0])
    if dtype in ("float32", "bfloat16", "float16"):
        with contextlib.suppress(ImportError):
            import torch
            torch.set_num_threads(1)
            tq = torch.from_numpy(unit_q).to(getattr(torch, dtype))
            td = torch.from_numpy(unit_d).to(getattr(torch, dtype))
            found["torch"] = lambda: float((1 - (tq @ td.T).amax(dim=1).float()).clamp_min(0).sum())
    return found


def family_names(mask):
    import numkong as nk
    return ",".join(c.name.lower() for c in nk.Capability if mask & c)


def packed_sizes(anchor, rows=1024):
    """Packed bytes per row over raw bytes per row, for each dtype at depth 128 and 768."""
    import numkong as nk
    results = []
    print(f"\nPacked bytes per row ({rows} rows; raw = depth x the format's bits / 8)")
    print(f"{'dtype':<9} {'depth':>5} {'raw B':>7} {'ours B':>9} {'ratio':>6} {'anchor B':>9} {'ratio':>6}")
    for dtype in DTYPES + INTEGER_DTYPES:
        for depth in (128, 768):
            bits = {"int8": 8, "int4": 4, "uint1": 1}.get(dtype)
            raw = depth * bits // 8 if bits else depth * stored(np.ones((1, 1)), dtype).itemsize
            ours = nk.MaxSimPackedMatrix.pack_size(rows, depth, dtype=dtype) / rows
            theirs = None
            if anchor and not bits:
                matrix = stored(np.random.default_rng(0).standard_normal((rows, depth)), dtype).astype(np.float32)
                reply = anchor.pack(matrix, matrix, dtype)
                theirs = reply["nbytes"][0] / rows if "nbytes" in reply else None
            anchor_text = f"{theirs:>9.1f} {theirs / raw:>6.2f}" if theirs else f"{'n/a':>9} {'':>6}"
            print(f"{dtype:<9} {depth:>5} {raw:>7} {ours:>9.1f} {ours / raw:>6.2f} {anchor_text}")
            results.append({"dtype": dtype, "depth": depth, "raw": raw, "ours": ours, "anchor": theirs})
    return results


def case_functions(queries, documents, dtype, families):
    """{impl: score function} of this package (each family too, with `families`) and the baselines."""
    import numkong as nk
    packed = [nk.maxsim_pack(m, dtype=dtype) for m in (queries, documents)]
    functions = {"numkong": lambda: nk.maxsim_packed(*packed)}
    for family in families:
        operands = [nk.maxsim_pack(m, dtype=dtype, capabilities=family) for m in (queries, documents)]
        functions[f"numkong[{family.name.lower()}]"] = (
            lambda p=operands, f=family: nk.maxsim_packed(*p, capabilities=f))
    functions.update(baselines(queries, documents, dtype))
    return functions


def implementations(data_sets, dtype, families, anchor):
    """{impl: (scores, timer)} for one case over its (queries, documents) data sets: one score per set,
    timer(target) giving the mean over the sets of seconds per call; (None, why) when n/a."""
    per_set = [case_functions(queries, documents, dtype, families) for queries, documents in data_sets]
    impls = {}
    for name in per_set[0]:
        functions = [case[name] for case in per_set]
        impls[name] = ([f() for f in functions], lambda target, fs=functions: mean_seconds(fs, target))
    if anchor:
        keys = [f"{dtype}#{k}" for k in range(len(data_sets))]
        replies = [anchor.pack(*(m.astype(np.float32) for m in data_set), dtype, key)
                   for data_set, key in zip(data_sets, keys)]
        failed = [reply["error"] for reply in replies if "score" not in reply]
        timer = lambda target: anchor.ask(op="time", keys=keys, target=target)["seconds"]  # noqa: E731
        impls[f"numkong {anchor.info['version']}"] = (None, failed[0]) if failed else (
            [reply["score"] for reply in replies], timer)
    return impls


CORPUS_CASES = {"1000 docs x 180": lambda rng: np.full(1000, 180),
                "1000 docs x 50..800": lambda rng: rng.integers(50, 801, 1000)}


CALL_SHAPES = [(1, 1, 1), (1, 1, 128)]  # what a call costs beyond its work


def call_costs(rounds, target, anchor):
    """Best microseconds per call of the CALL_SHAPES pairs, ours and the anchor's (float formats), interleaved;
    paired_ratio is the anchor's time over ours."""
    records = []
    print(f"\nA call's fixed cost (us; {anchor.info['version'] if anchor else 'no anchor'} time / ours, paired)")
    for shape in CALL_SHAPES:
        count_q, count_d, depth = shape
        rng = np.random.default_rng(list(shape))
        raw = (rng.standard_normal((count_q, depth), dtype=np.float32),
               rng.standard_normal((count_d, depth), dtype=np.float32))
        for dtype in ("float32", "bfloat16", "float16"):
            impls = implementations([tuple(stored(m, dtype) for m in raw)], dtype, [], anchor)
            names = [name for name in impls if name.startswith("numkong") and impls[name][0] is not None]
            times = {name: [] for name in names}
            for _ in range(rounds):
                for name in names:
                    times[name].append(impls[name][1](target))
            cells = []
            for name in names:
                record = {"shape": list(shape), "dtype": dtype, "impl": name, "us": min(times[name]) * 1e6,
                          "paired_ratio": paired_ratio(times[name], times["numkong"])}
                records.append(record)
                cells.append(f"{name} {record['us']:.3f}" + (f" ({record['paired_ratio']:.2f})" if name != "numkong"
                                                                else ""))
            print(f"{'x'.join(map(str, shape)):<9} {dtype:<9} {', '.join(cells)}")
    return records


INTEGER_DTYPES = ["int8", "int4", "uint1"]


def instruction_peaks():
    """{instruction: G ops/s or 'n/a ...'} from tools/peaks.c, built with the system C compiler; {} without one."""
    compiler = next((c for c in (os.environ.get("CC"), "cc", "gcc", "clang") if c and shutil.which(c)), None)
    source = os.path.join(os.path.dirname(os.path.abspath(__file__)), "peaks.c")
    if compiler is None:
        return {}
    with tempfile.TemporaryDirectory() as scratch:
        binary = os.path.join(scratch, "peaks")
        build = subprocess.run([compiler, "-O3", "-mavx512f", "-mavx512vnni", "-mamx-tile", "-mamx-int8", source,
                                "-o", binary], capture_output=True, text=True)
        if build.returncode != 0:
            return {"all": f"n/a (tools/peaks.c does not build here: {build.stderr.strip()[:80]})"}
        run = subprocess.run([binary], capture_output=True, text=True)
    peaks = {}
    for line in run.stdout.splitlines():
        name, _, value = line.partition(" ")
        peaks[name] = float(value) if value.replace(".", "").isdigit() else value
    return peaks


def peak_label(name, value):
    """One tools/peaks.c figure with its unit: G ops/s, or ns for the AMX unit's wake-up (`*_ns`)."""
    if not isinstance(value, float):
        return f"{name} {value}"
    return f"{name} {value:.0f} {'ns' if name.endswith('_ns') else 'G/s'}"


def dequantized(matrix, dtype):
    """The float64 values a packing in `dtype` stands for (integer formats: scale x q, or +-1)."""
    import numkong as nk
    return nk.maxsim_pack_corpus([matrix], dtype=dtype).document(0).astype(np.float64)


def integer_cases(rounds, target, datasets):
    """int8 / int4 / uint1 against bfloat16 on the pair shapes (one pinned thread), with the instruction
    peaks, and scoring a 1,000-document corpus (one thread)."""
    import numkong as nk
    peaks = instruction_peaks()
    peak_text = ", ".join(peak_label(name, value) for name, value in peaks.items()) or "n/a (no C compiler)"
    print(f"\nInteger formats, exact (no rescoring), one thread; GSO/s = 2 x Q x D x depth / time, beside this "
          f"core's measured peaks (tools/peaks.c): {peak_text}")
    print(f"{'shape QxDxdepth':<16} {'dtype':<9} {'us':>11} {'GSO/s':>8} {'t/bf16':>7} {'paired':>7} {'rel err':>9}")
    records = {"peaks": peaks, "pairs": [], "corpus": []}
    names = ["bfloat16"] + INTEGER_DTYPES
    for shape in SHAPES:
        count_q, count_d, depth = shape
        label = "x".join(map(str, shape))
        operands, expected = {name: [] for name in names}, {name: [] for name in names}
        for k in range(datasets):
            rng = np.random.default_rng(list(shape) + [100 + k])
            raw_q = rng.standard_normal((count_q, depth), dtype=np.float32)
            raw_d = rng.standard_normal((count_d, depth), dtype=np.float32)
            for name in names:
                operands[name].append((nk.maxsim_pack(raw_q, name), nk.maxsim_pack(raw_d, name)))
                expected[name].append(reference(dequantized(raw_q, name), dequantized(raw_d, name)))
        timers = {name: (lambda pairs=operands[name]: [nk.maxsim_packed(*pair) for pair in pairs]) for name in names}
        times = {name: [] for name in names}
        for _ in range(rounds):
            for name in names:
                times[name].append(per_call_seconds(timers[name], target) / datasets)
        for name in names:
            seconds = min(times[name])
            error = max(abs(nk.maxsim_packed(*pair) - want) / want for pair, want in zip(operands[name], expected[name]))
            record = {"shape": list(shape), "dtype": name, "us": seconds * 1e6,
                      "gsops": 2 * count_q * count_d * depth / seconds / 1e9, "ratio": seconds / min(times["bfloat16"]),
                      "paired_ratio": paired_ratio(times[name], times["bfloat16"]), "rel_error": error}
            records["pairs"].append(record)
            print(f"{label:<16} {name:<9} {record['us']:>11.2f} {record['gsops']:>8.1f} {record['ratio']:>7.2f} "
                  f"{record['paired_ratio']:>7.2f} {error:>9.1e}")
    rng = np.random.default_rng(7)
    query = rng.standard_normal((32, 128), dtype=np.float32)
    documents = [rng.standard_normal((180, 128), dtype=np.float32) for _ in range(1000)]
    print("\nOne 32 x 128 query vs 1,000 documents x 180 tokens, one thread")
    print(f"{'dtype':<9} {'ms':>9} {'t/bf16':>7} {'B/token':>8}")
    corpus_times = {}
    for name in names:
        corpus, packed = nk.maxsim_pack_corpus(documents, dtype=name), nk.maxsim_pack(query, name)
        corpus_times[name] = min(per_call_seconds(lambda: nk.maxsim_packed_corpus(packed, corpus, threads=1),
                                                  max(target, 0.05)) for _ in range(rounds))
        record = {"dtype": name, "ms": corpus_times[name] * 1e3,
                  "ratio": corpus_times[name] / corpus_times["bfloat16"], "bytes_per_token": corpus.nbytes / 180000}
        records["corpus"].append(record)
        print(f"{name:<9} {record['ms']:>9.2f} {record['ratio']:>7.2f} {record['bytes_per_token']:>8.1f}")
    return records


def corpus_cases(rounds, target):
    """One 32 x 128 float32 query against 1,000 documents: numkong on 1 and all threads vs maxsim-cpu."""
    import numkong as nk
    threads = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    print(f"\nBatched reranking: one 32 x 128 float32 query vs a corpus ({threads} threads available)")
    print(f"{'corpus':<20} {'impl':<22} {'ms':>9} {'t/ours':>7} {'max rel err':>11}")
    records = []
    for label, lengths_of in CORPUS_CASES.items():
        rng = np.random.default_rng(7)
        query = unit_rows(rng.standard_normal((32, 128), dtype=np.float32))
        documents = [unit_rows(rng.standard_normal((int(n), 128), dtype=np.float32)) for n in lengths_of(rng)]
        packed_query, corpus = nk.maxsim_pack(query), nk.maxsim_pack_corpus(documents)
        expected = np.array([reference(query, document) for document in documents])
        functions = {f"numkong threads={count}": (lambda count=count: nk.maxsim_packed_corpus(
            packed_query, corpus, threads=count)) for count in sorted({1, threads})}
        with contextlib.suppress(ImportError):
            import maxsim_cpu
            functions["maxsim-cpu (all cores)"] = lambda: len(query) - np.asarray(
                maxsim_cpu.maxsim_scores_variable(query, documents), dtype=np.float64)
        best = {name: float("inf") for name in functions}
        for _ in range(rounds):
            for name, function in functions.items():
                best[name] = min(best[name], per_call_seconds(function, max(target, 0.05)))
        ours = best[f"numkong threads={threads}"]
        for name, function in functions.items():
            error = float(np.max(np.abs(function() - expected) / expected))
            print(f"{label:<20} {name:<22} {best[name] * 1e3:>9.2f} {best[name] / ours:>7.2f} {error:>11.1e}")
            records.append({"corpus": label, "impl": name, "ms": best[name] * 1e3, "ratio": best[name] / ours,
                            "max_rel_error": error})
    return records


PYLATE_CASE = {"query_tokens": 32, "documents": 1000, "tokens": 180, "depth": 128, "threads": 2}


def pylate_cases(rounds, target):
    """pylate.rank.rerank against numkong.pylate.rerank on PYLATE_CASE; [] when pylate is not importable."""
    case = PYLATE_CASE
    try:
        import torch
        from pylate import rank
    except ImportError as error:
        print(f"\nPyLate reranking: n/a ({error}; bash tools/install_slow_tier.sh installs pylate)")
        return []
    from numkong import pylate as nkp
    threads = case["threads"]
    torch.set_num_threads(threads)
    rng = np.random.default_rng(11)
    query = torch.from_numpy(unit_rows(rng.standard_normal((case["query_tokens"], case["depth"]), dtype=np.float32)))
    documents = [torch.from_numpy(unit_rows(rng.standard_normal((case["tokens"], case["depth"]), dtype=np.float32)))
                 for _ in range(case["documents"])]
    ids = [list(range(case["documents"]))]
    packed = nkp.pack_documents(documents)
    functions = {
        "pylate.rank.rerank": lambda: rank.rerank(ids, [query], [documents]),
        "numkong.pylate.rerank": lambda: nkp.rerank(ids, [query], [documents], threads=threads),
        "numkong.pylate, packed ahead": lambda: nkp.rerank(ids, [query], [packed], threads=threads),
    }
    print(f"\nPyLate reranking: one {case['query_tokens']}-token query, {case['documents']} documents x "
          f"{case['tokens']} tokens, depth {case['depth']}, float32, {threads} threads")
    # PyLate's float32 scores tie or swap documents whose exact scores differ by less than its rounding:
    # the rankings agree when PyLate's scores, read in our order, never rise by more than that.
    tolerance = case["query_tokens"] * (case["depth"] + case["query_tokens"]) * 2.0 ** -24
    print(f"{'impl':<30} {'ms':>9} {'pylate/this':>11} {'same ranking':>12} {'max |score diff|':>16}")
    best = {name: float("inf") for name in functions}
    for _ in range(rounds):
        for name, function in functions.items():
            best[name] = min(best[name], per_call_seconds(function, max(target, 0.05)))
    theirs = functions["pylate.rank.rerank"]()[0]
    records = []
    for name, function in functions.items():
        results = function()[0]
        their_scores = {r["id"]: r["score"] for r in theirs}
        in_our_order = np.array([their_scores[r["id"]] for r in results])
        same = bool(np.all(np.diff(in_our_order) <= tolerance))
        difference = max(abs(r["score"] - their_scores[r["id"]]) for r in results)
        ratio = best["pylate.rank.rerank"] / best[name]
        print(f"{name:<30} {best[name] * 1e3:>9.2f} {ratio:>11.2f} {str(same):>12} {difference:>16.1e}")
        records.append({"impl": name, "ms": best[name] * 1e3, "pylate_ratio": ratio, "same_ranking": same,
                        "max_score_difference": difference, **case})
    return records


def run(args):
    """Pin, print the families, time every case with interleaved rounds, print and save the table."""
    import numkong as nk

    allowed = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None
    if allowed:
        cpu = args.cpu if args.cpu is not None else min(allowed)
        os.sched_setaffinity(0, {cpu})  # the anchor worker, started later, inherits it
        print(f"pinned to CPU {cpu}")
    limits = contextlib.nullcontext()
    with contextlib.suppress(ImportError):
        from threadpoolctl import threadpool_limits
        limits = threadpool_limits(1)

    meta = {kind: family_names(nk.get_capabilities(kind)) for kind in ("compiled", "cpu", "available")}
    meta["numkong"] = nk.__version__
    print(f"numkong {nk.__version__}: compiled {meta['compiled']}; CPU {meta['cpu']}; active {meta['available']}")
    meta["cpu_class"] = args.cpu_class
    meta["datasets"] = args.datasets
    anchor = Anchor(args.anchor_python, args.kept_families) if args.anchor_python else None
    if anchor:
        meta["anchor"] = anchor.info
        print(f"anchor numkong {anchor.info['version']}: {', '.join(anchor.info['capabilities'])}")
    rounds, target = (2, 0.003) if args.quick else (args.rounds, args.target)
    families = [c for c in nk.Capability if nk.get_capabilities("available") & c] if args.families else []

    records = []
    print(f"\n{'shape QxDxdepth':<16} {'dtype':<9} {'impl':<18} {'us':>11} {'GSO/s':>8} {'t/ours':>7} {'paired':>7} "
          f"{'rel err':>9}")
    with limits:
        for shape in SHAPES:
            count_q, count_d, depth = shape
            raw_sets = []
            for k in range(args.datasets):
                rng = np.random.default_rng(list(shape) + ([k] if k else []))
                raw_sets.append((rng.standard_normal((count_q, depth), dtype=np.float32),
                                 rng.standard_normal((count_d, depth), dtype=np.float32)))
            label = "x".join(map(str, shape))
            cases = {}  # dtype -> (reference score of each data set, implementations)
            for dtype in DTYPES:
                data_sets = [(stored(raw_q, dtype), stored(raw_d, dtype)) for raw_q, raw_d in raw_sets]
                cases[dtype] = ([reference(queries, documents) for queries, documents in data_sets],
                                implementations(data_sets, dtype, families, anchor))
            times = {(dtype, name): [] for dtype, (_, impls) in cases.items()
                     for name, (scores, _) in impls.items() if scores is not None}
            for _ in range(rounds):  # interleaved: every dtype and implementation once per round
                for dtype, name in times:
                    times[dtype, name].append(cases[dtype][1][name][1](target))
            for dtype, (expected, impls) in cases.items():
                for name, (scores, timer) in impls.items():
                    record = {"shape": list(shape), "dtype": dtype, "impl": name}
                    if scores is None:
                        record["error"] = timer
                        print(f"{label:<16} {dtype:<9} {name:<18} {'n/a':>11}")
                    else:
                        seconds, ours = min(times[dtype, name]), times[dtype, "numkong"]
                        record.update(us=seconds * 1e6, gsops=2 * count_q * count_d * depth / seconds / 1e9,
                                      ratio=seconds / min(ours), paired_ratio=paired_ratio(times[dtype, name], ours),
                                      rounds_us=[t * 1e6 for t in times[dtype, name]],
                                      rel_error=max(abs(score - reference_score) / reference_score
                                                    for score, reference_score in zip(scores, expected)))
                        print(f"{label:<16} {dtype:<9} {name:<18} {record['us']:>11.2f} {record['gsops']:>8.1f} "
                              f"{record['ratio']:>7.2f} {record['paired_ratio']:>7.2f} {record['rel_error']:>9.1e}")
                    records.append(record)
            bf16 = times["bfloat16", "numkong"]
            summary = []
            for dtype in DTYPES:
                if dtype != "bfloat16":
                    ours = times[dtype, "numkong"]
                    summary.append(f"{dtype} {min(ours) / min(bf16):.2f} {paired_ratio(ours, bf16):.2f}")
            print(f"{label:<16} numkong time / bfloat16's (best, paired): {', '.join(summary)}")
    with limits:
        integers = integer_cases(rounds, target, args.datasets)
        calls = call_costs(rounds, target, anchor)
    sizes = packed_sizes(anchor)
    if anchor:
        anchor.close()
    if allowed:
        os.sched_setaffinity(0, allowed)  # batched reranking uses every core
    # In a fresh process: maxsim-cpu sizes its thread pool once, and this one was made while pinned.
    with tempfile.TemporaryDirectory() as scratch:
        path = os.path.join(scratch, "corpus.json")
        subprocess.run([sys.executable, os.path.abspath(__file__), "--corpus-worker", path, "--rounds", str(rounds),
                        "--target", str(target)], check=True)
        with open(path) as file:
            worker = json.load(file)
    corpus, pylate = worker["corpus"], worker["pylate"]
    if args.json:
        with open(args.json, "w") as file:
            json.dump({"meta": meta, "results": records, "integers": integers, "call_costs": calls,
                       "packed_bytes_per_row": sizes,
                       "corpus": corpus, "pylate": pylate}, file, indent=1)
        print(f"\nwrote {args.json}")


def significant(value):
    """Three significant digits, as the README's tables print times."""
    return f"{value:.0f}" if value >= 100 else f"{value:.1f}" if value >= 10 else f"{value:.2f}"


def markdown(paths):
    """The README's tables for the runs in `paths` (--json files of one CPU class)."""
    runs = []
    for path in paths:
        with open(path) as file:
            runs.append(json.load(file))
    classes = {run["meta"]["cpu_class"] for run in runs}
    if len(classes) != 1:
        raise SystemExit(f"--markdown: the runs mix CPU classes {sorted(map(str, classes))}; give one class at a time")
    anchors = {run["meta"].get("anchor", {}).get("version") for run in runs}
    if len(anchors) != 1 or None in anchors:
        raise SystemExit("--markdown: every run needs the same --anchor-python numkong")
    anchor, cpu_class = anchors.pop(), CLASS_NAMES[classes.pop()]
    pairs = [{(tuple(r["shape"]), r["dtype"], r["impl"]): r for r in run["results"] if "us" in r} for run in runs]
    rounds = len(runs[0]["results"][0]["rounds_us"])

    def over_runs(shape, dtype, impl, field):
        return [run[shape, dtype, impl][field] for run in pairs if (shape, dtype, impl) in run]

    def median_us(shape, dtype, impl):
        times = over_runs(shape, dtype, impl, "us")
        return significant(statistics.median(times)) if times else "n/a"

    floats = ("float32", "bfloat16", "float16")
    plural = "s" if len(runs) > 1 else ""
    print(f"<!-- tools/bench.py --markdown: {len(runs)} run{plural} of {rounds} rounds, {cpu_class}, "
          f"anchor numkong {anchor} -->")
    print(f"| queries x documents x depth | float32 | bfloat16 | float16 | e4m3 | e2m3 | {anchor} f32 / bf16 / f16 "
          f"| {anchor} time / ours (f32, bf16, f16) | NumPy float32 |")
    print("|---|---|---|---|---|---|---|---|---|")
    for shape in SHAPES:
        ours = [median_us(shape, dtype, "numkong") for dtype in ("float32", "bfloat16", "float16", "e4m3", "e2m3")]
        ours[0] += " us" if shape == SHAPES[0] else ""
        theirs = " / ".join(median_us(shape, dtype, f"numkong {anchor}") for dtype in floats)
        spans = []
        for dtype in floats:
            ratios = over_runs(shape, dtype, f"numkong {anchor}", "ratio")
            spans.append(f"{min(ratios):.2f}-{max(ratios):.2f}x" if ratios else "n/a")
        print(f"| {' x '.join(map(str, shape))} | {' | '.join(ours)} | {theirs} | {', '.join(spans)} "
              f"| {median_us(shape, 'float32', 'numpy')} |")

    def errors(impl):
        return [r["rel_error"] for run in runs for r in run["results"] if r["impl"] == impl and "rel_error" in r]

    print(f"\nRelative error against the float64 reference: ours at most {max(errors('numkong')):.1e}, "
          f"{anchor} {min(errors(f'numkong {anchor}')):.1e} to {max(errors(f'numkong {anchor}')):.1e}.")
    gsops = [f"{statistics.median(over_runs(shape, 'float32', 'numkong', 'gsops')):.0f}" for shape in SHAPES]
    peaks = {name: statistics.median(run["integers"]["peaks"][name] for run in runs)
             for name in runs[0].get("integers", {}).get("peaks", {})}
    print(f"Ours in GSO/s (2 x Q x D x depth / time), float32, by shape: {', '.join(gsops)}; the core's peaks "
          f"(tools/peaks.c): {', '.join(peak_label(name, value) for name, value in peaks.items())}.")
    spans = []
    for dtype in DTYPES:
        if dtype != "bfloat16":
            ratios = [paired_ratio(run[shape, dtype, "numkong"]["rounds_us"],
                                   run[shape, "bfloat16", "numkong"]["rounds_us"]) for run in pairs for shape in SHAPES]
            spans.append(f"{dtype} {min(ratios):.2f}-{max(ratios):.2f}x")
    print(f"Our time over bfloat16's, paired, every shape and run: {', '.join(spans)}.")
    numpy_ratios = [ratio for shape in SHAPES for ratio in over_runs(shape, "float32", "numpy", "ratio")]
    print(f"NumPy's float32 time over ours, every shape and run: {min(numpy_ratios):.1f}-{max(numpy_ratios):.1f}x.")
    calls = [{(tuple(r["shape"]), r["dtype"], r["impl"]): r for r in run.get("call_costs", [])} for run in runs]
    if any(calls):
        cells = []
        for shape in CALL_SHAPES:
            for dtype in floats:
                ours = [run[shape, dtype, "numkong"]["us"] for run in calls if (shape, dtype, "numkong") in run]
                theirs = [run[shape, dtype, f"numkong {anchor}"]["us"] for run in calls
                          if (shape, dtype, f"numkong {anchor}") in run]
                if ours and theirs:
                    cells.append(f"{'x'.join(map(str, shape))} {dtype} {significant(statistics.median(ours))} / "
                                 f"{significant(statistics.median(theirs))}")
        print(f"A call's fixed cost from Python in us, ours / {anchor} (median of best times): {', '.join(cells)}.")
    print("\n| corpus | numkong, 2 threads | numkong, 1 thread | maxsim-cpu (all cores) |\n|---|---|---|---|")
    corpora = [{(r["corpus"], r["impl"]): r["ms"] for r in run["corpus"]} for run in runs]
    for corpus in dict.fromkeys(r["corpus"] for r in runs[0]["corpus"]):
        cells = []
        for impl in ("numkong threads=2", "numkong threads=1", "maxsim-cpu (all cores)"):
            times = [run[corpus, impl] for run in corpora if (corpus, impl) in run]
            cells.append(f"{significant(statistics.median(times))} ms" if times else "n/a")
        label = corpus.replace("1000 docs x", "1,000 x") + " tokens"
        print(f"| {label}, {cpu_class} | {' | '.join(cells)} |")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--anchor-python", help="interpreter whose numkong is timed alongside ours")
    parser.add_argument("--json", help="write every figure to this JSON file")
    parser.add_argument("--quick", action="store_true", help="a short run: 2 rounds of 3 ms each")
    parser.add_argument("--families", action="store_true", help="also time each available kernel family")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds per case")
    parser.add_argument("--target", type=float, default=0.02, help="seconds of calls per timing")
    parser.add_argument("--cpu", type=int, help="CPU to pin to (default: the first one allowed)")
    parser.add_argument("--datasets", type=int, default=4,
                        help="random normal data sets per shape; times are the mean over them")
    parser.add_argument("--cpu-class", choices=CPU_CLASSES[1:],
                        help="limit both numkong builds to the kernel families of this x86 CPU class")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--pylate-only", action="store_true",
                        help="only the PyLate reranking comparison (needs pylate and torch)")
    parser.add_argument("--corpus", action="store_true",
                        help="only the corpora at scale (10k and 100k documents: packing, loading, top-k search; "
                             "tools/bench_scale.py)")
    parser.add_argument("--corpus-sizes", default="10000,100000", help="document counts for --corpus")
    parser.add_argument("--corpus-worker", help=argparse.SUPPRESS)
    parser.add_argument("--markdown", nargs="+", metavar="RUN.json",
                        help="print the README's tables from the --json files of earlier runs of one CPU class")
    args = parser.parse_args()
    if args.markdown:
        markdown(args.markdown)
        return
    args.kept_families = CPU_CLASSES[:CPU_CLASSES.index(args.cpu_class) + 1] if args.cpu_class else None
    if args.kept_families:  # before numkong is imported here or in the corpus worker, which inherits it
        os.environ["NUMKONG_DISABLE"] = ",".join(
            name for name in ("haswell", "skylake", "icelake", "genoa", "sapphireamx")
            if name not in args.kept_families)
    if args.worker:
        worker()
    elif args.corpus_worker:
        records = {"corpus": corpus_cases(args.rounds, args.target), "pylate": pylate_cases(args.rounds, args.target)}
        with open(args.corpus_worker, "w") as file:
            json.dump(records, file)
    elif args.corpus:
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        from bench_scale import scale_cases
        records = scale_cases(tuple(int(size) for size in args.corpus_sizes.split(",")))
        if args.json:
            with open(args.json, "w") as file:
                json.dump({"scale": records}, file, indent=1)
    elif args.pylate_only:
        records = pylate_cases(args.rounds, args.target)
        if args.json:
            with open(args.json, "w") as file:
                json.dump({"pylate": records}, file, indent=1)
    else:
        run(args)


if __name__ == "__main__":
    main()
