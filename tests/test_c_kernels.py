"""Runs the C-level check driver (tests/c): every compiled family on this CPU against serial, on the
driver's quick case list (which crosses every tail and blocking boundary); in the slow tier the full list
under AddressSanitizer + UndefinedBehaviorSanitizer, and the quick list for Arm under qemu and for Windows
under wine; every build prints the serial digest in tests/c/serial_digests.txt."""
import os
import re
import shutil
import subprocess

import pytest

from conftest import require_tools

HERE = os.path.dirname(os.path.abspath(__file__))
# -O1: the sanitizer build and run took 247 s of CPU at the driver's -O2, 171 s at -O1.
SANITIZERS = "-O1 -fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer"


def _run_driver(build_dir, cflags="", args=""):
    environment = dict(os.environ, CFLAGS=cflags, NK_CHECK_ARGS=args)
    return subprocess.run(["bash", os.path.join(HERE, "c", "run.sh"), str(build_dir)], capture_output=True,
                          text=True, env=environment)


def _digests(stdout):
    """The serial score digests a driver run printed, one per run: scores hashed bit for bit."""
    return re.findall(r"serial digest ([0-9a-f]{16}) \((quick|full) cases\)", stdout)


def _expected_digests():
    """{"quick": digest} from tests/c/serial_digests.txt: what every build of the driver must print."""
    with open(os.path.join(HERE, "c", "serial_digests.txt")) as lines:
        return dict(line.split() for line in lines if line.strip() and not line.startswith("#"))


@pytest.mark.skipif(shutil.which("gcc") is None, reason="gcc is needed to build the C check driver")
def test_every_family_matches_serial_in_c(tmp_path):
    # Every family's scores were compared bit for bit with serial's inside the driver; serial's own
    # scores are pinned by the committed digest, which the emulated builds below must print too.
    run = _run_driver(tmp_path, args="quick")
    assert run.returncode == 0 and ", 0 failed" in run.stdout, run.stdout[-4000:] + run.stderr[-4000:]
    assert {mode: digest for digest, mode in _digests(run.stdout)} == _expected_digests(), (
        "serial's scores changed: if the driver's case list changed on purpose, put its digest in "
        "tests/c/serial_digests.txt")


@pytest.mark.slow
def test_every_family_clean_under_address_and_undefined_sanitizers(tmp_path):
    require_tools("gcc")
    probe = subprocess.run(["gcc", *SANITIZERS.split(), "-x", "c", "-", "-o", str(tmp_path / "probe")],
                           input="int main(void) { return 0; }", capture_output=True, text=True)
    assert probe.returncode == 0, f"this gcc cannot link ASan/UBSan programs: {probe.stderr[-2000:]}"
    run = _run_driver(tmp_path / "build", SANITIZERS)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
    assert ", 0 failed" in run.stdout


@pytest.mark.slow
def test_arm_families_match_serial_under_qemu(tmp_path):
    """NEON and SVE (128, 256, 512 bits, and with SVE off) against serial, cross-built and emulated."""
    require_tools("aarch64-linux-gnu-gcc", "qemu-aarch64")
    runs = "max,sve128=on|quick max,sve=off|quick max,sve256=on|quick max|quick"
    run = subprocess.run(["bash", os.path.join(HERE, "c", "run_arm.sh"), str(tmp_path)], capture_output=True,
                         text=True, env=dict(os.environ, NK_ARM_RUNS=runs), timeout=1800)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
    assert run.stdout.count(", 0 failed") >= 5, run.stdout[-4000:]
    # Same bits on Arm as on this machine: serial (and so every family) follows one canonical order.
    expected = _expected_digests()
    for digest, mode in _digests(run.stdout):
        assert digest == expected[mode], f"Arm {mode} digest {digest} != {expected[mode]} (tests/c/serial_digests.txt)"


# Families the mingw-w64 GCC cannot build yet, with the reason; every other x86 family must build.
MINGW_KNOWN_FAILURES = {
    # GCC 12's amxtileintrin.h casts the tile stride to long, 32 bits on Windows, so tileloadd gets a
    # 32-bit index register: "(%rdi,%eax,1) is not a valid base/index expression".
    "sapphireamx": "GCC's _tile_loadd passes a 32-bit long stride on Windows",
}


@pytest.mark.slow
def test_windows_build_matches_serial_under_wine(tmp_path):
    """The kernels and the check driver cross-compiled with mingw-w64 and run under wine64."""
    require_tools("x86_64-w64-mingw32-gcc")
    if not any(shutil.which(w) for w in ("wine64", "/usr/lib/wine/wine64", "wine")):
        require_tools("wine64")
    required = " ".join(f for f in ("haswell", "skylake", "icelake", "genoa", "sapphireamx")
                        if f not in MINGW_KNOWN_FAILURES)
    run = subprocess.run(["bash", os.path.join(HERE, "c", "run_mingw.sh"), str(tmp_path)], capture_output=True,
                         text=True, env=dict(os.environ, NK_MINGW_REQUIRE=required, NK_MINGW_ARGS="quick"), timeout=1800)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
    assert ", 0 failed" in run.stdout, run.stdout[-4000:]
    assert "checked" in run.stdout, run.stdout[-4000:]  # at least one SIMD family ran on this CPU
    digests = _digests(run.stdout)
    expected = _expected_digests()
    assert digests and all(digest == expected[mode] for digest, mode in digests), (digests, expected)
