"""The cluster's policy on the real dev swarm (issue 15): a job file asking for what the policy does
not allow is refused before anything is created; hooks run as the policy says; webhooks are never
redirected."""

from __future__ import annotations

import dataclasses
import http.server
import json
import os
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from controller.swarm.backend import ENDED
from controller.swarm.docker import DockerSwarm
from controller.swarm.servicespec import PIDS_LIMIT, RUNNER_NANO_CPUS, RUNNER_NETWORK
from tests.integration.conftest import ServiceWatch, Workspace, shell_service
from tests.integration.test_operating import make_job, report_of

pytestmark = pytest.mark.integration
DOCKER_ENV = {**os.environ, "DOCKER_API_VERSION": "1.41"}  # CLI 28 against engine 20.10


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"on_complete": {"command": "sh -c 'id > /tmp/pwned'"}}, "on_complete.command: is no longer supported"),
        ({"image": "busybox:latest"}, "image: 'busybox:latest' is not in the cluster's policy.images"),
        ({"placement": ["node.role==manager"]}, "placement[0]: 'node.role==manager' is not allowed"),
        ({"resources": {"gpus": 4}}, "resources.gpus: asks for 4, the limit is 1"),
    ],
)
def test_a_job_beyond_the_policy_creates_nothing(
    workspace: Workspace, swarm: DockerSwarm, fields: dict[str, Any], message: str
) -> None:
    ws = workspace
    named = {k: v for k, v in fields.items() if k != "image"}
    job = make_job(ws, 1, fields.get("image", ws.config.image), **named)
    with ServiceWatch(swarm, ws.job) as watch:
        proc = ws.ffswarm("submit", str(job))
    assert proc.returncode == 65, proc.stderr[-2000:]
    assert f"{job}: {message}" in proc.stderr
    assert watch.max_alive == 0 and watch.step_specs == {}  # no service was created
    assert not (ws.root / "runs" / ws.job).exists() and not (ws.dir / "out").exists()
    assert not Path("/tmp/pwned").exists()


@pytest.fixture
def hook_dir(workspace: Workspace) -> Iterator[Path]:
    """Outside the checkout, as an operator's hook program would be (/usr/local/bin): a checkout in a
    0700 folder (mktemp -d) would keep the hook's uid from reaching its own program."""
    d = Path(tempfile.mkdtemp(prefix="ffswarm-hook-"))
    d.chmod(0o777)  # the hook's uid (nobody) writes here
    yield d
    shutil.rmtree(d, ignore_errors=True)


