"""The webhook outbox: a job's deliveries kept on the shared volume until the receiver has them.

A delivery is one event of one job (``job.started``, ``job.finished``, ``job.cancelled``) for its
``on_complete.webhook``. It is written before anything is sent, one file per delivery in the run
folder (``runs/<job>/deliveries/<id>.json``, atomic, never through a link), with its id (``msg_…``),
its body (the Standard Webhooks envelope, the same bytes on every retry), every attempt (time, HTTP
status or error class; never the receiver's body), its state (pending → delivered | failed) and when
it is next due. A queue entry beside the run folders (``runs/.outbox/<job>~<id>~<generation>``) lets a
deliverer find the pending ones without reading every run folder; the record is the truth, the
entry only a pointer (written before the record, removed after it says delivered or failed).

A tenant's job that ended without a run folder (`serve` refused it, or it was cancelled while queued)
keeps its deliveries beside its owner record instead, ``tenants/.jobs/<t>/<job>.deliveries/`` (the
folder the API and `serve` both write, which runners cannot): the same records, found by the same
queue entries, listed by the same route. Such an end is queued under a stable id (``stable_id``: job,
event type and run), so a `serve` restarted half-way through refusing a job finds the delivery it
already made instead of announcing the end again under a new id. A job with a run folder queues its
``job.finished`` / ``job.cancelled`` under a stable id as well, of the run ``deliveries/run`` counts
(one more each time a job that ended runs again: ``next_run``), so a controller restarted between
queueing a job's end and recording that the run ended does not announce it twice either.

Whoever makes a delivery tries it at once (``ffswarm submit`` has no other chance); one that fails
stays pending, and `serve` runs a ``Deliverer`` (controller/run/webhooks.py) that sends due ones on
``webhooks.retry_schedule`` (controller/settings/webhooks.py), across its own restarts: a new
deliverer reads the same files.
A success is recorded before the delivery counts as done, so a controller killed between the
receiver's 2xx and that record sends the SAME id again: receivers deduplicate on ``webhook-id``.
Two deliverers (two `serve`s) never send one delivery at once: each attempt holds an exclusive
``<id>.sending`` claim beside the record. Clocks are arguments: tests never wait.
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from contract.layout import DataRootLayout, RunLayout
from controller import log
from controller import redact as shown
from controller.job.plan import ID
from controller.policy import Webhooks
from controller.run import hooks
from controller.run.delivery import DELIVERY_ID, Delivery, OutboxError, stable_id
from controller.run.rundir import RunDir
from controller.settings.webhooks import WebhookSettings
from controller.volume import DIR_MODE, Owner, UnsafePath, Volume

__all__ = ["DELIVERY_ID", "Delivery", "Outbox", "OutboxError", "stable_id"]  # the records: delivery.py

Clock = Callable[[], float]
Sender = Callable[[str, bytes, str, Webhooks, float], hooks.Attempt]  # url, body, id, policy, now
TenantOf = Callable[[str], str | None]  # the tenant whose owner record holds a job (None: none does)

FOLDER = "deliveries"
RUN_FILE = "run"  # in a job's deliveries folder: which run of the job its next end belongs to
RUNLESS = ".deliveries"  # a run-less tenant job's folder: tenants/.jobs/<t>/<job>.deliveries/
QUEUE = ".outbox"  # under runs/
MAX_RECORD = 4 * 1024**2
MAX_ATTEMPTS = 1000  # attempts a record keeps (redeliveries add more); the oldest are dropped
CLAIM_SECONDS = 120.0  # a send's claim older than this is a killed sender's
ORPHAN_SECONDS = 300.0  # a queue entry whose record never appeared (its writer was killed)


class Outbox:
    """The deliveries of the jobs under one data root."""

    def __init__(
        self,
        data_root: Path,
        settings: WebhookSettings | None = None,
        clock: Clock = time.time,
        record_tenant: TenantOf | None = None,
    ) -> None:
        self.root = data_root
        self.volume = Volume(data_root)
        self.settings = settings or WebhookSettings()
        self.clock = clock
        self.record_tenant = record_tenant or (lambda job: None)

    # -- paths ---------------------------------------------------------------------------------------
    def runless(self, job: str) -> str | None:
        """The tenant of a job that has no run folder but an owner record (refused, or cancelled while
        queued): its deliveries live beside that record. None for a job with a run folder."""
        if not ID.fullmatch(job) or os.path.lexists(RunLayout.host(self.root, job).dir):
            return None
        return self.record_tenant(job)

    def tenant(self, job: str) -> str | None:
        """Whose key signs the job's deliveries: its run folder's ``owner``, or the tenant whose
        record holds the job (a run-less job's; a run folder refused half made, before its
        ``owner`` was written); None for a CLI job."""
        return self.runless(job) or hooks.job_tenant(self.root, job) or self.record_tenant(job)

    def folder(self, job: str) -> Path:
        tenant = self.runless(job)
        if tenant is not None:
            return DataRootLayout.host(self.root).records / tenant / f"{job}{RUNLESS}"
        return RunLayout.host(self.root, job).dir / FOLDER

    def record(self, job: str, delivery: str) -> Path:
        return self.folder(job) / f"{delivery}.json"

    @property
    def queue(self) -> Path:
        return DataRootLayout.host(self.root).runs / QUEUE

    def _owner(self, job: str) -> Owner | None:
        tenant = self.runless(job)
        if tenant is None:
            return RunDir(self.root, job).controller_owner()  # the run folder's own owner and group
        try:  # the record folder's: the API (which redelivers) writes what `serve` made, and back
            st = os.stat(DataRootLayout.host(self.root).records / tenant, follow_symlinks=False)
        except OSError:
            return None
        return (st.st_uid, st.st_gid) if stat.S_ISDIR(st.st_mode) else None

    # -- records -------------------------------------------------------------------------------------
    def read(self, job: str, delivery: str) -> Delivery | None:
        if not ID.fullmatch(job) or not DELIVERY_ID.fullmatch(delivery):
            return None
        path = self.record(job, delivery)
        try:
            raw = self.volume.read(path, MAX_RECORD)
        except (OSError, UnsafePath) as e:
            raise OutboxError(f"{self.volume.rel(path)}: cannot read: {type(e).__name__}") from None
        if raw is None:
            return None
        d = Delivery.parse(raw, self.volume.rel(path))
        if (d.id, d.job) != (delivery, job):
            raise OutboxError(f"{self.volume.rel(path)}: names another delivery (moved?)")
        return d

    def write(self, d: Delivery) -> None:
        owner = self._owner(d.job)
        self.volume.mkdirs(self.folder(d.job), owner, DIR_MODE)
        self.volume.write_atomic(self.record(d.job, d.id), d.to_json(), owner)

    def deliveries(self, job: str) -> list[Delivery]:
        """The job's deliveries, oldest first; records that do not parse are skipped (logged)."""
        found: list[Delivery] = []
        for name in self._names(self.folder(job)):
            if name.endswith(".json") and DELIVERY_ID.fullmatch(name[:-5]):
                try:
                    d = self.read(job, name[:-5])
                except OutboxError as e:
                    log.get(job=job).warning("webhook_record_unreadable", error=str(e))
                    continue
                if d is not None:
                    found.append(d)
        return sorted(found, key=lambda d: (d.created, d.id))

    def _names(self, folder: Path) -> list[str]:
        """Regular files' names in ``folder`` (none when it is missing), opened without following links."""
        try:
            fd = self.volume.open_dir(folder, "listing")
        except (OSError, UnsafePath):
            return []
        try:
            names = os.listdir(fd)
            return [n for n in names if stat.S_ISREG(os.stat(n, dir_fd=fd, follow_symlinks=False).st_mode)]
        except OSError:
            return []
        finally:
            os.close(fd)

    # -- the queue -----------------------------------------------------------------------------------
    def _entry(self, d: Delivery) -> Path:
        return self.queue / f"{d.job}~{d.id}~{d.generation}"

    def _queue(self, d: Delivery) -> None:
        self.volume.mkdirs(self.queue, self._owner(d.job), DIR_MODE)
        self.volume.write_atomic(self._entry(d), json.dumps({"at": self.clock()}).encode(), self._owner(d.job))

    def entries(self) -> Iterator[tuple[str, str, int, str]]:
        """(job, delivery id, generation, entry name) of every queue entry, oldest name first."""
        for name in sorted(self._names(self.queue)):
            parts = name.split("~")
            if len(parts) == 3 and ID.fullmatch(parts[0]) and DELIVERY_ID.fullmatch(parts[1]) and parts[2].isdigit():
                yield parts[0], parts[1], int(parts[2]), name

    def unqueue(self, name: str) -> None:
        with contextlib.suppress(OSError, UnsafePath):
            self.volume.unlink(self.queue / name)

    # -- runs --------------------------------------------------------------------------------------------
    def run_number(self, job: str) -> int:
        """Which run of the job its end events belong to (``RUN_FILE``; 1 before any was counted)."""
        return max(self._counted(job), 1)

    def _counted(self, job: str) -> int:
        try:
            raw = self.volume.read(self.folder(job) / RUN_FILE, 32)
        except (OSError, UnsafePath):
            raw = None
        text = (raw or b"").decode("ascii", "replace").strip()
        return int(text) if text.isdigit() and int(text) < 10**9 else 0

    def next_run(self, job: str) -> int:
        """The job runs again after it ended (a retry): its next end events belong to a new run."""
        n = self.run_number(job) + 1
        owner = self._owner(job)
        self.volume.mkdirs(self.folder(job), owner, DIR_MODE)
        self.volume.write_atomic(self.folder(job) / RUN_FILE, f"{n}\n".encode(), owner)
        return n

    # -- making and redelivering ---------------------------------------------------------------------
    def enqueue(self, job: str, kind: str, data: Mapping[str, Any], url: str, run: str | None = None) -> Delivery:
        """A new pending delivery, due now; its id is fixed from here on. With ``run``, its id is
        ``stable_id(job, kind, run)`` and a delivery already made under it is returned as it is."""
        now = self.clock()
        if run is not None:
            made = self.read(job, stable_id(job, kind, run))
            if made is not None:
                return made
        body = json.dumps(hooks.envelope(kind, data, now))
        new = hooks.new_id() if run is None else stable_id(job, kind, run)
        d = Delivery(id=new, job=job, type=kind, url=url, body=body, created=now, next_attempt=now)
        self._queue(d)  # first: a record is never pending without an entry that finds it
        self.write(d)
        return d

    def redeliver(self, job: str, delivery: str) -> Delivery | None:
        """The delivery queued again with the same id and body, due now, its schedule from the start;
        its past attempts stay. None when the job has no such delivery."""
        d = self.read(job, delivery)
        if d is None:
            return None
        d = replace(d, state="pending", next_attempt=self.clock(), tries=0, generation=d.generation + 1)
        self.write(d)
        self._queue(d)  # a new entry name: a deliverer finishing the old generation cannot remove it
        return d

    # -- sending -------------------------------------------------------------------------------------
    @contextlib.contextmanager
    def claimed(self, d: Delivery) -> Iterator[bool]:
        """Whether this process may send ``d`` now: an exclusive ``<id>.sending`` file, removed after;
        one a killed sender left is taken over after CLAIM_SECONDS."""
        path = self.folder(d.job) / f"{d.id}.sending"
        now = self.clock()
        for _ in range(2):
            try:
                fd = self.volume.create_exclusive(path, self._owner(d.job))
            except FileExistsError:
                raw = None
                with contextlib.suppress(OSError, UnsafePath):
                    raw = self.volume.read(path, 100)
                try:
                    since = float(raw or b"")
                except ValueError:
                    since = 0.0
                if now - since < CLAIM_SECONDS:
                    yield False
                    return
                with contextlib.suppress(OSError, UnsafePath):
                    self.volume.unlink(path)
                continue
            except (OSError, UnsafePath):
                yield False
                return
            try:
                os.write(fd, str(now).encode())
            finally:
                os.close(fd)
            try:
                yield True
            finally:
                with contextlib.suppress(OSError, UnsafePath):
                    self.volume.unlink(path)
            return
        yield False

    def attempt(self, d: Delivery, policy: Webhooks, send: Sender | None = None) -> Delivery:
        """One attempt at a pending delivery, recorded; the record as it is after (unchanged when
        another sender holds it or it is no longer pending)."""
        with self.claimed(d) as mine:
            if not mine:
                return d
            current = self.read(d.job, d.id)  # as it is now: another sender may have delivered it
            if current is None or current.state != "pending":
                return current or d
            now = self.clock()
            tried = (send or _send)(current.url, current.body.encode(), current.id, policy, now)
            row: dict[str, Any] = {"at": now}
            row.update({"status": tried.status} if tried.status else {"error": tried.error})
            attempts = (*current.attempts, row)[-MAX_ATTEMPTS:]
            tries = current.tries + 1
            schedule = self.settings.retry_schedule
            if tried.ok:
                done = replace(current, state="delivered", next_attempt=None, attempts=attempts, tries=tries)
            elif tried.final or tries > len(schedule):
                done = replace(current, state="failed", next_attempt=None, attempts=attempts, tries=tries)
            else:
                done = replace(current, next_attempt=now + schedule[tries - 1], attempts=attempts, tries=tries)
            self.write(done)  # recorded before it counts as done: a crash before here resends the same id
        level = "info" if tried.ok else "warning"
        getattr(log.get(job=d.job), level)(
            "webhook_attempt", delivery=d.id, type=d.type, state=done.state, detail=shown.secrets(tried.detail)
        )
        return done


def _send(url: str, body: bytes, delivery: str, policy: Webhooks, now: float) -> hooks.Attempt:
    return hooks.send_once(url, body, delivery, policy, now)
