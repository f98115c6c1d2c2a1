#!/usr/bin/env python3
"""Retrieval quality, size and speed of numkong's packing formats, and a two-stage search.

    python tools/quality.py [--documents 10000] [--queries 100] [--candidates 200,400] [--threads 2]
                            [--repeats 3] [--seed 0] [--quick] [--markdown] [--json PATH]

Data: ColBERT-like clustered synthetic tokens, from tools/bench_scale.py with a fixed seed. 1,024 shared unit
centroids of depth 128; each document has 32..180 tokens (uniform), each token a random centroid plus
Gaussian noise (0.35 / sqrt(depth) per component), normalized. Each query has 32 rows: random tokens of a
random document (its "source") plus noise (0.15 / sqrt(depth) per component). Everything starts as
float32 arrays; every format packs those same arrays (numkong rounds or quantizes them itself).

Formats (float32, float16, bfloat16, int8, int4, uint1): each is packed as a whole corpus
(maxsim_pack_corpus on the float32 documents, --threads threads; `pack s` is the best of two packings)
and searched exactly in that format with maxsim_packed_corpus(query, corpus, top_k=10). The reference is
float32's exact top-10: `recall@10` is |top-10 of the format & top-10 of float32| / 10, averaged over the
queries. `rel. error` compares every score of every (query, document) pair, all documents of all queries,
with float32's: |score_format - score_float32| / score_float32, median and max over those pairs (the JSON
also has them over float32's top-10 pairs only). `B/token` is corpus.nbytes / corpus.total_vectors, the
packed corpus with its derived sections and table, not just the stored values. `ms/query` is wall-clock
per query for packing the query in the format and top_k=10 over the corpus on --threads threads, one
query per call, the best of --repeats passes over all queries.

Two-stage search: a uint1 (or int4) corpus gives each query's top C candidates (top_k=C), which are then
rescored exactly in float16 against a float16 corpus of the same documents, and the best 10 kept (ties
by document index, as top_k orders them). The rescoring goes through the corpus API with
maxsim_packed(query_float16, corpus_float16[i]) for each candidate i: corpus[i] is a view of the packed
document, so nothing is repacked (repacking the candidates' corpus.document(i) arrays into a sub-corpus
gives the same scores but costs far more than it saves; numkong has no call that scores a subset of a
corpus). `ms/query` covers packing the query in both formats, the first stage on --threads threads and
the single-threaded rescoring loop; `stage 1` and `rescore` split it. These are compared with a
single-stage float16 top-10 search (and float32's, the reference).

Wall-clock timing with time.perf_counter; nothing is pinned. --quick is a smoke test of a few seconds
(500 documents, 8 queries, C = 50, 100, one repeat): its figures mean little.
"""
import argparse
import json
import os
import sys
import time

import numpy as np

from bench_scale import CENTROIDS, DEPTH, clustered_documents, relevant_queries  # the data of bench.py --corpus

QUERY_ROWS = 32
TOP = 10
FORMATS = ["float32", "float16", "bfloat16", "int8", "int4", "uint1"]
FIRST_STAGES = ["uint1", "int4"]
RESCORE = "float16"


def log(message):
    """Progress on stderr, so that stdout holds only the header and the tables."""
    print(message, file=sys.stderr, flush=True)


# ---- measuring ----

def best_seconds(function, repeats):
    """Best wall-clock seconds of `function()` over `repeats` calls, and its last result. The result before
    is dropped first, so that a repeated packing reuses its memory instead of touching fresh pages: on a VM
    whose host backs memory on first touch, float32's first corpus took 3-4 s and the next 0.25 s."""
    best, result = float("inf"), None
    for _ in range(repeats):
        result = None
        start = time.perf_counter()
        result = function()
        best = min(best, time.perf_counter() - start)
    return best, result


def recall(found, reference):
    """Mean over queries of |found[q] & reference[q]| / len(reference[q])."""
    return float(np.mean([len(set(map(int, f)) & set(map(int, r))) / len(r) for f, r in zip(found, reference)]))


def relative_errors(scores, reference):
    """|scores - reference| / reference, elementwise (0 where both are 0)."""
    difference = np.abs(scores - reference)
    return np.divide(difference, reference, out=np.where(difference > 0, np.inf, 0.0), where=reference > 0)


