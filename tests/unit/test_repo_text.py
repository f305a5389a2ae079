"""The repository's own text files hold no merge left-overs: a conflict marker in a doc or a script
reads as gibberish to a user and, in code, breaks it."""

from __future__ import annotations

import re
import subprocess
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
