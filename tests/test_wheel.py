"""Slow tier: `pip wheel .` + `auditwheel repair` give a manylinux wheel that installs in a fresh virtual
environment and passes the quick tier there (tools/check_wheel.sh)."""
import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="auditwheel repairs Linux wheels")
def test_manylinux_wheel_installs_and_passes_the_quick_tier(tmp_path):
    run = subprocess.run(["bash", os.path.join(ROOT, "tools", "check_wheel.sh"), str(tmp_path)],
                         capture_output=True, text=True, env=dict(os.environ, PYTHON=sys.executable), timeout=1800)
    output = run.stdout + run.stderr
    assert run.returncode == 0, output[-4000:]
    wheel = re.search(r"manylinux wheel: (numkong-\S+-manylinux_\d+_\d+_\w+\.whl)", output)
    assert wheel, output[-4000:]
    assert f"installed at {tmp_path}" in output, "the tests must run against the installed wheel"
    summaries = re.findall(r"^=*\s*(\d+ passed.*?)\s*=*$", run.stdout, re.M)  # pytest's closing line
    assert summaries and "failed" not in summaries[-1] and "error" not in summaries[-1], output[-4000:]
