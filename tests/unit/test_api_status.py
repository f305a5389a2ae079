"""GET /v1/jobs/{job} over real HTTP: the outcome of a job that ended (succeeded, partial, failed,
cancelled; none before the end) and when it was created, started and ended, for every phase; and
`ffswarm status` saying the outcome in its line."""

from __future__ import annotations

import os
import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from controller.api.area import Area
from controller.run.status import describe, job_status, outcome_of, utc
from tests.builders import Env, api_env
from tests.unit.api_jobs import ERROR, NO_FACE, OK, cancelled_running, finished, record, refused, run

RFC3339_UTC = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ")


@pytest.fixture
def env(tmp_path: Path) -> Iterator[Env]:
    yield from api_env(tmp_path)


def get(env: Env, job: str) -> dict[str, object]:
    with env.client() as c:
        r = c.get(f"/v1/jobs/{job}")
    assert r.status_code == 200, r.text
    body: dict[str, object] = r.json()
    return body


def test_a_finished_job_says_whether_it_succeeded_partly_or_failed(env: Env) -> None:
    ended = time.time() - 100
    finished(env.root, "allgood-aaaaaaaa", [OK, NO_FACE], at=ended)  # no face is no failure
    finished(env.root, "some-bbbbbbbb", [OK, ERROR, ERROR])
    finished(env.root, "faceless-cccccccc", [NO_FACE, ERROR])
    finished(env.root, "none-dddddddd", [ERROR, ERROR])
    assert get(env, "allgood-aaaaaaaa")["outcome"] == "succeeded"
    assert get(env, "some-bbbbbbbb")["outcome"] == "partial"
    assert get(env, "faceless-cccccccc")["outcome"] == "partial"
    row = get(env, "none-dddddddd")
    assert row["phase"] == "finished" and row["outcome"] == "failed"
    assert get(env, "allgood-aaaaaaaa")["finished_at"] == utc(ended)  # the report's end


def test_cancelled_refused_queued_and_running_jobs(env: Env) -> None:
    cancelled_running(env.root, "stop-aaaaaaaa")
    refused(env.root, "bad-bbbbbbbb", "tenants/acme/in/x.jpg: no such file")
    record(env.root, "wait-cccccccc")
    record(env.root, "gone-dddddddd").mark_cancelled("gone-dddddddd")  # taken out of the inbox
    record(env.root, "busy-eeeeeeee")
    run(env.root, "busy-eeeeeeee", [OK, None])
    ids = ("stop-aaaaaaaa", "bad-bbbbbbbb", "wait-cccccccc", "gone-dddddddd", "busy-eeeeeeee")
    stop, bad, wait, gone, busy = (get(env, j) for j in ids)
    assert (stop["phase"], stop["outcome"]) == ("cancelled", "cancelled") and stop["finished_at"]
    assert (bad["phase"], bad["outcome"]) == ("refused", "failed") and bad["reason"] == "in/x.jpg: no such file"
    assert bad["finished_at"] and bad["started_at"] is None  # it never ran
    assert (wait["phase"], wait["outcome"], wait["started_at"], wait["finished_at"]) == ("queued", None, None, None)
    assert (gone["phase"], gone["outcome"]) == ("cancelled", "cancelled") and gone["finished_at"]
    assert (busy["phase"], busy["outcome"], busy["finished_at"]) == ("running", None, None)
    for row in (stop, bad, wait, gone, busy):
        assert "outcome" in row and isinstance(row["created_at"], str) and RFC3339_UTC.fullmatch(row["created_at"])


def test_created_started_and_finished_times_are_rfc3339_utc_in_order(env: Env) -> None:
    now = time.time()
    rd = finished(env.root, "party-aaaaaaaa", [OK], at=now - 10)
    os.utime(rd.layout.plan, (now - 60, now - 60))  # the run folder was made (the job left the queue) then
    row = get(env, "party-aaaaaaaa")
    assert row["started_at"] == utc(now - 60) and row["finished_at"] == utc(now - 10)
    assert row["created_at"] == utc(float(row["created"]))  # type: ignore[arg-type]
    for key in ("created_at", "started_at", "finished_at"):
        assert RFC3339_UTC.fullmatch(str(row[key])), key
    assert utc(0) == "1970-01-01T00:00:00Z"


def test_a_job_queued_again_for_a_retry_has_no_outcome_until_it_ends_again(env: Env) -> None:
    finished(env.root, "again-aaaaaaaa", [ERROR])
    (env.root / "inbox" / "again-aaaaaaaa.yaml").write_text("name: again-aaaaaaaa\n")  # handed back by …/retry
    row = get(env, "again-aaaaaaaa")
    assert (row["phase"], row["outcome"], row["finished_at"]) == ("queued", None, None)
    assert row["started_at"] is not None  # it did run before


def test_outcome_of_each_phase() -> None:
    def outcome(phase: str, ok: int = 0, no_face: int = 0, failed: int = 0) -> str | None:
        return outcome_of({"phase": phase, "items": {"ok": ok, "no_face": no_face, "failed": failed}})

    assert outcome("finished", ok=2) == "succeeded" and outcome("finished") == "succeeded"
    assert outcome("finished", ok=1, failed=1) == "partial" and outcome("finished", no_face=1, failed=1) == "partial"
    assert outcome("finished", failed=2) == "failed" and outcome_of({"phase": "refused"}) == "failed"
    assert outcome("cancelled", ok=1) == "cancelled"
    assert [outcome(p, ok=1) for p in ("queued", "running", "stopped", "unreadable")] == [None] * 4


def test_status_says_the_outcome_of_a_job_that_ended(tmp_path: Path) -> None:
    Area(tmp_path, "acme").ensure(None)
    rd = finished(tmp_path, "party-aaaaaaaa", [OK, ERROR], at=1_796_196_993.0)
    row = job_status(rd)
    assert row["outcome"] == "partial" and row["finished_at"] == "2026-12-02T07:36:33Z"
    assert "party-aaaaaaaa: finished — partial (ended 2026-12-02 07:36:33 UTC) · items 1/2 done, 1 failed" in describe(
        row
    )
    running = run(tmp_path, "busy-bbbbbbbb", [OK, None])
    assert "—" not in describe(job_status(running)) and job_status(running)["outcome"] is None
