"""The controller as a Swarm service: `ffswarm render --controller` → `docker stack deploy` → inbox → outputs.

The runner image carries the ffswarm package, so the controller runs from it. The dev image may be
older than this checkout (and predates prometheus_client), so the test derives a throwaway image
from it with the checkout's contract/, controller/ and runner_image/ and the venv's prometheus_client
copied in: nothing is downloaded. Everything (image, stack, config, inbox) carries the test's name and is
removed in teardown.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import prometheus_client
import pytest

from controller.swarm.docker import DockerSwarm
from tests.integration.conftest import ROOT, Workspace
from tests.integration.test_ops_serve import drop, free_port, job_text

pytestmark = pytest.mark.integration
DOCKER_ENV = {**os.environ, "DOCKER_API_VERSION": "1.41"}
SITE = "/opt/ffswarm/lib/python3.11/site-packages"


@pytest.fixture
def controller_image(workspace: Workspace, swarm: DockerSwarm) -> Iterator[str]:
    ctx = workspace.dir / "image"
    ctx.mkdir()
    for pkg in ("contract", "controller", "runner_image"):
        shutil.copytree(ROOT / pkg, ctx / pkg, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(Path(prometheus_client.__file__).parent, ctx / "prometheus_client",
                    ignore=shutil.ignore_patterns("__pycache__"))  # fmt: skip
    base = swarm.resolve_image(workspace.config.image)
    (ctx / "Dockerfile").write_text(
        f"FROM {base}\nUSER root\n"
        + "".join(f"COPY {p} {SITE}/{p}\n" for p in ("contract", "controller", "runner_image", "prometheus_client"))
    )
    tag = f"ffswarm/controller-test:{workspace.job}"
    swarm.client.images.build(path=str(ctx), tag=tag, rm=True, labels={"io.ffswarm.test": workspace.job})
    yield tag
    swarm.client.images.remove(tag, force=True)


@pytest.fixture
def stack(workspace: Workspace, swarm: DockerSwarm) -> Iterator[str]:
    name = f"ctl{workspace.job[-6:]}"
    yield name
    subprocess.run(["docker", "stack", "rm", name], env=DOCKER_ENV, capture_output=True, timeout=60)
    deadline = time.monotonic() + 30  # the controller's own chunk services, should it have left any
    while swarm.client.containers.list(all=True, filters={"label": f"com.docker.stack.namespace={name}"}):
        if time.monotonic() > deadline:
            break
        time.sleep(0.5)


def test_controller_stack_runs_inbox_jobs(workspace: Workspace, controller_image: str, stack: str) -> None:
    ws = workspace
    config = ws.dir / "ffswarm.yaml"  # its hash names the Swarm config: unique per test
    config.write_text(f"# controller stack test {ws.job}\n" + ws.config.path.read_text())
    inbox = ws.dir / "inbox"
    port = free_port()
    stack_file = ws.dir / "controller.yml"
    proc = ws.ffswarm("--config", str(config), "render", "--controller", "--image", controller_image,
                      "--metrics-port", str(port), "--inbox", str(inbox), "-o", str(stack_file))  # fmt: skip
    # (the global --config given twice: the later one wins; the test config is the one rendered)
    assert proc.returncode == 0, proc.stderr[-2000:]
    deploy = subprocess.run(["docker", "stack", "deploy", "--resolve-image", "never", "-c", str(stack_file), stack],
                            env=DOCKER_ENV, capture_output=True, text=True, timeout=120)  # fmt: skip
    assert deploy.returncode == 0, deploy.stderr
    t0 = time.monotonic()
    drop(inbox, "broken.yaml", "name: [not, a, name]\n")
    drop(inbox, f"{ws.job}.yaml", job_text(ws, 3))
    done = inbox / "done" / f"{ws.job}.yaml"
    while not done.exists():
        if time.monotonic() - t0 > 300:
            logs = subprocess.run(["docker", "service", "logs", f"{stack}_controller"], env=DOCKER_ENV,
                                  capture_output=True, text=True, timeout=30)  # fmt: skip
            pytest.fail(f"job not done; controller logs:\n{(logs.stdout + logs.stderr)[-4000:]}")
        time.sleep(0.3)
    print(f"controller stack: deploy → 4-item job done in {time.monotonic() - t0:.1f}s")
    assert sorted(p.name for p in (ws.dir / "out").iterdir()) == sorted(p.name for p in (ws.dir / "crowd").iterdir())
    failed = inbox / "failed" / "broken.yaml.reason.txt"
    assert failed.is_file() and "JobFileError (exit 65)" in failed.read_text() and "broken.yaml: " in failed.read_text()
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        text = r.read().decode()
    assert "ffswarm_items_done_total 4.0" in text
