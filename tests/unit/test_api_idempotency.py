"""`Idempotency-Key` on `POST /v1/jobs` over real HTTP on loopback: a repeated request gets the same job,
a different body with the key is 422, racing requests make exactly one job, and a refusal frees the key."""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from controller.api import idempotency
from controller.api.area import Area
from tests.builders import JPEG, KEYS, PNG, Env, beat, make_config, serve_api

BODY = {"source": "faces/me.jpg", "targets": ["crowd/*.jpg"], "resources": {"gpus": 0}}


@pytest.fixture
def env(tmp_path: Path) -> Iterator[Env]:
    config, key = make_config(tmp_path, quota={"jobs_queued": 50})
    beat(config)
    for url in serve_api(config):
        with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {KEYS['acme']}"}) as c:
            c.get("/v1/jobs")  # the area is made on first use
        area = config.data_root / "tenants" / "acme"
        for rel in ("faces/me.jpg", "crowd/a.jpg"):
            (area / rel).parent.mkdir(exist_ok=True)
            (area / rel).write_bytes(JPEG)
        yield Env(config, config.data_root, url, key)


def jobs(env: Env, tenant: str = "acme") -> list[str]:
    return Area(env.root, tenant).jobs()


def post(env: Env, key: str | None, body: object = BODY, tenant: str = "acme") -> httpx.Response:
    headers = {} if key is None else {"Idempotency-Key": key}
    with env.client(tenant) as c:
        return c.post("/v1/jobs", json=body, headers=headers)


def test_the_same_key_and_body_answer_the_same_job_once(env: Env) -> None:
    first = post(env, "order-1234")
    assert first.status_code == 202, first.text
    again = post(env, "order-1234", {"resources": {"gpus": 0}, "targets": ["crowd/*.jpg"], "source": "faces/me.jpg"})
    assert again.status_code == 202 and again.json() == first.json()  # key order is not part of the body
    assert again.headers["Idempotent-Replayed"] == "true" and again.headers["Location"] == first.json()["status_url"]
    assert jobs(env) == [first.json()["id"]]  # one job, one inbox file
    assert len(os.listdir(env.root / "inbox")) == 2  # the job file and the heartbeat folder
    other = post(env, "order-1235")  # another key: another job
    assert other.status_code == 202 and other.json()["id"] != first.json()["id"]
    for_globex = post(env, "order-1234", tenant="globex")  # keys are per tenant: its own request, checked
    assert for_globex.status_code == 422 and for_globex.json()["error"]["code"] == "invalid_job"  # no files there
    records = list((env.root / "tenants" / ".jobs" / "acme" / ".keys").iterdir())
    assert len(records) == 2 and not any("order-1234" in p.read_text() for p in records)  # only its digest


def test_the_same_key_with_another_body_is_422_and_makes_nothing(env: Env) -> None:
    first = post(env, "k")
    changed = post(env, "k", {**BODY, "faces": "all"})
    assert changed.status_code == 422
    assert changed.json()["error"]["code"] == "idempotency_mismatch"
    assert changed.json()["error"]["field"] == "Idempotency-Key"
    assert jobs(env) == [first.json()["id"]]


@pytest.mark.parametrize("bad", ["", "x" * 201, "tab\there", "é"])
def test_a_bad_key_is_400_naming_the_header(env: Env, bad: str) -> None:
    with env.client() as c:
        r = c.post("/v1/jobs", json=BODY, headers={"Idempotency-Key": bad.encode("utf-8")})  # type: ignore[dict-item]
    assert r.status_code == 400 and r.json()["error"]["field"] == "Idempotency-Key"
    assert jobs(env) == []


def test_a_refused_request_does_not_keep_the_key(env: Env) -> None:
    refused = post(env, "k", {**BODY, "targets": ["nowhere/*.jpg"]})
    assert refused.status_code == 422 and refused.json()["error"]["code"] == "invalid_job"
    fixed = post(env, "k", BODY)  # fixed and sent again with the same key: accepted
    assert fixed.status_code == 202 and jobs(env) == [fixed.json()["id"]]


