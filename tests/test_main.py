"""python -m numkong: --help and --version do not run the demo; --families and --json; the demo itself."""
import json
import subprocess
import sys

import numkong as nk


def run(*arguments, timeout=300):
    return subprocess.run([sys.executable, "-m", "numkong", *arguments], capture_output=True, text=True,
                          timeout=timeout)


def test_help_lists_the_options_and_does_not_score():
    result = run("--help", timeout=60)
    assert result.returncode == 0, result.stderr
    for option in ("--families", "--json", "--version"):
        assert option in result.stdout
    assert "Sample:" not in result.stdout and "OK:" not in result.stdout


def test_version():
    result = run("--version", timeout=60)
    assert result.returncode == 0 and result.stdout.strip() == f"numkong {nk.__version__}"


def test_unknown_option_is_an_error():
    result = run("--no-such-option", timeout=60)
    assert result.returncode == 2 and "unrecognized arguments" in result.stderr


def test_families_table_and_json():
    table = run("--families", timeout=60)
    assert table.returncode == 0, table.stderr
    assert "Sample:" not in table.stdout
    lines = {line.split()[0]: line for line in table.stdout.splitlines()[1:] if line.strip()}
    for capability in nk.Capability:
        assert capability.name.lower() in lines
    assert "sapphireamx" in lines and "AMX" in lines["sapphireamx"]
    listed = json.loads(run("--families", "--json", timeout=60).stdout)
    by_name = {row["family"]: row for row in listed["families"]}
    assert set(by_name) == {c.name.lower() for c in nk.Capability}
    for capability in nk.Capability:
        row = by_name[capability.name.lower()]
        assert row["bit"] == int(capability)
        assert row["available"] == bool(nk.get_capabilities() & capability)
        assert row["compiled"] == bool(nk.get_capabilities("compiled") & capability)


def test_demo_json_reports_every_available_family_exact():
    result = run("--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)  # the whole output is one JSON object
    assert report["ok"] is True and report["mismatches"] == []
    assert report["available"] == [c.name.lower() for c in nk.Capability if nk.get_capabilities() & c]
    implementations = {(r["implementation"], r["dtype"]) for r in report["results"]}
    for family in report["available"]:
        assert (family, "float32") in implementations and (family, "bfloat16") in implementations
    for row in report["results"]:
        assert row["max_abs_difference"] <= report["tolerance"] * max(1.0, abs(row["total_score"]))
