"""The runner image on a hostile volume, in a real chunk service under the real supervisor (issue 16,
runner side): what changed on the volume after planning — a target swapped for a FIFO, an output
folder swapped for a symlink into another user's folder, a file put where an output goes — fails
its own item at once, and nothing is written through a link or over a file the job did not write.
The attempt's results file is the controller's creation, per attempt, for the runner's uid."""

from __future__ import annotations

import hashlib
import json
import os
import stat
import time
from typing import Any

import pytest

from contract.results import ItemStatus, chunk_results
from controller.run.chunks import Policy
from controller.run.failures import ChunkState
from controller.run.rundir import Control, RunDir
from controller.run.supervisor import Supervisor
from controller.swarm.docker import DockerSwarm
from controller.swarm.servicespec import RunnerSettings
from runner_image.safefs import EXISTS
from tests.fixtures import photos
from tests.integration.conftest import Workspace, chown_tree

pytestmark = pytest.mark.integration


def test_what_changed_after_planning_fails_alone_and_nothing_is_written_through_it(
    workspace: Workspace, swarm: DockerSwarm
) -> None:
    ws = workspace
    cfg = ws.config
    uid, gid = (int(x) for x in cfg.runner_uid_gid().split(":"))
    star = photos.astronaut(ws.dir / "faces")
    photos.face_photos(ws.dir / "crowd", 3)
    os.mkfifo(ws.dir / "crowd" / "fifo.jpg")  # was a photo when the job was planned
    private = ws.dir / "alice" / "private"
    private.mkdir(parents=True)
    (ws.dir / "out").mkdir()
    (ws.dir / "out" / "taken.jpg").write_bytes(b"alice's picture")  # not this job's
    (ws.dir / "linked").symlink_to(private)  # an output folder swapped for a link
    chown_tree(ws.dir, cfg.runner_uid_gid())

    rundir = RunDir(ws.root, ws.job, (uid, gid))
    for sub in ("chunks", "results", "logs"):
        (rundir.path / sub).mkdir(parents=True)
    d = f"/data/{ws.rel(ws.dir)}"
    items = [
        ("i000000", f"{d}/crowd/fifo.jpg", f"{d}/out/fifo.jpg"),
        ("i000001", f"{d}/crowd/face_00.jpg", f"{d}/linked/face_00.jpg"),
        ("i000002", f"{d}/crowd/face_01.jpg", f"{d}/out/taken.jpg"),
        ("i000003", f"{d}/crowd/face_02.jpg", f"{d}/out/face_02.jpg"),
    ]
    manifest: dict[str, Any] = {
        "schema": 1,
        "job": ws.job,
        "chunk": "c0000",
        "run_dir": f"/data/runs/{ws.job}",
        "pack_dir": "/data/models/default",
        "source": [f"/data/{ws.rel(star)}"],
        "providers": ["cpu"],
        "items": [{"id": i, "input": src, "output": out} for i, src, out in items],
    }
    (rundir.path / "chunks" / "c0000.json").write_text(json.dumps(manifest))
    rundir.write_control(Control(max_concurrent=1))
    chown_tree(rundir.path, cfg.runner_uid_gid())

    settings = RunnerSettings(
        job=ws.job,
        image=swarm.resolve_image(cfg.image),
        constraints=("node.labels.ffswarm.gpu==true",),
        gpu_kind="GPU",
        gpus=1,
        memory_bytes=2 << 30,
        volume=cfg.volume,
        user=cfg.runner_uid_gid(),
    )
    t0 = time.monotonic()
    runs = Supervisor(swarm, rundir, settings, Policy(retries=0, timeout=600, schedule_timeout=60, poll=0.2)).run(
        ["c0000"]
    )
    elapsed = time.monotonic() - t0
    run = runs["c0000"]
    assert run.state is ChunkState.DONE and [a.exit_code for a in run.attempts] == [3], run.as_dict()
    assert elapsed < 300, f"the FIFO held the chunk ({elapsed:.0f} s)"

    made = rundir.layout.results("c0000", 1)
    st = os.stat(made, follow_symlinks=False)
    assert stat.S_ISREG(st.st_mode) and (st.st_uid, st.st_gid) == (uid, gid) and stat.S_IMODE(st.st_mode) == 0o640
    latest = chunk_results(rundir.layout.results_dir, "c0000").latest
    rel = ws.rel(ws.dir)
    assert latest["i000000"].reason == f"{rel}/crowd/fifo.jpg: is a FIFO (named pipe), not a regular file"
    assert latest["i000001"].reason == f"{rel}/linked/face_00.jpg: folder {rel}/linked is a symbolic link: not followed"
    assert latest["i000002"].reason == f"{rel}/out/taken.jpg: {EXISTS}"
    ok = latest["i000003"]
    body = (ws.dir / "out" / "face_02.jpg").read_bytes()
    assert (ok.status, ok.size, ok.sha256) == (ItemStatus.OK, len(body), hashlib.sha256(body).hexdigest())
    assert list(private.iterdir()) == []
    assert (ws.dir / "out" / "taken.jpg").read_bytes() == b"alice's picture"
    assert sorted(p.name for p in (ws.dir / "out").iterdir()) == ["face_02.jpg", "taken.jpg"]  # no temp left
