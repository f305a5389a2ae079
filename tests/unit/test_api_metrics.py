"""`ffswarm api`'s own metrics at /metrics over real HTTP on loopback: requests by route template and
code, latency, upload bytes and accepted jobs by tenant; the endpoint takes only a metrics token."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from controller.config import parse_config
from tests.builders import JPEG, Env, beat, make_config, serve_api

METRICS_TOKEN = "prometheus-scrape-token"


@pytest.fixture
def env(tmp_path: Path) -> Iterator[Env]:
    config, key = make_config(tmp_path)
    data = yaml.safe_load(config.path.read_text())
    data["api"]["metrics_token_sha256"] = [hashlib.sha256(METRICS_TOKEN.encode()).hexdigest()]
    config = parse_config(config.path, data)
    beat(config)
    for url in serve_api(config):
        yield Env(config, config.data_root, url, key)


def scrape(env: Env) -> dict[str, float]:
    r = env.client(token=METRICS_TOKEN).get("/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    return {
        f"{s.name}{sorted(s.labels.items())}": s.value
        for f in text_string_to_metric_families(r.text)
        for s in f.samples
    }


def test_requests_are_counted_by_route_template_and_code_and_uploads_by_tenant(env: Env) -> None:
    area = env.area()
    with env.client() as c:
        c.get("/v1/jobs")
        (area / "faces").mkdir()
        (area / "faces" / "me.jpg").write_bytes(JPEG)
        (area / "crowd").mkdir()
        (area / "crowd" / "a.jpg").write_bytes(JPEG)
        for job in ("a-00000000", "b-11111111", "c-22222222"):
            assert c.get(f"/v1/jobs/{job}").status_code == 404
        body = b'{"source": "faces/me.jpg", "targets": ["crowd/*.jpg"], "resources": {"gpus": 0}}'
        r = c.post("/v1/jobs", content=body, headers={"content-type": "application/json"})
        assert r.status_code == 202, r.text
        refused = c.post("/v1/jobs", content=b'{"targets": 1}', headers={"content-type": "application/json"})
        assert refused.status_code == 422
        assert c.get(f"/v1/jobs/{r.json()['id']}").status_code == 200
    assert env.client().get("/no/such/path/abc").status_code == 404
    m = scrape(env)
    job = "ffswarm_api_requests_total[('code', '{}'), ('method', 'GET'), ('route', '/v1/jobs/{{job}}')]"
    assert m[job.format(404)] == 3 and m[job.format(200)] == 1  # one series for every id asked
    assert not any("a-00000000" in k for k in m)
    assert m["ffswarm_api_requests_total[('code', '404'), ('method', 'GET'), ('route', 'unmatched')]"] == 1
    assert m["ffswarm_api_request_seconds_count[('method', 'GET'), ('route', '/v1/jobs/{job}')]"] == 4
    assert m["ffswarm_api_jobs_accepted_total[('tenant', 'acme')]"] == 1
    assert m["ffswarm_api_upload_bytes_total[('outcome', 'accepted'), ('tenant', 'acme')]"] == len(body)
    assert m["ffswarm_api_upload_bytes_total[('outcome', 'refused'), ('tenant', 'acme')]"] == len(b'{"targets": 1}')


def test_metrics_take_the_metrics_token_only(env: Env) -> None:
    assert env.client(tenant=None).get("/metrics").status_code == 401
    r = env.client("acme").get("/metrics")  # a tenant's key shows no other tenant's numbers
    assert r.status_code == 401 and r.json()["error"]["code"] == "unauthorized" and "acme" not in r.text
    assert env.client(token="wrong").get("/metrics").status_code == 401
    assert "ffswarm_api_requests_total" in env.client(token=METRICS_TOKEN).get("/metrics").text


def test_without_a_metrics_token_configured_metrics_are_off(tmp_path: Path) -> None:
    config, _ = make_config(tmp_path)
    for url in serve_api(config):
        env = Env(config, config.data_root, url, b"")
        r = env.client(token=METRICS_TOKEN).get("/metrics")
        assert r.status_code == 404 and r.json()["error"]["code"] == "metrics_off"
