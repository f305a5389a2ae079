"""A tenant's runner sees only its tenant (docs/operations.md#isolation), on the real engine: the
live service's mounts hold no folder outside the tenant's area, its run folder and its model pack,
and a process in the real runner image, started as that tenant's chunk, cannot read another
tenant's upload or another job's run folder (ENOENT: not there) nor write the data root, the
models or its own uploads (EROFS), while it can write its outputs and its run folder."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import time
import uuid
from collections.abc import Iterator

import pytest

from controller.job.owners import area_rel
from controller.swarm.backend import ENDED
from controller.swarm.docker import DockerSwarm
from controller.swarm.servicespec import RunnerSettings, chunk_service, tenant_mounts
from tests.integration.conftest import Workspace, chown_tree

pytestmark = pytest.mark.integration

PROBE = r"""
import errno, json, os, sys
out, tries = sys.argv[1], json.loads(sys.argv[2])
def attempt(mode, path):
    try:
        if mode == "read":
            open(path, "rb").close()
        else:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            os.write(fd, b"x")
            os.close(fd)
        return "ok"
    except OSError as e:
        return errno.errorcode.get(e.errno, str(e.errno))
seen = {f"{m} {p}": attempt(m, p) for m, p in tries}
seen["listing /data"] = sorted(os.listdir("/data"))
with open(out, "w") as f:
    json.dump(seen, f)
"""


@pytest.fixture
def two_tenants(workspace: Workspace) -> Iterator[tuple[str, str]]:
    tag = uuid.uuid4().hex[:6]
    names = (f"iso-a-{tag}", f"iso-b-{tag}")
    yield names
    for t in names:
        shutil.rmtree(workspace.root / area_rel(t), ignore_errors=True)


def test_a_tenants_runner_sees_only_its_area_its_run_folder_and_the_models(
    workspace: Workspace, swarm: DockerSwarm, two_tenants: tuple[str, str]
) -> None:
    ws, cfg = workspace, workspace.config
    a, b = two_tenants
    root = ws.root
    for t in (a, b):
        (root / area_rel(t) / "uploads" / "j1").mkdir(parents=True)
        (root / area_rel(t) / "uploads" / "j1" / "face.jpg").write_bytes(b"tenant photo")
    out = root / area_rel(a) / "out" / ws.job
    out.mkdir(parents=True)
    other_run = root / "runs" / f"{ws.job}-other"
    (other_run / "results").mkdir(parents=True)
    run = root / "runs" / ws.job
    (run / "results").mkdir(parents=True)
    for p in (root / area_rel(a), root / area_rel(b), other_run, run):
        chown_tree(p, cfg.runner_uid_gid())
    assert (root / "models" / "default").is_dir()

    mounts = tenant_mounts(area_rel(a), f"runs/{ws.job}", "models/default", [f"{area_rel(a)}/out/{ws.job}"])
    settings = RunnerSettings(
        job=ws.job, image=swarm.resolve_image(cfg.image), constraints=("node.labels.ffswarm.gpu==true",),
        gpu_kind="GPU", gpus=1, memory_bytes=512 << 20, volume=cfg.volume, user=cfg.runner_uid_gid(),
        data_mounts=mounts,
    )  # fmt: skip
    tries = [
        ("read", f"/data/{area_rel(b)}/uploads/j1/face.jpg"),  # another tenant's upload
        ("write", f"/data/{area_rel(b)}/uploads/j1/planted.jpg"),
        ("write", "/data/planted"),  # the data root
        ("write", f"/data/runs/{ws.job}-other/results/c0000.a1.jsonl"),  # another job's run folder
        ("write", "/data/models/default/pack.yaml"),  # the model pack
        ("write", f"/data/{area_rel(a)}/uploads/j1/face.jpg"),  # its own inputs
        ("read", f"/data/{area_rel(a)}/uploads/j1/face.jpg"),
        ("write", f"/data/{area_rel(a)}/out/{ws.job}/out.jpg"),  # its outputs
    ]
    answer = f"/data/runs/{ws.job}/results/probe.json"
    spec = dataclasses.replace(
        chunk_service(settings, "c0000", 1),
        command=("/opt/ffswarm/bin/python", "-c", PROBE, answer, json.dumps(tries)),
    )
    swarm.create_service(spec)

    live = swarm.client.api.inspect_service(spec.name)["Spec"]["TaskTemplate"]["ContainerSpec"]["Mounts"]
    data = [m for m in live if m["Type"] != "tmpfs"]
    allowed = {str(root / area_rel(a)), str(run), str(root / "models" / "default")}
    assert all(any(m["Source"] == p or m["Source"].startswith(p + "/") for p in allowed) for m in data), data
    assert {m["Target"]: bool(m.get("ReadOnly")) for m in data} == {
        f"/data/{area_rel(a)}": True,
        f"/data/{area_rel(a)}/out/{ws.job}": False,
        f"/data/runs/{ws.job}": False,
        "/data/models/default": True,
    }

    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        states = [t.state for s in swarm.services(ws.job) for t in s.tasks]
        if states and all(st in ENDED for st in states):
            break
        time.sleep(0.5)
    assert states and all(st == "complete" for st in states), states
    seen = json.loads((run / "results" / "probe.json").read_text())
    assert seen == {
        f"read /data/{area_rel(b)}/uploads/j1/face.jpg": "ENOENT",
        f"write /data/{area_rel(b)}/uploads/j1/planted.jpg": "ENOENT",
        "write /data/planted": "EROFS",
        f"write /data/runs/{ws.job}-other/results/c0000.a1.jsonl": "ENOENT",
        "write /data/models/default/pack.yaml": "EROFS",
        f"write /data/{area_rel(a)}/uploads/j1/face.jpg": "EROFS",
        f"read /data/{area_rel(a)}/uploads/j1/face.jpg": "ok",
        f"write /data/{area_rel(a)}/out/{ws.job}/out.jpg": "ok",
        "listing /data": ["models", "runs", "tenants"],
    }
    assert (root / area_rel(b) / "uploads" / "j1" / "face.jpg").read_bytes() == b"tenant photo"
    assert not (root / area_rel(b) / "uploads" / "j1" / "planted.jpg").exists()
    assert (out / "out.jpg").read_bytes() == b"x"
    assert not os.path.lexists(other_run / "results" / "c0000.a1.jsonl")
    shutil.rmtree(other_run, ignore_errors=True)