def test_concurrent_requests_with_one_key_make_exactly_one_job(env: Env) -> None:
    answers: list[httpx.Response] = []
    start = threading.Barrier(8)

    def send() -> None:
        start.wait()
        answers.append(post(env, "race"))

    threads = [threading.Thread(target=send) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(jobs(env)) == 1
    accepted = {r.json()["id"] for r in answers if r.status_code == 202}
    assert accepted == set(jobs(env))  # every 202 names that one job
    assert {r.status_code for r in answers} <= {202, 409}  # the rest: still in progress, ask again
    for r in answers:
        if r.status_code == 409:
            assert r.json()["error"]["code"] == "idempotency_in_progress" and r.headers["Retry-After"]
    assert post(env, "race").json()["id"] in accepted  # asked again: the one job


def test_two_replicas_on_one_volume_make_one_job_for_one_key(env: Env) -> None:
    """A second API process (another replica) on the same data root sees the first one's key."""
    for second in serve_api(env.config):
        first = post(env, "replica")
        with httpx.Client(base_url=second, headers={"Authorization": f"Bearer {KEYS['acme']}"}) as c:
            again = c.post("/v1/jobs", json=BODY, headers={"Idempotency-Key": "replica"})
        assert again.status_code == 202 and again.json() == first.json()
    assert len(jobs(env)) == 1


def test_uploads_are_matched_by_their_parts_not_their_boundary(env: Env) -> None:
    def upload(targets: bytes, boundary: str) -> httpx.Response:
        files = [("source", ("me.jpg", JPEG)), ("targets", ("a.png", targets))]
        req = httpx.Request(
            "POST", f"{env.url}/v1/jobs", files=files, data={"job": json.dumps({"resources": {"gpus": 0}})},
            headers={"Authorization": f"Bearer {KEYS['acme']}", "Idempotency-Key": "upload-1",
                     "Content-Type": f"multipart/form-data; boundary={boundary}"},
        )  # fmt: skip
        with httpx.Client() as c:
            return c.send(req)

    first = upload(PNG, "boundary-one")
    assert first.status_code == 202, first.text
    again = upload(PNG, "another-boundary")  # curl picks a new boundary for every request
    assert again.status_code == 202 and again.json() == first.json()
    assert not any(p.name.startswith(".incoming-") for p in (env.area() / "uploads").iterdir())
    assert len(list((env.area() / "uploads").iterdir())) == 1  # the first one's files only
    changed = upload(PNG + b"!", "boundary-one")
    assert changed.status_code == 422 and changed.json()["error"]["code"] == "idempotency_mismatch"
    assert len(jobs(env)) == 1


def test_a_key_is_new_again_after_24_hours_and_a_killed_requests_hold_after_an_hour(env: Env) -> None:
    first = post(env, "daily")
    keys = idempotency.Keys(Area(env.root, "acme"))
    path = keys.path("daily")
    record = json.loads(path.read_text())
    path.write_text(json.dumps({**record, "created": time.time() - idempotency.TTL - 1}))
    later = post(env, "daily")
    assert later.status_code == 202 and later.json()["id"] != first.json()["id"]
    # a request whose API process was killed left its key held (no answer): taken over after an hour
    stuck = {"token": "dead", "created": time.time() - 60, "body": None, "answer": None}
    keys.path("stuck").write_text(json.dumps(stuck))
    assert post(env, "stuck").status_code == 409
    keys.path("stuck").write_text(json.dumps({**stuck, "created": time.time() - idempotency.PENDING_STALE - 1}))
    assert post(env, "stuck").status_code == 202
    old = time.time() - idempotency.TTL - 1
    os.utime(path, (old, old))
    assert idempotency.sweep(Area(env.root, "acme")) == 1 and not path.exists()
