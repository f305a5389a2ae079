"""The repository's own text: no merge left-overs (a conflict marker in a doc or a script reads as
gibberish to a user and, in code, breaks it), and no issue numbers in the product code's docstrings
and comments (a reader of the code has the code, not the tracker)."""

from __future__ import annotations

import ast
import io
import re
import subprocess
import tokenize
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MARKER = re.compile(rb"^(<{7} |>{7} |={7}$)", re.M)


def test_no_tracked_text_file_holds_a_merge_conflict_marker() -> None:
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    found = []
    for name in filter(None, listed.decode().split("\0")):
        path = ROOT / name
        if path.suffix in {".png", ".jpg", ".onnx", ".zip", ".mp4"} or not path.is_file():
            continue
        data = path.read_bytes()
        if b"\0" not in data[:8192] and MARKER.search(data):
            found.append(name)
    assert not found, f"merge conflict markers in: {found}"


# -- docstrings and comments of product code say what and why, not which ticket -------------------------
PRODUCT = ("contract", "controller", "runner_image")
# "#31", "(#31)", "issue 31", "issues #16 and 18"; not a fragment (docs/x.md#s2), an entity (&#39;) or a
# colour written after a word (color:#000)
TICKET = re.compile(r"(?<![\w/.&:#-])#\d+\b|\bissues?\s+#?\d+", re.I)


def prose(source: str) -> Iterator[tuple[int, str]]:
    """(line, text) of every comment and docstring (a string standing alone as a statement) in ``source``."""
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            yield token.start[0], token.string.lstrip("#")
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            yield node.lineno, node.value.value


def tickets(source: str) -> list[tuple[int, str]]:
    return [(line, m.group()) for line, text in prose(source) for m in TICKET.finditer(text)]


def test_product_code_names_no_issue_numbers_in_its_docstrings_or_comments() -> None:
    found = [
        f"{path.relative_to(ROOT)}:{line}: {hit}"
        for package in PRODUCT
        for path in sorted((ROOT / package).rglob("*.py"))
        for line, hit in tickets(path.read_text())
    ]
    assert not found, "say what and why instead (the issue's number means nothing to a reader):\n" + "\n".join(found)


def test_the_ticket_finder() -> None:
    source = (
        '"""Fenced at plan time (issue 16)."""\n'
        "x = 1  # see #31\n"
        "def f():\n"
        '    """Pairs (Issues #18)."""\n'
        "    return '#32 in a string literal is data'  # docs/api.md#config, &#39;, color:#000\n"
    )
    assert tickets(source) == [(2, "#31"), (1, "issue 16"), (4, "Issues #18")]
