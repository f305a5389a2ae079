"""Local photos, videos, folders and ZIP archives made into the parts of an upload (``POST /v1/jobs``
as multipart: ``source`` photos, ``targets`` files and archives, an optional ``job`` part of options).

A folder travels as one ZIP archive (stored, not compressed: photos and videos are compressed
already), built once in a temporary folder before the first try, so every try of a submit sends the
very same bytes and the API's Idempotency-Key check sees the same request. The API unpacks it into a
folder of its own, keeping the folder's layout. Only photos and videos go into it, by extension;
hidden files and anything else are left out and named in the notes. Folders are walked without
following links to other folders (no loops); files are read as the user's system shows them.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
import zipfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from controller.client.errors import ClientError, LocalFileError

PHOTOS = frozenset({".jpg", ".jpeg", ".png", ".webp", ".bmp", ".tif", ".tiff"})
VIDEOS = frozenset({".mp4", ".mov", ".mkv", ".webm", ".avi"})
MAX_NOTES = 20

PathLike = str | os.PathLike[str]


@dataclass
class Upload:
    """The parts of one upload: (form field, file name, local path), in the order they are sent."""

    parts: list[tuple[str, str, Path]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    options: bytes | None = None
    _temp: tempfile.TemporaryDirectory[str] | None = None

    def body(self, files: contextlib.ExitStack) -> Mapping[str, Any]:
        """httpx's arguments for one try: every file opened afresh (closed by ``files``)."""
        sent: list[tuple[str, tuple[str | None, Any, str | None]]] = []
        for name, filename, path in self.parts:
            try:
                opened = files.enter_context(path.open("rb"))
            except OSError as e:
                raise LocalFileError(f"{name} {str(path)!r} cannot be read ({e.strerror})") from None
            sent.append((name, (filename, opened, "application/octet-stream")))
        data = {"job": self.options.decode()} if self.options is not None else {}
        return {"files": sent, "data": data}

    def close(self) -> None:
        if self._temp is not None:
            self._temp.cleanup()
            self._temp = None


def prepare(source: Sequence[PathLike], targets: Sequence[PathLike], options: Mapping[str, Any] | None) -> Upload:
    """The upload of ``source`` photos and ``targets`` (photos, videos, ZIP archives, folders)."""
    if not source:
        raise ClientError("an upload needs at least one source photo (source=…)")
    if not targets:
        raise ClientError("an upload needs at least one target: a photo, a video, a ZIP archive or a folder")
    for key in ("source", "targets"):
        if options and key in options:
            raise ClientError(f"options may not hold {key!r}: it comes from the files sent")
    up = Upload(options=json.dumps(dict(options)).encode() if options else None)
    try:
        for raw in source:
            path = _existing(raw, "source photo")
            if path.is_dir() or path.suffix.lower() not in PHOTOS:
                raise LocalFileError(f"source {str(raw)!r} is not a photo (one of {', '.join(sorted(PHOTOS))})")
            up.parts.append(("source", path.name, path))
        names: set[str] = set()
        for raw in targets:
            path = _existing(raw, "target")
            if path.is_dir():
                up.parts.append(("targets", _unique(f"{path.name or 'folder'}.zip", names), _zip(up, path)))
            else:
                up.parts.append(("targets", _unique(path.name, names), path))
    except BaseException:
        up.close()
        raise
    if len(up.notes) > MAX_NOTES:
        up.notes[MAX_NOTES:] = [f"… and {len(up.notes) - MAX_NOTES} more left out"]
    return up


def _existing(raw: PathLike, what: str) -> Path:
    path = Path(raw).expanduser()
    if not path.exists():
        raise LocalFileError(f"{what} {str(raw)!r} does not exist")
    return path.resolve()


def _unique(name: str, taken: set[str]) -> str:
    stem, ext = os.path.splitext(name)
    n = 2
    while name in taken:
        name, n = f"{stem}-{n}{ext}", n + 1
    taken.add(name)
    return name


def _zip(up: Upload, folder: Path) -> Path:
    """The folder's photos and videos as one stored ZIP in the upload's temporary folder."""
    if up._temp is None:
        up._temp = tempfile.TemporaryDirectory(prefix="ffswarm-upload-")
    archive = Path(up._temp.name) / f"{len(up.parts)}.zip"
    count = 0
    with zipfile.ZipFile(archive, "w", compression=zipfile.ZIP_STORED, strict_timestamps=False) as zf:
        for top, dirs, files in os.walk(folder):  # links to folders are not followed
            dirs[:] = sorted(d for d in dirs if not d.startswith("."))
            for name in sorted(files):
                path = Path(top, name)
                rel = path.relative_to(folder).as_posix()
                if name.startswith(".") or path.suffix.lower() not in PHOTOS | VIDEOS or not path.is_file():
                    up.notes.append(f"{folder.name}/{rel}: not a photo or video; not sent")
                    continue
                zf.write(path, rel)
                count += 1
    if count == 0:
        raise LocalFileError(f"folder {str(folder)!r} holds no photo or video")
    return archive
