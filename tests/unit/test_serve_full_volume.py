"""A full shared volume is a state that passes: `serve` keeps the job in the inbox and goes on later,
never fails it for good; any other unexpected error fails the job with its traceback in the log."""

from __future__ import annotations

import errno
import io
import json
import logging
import os
import sys
import threading
import time
from pathlib import Path

import pytest

from controller import log
from controller.config import parse_config
from controller.run import usecase
from controller.run.metrics import Metrics
from controller.serve import jobs
from controller.serve.daemon import Outcome, Server
from controller.serve.inbox import Inbox


def _job_file(tmp_path: Path) -> Path:
    path = tmp_path / "inbox" / "a.yaml"
    path.parent.mkdir()
    path.write_text("name: a\n")
    return path


def test_a_job_whose_volume_fills_up_waits_in_the_inbox(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def full(*_a: object, **_k: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(usecase, "one_job", full)
    config = parse_config(tmp_path / "ffswarm.yaml", {"data_root": str(tmp_path)})
    outcome = jobs.run_job_file(config, _job_file(tmp_path), Metrics())
    assert outcome.retry and not outcome.ok
    assert outcome.reason == jobs.FULL


def test_an_unexpected_error_fails_the_job_and_logs_its_traceback(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(*_a: object, **_k: object) -> None:
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(usecase, "one_job", broken)
    out = io.StringIO()
    monkeypatch.setattr(sys, "stderr", out)
    log.setup(json_lines=True, level=logging.INFO)
    config = parse_config(tmp_path / "ffswarm.yaml", {"data_root": str(tmp_path)})
    try:
        outcome = jobs.run_job_file(config, _job_file(tmp_path), Metrics())
    finally:
        monkeypatch.undo()
        log.setup(json_lines=True)  # the real stderr again for the tests after this one
    assert not outcome.retry and not outcome.ok
    assert outcome.reason == "internal error (exit 70): OSError; the controller's log has the details"
    lines = [json.loads(line) for line in out.getvalue().splitlines() if line.startswith("{")]
    logged = [x for x in lines if x.get("event") == "job_file_internal_error"]
    assert logged, out.getvalue()
    assert "Traceback (most recent call last)" in logged[0]["exception"]
    assert "Input/output error" in logged[0]["exception"]


def test_serve_keeps_serving_while_a_full_volume_refuses_a_claims_lease(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from controller.run import lease

    job = _job_file(tmp_path)
    old = time.time() - 60
    os.utime(job, (old, old))  # settled: ready to be claimed
    real = lease.create
    full = threading.Event()
    full.set()

    def create(path: Path, record: lease.Record) -> bool:
        if full.is_set():
            full.clear()  # one refusal: the volume has room again afterwards
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(path, record)

    monkeypatch.setattr(lease, "create", create)
    ran: list[str] = []

    def run(config: object, path: Path, metrics: Metrics) -> Outcome:
        ran.append(path.name)
        return Outcome(True, None)

    config = parse_config(tmp_path / "ffswarm.yaml", {"data_root": str(tmp_path)})
    server = Server(config, Inbox(job.parent), Metrics(), poll=0.05, run=run, heartbeat_every=0.2)
    t = threading.Thread(target=server.serve_forever, daemon=True)
    t.start()
    try:
        deadline = time.monotonic() + 10
        while not ran and t.is_alive() and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        server.stop.set()
        t.join(5)
    assert not full.is_set() and len(ran) == 1 and ran[0].startswith("a.")  # refused once, claimed next round


def test_a_job_that_meets_the_object_store_down_waits_in_the_inbox(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The store not answering (after the client's own retries) passes like a full volume: the job
    waits and is tried again, never refused for good (the soak's store outage refused S3 jobs)."""
    from controller.storage.errors import StorageTemporaryError

    def down(*_a: object, **_k: object) -> None:
        raise StorageTemporaryError("s3://b/t/face.jpg", "no answer from the storage endpoint")

    monkeypatch.setattr(usecase, "one_job", down)
    config = parse_config(tmp_path / "ffswarm.yaml", {"data_root": str(tmp_path)})
    outcome = jobs.run_job_file(config, _job_file(tmp_path), Metrics())
    assert outcome.retry and not outcome.ok
    assert outcome.reason is not None and "no answer from the storage endpoint" in outcome.reason
