"""Deleting finished jobs (controller/run/deletion.py): ``DELETE /v1/jobs/{id}`` over real HTTP,
`ffswarm delete`, and the retention `serve` applies — on real files of fabricated finished jobs."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from contract.results import ItemResult, ItemStatus
from controller.api.area import Area
from controller.apiconfig import parse_tenants
from controller.cli.main import cli
from controller.config import Config
from controller.errors import FfswarmError
from controller.job import claims
from controller.job.plan import Chunk, Plan, PlannedItem, PlannedVideo
from controller.run import links
from controller.run.metrics import Metrics
from controller.run.rundir import Control, RunDir
from controller.serve.daemon import Outcome, Server
from controller.serve.inbox import Inbox
from controller.serve.retention import Retention
from controller.settings.fields import FieldError
from tests.builders import JPEG, MP4, Env, api_env, make_config

JOB = "party-abcdefgh"
OTHER = "other-abcdefgh"


@pytest.fixture
def env(tmp_path: Path) -> Iterator[Env]:
    yield from api_env(tmp_path, quota={"upload": "64k", "stored": "50k", "jobs_queued": 100})


def finished_job(root: Path, job: str, tenant: str | None = "acme", size: int = 1000, report: bool = True) -> RunDir:
    """A job as `serve` leaves it once it ended: uploads, two committed outputs (result lines with
    their size and sha256), a shared input it read, its report, inbox done file, links record and
    retry marker."""
    top = f"tenants/{tenant}" if tenant else "cli"
    if tenant is not None:
        area = Area(root, tenant)
        area.ensure(None)
        area.write_record(job, uploads=True)
        up = root / top / "uploads" / job
        up.mkdir(parents=True)
        (up / "t.jpg").write_bytes(JPEG + b"\0" * size)
        links.revoke(root, tenant, job)
        (area.records / f"{job}.retry").write_text("{}")
    shared = root / top / "in" / "shared.jpg"
    shared.parent.mkdir(parents=True, exist_ok=True)
    shared.write_bytes(JPEG)
    outs = [f"{top}/out/{job}/{n}.jpg" for n in range(2)]
    items = tuple(PlannedItem(f"i{n:06d}", f"{top}/in/shared.jpg", out, "image") for n, out in enumerate(outs))
    rd = RunDir(root, job)
    rd.create(b"name: x\n", Plan(job, items, (Chunk("c0000", tuple(i.id for i in items)),)), {}, Control(1), "sha256:x")
    lines = []
    for item in items:
        body = JPEG + job.encode() * size
        (root / item.output).parent.mkdir(parents=True, exist_ok=True)
        (root / item.output).write_bytes(body)
        digest = hashlib.sha256(body).hexdigest()
        r = ItemResult(item.id, ItemStatus.OK, 1, f"/data/{item.input}", f"/data/{item.output}",
                       started=1, finished=2, size=len(body), sha256=digest)  # fmt: skip
        lines.append(r.to_line())
    (rd.path / "results" / "c0000.jsonl").write_text("".join(lines))
    if report:
        rd.write_report({"job": job, "items": {"ok": 2}})
        done = root / "inbox" / "done"
        done.mkdir(parents=True, exist_ok=True)
        (done / f"{job}.yaml").write_text("name: x\n")
    return rd


def files(root: Path) -> set[str]:
    """Every file and link under the data root (folders left out), relative to it."""
    return {p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_symlink() or not p.is_dir()}


def of(job: str, tenant: str = "acme") -> set[str]:
    """The paths a tenant's finished job above owns."""
    return {
        f"tenants/{tenant}/uploads/{job}/t.jpg",
        f"tenants/{tenant}/out/{job}/0.jpg",
        f"tenants/{tenant}/out/{job}/1.jpg",
        f"tenants/.jobs/{tenant}/{job}.json",
        f"tenants/.jobs/{tenant}/{job}.links",
        f"tenants/.jobs/{tenant}/{job}.retry",
        f"inbox/done/{job}.yaml",
    }


def _upload(env: Env, size: int):  # type: ignore[no-untyped-def]
    with env.client() as c:
        body = JPEG + b"\0" * size
        return c.post("/v1/jobs", files=[("source", ("me.jpg", JPEG)), ("targets", ("t.jpg", body))])


