"""Unpacking an uploaded ZIP archive into a job's targets, with explicit limits.

Every entry is checked before any is written. Refused, naming the archive and the entry (400):
absolute names, ``..``, drive letters and backslashes, links, devices and other special files (by
the Unix mode an archiver recorded), encrypted entries, compression methods other than stored,
deflate, bzip2 and LZMA, a name twice, folders deeper than ``ZipLimits.depth`` or names longer than
``name_bytes`` (one component) or ``path_bytes`` (the whole name), nested archives, and damage found
while reading (a bad CRC, a corrupt or truncated stream). An archive over the entry count, or whose
entries unpack to more than ``ratio`` times their packed size — each entry, and the whole archive
against its size — is refused as well, by what its headers declare and again by the bytes actually
decompressed (a header that lies gains nothing). Every unpacked byte is charged to the request's
budget before it is written (413 naming the archive when it would pass it); what the archive
declares is held in the tenant's quota ledger before its first entry is written, and any byte
beyond that as it comes. Entries that are not photos or videos (by their first bytes) are skipped
and listed as notes. Folders are recreated below the destination through descriptors
(controller/folder.py); nothing is written outside it.
"""

from __future__ import annotations

import lzma
import os
import re
import stat
import struct
import zipfile
import zlib
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import IO

from controller.api.errors import ApiError
from controller.api.uploads import Budget, safe_name, sniff, too_large
from controller.folder import Folder
from controller.volume import write_all

_SEGMENT = re.compile(r"[A-Za-z0-9 ._()+,@=-]{1,200}")
_CHUNK = 1024**2
_METHODS = (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED, zipfile.ZIP_BZIP2, zipfile.ZIP_LZMA)
# what reading a damaged archive raises (zipfile, zlib, bz2: OSError, lzma), never a server fault
_BROKEN = (zipfile.BadZipFile, zlib.error, lzma.LZMAError, EOFError, NotImplementedError, RuntimeError,
           ValueError, struct.error, OSError)  # fmt: skip


@dataclass(frozen=True)
class ZipLimits:
    """``entries``: per archive; ``total_bytes``: unpacked, all archives of a request together;
    ``ratio``: unpacked ÷ packed, per entry and per whole archive; ``depth``: folders an entry may
    sit in; ``name_bytes``: one name (UTF-8); ``path_bytes``: an entry's whole name."""

    entries: int = 10_000
    total_bytes: int = 8 * 1024**3
    ratio: int = 200
    depth: int = 8
    name_bytes: int = 255
    path_bytes: int = 1024


@dataclass
class Unpacked:
    files: list[str] = field(default_factory=list)  # relative to the folder the archive is in
    skipped: list[str] = field(default_factory=list)  # "entry: why", for people
    total: int = 0


def _shown(entry: str) -> str:
    return entry[:200].encode("ascii", "backslashreplace").decode()


def _refuse(archive: str, entry: str, why: str) -> ApiError:
    return ApiError(400, "bad_zip", f"{archive}: entry {_shown(entry)!r} {why}", file=archive)


def _whole(archive: str, why: str) -> ApiError:
    return ApiError(400, "bad_zip", f"{archive}: {why}", file=archive)


def _damaged(archive: str, entry: str, e: BaseException) -> ApiError:
    if isinstance(e, NotImplementedError):
        return _refuse(archive, entry, "uses a compression method that cannot be unpacked")
    if isinstance(e, RuntimeError):  # zipfile: a password is required
        return _refuse(archive, entry, "is encrypted")
    if "CRC" in str(e):
        return _refuse(archive, entry, "is damaged (its CRC-32 does not match)")
    return _refuse(archive, entry, "is damaged or truncated (it cannot be decompressed)")


def _entry_path(archive: str, info: zipfile.ZipInfo, limits: ZipLimits) -> PurePosixPath:
    name = info.filename
    if "\\" in name or "\x00" in name or re.match(r"^[A-Za-z]:", name):
        raise _refuse(archive, name, "has a backslash, a NUL or a drive letter")
    if name.startswith("/"):
        raise _refuse(archive, name, "is an absolute path")
    parts = PurePosixPath(name).parts
    if any(p == ".." for p in parts):
        raise _refuse(archive, name, "leads out of the archive (..)")
    if len(name.encode("utf-8", "surrogateescape")) > limits.path_bytes:
        raise _refuse(archive, name, f"has a name over {limits.path_bytes} bytes")
    if any(len(p.encode("utf-8", "surrogateescape")) > limits.name_bytes for p in parts):
        raise _refuse(archive, name, f"has a folder or file name over {limits.name_bytes} bytes")
    rel = PurePosixPath(*[p for p in parts if p != "."])
    if len(rel.parts) - (0 if info.is_dir() else 1) > limits.depth:
        raise _refuse(archive, name, f"is more than {limits.depth} folders deep")
    return rel


