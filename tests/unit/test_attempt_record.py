"""The runner → controller attempt record (contract/attempt.py): what it refuses, and how the
controller reads it (controller/run/attempts.py) for timings and failure reasons, falling back on
the runner's log only when an attempt left no record."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any

import pytest

from contract.attempt import MAX_BYTES, AttemptRecord
from contract.errors import RecordError
from controller.job.plan import TargetRef, make_plan
from controller.run import attempts, timings
from controller.run.failures import ChunkState
from controller.run.rundir import RunDir
from tests.fakes import FakeSwarm, Outcome
from tests.unit.test_supervisor import make
from tests.unit.test_timings import finished_job

NOW = 1_790_000_000.0


def loaded(**kw: Any) -> AttemptRecord:
    fields: dict[str, Any] = {
        "job": "j",
        "chunk": "c0000",
        "attempt": 1,
        "started": NOW,
        "provider": "cuda",
        "threads": 8,
        "cold_start_s": 4.5,
        "models_loaded_at": NOW + 4.0,
    }
    return AttemptRecord(**{**fields, **kw})


def ended(**kw: Any) -> AttemptRecord:
    changes: dict[str, Any] = {"items_done": 3, "items_failed": 1, "exit": "ITEMS_FAILED", "finished": NOW + 9}
    return dataclasses.replace(loaded(), **{**changes, **kw})


def test_a_record_survives_its_round_trip() -> None:
    for record in (loaded(), ended(reason="in/a.jpg: not an image"), AttemptRecord("j", "c0000", 2, NOW)):
        assert AttemptRecord.from_json(record.to_json()) == record
    assert not loaded().ended and ended().ended


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"attempt": "1"}, "attempt"),
        ({"attempt": True}, "attempt"),
        ({"attempt": 0}, "attempt"),
        ({"attempt": 10**9}, "attempt"),
        ({"threads": 1.5}, "threads"),
        ({"threads": 0}, "threads"),
        ({"cold_start_s": -1}, "cold_start_s"),
        ({"cold_start_s": "4.5"}, "cold_start_s"),
        ({"cold_start_s": 1e9}, "cold_start_s"),
        ({"started": -5}, "started"),
        ({"started": 1e300}, "started"),
        ({"models_loaded_at": None}, "come together"),
        ({"provider": "tpu"}, "provider"),
        ({"items_done": -1}, "items_done"),
        ({"items_failed": 10**12}, "items_failed"),
        ({"exit": "EXPLODED", "finished": NOW + 1}, "exit"),
        ({"exit": "OK"}, "come together"),
        ({"exit": "OK", "finished": NOW - 3600}, "finished before"),
        ({"reason": 7}, "reason"),
        ({"reason": "x" * 5000}, "reason"),
        ({"reason": "a\x1b[2Jb"}, "reason"),
        ({"job": "../etc"}, "job"),
        ({"chunk": ""}, "chunk"),
        ({"schema": 2}, "schema"),
    ],
)
def test_bad_types_and_absurd_values_are_refused(change: dict[str, Any], field: str) -> None:
    data = json.loads(loaded().to_json())
    data.update(change)
    with pytest.raises(RecordError, match=field):
        AttemptRecord.from_json(json.dumps(data))


def test_unknown_or_missing_fields_and_non_records_are_refused_without_echoing_them() -> None:
    data = json.loads(loaded().to_json())
    with pytest.raises(RecordError, match="1 unknown field") as refused:
        AttemptRecord.from_json(json.dumps({**data, "secret-token-123": "hunter2"}))
    assert "secret" not in str(refused.value) and "hunter2" not in str(refused.value)
    del data["started"]
    with pytest.raises(RecordError, match="lacks started"):
        AttemptRecord.from_json(json.dumps(data))
    for text in ("[]", "not json", '"x"', " " * (MAX_BYTES + 1), b"\xff\xfe"):
        with pytest.raises(RecordError):
            AttemptRecord.from_json(text)
    with pytest.raises(RecordError) as refused:
        AttemptRecord.from_json(json.dumps({**json.loads(loaded().to_json()), "provider": "hunter2"}))
    assert "hunter2" not in str(refused.value)


def put(rundir: RunDir, record: AttemptRecord | str, chunk: str = "c0000", attempt: int = 1) -> Path:
    path = rundir.layout.attempt_record(chunk, attempt)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(record if isinstance(record, str) else record.to_json())
    return path


def test_the_controller_trusts_only_a_valid_record_filed_under_its_own_name(tmp_path: Path) -> None:
    rundir = RunDir(tmp_path, "j")
    assert attempts.read_record(rundir, "c0000", 1) is None  # none written
    put(rundir, loaded())
    assert attempts.read_record(rundir, "c0000", 1) == loaded()
    put(rundir, loaded(chunk="c0001"), "c0000", 2)  # another chunk's record under this name
    assert attempts.read_record(rundir, "c0000", 2) is None
    put(rundir, loaded(attempt=2), "c0001", 3)
    assert attempts.read_record(rundir, "c0001", 3) is None
    put(rundir, "{torn", "c0002")
    assert attempts.read_record(rundir, "c0002", 1) is None
    put(rundir, loaded().to_json() + " " * MAX_BYTES, "c0003")  # too large to be a record
    assert attempts.read_record(rundir, "c0003", 1) is None
    elsewhere = put(RunDir(tmp_path, "other"), loaded(job="j", chunk="c0004"), "c0004")
    os.symlink(elsewhere, rundir.layout.attempt_record("c0004", 1))  # a link is never followed
    assert attempts.read_record(rundir, "c0004", 1) is None
    rundir.layout.attempt_record("c0005", 1).mkdir()
    assert attempts.read_record(rundir, "c0005", 1) is None


def test_timings_read_cold_start_and_provider_from_the_records(tmp_path: Path) -> None:
    rundir, plan = finished_job(tmp_path, [4.0, 6.0, 5.0], provider="cuda")  # what the logs say
    for chunk, cold in zip(plan.chunks, [1.0, 2.0, 3.0], strict=True):
        put(rundir, ended(job="j", chunk=chunk.id, provider="cpu", cold_start_s=cold), chunk.id)
    measured = timings.measure(rundir, plan)
    assert measured is not None
    assert measured[0] == "cpu" and measured[1].cold_start_s == 2.0  # the records win over the logs


def test_timings_fall_back_on_the_log_of_an_attempt_without_a_record(tmp_path: Path) -> None:
    rundir, plan = finished_job(tmp_path, [4.0, 6.0, 5.0])
    put(rundir, ended(chunk=plan.chunks[0].id, cold_start_s=1.0), plan.chunks[0].id)
    measured = timings.measure(rundir, plan)
    assert measured is not None and measured[1].cold_start_s == 5.0  # median of 1 (record), 6 and 5 (logs)
    # a record of an attempt that never loaded models (every item cached) measures nothing
    put(rundir, AttemptRecord("j", plan.chunks[1].id, 1, NOW, exit="OK", finished=NOW), plan.chunks[1].id)
    assert attempts.cold_start(rundir, plan.chunks[1].id, 1, rundir.log_path(plan.chunks[1].id, 1)) is None


def test_no_records_and_no_logs_measure_nothing(tmp_path: Path) -> None:
    rundir = RunDir(tmp_path, "j")
    (rundir.path / "logs").mkdir(parents=True)
    assert timings.measure(rundir, make_plan("j", [TargetRef("a.jpg", "b.jpg", "image")], 4)) is None


LOG = '{"event": "runner failed", "error": "from the log"}\n'


def runner_leaves(rundir: RunDir, record: AttemptRecord | str | None, log: str) -> None:
    """What attempt 1 of c0000 leaves in the run folder before its container ends."""
    if record is not None:
        put(rundir, record)
    rundir.log_path("c0000", 1).parent.mkdir(parents=True, exist_ok=True)
    rundir.log_path("c0000", 1).write_text(log)


def test_a_failure_reason_comes_from_the_record(tmp_path: Path) -> None:
    swarm = FakeSwarm(script={("c0000", 1): Outcome("failed", 66)})
    sup, _ = make(tmp_path, swarm, retries=0)
    record = ended(exit="MISSING_INPUT", reason="source photo faces/star.jpg: no face detected")
    swarm.on_end["c0000"] = lambda: runner_leaves(sup.rundir, record, LOG)
    run = sup.run(["c0000"])["c0000"]
    assert run.state is ChunkState.FAILED
    assert run.reason == "runner exit 66 (missing input): source photo faces/star.jpg: no face detected"


@pytest.mark.parametrize("record", [None, "{not a record", AttemptRecord("j", "c0009", 1, NOW)])
def test_without_a_trustworthy_record_the_reason_falls_back_on_the_log(
    tmp_path: Path, record: AttemptRecord | str | None
) -> None:
    swarm = FakeSwarm(script={("c0000", 1): Outcome("failed", 66)})
    sup, _ = make(tmp_path, swarm, retries=0)
    swarm.on_end["c0000"] = lambda: runner_leaves(sup.rundir, record, LOG)
    assert sup.run(["c0000"])["c0000"].reason == "runner exit 66 (missing input): from the log"


def test_a_runner_killed_after_its_first_record_keeps_the_controllers_reason(tmp_path: Path) -> None:
    swarm = FakeSwarm(script={("c0000", 1): Outcome("failed", 137)})
    sup, _ = make(tmp_path, swarm, retries=0)
    # models loaded, then killed: no ending written; the log's last line is no reason
    swarm.on_end["c0000"] = lambda: runner_leaves(sup.rundir, loaded(), '{"event": "item", "item": "i000001"}\n')
    run = sup.run(["c0000"])["c0000"]
    assert run.state is ChunkState.FAILED and "out of memory" in (run.reason or "")
    assert "i000001" not in (run.reason or "")


def test_the_runner_process_is_named_in_every_record_it_writes_and_a_bad_name_is_refused() -> None:
    from runner_image.record import PROCESS

    record = dataclasses.replace(loaded(), process=PROCESS)
    assert AttemptRecord.from_json(record.to_json()).process == PROCESS
    for bad in ("x" * 16, "ABCDEF0123456789", "0" * 15, 7, "../../etc/passwd"):
        with pytest.raises(RecordError, match="process"):
            AttemptRecord.from_dict({**json.loads(record.to_json()), "process": bad})
