"""Per-tenant webhooks: a tenant's job posts only to its own ``tenants.<t>.webhooks.allow_hosts``,
signed with its own secret, and the body names the tenant; the cluster's ``policy.webhooks`` serves
CLI jobs only. Real loopback receivers (127.0.0.1 for acme, 127.0.0.2 for globex) and a real API."""

from __future__ import annotations

import base64
import hashlib
import hmac
import http.server
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from controller.config import Config, parse_config
from controller.errors import JobFileError
from controller.job.files import parse_job
from controller.job.plan import Chunk, Plan, PlannedItem
from controller.job.settings import OnComplete
from controller.job.spec import JobSpec
from controller.policy import check_job
from controller.run.report import Counts, Report
from controller.run.rundir import Control, RunDir
from controller.run.usecase import call_hooks
from tests.builders import Env, beat, make_config, serve_api

SECRETS = {"cluster": b"cluster-webhook-secret-0123456789", "acme": b"acme-webhook-secret-0123456789ab",
           "globex": b"globex-webhook-secret-0123456789"}  # fmt: skip
HOSTS = {"acme": "127.0.0.1", "globex": "127.0.0.2"}


class Receiver:
    """A tenant's webhook receiver: records every POST it gets."""

    def __init__(self, host: str) -> None:
        self.got: list[tuple[dict[str, str], bytes]] = []
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                outer.got.append((dict(self.headers), self.rfile.read(int(self.headers["Content-Length"]))))
                self.send_response(204)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = http.server.HTTPServer((host, 0), Handler)
        self.url = f"http://{host}:{self.httpd.server_address[1]}/hook"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def signed_by(self, n: int) -> str | None:
        """Whose secret signed the n-th delivery (None: no one's we know)."""
        headers, body = self.got[n]
        text = f"{headers['webhook-id']}.{headers['webhook-timestamp']}.".encode() + body
        for who, secret in SECRETS.items():
            mac = base64.b64encode(hmac.new(secret, text, hashlib.sha256).digest()).decode()
            if headers["webhook-signature"] == f"v1,{mac}":
                return who
        return None


@pytest.fixture
def receivers() -> Iterator[dict[str, Receiver]]:
    made = {tenant: Receiver(host) for tenant, host in HOSTS.items()}
    yield made
    for r in made.values():
        r.httpd.shutdown()
        r.httpd.server_close()


def configured(tmp_path: Path) -> Config:
    make_config(tmp_path)
    path = tmp_path / "ffswarm.yaml"
    data = yaml.safe_load(path.read_text())
    for who, secret in SECRETS.items():
        (tmp_path / "secrets" / f"hook-{who}").write_bytes(secret)
    data["policy"] = {"webhooks": {"allow_hosts": ["127.0.0.1"], "allow_private": True,
                                   "secret_file": str(tmp_path / "secrets" / "hook-cluster")}}  # fmt: skip
    for tenant, host in HOSTS.items():
        data["tenants"][tenant]["webhooks"] = {
            "allow_hosts": [host], "allow_private": True, "secret_file": str(tmp_path / "secrets" / f"hook-{tenant}")
        }  # fmt: skip
    path.write_text(yaml.safe_dump(data))
    return parse_config(path, data)


def job(webhook: str) -> JobSpec:
    return parse_job({"name": "j", "source": "a.jpg", "targets": ["b.jpg"], "output": "o/{stem}{ext}",
                      "on_complete": {"webhook": webhook}}, "j")  # fmt: skip


def ended(config: Config, job: str, tenant: str | None, url: str) -> dict[str, str] | None:
    """call_hooks for a run folder of ``tenant``'s job (None: a CLI job) that ended, as the use case does."""
    item = PlannedItem("i000000", "in/0.jpg", "out/0.jpg", "image")
    rd = RunDir(config.data_root, job)
    rd.create(b"name: x\n", Plan(job, (item,), (Chunk("c0000", (item.id,)),)), {}, Control(1), "sha256:x")
    if tenant is not None:
        rd.write_file(rd.layout.owner, f"{tenant}\n".encode())
    report = Report(job, "img", 0.0, 1.0, Counts(1, 1, 0, 0, 1), (), {}, {})
    done = call_hooks(config, OnComplete(webhook=url), rd, report, rd.path / "report.json")
    return None if done.hooks is None else dict(done.hooks)


