"""Runs the C-level check driver (tests/c): every compiled family on this CPU against serial."""
import os
import shutil
import subprocess

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))


@pytest.mark.skipif(shutil.which("gcc") is None, reason="gcc is needed to build the C check driver")
def test_every_family_matches_serial_in_c(tmp_path):
    run = subprocess.run(["bash", os.path.join(HERE, "c", "run.sh"), str(tmp_path)], capture_output=True, text=True)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
    assert ", 0 failed" in run.stdout
