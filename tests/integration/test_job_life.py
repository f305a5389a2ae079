"""A job's life on the real swarm (issue 21, points 2-7): the history of every run kept across Ctrl-C,
resume and a retry with nothing to do; a cancelled job continued by `resume` and by `submit` of its
file without redoing what was done; commands refused on a finished job; one controller per job (the
lease), taken over at once from a killed one; an honest `status`; cancelled items counted apart."""

from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import socket
import subprocess
from typing import Any

import pytest

from controller.swarm.docker import DockerSwarm
from tests.integration.conftest import ServiceWatch, Workspace, assert_committed_once
from tests.integration.test_operating import make_job, popen_submit, report_of, wait_for

pytestmark = pytest.mark.integration


def status_of(ws: Workspace) -> dict[str, Any]:
    proc = ws.ffswarm("status", ws.job, "-o", "json")
    assert proc.returncode == 0, proc.stderr[-2000:]
    row = json.loads(proc.stdout)  # the job's status object, as GET /v1/jobs/{job} answers it
    assert isinstance(row, dict)
    return row


def status_line(ws: Workspace) -> str:
    proc = ws.ffswarm("status", ws.job)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout.strip()


def committed(ws: Workspace, chunk: str, attempt: int, lines: int) -> bool:
    path = ws.root / "runs" / ws.job / "results" / f"{chunk}.a{attempt}.jsonl"
    return path.exists() and path.read_text().count("\n") >= lines


def fingerprints(ws: Workspace) -> dict[str, tuple[int, str]]:
    """Each output now: its mtime (ns) and sha256."""
    return {
        p.name: (p.stat().st_mtime_ns, hashlib.sha256(p.read_bytes()).hexdigest())
        for p in sorted((ws.dir / "out").glob("*.jpg"))
    }


def attempts_of(chunks: dict[str, Any]) -> dict[str, list[tuple[int, str]]]:
    return {cid: [(a["attempt"], a["outcome"]) for a in rec["attempts"]] for cid, rec in chunks.items()}


def finish(proc: subprocess.Popen[str], timeout: float = 120) -> tuple[int, str, str]:
    """Exit code, stdout and stderr of a controller run in the background."""
    out, err = proc.communicate(timeout=timeout)
    return proc.returncode, out, err


# -- 2 and 6: Ctrl-C, resume, a retry with nothing to do; the history of every run is kept --------------
def test_history_of_every_run_survives_ctrl_c_resume_and_an_idle_retry(
    workspace: Workspace, swarm: DockerSwarm, fault_image: str
) -> None:
    ws = workspace
    faults = {"*": {"*": {"sleep": 2}}, "c0000": {"1": {"exit": 70}}}  # c0000's first attempt fails
    job = make_job(ws, 6, fault_image, faults=faults, chunk_size=2, max_concurrent=1, retries=2)
    with ServiceWatch(swarm, ws.job) as watch:
        proc = popen_submit(ws, "submit", str(job))
        # c0000 failed once and waits for its retry behind the others: c0001 done, c0002 running
        wait_for(lambda: committed(ws, "c0001", 1, 2), 120, "c0001 committed")
        wait_for(lambda: any("-c0002-" in s for s in watch.specs), 30, "chunk c0002 started")
        proc.send_signal(signal.SIGINT)
        code, _, err = finish(proc, 60)
    assert code == 130, err[-2000:]
    assert f"Continue with: ffswarm resume {ws.job}" in err

    # nothing runs the job now, and status says so (not "running · … ETA")
    assert f"stopped: no controller — `ffswarm resume {ws.job}`" in status_line(ws), err[-6000:]
    assert status_of(ws)["phase"] == "stopped" and status_of(ws)["controller"] is None

    resumed = ws.ffswarm("resume", ws.job)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    report = report_of(ws)
    assert report["counts"]["ok"] == 6
    # the first run's chunks and attempts are in the report beside what the resume ran: c0000's first
    # attempt (interrupted run) and its second (the resume), c0001 run by the first run alone
    assert attempts_of(report["chunks"]) == {
        "c0000": [(1, "internal"), (2, "done")],
        "c0001": [(1, "done")],
        "c0002": [(1, "done")],
    }
    nodes = {a["node"] for rec in report["chunks"].values() for a in rec["attempts"]}
    assert len(nodes) == 1 and None not in nodes, report["chunks"]  # every attempt names its node
    row = status_of(ws)
    assert row["phase"] == "finished"
    assert row["chunks"] == {"total": 3, "done": 3} and row["attempts"] == 4 and row["nodes"] == sorted(nodes)

    # a retry with nothing to do keeps the history: not "none started", not `"chunks": {}`
    retried = ws.ffswarm("retry", ws.job)
    assert retried.returncode == 0, retried.stderr[-2000:]
    assert attempts_of(report_of(ws)["chunks"]) == attempts_of(report["chunks"])
    assert report_of(ws)["counts"]["ok"] == 6
    line = status_line(ws)
    assert "chunks: 3 done (of 3) · 4 attempts on 1 node(s)" in line, line
    assert_committed_once(ws, 6)


