"""The controller image (Dockerfile.controller: the controller stack's serve and api) carries no
runner: its lock holds no onnxruntime, OpenCV or numpy, it installs from that lock with hashes and
without the runner's code, the dev swarm builds it, and the config names it as controller_image."""

from __future__ import annotations

from pathlib import Path

import pytest

from controller.config import parse_config
from controller.errors import ConfigError
from tests.unit.test_locks import ROOT, pins


def runner_libraries(lock: str) -> list[str]:
    """What only the runner needs: any onnxruntime or OpenCV build, numpy, insightface and the rest."""
    only = {"numpy", "insightface", "onnx", "scipy", "scikit-image"}
    return sorted(p for p in pins(lock) if p.startswith(("onnxruntime", "opencv")) or p in only)


def test_the_controller_lock_holds_no_runner_library() -> None:
    assert runner_libraries("controller") == [], "locks/controller.txt pins runner libraries"
    assert {"onnxruntime", "numpy", "opencv-python-headless"} <= set(
        runner_libraries("runner-cpu")
    )  # it would see them
    pinned = set(pins("controller"))
    assert {"pillow", "starlette", "uvicorn", "docker", "pydantic", "httpx"} <= pinned  # what serve and api import
    assert not {"pip", "setuptools", "wheel"} & pinned


def test_the_controller_image_installs_its_lock_with_hashes_and_no_runner_code() -> None:
    dockerfile = (ROOT / "Dockerfile.controller").read_text()
    assert "--no-deps --require-hashes -r /locks/controller.txt" in dockerfile
    copied = [line.split()[1:-1] for line in dockerfile.splitlines() if line.startswith("COPY ")]
    sources = {src for srcs in copied for src in srcs}
    assert "runner_image/" not in sources and not any("models" in s or "runner-" in s for s in sources)
    assert "USER ${CONTROLLER_UID}:${CONTROLLER_UID}" in dockerfile  # never root by default
    assert 'ENTRYPOINT ["/opt/ffswarm/bin/ffswarm"]' in dockerfile  # the stack's entrypoint and healthcheck paths


def test_the_dev_swarm_builds_it_after_the_runner_image_and_names_it_in_the_config() -> None:
    images = (ROOT / "scripts" / "build-images.sh").read_text()  # what dev-swarm.sh and test.sh build
    runner = images.index("scripts/build-runner-image.sh ffswarm/runner:dev")
    assert images.index("scripts/build-controller-image.sh ffswarm/controller:dev") > runner
    assert "controller_image: ffswarm/controller:dev" in (ROOT / "scripts" / "dev-swarm.sh").read_text()


def test_controller_image_is_an_optional_config_key(tmp_path: Path) -> None:
    path = tmp_path / "ffswarm.yaml"
    base = {"data_root": str(tmp_path), "image": "ffswarm/runner:1.0"}
    assert parse_config(path, base).controller_image is None  # the stack then runs from `image`
    named = parse_config(path, {**base, "controller_image": "ffswarm/controller:1.0"})
    assert named.controller_image == "ffswarm/controller:1.0" and named.image == "ffswarm/runner:1.0"
    with pytest.raises(ConfigError, match=f"{path}: controller_image must be an image reference"):
        parse_config(path, {**base, "controller_image": ["not", "a", "name"]})
