"""Corpus-at-scale figures for tools/bench.py --corpus: packing, saving, loading, top-k search.

For each corpus size (10,000 and 100,000 documents of 32-180 tokens, depth 128, float16, on
ColBERT-like clustered data: tokens near 1,024 shared centroids, queries built from a relevant
document's tokens plus noise) it reports pack time on 1 and 2 threads (alternating rounds, each
after touch_and_free), save time, load time and
GB/s at each verify level, the latency and queries/s of top_k=10 with 1 and with 16 queries per call,
against all scores plus a sort on one thread, and maxsim-cpu's maxsim_scores_variable + argpartition
(all cores) when maxsim_cpu is importable; then bytes per token of each dtype.
"""
import os
import tempfile
import time

import numpy as np

DEPTH = 128
CENTROIDS = 1024


def clustered_documents(count, seed=0, dtype=np.float16, low=32, high=180, spread=0.35):
    """`count` documents whose unit tokens lie near random ones of CENTROIDS shared unit centroids."""
    rng = np.random.default_rng(seed)
    centers = rng.standard_normal((CENTROIDS, DEPTH)).astype(np.float32)
    centers /= np.linalg.norm(centers, axis=1, keepdims=True)
    documents = []
    for n in rng.integers(low, high + 1, count):
        tokens = centers[rng.integers(0, CENTROIDS, n)]
        tokens = tokens + spread * rng.standard_normal((n, DEPTH)).astype(np.float32) / np.sqrt(DEPTH)
        documents.append((tokens / np.linalg.norm(tokens, axis=1, keepdims=True)).astype(dtype))
    return documents


def relevant_queries(documents, count, seed=1, rows=32, noise=0.15):
    """(queries, the document each was built from): rows of a random document's tokens plus noise."""
    rng = np.random.default_rng(seed)
    queries, relevant = [], []
    for _ in range(count):
        index = int(rng.integers(0, len(documents)))
        tokens = documents[index].astype(np.float32)[rng.integers(0, len(documents[index]), rows)]
        tokens = tokens + noise * rng.standard_normal(tokens.shape).astype(np.float32) / np.sqrt(DEPTH)
        queries.append(tokens.astype(documents[0].dtype))
        relevant.append(index)
    return queries, relevant


