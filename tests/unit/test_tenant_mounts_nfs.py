"""A tenant's job on an NFS volume (docs/operations.md#isolation): the mounts docker.py hands the engine
(docker-py's ``types.Mount``, built from the service spec; no engine is called) make each folder a
volume of its own over the export's sub-path — the area and the model pack read-only, the output and
run folders writable — named by its options, so the same folder is the same volume on every attempt
and after a restart, and no two folders share one. A CLI job still mounts the whole export at /data."""

from __future__ import annotations

import dataclasses
import pickle
from pathlib import Path
from typing import Any

import yaml

from contract.layout import run_rel
from controller.cli import ops
from controller.config import Config, parse_config
from controller.swarm.docker import service_mounts
from controller.swarm.render import render_runner_stack
from controller.swarm.servicespec import RunnerSettings, ServiceSpec, VolumeSpec, chunk_service, tenant_mounts
from tests.unit.test_render_tenant import Swarm, started_tenant_job

SERVER, EXPORT = "nfs.example.internal", "/srv/ffswarm"
NFS_OPTIONS = {"type": "nfs", "o": f"addr={SERVER},nfsvers=4.1,hard"}


def on_nfs(config: Config) -> Config:
    """The same config file with ``volume: {type: nfs, server, export}``, parsed as ffswarm reads it."""
    data = yaml.safe_load(config.path.read_text())
    return parse_config(config.path, {**data, "volume": {"type": "nfs", "server": SERVER, "export": EXPORT}})


def mounts(spec: ServiceSpec) -> list[dict[str, Any]]:
    """The data mounts docker.py gives the engine for ``spec`` (its tmpfs left out), as the API reads them."""
    return [dict(m) for m in service_mounts(spec) if m["Type"] != "tmpfs"]


def volume(target: str, device: str, read_only: bool, name: str) -> dict[str, Any]:
    options = {**NFS_OPTIONS, "device": device}
    return {"Target": target, "Source": name, "Type": "volume", "ReadOnly": read_only,
            "VolumeOptions": {"DriverConfig": {"Name": "local", "Options": options}}}  # fmt: skip


def test_a_tenants_job_mounts_each_folder_as_a_volume_over_the_exports_sub_path(tmp_path: Path) -> None:
    config, job = started_tenant_job(tmp_path)
    config = on_nfs(config)
    services = ops.job_services(config, job, 1, lambda: Swarm())  # type: ignore[arg-type, return-value]
    assert services
    for spec in services:
        found = mounts(spec)
        names = [m["Source"] for m in found]
        assert found == [
            volume("/data/tenants/acme", f":{EXPORT}/tenants/acme", True, names[0]),
            volume(f"/data/tenants/acme/out/{job}", f":{EXPORT}/tenants/acme/out/{job}", False, names[1]),
            volume(f"/data/{run_rel(job)}", f":{EXPORT}/{run_rel(job)}", False, names[2]),
            volume("/data/models/default", f":{EXPORT}/models/default", True, names[3]),
        ]
        assert len(set(names)) == len(names) and config.volume.name not in names  # never the whole export
        assert all(n.startswith("ffswarm-data-") for n in names)


def test_a_folders_volume_keeps_its_name_across_attempts_restarts_and_the_rendered_stack(tmp_path: Path) -> None:
    config, job = started_tenant_job(tmp_path)
    config = on_nfs(config)
    first = ops.job_services(config, job, 1, lambda: Swarm())[0]  # type: ignore[arg-type, return-value]
    again = ops.job_services(on_nfs(config), job, 2, lambda: Swarm())[0]  # type: ignore[arg-type, return-value]
    travelled = pickle.loads(pickle.dumps(config))  # as the config reaches the API's worker processes
    names = [m["Source"] for m in mounts(first)]
    assert [m["Source"] for m in mounts(again)] == names
    assert [m["Source"] for m in mounts(dataclasses.replace(first, volume=travelled.volume))] == names
    # a hash of the options, the same in every process (volumes made by an earlier controller are reused)
    assert names[0] == "ffswarm-data-423e6913b4"
    stack = yaml.safe_load(render_runner_stack([first]))
    rendered = {v["name"]: v["driver_opts"]["device"] for v in stack["volumes"].values()}
    assert {m["Source"]: m["VolumeOptions"]["DriverConfig"]["Options"]["device"] for m in mounts(first)}.items() <= (
        rendered.items()
    )


def test_two_tenants_never_share_a_volume_and_a_cli_job_mounts_the_whole_export(tmp_path: Path) -> None:
    nfs = VolumeSpec.nfs(SERVER, EXPORT)
    base = RunnerSettings(
        job="sel-abcdefgh", image="sha256:1", constraints=(), gpu_kind="GPU", gpus=1, memory_bytes=1 << 30,
        volume=nfs, user="10001:10001",
    )  # fmt: skip

    def tenant(name: str, job: str) -> list[dict[str, Any]]:
        folders = tenant_mounts(f"tenants/{name}", f"runs/{job}", "models/default", [f"tenants/{name}/out"])
        settings = dataclasses.replace(base, job=job, data_mounts=folders)
        return mounts(chunk_service(settings, "c0000", 1))

    acme, globex = tenant("acme", "sel-abcdefgh"), tenant("globex", "party-ijklmnop")
    assert {m["Source"] for m in acme[:3]}.isdisjoint(m["Source"] for m in globex[:3])  # area, outputs, run
    assert acme[3] == globex[3]  # the model pack: one read-only volume for both
    cli = mounts(chunk_service(base, "c0000", 1))
    assert cli == [volume("/data", f":{EXPORT}", False, nfs.name)]
