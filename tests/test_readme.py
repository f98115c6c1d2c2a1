"""Every fenced code block of the README runs as written, in order.

A fence's info string says how: ```python blocks run in one shared namespace, top to bottom;
```python needs-NAME blocks skip when the module NAME is not installed (later blocks must not use
their names); ```cython blocks are compiled against the installed package and imported; ```bash,
```console and ```text blocks are not run. Commands in the README are indented blocks, not fences.
"""
import os
import re

import pytest

from conftest import build_cython_extension

README = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "README.md")
FENCE = re.compile(r"^```([^\n`]*)\n(.*?)^```\s*$", re.M | re.S)
NOT_RUN = {"bash", "console", "text"}


def readme_blocks():
    with open(README, encoding="utf-8") as file:
        text = file.read()
    blocks = []
    for match in FENCE.finditer(text):
        words = match.group(1).split()
        line = text.count("\n", 0, match.start()) + 1
        blocks.append((line, words[0] if words else "", words[1:], match.group(2)))
    return blocks


BLOCKS = readme_blocks()
NAMESPACE = {}


def test_readme_has_python_blocks_and_only_known_fences():
    assert sum(1 for _, language, _, _ in BLOCKS if language == "python") >= 4
    for line, language, options, _ in BLOCKS:
        assert language in {"python", "cython"} | NOT_RUN, f"README.md:{line}: unknown fence {language!r}"
        assert all(option.startswith("needs-") for option in options), f"README.md:{line}: {options}"


EXTRAS = {"needs-torch", "needs-pylate"}  # packages only the slow tier installs: such blocks are self-contained


@pytest.mark.parametrize("line, language, options, code",
                         [pytest.param(*block, marks=[pytest.mark.extras] if EXTRAS & set(block[2]) else [])
                          for block in BLOCKS], ids=[f"line{b[0]}-{b[1]}" for b in BLOCKS])
def test_readme_block_runs(line, language, options, code, tmp_path):
    if language in NOT_RUN:
        pytest.skip(f"{language} block: not run")
    for option in options:
        pytest.importorskip(option[len("needs-"):], reason=f"README.md:{line} needs {option[len('needs-'):]}")
    if language == "python":
        exec(compile(code, f"README.md:{line}", "exec"), NAMESPACE)
        return
    module = build_cython_extension(code, "readme_block", tmp_path)
    # The README's example scores two packed matrices; the quickstart's q and d are in the namespace.
    q, d = NAMESPACE["q"], NAMESPACE["d"]
    assert module.score_many(q, d, 3) == __import__("numkong").maxsim_packed(q, d)
