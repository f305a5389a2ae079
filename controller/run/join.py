"""Video targets after the chunks: check the segments, redo bad ones, join each video.

When the chunks have finished, every committed segment is checked (ffprobe: readable, right frame
count); a missing or corrupt one is deleted and its chunk run again, which redoes that segment alone
(the runner skips committed items). Then each video's segments are joined without re-encoding and
its original audio restored; each join's result is a line of the run folder's joins.jsonl.
"""

from __future__ import annotations

import contextlib
import os
import posixpath
import resource
import stat
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any

from contract import ffmpeg
from contract.manifest import NoFacePolicy, Segment
from contract.results import ItemResult, ItemStatus, read_results
from contract.s3 import S3Url, is_s3
from controller.errors import MissingInputError
from controller.job import access
from controller.job.plan import Plan, PlannedVideo, segment_output
from controller.job.spec import JobSpec
from controller.job.video import ProbeError, _reason, _run, fetched, probe
from controller.run.chunks import ChunkRun
from controller.run.rundir import RunDir
from controller.storage.errors import ObjectMissing, StorageAccessError, StorageTemporaryError
from controller.storage.transfer import ObjectChanged, ObjectExists, ObjectTooLarge, digest
from controller.volume import Owner, UnsafePath, Volume, create_temp, masked, own, proc_path

if TYPE_CHECKING:
    from controller.storage.s3 import S3Store

JOIN_TIMEOUT = 1800.0
OUTPUT_MODE = 0o644  # the user's output, as the runner writes its others (umask-narrowed)


def check_segment(volume: Volume, rel: str, segment: Segment) -> str | None:
    """Why a committed segment file cannot be joined (None: it can). ``rel``: relative to the data
    root; opened without following links and required to be a regular file (runners write it)."""
    try:
        with _opened(volume, [rel]) as (fd,):
            info = probe(Path(proc_path(fd)), rel)
    except FileNotFoundError:
        return "missing"
    except (OSError, UnsafePath) as e:
        return "not a regular file" if isinstance(e, UnsafePath) else f"unreadable: {e.strerror}"
    except ProbeError as e:
        return f"unreadable: {e}"
    ok = info.frames == segment.frame_count or (segment.last and 0 < info.frames <= segment.frame_count)
    return None if ok else f"has {info.frames} frames, expected {segment.frame_count}"


@contextlib.contextmanager
def _opened(volume: Volume, rels: list[str]) -> Iterator[list[int]]:
    """Each file opened read-only beneath the data root, never through a link, each a regular file
    (UnsafePath otherwise; a FIFO does not block): ffmpeg reads them by descriptor (proc_path), so a
    name swapped after this point changes nothing."""
    _enough_descriptors(len(rels) + 16)
    fds: list[int] = []
    try:
        for rel in rels:
            fds.append(volume.open(rel, os.O_RDONLY | os.O_NONBLOCK, what="reading"))
            if not stat.S_ISREG(os.fstat(fds[-1]).st_mode):
                raise UnsafePath(f"{rel}: not a regular file")
        yield fds
    finally:
        for fd in fds:
            os.close(fd)


def _enough_descriptors(wanted: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < wanted + 256:
        limit = wanted + 256 if hard == resource.RLIM_INFINITY else min(hard, wanted + 256)
        resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, limit), hard))


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
    store: S3Store | None = None,
) -> dict[str, ChunkRun]:
    """After the chunks: redo missing/corrupt committed segments once (their chunks only), then join
    every video whose segments are all committed. Returns the chunk runs, redone ones updated.
    ``store``: the object store, for a video whose original or output is an ``s3://`` object."""
    if not plan.videos or rundir.control().cancel:
        return runs
    redo: dict[str, list[str]] = {}
    for sid, (chunk, result) in _segment_results(plan, rundir).items():
        if not _committed(result) or _joined(rundir, plan.item(sid).parent or "", store):
            continue
        seg = plan.item(sid).segment
        assert seg is not None
        output = segment_output(plan.job, sid)  # its own file in this run folder, whatever plan.json says
        why = check_segment(rundir.volume, output, seg)
        if why is not None:
            rundir.volume.unlink(output)  # the runner redoes what is missing; never through a link
            redo.setdefault(chunk, []).append(sid)
            emit("segment_redo", segment=sid, chunk=chunk, reason=why)
    if redo:
        runs = {**runs, **rerun(sorted(redo))}
    segs = _segment_results(plan, rundir)
    for video in plan.videos:
        if video.error is None and not _joined(rundir, video.id, store):
            results = [segs[s][1] for s in video.segments]
            if all(_committed(r) for r in results):
                result = join_video(video, plan, rundir, spec, [r for r in results if r is not None], store)
                _append(rundir, result)
                emit("video_joined", item=video.id, status=result.status.value, reason=result.reason)
    return runs


MAX_JOINS_BYTES = 64 * 1024**2


