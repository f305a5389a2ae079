"""A job's items as its tenant sees them: each photo or video with its status and reason, and the
one input or output file of an item the web page shows before/after.

Read from the run folder's plan and results (the one fold every view uses). Only files of that job,
inside the tenant's area, are ever named or opened; an output only once its item is committed; every
open is beneath the data root without following a link (controller/volume.py). Anything else reads
as "not found", exactly like another tenant's job.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from contract.paths import user_text
from controller.api.area import Area
from controller.api.errors import ApiError, not_found
from controller.api.uploads import sniff
from controller.config import Config
from controller.errors import FfswarmError
from controller.job.plan import ID
from controller.run.fold import Fold
from controller.run.rundir import RunDir
from controller.volume import Volume

MAX_REASON = 1000
PIECE = 256 * 1024
MEDIA_TYPES = {
    "jpeg": "image/jpeg",
    "png": "image/png",
    "webp": "image/webp",
    "bmp": "image/bmp",
    "tiff": "image/tiff",
    "mp4": "video/mp4",
    "mkv": "video/x-matroska",
    "avi": "video/x-msvideo",
}


@dataclass(frozen=True)
class Entry:
    id: str
    kind: str  # image | video
    input: str  # relative to the data root
    output: str
    status: str | None  # ok | no_face | error; None: not ended yet
    reason: str | None
    has_output: bool


def _fold(config: Config, area: Area, job: str) -> Fold | None:
    if area.owns(job) is None:
        raise not_found(job)
    rundir = RunDir(config.data_root, job)
    if not rundir.exists():
        return None  # queued, refused or cancelled before it started: no items yet
    try:
        return Fold.read(rundir.plan(), rundir)
    except (FfswarmError, ValueError, OSError):
        raise ApiError(404, "not_found", f"job {job!r} has no readable plan") from None


def _entries(fold: Fold) -> list[Entry]:
    out = []
    for item in fold.plan.items:
        if item.kind == "segment":
            continue
        r = fold.result(item.id)
        status = r.status.value if r is not None else None
        committed = r is not None and fold.committed(item.id) and r.output is not None
        out.append(Entry(item.id, "image", item.input, item.output, status, r.reason if r else None, committed))
    for video in fold.plan.videos:
        s = fold.video_status(video)
        join = fold.joined.get(video.id)
        reason = video.error if video.error is not None else (join.reason if join is not None else None)
        done = s is not None and not s.is_failure() and join is not None and join.output is not None
        out.append(Entry(video.id, "video", video.input, video.output, s.value if s else None, reason, done))
    return sorted(out, key=lambda e: e.id)


def _shown(area: Area, rel: str) -> str | None:
    prefix = area.rel + "/"
    return rel[len(prefix) :] if rel.startswith(prefix) else None


def _reason(area: Area, config: Config, text: str | None) -> str | None:
    if text is None:
        return None
    text = user_text(text, str(config.data_root)).replace(area.rel + "/", "")
    return text[:MAX_REASON]


STATUSES = ("ok", "no_face", "error", "pending")


def list_items(
    config: Config, area: Area, job: str, limit: int, cursor: str | None, status: str | None = None
) -> dict[str, Any]:
    """``{"items": [...], "next_cursor"}``: the job's photos and videos in plan order (only those
    with ``status``, when given), paths relative to the tenant's area (null for one outside it)."""
    fold = _fold(config, area, job)
    want = None if status is None else (None if status == "pending" else status)
    entries = [
        e
        for e in ([] if fold is None else _entries(fold))
        if (cursor is None or e.id > cursor) and (status is None or e.status == want)
    ]
    page = entries[:limit]
    rows = [
        {
            "id": e.id,
            "kind": e.kind,
            "input": _shown(area, e.input),
            "output": _shown(area, e.output),
            "status": e.status,
            "reason": _reason(area, config, e.reason),
            "has_output": e.has_output and _shown(area, e.output) is not None,
        }
        for e in page
    ]
    return {"items": rows, "next_cursor": page[-1].id if len(entries) > limit else None}


def item_file(config: Config, area: Area, job: str, item: str, which: str) -> tuple[str, str]:
    """(path relative to the data root, kind) of an item's input, or its output once committed; 404
    for anything else: another job's or tenant's item, a segment, a path outside the area."""
    if not ID.fullmatch(item) or which not in ("input", "output"):
        raise ApiError(404, "not_found", f"no item {item!r} in job {job!r}")
    fold = _fold(config, area, job)
    entry = next((e for e in _entries(fold) if e.id == item), None) if fold is not None else None
    if entry is None:
        raise ApiError(404, "not_found", f"no item {item!r} in job {job!r}")
    if which == "output" and not entry.has_output:
        raise ApiError(404, "no_output", f"item {item!r} has no output (yet)")
    rel = entry.input if which == "input" else entry.output
    if _shown(area, rel) is None:
        raise ApiError(404, "not_found", f"item {item!r} has no {which} in your area")
    return rel, entry.kind


@dataclass
class Opened:
    """An open regular file of the volume; the caller closes it (``close``) or hands it to ``pieces``."""

    fd: int
    size: int
    media_type: str | None  # from the first bytes; None: not a photo or video we know

    def read(self, limit: int) -> bytes:
        chunks, left = [], limit
        while left > 0 and (block := os.read(self.fd, min(left, PIECE))):
            chunks.append(block)
            left -= len(block)
        return b"".join(chunks)

    def pieces(self) -> Iterator[bytes]:
        try:
            while block := os.read(self.fd, PIECE):
                yield block
        finally:
            self.close()

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def open_file(config: Config, rel: str, shown: str) -> Opened:
    """``rel`` opened beneath the data root without following a link; 404 (naming ``shown``, the path
    as the tenant knows it) when it is missing, a link, or not a regular file."""
    try:
        fd = Volume(config.data_root).open(rel, os.O_RDONLY | os.O_NONBLOCK)
    except (OSError, FfswarmError):
        raise ApiError(404, "not_found", f"{shown} cannot be read", file=shown) from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise ApiError(404, "not_found", f"{shown} is not a regular file", file=shown)
    head = os.pread(fd, 64, 0)
    found = sniff(head)
    media = MEDIA_TYPES.get(found[1]) if found is not None and found[0] != "zip" else None
    return Opened(fd, st.st_size, media)


def shown_path(area: Area, rel: str) -> str:
    return _shown(area, rel) or rel.rsplit("/", 1)[-1]
