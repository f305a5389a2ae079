"""``Prefer: wait=N`` on POST /v1/jobs over real HTTP: a job that ends while the request waits is
answered with its final status (200, ``Preference-Applied``); one that does not, with the usual
202 once N seconds passed; a Prefer without a valid wait changes nothing."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from controller.api.waiting import preference
from tests.builders import JPEG, Env, api_env
from tests.unit.api_jobs import NO_FACE, OK, report, run

JOB = {"name": "party", "source": "faces/me.jpg", "targets": ["crowd/*.jpg"], "resources": {"gpus": 0}}


@pytest.fixture
def env(tmp_path: Path) -> Iterator[Env]:
    yield from api_env(tmp_path)


def photos(env: Env) -> None:
    with env.client() as c:
        c.get("/v1/jobs")  # the area is made on first use
    for rel in ("faces/me.jpg", "crowd/a.jpg"):
        (env.area() / rel).parent.mkdir(parents=True, exist_ok=True)
        (env.area() / rel).write_bytes(JPEG)


class Serve(threading.Thread):
    """Does what `serve` does with the first job that reaches the inbox: claims it, runs it (its run
    folder made, both photos ended) and writes its report."""

    def __init__(self, env: Env) -> None:
        super().__init__(daemon=True)
        self.inbox = env.root / "inbox"
        self.root = env.root
        self.stop = threading.Event()
        self.job: str | None = None

    def run(self) -> None:
        while not self.stop.wait(0.02):
            files = sorted(self.inbox.glob("party-*.yaml"))
            if files:
                self.job = files[0].name.removesuffix(".yaml")
                files[0].unlink()  # claimed
                rd = run(self.root, self.job, [OK, NO_FACE])
                report(rd, time.time() - 1, time.time())
                return


def post(env: Env, prefer: str | None) -> tuple[httpx.Response, float]:
    headers = {"Prefer": prefer} if prefer is not None else {}
    with env.client() as c:
        started = time.monotonic()
        r = c.post("/v1/jobs", json=JOB, headers=headers, timeout=30)
        return r, time.monotonic() - started


def test_a_job_that_ends_while_the_request_waits_is_answered_with_its_final_status(env: Env) -> None:
    photos(env)
    serve = Serve(env)
    serve.start()
    try:
        r, took = post(env, "respond-async, wait=20")
    finally:
        serve.stop.set()
        serve.join()
    assert r.status_code == 200, r.text
    assert r.headers["Preference-Applied"] == "wait=20" and took < 20
    body = r.json()
    assert body["job"] == serve.job and r.headers["Location"] == f"/v1/jobs/{serve.job}"
    assert (body["phase"], body["outcome"]) == ("finished", "succeeded") and body["finished_at"]
    with env.client() as c:
        assert c.get(f"/v1/jobs/{serve.job}").json()["outcome"] == "succeeded"


def test_a_job_that_does_not_end_in_time_is_the_usual_202(env: Env) -> None:
    photos(env)
    r, took = post(env, "wait=1")
    assert r.status_code == 202 and "Preference-Applied" not in r.headers
    assert took >= 1.0 and set(r.json()) == {"id", "status_url", "events_url"}


def test_a_prefer_without_a_valid_wait_is_ignored(env: Env) -> None:
    photos(env)
    for prefer in ("wait=0", "wait=61", "wait=soon", "wait=-3", "respond-async", "wait"):
        r, took = post(env, prefer)
        assert r.status_code == 202 and took < 1.0 and "Preference-Applied" not in r.headers, prefer


def test_the_wait_preference_is_read_as_rfc_7240_writes_it() -> None:
    assert preference(["wait=5"]) == 5 and preference(["respond-async, WAIT=60"]) == 60
    assert preference(['wait="7"']) == 7 and preference(["handling=lenient", "wait=3; x=1"]) == 3
    assert preference(["wait=0"]) is None and preference(["wait=61"]) is None and preference([]) is None
    assert preference(["wait=1.5"]) is None and preference(["wait=2, wait=9"]) == 2  # the first one counts
