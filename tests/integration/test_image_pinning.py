"""A job runs on the image its run folder recorded (image.json), even after the config's tag moved:
`ffswarm render JOB_FILE` and `ffswarm serve` continue a job on its first image, never on the tag's
new one (issue 14: they once resolved the tag again)."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from controller.config import Config
from controller.swarm.docker import DockerSwarm
from tests.integration.conftest import Serve, ServiceWatch, Workspace, free_port
from tests.integration.test_ops_serve import drop, job_text, wait_for

pytestmark = pytest.mark.integration


@pytest.fixture
def moved_tag(swarm: DockerSwarm, config: Config, tmp_path: Path) -> Iterator[tuple[str, str]]:
    """(the tag's image ID before, the ID it points at now): the config's tag moved to a tiny image
    built FROM the runner image with one extra label. The tag is put back in teardown (the rest of
    the suite runs that tag) and the tiny image removed."""
    images = swarm.client.images
    original = str(images.get(config.image).id)
    (tmp_path / "Dockerfile").write_text(f"FROM {original}\nLABEL io.ffswarm.test=moved-{uuid.uuid4().hex[:8]}\n")
    moved, _ = images.build(path=str(tmp_path), rm=True, labels={"io.ffswarm.test": "image-pinning"})
    repo, _, tag = config.image.rpartition(":")
    try:
        assert moved.tag(repo, tag)
        yield original, str(moved.id)
    finally:
        images.get(original).tag(repo, tag)
        assert str(images.get(config.image).id) == original
        images.remove(str(moved.id), force=True)


def recorded_image(ws: Workspace) -> str:
    return str(json.loads((ws.root / "runs" / ws.job / "image.json").read_text())["image"])


def stack_images(path: Path) -> set[str]:
    return {s["image"] for s in yaml.safe_load(path.read_text())["services"].values()}


def test_render_and_serve_keep_the_image_recorded_in_image_json_after_the_tag_moved(
    workspace: Workspace, swarm: DockerSwarm, config: Config, request: pytest.FixtureRequest
) -> None:
    ws = workspace
    job_file = ws.write_job(job_text(ws, 3))  # 3 faces + 1 without a face: 2 chunks of 2
    first = ws.ffswarm("render", str(job_file), "-o", str(ws.dir / "first.yml"))  # creates the run folder
    assert first.returncode == 0, first.stderr[-2000:]
    pinned = recorded_image(ws)
    assert pinned == str(swarm.client.images.get(config.image).id)  # a local build: pinned by its ID
    assert stack_images(ws.dir / "first.yml") == {pinned}

    original, moved = request.getfixturevalue("moved_tag")
    assert original == pinned and moved != pinned
    assert str(swarm.client.images.get(config.image).id) == moved  # the tag now names another image

    again = ws.ffswarm("render", str(job_file), "-o", str(ws.dir / "again.yml"))
    assert again.returncode == 0, again.stderr[-2000:]
    assert stack_images(ws.dir / "again.yml") == {pinned}
    by_id = ws.ffswarm("render", ws.job, "-o", str(ws.dir / "by-id.yml"))
    assert by_id.returncode == 0 and stack_images(ws.dir / "by-id.yml") == {pinned}

    serve = Serve(ws.dir / "inbox", free_port())
    try:
        with ServiceWatch(swarm, ws.job) as watch:
            serve.start()
            drop(serve.inbox, job_file.name, job_file.read_text())
            wait_for(serve.inbox / "done" / job_file.name, 300, serve)
            time.sleep(0.2)
    finally:
        serve.kill()
    images = {s["TaskTemplate"]["ContainerSpec"]["Image"] for s in [*watch.specs.values(), *watch.step_specs.values()]}
    assert watch.specs and images == {pinned}, images
    report = json.loads((ws.root / "runs" / ws.job / "report.json").read_text())
    assert report["image"] == pinned and report["counts"]["failed"] == 0
    assert recorded_image(ws) == pinned
