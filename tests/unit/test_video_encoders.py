"""video.codec against what the runner image's ffmpeg has (its io.ffswarm.encoders label, written by
scripts/build-runner-image.sh): a job with videos is refused before anything is made when the image
lacks the encoder; NVENC needs the job to reserve a GPU and allow cuda."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from controller.errors import JobFileError
from controller.job.spec import JobSpec, VideoSettings
from controller.run.usecase import check_encoder
from controller.settings.fields import FieldError


def job(codec: str) -> Any:
    spec = JobSpec(
        name="v", source=("a.jpg",), targets=("c/*.mp4",), output="o/{stem}{ext}", video=VideoSettings(codec)
    )
    return SimpleNamespace(spec=spec, file=Path("jobs/v.yaml"))


def test_an_encoder_the_image_lacks_is_refused_naming_video_codec_and_what_it_has() -> None:
    with pytest.raises(JobFileError) as e:
        check_encoder(job("libx265"), "sha256:abc", frozenset({"libx264", "libvpx-vp9"}))
    assert e.value.field == "video.codec" and e.value.exit_code == 65
    assert "the runner image sha256:abc has no libx265 encoder (it has: libvpx-vp9, libx264)" in e.value.reason


def test_an_encoder_the_image_has_or_an_image_that_does_not_say_is_accepted() -> None:
    check_encoder(job("libx265"), "sha256:abc", frozenset({"libx264", "libx265"}))
    check_encoder(job("libx265"), "sha256:abc", None)  # no label: an image built elsewhere


def test_nvenc_needs_a_reserved_gpu_and_cuda() -> None:
    base = {"name": "v", "source": ("a.jpg",), "targets": ("c/*.mp4",), "output": "o/{stem}{ext}"}
    JobSpec(**base, video=VideoSettings("h264_nvenc"), providers=("cuda", "cpu"))  # type: ignore[arg-type]
    with pytest.raises(FieldError) as e:
        JobSpec(**base, video=VideoSettings("hevc_nvenc"), providers=("cpu",))  # type: ignore[arg-type]
    assert e.value.field == "video.codec" and "encodes on the GPU" in e.value.reason
