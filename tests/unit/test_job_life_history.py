"""A job's life (issue 21), what the dev swarm showed beyond the first unit tests: the lease names the
command a controller runs, an attempt a stopped controller left open reads as its runner ended it,
where it ran is kept from its service, and a stopped job with nothing pending still says how to go on."""

from __future__ import annotations

import os
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest

from contract.attempt import AttemptRecord
from controller.run import history
from controller.run.fold import Fold
from controller.run.lease import who
from controller.run.rundir import RunDir, Stage
from controller.run.status import describe, job_status
from controller.swarm.servicespec import LABEL_ROLE, chunk_service
from tests.fakes import FakeSwarm, Outcome
from tests.unit.test_job_life import commit, run_folder
from tests.unit.test_supervisor import make, settings


@pytest.mark.parametrize(
    "argv",
    [
        ["ffswarm", "submit", "jobs/a.yaml"],
        ["ffswarm", "--json-logs", "--config", "/etc/ffswarm.yaml", "submit", "jobs/a.yaml"],
        ["ffswarm", "-v", "--config=/etc/ffswarm.yaml", "submit"],
    ],
)
def test_the_lease_names_the_command_past_the_root_options(monkeypatch: pytest.MonkeyPatch, argv: list[str]) -> None:
    monkeypatch.setattr(sys, "argv", argv)
    assert who().endswith(f"(ffswarm submit, pid {os.getpid()})")


def open_attempt(rd: RunDir, chunk: str = "c0000", node: str | None = None) -> None:
    """state.json as a controller stopped (Ctrl-C, killed) mid-attempt left it."""
    att = {"attempt": 1, "service": f"ffswarm-j-{chunk}-a1", "node": node, "exit_code": None, "outcome": "running"}
    rd.write_state({chunk: {"state": "running", "attempts": [att | {"reason": None}]}})


def runner_ended(rd: RunDir, chunk: str, exit_kind: str, reason: str | None = None) -> None:
    now = time.time()
    record = AttemptRecord("j", chunk, 1, now - 2, exit=exit_kind, reason=reason, finished=now)
    path = rd.layout.attempt_record(chunk, 1)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(record.to_json())


def test_an_attempt_a_stopped_controller_left_open_reads_as_its_runner_ended_it(tmp_path: Path) -> None:
    rd = run_folder(tmp_path)
    rd.enter(Stage.CHUNKS)
    open_attempt(rd, "c0000")
    commit(rd, "c0000", "i000000", "i000001")
    runner_ended(rd, "c0000", "OK")
    (att,) = history.whole(rd, Fold.read(rd.plan(), rd))["c0000"]["attempts"]
    assert (att["outcome"], att["exit_code"]) == ("done", 0)  # not "running" forever in report.json


def test_an_open_attempt_whose_runner_failed_keeps_its_runners_reason(tmp_path: Path) -> None:
    rd = run_folder(tmp_path)
    open_attempt(rd, "c0000")
    runner_ended(rd, "c0000", "INTERNAL", "bug in the runner")
    rec = history.whole(rd, Fold.read(rd.plan(), rd))["c0000"]
    assert [(a["outcome"], a["exit_code"], a["reason"]) for a in rec["attempts"]] == [
        ("internal", 70, "bug in the runner")
    ]


def test_an_open_attempt_without_a_record_is_done_once_its_items_are_committed(tmp_path: Path) -> None:
    rd = run_folder(tmp_path)
    open_attempt(rd, "c0001")
    commit(rd, "c0001", "i000002", "i000003")
    (att,) = history.whole(rd, Fold.read(rd.plan(), rd))["c0001"]["attempts"]
    assert att["outcome"] == "done"


def test_a_resume_records_where_an_unwatched_attempt_ran_from_its_service(tmp_path: Path) -> None:
    swarm = FakeSwarm()
    sup, _ = make(tmp_path, swarm)
    open_attempt(sup.rundir, "c0000")  # the stopped controller had not seen its node yet
    swarm.add_orphan(chunk_service(settings(), "c0000", 1), Outcome())  # its service, ended meanwhile
    sup.run(["c0001"])  # the resume: c0000's items are committed, only c0001 is pending
    chunks = (sup.rundir.state() or {})["chunks"]
    assert chunks["c0000"]["attempts"][0]["node"] == "node-1"
    assert "ffswarm-j-c0000-a1" in swarm.removed


def test_a_stopped_job_with_nothing_pending_still_says_how_to_finish_it(tmp_path: Path) -> None:
    rd = run_folder(tmp_path)
    rd.enter(Stage.CHUNKS)  # Ctrl-C after the last item, before the report
    commit(rd, "c0000", "i000000", "i000001")
    commit(rd, "c0001", "i000002", "i000003")
    row = job_status(rd)
    assert row["phase"] == "stopped" and row["items"]["pending"] == 0
    assert describe(row).startswith("j: stopped: no controller — `ffswarm resume j` · items 4/4 done")


def test_an_attempt_started_just_before_its_controller_stopped_is_in_the_history(tmp_path: Path) -> None:
    rd = run_folder(tmp_path)
    rd.write_state({"c0001": {"state": "queued", "attempts": []}})  # service made, state.json not yet
    rd.layout.logs_dir.mkdir(parents=True, exist_ok=True)
    (rd.layout.logs_dir / "c0001.a1.log").write_text("")
    commit(rd, "c0001", "i000002", "i000003")
    runner_ended(rd, "c0001", "OK")
    rec = history.whole(rd, Fold.read(rd.plan(), rd))["c0001"]
    assert rec["state"] == "done" and [(a["attempt"], a["outcome"]) for a in rec["attempts"]] == [(1, "done")]


def test_a_resume_adds_an_unrecorded_attempt_from_its_service(tmp_path: Path) -> None:
    swarm = FakeSwarm()
    sup, _ = make(tmp_path, swarm)
    sup.rundir.write_state({"c0000": {"state": "queued", "attempts": []}})
    swarm.add_orphan(chunk_service(settings(), "c0000", 1), Outcome())
    step = chunk_service(settings(), "identity", 1)  # the identity step's service: not a chunk
    step = replace(step, name="ffswarm-j-identity", labels={**step.labels, LABEL_ROLE: "identity"})
    swarm.add_orphan(step, Outcome())
    sup.run(["c0001"])
    chunks = (sup.rundir.state() or {})["chunks"]
    assert [(a["attempt"], a["node"]) for a in chunks["c0000"]["attempts"]] == [(1, "node-1")]
    assert sorted(chunks) == ["c0000", "c0001"]
