"""Folders made by another user (issue "Tried as a new user", 1): on the real dev swarm, photos copied
onto the volume as root (`mkdir -p hidden/in`) and an output folder under it that does not exist
yet — the job works, its output folder made for the runner; an output folder that exists and is
root's — `ffswarm submit` refuses at once (exit 66) with the fix, leaving nothing behind."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from controller.swarm.docker import DockerSwarm
from controller.swarm.servicespec import LABEL_JOB
from tests.fixtures import photos
from tests.integration.conftest import Workspace

pytestmark = pytest.mark.integration


def root_made(ws: Workspace, n: int) -> Path:
    """As root: `mkdir -p <ws>/hidden/in && cp photos hidden/in/` (folders 0755, files 0644, owner 0:0)."""
    for p in (ws.dir, ws.dir / "hidden", ws.dir / "hidden" / "in"):
        p.mkdir(exist_ok=True)
        os.chown(p, 0, 0)
        p.chmod(0o755)
    for p in [photos.astronaut(ws.dir / "hidden" / "in"), *photos.face_photos(ws.dir / "hidden" / "in", n)]:
        os.chown(p, 0, 0)
        p.chmod(0o644)
    return ws.dir / "hidden"


def job_text(ws: Workspace, hidden: Path) -> str:
    return f"""
name: {ws.job}
source: {ws.rel(hidden / "in" / "astronaut.jpg")}
targets: [{ws.rel(hidden / "in")}/face_*.jpg]
output: {ws.rel(hidden / "out")}/{{stem}}{{ext}}
chunk_size: 2
providers: [cpu]
resources: {{gpus: 1, gpu_kind: GPU, memory: 2g}}
retries: 0
timeout: 10m
"""


def owner(p: Path) -> str:
    st = p.stat()
    return f"{st.st_uid}:{st.st_gid}"


@pytest.mark.skipif(os.geteuid() != 0, reason="makes root's folders")
def test_root_made_folders_work_the_output_folder_is_made_for_the_runner(workspace: Workspace) -> None:
    ws = workspace
    hidden = root_made(ws, 3)
    job_file = ws.write_job(job_text(ws, hidden))
    dry = ws.ffswarm("submit", "--dry-run", str(job_file))
    assert dry.returncode == 0, dry.stderr[-3000:]
    assert not (hidden / "out").exists() and not (ws.root / "runs" / ws.job).exists()  # a dry run makes nothing

    proc = ws.ffswarm("submit", str(job_file))
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert owner(hidden / "out") == ws.config.runner_uid_gid() and owner(hidden) == "0:0"
    outputs = sorted(p.name for p in (hidden / "out").iterdir())
    assert outputs == sorted(p.name for p in (hidden / "in").glob("face_*.jpg")) and len(outputs) == 3


@pytest.mark.skipif(os.geteuid() != 0, reason="makes root's folders")
def test_an_output_folder_the_runner_cannot_write_is_refused_at_submit(
    workspace: Workspace, swarm: DockerSwarm
) -> None:
    ws = workspace
    hidden = root_made(ws, 2)
    (hidden / "out").mkdir()
    os.chown(hidden / "out", 0, 0)
    (hidden / "out").chmod(0o755)
    job_file = ws.write_job(job_text(ws, hidden))
    before = sorted(str(p) for p in ws.dir.rglob("*"))

    proc = ws.ffswarm("submit", str(job_file), timeout=120)
    assert proc.returncode == 66, proc.stdout[-2000:] + proc.stderr[-3000:]
    out_rel = ws.rel(hidden / "out")
    assert f"  {out_rel}: output folder the runner cannot write (owner 0:0, mode 0755)" in proc.stderr
    uid_gid = ws.config.runner_uid_gid()
    assert f"chown -R {uid_gid} {out_rel} && chmod -R u+rwX {out_rel}" in proc.stderr
    assert "runner_user:" in proc.stderr
    assert not (ws.root / "runs" / ws.job).exists()
    assert sorted(str(p) for p in ws.dir.rglob("*")) == before
    assert swarm.client.api.services(filters={"label": f"{LABEL_JOB}={ws.job}"}) == []
