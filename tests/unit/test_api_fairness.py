"""Per-tenant fairness (controller/api/fairness.py): a tenant's request rate and requests in flight,
refused with 429, Retry-After and the RateLimit headers before the body is read, without touching
another tenant; the buckets on an injected clock, then through the real API (requests held open
in flight by a glob check waiting on a gate the test holds)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from controller.api import submit
from controller.api.errors import ApiError
from controller.api.fairness import Fairness
from controller.apiconfig import Quota, Tenant
from controller.errors import ConfigError
from tests.builders import JPEG, Env, api_env, beat, make_config, serve_api
from tests.unit import slow_steps
from tests.unit.test_api_group_commit import until


def tenant(name: str = "acme", rps: float = 2.0, in_flight: int = 16) -> Tenant:
    return Tenant(name, quota=Quota(requests_per_second=rps, requests_in_flight=in_flight))


def refused(fair: Fairness, t: Tenant) -> ApiError:
    with pytest.raises(ApiError) as e:
        fair.admit(t)
    assert e.value.status == 429 and e.value.body()["error"]["code"] == "rate_limited"
    return e.value


def test_a_tenant_gets_a_seconds_burst_then_its_rate_and_others_are_untouched() -> None:
    now = [100.0]
    fair = Fairness(clock=lambda: now[0])
    acme, globex = tenant(rps=2), tenant("globex", rps=2)
    first = fair.admit(acme)
    assert first == {"RateLimit-Limit": "2", "RateLimit-Remaining": "1", "RateLimit-Reset": "1"}
    fair.done(acme)
    fair.admit(acme)
    fair.done(acme)
    e = refused(fair, acme)
    assert e.headers == {"Retry-After": "1", "RateLimit-Limit": "2", "RateLimit-Remaining": "0", "RateLimit-Reset": "1"}
    assert "2 requests a second" in e.message and "quota.requests_per_second" in e.message
    assert fair.admit(globex)["RateLimit-Remaining"] == "1"  # its own bucket
    now[0] += 0.5  # one request's worth back
    assert fair.admit(acme)["RateLimit-Remaining"] == "0"
    fair.done(acme)
    slow = tenant("slow", rps=0.1)
    fair.admit(slow)
    assert refused(fair, slow).headers["Retry-After"] == "10"  # a token every 10 s


def test_requests_in_flight_are_capped_until_one_is_done() -> None:
    fair = Fairness(clock=lambda: 0.0)
    acme = tenant(rps=1000, in_flight=2)
    fair.admit(acme)
    fair.admit(acme)
    e = refused(fair, acme)
    assert e.headers["Retry-After"] == "1" and "quota.requests_in_flight" in e.message
    fair.done(acme)
    fair.admit(acme)


@pytest.fixture
def env(tmp_path: Path) -> Iterator[Env]:
    config, key = make_config(tmp_path, quota={"requests_per_second": 0.1, "requests_in_flight": 4})
    beat(config)
    for url in serve_api(config):
        yield Env(config, config.data_root, url, key)


def test_over_its_rate_a_tenant_gets_429_before_its_body_is_read_and_another_tenant_is_served(env: Env) -> None:
    with env.client() as c:
        ok = c.get("/v1/jobs")
        assert ok.status_code == 200 and ok.headers["RateLimit-Limit"] == "1"
        assert ok.headers["RateLimit-Remaining"] == "0" and ok.headers["RateLimit-Reset"] == "10"
        big = b"{" + b" " * (2 * 1024**2)  # over the 1 MiB a JSON job may be: 413 had it been read
        r = c.post("/v1/jobs", content=big, headers={"Content-Type": "application/json"})
    assert r.status_code == 429 and r.json()["error"]["code"] == "rate_limited"
    assert r.headers["Retry-After"] == "10" and r.headers["RateLimit-Remaining"] == "0"
    with env.client("globex") as c:
        assert c.get("/v1/jobs").status_code == 200
    with env.client(token="not-a-key") as c:  # no tenant's credentials: the handler's 401, not a limit
        assert c.get("/v1/jobs").status_code == 401


@pytest.mark.parametrize(
    ("quota", "words"),
    [
        ({"requests_per_second": 0}, "tenants.acme.quota.requests_per_second"),
        ({"requests_in_flight": 0}, "tenants.acme.quota.requests_in_flight"),
    ],
)
def test_bad_fairness_limits_are_refused_naming_the_key(tmp_path: Path, quota: dict[str, object], words: str) -> None:
    with pytest.raises(ConfigError) as e:
        make_config(tmp_path, quota=quota)
    assert words in str(e.value)


def test_the_limits_default_to_50_a_second_and_16_at_once(tmp_path: Path) -> None:
    config, _ = make_config(tmp_path)
    q = config.tenants["acme"].quota
    assert (q.requests_per_second, q.requests_in_flight) == (50.0, 16)


IN_FLIGHT = 2


@pytest.fixture
def busy(tmp_path: Path) -> Iterator[Env]:
    """acme and globex may each have IN_FLIGHT requests in flight (and a rate that never refuses)."""
    yield from api_env(tmp_path, quota={"requests_per_second": 1000, "requests_in_flight": IN_FLIGHT})


def test_a_tenants_requests_past_its_in_flight_cap_get_429_until_one_finishes_and_others_are_served(
    busy: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    # acme's glob checks wait, in the slow workers, on a gate this test holds shut
    monkeypatch.setattr(submit, "checked_json_apart", slow_steps.held_checked_json)  # sent by name
    for tenant in ("acme", "globex"):
        with busy.client(tenant) as c:
            assert c.get("/v1/jobs").status_code == 200  # the area is made on first use
        (busy.area(tenant) / "crowd").mkdir()
        (busy.area(tenant) / "crowd" / "0.jpg").write_bytes(JPEG)
    job = {"source": "crowd/0.jpg", "targets": ["crowd/*.jpg"]}

    def post() -> httpx.Response:
        with busy.client() as c:
            return c.post("/v1/jobs", json=job)

    gate = slow_steps.gate(busy.root)
    try:
        with ThreadPoolExecutor(IN_FLIGHT) as clients:
            held = [clients.submit(post) for _ in range(IN_FLIGHT)]
            until(lambda: slow_steps.began(busy.root) == IN_FLIGHT, "acme's submits to be held")
            with busy.client() as c:
                r = c.get("/v1/jobs")
            assert r.status_code == 429 and r.json()["error"]["code"] == "rate_limited", r.text
            assert "quota.requests_in_flight" in r.json()["error"]["message"]
            assert r.headers["Retry-After"] == "1"
            assert r.headers["RateLimit-Limit"] == "1000"  # the rate is not what refused it
            assert int(r.headers["RateLimit-Remaining"]) > 0 and int(r.headers["RateLimit-Reset"]) >= 0
            with busy.client("globex") as c:
                assert c.get("/v1/jobs").status_code == 200
                assert c.post("/v1/jobs", json=job).status_code == 202  # its glob is not held
            os.close(gate)
            gate = -1
            assert held[0].result(timeout=30).status_code == 202  # one finished: the next passes
            with busy.client() as c:
                again = c.get("/v1/jobs")
            assert again.status_code == 200 and again.headers["RateLimit-Limit"] == "1000"
    finally:
        if gate >= 0:
            os.close(gate)
    assert [h.result(timeout=30).status_code for h in held] == [202] * IN_FLIGHT