def touch_and_free(nbytes):
    """Write `nbytes` of fresh memory and free it. On a VM that hands freed memory back to its host (free
    page reporting), the first write to memory the host took back costs far more than the guest's own
    page clearing (4.3 GB: about 9 s the first time, 0.3 s after); called before each timed pack, it
    gives every thread count pages the host has backed, so that the ratio measures the packer."""
    block = np.ones(max(int(nbytes), 1) // 8 + 1)
    del block


def alternating(functions, rounds, before=None):
    """{name: [seconds per round]} of `functions` timed once each per round, their order reversed every
    other round (a host whose speed drifts then favours neither); `before()` runs ahead of each timing."""
    names = list(functions)
    times = {name: [] for name in names}
    for round_index in range(rounds):
        for name in (names if round_index % 2 == 0 else names[::-1]):
            if before is not None:
                before()
            start = time.perf_counter()
            functions[name]()
            times[name].append(time.perf_counter() - start)
    return times


def paired_ratio(times, slow, fast):
    """Median over rounds of times[slow] / times[fast] (timings of the same round)."""
    return float(np.median([a / b for a, b in zip(times[slow], times[fast])]))


def scale_cases(sizes=(10_000, 100_000), repeats=3):
    import numkong as nk
    from numkong.__main__ import best_time
    records = []
    print(f"\nCorpora at scale: clustered float16 tokens, depth {DEPTH}, documents of 32-180 tokens, top_k=10")
    print(f"{'documents':>9} {'measure':<44} {'value':>12}")

    def report(size, measure, value, unit):
        print(f"{size:>9} {measure:<44} {value:>10.3g} {unit}")
        records.append({"documents": size, "measure": measure, "value": value, "unit": unit})

    for size in sizes:
        documents = clustered_documents(size)
        tokens = sum(len(d) for d in documents)
        corpus = nk.maxsim_pack_corpus(documents, threads=2)
        packs = alternating({threads: (lambda threads=threads: nk.maxsim_pack_corpus(documents, threads=threads))
                             for threads in (1, 2)}, 4 if size > 20_000 else 6,
                            before=lambda: touch_and_free(1.2 * corpus.nbytes))
        for threads in (1, 2):
            report(size, f"pack, {threads} thread{'s' if threads > 1 else ''}", min(packs[threads]), "s")
        report(size, "pack, 1 thread / 2 threads (paired median)", paired_ratio(packs, 1, 2), "x")
        report(size, "packed bytes per token", corpus.nbytes / tokens, "B")
        with tempfile.TemporaryDirectory() as folder:
            path = os.path.join(folder, "corpus.nkc")
            report(size, "save", best_time(lambda: corpus.save(path), 1), "s")
            for verify in (True, False, "all"):
                seconds = best_time(lambda: nk.MaxSimPackedCorpus.load(path, verify=verify), 1 if verify == "all" else 3)
                report(size, f"load (mmap), verify={verify}", seconds, "s")
                report(size, f"load (mmap), verify={verify}, GB/s", corpus.nbytes / seconds / 1e9, "GB/s")
        queries, _ = relevant_queries(documents, 16)
        packed = [nk.maxsim_pack(query) for query in queries]
        searches = alternating({
            "full": lambda: np.argsort(nk.maxsim_packed_corpus(packed[0], corpus, threads=1), kind="stable")[:10],
            "top": lambda: nk.maxsim_packed_corpus(packed[0], corpus, top_k=10, threads=1)}, 2 * repeats + 1)
        full = min(searches["full"])
        report(size, "all scores + sort, 1 query, 1 thread", full * 1e3, "ms")
        for threads in (1, 2):
            one = min(searches["top"]) if threads == 1 else \
                best_time(lambda: nk.maxsim_packed_corpus(packed[0], corpus, top_k=10, threads=threads), repeats)
            report(size, f"top_k=10, 1 query, {threads} thread{'s' if threads > 1 else ''}", one * 1e3, "ms")
            many = best_time(lambda: nk.maxsim_packed_corpus(packed, corpus, top_k=10, threads=threads), repeats)
            report(size, f"top_k=10, 16 queries per call, {threads} thread{'s' if threads > 1 else ''}",
                   16 / many, "queries/s")
            if threads == 1:
                report(size, "all scores + sort / top_k=10 (1 thread, best times)", full / one, "x")
                report(size, "all scores + sort / top_k=10 (1 thread, paired median)",
                       paired_ratio(searches, "full", "top"), "x")
        try:
            import maxsim_cpu
        except ImportError:
            print(f"{size:>9} {'maxsim-cpu':<44} {'n/a':>12} (pip install maxsim-cpu)")
        else:
            wide = [d.astype(np.float32) for d in documents]
            query = queries[0].astype(np.float32)
            query /= np.linalg.norm(query, axis=1, keepdims=True)
            theirs = best_time(lambda: np.argpartition(
                -np.asarray(maxsim_cpu.maxsim_scores_variable(query, wide)), 10)[:10], 1 if size > 20_000 else 2)
            report(size, "maxsim-cpu scores_variable + argpartition", theirs * 1e3, "ms")
            two = best_time(lambda: nk.maxsim_packed_corpus(packed[0], corpus, top_k=10, threads=2), repeats)
            report(size, "maxsim-cpu / top_k=10 (2 threads)", theirs / two, "x")
            del wide
        del corpus, documents
    sample = clustered_documents(1000, seed=5, dtype=np.float32)
    sample_tokens = sum(len(d) for d in sample)
    for dtype in ("float32", "bfloat16", "float16", "e4m3", "e5m2", "e2m3", "e3m2"):
        corpus = nk.maxsim_pack_corpus(sample, dtype=dtype)
        report(1000, f"bytes per token, {dtype}", corpus.nbytes / sample_tokens, "B")
    return records