# -- 5 and 6: one controller per job; a killed one's job is taken over at once ---------------------------
def test_one_controller_per_job_and_a_killed_ones_job_is_taken_over(
    workspace: Workspace, swarm: DockerSwarm, fault_image: str
) -> None:
    ws = workspace
    job = make_job(ws, 6, fault_image, faults={"*": {"*": {"sleep": 3}}}, chunk_size=2, max_concurrent=1)
    host = socket.gethostname()
    with ServiceWatch(swarm, ws.job) as watch:
        first = popen_submit(ws, "submit", str(job))
        wait_for(lambda: bool(watch.specs), 120, "a chunk service")

        line = status_line(ws)
        assert re.search(rf"^{re.escape(ws.job)}: running \((\w+; )?controller on {re.escape(host)}\) ·", line), line
        ctl = status_of(ws)["controller"]
        assert ctl["host"] == host and ctl["pid"] == first.pid

        second = ws.ffswarm("submit", str(job))
        assert second.returncode == 69, second.stderr[-2000:]
        said = second.stderr.strip().splitlines()[-1]
        assert re.fullmatch(
            rf"ffswarm: job {re.escape(ws.job)} is being run by \S+ \(ffswarm submit, pid {first.pid}\) "
            rf"on {re.escape(host)} since \S+; `ffswarm status {re.escape(ws.job)} --follow` to watch it",
            said,
        ), said
        assert first.poll() is None  # the second submit left the first one's job alone

        os.kill(first.pid, signal.SIGKILL)
        first.wait()
        line = status_line(ws)
        assert f"{ws.job}: stopped: no controller — `ffswarm resume {ws.job}`" in line, line
        assert status_of(ws)["controller"] is None

        resumed = ws.ffswarm("resume", ws.job)  # same host, dead pid: taken over at once, no 69
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert report_of(ws)["counts"]["ok"] == 6
    assert sorted(watch.specs) == [f"ffswarm-{ws.job}-c000{i}-a1" for i in range(3)]  # adopted, never doubled
    row = status_of(ws)
    assert row["phase"] == "finished" and row["controller"] is None
    assert_committed_once(ws, 6)


# -- 3, 4 and 7: cancel, continue with resume and with submit; a finished job refuses cancel and scale ---
def test_a_cancelled_job_is_continued_without_redoing_its_done_items(
    workspace: Workspace, swarm: DockerSwarm, fault_image: str
) -> None:
    ws = workspace
    # each cancel finds a chunk waiting (30 s) before its first item, so what is done when is known
    slow = {"1": {"sleep": 30}}
    faults = {"*": {"*": {"sleep": 2}}, "c0001": slow, "c0002": slow}
    job = make_job(ws, 8, fault_image, faults=faults, chunk_size=2, max_concurrent=1)
    with ServiceWatch(swarm, ws.job) as watch:
        proc = popen_submit(ws, "submit", str(job))
        wait_for(lambda: committed(ws, "c0000", 1, 2), 120, "c0000 committed")
        wait_for(lambda: any("-c0001-" in s for s in watch.specs), 30, "chunk c0001 started")
        cancelled = ws.ffswarm("cancel", ws.job)
        assert cancelled.returncode == 0, cancelled.stderr[-2000:]
        code, out, err = finish(proc)
    assert code == 1, err[-2000:]

    # 7: what was not run is cancelled, not failed: in the summary, report.json and status
    assert f"job {ws.job}: 2 ok, 0 without a face, 0 failed, 6 cancelled of 8 items" in out, out
    assert f"cancelled: 6 item(s) not run; `ffswarm resume {ws.job}` runs them" in out
    assert "failed:" not in out and "job cancelled" not in out
    report = report_of(ws)
    assert report["counts"]["failed"] == 0 and report["counts"]["cancelled"] == 6
    assert sorted(e["status"] for e in report["items"].values()) == ["cancelled"] * 6 + ["ok"] * 2
    assert report["failures"] == []
    row = status_of(ws)
    assert row["phase"] == "cancelled"
    assert row["items"] == {"total": 8, "ok": 2, "no_face": 0, "failed": 0, "cancelled": 6, "pending": 0}
    assert f"{ws.job}: cancelled — `ffswarm resume {ws.job}` continues it" in status_line(ws)
    done_before = fingerprints(ws)
    assert len(done_before) == 2

    # 3: resume continues the remaining items (c0001 again); cancelled again once c0002 waits
    with ServiceWatch(swarm, ws.job) as watch:
        proc = popen_submit(ws, "resume", ws.job)
        wait_for(lambda: committed(ws, "c0001", 2, 2), 120, "c0001 committed by the resume")
        wait_for(lambda: any("-c0002-" in s for s in watch.specs), 30, "chunk c0002 started")
        assert ws.ffswarm("cancel", ws.job).returncode == 0
        code, out, err = finish(proc)
    assert code == 1, err[-2000:]
    assert f"job {ws.job}: 4 ok, 0 without a face, 0 failed, 4 cancelled of 8 items" in out, out
    done_then = fingerprints(ws)
    assert len(done_then) == 4 and {k: done_then[k] for k in done_before} == done_before  # not redone

    # 3: submitting the same file again runs the rest (not `job_cancelled`, not a job -2)
    again = ws.ffswarm("submit", str(job))
    assert again.returncode == 0, again.stderr[-2000:]
    assert f"job {ws.job}: 8 ok, 0 without a face, 0 failed of 8 items" in again.stdout, again.stdout
    assert not (ws.root / "runs" / f"{ws.job}-2").exists()
    done_last = fingerprints(ws)
    assert len(done_last) == 8 and {k: done_last[k] for k in done_then} == done_then
    assert_committed_once(ws, 8)  # every output written exactly once over the three runs

    # 4: a finished job refuses cancel and scale, and stays finished
    for cmd in (("cancel", ws.job), ("scale", ws.job, "3")):
        refused = ws.ffswarm(*cmd)
        assert refused.returncode == 2, refused.stderr[-2000:]
        assert f"job {ws.job} already finished" in refused.stderr
    row = status_of(ws)
    assert row["phase"] == "finished" and row["items"]["ok"] == 8 and row["items"]["cancelled"] == 0
    assert row["max_concurrent"] == 1
    assert not json.loads((ws.root / "runs" / ws.job / "control.json").read_text()).get("cancel")
