"""`POST /v1/jobs/{id}/scale` and `/retry` over real HTTP on loopback, and the completion webhook's signed
results link. A retried job goes through what `serve` does with an inbox file (claim, owner check,
prepare, pending chunks), on a run folder made by the same code a real run uses."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest
import yaml

from contract.results import ItemResult, ItemStatus
from controller.api.auth import verify_link
from controller.apiconfig import ApiSettings
from controller.config import Config
from controller.job.spec import OnComplete
from controller.policy import Policy
from controller.run import job_lease, links, usecase
from controller.run.fold import Fold
from controller.run.hooks import DELIVERED, on_complete, results_link
from controller.run.jobs import start_run
from controller.run.rundir import RunDir, Stage
from controller.serve import daemon as serve
from controller.serve.inbox import Inbox
from tests.builders import JPEG, Env, api_env
from tests.unit.test_hooks import Server, loopback

IMAGE = "sha256:" + "1" * 64


@pytest.fixture
def env(tmp_path: Path) -> Iterator[Env]:
    yield from api_env(tmp_path, quota={"jobs_queued": 2, "gpus": 4})


def submit(env: Env, **fields: object) -> str:
    with env.client() as c:
        c.get("/v1/jobs")  # the area is made on first use
        for rel in ("faces/me.jpg", "crowd/a.jpg", "crowd/b.jpg"):
            (env.area() / rel).parent.mkdir(exist_ok=True)
            (env.area() / rel).write_bytes(JPEG)
        body = {"source": "faces/me.jpg", "targets": ["crowd/*.jpg"], "chunk_size": 1, "resources": {"gpus": 0}}
        r = c.post("/v1/jobs", json={**body, **fields})
    assert r.status_code == 202, r.text
    return str(r.json()["id"])


def claim(config: Config, job: str) -> Path:
    """What serve's loop does with ``inbox/<job>.yaml``: claim it (mtime set back: it has settled)."""
    box = Inbox(config.data_root / "inbox", config.policy.limits.job_file)
    box.ensure()
    path = config.data_root / "inbox" / f"{job}.yaml"
    settled = time.time() - 10
    os.utime(path, (settled, settled))
    claimed = box.claim(path)
    assert claimed is not None
    return claimed


def run_once(config: Config, job: str, fail: set[str]) -> RunDir:
    """serve's first run of the job, as it leaves the run folder: one result per item (``fail``:
    chunk ids whose item failed), the report, the stage ended, the file moved to failed/."""
    claimed = claim(config, job)
    tenant = serve.job_owner(config, claimed)
    assert tenant == "acme"  # the owner record names these very bytes
    prepared = usecase.one_job(config, claimed, tenant=tenant)
    rundir = start_run(config, prepared, IMAGE)
    now = time.time()
    for chunk in rundir.plan().chunks:
        for item_id in chunk.items:
            item = next(i for i in rundir.plan().items if i.id == item_id)
            bad = chunk.id in fail
            if not bad:
                (config.data_root / item.output).write_bytes(JPEG)
            status, out = (ItemStatus.ERROR, None) if bad else (ItemStatus.OK, f"/data/{item.output}")
            reason = "boom" if bad else None
            line = ItemResult(item.id, status, 1, f"/data/{item.input}", out, reason, started=now, finished=now + 1)
            path = rundir.layout.results(chunk.id, 1)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(line.to_line())
    rundir.write_report({"job": job, "items": {"failed": len(fail)}})
    rundir.enter(Stage.ENDED)
    Inbox(config.data_root / "inbox").finish(claimed, not fail, "1 failed" if fail else None)
    return rundir


