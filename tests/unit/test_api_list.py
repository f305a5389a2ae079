"""GET /v1/jobs over real HTTP: a tenant's jobs as status objects, newest first, a page at a time
from the tenant's job index (never the whole record folder), filtered by phase, outcome and
creation time; deleted jobs gone from it; entries added by many writers at once all listed."""

from __future__ import annotations

import shutil
import threading
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from controller.api import listing, views
from controller.api.area import Area
from controller.job.index import job_of, key_of
from tests.builders import Env, api_env
from tests.unit.api_jobs import ERROR, OK, finished, record

ACME = [f"acme{n}-aaaaaaaa" for n in range(5)]  # made in this order: acme4 is the newest


@pytest.fixture
def env(tmp_path: Path) -> Iterator[Env]:
    yield from api_env(tmp_path)


def jobs(env: Env, tenant: str = "acme", **params: str | int) -> dict[str, Any]:
    with env.client(tenant) as c:
        r = c.get("/v1/jobs", params=params)
    assert r.status_code == 200, r.text
    body: dict[str, Any] = r.json()
    return body


def names(page: dict[str, Any]) -> list[str]:
    return [row["job"] for row in page["jobs"]]


def acme_and_globex(env: Env) -> None:
    """acme0..4 (0, 2, 4 finished: 0 ok, 2 partial, 4 failed; 1 and 3 queued), globex's two between them."""
    for n, job in enumerate(ACME):
        if n % 2:
            record(env.root, job)
        else:
            finished(env.root, job, [[OK], [OK, ERROR], [ERROR]][n // 2])
        if n in (1, 3):
            record(env.root, f"globex{n}-bbbbbbbb", tenant="globex")


def test_newest_first_as_status_objects_page_by_page_each_tenant_its_own(env: Env) -> None:
    acme_and_globex(env)
    first = jobs(env, limit=2)
    assert names(first) == ["acme4-aaaaaaaa", "acme3-aaaaaaaa"] and first["next_cursor"]
    assert first["jobs"][0]["outcome"] == "failed" and first["jobs"][1]["phase"] == "queued"
    second = jobs(env, limit=2, cursor=first["next_cursor"])
    third = jobs(env, limit=2, cursor=second["next_cursor"])
    assert names(second) == ["acme2-aaaaaaaa", "acme1-aaaaaaaa"] and names(third) == ["acme0-aaaaaaaa"]
    assert third["next_cursor"] is None
    assert names(jobs(env)) == ACME[::-1] and jobs(env)["next_cursor"] is None
    assert names(jobs(env, "globex")) == ["globex3-bbbbbbbb", "globex1-bbbbbbbb"]
    assert all(row["owner"] == "globex" for row in jobs(env, "globex")["jobs"])


def test_filters_by_phase_outcome_and_creation_time(env: Env) -> None:
    acme_and_globex(env)
    assert names(jobs(env, phase="queued")) == ["acme3-aaaaaaaa", "acme1-aaaaaaaa"]
    assert names(jobs(env, phase="finished", outcome="partial")) == ["acme2-aaaaaaaa"]
    assert names(jobs(env, outcome="succeeded")) == ["acme0-aaaaaaaa"]
    assert jobs(env, outcome="cancelled") == {"jobs": [], "next_cursor": None}
    middle = next(row for row in jobs(env)["jobs"] if row["job"] == "acme2-aaaaaaaa")
    after = datetime.fromtimestamp(middle["created"], UTC).isoformat()  # to the microsecond
    assert names(jobs(env, created_after=after)) == ["acme4-aaaaaaaa", "acme3-aaaaaaaa"]
    page = jobs(env, phase="finished", limit=1)
    rest = jobs(env, phase="finished", limit=1, cursor=page["next_cursor"])
    assert names(page) + names(rest) == ["acme4-aaaaaaaa", "acme2-aaaaaaaa"]


def test_bad_filters_are_400_naming_every_field(env: Env) -> None:
    with env.client() as c:
        r = c.get("/v1/jobs", params={"limit": "0", "cursor": "acme1-aaaaaaaa", "phase": "done",
                                      "outcome": "great", "created_after": "yesterday"})  # fmt: skip
        assert r.status_code == 400
        err = r.json()["error"]
        assert err["code"] == "bad_request" and err["field"] == "limit"
        assert [e["field"] for e in err["errors"]] == ["limit", "cursor", "phase", "outcome", "created_after"]
        assert "yesterday" not in r.text and "great" not in r.text  # nothing echoed
        naive = c.get("/v1/jobs", params={"created_after": "2026-12-02T07:41:03"})  # no offset: which zone?
        assert naive.status_code == 400 and naive.json()["error"]["errors"][0]["field"] == "created_after"


def test_a_deleted_job_leaves_the_list(env: Env) -> None:
    acme_and_globex(env)
    with env.client() as c:
        assert c.delete("/v1/jobs/acme2-aaaaaaaa").status_code == 204
    assert names(jobs(env)) == ["acme4-aaaaaaaa", "acme3-aaaaaaaa", "acme1-aaaaaaaa", "acme0-aaaaaaaa"]
    (env.root / "tenants" / ".jobs" / "acme" / "acme0-aaaaaaaa.json").unlink()  # a deletion cut short
    assert names(jobs(env)) == ["acme4-aaaaaaaa", "acme3-aaaaaaaa", "acme1-aaaaaaaa"]
    left = sorted(p.name for p in (env.root / "tenants" / ".jobs" / "acme" / ".index").rglob("*_*"))
    assert [name.split("_", 1)[1] for name in left] == ["acme1-aaaaaaaa", "acme3-aaaaaaaa", "acme4-aaaaaaaa"]


def test_a_page_reads_only_its_own_jobs(env: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    for n in range(30):
        record(env.root, f"old{n}-aaaaaaaa")
    assert len(jobs(env, limit=1)["jobs"]) == 1  # the index exists now
    looked: list[str] = []
    view = views.job_view

    def counted(config: Any, area: Area, job: str) -> dict[str, Any]:
        looked.append(job)
        return view(config, area, job)

    def no_scan(self: Area) -> list[str]:
        raise AssertionError("a page listed every record of the tenant")

    monkeypatch.setattr(views, "job_view", counted)
    monkeypatch.setattr(Area, "jobs", no_scan)
    page = jobs(env, limit=5)
    assert names(page) == [f"old{n}-aaaaaaaa" for n in range(29, 24, -1)] and looked == names(page)
    looked.clear()
    assert names(jobs(env, limit=5, cursor=page["next_cursor"]))[0] == "old24-aaaaaaaa" and len(looked) == 5


def test_records_made_before_the_index_are_listed(env: Env) -> None:
    for job in ACME:
        record(env.root, job)
    shutil.rmtree(env.root / "tenants" / ".jobs" / "acme" / ".index")  # as an older API left them
    assert names(jobs(env)) == ACME[::-1]
    record(env.root, "late-cccccccc")
    assert names(jobs(env, limit=2)) == ["late-cccccccc", "acme4-aaaaaaaa"]


def test_many_writers_at_once_each_job_listed_once_in_order(env: Env) -> None:
    """Replicas accepting jobs at the same moment: every entry is there, once, in creation order."""
    Area(env.root, "acme").ensure(None)
    made: list[str] = []
    lock = threading.Lock()

    def writer(w: int) -> None:
        area = Area(env.root, "acme")  # each its own, as each replica has
        for n in range(25):
            job = f"w{w}n{n}-aaaaaaaa"
            rec = area.write_record(job, uploads=False)
            with lock:
                made.append(key_of(job, rec.created))

    threads = [threading.Thread(target=writer, args=(w,)) for w in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    listed = names(jobs(env, limit=1000))
    assert len(listed) == len(set(listed)) == 200
    assert listed == [job_of(key) for key in sorted(made, reverse=True)]  # by creation time, then id


def test_a_filtered_page_stops_looking_and_says_where_to_go_on(env: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    """A filter that matches only old jobs: each page looks at a bounded number of jobs, may come back
    empty with a cursor, and paging on finds the match."""
    finished(env.root, "first-aaaaaaaa", [OK])
    for n in range(5):
        record(env.root, f"new{n}-aaaaaaaa")
    monkeypatch.setattr(listing, "SCAN", 2)
    pages = [jobs(env, outcome="succeeded", limit=1)]
    while pages[-1]["next_cursor"] is not None:
        pages.append(jobs(env, outcome="succeeded", limit=1, cursor=pages[-1]["next_cursor"]))
    assert [names(p) for p in pages] == [[], [], ["first-aaaaaaaa"]]
