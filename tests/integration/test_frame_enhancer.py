"""The frame enhancer on the real single-node swarm (issue 20): a job listing ``frame_enhancer`` after
the face steps writes every output larger by the model's scale — photos with faces, a photo without
one that is kept, and every frame of a video cut into segments and joined.

The pack is the stand-in pack plus a stand-in Real-ESRGAN (tests/fixtures/standin_frame.py: the
model's I/O contract, a sharpening upscale inside), made for this test under models/<job>/.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator

import cv2
import numpy as np
import pytest

from tests.fixtures import photos, standin_pack
from tests.integration.conftest import Workspace, chown_tree
from tests.integration.test_video import frames, panned_clip, streams

pytestmark = pytest.mark.integration


@pytest.fixture
def pack(workspace: Workspace) -> Iterator[str]:
    folder = workspace.root / "models" / workspace.job
    standin_pack.build_pack(folder, workspace.job, enhancer=False)  # with the stand-in Real-ESRGAN x2
    chown_tree(folder, workspace.config.runner_uid_gid())
    yield workspace.job
    shutil.rmtree(folder, ignore_errors=True)


def test_frame_enhancer_outputs_are_twice_the_size_photos_and_video(workspace: Workspace, pack: str) -> None:
    ws = workspace
    star = photos.astronaut(ws.dir / "faces")
    made = photos.face_photos(ws.dir / "in", 2)
    blank = photos.no_face_photo(ws.dir / "in")
    clip = panned_clip(star, ws.dir / "in" / "pan.mp4", "25", 2)
    chown_tree(ws.dir, ws.config.runner_uid_gid())
    out = ws.dir / "out"
    job_file = ws.write_job(f"""
name: {ws.job}
source: {ws.rel(star)}
targets: [{ws.rel(ws.dir / "in")}/*]
output: {ws.rel(out)}/{{stem}}{{ext}}
models: {pack}
processors: [face_swapper, frame_enhancer]
frame_enhancer: {{blend: 1.0}}
no_face: copy
segment_seconds: 1
providers: [cpu]
resources: {{gpus: 1, gpu_kind: GPU, memory: 2g}}
retries: 0
timeout: 10m
""")
    proc = ws.ffswarm("submit", str(job_file))
    assert proc.returncode == 0, proc.stderr[-3000:]

    for f in [*made, blank]:
        before, after = cv2.imread(str(f)), cv2.imread(str(out / f.name))
        assert after is not None and after.shape == (before.shape[0] * 2, before.shape[1] * 2, 3), f.name
        plain = cv2.resize(before, after.shape[1::-1], interpolation=cv2.INTER_LINEAR)
        # the photo, larger: most pixels (all but the swapped face) as a plain resize has them
        assert np.median(np.abs(after.astype(np.int16) - plain.astype(np.int16))) <= 3, f.name
    swapped = cv2.resize(cv2.imread(str(made[0])), (0, 0), fx=2, fy=2)
    assert np.abs(cv2.imread(str(out / made[0].name)).astype(np.int16) - swapped.astype(np.int16)).max() > 20

    video = next(s for s in streams(out / "pan.mp4") if s["codec_type"] == "video")
    source = next(s for s in streams(clip) if s["codec_type"] == "video")
    assert (video["width"], video["height"]) == (source["width"] * 2, source["height"] * 2)
    assert len(frames(out / "pan.mp4")) == len(frames(clip)) == 50
    assert any(s["codec_type"] == "audio" for s in streams(out / "pan.mp4"))
    report = json.loads((ws.root / "runs" / ws.job / "report.json").read_text())
    assert report["counts"]["ok"] == 3 and report["counts"]["no_face"] == 1, report["counts"]


def test_the_x4_frame_enhancer_makes_photos_four_times_larger(workspace: Workspace) -> None:
    """frame_enhancer.model real_esrgan_x4: the pack's x4 stand-in, tiled like x2; every photo output,
    a kept one without a face too, is four times larger and otherwise the photo."""
    ws = workspace
    folder = ws.root / "models" / f"{ws.job}-x4"
    standin_pack.build_pack(folder, folder.name, enhancer=False, frame_scale=4)
    chown_tree(folder, ws.config.runner_uid_gid())
    try:
        star = photos.astronaut(ws.dir / "faces")
        made = photos.face_photos(ws.dir / "in", 1)
        blank = photos.no_face_photo(ws.dir / "in")
        chown_tree(ws.dir, ws.config.runner_uid_gid())
        out = ws.dir / "out4"
        job_file = ws.write_job(f"""
name: {ws.job}
source: {ws.rel(star)}
targets: [{ws.rel(ws.dir / "in")}/*]
output: {ws.rel(out)}/{{stem}}{{ext}}
models: {folder.name}
processors: [face_swapper, frame_enhancer]
frame_enhancer: {{model: real_esrgan_x4}}
no_face: copy
providers: [cpu]
resources: {{gpus: 1, gpu_kind: GPU, memory: 2g}}
retries: 0
timeout: 10m
""")
        proc = ws.ffswarm("submit", str(job_file))
        assert proc.returncode == 0, proc.stderr[-3000:]
        for f in [*made, blank]:
            before, after = cv2.imread(str(f)), cv2.imread(str(out / f.name))
            assert after is not None and after.shape == (before.shape[0] * 4, before.shape[1] * 4, 3), f.name
            plain = cv2.resize(before, after.shape[1::-1], interpolation=cv2.INTER_LINEAR)
            assert np.median(np.abs(after.astype(np.int16) - plain.astype(np.int16))) <= 3, f.name
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def test_frame_enhancer_before_a_face_step_is_refused_naming_processors(workspace: Workspace, pack: str) -> None:
    ws = workspace
    star = photos.astronaut(ws.dir / "faces")
    chown_tree(ws.dir, ws.config.runner_uid_gid())
    job_file = ws.write_job(
        f"name: {ws.job}\nsource: {ws.rel(star)}\ntargets: [{ws.rel(star)}]\noutput: {ws.rel(ws.dir)}/o/{{stem}}.png\n"
        f"models: {pack}\nprocessors: [frame_enhancer, face_swapper]\nresources: {{gpus: 0}}\n"
    )
    proc = ws.ffswarm("submit", str(job_file))
    assert proc.returncode == 65, proc.stderr[-2000:]
    assert "processors" in proc.stderr and "list it last" in proc.stderr
    assert not (ws.root / "runs" / ws.job).exists()
