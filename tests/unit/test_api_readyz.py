"""`GET /readyz` over real HTTP: ready only while the data root, the API's record folders and a live
`serve` are there; the reasons are short, name no path outside the data root, and only a caller with
a valid token sees them. `/healthz` stays plain liveness. Neither needs a token."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from controller.run.handover import HEARTBEAT_DIR
from tests.builders import Env, api_env, beat

ROOT_ONLY = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to hand a folder to another uid")


@pytest.fixture
def env(tmp_path: Path) -> Iterator[Env]:
    yield from api_env(tmp_path, heartbeat=False)


def ready(env: Env, tenant: str | None = "acme") -> tuple[int, dict[str, object]]:
    """/readyz as a tenant sees it (reasons included), or without a token (tenant None)."""
    with env.client(tenant=tenant) as c:
        r = c.get("/readyz")
        assert r.headers["content-type"] == "application/json"
        return r.status_code, r.json()


def test_without_a_token_it_says_only_ready_or_not_and_names_no_tenant(env: Env) -> None:
    beat(env.config)
    with env.client() as c:
        assert c.get("/v1/jobs").status_code == 200  # the record folders exist
    assert ready(env, tenant=None) == (200, {"ready": True})
    (env.root / "tenants" / ".jobs" / "globex").mkdir(mode=0o777)
    (env.root / "tenants" / ".jobs" / "globex").chmod(0o777)
    assert ready(env, tenant=None) == (503, {"ready": False})  # no reasons: they would name a tenant
    assert ready(env)[1]["reasons"] == ["tenants/.jobs/globex is not the API's own (owner or mode)"]  # a token
    with env.client(token="not-a-key") as c:
        assert c.get("/readyz").status_code == 401  # a token that is there must be valid


def test_ready_once_serve_beats_and_not_once_its_heartbeat_is_gone(env: Env) -> None:
    status, body = ready(env)
    assert status == 503 and body["ready"] is False
    assert body["reasons"] == ["no controller is serving the inbox (no live `ffswarm serve` heartbeat)"]
    beat(env.config)
    assert ready(env) == (200, {"ready": True})  # tenants/ not made yet: it can be, on first use
    for f in (env.root / "inbox" / HEARTBEAT_DIR).iterdir():
        f.unlink()  # serve stopped
    assert ready(env)[0] == 503
    with env.client(tenant=None) as anon:
        assert anon.get("/healthz").json() == {"ok": True}  # alive all the same
        assert anon.get("/readyz").json() == {"ready": False}


def test_a_records_folder_others_may_write_is_not_ready_and_no_host_path_is_named(env: Env) -> None:
    beat(env.config)
    with env.client() as c:  # the first request makes the area and the record folders
        assert c.get("/v1/jobs").status_code == 200
    assert ready(env) == (200, {"ready": True})
    records = env.root / "tenants" / ".jobs"
    records.chmod(0o777)
    status, body = ready(env)
    assert status == 503 and body["reasons"] == ["tenants/.jobs is not the API's own (owner or mode)"]
    records.chmod(0o755)
    (records / "acme").chmod(0o775)
    assert ready(env)[1]["reasons"] == ["tenants/.jobs/acme is not the API's own (owner or mode)"]
    (records / "acme").chmod(0o755)
    (records / "acme").rename(env.root / "elsewhere")
    (records / "acme").symlink_to(env.root / "elsewhere")  # a link is never followed
    assert ready(env)[1]["reasons"] == ["tenants/.jobs/acme is not a folder"]
    assert str(env.root) not in json.dumps(ready(env)[1])


@ROOT_ONLY
def test_a_records_folder_the_runner_owns_is_not_ready(env: Env) -> None:
    beat(env.config)
    (env.root / "tenants" / ".jobs").mkdir(parents=True)
    os.chown(env.root / "tenants" / ".jobs", 10001, 10001)  # a runner could plant records there
    assert ready(env)[1]["reasons"] == ["tenants/.jobs is not the API's own (owner or mode)"]


def test_an_unreachable_data_root_says_only_that(env: Env) -> None:
    beat(env.config)
    env.root.rename(env.root.with_name("moved"))  # the volume went away
    status, body = ready(env)
    assert (status, body) == (503, {"ready": False, "reasons": ["the data root cannot be reached"]})