def test_delete_removes_exactly_the_jobs_files_and_frees_the_quota(env: Env) -> None:
    finished_job(env.root, JOB, size=10_000)  # about 30 kB of the 50 kB quota
    again = env.root / "inbox" / "done" / f"{JOB}.20260101T000000-0123abcd.yaml"  # it ended twice (a retry)
    again.write_text("name: x\n")
    finished_job(env.root, OTHER, size=10)
    refused = _upload(env, 30_000)
    assert refused.status_code == 429, refused.text
    assert "DELETE /v1/jobs/{id}" in refused.json()["error"]["message"]
    before = files(env.root)
    assert of(JOB) <= before
    with env.client() as c:
        r = c.delete(f"/v1/jobs/{JOB}")
        assert r.status_code == 204 and r.content == b""
        assert c.get(f"/v1/jobs/{JOB}").status_code == 404
        assert [j["job"] for j in c.get("/v1/jobs").json()["jobs"]] == [OTHER]
        assert c.delete(f"/v1/jobs/{JOB}").status_code == 404  # gone
    after = files(env.root)
    gone = before - after
    listed = {p for p in before if p.startswith("tenants/.jobs/acme/.index/") and p.endswith(f"_{JOB}")}
    assert len(listed) == 1  # its entry in the tenant's job list goes with it
    assert {p for p in gone if not p.startswith(f"runs/{JOB}/")} == of(JOB) | {f"inbox/done/{again.name}"} | listed
    assert not (env.root / "runs" / JOB).exists()
    assert not (env.area() / "out" / JOB).exists() and not (env.area() / "uploads" / JOB).exists()
    assert (env.area() / "in" / "shared.jpg").read_bytes() == JPEG  # the shared input stays
    assert of(OTHER) <= after and (env.root / "runs" / OTHER / "report.json").exists()
    passed = _upload(env, 30_000)  # the freed bytes count at once
    assert passed.status_code == 202, passed.text


def test_a_running_or_queued_job_is_409_and_another_tenants_404(env: Env) -> None:
    results = finished_job(env.root, JOB, report=False).path / "results" / "c0000.jsonl"
    results.write_text(results.read_text().splitlines(keepends=True)[0])  # one item still runs
    queued = "queued-abcdefgh"
    Area(env.root, "acme").write_record(queued, uploads=False)
    env.inbox_file(queued).write_text("name: x\n")
    retried = "retried-abcdefgh"  # finished once, handed back and claimed by serve again
    finished_job(env.root, retried)
    (env.root / "inbox" / "running").mkdir()
    (env.root / "inbox" / "running" / f"{retried}.{'0' * 32}.yaml").write_text("name: x\n")
    finished_job(env.root, OTHER)
    before = files(env.root)
    with env.client() as c:
        for job in (JOB, queued, retried):
            r = c.delete(f"/v1/jobs/{job}")
            assert r.status_code == 409 and r.json()["error"]["code"] == "not_finished", r.text
    with env.client("globex") as c:
        r = c.delete(f"/v1/jobs/{OTHER}")
        assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"
        assert c.delete("/v1/jobs/..%2f..%2fetc").status_code == 404
    assert files(env.root) == before  # nothing touched


def test_outputs_another_job_claims_and_links_swapped_in_are_left(env: Env) -> None:
    finished_job(env.root, JOB)
    area = env.area()
    claimed = f"tenants/acme/out/{JOB}/1.jpg"
    claims.claim(env.root, OTHER, [claimed], "other.yaml")  # another job claims it now
    # the uploads folder swapped for a link to a folder of the tenant's own: the link goes, not what it names
    keep = area / "keep"
    keep.mkdir()
    (keep / "t.jpg").write_bytes(b"keep me")
    up = area / "uploads" / JOB
    for p in up.iterdir():
        p.unlink()
    up.rmdir()
    up.symlink_to(keep)
    with env.client() as c:
        assert c.delete(f"/v1/jobs/{JOB}").status_code == 204
    assert (env.root / claimed).exists()  # claimed by the other job
    assert not (area / f"out/{JOB}/0.jpg").exists()
    assert not os.path.lexists(up) and (keep / "t.jpg").read_bytes() == b"keep me"

    # an output folder swapped for a link to a copy of the outputs: nothing behind the link is removed
    job = "swap-abcdefgh"
    finished_job(env.root, job)
    out = area / "out" / job
    copy = area / "copy"
    out.rename(copy)
    out.symlink_to(copy)
    with env.client() as c:
        assert c.delete(f"/v1/jobs/{job}").status_code == 204
    assert sorted(p.name for p in copy.iterdir()) == ["0.jpg", "1.jpg"]
    assert not (env.root / "runs" / job).exists()


