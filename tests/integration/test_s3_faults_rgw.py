"""The store failing under a running job, on the real single-node swarm with Ceph RGW on the host
(tests/fixtures/s3_server.py; docs/storage.md#failures):

- the store stops answering mid-job (radosgw SIGKILLed, its monitor and OSD keep the objects, then
  started again): the runner's attempt ends 75 and the chunk is retried; no partial object is ever
  visible and what the first attempt committed is never written again;
- the output bucket is deleted mid-job: the items not yet committed fail naming the bucket, what was
  committed before stays recorded, and nothing else in the store is touched.

Each runs in a minute or two on the dev swarm: ``scripts/test.sh -k s3_faults_rgw``, or, with the dev
swarm and RGW up, ``.venv/bin/python -m pytest -q -p no:cacheprovider tests/integration/test_s3_faults_rgw.py``.
"""

from __future__ import annotations

import contextlib
import json
import time
from dataclasses import dataclass, field
from typing import Any

import pytest

from contract.results import ItemStatus
from contract.s3 import META_ATTEMPT
from controller.swarm.docker import DockerSwarm
from tests.fixtures import photos
from tests.fixtures.s3_server import BUCKET, S3Server
from tests.integration.conftest import Workspace, chown_tree, results_of
from tests.integration.test_s3_swarm import COMMON, config_with_s3, objects, put_inputs, s3, whole
from tests.polling import Polling

pytestmark = pytest.mark.integration
__all__ = ["s3"]  # the module's server fixture, shared with test_s3_swarm.py

MAX_DOWN = 120.0  # the store comes back at the latest after this long, whatever the attempt did


def report_of(ws: Workspace) -> dict[str, Any]:
    report: dict[str, Any] = json.loads((ws.root / "runs" / ws.job / "report.json").read_text())
    return report


def first_attempt_ended(ws: Workspace) -> bool:
    """Whether the run folder records an exit code for chunk c0000's first attempt."""
    try:
        state = json.loads((ws.root / "runs" / ws.job / "state.json").read_text())
    except (OSError, ValueError):
        return False
    attempts = ((state.get("chunks") or {}).get("c0000") or {}).get("attempts") or []
    return bool(attempts) and attempts[0].get("exit_code") is not None


@dataclass
class StoreDownAfterCommits(Polling):
    """Once ``after`` outputs are in the bucket: read them back, kill radosgw, and start it again
    once the attempt that met the dead store has ended (or after MAX_DOWN seconds)."""

    s3: S3Server
    ws: Workspace
    job: str
    after: int
    interval = 0.1
    seen_before: dict[str, dict[str, Any]] = field(default_factory=dict)
    killed_at: float | None = None
    restarted: bool = False

    def poll(self) -> None:
        if self.restarted:
            return
        if self.killed_at is None:
            listed = self.s3.client().list_objects_v2(Bucket=BUCKET, Prefix=f"{self.job}/out/").get("KeyCount", 0)
            if listed >= self.after:
                self.seen_before = objects(self.s3, f"{self.job}/out")
                self.s3.rgw.kill_gateway()
                self.killed_at = time.monotonic()
        elif first_attempt_ended(self.ws) or time.monotonic() - self.killed_at >= MAX_DOWN:
            self.s3.rgw.start_gateway()
            self.restarted = True

    def __exit__(self, *exc: object) -> None:
        super().__exit__(*exc)
        if self.killed_at is not None and not self.restarted:  # never leave the store down for the next test
            self.s3.rgw.start_gateway()


