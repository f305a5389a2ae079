"""The one fold of a run folder (controller/run/fold.py) and what is built on it: the pending chunks,
`status`'s counts, the typed report and the one end-of-job summary."""

from __future__ import annotations

import json
import socket
from pathlib import Path

from contract.manifest import Segment
from contract.results import ItemResult, ItemStatus
from controller.job.plan import Chunk, Plan, PlannedItem, PlannedVideo
from controller.run import job_lease as lease
from controller.run.chunks import ChunkRun
from controller.run.failures import ChunkState
from controller.run.fold import Fold, committed
from controller.run.report import Report, build_report, summary
from controller.run.rundir import Control, RunDir, Stage
from controller.run.status import describe, job_status

SEG = Segment(start_frame=0, frame_count=25, fps="25/1", width=64, height=64, timescale=12800)


def line(item: str, status: ItemStatus, attempt: int = 1, output: str | None = None) -> str:
    return ItemResult(item, status, attempt, f"/data/in/{item}", output, started=10.0, finished=11.0).to_line()


def run_folder(tmp_path: Path) -> RunDir:
    """Four images in two chunks and one video of two segments in a third."""
    items = (
        *(PlannedItem(f"i00000{n}", f"in/{n}.jpg", f"out/{n}.jpg", "image") for n in range(4)),
        PlannedItem("i000004", "in/v.mp4", "runs/j/segments/i000004.mp4", "segment", parent="v000000", segment=SEG),
        PlannedItem("i000005", "in/v.mp4", "runs/j/segments/i000005.mp4", "segment", parent="v000000", segment=SEG),
    )
    chunks = (Chunk("c0000", ("i000000", "i000001")), Chunk("c0001", ("i000002", "i000003")))
    plan = Plan("j", items, (*chunks, Chunk("c0002", ("i000004", "i000005"))), (
        PlannedVideo("v000000", "in/v.mp4", "out/v.mp4", ("i000004", "i000005")),
    ))  # fmt: skip
    rd = RunDir(tmp_path, "j")
    rd.create(b"name: j\n", plan, {}, Control(2), "sha256:pinned")
    return rd


def write(rd: RunDir, chunk: str, *lines: str) -> None:
    with (rd.path / "results" / f"{chunk}.jsonl").open("a") as f:
        f.write("".join(lines))


def test_one_rule_for_done_ok_and_no_face_are_committed_an_error_is_pending(tmp_path: Path) -> None:
    rd = run_folder(tmp_path)
    write(rd, "c0000", line("i000000", ItemStatus.OK, output="/data/out/0.jpg"), line("i000001", ItemStatus.NO_FACE))
    write(rd, "c0001", line("i000002", ItemStatus.OK), line("i000003", ItemStatus.ERROR))
    write(rd, "c0002", line("i000004", ItemStatus.OK))  # the video's second segment has no result yet
    fold = Fold.read(rd.plan(), rd)
    assert [fold.committed(i) for i in ("i000000", "i000001", "i000002", "i000003", "i000004", "i000005")] == [
        True, True, True, False, True, False,
    ]  # fmt: skip
    assert fold.pending_chunks() == ["c0001", "c0002"]
    assert fold.user_counts() == {"ok": 2, "no_face": 1, "error": 1}  # the video is not ended: not counted
    assert fold.user_total() == 5 and fold.segments() == (2, 1)
    assert not committed(None)

    write(rd, "c0001", line("i000003", ItemStatus.OK, attempt=2))  # a later attempt supersedes the error
    write(rd, "c0002", line("i000005", ItemStatus.OK))
    assert Fold.read(rd.plan(), rd).pending_chunks() == []


def test_status_and_the_report_count_what_the_fold_says(tmp_path: Path) -> None:
    rd = run_folder(tmp_path)
    write(rd, "c0000", line("i000000", ItemStatus.OK, output="/data/out/0.jpg"), line("i000001", ItemStatus.NO_FACE))
    write(rd, "c0001", line("i000002", ItemStatus.ERROR))
    row = job_status(rd)
    assert row["items"] == {"total": 5, "ok": 1, "no_face": 1, "failed": 1, "cancelled": 0, "pending": 2}
    runs = {"c0001": ChunkRun("c0001", state=ChunkState.FAILED, reason="runner exit 65")}
    report = build_report(rd.plan(), rd, runs, "sha256:pinned", 1.0)
    assert (report.counts.ok, report.counts.no_face, report.counts.failed, report.counts.items) == (1, 1, 3, 5)
    assert [f.item for f in report.failures] == ["i000002", "i000003", "v000000"]
    assert report.exit_code() == 1