def format_cases(nk, documents, queries, sources, threads, repeats):
    """Per format: packing, size, exact top-10 and every score. Returns (records, corpora, reference top-10)."""
    records, corpora, reference_ids, reference_scores = [], {}, None, None
    for name in FORMATS:
        log(f"{name}: packing")
        pack_seconds, corpus = best_seconds(lambda: nk.maxsim_pack_corpus(documents, dtype=name, threads=threads),
                                            2)
        log(f"{name}: searching")

        def search(corpus=corpus, name=name):
            return [nk.maxsim_packed_corpus(nk.maxsim_pack(query, name), corpus, top_k=TOP, threads=threads)[0]
                    for query in queries]

        search_seconds, top = best_seconds(search, repeats)
        top = np.array(top)
        scores = nk.maxsim_packed_corpus([nk.maxsim_pack(query, name) for query in queries], corpus,
                                         threads=threads)
        if reference_ids is None:  # float32 comes first
            reference_ids, reference_scores = top, scores
        errors = relative_errors(scores, reference_scores)
        top_errors = np.take_along_axis(errors, reference_ids, axis=1)
        records.append({
            "format": name, "bytes_per_token": corpus.nbytes / corpus.total_vectors, "corpus_bytes": corpus.nbytes,
            "pack_s": pack_seconds, "ms_per_query": search_seconds / len(queries) * 1e3,
            "recall_at_10": recall(top, reference_ids),
            "source_in_top_10": float(np.mean([s in set(map(int, t)) for s, t in zip(sources, top)])),
            "rel_error_median": float(np.median(errors)), "rel_error_max": float(np.max(errors)),
            "rel_error_top10_median": float(np.median(top_errors)), "rel_error_top10_max": float(np.max(top_errors)),
        })
        if name in FIRST_STAGES or name == RESCORE:
            corpora[name] = corpus
        del corpus, scores
    return records, corpora, reference_ids


def two_stage_cases(nk, corpora, queries, reference_ids, candidate_counts, threads, repeats):
    """First stage top-C in a compact format, exact float16 rescoring of the C through corpus[i]."""
    fine = corpora[RESCORE]
    records = []
    for first in FIRST_STAGES:
        coarse = corpora[first]
        for count in candidate_counts:
            count = min(count, len(coarse))
            log(f"two-stage {first} -> {RESCORE}, C = {count}")
            stage_times = np.zeros(2)

            def search(first=first, coarse=coarse, count=count, stage_times=stage_times):
                found = []
                for query in queries:
                    start = time.perf_counter()
                    candidates, _ = nk.maxsim_packed_corpus(nk.maxsim_pack(query, first), coarse, top_k=count,
                                                            threads=threads)
                    middle = time.perf_counter()
                    packed = nk.maxsim_pack(query, RESCORE)
                    candidates = np.sort(candidates)  # ties then go to the lower index, as in top_k
                    scores = np.array([nk.maxsim_packed(packed, fine[i]) for i in candidates.tolist()])
                    found.append(candidates[np.argsort(scores, kind="stable")[:TOP]])
                    end = time.perf_counter()
                    stage_times += (middle - start, end - middle)
                return found

            best = (float("inf"), None, None)
            for _ in range(repeats):
                stage_times[:] = 0
                seconds, found = best_seconds(search, 1)
                if seconds < best[0]:
                    best = (seconds, found, stage_times.copy())
            seconds, found, stages = best
            records.append({
                "search": f"{first} top-{count} -> {RESCORE} rescoring", "first_stage": first, "candidates": count,
                "recall_at_10": recall(found, reference_ids), "ms_per_query": seconds / len(queries) * 1e3,
                "stage1_ms": stages[0] / len(queries) * 1e3, "rescore_ms": stages[1] / len(queries) * 1e3,
            })
    return records


# ---- output ----

def table(headers, rows, markdown):
    """Rows of already formatted cells as a Markdown table or aligned plain text."""
    if markdown:
        aligns = ["---"] + ["---:"] * (len(headers) - 1)
        lines = ["| " + " | ".join(headers) + " |", "|" + "|".join(aligns) + "|"]
        lines += ["| " + " | ".join(row) + " |" for row in rows]
    else:
        widths = [max(len(str(cell)) for cell in column) for column in zip(headers, *rows)]
        lines = ["  ".join(cell.ljust(w) if i == 0 else cell.rjust(w) for i, (cell, w) in
                           enumerate(zip(line, widths))) for line in [headers, *rows]]
    return "\n".join(lines)


