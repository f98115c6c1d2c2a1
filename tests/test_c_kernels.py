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


def _can_run_arm_driver():
    have_tools = shutil.which("aarch64-linux-gnu-gcc") and shutil.which("qemu-aarch64")
    can_install = shutil.which("apt-get") and hasattr(os, "geteuid") and os.geteuid() == 0
    return bool(have_tools or can_install)


@pytest.mark.skipif(not _can_run_arm_driver(), reason="needs aarch64-linux-gnu-gcc and qemu-aarch64 (or root + apt)")
def test_arm_families_match_serial_under_qemu(tmp_path):
    """NEON and SVE (128, 256, 512 bits, and with SVE off) against serial, cross-built and emulated."""
    runs = "max,sve128=on|quick max,sve=off|quick max,sve256=on|quick max|quick"
    run = subprocess.run(["bash", os.path.join(HERE, "c", "run_arm.sh"), str(tmp_path)], capture_output=True,
                         text=True, env=dict(os.environ, NK_ARM_RUNS=runs), timeout=1800)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
    assert run.stdout.count(", 0 failed") >= 5, run.stdout[-4000:]
