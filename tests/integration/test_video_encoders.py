"""Video encoders on the real single-node swarm (issue 20): a video job with `video.codec: libx265`
comes out as HEVC and one with `libvpx-vp9` into a .webm as VP9, every frame kept; the runner image
says which encoders its ffmpeg has (the io.ffswarm.encoders label submit checks)."""

from __future__ import annotations

import pytest

from controller.swarm.docker import DockerSwarm
from tests.fixtures import photos
from tests.integration.conftest import Workspace, chown_tree
from tests.integration.test_video import frames, panned_clip, streams

pytestmark = pytest.mark.integration


def test_the_runner_image_lists_its_video_encoders(swarm: DockerSwarm, workspace: Workspace) -> None:
    encoders = swarm.image_encoders(workspace.config.image)
    assert encoders is not None and {"libx264", "libx265", "libvpx-vp9"} <= encoders


def test_a_runner_image_this_manager_does_not_hold_is_not_checked(swarm: DockerSwarm) -> None:
    """A manager need not hold the runner image (its GPU nodes pull it): a video job is not refused
    for it, the encoder check is skipped."""
    assert swarm.image_encoders("ffswarm/runner@sha256:" + "0" * 64) is None


@pytest.mark.parametrize(("codec", "ext", "name"), [("libx265", ".mp4", "hevc"), ("libvpx-vp9", ".webm", "vp9")])
def test_a_video_is_encoded_with_the_jobs_codec(workspace: Workspace, codec: str, ext: str, name: str) -> None:
    ws = workspace
    star = photos.astronaut(ws.dir / "faces")
    (ws.dir / "in").mkdir()
    clip = panned_clip(star, ws.dir / "in" / "pan.mp4", "25", 2)
    chown_tree(ws.dir, ws.config.runner_uid_gid())
    out = ws.dir / "out"
    job_file = ws.write_job(f"""
name: {ws.job}
source: {ws.rel(star)}
targets: [{ws.rel(clip)}]
output: {ws.rel(out)}/{{stem}}{ext}
video: {{codec: {codec}, crf: 30, preset: veryfast}}
segment_seconds: 1
providers: [cpu]
resources: {{gpus: 1, gpu_kind: GPU, memory: 2g}}
retries: 0
timeout: 10m
""")
    proc = ws.ffswarm("submit", str(job_file))
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = out / f"pan{ext}"
    video = next(s for s in streams(result) if s["codec_type"] == "video")
    assert video["codec_name"] == name
    assert len(frames(result)) == len(frames(clip)) == 50
