"""A tenant's quotas on every submit (controller/api/quota.py): the stored-bytes quota through the real
API, and the book that keeps each check from re-reading every job and file the tenant ever had."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from controller.api.area import Area
from controller.api.quota import STORED_SECONDS, QuotaBook
from tests.builders import JPEG, Env, api_env, make_config


@pytest.fixture
def env(tmp_path: Path) -> Iterator[Env]:
    yield from api_env(tmp_path, quota={"upload": "64k", "stored": "50k", "jobs_queued": 100})


def _upload(env: Env, name: str, size: int):  # type: ignore[no-untyped-def]
    body = JPEG + b"\0" * max(0, size - len(JPEG))
    with env.client() as c:
        return c.post("/v1/jobs", files=[("source", ("me.jpg", JPEG)), ("targets", (name, body))])


def test_a_full_area_is_429_and_an_accepted_upload_counts_at_once(env: Env) -> None:
    # 0, then 30 kB stored when checked; the second fills the 50 KiB exactly (an upload may not pass
    # what is left of the quota: tests/unit/test_api_upload_limits.py)
    for name, size in (("a.jpg", 30_000), ("b.jpg", 50 * 1024 - 2 * len(JPEG) - 30_000)):
        r = _upload(env, name, size)
        assert r.status_code == 202, r.text
    # the area was walked before the first upload and holds 50 KiB now: the next check knows it
    # without walking again, so a third upload is refused within the same seconds
    second = _upload(env, "c.jpg", 30_000)
    assert second.status_code == 429, second.text
    assert second.json()["error"]["code"] == "over_quota" and "bytes" in second.json()["error"]["message"]
    assert second.headers["Retry-After"] == "30"
    with env.client() as c:
        assert c.post("/v1/jobs", json={"source": "x.jpg", "targets": ["y.jpg"]}).status_code == 429


def test_the_book_counts_unfinished_jobs_rechecking_only_those_that_can_change(tmp_path: Path) -> None:
    config, _ = make_config(tmp_path)
    area = Area(config.data_root, "acme")
    area.records.mkdir(parents=True)
    area.path.mkdir(parents=True)
    now = [0.0]
    book = QuotaBook(clock=lambda: now[0])
    jobs = [f"j{n}-abcdefgh" for n in range(4)]
    for job in jobs:
        (area.records / f"{job}.json").write_text("{}")
    assert book.unfinished(config, area, 100) == 4
    done = config.data_root / "inbox" / "done"
    done.mkdir(parents=True)
    for job in jobs[:3]:
        (done / f"{job}.yaml").write_text("x")
    assert book.unfinished(config, area, 100) == 1
    assert book.unfinished(config, area, 1) == 1  # counted up to what the quota needs
    # an ended job runs again only by a retry, whose record makes it count until serve is done
    (area.records / f"{jobs[0]}.retry").write_text("{}")
    (config.data_root / "inbox" / f"{jobs[0]}.yaml").write_text("x")
    assert book.unfinished(config, area, 100) == 2
    os.unlink(config.data_root / "inbox" / f"{jobs[0]}.yaml")
    assert book.unfinished(config, area, 100) == 1
    # a job whose record is gone is not counted, and a new one is
    os.unlink(area.records / f"{jobs[3]}.json")
    (area.records / "new-bcdefghi.json").write_text("{}")
    assert book.unfinished(config, area, 100) == 1

    (area.path / "big").write_bytes(b"\0" * 5000)
    assert book.stored(area, 10**9) == 5000
    (area.path / "more").write_bytes(b"\0" * 5000)  # another replica's upload, say
    book.add_stored(area, 700)  # this process's own upload
    assert book.stored(area, 10**9) == 5700  # not walked again yet
    now[0] = STORED_SECONDS
    assert book.stored(area, 10**9) == 10_000  # walked again: the area as it is
