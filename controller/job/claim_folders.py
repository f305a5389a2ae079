"""Folder claims, the second form of claim (controller/job/claims.py): a job writing many outputs into
one folder claims them with one file, ``runs/.claims/dirs/<sha256 of the folder>/<job>``, a JSON
record ``{"job", "folder", "names"}`` of the names it writes there. Read back as hostile (through
controller/volume.py): a record whose job or folder is not the one its path stands for binds nothing."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
from collections.abc import Iterable

from contract.layout import RUNS
from controller.volume import Owner, UnsafePath, Volume

DIRS = f"{RUNS}/.claims/dirs"
JOB_ID = re.compile(r"[a-z0-9-]{1,80}")
LIMIT = 256 * 1024**2  # bytes of one record (and of a job's claims index) read at most


def key(rel: str) -> str:
    """The name a path (an output, or a folder) is claimed under."""
    return hashlib.sha256(rel.encode()).hexdigest()


def join(folder: str, name: str) -> str:
    return f"{folder}/{name}" if folder else name


def by_folder(outputs: Iterable[str]) -> dict[str, set[str]]:
    """Outputs (relative to the data root) as the names in each folder."""
    found: dict[str, set[str]] = {}
    for rel in outputs:
        folder, _, name = rel.rpartition("/")
        found.setdefault(folder, set()).add(name)
    return found


def path_of(folder: str, job: str) -> str:
    return f"{DIRS}/{key(folder)}/{job}"


def read(vol: Volume, folder: str, job: str) -> set[str] | None:
    """The names ``job``'s folder claim on ``folder`` lists; None: it has none (or not a valid one)."""
    try:
        record = json.loads(vol.read(path_of(folder, job), LIMIT) or b"null")
        names = record["names"]
        if record["job"] != job or record["folder"] != folder or not isinstance(names, list):
            return None
    except (UnsafePath, OSError, ValueError, TypeError, KeyError):
        return None
    return {n for n in names if isinstance(n, str)}


def read_all(vol: Volume, folder: str) -> list[tuple[str, set[str], float | None]]:
    """Every job's folder claim on ``folder``: (job, the names it claims there, when it was written)."""
    try:
        fd = vol.open_dir(f"{DIRS}/{key(folder)}", "reading claims")
    except (UnsafePath, OSError):
        return []  # none (the common case), or not a folder the controller made: nothing there binds
    try:
        with os.scandir(fd) as entries:
            jobs = [e.name for e in entries if JOB_ID.fullmatch(e.name)]
    finally:
        os.close(fd)
    found = []
    for job in jobs:
        names = read(vol, folder, job)
        if names is not None:
            found.append((job, names, vol.mtime(path_of(folder, job))))
    return found


def write(vol: Volume, folder: str, job: str, names: set[str], owner: Owner | None, durable: bool = True) -> None:
    """``job``'s folder claim on ``folder``, listing ``names`` (replacing what it listed before)."""
    path = path_of(folder, job)
    if owner is not None:
        vol.mkdirs(DIRS, owner, enforce=True)
    vol.mkdirs(path.rpartition("/")[0], owner, enforce=owner is not None)
    record = {"job": job, "folder": folder, "names": sorted(names)}
    vol.write_atomic(path, json.dumps(record).encode(), owner, durable=durable)


def remove(vol: Volume, folder_key: str, job: str) -> int:
    """Remove ``job``'s folder claim under ``folder_key`` (a folder's ``key``); how many names it listed."""
    path = f"{DIRS}/{folder_key}/{job}"
    with contextlib.suppress(OSError, UnsafePath, ValueError, TypeError, KeyError):
        names = json.loads(vol.read(path, LIMIT) or b"")["names"]
        vol.unlink(path)
        return len(names)
    return 0