def test_a_policy_hook_runs_as_its_uid_with_a_clean_environment(
    workspace: Workspace, hook_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ws = workspace
    prog = hook_dir / "notify.py"
    prog.write_text(
        "#!/usr/bin/python3\nimport json, os, sys\n"
        f"json.dump({{'argv': sys.argv[1:], 'env': dict(os.environ), 'ids': [os.getuid(), os.getgid()], "
        f"'stdin': json.load(sys.stdin)}}, "
        f"open({str(hook_dir / 'seen.json')!r}, 'w'))\n"
    )
    prog.chmod(0o755)
    config = ws.config_with(
        hooks={"notify": {"command": [str(prog), "--done"], "user": "65534:65534", "timeout": "30s"}}
    )
    job = make_job(ws, 1, ws.config.image, on_complete={"hook": "notify"})
    monkeypatch.setenv("FFSWARM_SECRET_FOR_TEST", "must-not-leak")  # the controller's environment
    proc = ws.ffswarm("submit", str(job), config=config)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert report_of(ws)["hooks"] == {"hook": "ok"}
    seen = json.loads((hook_dir / "seen.json").read_text())
    seen["env"].pop("LC_CTYPE", None)  # set by the hook's own Python at startup (PEP 538)
    assert seen["argv"] == ["--done"]
    assert set(seen["env"]) == {"FFSWARM_JOB", "FFSWARM_REPORT", "PATH"}
    assert seen["env"]["FFSWARM_JOB"] == ws.job
    assert seen["env"]["FFSWARM_REPORT"] == str(ws.root / "runs" / ws.job / "report.json")
    assert seen["stdin"]["job"] == ws.job and seen["stdin"]["counts"]["ok"] == 1  # the report, on stdin
    if os.geteuid() == 0:
        assert seen["ids"] == [65534, 65534]


def test_a_redirected_webhook_is_not_followed(workspace: Workspace) -> None:
    ws = workspace
    hits: dict[str, int] = {"target": 0, "redirector": 0}

    def handler(name: str, location: str | None) -> type[http.server.BaseHTTPRequestHandler]:
        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                hits[name] += 1
                self.rfile.read(int(self.headers["Content-Length"]))
                self.send_response(302 if location else 204)
                if location:
                    self.send_header("Location", location)
                self.send_header("Content-Length", "0")
                self.end_headers()

            do_GET = do_POST  # noqa: N815

            def log_message(self, *args: Any) -> None:
                pass

        return Handler

    target = http.server.HTTPServer(("127.0.0.1", 0), handler("target", None))
    redirector = http.server.HTTPServer(
        ("127.0.0.1", 0), handler("redirector", f"http://127.0.0.1:{target.server_address[1]}/")
    )
    for s in (target, redirector):
        threading.Thread(target=s.serve_forever, daemon=True).start()
    config = ws.config_with(webhooks={"allow_hosts": ["127.0.0.1"], "allow_private": True})
    try:
        url = f"http://127.0.0.1:{redirector.server_address[1]}/done"
        hook = {"webhook": url, "webhook_events": ["job.finished"]}  # one delivery, refused at its redirect
        job = make_job(ws, 1, ws.config.image, on_complete=hook)
        proc = ws.ffswarm("submit", str(job), config=config)
    finally:
        for s in (target, redirector):
            s.shutdown()
            s.server_close()
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert report_of(ws)["hooks"] == {"webhook": "not delivered"}
    assert hits == {"target": 0, "redirector": 1}


def test_runner_services_carry_memory_pids_and_cpu_limits(workspace: Workspace, swarm: DockerSwarm) -> None:
    """Read back with `docker service inspect`: memory reserved as well as limited, pids and CPU limits."""
    ws = workspace
    image = swarm.resolve_image(ws.config.image)
    spec = shell_service(ws, image, "c0000", "cat /proc/self/cgroup > /dev/null; exit 0")
    swarm.create_service(spec)
    inspect = subprocess.run(
        ["docker", "service", "inspect", spec.name], capture_output=True, text=True, timeout=60, env=DOCKER_ENV
    )
    assert inspect.returncode == 0, inspect.stderr
    task = json.loads(inspect.stdout)[0]["Spec"]["TaskTemplate"]
    assert task["Resources"]["Limits"] == {"MemoryBytes": 256 << 20, "NanoCPUs": RUNNER_NANO_CPUS, "Pids": PIDS_LIMIT}
    assert task["Resources"]["Reservations"]["MemoryBytes"] == 256 << 20
    assert [n["Target"] for n in task["Networks"]] == [network_id(RUNNER_NETWORK)]


def network_id(name: str) -> str:
    out = subprocess.run(
        ["docker", "network", "inspect", name], capture_output=True, text=True, timeout=60, env=DOCKER_ENV
    )
    assert out.returncode == 0, out.stderr
    net = json.loads(out.stdout)[0]
    assert net["Internal"] is True and net["Driver"] == "overlay"
    return str(net["Id"])


def test_runners_have_no_network_out(workspace: Workspace, swarm: DockerSwarm) -> None:
    """A runner connects to a TCP server listening on every address of the host: from the engine's
    bridge it gets through (the control: this test can fail), from the runners' network it cannot."""
    ws = workspace
    image = swarm.resolve_image(ws.config.image)
    server = socket.create_server(("0.0.0.0", 0))
    port = server.getsockname()[1]
    bridge = subprocess.run(
        ["docker", "network", "inspect", "bridge", "--format", "{{(index .IPAM.Config 0).Gateway}}"],
        capture_output=True,
        text=True,
        timeout=60,
        env=DOCKER_ENV,
    )
    gateway = bridge.stdout.strip()
    assert bridge.returncode == 0 and gateway, bridge.stderr
    probe = (
        '/opt/ffswarm/bin/python -c "import socket,sys; s=socket.socket(); s.settimeout(3); '
        f"sys.exit(0 if s.connect_ex(('{gateway}', {port})) == 0 else 3)\""
    )
    runner = shell_service(ws, image, "c0000", probe)
    control = dataclasses.replace(shell_service(ws, image, "c0001", probe), networks=())
    try:
        for spec in (runner, control):
            swarm.create_service(spec)
        ended = wait_ended(swarm, ws, {runner.name, control.name})
    finally:
        server.close()
    assert (ended[control.name].state, ended[control.name].exit_code) == ("complete", 0)
    assert (ended[runner.name].state, ended[runner.name].exit_code) == ("failed", 3)


def test_gpu_runners_on_the_network_are_never_rejected(workspace: Workspace, swarm: DockerSwarm) -> None:
    """Runners arriving on and leaving a node used to change its network attachments, and each such
    node update made Swarm reject the node's GPU tasks ("assigned node no longer meets constraints").
    With the anchor, one GPU runner after another (and two at once) all run to completion."""
    ws = workspace
    image = swarm.resolve_image(ws.config.image)
    names: set[str] = set()
    for wave in (("c0000",), ("c0001", "c0002"), ("c0003",)):
        specs = [shell_service(ws, image, c, "sleep 2; exit 0") for c in wave]
        for spec in specs:
            swarm.create_service(spec)
        names |= {s.name for s in specs}
        ended = wait_ended(swarm, ws, {s.name for s in specs})
        assert {n: (t.state, t.message) for n, t in ended.items()} == {s.name: ("complete", "finished") for s in specs}
    history = [t for svc in swarm.services(ws.job) if svc.name in names for t in svc.tasks]
    assert [t for t in history if t.state == "rejected"] == []
    assert len(history) == 4


def wait_ended(swarm: DockerSwarm, ws: Workspace, names: set[str], timeout: float = 90) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        latest = {s.name: s.latest_task() for s in swarm.services(ws.job) if s.name in names}
        if len(latest) == len(names) and all(t is not None and t.state in ENDED for t in latest.values()):
            return latest
        time.sleep(0.3)
    raise AssertionError(f"{sorted(names)}: not ended within {timeout:.0f} s")
