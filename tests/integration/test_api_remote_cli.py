"""`ffswarm --api URL` from a machine with no Docker socket, no data root and no config: a folder of
real photos uploaded to the dev swarm's API, run by real runners, followed to the CLI's exit code,
and the results downloaded."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.fixtures import photos
from tests.integration.conftest import ROOT, Api, Tenants, Workspace

pytestmark = pytest.mark.integration

OPTIONS = """\
name: remote
no_face: skip
chunk_size: 2
providers: [cpu]
resources: {gpus: 1, gpu_kind: GPU, memory: 2g}
"""


def ffswarm(laptop: Path, api: Api, token: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(laptop),
        "XDG_CONFIG_HOME": str(laptop / ".config"),
        "DOCKER_HOST": f"unix://{laptop}/no-docker.sock",  # no engine to reach: everything goes through the API
        "PYTHONPATH": str(ROOT),
        "FFSWARM_API_URL": api.url,
        "FFSWARM_TOKEN": token,
    }
    cmd = [sys.executable, "-m", "controller.cli", *args]
    return subprocess.run(cmd, cwd=laptop, env=env, capture_output=True, text=True, timeout=600, check=False)


def test_a_laptop_submits_a_folder_to_the_swarms_api_exits_like_submit_and_downloads_the_results(
    workspace: Workspace, tenants: Tenants, api: Api, tmp_path: Path
) -> None:
    laptop = tmp_path / "laptop"
    me = photos.astronaut(laptop / "me")
    crowd = photos.face_photos(laptop / "crowd", 3)
    (laptop / "crowd" / "broken.jpg").write_bytes(b"\xff\xd8\xff\xe0" + os.urandom(4000))  # a JPEG's head only
    (laptop / "options.yaml").write_text(OPTIONS)
    token = tenants.keys[tenants.a]

    run = ffswarm(laptop, api, token, "submit", "options.yaml", "crowd", "--source", str(me.relative_to(laptop)))
    assert run.returncode == 1, run.stdout + run.stderr  # one item failed: 1, as a local submit
    found = re.search(r"^job (\S+): accepted", run.stdout, re.M)
    assert found, run.stdout
    job = found.group(1)
    assert f"job {job}: 3 ok, 0 without a face, 1 failed of 4 items" in run.stdout, run.stdout
    lines = [json.loads(line) for line in run.stdout.splitlines() if line.startswith("{")]
    assert lines and lines[-1]["phase"] == "finished"  # off a terminal: a status line per change
    assert not (laptop / "no-docker.sock").exists()

    status = ffswarm(laptop, api, token, "status", job, "-o", "json")
    assert status.returncode == 0, status.stderr
    row = json.loads(status.stdout)
    assert (row["outcome"], row["items"]["ok"], row["items"]["failed"]) == ("partial", 3, 1)
    logs = ffswarm(laptop, api, token, "logs", job)
    assert logs.returncode == 0 and "broken.jpg" in logs.stdout, logs.stdout + logs.stderr

    got = ffswarm(laptop, api, token, "results", job, "-o", "out.zip")
    assert got.returncode == 0, got.stdout + got.stderr
    with zipfile.ZipFile(laptop / "out.zip") as zf:
        names = sorted(Path(n).name for n in zf.namelist() if not n.endswith("/"))
        outputs = [n for n in names if n.endswith(".jpg")]
        assert sorted(outputs) == sorted(p.name for p in crowd), names
        assert all(zf.read(n)[:2] == b"\xff\xd8" for n in zf.namelist() if n.endswith(".jpg"))

    other = ffswarm(laptop, api, tenants.keys[tenants.b], "status", job)
    assert other.returncode == 2, other.stdout + other.stderr  # another tenant's job does not exist for it
