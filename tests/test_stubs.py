"""The type stubs, the Cython .pxd and the C header agree with the runtime on every name."""
import ast
import os
import re

import numkong as nk

PACKAGE = os.path.dirname(nk.__file__)


def _stub_tree():
    with open(os.path.join(PACKAGE, "__init__.pyi")) as file:
        return ast.parse(file.read())


def test_stub_functions_and_classes_match_runtime():
    tree = _stub_tree()
    stubbed = {node.name for node in tree.body if isinstance(node, (ast.FunctionDef, ast.ClassDef))}
    public = {name for name in nk.__all__ if callable(getattr(nk, name)) and not name.startswith("float")
              and name != "bfloat16"}
    assert stubbed == public


def test_stub_class_members_exist_at_runtime():
    for node in _stub_tree().body:
        if isinstance(node, ast.ClassDef) and node.name != "Capability":
            members = {item.name for item in node.body if isinstance(item, ast.FunctionDef)}
            for member in members - {"__buffer__"}:
                assert hasattr(getattr(nk, node.name), member), f"{node.name}.{member}"
    assert {c.name for c in nk.Capability} == {
        target.id for node in _stub_tree().body if isinstance(node, ast.ClassDef) and node.name == "Capability"
        for item in node.body if isinstance(item, ast.Assign) for target in item.targets}


def test_packed_classes_expose_exactly_the_stubbed_members():
    # Cython `cdef readonly` fields become Python attributes: one that is not in the stub (and the
    # spec) would be public API by accident.
    for node in _stub_tree().body:
        if isinstance(node, ast.ClassDef) and node.name.startswith("MaxSimPacked"):
            stubbed = {item.name for item in node.body if isinstance(item, ast.FunctionDef)}
            runtime = {name for name in dir(getattr(nk, node.name)) if not name.startswith("_")}
            assert runtime == {name for name in stubbed if not name.startswith("_")}, node.name


def test_stub_signatures_match_runtime_parameters():
    import inspect
    for node in _stub_tree().body:
        if isinstance(node, ast.FunctionDef) and node.name.startswith("maxsim"):
            runtime = inspect.signature(getattr(nk, node.name))
            stub = [a.arg for a in node.args.posonlyargs + node.args.args + node.args.kwonlyargs]
            assert list(runtime.parameters) == stub, node.name
            kinds = {name: p.kind for name, p in runtime.parameters.items()}
            assert [a.arg for a in node.args.kwonlyargs] == [
                n for n, k in kinds.items() if k == inspect.Parameter.KEYWORD_ONLY], node.name


def test_pxd_declares_only_names_of_the_c_header():
    with open(os.path.join(nk.get_include(), "numkong", "maxsim.h")) as file:
        header = file.read()
    with open(os.path.join(PACKAGE, "_maxsim.pxd")) as file:
        pxd = file.read()
    declared = set(re.findall(r"\b(nk_[a-z0-9_]+)\b", pxd))
    cython_only = {"nk_status_t", "nk_maxsim_info_t", "nk_corpus_info_t"}  # typedef names, also in the header
    missing = {name for name in declared if name not in header}
    assert not missing, f"names in _maxsim.pxd that the C header lacks: {sorted(missing)}"
    assert cython_only <= set(re.findall(r"\b(nk_[a-z0-9_]+)\b", header))
    for function in re.findall(r"^\s*(?:nk_status_t|uint64_t|void|size_t|void \*)\s*\*?\s*(nk_\w+)\(", pxd, re.M):
        assert re.search(rf"\b{function}\(", header), function
