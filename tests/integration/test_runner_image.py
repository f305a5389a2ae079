"""The runner image as scripts/build-runner-image.sh builds it: it carries exactly its lock, its SBOM
says so and is what the label's digest names, and nothing the runner does not need is left in it."""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
import uuid
from typing import Any

import pytest

from controller.config import Config
from controller.doctor import SBOM_LABEL
from controller.swarm.docker import DockerSwarm
from tests.integration.conftest import ROOT
from tests.unit.test_locks import pins

pytestmark = pytest.mark.integration
SBOM_PATH = "/opt/ffswarm/sbom.cdx.json"
MAX_CPU_IMAGE_MB = 900  # 776 MB when the locks came in (1,467 MB before); scipy & co. back would pass this
TEST_LABEL = {"io.ffswarm.test": "runner-image"}


@pytest.fixture(scope="module")
def image(config: Config, swarm: DockerSwarm) -> Any:
    return swarm.client.images.get(config.image)


@pytest.fixture(scope="module")
def sbom_bytes(image: Any, swarm: DockerSwarm) -> bytes:
    """The SBOM file as the image holds it (read from a created, never started container)."""
    container = swarm.client.containers.create(image.id, name=f"ffswarm-test-sbom-{uuid.uuid4().hex[:8]}",
                                               labels=TEST_LABEL)  # fmt: skip
    try:
        stream, _ = container.get_archive(SBOM_PATH)
        with tarfile.open(fileobj=io.BytesIO(b"".join(stream))) as tar:
            member = tar.extractfile(tar.getmembers()[0])
            assert member is not None
            return member.read()
    finally:
        container.remove(force=True)


def run_in(swarm: DockerSwarm, image: Any, code: str) -> str:
    out: bytes = swarm.client.containers.run(image.id, ["-c", code], entrypoint="/opt/ffswarm/bin/python",
                                             remove=True, network_mode="none", labels=TEST_LABEL)  # fmt: skip
    return out.decode()


def test_the_label_is_the_digest_of_the_sbom_inside(image: Any, sbom_bytes: bytes) -> None:
    assert image.labels.get(SBOM_LABEL) == hashlib.sha256(sbom_bytes).hexdigest()
    copy = ROOT / "build" / "sbom-runner.cdx.json"  # the build script's copy next to the build output
    assert copy.read_bytes() == sbom_bytes


def test_the_image_carries_exactly_its_lock(image: Any, sbom_bytes: bytes, swarm: DockerSwarm) -> None:
    lock_name = image.labels["io.ffswarm.lock"]  # locks/runner-cpu.txt on the dev swarm
    locked = pins(lock_name.removeprefix("locks/").removesuffix(".txt"))
    sbom = json.loads(sbom_bytes)
    assert sbom["bomFormat"] == "CycloneDX" and sbom["specVersion"] == "1.5"
    python = {c["name"]: c for c in sbom["components"] if c["purl"].startswith("pkg:pypi/")}
    assert {n: c["version"] for n, c in python.items() if n != "ffswarm"} == {n: v for n, (v, _) in locked.items()}
    for name, (_, hashes) in locked.items():  # the very file pip installed, one the lock allows
        assert python[name]["hashes"][0]["content"] in hashes, name
    debian = {c["name"] for c in sbom["components"] if c["purl"].startswith("pkg:deb/")}
    assert {"ffmpeg", "python3", "ca-certificates"} <= debian
    assert not {"libllvm15", "libgl1-mesa-dri", "python3-venv", "python3-pip-whl"} & debian
    # what pip itself sees in the image is the same set
    code = "import importlib.metadata as m; print('\\n'.join(d.metadata['Name'] for d in m.distributions()))"
    seen = run_in(swarm, image, code).split()
    assert sorted(n.lower().replace("_", "-") for n in seen) == sorted(python)


def test_no_installer_apt_lists_or_test_suites_are_left(image: Any, swarm: DockerSwarm) -> None:
    code = """
import importlib.util, json, os, sysconfig
site = sysconfig.get_paths()["purelib"]
print(json.dumps({
    "modules": [m for m in ("pip", "setuptools", "wheel", "scipy", "skimage", "networkx")
                if importlib.util.find_spec(m)],
    "apt_lists": [f for f in os.listdir("/var/lib/apt/lists") if f not in ("partial", "lock")],
    "tests": [p for p in ("numpy/_core/tests", "onnx/backend/test/data") if os.path.exists(os.path.join(site, p))],
}))
"""
    assert json.loads(run_in(swarm, image, code)) == {"modules": [], "apt_lists": [], "tests": []}


def test_the_cpu_image_stays_lean(image: Any) -> None:
    assert image.labels.get("io.ffswarm.lock") == "locks/runner-cpu.txt"  # the dev swarm's image
    assert image.attrs["Size"] / 1e6 <= MAX_CPU_IMAGE_MB
