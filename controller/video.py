"""Video targets on the controller's side: probe at plan time, cut into segments, join at the end.

A video is probed with ffprobe when the job is planned (frames, exact fps, rotation, audio), cut
into segments of ``segment_seconds`` on frame boundaries, and each segment becomes a work item
that any chunk service may run (runner_image/video.py). When the chunks have finished, every
committed segment is checked (ffprobe: readable, right frame count); a missing or corrupt one is
deleted and its chunk run again, which redoes that segment alone (the runner skips committed
items). Then each video's segments are joined without re-encoding and its original audio restored.

The controller host needs ffmpeg/ffprobe on its PATH (README; scripts/dev-swarm.sh installs it).
"""

from __future__ import annotations

import json
import os
import posixpath
import re
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any

from contract import ffmpeg
from contract.manifest import NoFacePolicy, Segment
from contract.results import ItemResult, ItemStatus, read_results
from controller import access
from controller.errors import CapacityError, MissingInputError
from controller.jobspec import JobSpec, Target, TargetKind
from controller.plan import Plan, PlannedVideo, TargetRef
from controller.rundir import RunDir
from controller.supervisor import ChunkRun

PROBE_TIMEOUT = 300.0
PROBES_AT_ONCE = 8
JOIN_TIMEOUT = 1800.0


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


def target_ref(target: Target, spec: JobSpec) -> TargetRef:
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
    times = frame_times(target.input, info) if info.frames > 1 else None
    segments = segments_for(info, spec, times)
    return TargetRef(target.rel, target.output_rel, "video", segments, None, info.as_dict())


def target_refs(targets: Iterable[Target], spec: JobSpec) -> list[TargetRef]:
    """Every target's ref, in order; videos are probed several at a time (two ffprobe runs each,
    mostly waiting on the disk or NFS)."""
    targets = list(targets)
    videos = [i for i, t in enumerate(targets) if t.kind is TargetKind.VIDEO]
    if len(videos) < 2:
        return [target_ref(t, spec) for t in targets]
    with ThreadPoolExecutor(max_workers=min(len(videos), PROBES_AT_ONCE)) as pool:
        probed = dict(zip(videos, pool.map(lambda i: target_ref(targets[i], spec), videos), strict=True))
    return [probed[i] if i in probed else target_ref(t, spec) for i, t in enumerate(targets)]


# --- after the chunks: check segments, redo bad ones, join ---------------------------------------


def check_segment(path: Path, segment: Segment) -> str | None:
    """Why a committed segment file cannot be joined (None: it can)."""
    if not path.is_file():
        return "missing"
    try:
        info = probe(path)
    except ProbeError as e:
        return f"unreadable: {e}"
    ok = info.frames == segment.frame_count or (segment.last and 0 < info.frames <= segment.frame_count)
    return None if ok else f"has {info.frames} frames, expected {segment.frame_count}"


def _segment_results(plan: Plan, rundir: RunDir) -> dict[str, tuple[str, ItemResult | None]]:
    """Segment id → (its chunk, its latest result)."""
    out: dict[str, tuple[str, ItemResult | None]] = {}
    for chunk in plan.chunks:
        latest = rundir.latest_results(chunk.id)
        for i in chunk.items:
            if plan.item(i).kind == "segment":
                out[i] = (chunk.id, latest.get(i))
    return out


def _committed(r: ItemResult | None) -> bool:
    return r is not None and r.status in (ItemStatus.OK, ItemStatus.NO_FACE)


def finish(
    plan: Plan,
    rundir: RunDir,
    spec: JobSpec,
    rerun: Callable[[list[str]], dict[str, ChunkRun]],
    runs: dict[str, ChunkRun],
    emit: Callable[..., None],
) -> dict[str, ChunkRun]:
    """After the chunks: redo missing/corrupt committed segments once (their chunks only), then join
    every video whose segments are all committed. Returns the chunk runs, redone ones updated."""
    if not plan.videos or rundir.control().cancel:
        return runs
    root = rundir.data_root
    redo: dict[str, list[str]] = {}
    for sid, (chunk, result) in _segment_results(plan, rundir).items():
        if not _committed(result) or _joined(rundir, plan.item(sid).parent or ""):
            continue
        seg = plan.item(sid).segment
        assert seg is not None
        why = check_segment(root / plan.item(sid).output, seg)
        if why is not None:
            (root / plan.item(sid).output).unlink(missing_ok=True)  # the runner redoes what is missing
            redo.setdefault(chunk, []).append(sid)
            emit("segment_redo", segment=sid, chunk=chunk, reason=why)
    if redo:
        runs = {**runs, **rerun(sorted(redo))}
    segs = _segment_results(plan, rundir)
    for video in plan.videos:
        if video.error is None and not _joined(rundir, video.id):
            results = [segs[s][1] for s in video.segments]
            if all(_committed(r) for r in results):
                result = join_video(video, plan, rundir, spec, [r for r in results if r is not None])
                _append(rundir, result)
                emit("video_joined", item=video.id, status=result.status.value, reason=result.reason)
    return runs


def joins(rundir: RunDir) -> dict[str, ItemResult]:
    """Each video's latest join result (runs/<job>/joins.jsonl)."""
    try:
        text = rundir.layout.joins.read_text()
    except FileNotFoundError:
        return {}
    return {r.item: r for r in read_results(text)}


def _joined(rundir: RunDir, video_id: str) -> bool:
    r = joins(rundir).get(video_id)
    if r is None or not _committed(r):
        return False
    return r.output is None or (rundir.data_root / r.output).is_file()


