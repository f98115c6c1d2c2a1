"""NUMKONG_DISABLE: kernel families removed at import, in a fresh interpreter each time."""
import json
import os
import subprocess
import sys

import pytest

import numkong as nk

PROBE = r"""
import json
import numpy as np
import numkong as nk
x = np.random.default_rng(0).standard_normal((9, 40))
result = {
    "available": int(nk.get_capabilities()),
    "compiled": int(nk.get_capabilities("compiled")),
    "cpu": int(nk.get_capabilities("cpu")),
    "score": nk.maxsim(x[:4], x, "float32"),
    "serial": nk.maxsim(x[:4], x, "float32", capabilities=nk.Capability.SERIAL),
}
refused = {}
for cap in nk.Capability:
    try:
        nk.maxsim(x, x, "float32", capabilities=cap)
    except ValueError as error:
        refused[cap.name] = str(error)
result["refused"] = refused
print(json.dumps(result))
"""


def _run(disable, code=PROBE, tmp_path=None):
    env = dict(os.environ)
    env.pop("NUMKONG_DISABLE", None)
    if disable is not None:
        env["NUMKONG_DISABLE"] = disable
    # Run outside the repository so that only the installed package can be imported.
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          cwd=str(tmp_path) if tmp_path else None, timeout=120)


def _probe(disable, tmp_path):
    run = _run(disable, tmp_path=tmp_path)
    assert run.returncode == 0, run.stderr
    return json.loads(run.stdout)


@pytest.fixture(scope="module")
def baseline(tmp_path_factory):
    return _probe(None, tmp_path_factory.mktemp("baseline"))


def test_without_the_variable(baseline):
    result = baseline
    assert result["available"] == int(nk.get_capabilities())
    assert result["compiled"] == int(nk.get_capabilities("compiled"))
    assert result["cpu"] == int(nk.get_capabilities("cpu"))


@pytest.mark.parametrize("spec", ["skylake,icelake", "icelake,skylake", " SkyLake , ICELAKE ,", "SKYLAKE,,icelake",
                                  "\tskylake,\nicelake\n"],
                         ids=["plain", "reordered", "spaces-and-case", "empty-item", "tabs-newlines"])
def test_disable_removes_families(spec, baseline, tmp_path):
    result = _probe(spec, tmp_path)
    removed = int(nk.Capability.SKYLAKE | nk.Capability.ICELAKE)
    assert result["available"] == baseline["available"] & ~removed
    assert result["available"] & int(nk.Capability.SERIAL)
    # Only what calls may use changes; what was built and what the CPU supports do not.
    assert result["compiled"] == baseline["compiled"]
    assert result["cpu"] == baseline["cpu"]
    for name in ("SKYLAKE", "ICELAKE"):
        assert "not available" in result["refused"][name]
    # Scores stay exact with what remains.
    assert abs(result["score"] - result["serial"]) <= 1e-6 * max(1.0, abs(result["serial"]))


@pytest.mark.parametrize("family", [c for c in nk.Capability if c is not nk.Capability.SERIAL and c & nk.get_capabilities()],
                         ids=lambda c: c.name.lower())
def test_disable_each_available_family(family, tmp_path):
    result = _probe(family.name.lower(), tmp_path)
    assert result["available"] == int(nk.get_capabilities()) & ~int(family)
    assert family.name in result["refused"]


def test_disable_empty_changes_nothing(tmp_path):
    assert _probe("", tmp_path)["available"] == int(nk.get_capabilities())
    assert _probe(" , ", tmp_path)["available"] == int(nk.get_capabilities())


def test_disable_family_not_on_this_cpu_is_accepted(tmp_path):
    """Naming a valid family this machine lacks anyway is not an error."""
    missing = [c for c in nk.Capability if not c & nk.get_capabilities()]
    if not missing:
        pytest.skip("every family is available here")
    assert _probe(missing[0].name.lower(), tmp_path)["available"] == int(nk.get_capabilities())


@pytest.mark.parametrize("spec, bad", [("skylake,foo", "foo"), ("avx512", "avx512"), ("icelake;skylake", "icelake;skylake"),
                                       ("Bogus", "bogus")],
                         ids=["unknown-after-valid", "isa-name", "wrong-separator", "capitalized"])
def test_unknown_family_makes_import_fail(spec, bad, tmp_path):
    run = _run(spec, code="import numkong", tmp_path=tmp_path)
    assert run.returncode != 0
    assert "NUMKONG_DISABLE" in run.stderr
    assert bad in run.stderr


@pytest.mark.parametrize("spec", ["serial", "SERIAL", "skylake, serial"])
def test_serial_cannot_be_disabled(spec, tmp_path):
    run = _run(spec, code="import numkong", tmp_path=tmp_path)
    assert run.returncode != 0
    assert "serial" in run.stderr
    assert "NUMKONG_DISABLE" in run.stderr