def joins(rundir: RunDir) -> dict[str, ItemResult]:
    """Each video's latest join result (runs/<job>/joins.jsonl: the controller's, read bounded)."""
    data = rundir.read_file(rundir.layout.joins, MAX_JOINS_BYTES)
    if data is None:
        return {}
    return {r.item: r for r in read_results(data.decode("utf-8", errors="replace"))}


def _joined(rundir: RunDir, video_id: str, store: S3Store | None = None) -> bool:
    r = joins(rundir).get(video_id)
    if r is None or not _committed(r):
        return False
    if r.output is None:
        return True
    if is_s3(r.output):  # still this job's commit of the video, with the bytes its join recorded
        try:
            found = None if store is None else store.probe(S3Url.parse(r.output))
        except (ValueError, StorageAccessError, StorageTemporaryError):
            return False
        return found is not None and found.committed_by(rundir.job, video_id) and found.sha256 == r.sha256
    try:
        fd = rundir.volume.open(r.output, os.O_RDONLY | os.O_NONBLOCK)
    except (OSError, UnsafePath):
        return False
    try:
        return stat.S_ISREG(os.fstat(fd).st_mode)
    finally:
        os.close(fd)


def _append(rundir: RunDir, result: ItemResult) -> None:
    rundir.volume.append(rundir.layout.joins, result.to_line().encode(), rundir.controller_owner())


def join_video(
    video: PlannedVideo,
    plan: Plan,
    rundir: RunDir,
    spec: JobSpec,
    segments: list[ItemResult],
    store: S3Store | None = None,
) -> ItemResult:
    """Concatenate the segments (no re-encode), restore the audio, check, rename into place; or, for
    an ``s3://`` output, commit it by PUT (the runner's rule: this job's object is kept, another's
    is refused without ``overwrite``). An ``s3://`` original is fetched once (its planned ETag)."""
    started = time.time()
    root = rundir.data_root
    faces = sum(r.faces for r in segments)
    no_face = all(r.status is ItemStatus.NO_FACE for r in segments)

    def result(
        status: ItemStatus, output: str | None, reason: str | None = None, sha: tuple[int, str] | None = None
    ) -> ItemResult:
        now = time.time()
        return ItemResult(
            video.id, status, 1, video.input, output, reason, faces, started=started, finished=now,
            timings={"join": round(now - started, 4)}, size=sha[0] if sha else None, sha256=sha[1] if sha else None,
        )  # fmt: skip

    if no_face and spec.no_face is NoFacePolicy.FAIL:
        return result(ItemStatus.ERROR, None, f"{video.input}: no face detected in any frame")
    if no_face and spec.no_face is NoFacePolicy.SKIP:
        return result(ItemStatus.NO_FACE, None)
    audio = [] if spec.skip_audio else list(video.info.get("audio", []))
    parts = [segment_output(plan.job, s) for s in video.segments]
    names = [video.input, *parts]  # how errors name them: relative to the data root
    demuxer = video.info.get("demuxer") if video.info.get("demuxer") in ffmpeg.INPUT_FORMATS else None
    volume = rundir.volume
    status = ItemStatus.NO_FACE if no_face else ItemStatus.OK
    try:
        if (is_s3(video.input) or is_s3(video.output)) and store is None:
            raise JoinError("the object store is not configured (storage.s3)")
        with _original(volume, video, store, bool(audio)) as original, _opened(volume, parts) as segment_fds:
            check_digests(segment_fds, segments, parts)  # the very descriptors ffmpeg reads
            ffmpeg_join = _Join(original, segment_fds, audio, names, demuxer, video.output)
            if is_s3(video.output):
                assert store is not None
                with tempfile.TemporaryDirectory(prefix="ffswarm-join-out-") as scratch:
                    out = Path(scratch) / f"joined{PurePosixPath(video.output).suffix}"
                    with open(out, "w+b") as f:
                        ffmpeg_join.into(f.fileno())
                        got = store.commit_file(S3Url.parse(video.output), f, plan.job, video.id, 1, spec.overwrite)
                return result(status, video.output, sha=(got.size, got.sha256))
            access.make_folders(root, [posixpath.dirname(video.output)], rundir.owner, rundir.controller_owner())
            ffmpeg_join.onto(volume, rundir.runner_owner())
    except (JoinError, MissingInputError, ObjectExists, ObjectChanged, ObjectMissing, ObjectTooLarge) as e:
        return result(ItemStatus.ERROR, None, f"{video.output}: {e}")
    except (StorageAccessError, StorageTemporaryError) as e:  # the store: named, the job's other items go on
        return result(ItemStatus.ERROR, None, f"{video.output}: {e}")
    except OSError as e:
        return result(ItemStatus.ERROR, None, f"{video.output}: {e.strerror}")
    return result(status, video.output)


class JoinError(Exception):
    pass


