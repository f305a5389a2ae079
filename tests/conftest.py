"""Fixtures shared by test modules (the builders they use are in tests/builders.py; the dev swarm's
fixtures in tests/integration/conftest.py).

- ``assets`` and ``data``: the runner tests' data root, the stand-in pack and real photos built once
  per module, copied into each test's own data root with the run folder of ``RUNNER_JOB``;
- ``moto_endpoint``: moto's S3 server on loopback, one per module (tests/fixtures/moto_server.py), only
  where RGW cannot serve a test (docs/storage.md);
- ``rgw``: Ceph RGW, a real S3 server, started once by scripts/s3-server.sh (tests/fixtures/rgw_server.py);
  ``s3``: RGW with the controller tests' buckets and objects, filled afresh per module.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.builders import RUNNER_JOB
from tests.fixtures import photos
from tests.fixtures.moto_server import moto_server
from tests.fixtures.rgw_server import Rgw, Seeded, rgw_server, seeded
from tests.fixtures.standin_pack import build_pack


@pytest.fixture(scope="module")
def assets(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Pack and photos built once per module; each test copies them into its own data root."""
    base = tmp_path_factory.mktemp("assets")
    build_pack(base / "models" / "default")
    inputs = base / "in"
    photos.astronaut(inputs)
    photos.group(inputs)
    photos.no_face_photo(inputs)
    photos.not_an_image(inputs)
    photos.face_photos(inputs, 4)
    shutil.copyfile(inputs / "face_01.jpg", inputs / "source.jpg")
    return base


@pytest.fixture
def data(tmp_path: Path, assets: Path) -> Path:
    root = tmp_path / "data"
    shutil.copytree(assets, root)
    (root / "runs" / RUNNER_JOB / "chunks").mkdir(parents=True)
    return root


@pytest.fixture(scope="module")
def moto_endpoint() -> Iterator[str]:
    yield from moto_server()


@pytest.fixture(scope="session")
def rgw() -> Rgw:
    return rgw_server()


@pytest.fixture(scope="module")
def s3(rgw: Rgw, tmp_path_factory: pytest.TempPathFactory) -> Seeded:
    return seeded(rgw, tmp_path_factory.mktemp("secrets"))
