"""Job control (controller/run/control.py): a job's width and cancel flag change one at a time, the
other kept, and a retry hands the job's own frozen file back to `serve`."""

from __future__ import annotations

from pathlib import Path

import pytest

from controller.errors import UsageError
from controller.job.plan import Chunk, Plan, PlannedItem
from controller.run import control
from controller.run.rundir import Control, RunDir

ROOT = Path(__file__).resolve().parents[2]
JOB_FILE = b"name: j\nsource: a.jpg\ntargets: [in]\noutput: out\n"


def run_folder(tmp_path: Path, width: int = 2, cancel: bool = False) -> RunDir:
    items = (PlannedItem("i000000", "in/0.jpg", "out/0.jpg", "image"),)
    rd = RunDir(tmp_path, "j")
    rd.create(JOB_FILE, Plan("j", items, (Chunk("c0000", ("i000000",)),)), {}, Control(width, cancel), "sha256:x")
    return rd


def test_scaling_keeps_a_cancel_and_cancelling_keeps_the_width(tmp_path: Path) -> None:
    rd = run_folder(tmp_path, width=2, cancel=True)
    control.set_width(rd, 5)
    assert rd.control() == Control(5, cancel=True)
    control.uncancel(rd)
    control.flag_cancel(rd)
    assert rd.control() == Control(5, cancel=True)


def test_uncancel_says_whether_the_job_was_cancelled(tmp_path: Path) -> None:
    rd = run_folder(tmp_path, width=3, cancel=True)
    assert control.uncancel(rd) is True
    assert rd.control() == Control(3)
    assert control.uncancel(rd) is False
    assert rd.control() == Control(3)


def test_a_retry_hands_the_frozen_job_file_back_uncancelled(tmp_path: Path) -> None:
    rd = run_folder(tmp_path, width=4, cancel=True)
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    control.hand_back(rd, inbox, rd.read_job_file())
    assert (inbox / "j.yaml").read_bytes() == JOB_FILE
    assert rd.control() == Control(4)
    with pytest.raises(UsageError, match="appeared while handing the job over"):
        control.hand_back(rd, inbox, b"name: other\n")
    assert (inbox / "j.yaml").read_bytes() == JOB_FILE


def test_control_json_has_one_writer() -> None:
    """The CLI and the API change a running job only through controller/run/control.py; the run
    folder's creation writes the first control.json."""
    allowed = {"controller/run/control.py", "controller/run/rundir.py"}
    writers = sorted(
        str(p.relative_to(ROOT))
        for p in (ROOT / "controller").rglob("*.py")
        if "write_control(" in p.read_text() and str(p.relative_to(ROOT)) not in allowed
    )
    assert not writers, f"control.json is written only by controller/run/control.py, not by {writers}"