def check_digests(fds: list[int], results: list[ItemResult], names: list[str]) -> None:
    """Each open segment's bytes against the size and sha256 its result line recorded (the runner
    records them for every output it commits), hashed as a commit is (controller/storage/transfer.py
    digest): JoinError naming the first segment that differs, so wrong bytes are never joined."""
    for fd, r, name in zip(fds, results, names, strict=True):
        if r.sha256 is None:
            continue
        with open(fd, "rb", closefd=False) as f:
            size, sha, _ = digest(f)
        if sha != r.sha256 or (r.size is not None and size != r.size):
            raise JoinError(f"segment {name} does not match the sha256 its result recorded (changed since "
                            f"it was committed); the video is not joined from it")  # fmt: skip


@contextlib.contextmanager
def _original(volume: Volume, video: PlannedVideo, store: S3Store | None, needed: bool) -> Iterator[int]:
    """The original video (its audio) as an open descriptor: opened beneath the data root, or an
    object fetched into a private temporary file with the ETag it had when planned (-1: no audio
    is restored, nothing is read)."""
    if not needed:
        yield -1
        return
    if not is_s3(video.input):
        with _opened(volume, [video.input]) as (fd,):
            yield fd
        return
    assert store is not None
    cap = int(video.info.get("bytes") or 0) or None
    etag = video.info.get("etag") if isinstance(video.info.get("etag"), str) else None
    with fetched(store, S3Url.parse(video.input), cap or 2**63, None, etag) as (path, _):
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        try:
            yield fd
        finally:
            os.close(fd)


class _Join:
    """One join's ffmpeg runs, into a descriptor: ``original`` and ``parts`` are open descriptors
    (``names``: how errors name them, original first); ``out``: how errors name the output."""

    def __init__(
        self,
        original: int,
        parts: list[int],
        audio: list[dict[str, Any]],
        names: list[str],
        demuxer: str | None,
        out: str,
    ) -> None:
        self.original, self.parts, self.audio, self.names, self.demuxer, self.out = (
            original,
            parts,
            audio,
            names,
            demuxer,
            out,
        )

    def into(self, fd: int) -> None:
        """Join into the open, empty file ``fd``, check it and fsync it (JoinError when it fails)."""
        muxer = ffmpeg.MUXERS[PurePosixPath(self.out).suffix.lower()]
        codecs = {ffmpeg.audio_codec(muxer, str(a["codec"])) for a in self.audio}
        first = None if not self.audio else ("copy" if codecs == {"copy"} else (codecs - {"copy"}).pop())
        tries: list[str | None] = [first]
        if first == "copy":
            tries.append(ffmpeg.AUDIO_REENCODE.get(muxer, ffmpeg.AUDIO_REENCODE_DEFAULT))
        part_paths = [proc_path(p) for p in self.parts]
        original = proc_path(self.original) if self.original >= 0 else ""
        tmp = proc_path(fd)
        with tempfile.TemporaryDirectory(prefix="ffswarm-join-") as scratch:
            listing = Path(scratch) / "segments.ffconcat"
            listing.write_text(ffmpeg.concat_list(part_paths))
            shown = dict(zip([original or "-", *part_paths], self.names, strict=True))
            shown = {**shown, tmp: self.out, str(listing): listing.name}
            errors = []
            for codec in tries:
                proc = _run(ffmpeg.join_cmd(str(listing), original, tmp, muxer, codec, self.demuxer), JOIN_TIMEOUT)
                if proc.returncode == 0:
                    break
                errors.append(f"{codec}: {_reason(proc.stderr, Path(tmp), shown)}")
            else:
                if self.audio:  # tell a failed audio restore from a failed join
                    video_only = _run(ffmpeg.join_cmd(str(listing), "", tmp, muxer, None), JOIN_TIMEOUT)
                    if video_only.returncode == 0:
                        raise JoinError(f"audio restore failed ({'; '.join(errors)})")
                raise JoinError(f"joining segments failed: {'; '.join(errors)}")
            _verify(Path(tmp), [Path(p) for p in part_paths], bool(self.audio))
        os.fsync(fd)

    def onto(self, volume: Volume, owner: Owner | None) -> None:
        """Join into a unique temporary file made O_EXCL in the output folder's descriptor (relative to
        the data root, reached without following links), hand it to ``owner``, rename it into place
        in that descriptor, and fsync the folder."""
        with volume.parent(self.out, "write") as (dfd, name):
            fd, tmp_name = create_temp(dfd, name)
            try:
                self.into(fd)
                own(fd, owner, masked(OUTPUT_MODE), self.out)
                os.rename(tmp_name, name, src_dir_fd=dfd, dst_dir_fd=dfd)
                tmp_name = ""
                os.fsync(dfd)
            finally:
                os.close(fd)
                if tmp_name:
                    with contextlib.suppress(OSError):
                        os.unlink(tmp_name, dir_fd=dfd)


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
