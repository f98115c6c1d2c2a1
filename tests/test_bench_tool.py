"""tools/bench.py --markdown: the README's tables from saved runs (medians of times, ranges of ratios)."""
import json
import os
import subprocess
import sys

TOOL = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tools", "bench.py")
SHAPES = [(32, 180, 128), (32, 1024, 128), (1024, 1024, 128), (32, 512, 768)]


def _run_file(tmp_path, name, cpu_class, scale):
    """A run's JSON in the shape bench.py writes: ours at `scale` us per shape index, the anchor 3x slower."""
    results = []
    for index, shape in enumerate(SHAPES):
        ours = scale * (index + 1)
        for dtype in ("float32", "bfloat16", "float16", "e4m3", "e5m2", "e2m3", "e3m2"):
            results.append({"shape": list(shape), "dtype": dtype, "impl": "numkong", "us": ours, "ratio": 1.0,
                            "gsops": 100.0 * scale, "rounds_us": [ours] * 3, "rel_error": 1e-16})
        for dtype in ("float32", "bfloat16", "float16"):
            results.append({"shape": list(shape), "dtype": dtype, "impl": "numkong 9.9", "us": 3 * ours,
                            "ratio": 3.0 * scale, "rounds_us": [3 * ours] * 3, "rel_error": 0.01})
        results.append({"shape": list(shape), "dtype": "e4m3", "impl": "numkong 9.9", "error": "unsupported"})
        results.append({"shape": list(shape), "dtype": "float32", "impl": "numpy", "us": 10 * ours, "ratio": 10.0,
                        "rounds_us": [10 * ours] * 3, "rel_error": 1e-8})
    corpus = [{"corpus": "1000 docs x 180", "impl": impl, "ms": ms}
              for impl, ms in (("numkong threads=1", 4.0 * scale), ("numkong threads=2", 2.0 * scale),
                               ("maxsim-cpu (all cores)", 20.0))]
    calls = [{"shape": list(shape), "dtype": dtype, "impl": impl, "us": us * scale, "paired_ratio": 1.0}
             for shape in ((1, 1, 1), (1, 1, 128)) for dtype in ("float32", "bfloat16", "float16")
             for impl, us in (("numkong", 0.1 * sum(shape)), ("numkong 9.9", 0.2))]
    path = tmp_path / name
    peaks = {"amx_int8": 6000.0 * scale, "amx_wakeup_ns": 250.0 * scale}
    path.write_text(json.dumps({"meta": {"cpu_class": cpu_class, "anchor": {"version": "9.9"}},
                                "results": results, "corpus": corpus, "call_costs": calls,
                                "integers": {"peaks": peaks}}))
    return str(path)


def _markdown(*paths):
    return subprocess.run([sys.executable, TOOL, "--markdown", *paths], capture_output=True, text=True, timeout=60)


def test_markdown_prints_medians_and_ratio_ranges(tmp_path):
    runs = [_run_file(tmp_path, f"run{k}.json", None, scale) for k, scale in enumerate((1.0, 1.1, 1.3))]
    done = _markdown(*runs)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "<!-- tools/bench.py --markdown: 3 runs of 3 rounds, all families, anchor numkong 9.9 -->"
    # medians over the runs: 1.1 us for the first shape, anchor 3.3; ratios span 3.00-3.90
    assert lines[3] == ("| 32 x 180 x 128 | 1.10 us | 1.10 | 1.10 | 1.10 | 1.10 | 3.30 / 3.30 / 3.30 "
                        "| 3.00-3.90x, 3.00-3.90x, 3.00-3.90x | 11.0 |"), lines[3]
    assert lines[5].startswith("| 1024 x 1024 x 128 | 3.30 |"), lines[5]
    assert "ours at most 1.0e-16, 9.9 1.0e-02 to 1.0e-02." in done.stdout
    assert "float32, by shape: 110, 110, 110, 110;" in done.stdout
    assert "(tools/peaks.c): amx_int8 6600 G/s, amx_wakeup_ns 275 ns." in done.stdout  # medians, with units
    assert "paired, every shape and run: float32 1.00-1.00x, float16 1.00-1.00x," in done.stdout
    assert "NumPy's float32 time over ours, every shape and run: 10.0-10.0x." in done.stdout
    assert "| 1,000 x 180 tokens, all families | 2.20 ms | 4.40 ms | 20.0 ms |" in lines
    assert ("A call's fixed cost from Python in us, ours / 9.9 (median of best times): 1x1x1 float32 0.33 / "
            "0.22, ") in done.stdout
    assert "1x1x128 float16 14.3 / 0.22." in done.stdout


def test_markdown_names_the_cpu_class(tmp_path):
    done = _markdown(_run_file(tmp_path, "ice.json", "icelake", 1.0))
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("<!-- tools/bench.py --markdown: 1 run of 3 rounds, Ice Lake class,")
    assert "| 1,000 x 180 tokens, Ice Lake class | 2.00 ms | 4.00 ms | 20.0 ms |" in done.stdout


def test_markdown_refuses_runs_of_different_cpu_classes(tmp_path):
    done = _markdown(_run_file(tmp_path, "all.json", None, 1.0), _run_file(tmp_path, "ice.json", "icelake", 1.0))
    assert done.returncode != 0
    assert "give one class at a time" in done.stderr
