"""Unpacking an uploaded ZIP archive into a job's targets, with explicit limits.

Refused, naming the entry (400): absolute names, ``..``, drive letters and backslashes, links,
devices and other special files (by the Unix mode an archiver recorded), encrypted entries, nested
archives, and an archive over the entry count, the declared or the actual unpacked bytes, or the
compression ratio. The actual bytes are counted while decompressing, so a header that lies about
sizes gains nothing. Entries that are not photos or videos (by their first bytes) are skipped and
listed as notes. Folders are recreated below the destination; nothing is written outside it.
"""

from __future__ import annotations

import os
import re
import stat
import zipfile
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from controller.api.errors import ApiError
from controller.api.uploads import safe_name, sniff

_SEGMENT = re.compile(r"[A-Za-z0-9 ._()+,@=-]{1,200}")
_CHUNK = 1024**2


@dataclass(frozen=True)
class ZipLimits:
    entries: int = 10_000
    total_bytes: int = 8 * 1024**3
    ratio: int = 200


@dataclass
class Unpacked:
    files: list[Path] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)  # "entry: why", for people
    total: int = 0


def _refuse(archive: str, entry: str, why: str) -> ApiError:
    shown = entry[:200].encode("ascii", "backslashreplace").decode()
    return ApiError(400, "bad_zip", f"{archive}: entry {shown!r} {why}", file=archive)


def _entry_path(archive: str, info: zipfile.ZipInfo) -> PurePosixPath:
    name = info.filename
    if "\\" in name or "\x00" in name or re.match(r"^[A-Za-z]:", name):
        raise _refuse(archive, name, "has a backslash, a NUL or a drive letter")
    if name.startswith("/"):
        raise _refuse(archive, name, "is an absolute path")
    parts = PurePosixPath(name).parts
    if any(p == ".." for p in parts):
        raise _refuse(archive, name, "leads out of the archive (..)")
    return PurePosixPath(*[p for p in parts if p != "."])


def unpack(zip_path: Path, archive: str, dest: Path, limits: ZipLimits) -> Unpacked:
    """Every entry checked before any is written; then each written with its bytes counted."""
    try:
        zf = zipfile.ZipFile(zip_path)
    except (zipfile.BadZipFile, OSError, ValueError):
        raise ApiError(400, "bad_zip", f"{archive}: not a readable ZIP archive", file=archive) from None
    out = Unpacked()
    with zf:
        infos = zf.infolist()
        if len(infos) > limits.entries:
            raise ApiError(
                400, "bad_zip", f"{archive}: {len(infos)} entries, the limit is {limits.entries}", file=archive
            )
        declared = 0
        plan: list[tuple[zipfile.ZipInfo, PurePosixPath]] = []
        for info in infos:
            rel = _entry_path(archive, info)
            mode = info.external_attr >> 16
            if info.create_system == 3 and mode and stat.S_IFMT(mode) not in (0, stat.S_IFREG, stat.S_IFDIR):
                kind = "a symbolic link" if stat.S_ISLNK(mode) else "a device or special file"
                raise _refuse(archive, info.filename, f"is {kind}")
            if info.flag_bits & 0x1:
                raise _refuse(archive, info.filename, "is encrypted")
            if info.is_dir() or not rel.parts:
                continue
            if info.file_size > info.compress_size * limits.ratio and info.file_size > _CHUNK:
                raise _refuse(archive, info.filename, f"unpacks more than {limits.ratio} times its packed size")
            declared += info.file_size
            if declared > limits.total_bytes:
                raise ApiError(
                    400, "bad_zip", f"{archive}: declares over {limits.total_bytes} unpacked bytes", file=archive
                )
            plan.append((info, rel))
        seen: set[str] = set()
        for info, rel in plan:
            _write_entry(zf, info, rel, archive, dest, limits, out, seen)
    return out


def _write_entry(
    zf: zipfile.ZipFile,
    info: zipfile.ZipInfo,
    rel: PurePosixPath,
    archive: str,
    dest: Path,
    limits: ZipLimits,
    out: Unpacked,
    seen: set[str],
) -> None:
    folders = [
        p if _SEGMENT.fullmatch(p) and not p.startswith(".") else safe_name(p, "", "zip")[:-4] for p in rel.parts[:-1]
    ]
    with zf.open(info) as src:
        head = src.read(16)
        found = sniff(head)
        if found is None:
            out.skipped.append(f"{info.filename[:200]}: not a photo or a video; skipped")
            return
        if found[0] == "zip":
            raise _refuse(archive, info.filename, "is an archive inside the archive (nesting is not unpacked)")
        name = safe_name(rel.name, found[1], found[0])
        target_rel = "/".join([*folders, name])
        stem, ext = os.path.splitext(target_rel)
        n = 2
        while target_rel in seen:
            target_rel, n = f"{stem}-{n}{ext}", n + 1
        seen.add(target_rel)
        target = dest.joinpath(*target_rel.split("/"))
        target.parent.mkdir(parents=True, exist_ok=True)
        written = len(head)
        with open(target, "xb") as fh:
            fh.write(head)
            while chunk := src.read(_CHUNK):
                written += len(chunk)
                out.total += len(chunk)
                if out.total > limits.total_bytes or written > max(info.compress_size * limits.ratio, _CHUNK):
                    raise _refuse(archive, info.filename, "unpacks past the limits (bytes or compression ratio)")
                fh.write(chunk)
        out.total += len(head)
        out.files.append(target)