def test_the_store_stopped_mid_job_ends_the_attempt_75_and_the_retry_rewrites_nothing(
    workspace: Workspace, swarm: DockerSwarm, s3: S3Server
) -> None:
    ws = workspace
    star = photos.astronaut(ws.dir / "faces")
    chown_tree(ws.dir, ws.config.runner_uid_gid())
    made = photos.face_photos(ws.dir / "made", 60)  # long enough that the store goes down mid-chunk
    put_inputs(s3, f"{ws.job}/in", made)
    job_file = ws.write_job(
        f"name: {ws.job}\nsource: {ws.rel(star)}\ntargets: ['s3://{BUCKET}/{ws.job}/in/*.jpg']\n"
        f"output: 's3://{BUCKET}/{ws.job}/out/{{stem}}{{ext}}'\nchunk_size: 60\nretries: 3\n{COMMON}"
    )
    with StoreDownAfterCommits(s3, ws, ws.job, after=3) as down:
        proc = ws.ffswarm("submit", str(job_file), config=config_with_s3(s3, ws))
    assert down.restarted, "the job ended before the store was stopped: more photos are needed"
    assert proc.returncode == 0, proc.stderr[-3000:]

    attempts = report_of(ws)["chunks"]["c0000"]["attempts"]
    assert attempts[0]["exit_code"] == 75, attempts  # the store unavailable after retries: temporary
    assert attempts[-1]["outcome"] == "done" and len(attempts) >= 2, attempts

    out = objects(s3, f"{ws.job}/out")
    assert sorted(out) == sorted(f"{ws.job}/out/{f.name}" for f in made)
    assert all(whole(o) for o in out.values())  # nothing partial: every object hashes to its sha256
    uploads = s3.client().list_multipart_uploads(Bucket=BUCKET, Prefix=f"{ws.job}/").get("Uploads", [])
    assert uploads == []
    assert down.seen_before and all(whole(o) for o in down.seen_before.values())
    for key, before in down.seen_before.items():  # committed before the stop: never written again
        assert out[key]["meta"][META_ATTEMPT] == "1" and out[key]["data"] == before["data"], key


@dataclass
class BucketGoneAfterCommits(Polling):
    """Once ``after`` outputs are in ``bucket``: empty it and delete it (again until it is gone:
    the runner keeps committing while it is emptied)."""

    s3: S3Server
    bucket: str
    after: int
    interval = 0.05
    committed_before: set[str] = field(default_factory=set)
    gone: bool = False

    def poll(self) -> None:
        if self.gone:
            return
        c = self.s3.client()
        listed = [o["Key"] for o in c.list_objects_v2(Bucket=self.bucket).get("Contents", [])]
        if not self.committed_before and len(listed) < self.after:
            return
        self.committed_before |= set(listed)
        for key in listed:
            c.delete_object(Bucket=self.bucket, Key=key)
        with contextlib.suppress(c.exceptions.ClientError):  # BucketNotEmpty: a commit landed meanwhile
            c.delete_bucket(Bucket=self.bucket)
            self.gone = True


def test_a_bucket_deleted_mid_job_fails_the_items_naming_it_and_loses_nothing_else(
    workspace: Workspace, swarm: DockerSwarm, s3: S3Server
) -> None:
    ws = workspace
    star = photos.astronaut(ws.dir / "faces")
    chown_tree(ws.dir, ws.config.runner_uid_gid())
    made = photos.face_photos(ws.dir / "made", 120)  # many left to commit once the bucket is gone
    put_inputs(s3, f"{ws.job}/in", made)
    inputs_before = objects(s3, f"{ws.job}/in")
    out_bucket = s3.rgw.new_bucket()
    job_file = ws.write_job(
        f"name: {ws.job}\nsource: {ws.rel(star)}\ntargets: ['s3://{BUCKET}/{ws.job}/in/*.jpg']\n"
        f"output: 's3://{out_bucket}/{ws.job}/{{stem}}{{ext}}'\nchunk_size: 120\nretries: 1\n{COMMON}"
    )
    try:
        with BucketGoneAfterCommits(s3, out_bucket, after=3) as gone:
            proc = ws.ffswarm("submit", str(job_file), config=config_with_s3(s3, ws))
    finally:
        with contextlib.suppress(Exception):
            s3.rgw.remove_bucket(out_bucket)
    assert gone.gone, "the job ended before the bucket was deleted: more photos are needed"
    assert proc.returncode != 0, proc.stdout[-3000:]

    report = report_of(ws)
    ok = {r.item for r in results_of(ws) if r.status is ItemStatus.OK}
    assert ok and report["counts"]["ok"] == len(ok)  # what was committed before stays recorded as done
    assert report["failures"] and len(report["failures"]) + len(ok) == len(made)
    for failure in report["failures"]:  # each not-done item names the missing bucket
        assert out_bucket in (failure["reason"] or ""), failure
    assert out_bucket in proc.stderr + proc.stdout
    assert objects(s3, f"{ws.job}/in") == inputs_before  # the inputs' bucket: untouched