def report(meta, formats, stages, markdown):
    print(f"\nExact top-{TOP} per format against float32's exact top-{TOP}: {meta['documents']:,} documents "
          f"({meta['tokens']:,} tokens), {meta['queries']} queries of {QUERY_ROWS} rows, depth {DEPTH}, "
          f"{meta['threads']} threads; rel. error over all {meta['queries'] * meta['documents']:,} "
          f"(query, document) scores\n")
    float32_bytes = formats[0]["bytes_per_token"]
    rows = [[r["format"], f"{r['bytes_per_token']:.1f}", f"{float32_bytes / r['bytes_per_token']:.1f}x",
             f"{r['pack_s']:.2f}", f"{r['ms_per_query']:.2f}", f"{r['recall_at_10']:.3f}",
             f"{r['rel_error_median']:.1e}", f"{r['rel_error_max']:.1e}"] for r in formats]
    print(table(["format", "B/token", "smaller", "pack s", "top-10 ms/query", "recall@10", "rel. error median",
                 "rel. error max"], rows, markdown))
    print(f"\nTwo-stage search: top C in a compact format, exact {RESCORE} rescoring of the C "
          f"(maxsim_packed per corpus[i]), best {TOP} kept; recall against float32's exact top-{TOP}\n")
    single = {r["format"]: r for r in formats}
    baseline = single[RESCORE]["ms_per_query"]
    rows = [[f"{name} exact top-{TOP}", "-", f"{single[name]['recall_at_10']:.3f}",
             f"{single[name]['ms_per_query']:.2f}", "-", "-", f"{single[name]['ms_per_query'] / baseline:.2f}"]
            for name in ("float32", RESCORE)]
    rows += [[f"{r['first_stage']} top-C -> {RESCORE}", str(r["candidates"]), f"{r['recall_at_10']:.3f}",
              f"{r['ms_per_query']:.2f}", f"{r['stage1_ms']:.2f}", f"{r['rescore_ms']:.2f}",
              f"{r['ms_per_query'] / baseline:.2f}"] for r in stages]
    print(table(["search", "C", "recall@10", "ms/query", "stage 1 ms", "rescore ms", f"time / {RESCORE}'s"], rows,
                markdown))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--documents", type=int, default=10_000, help="documents in the corpus (default 10,000)")
    parser.add_argument("--queries", type=int, default=100, help="queries averaged over (default 100)")
    parser.add_argument("--candidates", default="200,400", help="first-stage candidate counts C, comma-separated")
    parser.add_argument("--threads", type=int, default=2, help="threads for packing and corpus search (default 2)")
    parser.add_argument("--repeats", type=int, default=3, help="timed passes over the queries; the best counts")
    parser.add_argument("--seed", type=int, default=0, help="documents use this seed, queries seed + 1")
    parser.add_argument("--quick", action="store_true",
                        help="smoke test in seconds: 500 documents, 8 queries, C = 50,100, one repeat")
    parser.add_argument("--markdown", action="store_true", help="print the tables as Markdown")
    parser.add_argument("--json", help="also write every figure to this JSON file")
    args = parser.parse_args()
    if args.quick:
        args.documents, args.queries, args.candidates, args.repeats = 500, 8, "50,100", 1
    candidate_counts = [int(c) for c in args.candidates.split(",") if c.strip()]
    if args.documents < TOP or args.queries < 1 or not candidate_counts or min(candidate_counts) < TOP:
        parser.error(f"need at least {TOP} documents, one query and candidate counts of at least {TOP}")

    import numkong as nk

    active = ",".join(c.name.lower() for c in nk.Capability if nk.get_capabilities() & c)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"numkong {nk.__version__} ({os.path.dirname(nk.__file__)}): active {active}; numpy {np.__version__}; "
          f"{os.cpu_count()} CPUs, load average {load:.2f} at start")
    started = time.perf_counter()
    log(f"generating {args.documents} documents and {args.queries} queries")
    documents = clustered_documents(args.documents, args.seed, dtype=np.float32)
    queries, sources = relevant_queries(documents, args.queries, args.seed + 1, rows=QUERY_ROWS)
    meta = {"numkong": nk.__version__, "capabilities": active, "documents": args.documents,
            "tokens": int(sum(len(d) for d in documents)), "queries": args.queries, "threads": args.threads,
            "repeats": args.repeats, "seed": args.seed, "depth": DEPTH, "centroids": CENTROIDS,
            "query_rows": QUERY_ROWS, "quick": args.quick, "load_average": load}
    formats, corpora, reference_ids = format_cases(nk, documents, queries, sources, args.threads, args.repeats)
    stages = two_stage_cases(nk, corpora, queries, reference_ids, candidate_counts, args.threads, args.repeats)
    report(meta, formats, stages, args.markdown)
    meta["seconds"] = time.perf_counter() - started
    log(f"done in {meta['seconds']:.1f} s")
    if args.json:
        with open(args.json, "w") as file:
            json.dump({"meta": meta, "formats": formats, "two_stage": stages}, file, indent=1)
        log(f"wrote {args.json}")


if __name__ == "__main__":
    main()
