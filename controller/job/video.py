"""Video targets at plan time: probe, then cut into segments.

A video is probed with ffprobe when the job is planned (frames, exact fps, rotation, audio), cut
into segments of ``segment_seconds`` on frame boundaries, and each segment becomes a work item
that any chunk service may run (runner_image/video.py). When the chunks have finished, the
controller checks and joins the segments (controller/run/join.py).

The controller host needs ffmpeg/ffprobe on its PATH (docs/operations.md; scripts/dev-swarm.sh
installs it).
"""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any

from contract import ffmpeg
from contract.manifest import Segment
from controller.errors import CapacityError
from controller.job.plan import TargetRef
from controller.job.resolve import Target
from controller.job.spec import JobSpec, TargetKind
from controller.job.validate import FieldError
from controller.policy import Limits

PROBE_TIMEOUT = 300.0
PROBES_AT_ONCE = 8


class ProbeError(Exception):
    """The file is not a video we can process; the message is ffprobe's reason (or ours)."""


@dataclass(frozen=True)
class AudioStream:
    index: int
    codec: str
    duration: float | None


@dataclass(frozen=True)
class VideoInfo:
    """What ffprobe says about a target (first video stream; every audio stream)."""

    frames: int
    fps: Fraction  # exact; the average rate when the stream is variable
    variable_fps: bool
    duration: float
    time_base: Fraction
    width: int  # as stored (before rotation)
    height: int
    rotation: int  # 0, 90, 180 or 270
    sar: Fraction
    codec: str
    audio: tuple[AudioStream, ...]
    start_time: Fraction = Fraction(0)  # the file's (format) start time, which ffmpeg's -ss counts from

    @property
    def upright_size(self) -> tuple[int, int]:
        """Frame size after autorotation (what the runner decodes)."""
        return (self.height, self.width) if self.rotation in (90, 270) else (self.width, self.height)

    @property
    def upright_sar(self) -> Fraction:
        return 1 / self.sar if self.rotation in (90, 270) else self.sar

    @property
    def timescale(self) -> int:
        """The segments' time base 1/N: the input's when a frame lasts a whole number of its ticks
        (keeps timing exact and equal to the input's), else one that does."""
        tb = self.time_base
        if tb.numerator == 1 and (tb.denominator * self.fps.denominator) % self.fps.numerator == 0:
            return tb.denominator
        return self.fps.numerator * max(1, 10000 // self.fps.numerator)

    def as_dict(self) -> dict[str, Any]:
        return {
            "frames": self.frames,
            "fps": f"{self.fps.numerator}/{self.fps.denominator}",
            "variable_fps": self.variable_fps,
            "duration": self.duration,
            "size": [self.width, self.height],
            "rotation": self.rotation,
            "codec": self.codec,
            "audio": [{"index": a.index, "codec": a.codec, "duration": a.duration} for a in self.audio],
        }


def _rational(text: object) -> Fraction | None:
    m = re.fullmatch(r"(\d+)[/:](\d+)", str(text or ""))
    if not m or int(m.group(1)) == 0 or int(m.group(2)) == 0:
        return None
    return Fraction(int(m.group(1)), int(m.group(2)))


def _float(value: object) -> float | None:
    try:
        return float(str(value))
    except ValueError:
        return None


def _decimal(value: object) -> Fraction:
    """ffprobe's seconds ("0.000000", "-0.021333") exactly; 0 when absent or unreadable."""
    try:
        return Fraction(str(value)) if value is not None else Fraction(0)
    except ValueError:
        return Fraction(0)


def _rotation(stream: dict[str, Any]) -> int:
    raw: object = stream.get("tags", {}).get("rotate")
    for side in stream.get("side_data_list", []):
        if "rotation" in side:
            raw = side["rotation"]
    value = _float(raw) if raw is not None else None
    return 0 if value is None else (round(value / 90) * 90) % 360


def parse_probe(text: str) -> VideoInfo:
    """ffprobe's JSON (probe_cmd) → VideoInfo; ProbeError when there is no usable video stream."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise ProbeError(f"ffprobe gave no JSON: {e}") from e
    streams = data.get("streams", [])
    videos = [s for s in streams if s.get("codec_type") == "video" and not s.get("disposition", {}).get("attached_pic")]
    if not videos:
        kinds = sorted({str(s.get("codec_type")) for s in streams}) or ["none"]
        raise ProbeError(f"no video stream (streams: {', '.join(kinds)})")
    v = videos[0]
    r_rate, avg_rate = _rational(v.get("r_frame_rate")), _rational(v.get("avg_frame_rate"))
    fps = avg_rate or r_rate
    if fps is None:
        raise ProbeError("no frame rate")
    variable = r_rate is not None and avg_rate is not None and abs(r_rate - avg_rate) > r_rate / 200
    if not variable and r_rate is not None:
        fps = r_rate  # exact (30000/1001), where avg may carry rounding
    duration = _float(v.get("duration")) or _float(data.get("format", {}).get("duration")) or 0.0
    frames = int(v.get("nb_read_packets") or v.get("nb_frames") or 0) or round(duration * fps)
    if frames <= 0:
        raise ProbeError("the video stream has no frames")
    width, height = int(v.get("width") or 0), int(v.get("height") or 0)
    if width <= 0 or height <= 0:
        raise ProbeError("the video stream has no frame size")
    audio = tuple(
        AudioStream(int(s.get("index", 0)), str(s.get("codec_name", "unknown")), _float(s.get("duration")))
        for s in streams
        if s.get("codec_type") == "audio"
    )
    return VideoInfo(
        frames=frames,
        fps=fps,
        variable_fps=variable,
        duration=duration or float(frames / fps),
        time_base=_rational(v.get("time_base")) or Fraction(1, fps.numerator),
        width=width,
        height=height,
        rotation=_rotation(v),
        sar=_rational(v.get("sample_aspect_ratio")) or Fraction(1),
        codec=str(v.get("codec_name", "unknown")),
        audio=audio,
        start_time=_decimal(data.get("format", {}).get("start_time")),
    )


def _reason(stderr: str, path: Path, names: dict[str, str] | None = None) -> str:
    """ffmpeg's own words, without addresses and with the file named once by the caller. Other files
    it names are written as ``names`` says (relative to the data root), ``path`` else by its bare
    name: a reason never shows the controller host's paths."""
    lines = [re.sub(r"^\[[^\]]* @ 0x[0-9a-f]+\] ", "", ln).strip() for ln in stderr.splitlines()]
    lines = [ln.removeprefix(f"{path}: ") for ln in lines if ln]
    text = "; ".join(dict.fromkeys(lines)) or "ffmpeg failed without a message"
    for host, name in sorted({str(path): path.name, **(names or {})}.items(), key=lambda kv: -len(kv[0])):
        text = text.replace(host, name)  # longest first: a file's path before its folder's
    return text


def _run(cmd: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    except FileNotFoundError:
        raise CapacityError(f"{cmd[0]} not found: the controller host needs ffmpeg (apt-get install ffmpeg)") from None


def probe(path: Path, name: str | None = None) -> VideoInfo:
    """``name``: how ffprobe's words name the file (its data-root-relative path; default its bare name)."""
    try:
        if path.stat().st_size == 0:
            raise ProbeError("empty file (0 bytes)")
    except OSError as e:
        raise ProbeError(f"cannot read: {e.strerror or e}") from e
    try:
        proc = _run(ffmpeg.probe_cmd(str(path)), PROBE_TIMEOUT)
    except subprocess.TimeoutExpired:
        raise ProbeError(f"ffprobe did not finish within {PROBE_TIMEOUT:.0f} s") from None
    if proc.returncode != 0:
        raise ProbeError(f"ffprobe: {_reason(proc.stderr, path, {str(path): name} if name else None)}")
    return parse_probe(proc.stdout)


@dataclass(frozen=True)
class FrameTimes:
    """The video's frames' presentation times, in order (ticks of ``time_base``), and the file's
    start time that ffmpeg's ``-ss`` counts from."""

    pts: tuple[int, ...]
    time_base: Fraction
    start: Fraction

    def seek(self, frame: int) -> str | None:
        """``-ss`` for a decode that begins exactly at ``frame``: halfway between its time and the
        previous frame's, so rounding to microseconds cannot land on either (None: from the start)."""
        if frame <= 0 or frame >= len(self.pts):
            return None
        mid = Fraction(self.pts[frame - 1] + self.pts[frame], 2) * self.time_base - self.start
        return f"{float(mid):.6f}" if mid > 0 else None


def frame_times(path: Path, info: VideoInfo) -> FrameTimes | None:
    """Each frame's presentation time, from a demux of the video stream (no decode); None when
    they cannot all be known as the decoder will deliver them — a packet without a time (AVI's
    packed B-frames), a count other than the probe's, two frames at one time — and the segments
    then decode from the start instead of seeking. Read as CSV lines into a list of ints: an hour
    of 60 fps video is 216,000 packets."""
    try:
        proc = _run(ffmpeg.frame_times_cmd(str(path)), PROBE_TIMEOUT)
    except subprocess.TimeoutExpired:
        return None
    if proc.returncode != 0:
        return None
    pts: list[int] = []
    for line in proc.stdout.splitlines():
        value, _, flags = line.strip().partition(",")
        if not value and not flags:
            continue
        if "D" in flags:
            continue  # discarded by the demuxer (an edit list's lead-in): never decoded into a frame
        if not value.lstrip("-").isdigit():
            return None
        pts.append(int(value))
    if len(pts) != info.frames or len(set(pts)) != len(pts):
        return None
    pts.sort()
    return FrameTimes(tuple(pts), info.time_base, info.start_time)


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


def target_ref(target: Target, spec: JobSpec, limits: Limits | None = None) -> TargetRef:
    """An image as it is; a video probed and cut (a probe failure becomes the item's error)."""
    if target.kind is not TargetKind.VIDEO:
        return TargetRef(input=target.rel, output=target.output_rel, kind=target.kind.value)
    muxer = ffmpeg.MUXERS[target.output.suffix.lower()]
    allowed = ffmpeg.VIDEO_OK.get(muxer)
    try:
        if allowed is not None and spec.video.codec not in allowed:
            raise ProbeError(f"a {target.output.suffix} output cannot hold {spec.video.codec} video (video.codec)")
        info = probe(target.input, target.rel)
    except ProbeError as e:
        return TargetRef(input=target.rel, output=target.output_rel, kind="video", error=str(e))
    if limits is not None:
        check_limits(info, target.rel, spec, limits)
    times = frame_times(target.input, info) if info.frames > 1 else None
    segments = segments_for(info, spec, times)
    return TargetRef(target.rel, target.output_rel, "video", segments, None, info.as_dict())


def target_refs(targets: Iterable[Target], spec: JobSpec, limits: Limits | None = None) -> list[TargetRef]:
    """Every target's ref, in order; videos are probed several at a time (two ffprobe runs each,
    mostly waiting on the disk or NFS)."""
    targets = list(targets)
    videos = [i for i, t in enumerate(targets) if t.kind is TargetKind.VIDEO]
    if len(videos) < 2:
        return [target_ref(t, spec, limits) for t in targets]
    with ThreadPoolExecutor(max_workers=min(len(videos), PROBES_AT_ONCE)) as pool:
        probed = dict(zip(videos, pool.map(lambda i: target_ref(targets[i], spec, limits), videos), strict=True))
    return [probed[i] if i in probed else target_ref(t, spec, limits) for i, t in enumerate(targets)]
