"""A tenant's place on the shared volume, and the API's record of whose job is whose.

- ``tenants/<t>/`` is the tenant's area: its job paths are relative to it, its uploads land in
  ``uploads/<job>/`` and its default outputs in ``out/<job>/``. The API creates it, owned by the
  runner's uid:gid (runners read the inputs and write the outputs there).
- ``tenants/.jobs/<t>/<job>.json`` is the owner record, written by the API (never by a runner: the
  folder is the API's, 0755) before the job file reaches the inbox. A job is the caller's only if
  the caller's own folder holds its record, so another tenant's job is simply not found. `serve`
  reads the same record to write ``owner`` into the run folder (docs/api.md#ownership).

Everything read back from here is treated as hostile: no links followed, sizes capped, fields checked.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import stat
import time
from base64 import b32encode
from dataclasses import dataclass, replace
from pathlib import Path

from contract.layout import RUNS
from controller.run.rundir import read_nofollow, write_atomic

TENANTS = "tenants"
RECORDS = ".jobs"
JOB_ID = re.compile(r"[a-z0-9-]{1,31}-[a-z2-7]{8}")
_MAX_RECORD = 4096


def new_job_id(name: str) -> str:
    """``<name>-<8 lowercase base32>`` (40 random bits): unique across tenants in practice, and
    checked against runs/, the inbox and every record before it is used."""
    return f"{name}-{b32encode(secrets.token_bytes(5)).decode().lower()}"


@dataclass(frozen=True)
class JobRecord:
    job: str
    tenant: str
    created: float
    uploads: bool  # the job's inputs were uploaded (uploads/<job>/), not already in the area
    cancelled: bool = False  # taken out of the inbox before a controller claimed it

    def to_json(self) -> bytes:
        d = {"job": self.job, "tenant": self.tenant, "created": self.created, "uploads": self.uploads}
        return json.dumps({**d, "cancelled": self.cancelled}).encode()


class Area:
    """One tenant's area and records under a data root."""

    def __init__(self, data_root: Path, tenant: str) -> None:
        self.root = data_root
        self.tenant = tenant
        self.rel = f"{TENANTS}/{tenant}"  # as the data root names it
        self.path = data_root / TENANTS / tenant
        self.records = data_root / TENANTS / RECORDS / tenant

    def ensure(self, runner: tuple[int, int] | None) -> None:
        """Create the area (owned by the runner when this process may chown) and the record folder."""
        for folder, owner in (
            (self.root / TENANTS, None),
            (self.path, runner),
            (self.root / TENANTS / RECORDS, None),
            (self.records, None),
        ):
            try:
                os.mkdir(folder, 0o755)
                if owner is not None and os.geteuid() == 0:
                    os.chown(folder, *owner)
            except FileExistsError:
                pass
            st = os.lstat(folder)
            if not stat.S_ISDIR(st.st_mode):  # a link or a file where the area should be: never followed
                raise OSError(f"{self.root_rel(folder)} is not a folder")

    def root_rel(self, path: Path) -> str:
        return path.relative_to(self.root).as_posix()

    def shown(self, path: Path) -> str:
        """A path as the tenant knows it: relative to its area."""
        return path.relative_to(self.path).as_posix()

    def id_taken(self, job: str) -> bool:
        inbox = self.root / "inbox"
        names = [self.root / RUNS / job]
        names += [inbox / f"{job}{s}" for s in (".yaml", ".yml")] + [inbox / "running" / f"{job}.yaml"]
        if any(os.path.lexists(p) for p in names):
            return True
        recs = self.root / TENANTS / RECORDS
        try:
            tenants = [e.name for e in os.scandir(recs) if e.is_dir(follow_symlinks=False)]
        except OSError:
            tenants = []
        return any(os.path.lexists(recs / t / f"{job}.json") for t in tenants)

    def write_record(self, job: str, uploads: bool) -> JobRecord:
        rec = JobRecord(job, self.tenant, time.time(), uploads)
        write_atomic(self.records / f"{job}.json", rec.to_json())
        return rec

    def remove_record(self, job: str) -> None:
        (self.records / f"{job}.json").unlink(missing_ok=True)

    def record(self, job: str) -> JobRecord | None:
        """The caller's record of ``job``; None for any other job (another tenant's, or none)."""
        if not JOB_ID.fullmatch(job):
            return None
        data = read_nofollow(self.records / f"{job}.json", _MAX_RECORD)
        if data is None:
            return None
        try:
            d = json.loads(data)
        except ValueError:
            return None
        if not isinstance(d, dict) or d.get("job") != job or d.get("tenant") != self.tenant:
            return None
        created = d.get("created")
        if not isinstance(created, int | float) or isinstance(created, bool):
            return None
        return JobRecord(job, self.tenant, float(created), d.get("uploads") is True, d.get("cancelled") is True)

    def mark_cancelled(self, job: str) -> None:
        rec = self.record(job)
        if rec is not None:
            write_atomic(self.records / f"{job}.json", replace(rec, cancelled=True).to_json())

    def jobs(self) -> list[str]:
        """The tenant's job ids, sorted."""
        try:
            names = [e.name for e in os.scandir(self.records) if e.is_file(follow_symlinks=False)]
        except OSError:
            return []
        return sorted(n[:-5] for n in names if n.endswith(".json") and JOB_ID.fullmatch(n[:-5]))

    def stored_bytes(self, stop_after: int | None = None) -> int:
        """Bytes of regular files in the area (links not followed); stops counting past ``stop_after``."""
        total = 0
        stack = [str(self.path)]
        while stack:
            folder = stack.pop()
            try:
                entries = list(os.scandir(folder))
            except OSError:
                continue
            for e in entries:
                try:
                    if e.is_dir(follow_symlinks=False):
                        stack.append(e.path)
                    elif e.is_file(follow_symlinks=False):
                        total += e.stat(follow_symlinks=False).st_size
                except OSError:
                    continue
            if stop_after is not None and total > stop_after:
                return total
        return total
