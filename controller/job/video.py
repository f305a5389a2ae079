"""Video targets at plan time: probe, then cut into segments.

A video is probed with ffprobe when the job is planned (frames, exact fps, rotation, audio;
controller/job/probe.py, which also says how a hostile target is read), cut into segments of
``segment_seconds`` on frame boundaries, and each segment becomes a work item that any chunk
service may run (runner_image/video.py). When the chunks have finished, the controller checks and
joins the segments (controller/run/join.py). A video over the policy's pixels or frames is that
item's error, with the numbers; ffprobe runs as the runner's uid when the controller is root.
A video in object storage is fetched once into a private temporary file of the controller, probed
there like a file, and deleted (``fetched``); runners then read the object itself.

The controller host needs ffmpeg/ffprobe on its PATH (docs/operations.md; scripts/dev-swarm.sh
installs it).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from fractions import Fraction
from pathlib import Path
from typing import TYPE_CHECKING, Any

from contract import ffmpeg
from contract.manifest import Segment
from contract.s3 import S3Url, is_s3
from controller.job.access import Ids, parse_ids
from controller.job.plan import TargetRef
from controller.job.probe import (  # re-exported: planning's callers and tests name them here
    NOT_ALLOWED,
    PROBE_TIMEOUT,
    AudioStream,
    FrameTimes,
    ProbeError,
    VideoInfo,
    _reason,
    _run,
    frame_times,
    open_target,
    parse_probe,
    probe,
)
from controller.job.resolve import Target
from controller.job.spec import JobSpec, TargetKind
from controller.policy import Limits
from controller.settings.fields import FieldError
from controller.storage.errors import ObjectMissing
from controller.storage.transfer import ObjectTooLarge

if TYPE_CHECKING:
    from controller.storage.s3 import S3Object, S3Store

__all__ = [
    "NOT_ALLOWED",
    "PROBE_TIMEOUT",
    "AudioStream",
    "FrameTimes",
    "ProbeError",
    "VideoInfo",
    "_reason",
    "_run",
    "fetched",
    "frame_times",
    "open_target",
    "parse_probe",
    "probe",
]

PROBES_AT_ONCE = 8


def segment_ranges(frames: int, fps: Fraction, segment_seconds: float) -> list[tuple[int, int]]:
    """(start_frame, frame_count) of each segment: ``segment_seconds`` rounded to whole frames."""
    per = max(1, round(Fraction(repr(segment_seconds)) * fps))
    return [(start, min(per, frames - start)) for start in range(0, frames, per)]


def segments_for(info: VideoInfo, spec: JobSpec, times: FrameTimes | None = None) -> tuple[Segment, ...]:
    width, height = info.upright_size
    sar, fps = info.upright_sar, info.fps
    ranges = segment_ranges(info.frames, fps, spec.segment_seconds)
    return tuple(
        Segment(
            start_frame=start,
            frame_count=count,
            fps=f"{fps.numerator}/{fps.denominator}",
            width=width,
            height=height,
            timescale=info.timescale,
            sar=f"{sar.numerator}/{sar.denominator}",
            last=n == len(ranges) - 1,
            codec=spec.video.codec,
            crf=spec.video.crf,
            preset=spec.video.preset,
            seek=times.seek(start) if times else None,
            demuxer=info.demuxer,
        )
        for n, (start, count) in enumerate(ranges)
    )


def check_limits(info: VideoInfo, rel: str, spec: JobSpec, limits: Limits) -> None:
    """A video bigger than the policy allows refuses the job before a segment is made."""
    pixels, per = info.width * info.height, max(1, round(Fraction(repr(spec.segment_seconds)) * info.fps))
    for what, asked, limit in (
        ("pixels a frame", pixels, limits.video_pixels),
        ("frames", info.frames, limits.video_frames),
        ("segments", -(-info.frames // per), limits.segments),
    ):
        if asked > limit:
            f = "segment_seconds" if what == "segments" else "targets"
            raise FieldError(f, f"{rel} asks for {asked} {what}, the limit is {limit} (the cluster's policy.limits)")


def over_limits(info: VideoInfo, limits: Limits) -> str | None:
    """Why a video is too big for the policy (frame size, frame count), with the numbers; None if not."""
    if info.width * info.height > limits.video_pixels:
        return (
            f"video too large: {info.width}x{info.height} = {info.width * info.height} pixels a frame, "
            f"the limit is {limits.video_pixels} (the cluster's policy.limits.video_pixels)"
        )
    if info.frames > limits.video_frames:
        return (
            f"video too long: {info.frames} frames, the limit is {limits.video_frames} "
            "(the cluster's policy.limits.video_frames)"
        )
    return None


def target_ref(
    target: Target,
    spec: JobSpec,
    limits: Limits | None = None,
    run_as: Ids | None = None,
    store: S3Store | None = None,
) -> TargetRef:
    """An image as it is; a video probed and cut (a probe failure, or a video over the policy's
    pixels or frames, becomes the item's error). A video in the store is probed from a private copy
    (``readable``); its ETag and size are kept in the plan's facts, so that the join notices an object
    replaced since."""
    if target.kind is not TargetKind.VIDEO:
        return TargetRef(input=target.rel, output=target.output_rel, kind=target.kind.value)
    muxer = ffmpeg.MUXERS[target.output.suffix.lower()]
    allowed = ffmpeg.VIDEO_OK.get(muxer)
    facts: dict[str, Any] = {}
    try:
        if allowed is not None and spec.video.codec not in allowed:
            raise ProbeError(f"a {target.output.suffix} output cannot hold {spec.video.codec} video (video.codec)")
        with readable(target, store, limits or Limits(), run_as) as (path, obj):
            if obj is not None:
                facts = {"etag": obj.etag, "bytes": obj.size}
            info = probe(path, target.rel, run_as)
            too_big = None if limits is None else over_limits(info, limits)
            if too_big is not None:
                raise ProbeError(too_big)
            if limits is not None:
                check_limits(info, target.rel, spec, limits)  # segments per video: the job's setting
            times = frame_times(path, info, run_as) if info.frames > 1 else None
    except ProbeError as e:
        return TargetRef(input=target.rel, output=target.output_rel, kind="video", error=str(e))
    segments = segments_for(info, spec, times)
    return TargetRef(target.rel, target.output_rel, "video", segments, None, {**info.as_dict(), **facts})


@contextlib.contextmanager
def readable(
    target: Target, store: S3Store | None, limits: Limits, run_as: Ids | None
) -> Iterator[tuple[Path, S3Object | None]]:
    """The target as a file ffprobe may read: itself on the data root; an object fetched once
    (fetched). An object over ``policy.limits.video_bytes`` is the job file's error naming it, a
    vanished one the item's."""
    if not is_s3(target.rel):
        yield target.input, None
        return
    url = S3Url.parse(target.rel)
    if store is None:  # resolve_job refuses s3:// without a store: not reached from a job file
        raise ProbeError(f"{url} is in object storage, and storage.s3 is not configured")
    try:
        with fetched(store, url, limits.video_bytes, run_as) as got:
            yield got
    except ObjectTooLarge as e:
        size = f"{e.size} bytes" if e.size is not None else f"more than {e.cap} bytes"
        limit = f"the limit is {e.cap} (the cluster's policy.limits.video_bytes)"
        raise FieldError("targets", f"{url} is {size}, {limit}") from None
    except ObjectMissing:
        raise ProbeError(f"{url} does not exist (any more: it was deleted after it was listed)") from None


@contextlib.contextmanager
def fetched(
    store: S3Store, url: S3Url, cap: int, run_as: Ids | None = None, if_match: str | None = None
) -> Iterator[tuple[Path, S3Object]]:
    """The object streamed (at most ``cap`` bytes: S3Store.download) into a private temporary file of
    the controller — a 0700 folder of its own under the controller's TMPDIR, never the shared volume,
    the file 0600 and owned by ``run_as`` when ffprobe runs as the runner — removed when the block
    ends, whatever happened. ffprobe and ffmpeg read it by descriptor, never the URL."""
    folder = tempfile.mkdtemp(prefix="ffswarm-object-")
    try:
        fd, name = tempfile.mkstemp(dir=folder)
        with os.fdopen(fd, "wb") as f:
            if run_as is not None:
                os.fchown(f.fileno(), *run_as)  # ffprobe, as the runner, reopens it through /proc/self/fd
            obj = store.download(url, f, cap, if_match=if_match)
        yield Path(name), obj
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def target_refs(
    targets: Iterable[Target],
    spec: JobSpec,
    limits: Limits | None = None,
    run_as: Ids | None = None,
    store: S3Store | None = None,
) -> list[TargetRef]:
    """Every target's ref, in order; videos are probed several at a time (two ffprobe runs each,
    mostly waiting on the disk, NFS or the store), as ``run_as`` when given (probe_user).
    ``store``: where s3:// videos are fetched from (one temporary copy each, at most PROBES_AT_ONCE
    at a time)."""
    targets = list(targets)
    videos = [i for i, t in enumerate(targets) if t.kind is TargetKind.VIDEO]

    def ref(t: Target) -> TargetRef:
        return target_ref(t, spec, limits, run_as, store)

    if len(videos) < 2:
        return [ref(t) for t in targets]
    with ThreadPoolExecutor(max_workers=min(len(videos), PROBES_AT_ONCE)) as pool:
        probed = dict(zip(videos, pool.map(lambda i: ref(targets[i]), videos), strict=True))
    return [probed[i] if i in probed else ref(t) for i, t in enumerate(targets)]


def probe_user(runner_ids: str) -> Ids | None:
    """Who ffprobe runs as at plan time: the runner's uid:gid (``config.runner_uid_gid()``) when the
    controller is root — a decoder bug then gets no more than a runner has — else the controller."""
    return parse_ids(runner_ids) if os.geteuid() == 0 else None
