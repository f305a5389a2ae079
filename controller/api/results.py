"""``GET /v1/jobs/{id}/results.zip``: the job's committed outputs as one ZIP, built while it is sent.

Files come from the tenant's area on the volume, each read in pieces through a descriptor opened
without following links; a file that is not a regular file any more is left out. Objects (outputs in
the tenant's part of the store) are streamed from one GET each, never held whole: an object that is
gone, or is not this job's commit any more (its metadata names another job or item, or its sha256 or
size is not the one its result line recorded), is left out. Nothing fails mid-stream as an error page:
the objects left out, and any whose body broke off or did not hash to the recorded sha256 while it was
sent, are listed in ``ffswarm-left-out.json`` at the end of the ZIP (never an output's name: outputs
are photos and videos).
"""

from __future__ import annotations

import json
import os
import stat
import time
import zipfile
from collections.abc import Iterator, Sequence
from typing import Any

from contract.s3 import SCHEME, S3Url
from controller.api.area import Area
from controller.api.errors import ApiError, not_found
from controller.api.objects import Committed, Objects, committed_objects
from controller.config import Config
from controller.errors import FfswarmError
from controller.run.fold import Fold
from controller.run.rundir import RunDir
from controller.volume import Volume

PIECE = 256 * 1024
LEFT_OUT = "ffswarm-left-out.json"


def committed(config: Config, area: Area, job: str) -> tuple[list[str], list[Committed]]:
    """(files relative to the data root, objects) of every committed item, inside the tenant's area."""
    if area.owns(job) is None:
        raise not_found(job)
    rundir = RunDir(config.data_root, job)
    if not rundir.exists():
        return [], []
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
    return sorted({o for o in outs if o.startswith(prefix)}), committed_objects(fold, area)


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


def results_zip(
    config: Config, area: Area, job: str, outputs: list[str], objects: Sequence[Committed] = (),
    store: Objects | None = None,
) -> Iterator[bytes]:  # fmt: skip
    """A ZIP of ``outputs`` (files) and ``objects`` built while it is sent."""
    vol = Volume(config.data_root)
    pipe = _Pipe()
    names: set[str] = set()
    left: list[dict[str, Any]] = []
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
                name = rel[len(area.rel) + 1 :]
                names.add(name)
                info = zipfile.ZipInfo(name, time.localtime(st.st_mtime)[:6])
                info.file_size = st.st_size
                with zf.open(info, "w", force_zip64=st.st_size > 2**31) as dst:
                    while piece := src.read(PIECE):
                        dst.write(piece)
                        yield pipe.take()
            yield pipe.take()
        for obj in objects:
            yield from _object(zf, pipe, area, job, obj, store, names, left)
        if left:
            zf.writestr(LEFT_OUT, json.dumps({"job": job, "left_out": left}, indent=1, sort_keys=True) + "\n")
    yield pipe.take()


def _object(
    zf: zipfile.ZipFile, pipe: _Pipe, area: Area, job: str, obj: Committed, store: Objects | None,
    names: set[str], left: list[dict[str, Any]],
) -> Iterator[bytes]:  # fmt: skip
    """One object into the ZIP, or a line of ``left`` saying why it is not (or not whole) there."""
    from controller.storage.errors import ObjectMissing
    from controller.storage.stream import open_object  # boto3: only for a job with objects

    def leave(reason: str, **extra: str) -> None:
        left.append({"item": obj.item, "object": obj.url, "reason": reason, **extra})

    if store is None or store.settings is None:
        leave("object storage is not configured on this API")
        return
    try:
        body = open_object(store.client(area.s3), S3Url.parse(obj.url))
    except ObjectMissing:
        leave("the object no longer exists")
        return
    except (FfswarmError, ApiError) as e:
        leave(f"it could not be read: {_said(e)}")
        return
    # a joined video is committed by the controller: its job, not an item, is what it must name
    why = body.not_committed_by(job, None if obj.video else obj.item, obj.size, obj.sha256)
    if why is not None:
        body.close()
        leave(why)
        return
    name = (area.s3.relative(obj.url) if area.s3 is not None else None) or obj.url[len(SCHEME) :]
    if name in names:  # a file output of the same name: the object goes under s3/<bucket>/<key>
        name = f"s3/{obj.url[len(SCHEME) :]}"
    names.add(name)
    info = zipfile.ZipInfo(name, time.localtime(body.modified or time.time())[:6])
    info.file_size = body.size
    try:
        with zf.open(info, "w", force_zip64=body.size > 2**31) as dst:
            for piece in body.pieces(PIECE):
                dst.write(piece)
                yield pipe.take()
    except FfswarmError as e:  # the body broke off: the entry is closed short, and said so
        leave(f"incomplete: {_said(e)}; this entry is not the whole object", entry=name)
        return
    finally:
        body.close()
    yield pipe.take()
    if obj.sha256 is not None and body.digest.hexdigest() != obj.sha256:
        leave("the bytes sent do not match the recorded sha256; this entry is not the output", entry=name)


def _said(e: Exception) -> str:
    """An error's reason without the URL (said beside it) and never the server's text (ours never holds it)."""
    reason = getattr(e, "reason", None)
    if isinstance(reason, str):
        return reason
    message = getattr(e, "message", None)
    return message if isinstance(message, str) else type(e).__name__
