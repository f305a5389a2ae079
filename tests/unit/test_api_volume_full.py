"""A full shared volume is answered as a state that passes: 503 ``volume_full`` with Retry-After,
never a 500, and nothing of the request is left behind."""

from __future__ import annotations

import errno
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from controller.run import handover
from tests.builders import JPEG, Env, api_env


@pytest.fixture
def env(tmp_path: Path) -> Iterator[Env]:
    yield from api_env(tmp_path, quota={"jobs_queued": 1})  # one slot: a refused request must give it back


def test_a_submit_that_meets_a_full_volume_is_503_with_retry_after(env: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    (env.area() / "in").mkdir(parents=True)
    (env.area() / "in" / "a.jpg").write_bytes(JPEG)

    def full(*_a: Any, **_k: Any) -> Any:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(handover, "place", full)  # the job file meets the full volume (its owner record did not)
    with env.client() as c:
        r = c.post("/v1/jobs", json={"source": "in/a.jpg", "targets": ["in/a.jpg"]})
    assert r.status_code == 503
    assert r.headers["Retry-After"] == "30"
    assert r.json() == {"error": {"code": "volume_full", "message": "the shared volume is full; try again later"}}
    assert not list((env.root / "inbox").glob("*.yaml"))  # nothing of it is left: no job file, no owner record
    assert not list((env.root / "tenants" / ".jobs" / "acme").glob("*.json"))
    monkeypatch.undo()
    with env.client() as c:  # the one slot the refused request held is free again: the next one passes
        assert c.post("/v1/jobs", json={"source": "in/a.jpg", "targets": ["in/a.jpg"]}).status_code == 202