# -- retry -----------------------------------------------------------------------------------------
def test_a_retried_job_goes_back_to_serve_as_the_tenants_job_and_only_its_failed_chunk_runs(env: Env) -> None:
    job = submit(env)
    handed = env.inbox_file(job).read_bytes()
    rundir = run_once(env.config, job, fail={"c0001"})
    with env.client() as c:
        assert c.get(f"/v1/jobs/{job}").json()["phase"] == "finished"
        r = c.post(f"/v1/jobs/{job}/retry")
        assert r.status_code == 202, r.text
        assert r.json() == {"id": job, "status_url": f"/v1/jobs/{job}", "events_url": f"/v1/jobs/{job}/events",
                            "items": 1}  # fmt: skip
        assert env.inbox_file(job).read_bytes() == handed  # the bytes the owner record names
        assert c.get(f"/v1/jobs/{job}").json()["phase"] == "queued"
        again = c.post(f"/v1/jobs/{job}/retry")
        assert again.status_code == 409 and "already queued for a retry" in again.json()["error"]["message"]
    # serve claims it again: still the tenant's job, the run continues (outputs that exist are the
    # job's own: no overwrite refusal), and only the chunk with the failed item is pending
    claimed = claim(env.config, job)
    with env.client() as c:  # claimed, not taken up yet: still queued, not the run it was (`ffswarm retry` follows it)
        assert c.get(f"/v1/jobs/{job}").json()["phase"] == "queued"
    assert serve.job_owner(env.config, claimed) == "acme"
    prepared = usecase.one_job(env.config, claimed, tenant="acme")
    reopened, image = usecase.open_or_start(env.config, None, prepared)  # type: ignore[arg-type]
    assert image == IMAGE and reopened.path == rundir.path
    assert Fold.read(reopened.plan(), reopened).pending_chunks() == ["c0001"]


def test_retry_is_refused_while_queued_or_running_when_nothing_failed_and_for_another_tenant(env: Env) -> None:
    queued = submit(env)
    with env.client() as c:
        r = c.post(f"/v1/jobs/{queued}/retry")
        assert r.status_code == 409 and r.json()["error"]["code"] == "not_finished"
        assert env.client("globex").post(f"/v1/jobs/{queued}/retry").status_code == 404
    rundir = run_once(env.config, queued, fail=set())
    with env.client() as c:
        r = c.post(f"/v1/jobs/{queued}/retry")
        assert r.status_code == 409 and r.json()["error"]["code"] == "nothing_to_retry"
        assert (
            r.json()["error"]["message"]
            == f"job {queued!r} has no failed items: all 2 are done (2 ok, 0 without a face)"
        )
    failed = submit(env)
    rd = run_once(env.config, failed, fail={"c0000"})
    with job_lease.held(rd), env.client() as c:  # a controller runs it (a retry by the CLI, say)
        r = c.post(f"/v1/jobs/{failed}/retry")
        assert r.status_code == 409 and "running" in r.json()["error"]["message"]
    assert rundir.exists() and not env.inbox_file(failed).exists()


def test_a_retried_job_counts_against_the_queued_quota_until_it_ends(env: Env) -> None:
    first, second = submit(env), submit(env)  # jobs_queued: 2
    run_once(env.config, first, fail={"c0000"})
    run_once(env.config, second, fail={"c0000"})
    with env.client() as c:
        assert c.post(f"/v1/jobs/{first}/retry").status_code == 202
        assert c.post(f"/v1/jobs/{second}/retry").status_code == 202
        third = c.post("/v1/jobs", json={"source": "faces/me.jpg", "targets": ["crowd/a.jpg"]})
        assert third.status_code == 429 and third.headers["Retry-After"]
        assert c.post(f"/v1/jobs/{second}/cancel").json() == {"job": second, "cancelled": True}  # withdrawn
        assert not env.inbox_file(second).exists()
        assert c.get(f"/v1/jobs/{second}").json()["phase"] == "finished"
        assert c.post("/v1/jobs", json={"source": "faces/me.jpg", "targets": ["crowd/a.jpg"],
                                        "resources": {"gpus": 0}}).status_code == 202  # fmt: skip


# -- scale -----------------------------------------------------------------------------------------
def test_scale_of_a_running_job_writes_its_control_capped_by_the_policy_and_the_gpu_quota(env: Env) -> None:
    job = submit(env, resources={"gpus": 1})
    claimed = claim(env.config, job)
    rundir = start_run(env.config, usecase.one_job(env.config, claimed, tenant="acme"), IMAGE)
    with env.client() as c:
        r = c.post(f"/v1/jobs/{job}/scale", json={"max_concurrent": 3})
        assert r.status_code == 200 and r.json() == {"job": job, "max_concurrent": 3}
        assert rundir.control().max_concurrent == 3 and c.get(f"/v1/jobs/{job}").json()["max_concurrent"] == 3
        over = c.post(f"/v1/jobs/{job}/scale", json={"max_concurrent": 5})  # quota.gpus: 4, 1 GPU a chunk
        assert over.status_code == 422 and over.json()["error"]["field"] == "max_concurrent"
        assert "this tenant's quota.gpus is 4" in over.json()["error"]["message"]
        limit = env.config.policy.limits.max_concurrent
        r = c.post(f"/v1/jobs/{job}/scale", json={"max_concurrent": limit + 1})
        assert r.status_code == 422 and "policy.limits.max_concurrent" in r.json()["error"]["message"]
        assert rundir.control().max_concurrent == 3
        assert env.client("globex").post(f"/v1/jobs/{job}/scale", json={"max_concurrent": 1}).status_code == 404
        rundir.write_report({"job": job})
        rundir.enter(Stage.ENDED)
        done = c.post(f"/v1/jobs/{job}/scale", json={"max_concurrent": 2})
        assert done.status_code == 409 and done.json()["error"]["code"] == "finished"


