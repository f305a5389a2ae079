"""Video targets after the chunks: check the segments, redo bad ones, join each video.

When the chunks have finished, every committed segment is checked (ffprobe: readable, right frame
count); a missing or corrupt one is deleted and its chunk run again, which redoes that segment alone
(the runner skips committed items). Then each video's segments are joined without re-encoding and
its original audio restored; each join's result is a line of the run folder's joins.jsonl.
"""

from __future__ import annotations

import os
import posixpath
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from contract import ffmpeg
from contract.manifest import NoFacePolicy, Segment
from contract.results import ItemResult, ItemStatus, read_results
from controller.errors import MissingInputError
from controller.job import access
from controller.job.plan import Plan, PlannedVideo
from controller.job.spec import JobSpec
from controller.job.video import ProbeError, _reason, _run, probe
from controller.run.chunks import ChunkRun
from controller.run.rundir import RunDir

JOIN_TIMEOUT = 1800.0


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
