"""`ffswarm api` over real HTTP: tenant isolation, status/report/cancel, results.zip and signed links,
events — on a run folder fabricated as a finished job would leave it."""

from __future__ import annotations

import io
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest

from contract.results import ItemResult, ItemStatus
from controller.api.area import Area
from controller.job.plan import Chunk, Plan, PlannedItem
from controller.run.rundir import Control, RunDir
from tests.builders import Env, api_env

JOB = "party-abcdefgh"


@pytest.fixture
def env(tmp_path: Path) -> Iterator[Env]:
    yield from api_env(tmp_path)


def finished_run(env: Env, job: str = JOB, tenant: str = "acme", report: bool = True) -> RunDir:
    area = Area(env.root, tenant)
    area.ensure(None)
    area.write_record(job, uploads=False)
    out = f"tenants/{tenant}/out/{job}"
    items = tuple(PlannedItem(f"i{n:06d}", f"tenants/{tenant}/in/{n}.jpg", f"{out}/{n}.jpg", "image") for n in range(4))
    plan = Plan(job, items, (Chunk("c0000", tuple(i.id for i in items)),))
    rd = RunDir(env.root, job)
    rd.create(b"name: x\n", plan, {}, Control(2), "sha256:x")
    (env.root / out).mkdir(parents=True)
    lines = []
    now = time.time()
    for n, item in enumerate(items):
        status = ItemStatus.ERROR if n == 2 else ItemStatus.OK
        path = None if n == 2 else f"/data/{item.output}"
        if path:
            (env.root / item.output).write_bytes(f"output {n}".encode() * 1000)
        lines.append(ItemResult(item.id, status, 1, f"/data/{item.input}", path, started=now, finished=now).to_line())
    (env.root / out / "stray.jpg").write_bytes(b"not this job's")  # never committed: not in the ZIP
    (env.root / out / "2.jpg").write_bytes(b"a failed item's leftover")
    (rd.path / "results" / "c0000.jsonl").write_text("".join(lines))
    if report:
        rd.write_report({"job": job, "items": {"ok": 3, "failed": 1}})
    return rd


def test_another_tenants_job_is_404_for_every_route(env: Env) -> None:
    finished_run(env)
    with env.client("globex") as c:
        for path in ("", "/report", "/results.zip", "/events"):
            r = c.get(f"/v1/jobs/{JOB}{path}")
            assert r.status_code == 404 and r.json()["error"]["code"] == "not_found", path
        assert c.post(f"/v1/jobs/{JOB}/cancel").status_code == 404
        assert c.get("/v1/jobs").json()["jobs"] == []
    with env.client("acme") as c:
        assert [j["job"] for j in c.get("/v1/jobs").json()["jobs"]] == [JOB]
        row = c.get(f"/v1/jobs/{JOB}").json()
        assert row["phase"] == "finished" and row["items"]["ok"] == 3 and row["items"]["failed"] == 1
        assert row["owner"] == "acme"
        assert c.get(f"/v1/jobs/{JOB}/report").json()["items"] == {"ok": 3, "failed": 1}
        assert c.get("/v1/jobs/nojob-aaaaaaaa").status_code == 404


def test_results_zip_streams_exactly_the_committed_outputs(env: Env) -> None:
    finished_run(env)
    with env.client() as c, c.stream("GET", f"/v1/jobs/{JOB}/results.zip") as r:
        assert r.status_code == 200 and r.headers["content-type"] == "application/zip"
        assert "content-length" not in r.headers  # streamed while built
        pieces = list(r.iter_raw())
    with zipfile.ZipFile(io.BytesIO(b"".join(pieces))) as zf:
        assert sorted(zf.namelist()) == [f"out/{JOB}/0.jpg", f"out/{JOB}/1.jpg", f"out/{JOB}/3.jpg"]
        assert zf.read(f"out/{JOB}/3.jpg") == b"output 3" * 1000
        assert zf.testzip() is None


def test_a_committed_output_swapped_for_a_symlink_is_left_out(env: Env) -> None:
    finished_run(env)
    out = env.root / "tenants" / "acme" / "out" / JOB / "0.jpg"
    out.unlink()
    out.symlink_to("/etc/passwd")
    with env.client() as c:
        data = c.get(f"/v1/jobs/{JOB}/results.zip").content
    with zipfile.ZipFile(io.BytesIO(data)) as zf:
        assert sorted(zf.namelist()) == [f"out/{JOB}/1.jpg", f"out/{JOB}/3.jpg"]