@pytest.mark.parametrize(
    ("body", "status", "field"),
    [
        (b"not json", 400, None),
        (b"[1]", 422, None),
        (b"{}", 422, "max_concurrent"),
        (b'{"max_concurrent": 0}', 422, "max_concurrent"),
        (b'{"max_concurrent": "4"}', 422, "max_concurrent"),
        (b'{"max_concurrent": true}', 422, "max_concurrent"),
        (b'{"max_concurrent": 2, "cancel": true}', 422, "cancel"),
    ],
)
def test_a_bad_scale_body_names_the_field(env: Env, body: bytes, status: int, field: str | None) -> None:
    job = submit(env)
    with env.client() as c:
        r = c.post(f"/v1/jobs/{job}/scale", content=body, headers={"Content-Type": "application/json"})
    assert r.status_code == status and r.json()["error"].get("field") == field


def test_scale_of_a_queued_job_is_kept_for_when_serve_starts_it(env: Env) -> None:
    job = submit(env)
    with env.client() as c:
        r = c.post(f"/v1/jobs/{job}/scale", json={"max_concurrent": 4})
        assert r.status_code == 200, r.text
        assert c.get(f"/v1/jobs/{job}").json()["phase"] == "queued"
    assert yaml.safe_load(env.inbox_file(job).read_text())["max_concurrent"] == 4
    claimed = claim(env.config, job)
    assert serve.job_owner(env.config, claimed) == "acme"  # the record names the new file
    with env.client() as c:  # claimed, its run folder not made yet: ask again in a moment
        r = c.post(f"/v1/jobs/{job}/scale", json={"max_concurrent": 2})
        assert r.status_code == 409 and r.json()["error"]["code"] == "not_started" and r.headers["Retry-After"]
    prepared = usecase.one_job(env.config, claimed, tenant="acme")
    assert start_run(env.config, prepared, IMAGE).control().max_concurrent == 4  # it starts at that width


# -- the webhook's link ----------------------------------------------------------------------------
def test_the_completion_webhook_of_a_tenants_job_carries_a_signed_results_link(env: Env, tmp_path: Path) -> None:
    job = submit(env)
    rundir = run_once(env.config, job, fail=set())
    rundir.write_file(rundir.layout.owner, b"acme\n")  # serve writes it when the run starts
    api = ApiSettings(signing_key_file=env.config.api.signing_key_file, link_ttl=3600,
                      public_url="https://faces.example.com")  # fmt: skip
    extra = results_link(env.root, job, env.config.tenants, api)
    url = urlsplit(extra["results_url"])
    assert (url.scheme, url.netloc, url.path) == ("https", "faces.example.com", f"/v1/jobs/{job}/results.zip")
    q = {k: v[0] for k, v in parse_qs(url.query).items()}
    verify_link(links.SigningKeys(env.signing_key), "GET", url.path, q, 3600)  # the API accepts it
    assert abs(int(q["expires"]) - (time.time() + 3600)) < 60
    with env.client(tenant=None) as c:  # and it downloads without a token
        assert c.get(f"{url.path}?{url.query}").status_code == 200
    relative = results_link(env.root, job, env.config.tenants, env.config.api)["results_url"]
    assert relative.startswith(f"/v1/jobs/{job}/results.zip?expires=")
    assert results_link(env.root, "cli-job", env.config.tenants, api) == {}  # no owner: a CLI job
    assert results_link(env.root, job, env.config.tenants, ApiSettings()) == {}  # links off

    server = Server()
    try:
        report = {"job": job, "counts": {"ok": 2}}
        out = on_complete(Policy(webhooks=loopback(tmp_path)), OnComplete(webhook=server.url()), report,
                          tmp_path / "r", extra)  # fmt: skip
        assert out == {"webhook": DELIVERED}
        sent = json.loads(server.requests[0][1])
        assert sent["type"] == "job.finished" and sent["data"] == {**report, "results_url": extra["results_url"]}
    finally:
        server.httpd.shutdown()
        server.httpd.server_close()