def test_a_packs_folder_goes_with_its_last_member(env: Env) -> None:
    pack = "pack-abcdefgh"
    (env.root / "runs" / pack).mkdir(parents=True)
    (env.root / "runs" / pack / "members.json").write_text(json.dumps({JOB: {}, OTHER: {}}))
    for job in (JOB, OTHER):
        rd = finished_job(env.root, job)
        (rd.path / "packed").write_text(pack)
    with env.client() as c:
        assert c.delete(f"/v1/jobs/{JOB}").status_code == 204
        assert (env.root / "runs" / pack).is_dir()  # OTHER's run folder remains
        assert c.delete(f"/v1/jobs/{OTHER}").status_code == 204
    assert not (env.root / "runs" / pack).exists()


def test_ffswarm_delete_a_cli_job(env: Env, tmp_path: Path) -> None:
    job = "cli-job"
    results = finished_job(env.root, job, tenant=None, report=False).path / "results" / "c0000.jsonl"
    results.write_text(results.read_text().splitlines(keepends=True)[0])  # one item still runs
    path = tmp_path / "ffswarm.yaml"
    r = CliRunner().invoke(cli, ["--config", str(path), "delete", job])
    # main() exits with the error's exit code and prints its message (tests/unit/test_cli_conventions.py)
    assert isinstance(r.exception, FfswarmError) and r.exception.exit_code == 2
    assert str(r.exception) == "job 'cli-job' is running; delete it once it has finished (or cancel it first)"
    assert (env.root / "runs" / job).is_dir()
    RunDir(env.root, job).write_report({"job": job})  # ended: its report written
    r = CliRunner().invoke(cli, ["--config", str(path), "delete", job])
    assert r.exit_code == 0, r.output
    assert not (env.root / "runs" / job).exists()
    assert (env.root / "cli" / "out" / job / "0.jpg").exists()  # outputs only with --outputs

    finished_job(env.root, "cli-two", tenant=None)
    r = CliRunner().invoke(cli, ["--config", str(path), "delete", "--outputs", "cli-two"])
    assert r.exit_code == 0, r.output
    assert not (env.root / "cli" / "out" / "cli-two").exists() and not (env.root / "inbox/done/cli-two.yaml").exists()
    assert (env.root / "cli" / "in" / "shared.jpg").exists()

    finished_job(env.root, JOB)  # a tenant's job: as DELETE does it
    r = CliRunner().invoke(cli, ["--config", str(path), "delete", JOB])
    assert r.exit_code == 0 and "tenant acme" in r.output, r.output
    assert not (env.area() / "out" / JOB).exists() and Area(env.root, "acme").record(JOB) is None
    r = CliRunner().invoke(cli, ["--config", str(path), "delete", "nojob"])
    assert isinstance(r.exception, FfswarmError) and r.exception.exit_code == 66
    assert str(r.exception) == "no job 'nojob'"


DAY = 86400.0