def test_the_report_round_trips_through_report_json_in_the_same_shape(tmp_path: Path) -> None:
    rd = run_folder(tmp_path)
    write(rd, "c0000", line("i000000", ItemStatus.OK, output="/data/out/0.jpg"))
    report = build_report(rd.plan(), rd, {"c0000": ChunkRun("c0000", state=ChunkState.DONE)}, "sha256:p", 1.0)
    data = report.to_dict()
    assert set(data) == {
        "job", "image", "started", "finished", "started_at", "finished_at", "counts", "failures", "items", "chunks",
        "usage",
    }  # fmt: skip
    assert set(data["counts"]) == {
        "items", "ok", "no_face", "failed", "chunks", "chunks_done", "chunks_failed", "chunks_cancelled",
        "cancelled", "segments",
    }  # fmt: skip
    assert set(data["failures"][0]) == {"item", "input", "reason", "chunk"}
    assert set(data["items"]["i000000"]) == {"input", "output", "status", "reason", "chunk"}
    assert data["items"]["i000000"]["output"] == "out/0.jpg"
    video = data["items"]["v000000"]
    assert video["kind"] == "video" and video["segments"] == 2 and "info" in video
    rd.write_report(data)
    again = Report.from_dict(json.loads(rd.layout.report.read_text()))
    assert again == Report.from_dict(data) and again.to_dict() == json.loads(json.dumps(data))


def test_one_summary_for_a_terminal_and_for_an_inbox_reason_file(tmp_path: Path) -> None:
    rd = run_folder(tmp_path)
    write(rd, "c0000", line("i000000", ItemStatus.OK, output="/data/out/0.jpg"), line("i000001", ItemStatus.ERROR))
    report = build_report(rd.plan(), rd, {}, "sha256:p", 1.0)
    one, *shared, video = [f"failed: {f.input}: {f.reason}" for f in report.failures]
    # the two items of chunk c0001 fail for one reason: one line counts and names them
    failed = [one, "failed: 2 × no result recorded by chunk c0001: in/2.jpg, in/3.jpg", video]
    assert len(shared) == 2
    assert summary(report, "runs/j/report.json", max_failures=2) == [
        "job j: 1 ok, 0 without a face, 4 failed of 5 items; report: runs/j/report.json",
        *failed[:2],
        "… and 1 more failed item(s) for other reasons; see report.json",
    ]
    lines = summary(report, "/srv/runs/j/report.json", Path("/srv"), "default")
    assert lines == [
        "job j: 1 ok, 0 without a face, 4 failed of 5 items in 3 chunks",
        "outputs: /srv/out",
        *failed,
        "model pack: default",
        "report: /srv/runs/j/report.json",
    ]


def test_status_reads_the_stage_the_controller_recorded(tmp_path: Path) -> None:
    rd = run_folder(tmp_path)
    rd.write_state({"c0000": {"state": "running", "attempts": [{"node": "n1"}]}})
    assert job_status(rd)["phase"] == "running" and job_status(rd)["stage"] is None  # an older controller's
    rd.enter(Stage.CHUNKS)
    state = rd.state() or {}
    assert state["stage"] == "chunks" and state["chunks"]["c0000"]["state"] == "running"  # records kept
    rd.write_report({"job": "j"})  # a retry's old report: the recorded stage says the job runs again
    assert job_status(rd)["phase"] == "stopped"  # ... but no controller holds its lease: nothing runs it
    with lease.held(rd):
        row = job_status(rd)
        assert row["phase"] == "running" and row["stage"] == "chunks"
        assert describe(row).startswith(f"j: running (chunks; controller on {socket.gethostname()}) · items")
    rd.enter(Stage.ENDED)
    assert job_status(rd)["phase"] == "stopped" and job_status(rd)["stage"] is None  # items still pending


def test_unreadable_result_lines_are_counted_in_the_report_and_said_in_the_summary(tmp_path: Path) -> None:
    """A runner's torn or garbage lines are dropped by the reader but never hidden: report.json counts
    them per chunk and the end-of-job summary warns."""
    rd = run_folder(tmp_path)
    write(rd, "c0000", line("i000000", ItemStatus.OK, output="/data/out/0.jpg"), "{torn\n", "not json\n")
    report = Report.from_dict(json.loads(build_report(rd.plan(), rd, {}, "sha256:p", 1.0).to_json()))
    assert report.to_dict()["dropped_result_lines"] == {"c0000": 2}
    assert report.items["i000000"].status == "ok"
    assert "warning: 2 runner result line(s) could not be read (chunks c0000); see report.json" in summary(
        report, rd.layout.report
    )
