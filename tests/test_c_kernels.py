"""Runs the C-level check driver (tests/c): every compiled family on this CPU against serial."""
import os
import shutil
import subprocess

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
SANITIZERS = "-fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer"


def _run_driver(build_dir, cflags=""):
    environment = dict(os.environ, CFLAGS=cflags)
    return subprocess.run(["bash", os.path.join(HERE, "c", "run.sh"), str(build_dir)], capture_output=True,
                          text=True, env=environment)


@pytest.mark.skipif(shutil.which("gcc") is None, reason="gcc is needed to build the C check driver")
def test_every_family_matches_serial_in_c(tmp_path):
    run = _run_driver(tmp_path)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
    assert ", 0 failed" in run.stdout


@pytest.mark.skipif(shutil.which("gcc") is None, reason="gcc is needed to build the C check driver")
def test_every_family_clean_under_address_and_undefined_sanitizers(tmp_path):
    probe = subprocess.run(["gcc", *SANITIZERS.split(), "-x", "c", "-", "-o", str(tmp_path / "probe")],
                           input="int main(void) { return 0; }", capture_output=True, text=True)
    if probe.returncode != 0:
        pytest.skip("this gcc cannot link AddressSanitizer/UndefinedBehaviorSanitizer programs")
    run = _run_driver(tmp_path / "build", SANITIZERS)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
    assert ", 0 failed" in run.stdout