def test_retention_deletes_only_jobs_finished_longer_ago_at_most_once_a_minute(tmp_path: Path) -> None:
    config, _ = make_config(tmp_path)
    acme = dataclasses.replace(config.tenants["acme"], retention=7 * 86400)
    config = dataclasses.replace(config, tenants={**config.tenants, "acme": acme})
    root = config.data_root
    now = 1_900_000_000.0
    old, young, running, kept = "old-abcdefgh", "young-abcdefgh", "running-abcdefgh", "globex-abcdefgh"
    for job, tenant, age in ((old, "acme", 8 * DAY), (young, "acme", 7 * DAY - 10), (kept, "globex", 30 * DAY)):
        rd = finished_job(root, job, tenant)
        for f in (rd.layout.report, root / "inbox" / "done" / f"{job}.yaml"):
            os.utime(f, (now - age, now - age))
    cancelled = "cancelled-abcdefgh"  # cancelled before it ran: its record's time
    area = Area(root, "acme")
    area.write_record(cancelled, uploads=False)
    area.mark_cancelled(cancelled)
    os.utime(area.records / f"{cancelled}.json", (now - 9 * DAY, now - 9 * DAY))
    results = finished_job(root, running, report=False).path / "results" / "c0000.jsonl"
    results.write_text(results.read_text().splitlines(keepends=True)[0])  # one item still runs
    os.utime(results, (now - 30 * DAY, now - 30 * DAY))
    clock = [now]
    sweep = Retention(config, clock=lambda: clock[0])

    assert sweep.tick() == [cancelled, old]
    assert not (root / "runs" / old).exists() and not (area.path / "out" / old).exists()
    assert (root / "runs" / young).is_dir() and (root / "runs" / running).is_dir()
    assert (root / "runs" / kept).is_dir()  # globex has no retention
    clock[0] = now + 30  # the young job is past its 7 days now, but the sweep ran under a minute ago
    assert sweep.tick() == [] and (root / "runs" / young).is_dir()
    clock[0] = now + 61
    assert sweep.tick() == [young]
    assert not of(young) & files(root)
    assert area.jobs() == [running]


def test_retention_is_read_as_days_or_a_duration() -> None:
    key = {"api_keys_sha256": ["a" * 64]}
    assert parse_tenants({"a": {**key, "retention": "7d"}})["a"].retention == 7 * 86400
    assert parse_tenants({"a": {**key, "retention": "36h"}})["a"].retention == 36 * 3600
    assert parse_tenants({"a": key})["a"].retention is None
    with pytest.raises(
        FieldError, match=r"tenants\.a\.retention: must be a duration like 7d, 36h or 90m, got '7 days'"
    ):
        parse_tenants({"a": {**key, "retention": "7 days"}})


def test_a_joined_video_goes_only_while_it_is_what_its_join_wrote(env: Env) -> None:
    root = env.root
    videos = []
    for job, body in ((JOB, MP4), (OTHER, MP4)):
        Area(root, "acme").write_record(job, uploads=False)
        video = PlannedVideo("v000000", "tenants/acme/in/v.mp4", f"tenants/acme/out/{job}/v.mp4")
        rd = RunDir(root, job)
        rd.create(b"name: x\n", Plan(job, (), (), (video,)), {}, Control(1), "sha256:x")
        out = root / video.output
        out.parent.mkdir(parents=True)
        out.write_bytes(body)
        line = ItemResult(video.id, ItemStatus.OK, 1, f"/data/{video.input}", f"/data/{video.output}",
                          size=len(body), sha256=hashlib.sha256(body).hexdigest())  # fmt: skip
        (rd.path / "joins.jsonl").write_text(line.to_line())
        rd.write_report({"job": job})
        videos.append(out)
    videos[1].write_bytes(MP4 + b"rewritten since by someone else")
    with env.client() as c:
        assert c.delete(f"/v1/jobs/{JOB}").status_code == 204
        assert c.delete(f"/v1/jobs/{OTHER}").status_code == 204
    assert not videos[0].exists() and not videos[0].parent.exists()
    assert videos[1].read_bytes().endswith(b"someone else")  # not what its join wrote: kept


def test_serve_applies_retention_from_its_loop(tmp_path: Path) -> None:
    config, _ = make_config(tmp_path)
    acme = dataclasses.replace(config.tenants["acme"], retention=86400)
    config = dataclasses.replace(config, tenants={**config.tenants, "acme": acme})
    rd = finished_job(config.data_root, JOB)
    later = rd.layout.report.stat().st_mtime + 2 * DAY  # the clock the sweep reads: two days on

    def run(config: Config, path: Path, metrics: Metrics) -> Outcome:
        return Outcome(True, None)

    server = Server(config, Inbox(config.data_root / "inbox"), Metrics(), poll=0.05, run=run, heartbeat_every=0.1)
    server.retention = Retention(config, clock=lambda: later)
    t = threading.Thread(target=server.serve_forever, daemon=True)
    t.start()
    try:
        deadline = time.monotonic() + 10
        while rd.path.exists():
            assert time.monotonic() < deadline, "serve never applied the retention"
            time.sleep(0.05)
    finally:
        server.stop.set()
        t.join(5)
    assert Area(config.data_root, "acme").jobs() == []
