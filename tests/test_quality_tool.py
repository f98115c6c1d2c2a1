"""Smoke test of tools/quality.py: its --quick run (500 documents, 8 queries) exits 0 and prints both tables."""
import json
import os
import subprocess
import sys

TOOL = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tools", "quality.py")


def test_quick_run_prints_the_markdown_tables(tmp_path):
    report = tmp_path / "quality.json"
    run = subprocess.run([sys.executable, TOOL, "--quick", "--markdown", "--json", str(report)],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    assert lines[0].startswith("numkong "), run.stdout
    assert any(line.startswith("| format | B/token |") for line in lines), run.stdout
    assert any(line.startswith("| search | C | recall@10 |") for line in lines), run.stdout
    rows = [line for line in lines if line.startswith("| ") and not line.startswith(("| format", "| search"))]
    assert any(line.startswith("| uint1 |") for line in rows), run.stdout
    assert any(line.startswith("| uint1 top-C -> float16 |") for line in rows), run.stdout
    figures = json.loads(report.read_text())
    recall = {record["format"]: record["recall_at_10"] for record in figures["formats"]}
    assert recall["float32"] == 1.0 and recall["float16"] >= 0.9, recall  # float32 is the reference
