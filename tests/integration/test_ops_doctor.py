"""`ffswarm doctor` on the real dev swarm: passes, and names the failing check and its fix."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from controller.config import Config
from controller.doctor import SBOM_LABEL, check_runner_network
from controller.swarm.admin import SwarmAdmin
from controller.swarm.docker import DockerSwarm
from controller.swarm.network import ANCHOR_COMMAND, ANCHOR_READY
from controller.swarm.servicespec import ANCHOR_SERVICE, RUNNER_NETWORK, VolumeSpec
from tests.integration.conftest import Workspace

pytestmark = pytest.mark.integration


def config_like(ws: Workspace, tmp_path: Path, **override: str) -> Path:
    lines = [f"data_root: {override.get('data_root', ws.root)}", "volume:", "  type: bind",
             f"image: {override.get('image', ws.config.image)}", "schedule_timeout: 5m"]  # fmt: skip
    if "runner_user" in override:
        lines.append(f'runner_user: "{override["runner_user"]}"')
    path = tmp_path / "ffswarm.yaml"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_doctor_passes_on_the_dev_swarm(workspace: Workspace) -> None:
    proc = workspace.ffswarm("doctor", timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    checks = (
        "swarm",
        "gpu-nodes",
        "image",
        "image-on-nodes",
        "data-volume",
        "model-pack",
        "runner-network",
        "heartbeat",
    )
    for name in checks:
        assert f"[ok] {name}:" in proc.stdout
    assert "all checks passed" in proc.stdout
    info = SwarmAdmin().image_info(workspace.config.image)
    assert info is not None
    sbom = info.labels[SBOM_LABEL]  # the image's ID, size and SBOM digest (scripts/build-runner-image.sh)
    assert f"{info.image_id[:19]}, {info.size_bytes / 1e6:.0f} MB, SBOM sha256 {sbom[:16]}…" in proc.stdout


@pytest.fixture
def unlabelled(swarm: DockerSwarm) -> Iterator[str]:
    admin = SwarmAdmin()
    node = admin.swarm_info().node_id
    before = dict(next(n for n in admin.node_infos() if n.node_id == node).labels)
    admin.update_node_labels(node, {}, remove=("ffswarm.gpu",))
    try:
        yield node
    finally:
        admin.update_node_labels(node, {"ffswarm.gpu": before.get("ffswarm.gpu", "true")})


def test_doctor_names_a_missing_node_label(workspace: Workspace, unlabelled: str) -> None:
    proc = workspace.ffswarm("doctor", timeout=120)
    assert proc.returncode == 69, proc.stdout + proc.stderr
    assert "[FAIL] gpu-nodes: no node carries the label ffswarm.gpu=true" in proc.stdout
    assert "fix: ffswarm nodes label NODE ffswarm.gpu=true" in proc.stdout
    assert "gpu-nodes" in proc.stderr


def test_doctor_names_an_absent_image(workspace: Workspace, tmp_path: Path) -> None:
    image = f"ffswarm/runner:absent-{uuid.uuid4().hex[:8]}"
    proc = workspace.ffswarm("doctor", config=config_like(workspace, tmp_path, image=image), timeout=120)
    assert proc.returncode == 69, proc.stdout + proc.stderr
    assert f"[FAIL] image: runner image {image} is not present on this manager" in proc.stdout
    assert f"fix: build it (scripts/build-runner-image.sh {image})" in proc.stdout


@pytest.fixture
def root_owned_data_root(workspace: Workspace, swarm: DockerSwarm) -> Iterator[Path]:
    root = workspace.dir / "root-owned"
    root.mkdir()
    os.chown(root, 0, 0)
    root.chmod(0o755)
    yield root
    for v in swarm.client.volumes.list(filters={"name": VolumeSpec.bind(str(root)).name}):
        v.remove(force=True)


def test_doctor_names_a_data_root_runners_cannot_write(
    workspace: Workspace, tmp_path: Path, root_owned_data_root: Path
) -> None:
    assert os.geteuid() == 0, "needs root to make a root-owned data root (scripts/test.sh runs as root)"
    config = config_like(workspace, tmp_path, data_root=str(root_owned_data_root), runner_user="10001:10001")
    proc = workspace.ffswarm("doctor", config=config, timeout=300)
    assert proc.returncode == 69, proc.stdout + proc.stderr
    assert "[FAIL] data-volume:" in proc.stdout and "Permission denied" in proc.stdout
    assert (
        f"fix: make {root_owned_data_root} (and the NFS export) writable by the runner uid:gid (10001:10001)"
        in proc.stdout
    )


def test_doctor_names_a_node_without_the_runners_anchor(workspace: Workspace, swarm: DockerSwarm) -> None:
    """Without its anchor a node would reject its GPU tasks when runners come and go: doctor says so.
    (The anchor is put back by the next job's first runner, as a real job would.)"""
    swarm.client.api.remove_service(ANCHOR_SERVICE)
    try:
        admin = SwarmAdmin()
        assert admin.missing_anchors(RUNNER_NETWORK) == sorted(n.hostname for n in admin.node_infos())
        check = check_runner_network(admin)
        assert not check.ok and check.detail.startswith("no running anchor on ")
    finally:
        swarm._networks.clear()
        swarm.ensure_network(RUNNER_NETWORK, swarm.resolve_image(workspace.config.image), "65534:65534")
    assert SwarmAdmin().missing_anchors(RUNNER_NETWORK) == []


def test_the_runners_anchor_ends_on_sigterm_without_waiting_for_a_kill(swarm: DockerSwarm, config: Config) -> None:
    """An engine stop or node drain sends the anchor SIGTERM: it exits 0 at once instead of being
    SIGKILLed at the end of the grace period (exit 137), which held every engine stop for 10 s."""
    container = swarm.client.containers.run(  # a service's command replaces the entrypoint too
        swarm.resolve_image(config.image), entrypoint=list(ANCHOR_COMMAND), detach=True, network_mode="none"
    )
    try:
        # The engine says "running" as soon as the process exists; the handler is in place when it says so.
        for line in container.logs(stream=True, follow=True):
            if line.decode().strip() == ANCHOR_READY:
                break
        container.reload()
        assert container.status == "running"
        container.stop(timeout=30)  # SIGTERM, then SIGKILL only after 30 s
        container.reload()
        assert container.attrs["State"]["ExitCode"] == 0, container.attrs["State"]
    finally:
        container.remove(force=True)
