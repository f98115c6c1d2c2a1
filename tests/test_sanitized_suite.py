"""The whole suite once more against an AddressSanitizer + UndefinedBehaviorSanitizer build
(meson's b_sanitize option, via tools/sanitize.sh). Slow tier; skipped inside that run itself."""
import os
import subprocess

import pytest

from conftest import SANITIZED, require_tools

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.slow
@pytest.mark.skipif(SANITIZED, reason="already the sanitized run")
def test_suite_passes_under_address_and_undefined_sanitizers(tmp_path):
    require_tools("gcc")
    environment = dict(os.environ, NUMKONG_SANITIZE_VENV=str(tmp_path / "venv"))
    # The C driver runs under the sanitizers on its own in the slow tier; the inner run is the quick tier.
    run = subprocess.run(["bash", os.path.join(ROOT, "tools", "sanitize.sh"), "-q", "-x", "-n", "2", "--dist",
                          "loadfile", "-k",
                          "not c_kernels and not arm_families"], capture_output=True, text=True,
                         env=environment, timeout=3000)
    tail = run.stdout[-3000:] + run.stderr[-3000:]
    assert run.returncode == 0, tail
    assert " passed" in run.stdout and " failed" not in run.stdout.splitlines()[-1], tail
