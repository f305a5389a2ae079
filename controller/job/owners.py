"""Whose job is it: the owner records the API writes and `serve` reads (docs/api.md#ownership).

``tenants/.jobs/<tenant>/<job>.json`` says that ``<job>`` is ``<tenant>``'s, and carries the sha256
of the job file the API put in the inbox. The record and the folders above it are the controller's
(the API runs as the controller): a runner, whose uid owns the data root and the output folders in
the tenants' areas (never an area's top: controller/job/access.py own_area), can write neither, so
it cannot make a job of its own (or a CLI user's) count as a tenant's, which would let it write
into that tenant's area. A job counts as a tenant's only when

- every folder from ``tenants/`` down is a real folder (never a link), owned by a trusted uid (root
  or the controller's, never the runner's) and writable by no one else;
- the record is a regular file with one link, owned likewise, at most 4 KiB, naming that job and
  that tenant;
- its ``sha256`` is the digest of the very bytes `serve` claimed: a file dropped under the job's
  name with other content is not the tenant's job.

Anything else reads as "no owner": the job is a CLI job, and its outputs may not enter ``tenants/``.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import stat
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from contract.layout import RECORDS, TENANT_JOB_ID, TENANTS

TENANT = re.compile(r"[a-z0-9-]{1,40}")
# an API job's id: <name>-<tenant key><8 base32> (contract/layout.py tenant_job_id), or an older <name>-<8 base32>
JOB_ID = re.compile(rf"{TENANT_JOB_ID.pattern}|[a-z0-9-]{{1,31}}-[a-z2-7]{{8}}")
SHA256 = re.compile(r"[0-9a-f]{64}")
MAX_RECORD = 4096
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


OUTPUTS = "out"  # in a tenant's area: where its API jobs' outputs go by default (out/<job>/)


def area_rel(tenant: str) -> str:
    """A tenant's area as the data root names it."""
    return f"{TENANTS}/{tenant}"


def outputs_rel(tenant: str) -> str:
    """A tenant's folder of outputs (``<area>/out``) as the data root names it: its API jobs' default
    outputs go there, and it is the one folder of the area a lane of the tenant may write."""
    return f"{area_rel(tenant)}/{OUTPUTS}"


@dataclass(frozen=True)
class JobRecord:
    job: str
    tenant: str
    created: float
    uploads: bool  # the job's inputs were uploaded (uploads/<job>/), not already in the area
    cancelled: bool = False  # taken out of the inbox before a controller claimed it
    sha256: str | None = None  # the job file handed to the inbox; None: not (yet) handed over

    def to_json(self) -> bytes:
        d = {"job": self.job, "tenant": self.tenant, "created": self.created, "uploads": self.uploads}
        return json.dumps({**d, "cancelled": self.cancelled, "sha256": self.sha256}).encode()

    @staticmethod
    def parse(data: bytes, job: str, tenant: str) -> JobRecord | None:
        """The record ``data`` holds if it is one for ``job`` of ``tenant``; None for anything else."""
        try:
            d = json.loads(data)
        except ValueError:
            return None
        if not isinstance(d, dict) or d.get("job") != job or d.get("tenant") != tenant:
            return None
        created = d.get("created")
        if not isinstance(created, int | float) or isinstance(created, bool):
            return None
        digest = d.get("sha256")
        digest = digest if isinstance(digest, str) and SHA256.fullmatch(digest) else None
        return JobRecord(job, tenant, float(created), d.get("uploads") is True, d.get("cancelled") is True, digest)


def trusted_uids(controller_uid: int, runner_uid: int | None) -> frozenset[int]:
    """Who may own the records: root, the controller and this process; never the runner."""
    return frozenset({0, controller_uid, os.geteuid()} - {runner_uid})


def _trusted(st: os.stat_result, trusted: frozenset[int]) -> bool:
    return st.st_uid in trusted and not st.st_mode & 0o022


def _open_records(data_root: Path, tenant: str, trusted: frozenset[int]) -> int | None:
    """A descriptor of ``tenants/.jobs/<tenant>/`` when every folder on the way is the controller's."""
    fd = os.open(data_root, _DIR_FLAGS)
    try:
        for part in (TENANTS, RECORDS, tenant):
            try:
                nxt = os.open(part, _DIR_FLAGS, dir_fd=fd)
            except OSError:  # missing, a link (ELOOP), a file: not a record folder
                return None
            os.close(fd)
            fd = nxt
            if not _trusted(os.fstat(fd), trusted):
                return None
        keep, fd = fd, -1
        return keep
    finally:
        if fd >= 0:
            os.close(fd)


def read_record(data_root: Path, tenant: str, job: str, trusted: frozenset[int]) -> JobRecord | None:
    """``tenant``'s record of ``job``, read as hostile (see the module's docstring); None if there is
    none that counts."""
    if not TENANT.fullmatch(tenant) or not JOB_ID.fullmatch(job):
        return None
    folder = _open_records(data_root, tenant, trusted)
    if folder is None:
        return None
    try:
        fd = os.open(f"{job}.json", _FILE_FLAGS, dir_fd=folder)
    except OSError as e:
        if e.errno not in (errno.ENOENT, errno.ELOOP, errno.EACCES, errno.ENOTDIR, errno.ENXIO):
            raise
        return None
    finally:
        os.close(folder)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1 or not _trusted(st, trusted) or st.st_size > MAX_RECORD:
            return None
        data = os.read(fd, MAX_RECORD + 1)
    finally:
        os.close(fd)
    return None if len(data) > MAX_RECORD else JobRecord.parse(data, job, tenant)


def owner_of(data_root: Path, job: str, job_file: bytes, tenants: Iterable[str], trusted: frozenset[int]) -> str | None:
    """The tenant (of ``tenants``, the configured ones) whose record claims ``job`` for exactly the
    bytes ``job_file``; None: a CLI job."""
    digest = hashlib.sha256(job_file).hexdigest()
    for tenant in tenants:
        rec = read_record(data_root, tenant, job, trusted)
        if rec is not None and rec.sha256 == digest:
            return tenant
    return None
