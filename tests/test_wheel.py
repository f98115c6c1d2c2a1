"""Slow tier: `pip wheel .` + `auditwheel repair` give a manylinux wheel that installs in a fresh virtual
environment and passes tests against it (tools/check_wheel.sh; run by hand it runs the whole quick tier,
here the files that exercise what a wheel ships: the extension, the C headers for cimport, the stubs)."""
import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="auditwheel repairs Linux wheels")
def test_manylinux_wheel_installs_and_passes_its_tests(tmp_path):
    files = ["test_api.py", "test_cimport.py", "test_stubs.py", "test_packaging.py", "test_corpus.py", "test_main.py"]
    run = subprocess.run(["bash", os.path.join(ROOT, "tools", "check_wheel.sh"), str(tmp_path),
                          *[os.path.join(ROOT, "tests", name) for name in files]],
                         capture_output=True, text=True, env=dict(os.environ, PYTHON=sys.executable), timeout=1800)
    output = run.stdout + run.stderr
    assert run.returncode == 0, output[-4000:]
    wheel = re.search(r"manylinux wheel: (numkong-\S+-manylinux_\d+_\d+_\w+\.whl)", output)
    assert wheel, output[-4000:]
    assert f"installed at {tmp_path}" in output, "the tests must run against the installed wheel"
    summaries = re.findall(r"^=*\s*(\d+ passed.*?)\s*=*$", run.stdout, re.M)  # pytest's closing line
    assert summaries and "failed" not in summaries[-1] and "error" not in summaries[-1], output[-4000:]
