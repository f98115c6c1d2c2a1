"""Slow tier: libFuzzer + ASan + UBSan over the matrix loader, the corpus verifier and the packer
(tools/fuzz/run.sh), for NUMKONG_FUZZ_SECONDS (default 30). The quick tier fuzzes the same entry points
briefly with hypothesis (test_hardening.py)."""
import os
import re
import subprocess

import pytest

from conftest import require_tools

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.slow
def test_libfuzzer_finds_nothing_in_the_loaders(tmp_path):
    require_tools("clang")
    seconds = int(os.environ.get("NUMKONG_FUZZ_SECONDS", "30"))
    run = subprocess.run(["bash", os.path.join(ROOT, "tools", "fuzz", "run.sh"), str(seconds), str(tmp_path / "corpus")],
                         capture_output=True, text=True, timeout=seconds + 900)
    output = run.stdout + run.stderr
    assert run.returncode == 0, output[-4000:]
    runs = re.search(r"stat::number_of_executed_units:\s*(\d+)", output)
    assert runs and int(runs.group(1)) > 0, output[-4000:]
    assert not list((tmp_path / "corpus").glob("crash-*")), output[-4000:]
