"""A tenant's place on the shared volume, and the API's record of whose job is whose.

- ``tenants/<t>/`` is the tenant's area: its job paths are relative to it, its uploads land in
  ``uploads/<job>/`` and its default outputs in ``out/<job>/``. The API creates it as its own
  (0755: runners read the inputs below it), and ``uploads/`` too; only the folders outputs go to
  are the runner's, made by `serve` (controller/job/access.py). So a runner, even one that sees the
  whole data root (a CLI job's), cannot rename ``uploads/`` or rewrite another job's inputs.
- ``tenants/.jobs/<t>/<job>.json`` is the owner record (controller/job/owners.py), written by the
  API (never by a runner: the folders are the API's, 0755) before the job file reaches the inbox,
  with the sha256 of that job file. A job is the caller's only if the caller's own folder holds its
  record, so another tenant's job is simply not found. `serve` reads the same record, resolves the
  job inside the tenant's area and writes ``owner`` into the run folder; once that exists, it is
  what decides (docs/api.md#ownership).
- ``tenants/.jobs/<t>/.index/`` lists the tenant's jobs by creation time (controller/job/index.py):
  an entry is added with each record and removed with it, so the job list reads from its newest end.

Everything read back from here is treated as hostile: no links followed, sizes capped, fields checked.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import stat
import time
from base64 import b32encode
from dataclasses import replace
from pathlib import Path

from contract.layout import TENANTS, DataRootLayout, RunLayout, tenant_job_id
from controller import log
from controller.job import access
from controller.job.index import JobIndex
from controller.job.owners import JOB_ID, MAX_RECORD, TENANT, JobRecord
from controller.storage.area import StorageArea
from controller.volume import Volume, read_nofollow, write_atomic

__all__ = ["JOB_ID", "Area", "JobRecord", "new_job_id", "run_owner"]

_log = log.get(component="api")


def new_job_id(tenant: str, name: str) -> str:
    """``<name>-<tenant key><8 lowercase base32>`` (contract/layout.py tenant_job_id; 40 random bits):
    its run folder is in the tenant's folder of runs, where the tenant's warm runners may take its
    chunks. Checked against its run folder, the inbox and every record before it is used."""
    return tenant_job_id(tenant, name, b32encode(secrets.token_bytes(5)).decode().lower())


def run_owner(data_root: Path, job: str) -> str | None:
    """The tenant the job's run folder names (``owner``, written by `serve`); None before serve
    started it, or for a CLI job."""
    if not JOB_ID.fullmatch(job):
        return None
    data = read_nofollow(RunLayout.host(data_root, job).owner, 64)
    if data is None:
        return None
    name = data.decode("ascii", "replace").strip()
    return name if TENANT.fullmatch(name) else None


class Area:
    """One tenant's area and records under a data root."""

    def __init__(self, data_root: Path, tenant: str, s3: StorageArea | None = None) -> None:
        self.root = data_root
        self.tenant = tenant
        self.s3 = s3  # its part of the object store (tenants.<t>.s3), or None
        self.rel = f"{TENANTS}/{tenant}"  # as the data root names it
        top = DataRootLayout.host(data_root)
        self.path = top.tenants / tenant
        self.records = top.records / tenant
        self._taken = (str(top.inbox), str(top.records))  # where a job id may be in use, beside its run folder
        self.volume = Volume(data_root)
        self.index = JobIndex(self.volume, tenant)
        self._runners_said = False  # whether the log said once that the area's top is the runner's

    def ensure(self, runner: tuple[int, int] | None, keeper: tuple[int, int] | None = None) -> None:
        """Create the area and the record folders, all the API's own. The area's top is never the
        runner's (access.own_area): one an older ffswarm gave the runner (``runner``: its uid:gid)
        or a root `serve` made as root's is handed to ``keeper`` (controller_user: the API's own ids)
        when the API runs as root, else left as it is and logged once."""
        top = DataRootLayout.host(self.root)
        self._own_folder(top.tenants)
        found = access.own_area(self.root, self.rel, runner, keeper)
        if found is access.AreaTop.TAKEN_BACK:
            _log.info("api_area_taken_back", tenant=self.tenant, area=self.rel)
        elif found in (access.AreaTop.RUNNERS, access.AreaTop.ROOTS) and not self._runners_said:  # said once
            self._runners_said = True
            _log.warning(
                "api_area_runners" if found is access.AreaTop.RUNNERS else "api_area_roots",
                tenant=self.tenant,
                area=self.rel,
                why=f"the {found.value} uid owns the area's top and only root may hand it over: "
                f"chown it to the API's user ({os.geteuid()}:{os.getegid()})",
            )
        for folder in (top.records, self.records):
            self._own_folder(folder)

    def _own_folder(self, folder: Path) -> None:
        """A folder of the API's records, made if missing; refused unless the API's and writable by no one else."""
        try:
            st = os.lstat(folder)  # there already on every request but the first: no mkdir tried
        except FileNotFoundError:
            with contextlib.suppress(FileExistsError):
                os.mkdir(folder, 0o755)
            st = os.lstat(folder)
        if not stat.S_ISDIR(st.st_mode):  # a link or a file where the folder should be: never followed
            raise OSError(f"{self.root_rel(folder)} is not a folder")
        if st.st_uid not in (0, os.geteuid()) or st.st_mode & 0o022:
            # records in a folder others may write would not count for serve (controller/job/owners.py)
            raise OSError(f"{self.root_rel(folder)} is not the controller's (owner or mode)")

    def root_rel(self, path: Path) -> str:
        return path.relative_to(self.root).as_posix()

    def shown(self, path: Path) -> str:
        """A path as the tenant knows it: relative to its area."""
        return path.relative_to(self.path).as_posix()

    def id_taken(self, job: str) -> bool:
        inbox, recs = self._taken
        run = RunLayout.host(self.root, job).dir
        names = [str(run), f"{inbox}/{job}.yaml", f"{inbox}/{job}.yml", f"{inbox}/running/{job}.yaml"]
        if any(os.path.lexists(p) for p in names):
            return True
        try:
            tenants = [e.name for e in os.scandir(recs) if e.is_dir(follow_symlinks=False)]
        except OSError:
            tenants = []
        return any(os.path.lexists(f"{recs}/{t}/{job}.json") for t in tenants)

    def write_record(self, job: str, uploads: bool, sha256: str | None = None, durable: bool = True) -> JobRecord:
        """``sha256``: of the job file about to be handed to the inbox (serve checks it);
        ``durable=False``: not fsynced here (the caller flushes, controller/api/commit.py). The
        job's index entry is made after it (an entry always has its record)."""
        rec = JobRecord(job, self.tenant, time.time(), uploads, sha256=sha256)
        path = self.records / f"{job}.json"  # beneath the data root, never through a link
        try:
            self.volume.write_atomic(path, rec.to_json(), durable=durable)
        except FileNotFoundError:  # made by ensure on every request; made here for other callers
            self.volume.mkdirs(self.records)
            self.volume.write_atomic(path, rec.to_json(), durable=durable)
        try:
            self.index.add(job, rec.created)
        except BaseException:
            (self.records / f"{job}.json").unlink(missing_ok=True)
            raise
        return rec

    def remove_record(self, job: str) -> None:
        rec = self.record(job)
        if rec is not None:
            self.index.remove(job, rec.created)
        (self.records / f"{job}.json").unlink(missing_ok=True)

    def indexed(self) -> JobIndex:
        """The tenant's job index, with the records made before it existed added once."""
        if not self.index.built():
            self.index.build((job, rec.created) for job in self.jobs() if (rec := self.record(job)) is not None)
        return self.index

    def record(self, job: str) -> JobRecord | None:
        """The caller's record of ``job``; None for any other job (another tenant's, or none)."""
        if not JOB_ID.fullmatch(job):
            return None
        data = read_nofollow(self.records / f"{job}.json", MAX_RECORD)
        return None if data is None else JobRecord.parse(data, job, self.tenant)

    def owns(self, job: str) -> JobRecord | None:
        """The caller's record of ``job`` if the job is the caller's: the run folder's ``owner`` decides
        once `serve` wrote it, the owner record before that; None for any other job."""
        rec = self.record(job)
        if rec is None:
            return None
        recorded = run_owner(self.root, job)
        return rec if recorded is None or recorded == self.tenant else None

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
        return tree_bytes(self.path, stop_after)


def tree_bytes(path: Path, stop_after: int | None = None) -> int:
    """Bytes of regular files under ``path`` (links not followed); stops counting past ``stop_after``."""
    total = 0
    stack = [str(path)]
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