def test_a_signed_link_works_without_a_token_and_not_once_expired_or_tampered(env: Env) -> None:
    finished_run(env)
    with env.client() as c:
        link = c.get(f"/v1/jobs/{JOB}").json()["results_url"]
    path, query = urlsplit(link).path, parse_qs(urlsplit(link).query)
    with env.client(tenant=None) as anon:
        assert anon.get(f"/v1/jobs/{JOB}/results.zip").status_code == 401
        ok = anon.get(link)
        assert ok.status_code == 200 and zipfile.ZipFile(io.BytesIO(ok.content)).namelist()
        sig, expires = query["sig"][0], int(query["expires"][0])
        tampered = anon.get(path, params={"expires": expires + 3600, "sig": sig})
        assert tampered.status_code == 403 and tampered.json()["error"]["code"] == "bad_signature"
        other = anon.get("/v1/jobs/other-abcdefgh/results.zip", params={"expires": expires, "sig": sig})
        assert other.status_code == 403
        from controller.run import links

        old = links.sign(links.SigningKeys(env.signing_key), "GET", path, ttl=10, now=time.time() - 60)
        expired = anon.get(old)
        assert expired.status_code == 403 and expired.json()["error"]["code"] == "link_expired"


def test_cancel_flags_a_running_job_and_takes_a_queued_one_out_of_the_inbox(env: Env) -> None:
    rd = finished_run(env, report=False)
    results = rd.path / "results" / "c0000.jsonl"
    results.write_text(results.read_text().splitlines(keepends=True)[0])  # one item done, three to go
    with env.client() as c:
        r = c.post(f"/v1/jobs/{JOB}/cancel")
        assert r.status_code == 200 and rd.control().cancel
        queued = "queued-abcdefgh"
        Area(env.root, "acme").write_record(queued, uploads=False)
        env.inbox_file(queued).write_text("name: x\n")
        assert c.post(f"/v1/jobs/{queued}/cancel").status_code == 200
        assert not env.inbox_file(queued).exists()
        assert c.get(f"/v1/jobs/{queued}").json()["phase"] == "cancelled"


def test_cancelling_a_started_job_waiting_in_the_inbox_flags_it_and_leaves_its_file_for_serve(env: Env) -> None:
    rd = finished_run(env, report=False)  # started, then handed back to wait (a full volume, say)
    results = rd.path / "results" / "c0000.jsonl"
    results.write_text(results.read_text().splitlines(keepends=True)[0])  # one item done, three to go
    env.inbox_file(JOB).write_text("name: x\n")
    with env.client() as c:
        assert c.post(f"/v1/jobs/{JOB}/cancel").json() == {"job": JOB, "cancelled": True}
    assert env.inbox_file(JOB).exists() and rd.control().cancel  # serve continues it and ends it cancelled


def test_events_stream_progress_then_the_end(env: Env) -> None:
    finished_run(env)
    with env.client() as c, c.stream("GET", f"/v1/jobs/{JOB}/events") as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        text = "".join(r.iter_text())
    assert text.index("event: progress") < text.index("event: end") and '"phase": "finished"' in text


def test_the_run_folders_owner_decides_once_serve_wrote_it(env: Env) -> None:
    rd = finished_run(env)
    rd.write_file(rd.layout.owner, b"acme\n")  # what serve writes when it starts acme's job
    with env.client("acme") as c:
        row = c.get(f"/v1/jobs/{JOB}").json()
        assert row["owner"] == "acme" and row["phase"] == "finished"
        link = row["results_url"]
    with env.client(tenant=None) as anon:
        assert anon.get(link).status_code == 200
    rd.write_file(rd.layout.owner, b"globex\n")  # the run folder says otherwise: the record no longer suffices
    with env.client("acme") as c:
        for path in ("", "/report", "/results.zip", "/events"):
            assert c.get(f"/v1/jobs/{JOB}{path}").status_code == 404, path
        assert c.post(f"/v1/jobs/{JOB}/cancel").status_code == 404
    with env.client(tenant=None) as anon:
        assert anon.get(link).status_code == 404
