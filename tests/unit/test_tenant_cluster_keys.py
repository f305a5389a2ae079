"""A tenant whose S3 area is the plain ``tenants.<t>.s3: s3://…`` (docs/storage.md#tenant-keys) is
reached with the cluster's keys, which its runners then hold: the config still loads and its jobs
still run, but ``ffswarm doctor`` warns naming the tenant and the key that gives it keys of its own,
and ``serve`` and ``api`` say so once as they start (once for all of an API's workers)."""

from __future__ import annotations

import contextlib
import json
import threading
from pathlib import Path
from typing import Any

import pytest
import yaml
from structlog.testing import capture_logs

from controller.config import Config, parse_config
from controller.doctor import check_tenant_keys
from controller.run.metrics import Metrics
from controller.serve.daemon import Inbox, Outcome, Server
from tests.builders import make_config
from tests.polling import until
from tests.unit.test_api_killed_upload import ApiProcess
from tests.unit.test_cli_output import code, ffswarm

EVENT = "tenant_s3_cluster_keys"
OWN_KEYS = {"area": "s3://media/globex/", "credentials_secret": "globex-s3"}


def config_with_areas(tmp_path: Path, acme: object = "s3://media/acme/", globex: object = OWN_KEYS) -> Config:
    """The two-tenant config (tests/builders.py) with storage.s3 and the tenants' areas, written to its file."""
    config, _ = make_config(tmp_path)
    keys = tmp_path / "secrets" / "s3"
    keys.write_text("AWS_ACCESS_KEY_ID=cluster\nAWS_SECRET_ACCESS_KEY=cluster-secret\n")
    data: dict[str, Any] = yaml.safe_load(config.path.read_text())
    data["docker_host"] = "unix:///nonexistent/docker.sock"  # doctor's swarm check fails at once
    data["storage"] = {"s3": {"endpoint_url": "http://127.0.0.1:9", "credentials_secret": "ffswarm-s3",
                              "credentials_file": str(keys)}}  # fmt: skip
    for name, area in (("acme", acme), ("globex", globex)):
        if area is not None:
            data["tenants"][name]["s3"] = area
    config.path.write_text(yaml.safe_dump(data))
    return parse_config(config.path, data)


def test_a_plain_area_still_loads_and_its_tenant_is_named_as_on_the_clusters_keys(tmp_path: Path) -> None:
    config = config_with_areas(tmp_path)
    assert config.tenants_on_cluster_keys() == ("acme",)
    acme, globex = config.s3("acme"), config.s3("globex")
    assert acme is not None and acme.credentials_secret == "ffswarm-s3"  # its runners: the cluster's secret
    assert globex is not None and globex.credentials_secret == "globex-s3"
    assert config_with_areas(tmp_path / "own", acme=None).tenants_on_cluster_keys() == ()


def test_doctor_warns_naming_the_tenant_and_the_fix_and_still_passes_the_check(tmp_path: Path) -> None:
    config = config_with_areas(tmp_path)
    text = ffswarm(config.path, "doctor")
    lines = text.stdout.splitlines()
    (head,) = [line for line in lines if line.startswith("[warn] tenant-keys: ")]
    assert "acme (s3://media/acme/)" in head and "storage.s3's keys" in head and "globex" not in head
    fix = lines[lines.index(head) + 1]
    assert fix.startswith("       fix: ") and "tenants.acme.s3.credentials_secret" in fix
    assert "docs/storage.md#tenant-keys" in fix
    # the exit code is the failed swarm check's alone (no Docker at that socket): a warning fails nothing
    assert code(text) == 69 and "1 check(s) failed: swarm" in str(text.exception)
    found = json.loads(ffswarm(config.path, "doctor", "-o", "json").stdout)
    (check,) = [c for c in found["checks"] if c["name"] == "tenant-keys"]
    assert check["ok"] is True and check["warning"] is True and "tenants.acme.s3.credentials_secret" in check["fix"]
    assert all(c["warning"] is False for c in found["checks"] if c["name"] != "tenant-keys")


def test_doctor_says_ok_when_every_area_has_its_own_keys_and_nothing_without_areas(tmp_path: Path) -> None:
    own = check_tenant_keys(config_with_areas(tmp_path / "own", acme=None))
    assert own is not None and own.line() == "[ok] tenant-keys: every tenant's S3 area has keys of its own (globex)"
    assert check_tenant_keys(config_with_areas(tmp_path / "none", acme=None, globex=None)) is None
    text = ffswarm(config_with_areas(tmp_path / "none2", acme=None, globex=None).path, "doctor")
    assert "tenant-keys" not in text.stdout


def serve_briefly(config: Config) -> None:
    """`serve` over the config's inbox until its first heartbeat, then stopped."""

    def run(config: Config, path: Path, metrics: Metrics) -> Outcome:
        return Outcome(True, None)

    server = Server(config, Inbox(config.data_root / "inbox"), Metrics(), poll=0.05, run=run, heartbeat_every=0.1)
    t = threading.Thread(target=server.serve_forever, daemon=True)
    t.start()
    beats: set[float] = set()

    def beaten() -> bool:  # a few loops' beats: the warning is the start's, not each loop's
        with contextlib.suppress(OSError, ValueError):
            beats.add(json.loads(server.heartbeat.path.read_text())["updated"])
        return len(beats) >= 3

    until(beaten, "serve's first three heartbeats")
    server.stop.set()
    t.join(30)
    assert not t.is_alive()


@pytest.mark.parametrize(("acme", "warned"), [("s3://media/acme/", True), (None, False)])
def test_serve_logs_one_warning_at_start_for_a_tenant_on_the_clusters_keys(
    tmp_path: Path, acme: object, warned: bool
) -> None:
    config = config_with_areas(tmp_path, acme=acme)
    with capture_logs() as logs:
        serve_briefly(config)
    found = [e for e in logs if e["event"] == EVENT]
    if not warned:
        assert found == []
        return
    (record,) = found
    assert record["log_level"] == "warning" and record["tenants"] == ["acme"]
    assert "tenants.acme.s3.credentials_secret" in record["fix"]


def test_api_with_two_workers_logs_the_warning_once(tmp_path: Path) -> None:
    config = config_with_areas(tmp_path)
    log = tmp_path / "api.log"
    api = ApiProcess(config, log, ("--workers", "2"))
    api.stop()
    records = [json.loads(line) for line in log.read_text().splitlines() if line.startswith("{")]
    found = [r for r in records if r.get("event") == EVENT]
    assert len(found) == 1, log.read_text()
    assert found[0]["level"] == "warning" and found[0]["tenants"] == ["acme"] and found[0]["component"] == "api"
    assert "tenants.acme.s3.credentials_secret" in found[0]["fix"]
