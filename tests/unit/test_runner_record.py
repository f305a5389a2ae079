"""The runner writes its attempt record (contract/attempt.py) in an in-process chunk run with the
stand-in pack: once its models are loaded, and again at the end with the exit kind and reason."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from contract.attempt import AttemptRecord
from contract.manifest import NoFacePolicy
from runner_image import pipeline
from runner_image.errors import Terminated
from tests.unit.test_runner_chunk import JOB, run, temp_files, write_manifest


def record_of(root: Path, chunk: str = "c0001", attempt: int = 1) -> AttemptRecord:
    return AttemptRecord.from_json((root / "runs" / JOB / "attempts" / f"{chunk}.a{attempt}.json").read_text())


def test_a_finished_attempt_records_provider_cold_start_counts_and_exit(data: Path) -> None:
    before = time.time()
    manifest = write_manifest(data, ["astronaut.jpg", "no_face.jpg", "broken.jpg"])
    assert run(data, manifest) == 3
    record = record_of(data)
    assert (record.job, record.chunk, record.attempt) == (JOB, "c0001", 1)
    assert record.provider == "cpu" and record.threads is not None and record.threads >= 1
    assert record.cold_start_s is not None and record.cold_start_s > 0
    assert record.models_loaded_at is not None and before <= record.started <= record.models_loaded_at
    assert (record.items_done, record.items_failed) == (2, 1)
    assert record.exit == "ITEMS_FAILED" and record.reason is None
    assert record.finished is not None and record.models_loaded_at <= record.finished <= time.time()
    assert temp_files(data) == []


def test_the_record_is_written_when_models_are_loaded(data: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[AttemptRecord] = []
    real = pipeline.run_items

    def spy(*args: Any) -> None:
        seen.append(record_of(data))  # what the controller could read while the items run
        real(*args)

    monkeypatch.setattr(pipeline, "run_items", spy)
    assert run(data, write_manifest(data, ["astronaut.jpg"])) == 0
    (first,) = seen
    assert first.provider == "cpu" and first.cold_start_s is not None and not first.ended
    assert record_of(data).exit == "OK" and record_of(data).items_done == 1


def test_a_chunk_that_dies_after_loading_keeps_its_cold_start(data: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def killed(*args: Any) -> None:
        raise Terminated()

    monkeypatch.setattr(pipeline, "run_items", killed)
    assert run(data, write_manifest(data, ["astronaut.jpg"])) == 143
    record = record_of(data)
    assert record.cold_start_s is not None and record.provider == "cpu"
    assert record.exit == "TERMINATED" and record.reason == "terminated by SIGTERM"


def test_a_failed_attempt_records_its_reason_relative_to_the_data_root(data: Path) -> None:
    (data / "in" / "source.jpg").unlink()
    assert run(data, write_manifest(data, ["astronaut.jpg"]), attempt=2) == 66
    record = record_of(data, attempt=2)
    assert record.exit == "MISSING_INPUT" and record.provider == "cpu"  # models loaded, then the source failed
    assert record.reason is not None and record.reason.startswith("source photo in/source.jpg")
    assert "/data/" not in record.reason


def test_an_internal_error_is_recorded_with_its_type(data: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*args: Any) -> None:
        raise RuntimeError("bug in the pipeline")

    monkeypatch.setattr(pipeline, "run_items", broken)
    assert run(data, write_manifest(data, ["astronaut.jpg"])) == 70
    assert record_of(data).reason == "internal error: RuntimeError: bug in the pipeline"


def test_a_fully_cached_attempt_records_its_ending_without_models(data: Path) -> None:
    manifest = write_manifest(data, ["astronaut.jpg", "no_face.jpg"], no_face=NoFacePolicy.SKIP)
    assert run(data, manifest) == 0
    assert run(data, manifest, attempt=2) == 0
    record = record_of(data, attempt=2)
    assert record.provider is None and record.cold_start_s is None
    assert record.exit == "OK" and record.items_done == 2


def test_a_manifest_that_cannot_be_read_leaves_no_record(data: Path) -> None:
    assert run(data, "/data/runs/job1/chunks/c0404.json") == 66
    assert not (data / "runs" / JOB / "attempts").exists()


def test_an_attempt_given_up_for_a_later_one_takes_no_more_items(data: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The controller gave attempt 1 up while it still ran (its node was paused, its lane dropped) and
    made attempt 2's results file: attempt 1's runner ends the items in hand, records them, takes no
    other and exits 75 saying why, so two attempts do not go on working one chunk side by side."""
    real = pipeline.process_one

    def then_attempt_2_starts(engine: Any, item: Any) -> Any:
        result = real(engine, item)
        (data / "runs" / JOB / "results" / "c0001.a2.jsonl").touch()
        return result

    monkeypatch.setattr(pipeline, "process_one", then_attempt_2_starts)
    names = ["astronaut.jpg", "face_00.jpg", "face_02.jpg", "face_03.jpg", "no_face.jpg", "broken.jpg"]
    assert run(data, write_manifest(data, names)) == 75
    record = record_of(data)
    assert record.exit == "TEMPORARY"
    assert record.reason == "attempt 2 of chunk c0001 has started: this attempt commits no more"
    lines = (data / "runs" / JOB / "results" / "c0001.a1.jsonl").read_text().splitlines()
    written = sorted(p.name for p in (data / "out").iterdir())
    assert 1 <= len(lines) < len(names)  # the items in flight when it saw attempt 2, no more
    assert len(written) == record.items_done == len(lines)  # each output it wrote is recorded
    assert temp_files(data) == []


def test_an_attempt_given_up_with_items_in_flight_commits_none_of_them(
    data: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Attempt 1's node was paused mid-item and the controller started attempt 2; when attempt 1 comes
    back, the items it holds are encoded but not committed: attempt 2 commits each of them, once."""
    real = pipeline.media.encode_output
    a2 = data / "runs" / JOB / "results" / "c0001.a2.jsonl"

    def attempt_2_starts_meanwhile(*args: Any, **kw: Any) -> Any:
        out = real(*args, **kw)
        a2.touch()
        return out

    names = ["astronaut.jpg", "face_00.jpg", "face_02.jpg"]
    manifest = write_manifest(data, names)
    with monkeypatch.context() as m:
        m.setattr(pipeline.media, "encode_output", attempt_2_starts_meanwhile)
        assert run(data, manifest) == 75
    assert record_of(data).reason == "attempt 2 of chunk c0001 has started: this attempt commits no more"
    results = data / "runs" / JOB / "results"
    assert not (results / "c0001.a1.jsonl").read_text()  # nothing recorded …
    assert not (data / "out").exists() or not list((data / "out").iterdir())  # … nor written
    journal = results / "c0001.a1.commits"
    assert not journal.exists() or not journal.read_text()  # … nor journaled
    assert temp_files(data) == []
    a2.unlink()
    assert run(data, manifest, attempt=2) == 0
    lines = [json.loads(x) for x in (results / "c0001.a2.jsonl").read_text().splitlines()]
    assert sorted(x["status"] for x in lines) == ["ok"] * 3 and not any(x.get("cached") for x in lines)
    assert len(list((data / "out").iterdir())) == 3