def _plan(
    zf: zipfile.ZipFile, archive: str, size: int, limits: ZipLimits, budget: Budget
) -> list[tuple[zipfile.ZipInfo, PurePosixPath]]:
    """The entries to unpack, each checked; nothing is written yet."""
    infos = zf.infolist()
    if len(infos) > limits.entries:
        raise _whole(archive, f"{len(infos)} entries, the limit is {limits.entries}")
    declared = 0
    names: set[PurePosixPath] = set()
    plan: list[tuple[zipfile.ZipInfo, PurePosixPath]] = []
    for info in infos:
        rel = _entry_path(archive, info, limits)
        if rel.parts and rel in names:
            raise _refuse(archive, info.filename, "appears twice in the archive")
        names.add(rel)
        mode = info.external_attr >> 16
        if info.create_system == 3 and mode and stat.S_IFMT(mode) not in (0, stat.S_IFREG, stat.S_IFDIR):
            kind = "a symbolic link" if stat.S_ISLNK(mode) else "a device or special file"
            raise _refuse(archive, info.filename, f"is {kind}")
        if info.flag_bits & 0x1:
            raise _refuse(archive, info.filename, "is encrypted")
        if info.is_dir() or not rel.parts:
            continue
        if info.compress_type not in _METHODS:
            why = f"uses compression method {info.compress_type} (stored, deflate, bzip2 and LZMA are unpacked)"
            raise _refuse(archive, info.filename, why)
        if info.file_size > info.compress_size * limits.ratio:
            raise _refuse(archive, info.filename, f"unpacks more than {limits.ratio} times its packed size")
        declared += info.file_size
        plan.append((info, rel))
    if declared > limits.total_bytes:
        raise _whole(archive, f"declares over {limits.total_bytes} unpacked bytes (api.max_zip_bytes)")
    if declared > size * limits.ratio:
        raise _whole(archive, f"unpacks more than {limits.ratio} times its size")
    what = f"archive {archive!r} (it declares {declared} unpacked bytes)"
    if declared > budget.left:
        raise too_large(budget, what, archive)
    budget.hold(budget.used + declared, what, archive)  # in the tenant's ledger at once, not entry by entry
    return plan


def unpack(folder: Folder, zip_name: str, archive: str, limits: ZipLimits, budget: Budget) -> Unpacked:
    """The archive ``zip_name`` in ``folder`` unpacked into ``folder/<its stem>/``: every entry checked
    before any is written, then each written with its bytes counted and charged to ``budget``."""
    with os.fdopen(folder.open_file(zip_name), "rb") as fh:
        size = os.fstat(fh.fileno()).st_size
        try:
            zf = zipfile.ZipFile(fh)
        except _BROKEN:
            raise _whole(archive, "not a readable ZIP archive (damaged or truncated)") from None
        with zf:
            plan = _plan(zf, archive, size, limits, budget)
            stem = os.path.splitext(zip_name)[0]
            out = Unpacked()
            with folder.sub(stem, create=True) as dest:
                writer = _Writer(zf, archive, size, limits, budget, out)
                seen: set[str] = set()
                for info, rel in plan:
                    target = writer.entry(info, rel, dest, seen)
                    if target is not None:
                        out.files.append(f"{stem}/{target}")
    return out


@dataclass
class _Writer:
    zf: zipfile.ZipFile
    archive: str
    size: int  # the archive's, for the whole-archive ratio
    limits: ZipLimits
    budget: Budget
    out: Unpacked

    def entry(self, info: zipfile.ZipInfo, rel: PurePosixPath, dest: Folder, seen: set[str]) -> str | None:
        """One entry written below ``dest``; its name there, or None when it was skipped."""
        folders = [
            p if _SEGMENT.fullmatch(p) and not p.startswith(".") else safe_name(p, "", "zip")[:-4]
            for p in rel.parts[:-1]
        ]
        try:
            src = self.zf.open(info)
        except _BROKEN as e:
            raise _damaged(self.archive, info.filename, e) from None
        with src:
            head = self._read(src, 16, info)
            found = sniff(head)
            if found is None:
                self.out.skipped.append(f"{info.filename[:200]}: not a photo or a video; skipped")
                return None
            if found[0] == "zip":
                raise _refuse(self.archive, info.filename, "is an archive inside the archive (nesting is not unpacked)")
            name = safe_name(rel.name, found[1], found[0])
            target = "/".join([*folders, name])
            stem, ext = os.path.splitext(target)
            n = 2
            while target in seen:
                target, n = f"{stem}-{n}{ext}", n + 1
            seen.add(target)
            self._write(src, head, info, dest, target.split("/"))
        return target

    def _write(self, src: IO[bytes], head: bytes, info: zipfile.ZipInfo, dest: Folder, names: list[str]) -> None:
        opened: list[Folder] = []
        try:
            here = dest
            for name in names[:-1]:
                here = here.sub(name, create=True)
                opened.append(here)
            fd = here.create(names[-1])
        except (FileExistsError, NotADirectoryError):
            raise _refuse(self.archive, info.filename, "has the name of another entry's folder or file") from None
        finally:
            for f in opened:
                f.close()
        try:
            written = 0
            chunk = head
            while chunk:
                written += len(chunk)
                if written > info.compress_size * self.limits.ratio:
                    why = f"unpacks more than {self.limits.ratio} times its packed size"
                    raise _refuse(self.archive, info.filename, why)
                if self.out.total + len(chunk) > self.size * self.limits.ratio:
                    raise _whole(self.archive, f"unpacks more than {self.limits.ratio} times its size")
                if self.out.total + len(chunk) > self.limits.total_bytes:
                    raise _whole(self.archive, f"unpacks past {self.limits.total_bytes} bytes (api.max_zip_bytes)")
                what = f"archive {self.archive!r} (entry {_shown(info.filename)!r})"
                self.budget.charge(len(chunk), what, self.archive)
                self.out.total += len(chunk)
                write_all(fd, chunk)
                chunk = self._read(src, _CHUNK, info)
        finally:
            os.close(fd)

    def _read(self, src: IO[bytes], n: int, info: zipfile.ZipInfo) -> bytes:
        try:
            return src.read(n)
        except _BROKEN as e:
            raise _damaged(self.archive, info.filename, e) from None
