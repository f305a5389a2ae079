"""`ffswarm status`: what a person reads about a job, from its run folder alone."""

from __future__ import annotations

import json
import time
from pathlib import Path

from contract.manifest import Segment
from contract.results import ItemResult, ItemStatus
from controller.job.plan import Chunk, Plan, PlannedItem, PlannedVideo
from controller.run.rundir import Control, RunDir
from controller.run.status import describe, job_status


def result(item: str, status: ItemStatus, started: float) -> str:
    return ItemResult(
        item=item,
        status=status,
        attempt=1,
        input=f"/data/in/{item}",
        output=None,
        started=started,
        finished=started + 1.0,
    ).to_line()


def image_run(tmp_path: Path) -> RunDir:
    items = tuple(PlannedItem(f"i{n:06d}", f"in/{n}.jpg", f"out/{n}.jpg", "image") for n in range(4))
    plan = Plan("j", items, (Chunk("c0000", ("i000000", "i000001")), Chunk("c0001", ("i000002", "i000003"))))
    rd = RunDir(tmp_path, "j")
    rd.create(b"name: j\n", plan, {}, Control(2), "sha256:x")
    return rd


def test_a_running_job_counts_items_and_estimates_the_rest(tmp_path: Path) -> None:
    rd = image_run(tmp_path)
    now = time.time()
    (rd.path / "results" / "c0000.jsonl").write_text(
        result("i000000", ItemStatus.OK, now) + result("i000001", ItemStatus.ERROR, now + 1)
    )
    rd.write_state(
        {
            "c0000": {"state": "done", "attempts": [{"node": "n1"}]},
            "c0001": {"state": "running", "attempts": [{"node": "n2"}]},
        }
    )
    s = job_status(rd)
    assert s["phase"] == "running"
    assert s["items"] == {"total": 4, "ok": 1, "no_face": 0, "failed": 1, "cancelled": 0, "pending": 2}
    assert s["chunks"] == {"total": 2, "done": 1, "running": 1}
    assert s["nodes"] == ["n1", "n2"] and s["attempts"] == 2
    assert s["eta_seconds"] == 2  # 2 items took 2 s, 2 remain
    assert "items 1/4 done, 1 failed, 2 pending" in describe(s)


def test_finished_and_cancelled_phases(tmp_path: Path) -> None:
    rd = image_run(tmp_path)
    now = time.time()
    for chunk, ids in (("c0000", ("i000000", "i000001")), ("c0001", ("i000002", "i000003"))):
        (rd.path / "results" / f"{chunk}.jsonl").write_text("".join(result(i, ItemStatus.OK, now) for i in ids))
    rd.write_report({"job": "j"})
    assert job_status(rd)["phase"] == "finished"
    rd.write_control(Control(2, cancel=True))
    assert job_status(rd)["phase"] == "cancelled"


def test_a_video_counts_once_and_its_segments_separately(tmp_path: Path) -> None:
    seg = Segment(start_frame=0, frame_count=25, fps="25/1", width=64, height=64, timescale=12800)
    items = (
        PlannedItem("i000000", "in/a.jpg", "out/a.jpg", "image"),
        PlannedItem("i000001", "clips/v.mp4", "runs/j/segments/i000001.mp4", "segment", parent="v000000", segment=seg),
        PlannedItem("i000002", "clips/v.mp4", "runs/j/segments/i000002.mp4", "segment", parent="v000000", segment=seg),
    )
    videos = (PlannedVideo("v000000", "clips/v.mp4", "out/v.mp4", ("i000001", "i000002")),)
    plan = Plan("j", items, (Chunk("c0000", ("i000000", "i000001", "i000002")),), videos)
    rd = RunDir(tmp_path, "j")
    rd.create(b"name: j\n", plan, {}, Control(2), "sha256:x")
    now = time.time()
    (rd.path / "results" / "c0000.jsonl").write_text(
        "".join(result(i, ItemStatus.OK, now) for i in ("i000000", "i000001", "i000002"))
    )
    s = job_status(rd)
    assert s["items"]["total"] == 2 and s["items"]["ok"] == 1 and s["items"]["pending"] == 1  # not joined yet
    assert s["segments"] == {"total": 2, "done": 2}
    (rd.path / "joins.jsonl").write_text(result("v000000", ItemStatus.OK, now))
    assert job_status(rd)["items"]["ok"] == 2
    assert "video segments 2/2" in describe(job_status(rd))
    assert json.loads(json.dumps(s))  # --json output is plain data
