"""ffprobe at plan time: what a video target is (VideoInfo), and each frame's time (FrameTimes).

A target is hostile until probed: it is opened here without following a symlink or blocking (a
FIFO, device or folder is refused), and ffprobe reads it only through that descriptor
(``/proc/self/fd/N``), as the runner's unprivileged uid when the controller is root, with the
whitelists of contract/ffmpeg.py: files only, and only the mov/mp4, matroska/webm and avi
demuxers, so an ``.mp4`` that is really an HLS playlist or a concat script is refused before
anything it names is opened. The demuxer found is kept (VideoInfo.demuxer): segments and the join
name it with ``-f``.
"""

from __future__ import annotations

import errno
import json
import os
import re
import stat
import subprocess
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any

from contract import ffmpeg
from controller.errors import CapacityError
from controller.job.access import Ids

PROBE_TIMEOUT = 300.0

NOT_ALLOWED = "not a video format ffswarm reads (mp4/mov, mkv/webm or avi)"


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
    demuxer: str = "mov"  # the allowed demuxer ffprobe found (contract/ffmpeg.py INPUT_FORMATS)

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
            "demuxer": self.demuxer,
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
    format_name = str(data.get("format", {}).get("format_name") or "")
    demuxer = ffmpeg.demuxer_for(format_name)
    if demuxer is None:
        raise ProbeError(f"{NOT_ALLOWED} (it is {format_name or 'of no known format'})")
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
        demuxer=demuxer,
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


def _run(
    cmd: list[str], timeout: float, fd: int | None = None, run_as: Ids | None = None
) -> subprocess.CompletedProcess[str]:
    """``cmd`` with ``fd`` inherited (the file it reads), as ``run_as`` (uid, gid) when given."""
    uid, gid = (None, None) if run_as is None else run_as
    try:
        return subprocess.run(
            cmd,
            capture_output=True,
            text=True,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
            pass_fds=() if fd is None else (fd,),
            user=uid,
            group=gid,
            extra_groups=None if run_as is None else [],
        )
    except FileNotFoundError:
        raise CapacityError(f"{cmd[0]} not found: the controller host needs ffmpeg (apt-get install ffmpeg)") from None


def open_target(path: Path) -> int:
    """The target opened for ffprobe: never through a symlink, never blocking, a non-empty regular
    file (ProbeError otherwise). The caller closes it. ``/proc/self/fd/N``: a descriptor the caller
    opened that way itself (controller/run/join.py, controller/volume.py proc_path), duplicated."""
    given = re.fullmatch(r"/proc/(self|[0-9]+)/fd/([0-9]+)", str(path))
    if given is not None and given[1] not in ("self", str(os.getpid())):
        given = None
    try:
        if given is not None:
            fd = os.dup(int(given[2]))
            os.set_inheritable(fd, False)
        else:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise ProbeError("is a symbolic link: not followed") from None
        raise ProbeError(f"cannot read: {e.strerror or e}") from e
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ProbeError(f"is {_kind(st.st_mode)}, not a regular file")
        if st.st_size == 0:
            raise ProbeError("empty file (0 bytes)")
        return fd
    except BaseException:
        os.close(fd)
        raise


def _kind(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "a folder"
    if stat.S_ISFIFO(mode):
        return "a FIFO (named pipe)"
    return "a device or socket" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) or stat.S_ISSOCK(mode) else "not a file"


def probe(path: Path, name: str | None = None, run_as: Ids | None = None) -> VideoInfo:
    """``name``: how ffprobe's words name the file (its data-root-relative path; default its bare
    name). ``run_as``: the uid:gid ffprobe runs as (the runner's, when the controller is root)."""
    fd = open_target(path)
    try:
        via = f"/proc/self/fd/{fd}"
        try:
            proc = _run(ffmpeg.probe_cmd(via), PROBE_TIMEOUT, fd, run_as)
        except subprocess.TimeoutExpired:
            raise ProbeError(f"ffprobe did not finish within {PROBE_TIMEOUT:.0f} s") from None
    finally:
        os.close(fd)
    if proc.returncode != 0:
        if ffmpeg.REFUSED_FORMAT in proc.stderr:
            raise ProbeError(f"{NOT_ALLOWED}: refused without reading what it names")
        shown = name or path.name
        raise ProbeError(f"ffprobe: {_reason(proc.stderr, path, {str(path): shown, via: shown})}")
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


def frame_times(path: Path, info: VideoInfo, run_as: Ids | None = None) -> FrameTimes | None:
    """Each frame's presentation time, from a demux of the video stream (no decode); None when
    they cannot all be known as the decoder will deliver them — a packet without a time (AVI's
    packed B-frames), a count other than the probe's, two frames at one time — and the segments
    then decode from the start instead of seeking. Read as CSV lines into a list of ints: an hour
    of 60 fps video is 216,000 packets."""
    try:
        fd = open_target(path)
    except ProbeError:
        return None
    try:
        proc = _run(ffmpeg.frame_times_cmd(f"/proc/self/fd/{fd}", info.demuxer), PROBE_TIMEOUT, fd, run_as)
    except subprocess.TimeoutExpired:
        return None
    finally:
        os.close(fd)
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