def test_a_tenants_delivery_goes_only_to_its_own_hosts_signed_with_its_own_key(
    tmp_path: Path, receivers: dict[str, Receiver]
) -> None:
    config = configured(tmp_path)
    acme, globex = receivers["acme"], receivers["globex"]
    assert ended(config, "a1-abcdefgh", "acme", acme.url) == {"webhook": "delivered"}
    assert acme.signed_by(0) == "acme" and json.loads(acme.got[0][1])["data"]["tenant"] == "acme"
    assert ended(config, "a2-abcdefgh", "acme", globex.url) == {"webhook": "not delivered"}  # B's host
    assert globex.got == []  # B's receiver never hears of A's job
    assert ended(config, "g1-abcdefgh", "globex", globex.url) == {"webhook": "delivered"}
    assert [globex.signed_by(n) for n in range(len(globex.got))] == ["globex"]
    assert json.loads(globex.got[0][1])["data"]["tenant"] == "globex"
    assert ended(config, "g2-abcdefgh", "globex", acme.url) == {"webhook": "not delivered"}
    assert [acme.signed_by(n) for n in range(len(acme.got))] == ["acme"]
    # a CLI job: the cluster's hosts and key, and no tenant
    assert ended(config, "cli-job", None, acme.url) == {"webhook": "delivered"}
    assert acme.signed_by(1) == "cluster" and json.loads(acme.got[1][1])["data"]["tenant"] is None


def test_a_tenant_the_config_no_longer_names_gets_no_delivery(tmp_path: Path, receivers: dict[str, Receiver]) -> None:
    config = configured(tmp_path)
    assert ended(config, "gone-abcdefgh", "initech", receivers["acme"].url) == {"webhook": "not delivered"}
    assert receivers["acme"].got == []  # never the cluster's key and hosts instead


def test_a_tenant_job_naming_another_tenants_host_is_refused_at_submit(tmp_path: Path) -> None:
    config = configured(tmp_path)
    spec = job("http://127.0.0.2/x")
    with pytest.raises(JobFileError) as e:
        check_job(config.policy, spec, "j", config.webhooks("acme"))
    assert e.value.field == "on_complete.webhook"
    assert "tenants.acme.webhooks.allow_hosts (127.0.0.1)" in str(e.value)
    check_job(config.policy, spec, "j", config.webhooks("globex"))  # its own host
    check_job(config.policy, job("http://127.0.0.1/x"), "j")  # a CLI job: the cluster's hosts
    beat(config)
    for url in serve_api(config):
        env = Env(config, config.data_root, url, b"")
        with env.client() as c:
            body = {
                "source": "faces/me.jpg",
                "targets": ["crowd/*.jpg"],
                "on_complete": {"webhook": "http://127.0.0.2/x"},
            }
            r = c.post("/v1/jobs", json=body)
        assert r.status_code == 422, r.text
        assert r.json()["error"]["field"] == "on_complete.webhook"
        assert "127.0.0.2" in r.json()["error"]["message"]


def test_a_tenant_without_webhooks_of_its_own_has_none_even_when_the_cluster_has(tmp_path: Path) -> None:
    config, _ = make_config(tmp_path)
    data = yaml.safe_load((tmp_path / "ffswarm.yaml").read_text())
    data["policy"] = {"webhooks": {"allow_hosts": ["hooks.example.internal"]}}
    config = parse_config(tmp_path / "ffswarm.yaml", data)
    spec = job("https://hooks.example.internal/x")
    check_job(config.policy, spec, "j")  # a CLI job may
    with pytest.raises(JobFileError, match=r"webhooks are off: tenants\.acme\.webhooks\.allow_hosts lists none"):
        check_job(config.policy, spec, "j", config.webhooks("acme"))
