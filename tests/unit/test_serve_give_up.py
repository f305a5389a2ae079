"""A job `serve` gives up on after its run folder exists (an internal error, in a job or a pack) ends
as any job ends: failed with the reason beside its file, its report written, its job.finished queued
for the deliverer, its lease and claims let go of. A job another controller holds is left to it."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from controller.config import Config, parse_config
from controller.job import claims
from controller.run import job_lease, usecase, webhooks
from controller.run.jobs import start_run
from controller.run.metrics import Metrics
from controller.run.packed import pack_of
from controller.run.rundir import RunDir
from controller.run.status import job_status
from controller.serve import jobs
from controller.serve.daemon import Inbox, Server
from controller.serve.packing import Member
from controller.swarm.backend import SwarmBackend
from tests.builders import JPEG, make_config
from tests.fakes import FakeSwarm
from tests.unit.test_packing import _job

HOOK = "http://127.0.0.1:9/hook"  # never reached: a given-up job's end is only queued
WHY = "internal error (exit 70): RuntimeError; the controller's log has the details"
FILES = {"in/a.jpg": JPEG, "in/b.jpg": JPEG, "faces/me.jpg": JPEG}


class Swarm(FakeSwarm):
    def check_manager(self) -> None:
        pass


def webhook_config(tmp_path: Path) -> Config:
    """The test cluster, its policy letting jobs' webhooks reach the loopback receiver."""
    make_config(tmp_path)
    path = tmp_path / "ffswarm.yaml"
    data = yaml.safe_load(path.read_text())
    data["policy"] = {"webhooks": {"allow_hosts": ["127.0.0.1"], "allow_private": True}}
    path.write_text(yaml.safe_dump(data))
    return parse_config(path, data)


def job_text(photo: str) -> str:
    return (
        f"source: faces/me.jpg\ntargets: ['in/{photo}.jpg']\noutput: 'out/{photo}/{{name}}'\n"
        f"on_complete: {{webhook: '{HOOK}'}}\n"
    )


def server(config: Config, swarm: SwarmBackend) -> Server:
    serve = Server(config, Inbox(config.data_root / "inbox"), Metrics())
    serve.inbox.ensure()
    serve.swarm = lambda: swarm
    return serve


def claim(serve: Server, name: str) -> Path:
    path = serve.inbox.path / f"{name}.yaml"
    settled = time.time() - 10
    os.utime(path, (settled, settled))
    claimed = serve.inbox.claim(path)
    assert claimed is not None
    return claimed


def breaks_after_its_run_folder(config: Config, monkeypatch: pytest.MonkeyPatch, swarm: SwarmBackend) -> None:
    """The run of a job makes its run folder, then meets a bug."""
    monkeypatch.setattr(jobs, "DockerSwarm", lambda host: swarm)

    def run(config: Config, backend: SwarmBackend, job: Any, *a: Any, **k: Any) -> Any:
        start_run(config, job, "sha256:" + "1" * 64)
        raise RuntimeError("a bug, with /secret/path in its words")

    monkeypatch.setattr(usecase, "run", run)


def finished_deliveries(config: Config, job: str) -> list[Any]:
    return [d for d in webhooks.outbox(config).deliveries(job) if d.type == webhooks.FINISHED]


def ended_failed(config: Config, job: str, reason: str) -> None:
    """The job ended through the end of a job: failed for ``reason``, its end queued once, let go of."""
    rd = RunDir(config.data_root, job)
    row = job_status(rd)
    assert (row["phase"], row["outcome"], row["reason"]) == ("finished", "failed", reason)
    assert row["items"]["failed"] == row["items"]["total"] == 1 and row["items"]["pending"] == 0
    report = rd.report() or {}
    assert report["reason"] == reason and "Traceback" not in str(report) and "/secret/path" not in str(report)
    assert [f["reason"] for f in report["failures"]] == [f"chunk c0000 failed: {reason}"]
    (sent,) = finished_deliveries(config, job)
    data = json.loads(sent.body)["data"]  # what the deliverer sends, not tried yet
    assert sent.state == "pending" and not sent.attempts and sent.url == HOOK
    assert (data["phase"], data["outcome"], data["reason"]) == ("finished", "failed", reason)
    assert job_lease.holder(rd) is None


def test_a_job_whose_run_breaks_after_its_run_folder_exists_ends_failed_with_the_reason(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = webhook_config(tmp_path)
    job = _job(config, "one", job_text("a"), FILES)
    swarm = Swarm()
    breaks_after_its_run_folder(config, monkeypatch, swarm)
    serve = server(config, swarm)
    serve.start_job(claim(serve, "one"))
    for t in list(serve._active.values()):
        t.join()
    ended_failed(config, "one", WHY)
    assert (serve.inbox.failed / "one.yaml.reason.txt").read_text().strip() == WHY  # the reason beside the file
    assert claims.holder_of(config.data_root, job.plan.items[0].output) is None  # its output is free again


def test_a_job_another_controller_holds_is_left_to_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = webhook_config(tmp_path)
    _job(config, "one", job_text("a"), FILES)
    swarm = Swarm()
    breaks_after_its_run_folder(config, monkeypatch, swarm)
    serve = server(config, swarm)
    claimed = claim(serve, "one")
    other = job_lease.Lease(RunDir(config.data_root, "one"))  # another controller takes the job meanwhile

    def taken(config: Config, backend: SwarmBackend, job: Any, *a: Any, **k: Any) -> Any:
        start_run(config, job, "sha256:" + "1" * 64)
        other.acquire()
        raise RuntimeError("a bug")

    monkeypatch.setattr(usecase, "run", taken)
    serve.start_job(claimed)
    for t in list(serve._active.values()):
        t.join()
    rd = RunDir(config.data_root, "one")
    assert rd.report() is None and finished_deliveries(config, "one") == []
    assert job_status(rd)["phase"] == "running"  # the other controller's still
    other.release()


def test_a_packs_jobs_end_failed_with_the_reason_when_the_pack_breaks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = webhook_config(tmp_path)
    for name, photo in (("one", "a"), ("two", "b")):
        _job(config, name, job_text(photo), FILES)
    swarm = Swarm()
    monkeypatch.setattr(jobs, "DockerSwarm", lambda host: swarm)

    def broken(*a: Any, **k: Any) -> Any:
        raise RuntimeError("a bug")

    monkeypatch.setattr(usecase, "run", broken)  # the pack's own run, once its jobs' folders exist
    serve = server(config, swarm)
    members = [Member(c, usecase.one_job(config, c), None) for c in (claim(serve, "one"), claim(serve, "two"))]
    serve.slots = threading.Semaphore(0)  # the pack's slot, taken as _launch_packs takes it
    serve.start_pack(members, 1)
    for t in list(serve._active.values()):
        t.join()
    for name in ("one", "two"):
        ended_failed(config, name, WHY)
        assert (serve.inbox.failed / f"{name}.yaml").is_file()
    pack = pack_of(RunDir(config.data_root, "one"))
    assert pack is not None and job_status(RunDir(config.data_root, pack))["phase"] == "finished"
    for m in members:  # the pack's claims on its jobs' outputs let go of
        assert claims.holder_of(config.data_root, m.job.plan.items[0].output) is None
