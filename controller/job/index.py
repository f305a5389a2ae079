"""Each tenant's jobs, newest first, read from the newest end: the job index the API lists from.

One empty file per job, named by when its owner record was made (controller/job/owners.py)::

    tenants/.jobs/<tenant>/.index/<YYYYMMDD>/<HH>/<YYYYMMDDTHHMMSS.ffffffZ>_<job>

The name is the whole entry, so accepting a job costs one file created beside its record (no fsync
of its own: the API's group commit flushes it with the record), and any number of API replicas, on
any hosts, add entries at once without a lock (each creates its own name; NFS creates are atomic,
where appends from several hosts are not). Reading a page lists the newest day's folder, its newest
hour's folder, and goes back one folder at a time only as far as the page needs: its cost follows
the page, not the tenant's history. The name doubles as the list's cursor.

The folders are the API's own (beside the records, written by no runner); still, nothing is
followed: folders are opened without links (controller/volume.py) and only names that parse are
used. Records made before the index existed are added once per tenant (`build`), marked by
``.index/.built``.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Iterable, Iterator
from datetime import UTC, datetime

from contract.layout import RECORDS, TENANTS
from controller.job.owners import JOB_ID
from controller.volume import UnsafePath, Volume

INDEX = ".index"
BUILT = ".built"
KEY = re.compile(rf"(?P<day>\d{{8}})T(?P<hour>\d{{2}})\d{{4}}\.\d{{6}}Z_(?P<job>{JOB_ID.pattern})")
_DAY = re.compile(r"\d{8}")
_HOUR = re.compile(r"\d{2}")


def key_of(job: str, created: float) -> str:
    """The entry's name: the record's creation time in UTC to the microsecond, then the job id."""
    return f"{time_key(created)}_{job}"


def time_key(t: float) -> str:
    """A time as entry names begin with it: entries created after ``t`` sort above it."""
    return datetime.fromtimestamp(t, UTC).strftime("%Y%m%dT%H%M%S.%fZ")


def job_of(key: str) -> str:
    m = KEY.fullmatch(key)
    if m is None:
        raise ValueError(f"not an index entry: {key[:80]!r}")
    return m["job"]


class JobIndex:
    """One tenant's index under a data root."""

    def __init__(self, volume: Volume, tenant: str) -> None:
        self.volume = volume
        self.rel = f"{TENANTS}/{RECORDS}/{tenant}/{INDEX}"

    def _path(self, key: str) -> str:
        m = KEY.fullmatch(key)
        if m is None:
            raise ValueError(f"not an index entry: {key[:80]!r}")
        return f"{self.rel}/{m['day']}/{m['hour']}/{key}"

    def add(self, job: str, created: float) -> None:
        """The job's entry made (already there: nothing to do); its folders made on first use."""
        path = self._path(key_of(job, created))
        for _ in range(2):
            try:
                os.close(self.volume.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600, what="indexing"))
                return
            except FileExistsError:
                return
            except FileNotFoundError:
                self.volume.mkdirs(path.rsplit("/", 1)[0])

    def remove(self, job: str, created: float) -> None:
        """The job's entry removed (gone already: nothing to do)."""
        self.remove_key(key_of(job, created))

    def remove_key(self, key: str) -> None:
        with contextlib.suppress(FileNotFoundError, UnsafePath):
            self.volume.unlink(self._path(key))

    def newest(self, before: str | None = None) -> Iterator[str]:
        """Entry names, newest first; with ``before``, only those that sort below it. Lazy: a folder
        is listed only when the entries before it have been taken."""
        m = KEY.fullmatch(before) if before is not None else None
        for day in sorted((d for d in self._names(self.rel) if _DAY.fullmatch(d)), reverse=True):
            if m is not None and day > m["day"]:
                continue
            hours = (h for h in self._names(f"{self.rel}/{day}") if _HOUR.fullmatch(h))
            for hour in sorted(hours, reverse=True):
                if m is not None and (day, hour) > (m["day"], m["hour"]):
                    continue
                names = self._names(f"{self.rel}/{day}/{hour}")
                keys = (n for n in names if n.startswith(f"{day}T{hour}") and KEY.fullmatch(n))
                yield from sorted((k for k in keys if before is None or k < before), reverse=True)

    def _names(self, rel: str) -> list[str]:
        try:
            fd = self.volume.open_dir(rel, "listing")
        except (OSError, UnsafePath):
            return []  # not made yet, or not a folder the API made: nothing listed from it
        try:
            return os.listdir(fd)
        finally:
            os.close(fd)

    def built(self) -> bool:
        try:
            with self.volume.parent(f"{self.rel}/{BUILT}", "read") as (dfd, name):
                os.stat(name, dir_fd=dfd, follow_symlinks=False)
            return True
        except (OSError, UnsafePath):
            return False

    def build(self, records: Iterable[tuple[str, float]]) -> None:
        """Entries for records made before the index (each replica may do it at once: adding is
        idempotent), then the mark that says it was done."""
        for job, created in records:
            self.add(job, created)
        self.volume.mkdirs(self.rel)
        os.close(self.volume.open(f"{self.rel}/{BUILT}", os.O_WRONLY | os.O_CREAT, 0o600, what="indexing"))
