"""A job's life (issue 21): one controller per job (the lease), an honest `status`, the history of every
run kept, cancelled items as their own count, grouped reasons, and commands refused on finished jobs."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from contract.results import ItemResult, ItemStatus
from controller.errors import UsageError
from controller.job.plan import Chunk, Plan, PlannedItem
from controller.run import control
from controller.run import job_lease as lease
from controller.run.chunks import ChunkRun
from controller.run.failures import ChunkState
from controller.run.lease import who
from controller.run.report import Failure, build_report, failure_lines, summary
from controller.run.rundir import Control, RunDir, Stage
from controller.run.status import describe, job_status
from tests.fakes import FakeSwarm
from tests.polling import until
from tests.unit.test_supervisor import make


def run_folder(root: Path, items: int = 4, per_chunk: int = 2, cancel: bool = False) -> RunDir:
    planned = tuple(PlannedItem(f"i{n:06d}", f"in/{n}.jpg", f"out/{n}.jpg", "image") for n in range(items))
    chunks = tuple(
        Chunk(f"c{c:04d}", tuple(p.id for p in planned[c * per_chunk : (c + 1) * per_chunk]))
        for c in range(items // per_chunk)
    )
    rd = RunDir(root, "j")
    job_file = b"name: j\nsource: faces/a.jpg\ntargets: [in/*.jpg]\noutput: out/{stem}{ext}\n"
    rd.create(job_file, Plan("j", planned, chunks), {}, Control(2, cancel=cancel), "sha256:x")
    return rd


def commit(rd: RunDir, chunk: str, *items: str, status: ItemStatus = ItemStatus.OK, reason: str | None = None) -> None:
    now = time.time()
    lines = "".join(
        ItemResult(i, status, 1, f"/data/in/{i}", None, reason, started=now, finished=now + 1).to_line() for i in items
    )
    path = rd.layout.results(chunk, 1)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as f:
        f.write(lines)


# -- 5. one controller per job ------------------------------------------------------------------------
def test_a_second_controller_is_told_who_runs_the_job_and_exits_69(tmp_path: Path) -> None:
    rd = run_folder(tmp_path)
    with lease.held(rd):
        with pytest.raises(lease.LeaseHeld) as e:
            lease.Lease(rd).acquire()
        assert e.value.exit_code == 69
        assert f"job j is being run by {who()} on {socket.gethostname()} since " in str(e.value)
        assert str(e.value).endswith("`ffswarm status j --follow` to watch it")
        info = json.loads(rd.layout.lease.read_text())
        assert set(info) >= {"owner", "host", "pid", "started", "heartbeat"}
    assert not rd.layout.lease.exists()  # released at the end
    with lease.held(rd):  # and free for the next controller
        pass


def test_the_lease_is_renewed_while_held_and_an_expired_one_is_taken_over(tmp_path: Path) -> None:
    rd = run_folder(tmp_path)
    with lease.held(rd, interval=0.05):
        first = lease.read(rd)
        assert first is not None
        until(lambda: (lease.read(rd) or first).heartbeat > first.heartbeat, "the lease to be renewed")
    stale = lease.Lease(rd, interval=0.05)
    stale.acquire()  # never renewed: its controller was killed
    time.sleep(0.3)
    taker = lease.Lease(rd)
    taker.acquire()  # expired: taken over
    assert (lease.read(rd) or stale).owner.id == taker.owner.id
    assert not stale.renew() and stale.lost  # the old holder finds out and stops


def test_a_lease_left_by_a_dead_process_on_this_host_is_taken_over_at_once(tmp_path: Path) -> None:
    rd = run_folder(tmp_path)
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    gone = lease.Lease(rd)
    gone.acquire()
    info = json.loads(rd.layout.lease.read_text())
    rd.layout.lease.write_text(json.dumps({**info, "pid": int(dead.stdout)}))  # SIGKILLed
    assert lease.holder(rd) is None
    lease.Lease(rd).acquire()


def test_a_forged_lease_from_the_future_keeps_no_controller_out(tmp_path: Path) -> None:
    rd = run_folder(tmp_path)
    forged = {"owner": "x", "host": "elsewhere", "pid": 1, "started": 0, "heartbeat": time.time() + 10**9,
              "interval": 5, "token": "t"}  # fmt: skip
    rd.layout.lease.write_text(json.dumps(forged))
    assert lease.holder(rd) is None
    lease.Lease(rd).acquire()


# -- 6. honest status -----------------------------------------------------------------------------------
def test_status_tells_a_running_controller_from_none(tmp_path: Path) -> None:
    rd = run_folder(tmp_path)
    rd.enter(Stage.CHUNKS)
    row = job_status(rd)
    assert row["phase"] == "stopped" and row["controller"] is None
    assert describe(row).startswith("j: stopped: no controller — `ffswarm resume j` · items 0/4 done")
    with lease.held(rd):
        row = job_status(rd)
        assert row["phase"] == "running" and row["controller"]["host"] == socket.gethostname()
        assert describe(row).startswith(f"j: running (chunks; controller on {socket.gethostname()}) · ")


def test_a_stack_path_job_whose_items_are_all_committed_reads_finished(tmp_path: Path) -> None:
    rd = run_folder(tmp_path)  # render: no controller, no stage, no report; the stack's runners commit
    commit(rd, "c0000", "i000000", "i000001")
    assert job_status(rd)["phase"] == "running"
    commit(rd, "c0001", "i000002", "i000003")
    row = job_status(rd)
    assert row["phase"] == "finished" and row["items"]["pending"] == 0


# -- 2. history kept ------------------------------------------------------------------------------------
def test_a_second_run_appends_to_the_first_runs_chunk_records(tmp_path: Path) -> None:
    swarm = FakeSwarm()
    sup, _ = make(tmp_path, swarm)
    sup.run(["c0000", "c0001", "c0002"])
    again, _ = make(tmp_path / "x", swarm)  # a fresh controller on the same run folder
    again.rundir = sup.rundir
    again.run(["c0002"])  # a resume: only what was pending
    chunks = (sup.rundir.state() or {})["chunks"]
    assert sorted(chunks) == ["c0000", "c0001", "c0002"]  # the first run's chunks are kept
    assert [a["attempt"] for a in chunks["c0002"]["attempts"]] == [1, 2]  # appended, not overwritten


def test_the_report_and_status_show_every_run_after_a_retry_with_nothing_to_do(tmp_path: Path) -> None:
    rd = run_folder(tmp_path)
    commit(rd, "c0000", "i000000", "i000001")
    commit(rd, "c0001", "i000002", "i000003")
    first = {"c0000": ChunkRun("c0000", state=ChunkState.DONE), "c0001": ChunkRun("c0001", state=ChunkState.DONE)}
    rd.write_state({cid: r.as_dict() | {"attempts": [{"attempt": 1, "node": "n1"}]} for cid, r in first.items()})
    report = build_report(rd.plan(), rd, {}, "sha256:x", 1.0)  # `retry`: no chunk pending, none run
    assert sorted(report.chunks) == ["c0000", "c0001"] and report.counts.chunks_done == 2
    row = job_status(rd)
    assert row["attempts"] == 2 and row["nodes"] == ["n1"] and row["chunks"]["done"] == 2


def test_chunks_of_a_stack_are_described_from_their_runners_records(tmp_path: Path) -> None:
    rd = run_folder(tmp_path)
    rd.layout.logs_dir.mkdir(parents=True, exist_ok=True)
    (rd.layout.logs_dir / "c0000.a1.log").write_text("")
    commit(rd, "c0000", "i000000", "i000001")
    row = job_status(rd)
    assert row["chunks"].get("done") == 1 and row["attempts"] == 1


# -- 7. cancelled items are their own count; reasons grouped -------------------------------------------
def test_cancelled_items_are_counted_apart_from_failed_ones(tmp_path: Path) -> None:
    rd = run_folder(tmp_path, cancel=True)
    commit(rd, "c0000", "i000000", "i000001")
    runs = {"c0001": ChunkRun("c0001", state=ChunkState.CANCELLED)}
    report = build_report(rd.plan(), rd, runs, "sha256:x", 1.0)
    assert (report.counts.ok, report.counts.failed, report.counts.cancelled) == (2, 0, 2)
    assert report.failures == () and report.exit_code() == 1
    lines = summary(report, "runs/j/report.json")
    assert lines[0] == "job j: 2 ok, 0 without a face, 0 failed, 2 cancelled of 4 items; report: runs/j/report.json"
    assert lines[1] == "cancelled: 2 item(s) not run; `ffswarm resume j` runs them"
    assert not any(line.startswith("failed:") for line in lines)
    row = job_status(rd)
    assert row["items"]["cancelled"] == 2 and row["items"]["pending"] == 0 and row["items"]["failed"] == 0
    assert "2 cancelled, 0 pending" in describe(row)
    data = report.to_dict()
    assert data["started_at"].startswith("1970-01-01") or data["started_at"][:4] == "1969"  # RFC 3339 beside
    assert data["finished_at"][4] == "-" and "T" in data["finished_at"]


def test_failures_are_grouped_by_reason_with_the_first_paths() -> None:
    same = tuple(
        Failure(f"i{n:06d}", f"in/{n}.jpg", f"cannot write output: out/{n}.jpg: Permission denied", "c0000")
        for n in range(14)
    )
    for f in same:  # the reason names the output, not the input: grouped by what stays the same
        object.__setattr__(f, "reason", f"in/{f.input[3:]}: cannot write output: Permission denied")
    odd = Failure("i000100", "in/x.jpg", "in/x.jpg: not an image", "c0001")
    lines = failure_lines((*same, odd))
    assert lines == [
        "failed: 14 × cannot write output: Permission denied: in/0.jpg, in/1.jpg, in/2.jpg … and 11 more; "
        "see report.json",
        "failed: in/x.jpg: in/x.jpg: not an image",
    ]
    many = tuple(Failure(f"i{n}", f"in/{n}.jpg", f"reason {n}", None) for n in range(10_000))
    assert len(failure_lines(many, 20)) == 21  # a screen, not 10,000 lines


# -- 4. commands on finished jobs ----------------------------------------------------------------------
def test_cancel_and_scale_of_a_finished_job_are_refused(tmp_path: Path) -> None:
    from controller.config import parse_config

    config = parse_config(tmp_path / "ffswarm.yaml", {"data_root": str(tmp_path), "runner_user": "10001:10001"})
    rd = run_folder(tmp_path)
    commit(rd, "c0000", "i000000", "i000001")
    commit(rd, "c0001", "i000002", "i000003")
    rd.enter(Stage.ENDED)
    rd.write_report({"job": "j"})
    swarm = FakeSwarm()
    for refused in (lambda: control.cancel(config, "j", swarm), lambda: control.scale(config, "j", 3)):
        with pytest.raises(UsageError, match=r"^job j already finished") as e:
            refused()
        assert e.value.exit_code == 2
    assert rd.control() == Control(2) and job_status(rd)["phase"] == "finished"


def test_cancel_of_a_job_that_runs_is_accepted(tmp_path: Path) -> None:
    from controller.config import parse_config

    config = parse_config(tmp_path / "ffswarm.yaml", {"data_root": str(tmp_path), "runner_user": "10001:10001"})
    rd = run_folder(tmp_path)
    rd.enter(Stage.CHUNKS)
    with lease.held(rd):
        assert control.cancel(config, "j", FakeSwarm()) == 0
    assert rd.control().cancel


def test_the_lease_file_is_the_controllers_not_the_runners(tmp_path: Path) -> None:
    rd = run_folder(tmp_path)
    with lease.held(rd):
        assert rd.layout.lease.stat().st_uid == os.geteuid()
