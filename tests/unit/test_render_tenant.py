"""`ffswarm render <id>` of an API job: resolved inside its tenant's area, as `serve` resolved it, when
the run folder's ``owner`` is the controller's own file naming a configured tenant; any other owner
file (the runner's, writable by others, a link, an unknown tenant) leaves it a CLI job, refused as one.
Real files and ownership; the services are built as data, nothing is deployed."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

from contract.layout import run_rel
from controller.api import submit
from controller.api.area import Area
from controller.cli import ops
from controller.config import Config
from controller.errors import JobFileError
from controller.run import jobs, usecase
from controller.run.jobs import start_run
from controller.run.rundir import RunDir
from controller.serve import daemon as serve
from controller.serve.inbox import Inbox
from controller.swarm.render import render_runner_stack
from controller.swarm.servicespec import LABEL_JOB
from tests.builders import JPEG, beat, make_config
from tests.fakes import FakeSwarm

ROOT_ONLY = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to hand a file to another uid")


@dataclass
class Swarm(FakeSwarm):
    networks: list[str] = field(default_factory=list)

    def ensure_network(self, name: str, image: str, user: str) -> None:
        self.networks.append(name)


def started_tenant_job(tmp_path: Path) -> tuple[Config, str]:
    """A tenant's job accepted by the API, claimed from the inbox by serve, its run folder started
    and its ``owner`` recorded, as serve does before the first chunk."""
    config, _ = make_config(tmp_path)
    beat(config)
    area = Area(config.data_root, "acme")
    area.ensure(None)
    for rel in ("faces/me.jpg", "crowd/a.jpg", "crowd/b.jpg"):
        (area.path / rel).parent.mkdir(parents=True, exist_ok=True)
        (area.path / rel).write_bytes(JPEG)
    data = {"name": "party", "source": "faces/me.jpg", "targets": ["crowd/*.jpg"], "providers": ["cpu"]}
    job = submit.submit_json(config, config.tenants["acme"], area, data).job
    inbox = Inbox(config.data_root / "inbox")
    inbox.ensure()
    settled = time.time() - 10
    os.utime(inbox.path / f"{job}.yaml", (settled, settled))
    claimed = inbox.claim(inbox.path / f"{job}.yaml")
    assert claimed is not None and serve.job_owner(config, claimed) == "acme"
    rundir = start_run(config, usecase.one_job(config, claimed, tenant="acme"), "sha256:" + "1" * 64)
    serve.record_owner("acme")(rundir, None)  # type: ignore[arg-type]  # the job is not looked at
    return config, job


def render(config: Config, job: str) -> list[str]:
    swarm = Swarm()
    services = ops.job_services(config, job, 1, lambda: swarm)  # type: ignore[arg-type, return-value]
    assert all(s.labels[LABEL_JOB] == job for s in services)
    return [s.name for s in services]


def test_an_api_jobs_run_folder_renders_as_its_tenants_job(tmp_path: Path) -> None:
    config, job = started_tenant_job(tmp_path)
    assert jobs.run_tenant(config, job) == "acme"
    chunks = [c.id for c in RunDir(config.data_root, job).plan().chunks]
    names = render(config, job)
    assert len(names) == len(chunks) >= 1 and all(job in n for n in names)


def test_an_api_jobs_stack_mounts_only_its_tenants_folders(tmp_path: Path) -> None:
    config, job = started_tenant_job(tmp_path)
    services = ops.job_services(config, job, 1, lambda: Swarm())  # type: ignore[arg-type, return-value]
    stack = yaml.safe_load(render_runner_stack(services))
    root = str(config.data_root)
    for svc in stack["services"].values():
        assert {
            (m["type"], m["source"], m["target"], m["read_only"]) for m in svc["volumes"] if m["type"] != "tmpfs"
        } == {
            ("bind", f"{root}/tenants/acme", "/data/tenants/acme", True),
            ("bind", f"{root}/tenants/acme/out/{job}", f"/data/tenants/acme/out/{job}", False),
            ("bind", f"{root}/{run_rel(job)}", f"/data/{run_rel(job)}", False),
            ("bind", f"{root}/models/default", "/data/models/default", True),
        }


def refused_as_a_cli_job(config: Config, job: str) -> None:
    assert jobs.run_tenant(config, job) is None
    with pytest.raises(JobFileError) as e:  # a CLI job may not have an id that puts its run folder in a tenant's
        render(config, job)
    assert e.value.field == "name" and "the API's jobs" in e.value.reason


def test_an_owner_file_naming_a_tenant_the_config_lacks_is_a_cli_job(tmp_path: Path) -> None:
    config, job = started_tenant_job(tmp_path)
    rundir = RunDir(config.data_root, job, (10001, 10001), config.controller_ids())
    rundir.write_file(rundir.layout.owner, b"initech\n")  # the controller's file, an unknown tenant
    refused_as_a_cli_job(config, job)


def test_an_owner_file_others_may_write_or_a_link_is_a_cli_job(tmp_path: Path) -> None:
    config, job = started_tenant_job(tmp_path)
    owner = RunDir(config.data_root, job).layout.owner
    owner.chmod(0o666)
    refused_as_a_cli_job(config, job)
    owner.chmod(0o640)
    assert jobs.run_tenant(config, job) == "acme"
    copy = tmp_path / "owner"
    copy.write_text("acme\n")
    owner.unlink()
    owner.symlink_to(copy)
    refused_as_a_cli_job(config, job)


@ROOT_ONLY
def test_an_owner_file_the_runner_owns_is_a_cli_job(tmp_path: Path) -> None:
    config, job = started_tenant_job(tmp_path)
    owner = RunDir(config.data_root, job).layout.owner
    os.chown(owner, 10001, 10001)  # a runner could have written it
    refused_as_a_cli_job(config, job)
    os.chown(owner, *config.controller_ids())
    os.chown(owner.parent, 10001, 10001)  # nor may the run folder be the runner's
    refused_as_a_cli_job(config, job)


def test_a_run_folder_without_an_owner_file_is_a_cli_job_as_before(tmp_path: Path) -> None:
    config, job = started_tenant_job(tmp_path)
    RunDir(config.data_root, job).layout.owner.unlink()
    refused_as_a_cli_job(config, job)


def test_a_reopened_api_job_keeps_its_tenant_and_its_runners_narrow_view(tmp_path: Path) -> None:
    """`ffswarm resume`/`retry` reopen a job from its run folder: a tenant's job stays the tenant's,
    so its runners still see only the tenant's folders (and get only its storage keys)."""
    config, job = started_tenant_job(tmp_path)
    prepared, _ = jobs.open_run(config, job)
    assert prepared.tenant == "acme"
    assert {m.rel for m in jobs.data_mounts(config, prepared)} == {
        "tenants/acme",
        f"tenants/acme/out/{job}",
        run_rel(job).as_posix(),
        "models/default",
    }
    os.unlink(config.data_root / run_rel(job) / "owner")  # no owner record: a CLI job, as before
    assert jobs.open_run(config, job)[0].tenant is None
