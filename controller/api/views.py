"""What a tenant reads about its jobs: status, report, results as a streamed ZIP, events, cancel.

All of it comes from the run folder and the inbox (the API keeps no state): a job not yet claimed
by `serve` is ``queued``; one `serve` refused is ``refused`` with its reason. Results hold only
committed outputs inside the tenant's area, opened without following links, streamed in pieces.
"""

from __future__ import annotations

import asyncio
import json
import os
import stat
import time
import zipfile
from collections.abc import AsyncIterator, Iterator
from typing import Any

from controller.api.area import Area
from controller.api.errors import ApiError, not_found
from controller.config import Config
from controller.errors import FfswarmError
from controller.run import status, usage
from controller.run.fold import Fold
from controller.run.rundir import Control, RunDir, read_nofollow
from controller.volume import Volume

MAX_REASON = 4096
PIECE = 256 * 1024
EVENT_INTERVAL = 0.5  # progress at most every 500 ms


def job_view(config: Config, area: Area, job: str) -> dict[str, Any]:
    rec = area.owns(job)
    if rec is None:
        raise not_found(job)
    rundir = RunDir(config.data_root, job)
    if rundir.exists():
        try:
            row = status.job_status(rundir)
        except FfswarmError:
            row = {"job": job, "phase": "unreadable"}
        if os.path.lexists(config.data_root / "inbox" / f"{job}.yaml"):  # handed back by POST …/retry
            row = {**row, "phase": "queued"}
        return {**row, "owner": area.tenant, "created": rec.created, "usage": usage.of_rundir(rundir)}
    box = config.data_root / "inbox"
    reason = read_nofollow(box / "failed" / f"{job}.yaml.reason.txt", MAX_REASON)
    if reason is not None or os.path.lexists(box / "failed" / f"{job}.yaml"):
        text = (reason or b"").decode("utf-8", "replace").replace(area.rel + "/", "")
        return {"job": job, "phase": "refused", "reason": text, "owner": area.tenant, "created": rec.created}
    phase = "cancelled" if rec.cancelled else "queued"
    return {"job": job, "phase": phase, "owner": area.tenant, "created": rec.created}


def list_jobs(area: Area, limit: int, cursor: str | None) -> dict[str, Any]:
    ids = [j for j in area.jobs() if cursor is None or j > cursor]
    page = ids[:limit]
    return {"jobs": page, "next_cursor": page[-1] if len(ids) > limit else None}


def report(config: Config, area: Area, job: str) -> dict[str, Any]:
    if area.owns(job) is None:
        raise not_found(job)
    data = RunDir(config.data_root, job).report()
    if data is None:
        raise ApiError(404, "no_report", f"job {job!r} has no report yet")
    return data


def cancel(config: Config, area: Area, job: str) -> dict[str, Any]:
    """A queued job is taken out of the inbox; a running one is flagged (its controller stops it)."""
    rec = area.owns(job)
    if rec is None:
        raise not_found(job)
    rundir = RunDir(config.data_root, job, None, config.controller_ids())
    if rundir.exists():
        try:  # a retry serve has not claimed yet is withdrawn: the job stays as it had finished
            os.unlink(config.data_root / "inbox" / f"{job}.yaml")
            return {"job": job, "cancelled": True}
        except FileNotFoundError:
            pass
        if status.finished(rundir):
            raise ApiError(409, "finished", f"job {job!r} already finished: nothing to cancel")
        rundir.write_control(Control(rundir.control().max_concurrent, cancel=True))
        return {"job": job, "cancelled": True}
    try:
        os.unlink(config.data_root / "inbox" / f"{job}.yaml")
    except FileNotFoundError:
        raise ApiError(409, "not_cancellable", f"job {job!r} is being started; try again in a moment") from None
    area.mark_cancelled(job)
    return {"job": job, "cancelled": True}


def committed_outputs(config: Config, area: Area, job: str) -> list[str]:
    """Outputs (relative to the data root) of every committed item, inside the tenant's area."""
    if area.owns(job) is None:
        raise not_found(job)
    rundir = RunDir(config.data_root, job)
    if not rundir.exists():
        return []
    fold = Fold.read(rundir.plan(), rundir)
    outs = []
    for item in fold.plan.items:
        if item.kind == "image" and fold.committed(item.id):
            r = fold.result(item.id)
            if r is not None and r.output is not None:
                outs.append(item.output)
    for video in fold.plan.videos:
        s = fold.video_status(video)
        if s is not None and not s.is_failure():
            outs.append(video.output)
    prefix = area.rel + "/"
    return sorted({o for o in outs if o.startswith(prefix)})


class _Pipe:
    """A file-like sink that zipfile writes into; the generator takes what has piled up."""

    def __init__(self) -> None:
        self.buf = bytearray()
        self.pos = 0

    def write(self, b: bytes) -> int:
        self.buf += b
        self.pos += len(b)
        return len(b)

    def tell(self) -> int:
        return self.pos

    def flush(self) -> None:
        pass

    def take(self) -> bytes:
        out = bytes(self.buf)
        self.buf.clear()
        return out


def results_zip(config: Config, area: Area, outputs: list[str]) -> Iterator[bytes]:
    """A ZIP of ``outputs`` built while it is sent: each file read in pieces through a descriptor
    opened without following links; a file that is not a regular file any more is left out."""
    vol = Volume(config.data_root)
    pipe = _Pipe()
    with zipfile.ZipFile(pipe, "w", compression=zipfile.ZIP_STORED, allowZip64=True) as zf:  # type: ignore[call-overload]
        for rel in outputs:
            try:
                fd = vol.open(rel, os.O_RDONLY | os.O_NONBLOCK)
            except (OSError, FfswarmError):
                continue
            with os.fdopen(fd, "rb") as src:
                st = os.fstat(src.fileno())
                if not stat.S_ISREG(st.st_mode):
                    continue
                info = zipfile.ZipInfo(rel[len(area.rel) + 1 :], time.localtime(st.st_mtime)[:6])
                info.file_size = st.st_size
                with zf.open(info, "w", force_zip64=st.st_size > 2**31) as dst:
                    while piece := src.read(PIECE):
                        dst.write(piece)
                        yield pipe.take()
            yield pipe.take()
    yield pipe.take()


async def events(config: Config, area: Area, job: str, poll: float = EVENT_INTERVAL) -> AsyncIterator[bytes]:
    """Server-sent events: ``progress`` when the status changed (at most every 500 ms), then ``end``."""
    last = None
    while True:
        row = await asyncio.to_thread(job_view, config, area, job)
        text = json.dumps(row, sort_keys=True)
        if text != last:
            last = text
            yield f"event: progress\ndata: {text}\n\n".encode()
        if row["phase"] in ("finished", "cancelled", "refused", "stopped"):
            yield f"event: end\ndata: {json.dumps({'job': job, 'phase': row['phase']})}\n\n".encode()
            return
        await asyncio.sleep(poll)
