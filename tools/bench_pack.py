#!/usr/bin/env python3
"""Packing throughput of maxsim_pack_corpus, per packing dtype and thread count, against scoring.

    python tools/bench_pack.py [--documents 1000] [--tokens 180] [--depth 128] [--source float32]
                               [--dtypes float32,bfloat16,float16] [--threads 1,2] [--rounds 5] [--repeat 3]
                               [--anchor-python PATH/TO/python] [--json PATH]

The corpus is `documents` random normal documents of `tokens` x `depth` in the source dtype (a list of
2-D arrays, as a reranker has them). Each figure is the best of `rounds` x `repeat`: rows/s and GB/s of source
bytes read, and the pack time over the time of scoring one 32-row query against the packed corpus
(maxsim_packed_corpus on 1 thread), so "pack/score 3.5" means packing costs 3.5 queries.

--anchor-python runs this file as a worker under another interpreter whose numkong is timed the same
way (e.g. a venv with an older build); rounds alternate between ours and the anchor, one worker
process each, and the table shows both and old/new. Timings on a shared host are noisy: compare
only figures from one run.
"""
import argparse
import json
import os
import subprocess
import sys
import time


def _worker(args):
    """Time every (dtype, threads) once per round in this process; print one JSON object."""
    import ml_dtypes
    import numpy as np

    import numkong as nk

    source = np.dtype(ml_dtypes.bfloat16) if args.source == "bfloat16" else np.dtype(args.source)
    rng = np.random.default_rng(0)
    docs = [rng.standard_normal((args.tokens, args.depth)).astype(source) for _ in range(args.documents)]
    query = rng.standard_normal((32, args.depth)).astype(np.float32)
    result = {}
    for name in args.dtypes:
        corpus = nk.maxsim_pack_corpus(docs, dtype=name, threads=1)  # warm-up, and what scoring reads
        packed_query = nk.maxsim_pack(query, dtype=name)
        score = min(_timed(lambda: nk.maxsim_packed_corpus(packed_query, corpus, threads=1)) for _ in range(5))
        result[name] = {"score": score}
        for threads in args.threads:
            result[name][str(threads)] = min(_timed(lambda: nk.maxsim_pack_corpus(docs, dtype=name, threads=threads))
                                             for _ in range(args.repeat))
        del corpus
    print(json.dumps(result))


def _timed(call):
    start = time.perf_counter()
    call()
    return time.perf_counter() - start


def _run(python, argv):
    out = subprocess.run([python, os.path.abspath(__file__), "--worker"] + argv, check=True,
                         capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def _best(rounds):
    """Elementwise minimum over rounds of {dtype: {key: seconds}}."""
    best = {}
    for r in rounds:
        for name, times in r.items():
            slot = best.setdefault(name, {})
            for key, value in times.items():
                slot[key] = min(slot.get(key, value), value)
    return best


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--documents", type=int, default=1000)
    parser.add_argument("--tokens", type=int, default=180)
    parser.add_argument("--depth", type=int, default=128)
    parser.add_argument("--source", default="float32", help="float64, float32, float16 or bfloat16")
    parser.add_argument("--dtypes", default="float32,bfloat16,float16")
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--rounds", type=int, default=5, help="worker processes per build (interleaved)")
    parser.add_argument("--repeat", type=int, default=3, help="timings of each case per worker")
    parser.add_argument("--anchor-python", help="another interpreter whose numkong to compare against")
    parser.add_argument("--json", help="write the best times here")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.dtypes = args.dtypes.split(",")
    args.threads = [int(t) for t in args.threads.split(",")]
    if args.worker:
        return _worker(args)
    argv = [a for a in sys.argv[1:] if not a.startswith("--anchor-python") and a != args.anchor_python]
    ours, anchor = [], []
    for _ in range(args.rounds):  # interleaved, so that drift of the host hits both alike
        ours.append(_run(sys.executable, argv))
        if args.anchor_python:
            anchor.append(_run(args.anchor_python, argv))
    ours, anchor = _best(ours), _best(anchor) if anchor else None
    rows = args.documents * args.tokens
    source_bytes = rows * args.depth * (8 if args.source == "float64" else 4 if args.source == "float32" else 2)
    print(f"{args.documents} documents x {args.tokens} tokens x depth {args.depth}, {args.source} source; "
          f"best of {args.rounds} x {args.repeat}")
    header = f"{'dtype':>9} {'threads':>7} {'ms':>8} {'rows/s':>10} {'GB/s':>6} {'pack/score':>10}"
    if anchor:
        header += f" {'anchor ms':>10} {'old/new':>7}"
    print(header)
    for name in args.dtypes:
        for threads in args.threads:
            t = ours[name][str(threads)]
            line = (f"{name:>9} {threads:>7} {t * 1e3:8.1f} {rows / t:10.3g} {source_bytes / t / 1e9:6.2f} "
                    f"{t / ours[name]['score']:10.1f}")
            if anchor:
                a = anchor[name][str(threads)]
                line += f" {a * 1e3:10.1f} {a / t:7.2f}"
            print(line)
        line = f"{name:>9} {'score':>7} {ours[name]['score'] * 1e3:8.2f}  (one 32-row query, 1 thread)"
        if anchor:
            line += f"; anchor {anchor[name]['score'] * 1e3:.2f}"
        print(line)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"ours": ours, "anchor": anchor, "args": vars(args)}, f, indent=1)


if __name__ == "__main__":
    main()
