"""Packaging hygiene of the installed distribution and the repository: the license file matches the
declared license, project URLs, the changelog, and the cibuildwheel platforms."""
import importlib.metadata
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def read(name):
    with open(os.path.join(ROOT, name), encoding="utf-8") as file:
        return file.read()


def pyproject():
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as file:
        return tomllib.load(file)


def test_license_file_is_the_apache_license_2_0_and_ships_in_the_wheel():
    text = read("LICENSE")
    assert text.split()[:4] == ["Apache", "License", "Version", "2.0,"]
    assert "TERMS AND CONDITIONS FOR USE, REPRODUCTION, AND DISTRIBUTION" in text
    assert "END OF TERMS AND CONDITIONS" in text
    assert pyproject()["project"]["license"] == "Apache-2.0"
    metadata = importlib.metadata.metadata("numkong")
    assert metadata["License-Expression"] == "Apache-2.0"
    shipped = [f for f in importlib.metadata.files("numkong") if f.name == "LICENSE"]
    assert shipped and shipped[0].read_text() == text


def test_project_urls_and_changelog():
    urls = dict(url.split(", ", 1) for url in importlib.metadata.metadata("numkong").get_all("Project-URL"))
    assert {"Source", "Issues", "Changelog"} <= set(urls)
    changelog = read("CHANGELOG.md")
    version = importlib.metadata.version("numkong")
    assert "## Unreleased" in changelog and f"## {version}" in changelog


def test_optional_modules_are_installed():
    import numkong.pylate  # noqa: F401  (installed by meson's install_sources)
    files = {str(f) for f in importlib.metadata.files("numkong")}
    assert "numkong/pylate.py" in files


def test_cibuildwheel_builds_every_release_platform():
    config = pyproject()["tool"]["cibuildwheel"]
    assert set(config["linux"]["archs"]) == {"x86_64", "aarch64"}
    assert config["linux"]["musllinux-x86_64-image"] and config["linux"]["manylinux-aarch64-image"]
    assert set(config["macos"]["archs"]) == {"arm64", "x86_64"}
    assert config["windows"]["archs"] == ["AMD64"]
    assert "pytest" in config["test-command"] and config["test-extras"] == ["test"]