def _append(rundir: RunDir, result: ItemResult) -> None:
    fd = os.open(rundir.layout.joins, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        os.write(fd, result.to_line().encode())
        os.fsync(fd)
    finally:
        os.close(fd)


def join_video(
    video: PlannedVideo, plan: Plan, rundir: RunDir, spec: JobSpec, segments: list[ItemResult]
) -> ItemResult:
    """Concatenate the segments (no re-encode), restore the audio, check, rename into place."""
    started = time.time()
    root = rundir.data_root
    faces = sum(r.faces for r in segments)
    no_face = all(r.status is ItemStatus.NO_FACE for r in segments)

    def result(status: ItemStatus, output: str | None, reason: str | None = None) -> ItemResult:
        now = time.time()
        return ItemResult(
            video.id, status, 1, video.input, output, reason, faces, started=started, finished=now,
            timings={"join": round(now - started, 4)},
        )  # fmt: skip

    if no_face and spec.no_face is NoFacePolicy.FAIL:
        return result(ItemStatus.ERROR, None, f"{video.input}: no face detected in any frame")
    if no_face and spec.no_face is NoFacePolicy.SKIP:
        return result(ItemStatus.NO_FACE, None)
    out = root / video.output
    audio = [] if spec.skip_audio else list(video.info.get("audio", []))
    parts = [plan.item(s).output for s in video.segments]
    names = {str(root / rel): rel for rel in (video.output, video.input, *parts)}  # ffmpeg's words, as users know them
    try:
        access.make_folders(root, [posixpath.dirname(video.output)], rundir.owner)  # the runner's, as at submit
        _join(out, root / video.input, [root / p for p in parts], audio, rundir.owner, names)
    except (JoinError, MissingInputError) as e:
        return result(ItemStatus.ERROR, None, f"{video.output}: {e}")
    return result(ItemStatus.NO_FACE if no_face else ItemStatus.OK, video.output)


class JoinError(Exception):
    pass


def _join(
    out: Path,
    original: Path,
    parts: list[Path],
    audio: list[dict[str, Any]],
    owner: tuple[int, int] | None,
    names: dict[str, str] | None = None,
) -> None:
    """``names``: how errors name the files (host path → relative to the data root)."""
    muxer = ffmpeg.MUXERS[out.suffix.lower()]
    codecs = {ffmpeg.audio_codec(muxer, str(a["codec"])) for a in audio}
    first = None if not audio else ("copy" if codecs == {"copy"} else (codecs - {"copy"}).pop())
    tries: list[str | None] = [first]
    if first == "copy":
        tries.append(ffmpeg.AUDIO_REENCODE.get(muxer, ffmpeg.AUDIO_REENCODE_DEFAULT))
    with tempfile.TemporaryDirectory(prefix="ffswarm-join-") as scratch:
        listing = Path(scratch) / "segments.ffconcat"
        listing.write_text(ffmpeg.concat_list([str(p) for p in parts]))
        tmp = out.with_name(f".{out.name}.tmp-join-{os.getpid()}")
        names = {**(names or {}), str(tmp): (names or {}).get(str(out), out.name), str(listing): listing.name}
        try:
            errors = []
            for codec in tries:
                proc = _run(ffmpeg.join_cmd(str(listing), str(original), str(tmp), muxer, codec), JOIN_TIMEOUT)
                if proc.returncode == 0:
                    break
                errors.append(f"{codec}: {_reason(proc.stderr, tmp, names)}")
            else:
                if audio:  # tell a failed audio restore from a failed join
                    video_only = _run(ffmpeg.join_cmd(str(listing), "", str(tmp), muxer, None), JOIN_TIMEOUT)
                    if video_only.returncode == 0:
                        raise JoinError(f"audio restore failed ({'; '.join(errors)})")
                raise JoinError(f"joining segments failed: {'; '.join(errors)}")
            _verify(tmp, parts, bool(audio))
            if owner and os.geteuid() == 0:
                os.chown(tmp, *owner)
            os.replace(tmp, out)
        finally:
            tmp.unlink(missing_ok=True)


def _verify(joined: Path, parts: list[Path], audio: bool) -> None:
    try:
        info = probe(joined)
        expected = sum(probe(p).frames for p in parts)
    except ProbeError as e:
        raise JoinError(f"joined file unreadable: {e}") from e
    if info.frames != expected:
        raise JoinError(f"joined video has {info.frames} frames, segments have {expected}")
    if audio and not info.audio:
        raise JoinError("audio restore failed: the joined file has no audio stream")


# --- the report -----------------------------------------------------------------------------------


def report_items(plan: Plan, rundir: RunDir, segments: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """One report entry per video target, from the plan, its segments' entries and the join."""
    joined_all = joins(rundir)
    out: dict[str, dict[str, Any]] = {}
    for v in plan.videos:
        entry: dict[str, Any] = {"input": v.input, "output": None, "kind": "video", "segments": len(v.segments)}
        seg_entries = [segments[s] for s in v.segments if s in segments]
        bad = [(s, e) for s, e in zip(v.segments, seg_entries, strict=False) if e["status"] not in ("ok", "no_face")]
        joined = joined_all.get(v.id)
        if v.error is not None:
            entry.update(status="error", reason=f"{v.input}: {v.error}", chunk=None)
        elif bad:
            sid, e = bad[0]
            status = "cancelled" if all(e["status"] == "cancelled" for _, e in bad) else "error"
            entry.update(status=status, reason=f"segment {sid}: {e['reason']}", chunk=e["chunk"])
        elif joined is None:
            entry.update(status="error", reason="segments done but not joined", chunk=None)
        else:
            output = v.output if joined.output else None
            entry.update(status=joined.status.value, reason=joined.reason, output=output, chunk=None)
        entry["info"] = v.info
        out[v.id] = entry
    return out
