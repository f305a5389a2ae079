"""The controller as a Swarm service: `ffswarm render --controller` → `docker stack deploy` → inbox → outputs.

The runner image carries the ffswarm package and the API's web stack, so the controller runs from it.
The dev image may be older than this checkout, so the test derives a throwaway image from it with the
checkout's contract/, controller/ and runner_image/ and the venv's prometheus_client and API stack
(starlette, uvicorn, python-multipart, PyJWT) copied in: nothing is downloaded. With tenants in the
config the stack also runs `ffswarm api` (two replicas, non-root, its signing key a Swarm secret),
which must answer on its published port.
Everything (image, stack, config, secret, inbox) carries the test's name and is removed in teardown.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import os
import shutil
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from controller.swarm.docker import DockerSwarm
from tests.integration.conftest import ROOT, Workspace, free_port
from tests.integration.test_ops_serve import drop, job_text

pytestmark = pytest.mark.integration
DOCKER_ENV = {**os.environ, "DOCKER_API_VERSION": "1.41"}
SITE = "/opt/ffswarm/lib/python3.11/site-packages"
VENV_PACKAGES = ("prometheus_client", "starlette", "anyio", "uvicorn", "h11", "python_multipart", "jwt")
API_USER = "10002:10002"  # the api service's (never root); it only reads at start, so no folder needs to be its


@pytest.fixture
def controller_image(workspace: Workspace, swarm: DockerSwarm) -> Iterator[str]:
    ctx = workspace.dir / "image"
    ctx.mkdir()
    for pkg in ("contract", "controller", "runner_image"):
        shutil.copytree(ROOT / pkg, ctx / pkg, ignore=shutil.ignore_patterns("__pycache__"))
    for mod in VENV_PACKAGES:
        shutil.copytree(Path(importlib.import_module(mod).__file__ or "").parent, ctx / mod,
                        ignore=shutil.ignore_patterns("__pycache__"))  # fmt: skip
    base = swarm.resolve_image(workspace.config.controller_image or workspace.config.image)  # Dockerfile.controller's
    (ctx / "Dockerfile").write_text(
        f"FROM {base}\nUSER root\n"
        + "".join(f"COPY {p} {SITE}/{p}\n" for p in ("contract", "controller", "runner_image", *VENV_PACKAGES))
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
    for _ in range(20):  # the api's secret, once no container of the stack holds it
        gone = subprocess.run(["docker", "secret", "rm", f"{name}-api-key"], env=DOCKER_ENV, capture_output=True,
                              text=True, timeout=30)  # fmt: skip
        if gone.returncode == 0 or "not found" in gone.stderr.lower():
            break
        time.sleep(1)


def test_controller_stack_runs_inbox_jobs(
    workspace: Workspace, controller_image: str, stack: str, swarm: DockerSwarm
) -> None:
    ws = workspace
    config = ws.dir / "ffswarm.yaml"  # its hash names the Swarm config: unique per test
    secret = f"{stack}-api-key"  # the signing key of links, a Swarm secret the api reads at start
    key = ws.dir / "api-key"
    key.write_text(f"signing key {ws.job}\n")
    made = subprocess.run(["docker", "secret", "create", secret, str(key)], env=DOCKER_ENV, capture_output=True,
                          text=True, timeout=30)  # fmt: skip
    assert made.returncode == 0, made.stderr
    api = {"signing_key_file": f"/run/secrets/{secret}"}
    tenants = {"acme": {"api_keys_sha256": [hashlib.sha256(b"acme-key").hexdigest()]}}
    config.write_text(f"# controller stack test {ws.job}\n" + ws.config.path.read_text()
                      + f"api: {json.dumps(api)}\ntenants: {json.dumps(tenants)}\n")  # fmt: skip
    inbox = ws.dir / "inbox"
    port, api_port = free_port(), free_port()
    stack_file = ws.dir / "controller.yml"
    proc = ws.ffswarm("--config", str(config), "render", "--controller", "--image", controller_image,
                      "--metrics-port", str(port), "--inbox", str(inbox), "--api-port", str(api_port),
                      "--api-user", API_USER, "-o", str(stack_file))  # fmt: skip
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
    # The api replicas: each answers /healthz (its healthcheck), runs as API_USER, read the key from the
    # secret (the API refuses to start without it) and answers with the API's own errors. The published
    # port is checked in the service's spec: Swarm's routing mesh does not carry traffic on the dev VM
    # (its engine's iptables mangle rules fail: a plain http.server published the same way is not reached).
    healthy: list[Any] = []
    while len(healthy) < 2:
        found = swarm.client.containers.list(filters={"label": f"com.docker.swarm.service.name={stack}_api"})
        healthy = [c for c in found if c.attrs["State"].get("Health", {}).get("Status") == "healthy"]
        if time.monotonic() - t0 > 300:
            logs = subprocess.run(["docker", "service", "logs", f"{stack}_api"], env=DOCKER_ENV,
                                  capture_output=True, text=True, timeout=30)  # fmt: skip
            pytest.fail(f"api replicas not healthy; logs:\n{(logs.stdout + logs.stderr)[-4000:]}")
        time.sleep(0.5)
    probe = ("import urllib.request, urllib.error\ntry:\n urllib.request.urlopen('http://127.0.0.1:8080/v1/jobs')\n"
             "except urllib.error.HTTPError as e:\n print(e.code, e.read().decode())")  # fmt: skip
    code, out = healthy[0].exec_run(["/opt/ffswarm/bin/python", "-c", probe])
    assert code == 0 and out.decode().startswith("401 ") and '"unauthorized"' in out.decode(), out
    inspect = subprocess.run(["docker", "service", "inspect", f"{stack}_api"], env=DOCKER_ENV, capture_output=True,
                             text=True, timeout=30)  # fmt: skip
    spec = json.loads(inspect.stdout)[0]["Spec"]
    assert spec["Mode"]["Replicated"]["Replicas"] == 2
    container = spec["TaskTemplate"]["ContainerSpec"]
    assert container["User"] == API_USER and container["ReadOnly"] is True
    assert [s["SecretName"] for s in container["Secrets"]] == [secret]
    ports = spec["EndpointSpec"]["Ports"]
    assert [(p["TargetPort"], p["PublishedPort"], p["PublishMode"]) for p in ports] == [(8080, api_port, "ingress")]
