"""A job's webhook events: what each carries and when it is made (the use case calls these).

``job.started`` when the job begins running (once per job: a resumed or taken-over job does not
announce itself again), ``job.finished`` or ``job.cancelled`` at each end of a run, each only when the
job's ``on_complete.webhook_events`` lists it (default: all). The data is the job's status object as
the API shows it, with its ``outcome`` (and, for a tenant's job at its end, a signed ``results_url``).
Each event goes into the job's outbox (controller/run/outbox.py) and is tried once at once; one not
delivered stays pending there for `serve`'s ``Deliverer``, which sends each when it is due.

A tenant's job can also end before it has a run folder: `serve` refuses it (``job.finished``,
``outcome: failed``, the refusal's ``reason``) or the API cancels it while it is queued
(``job.cancelled``). ``ended_before_running`` queues that end once, under a stable id, beside the
job's owner record; the deliverer sends it like any other, signed with the tenant's own key.
"""

from __future__ import annotations

import functools
import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import yaml

from controller import log, yamlio
from controller.config import Config
from controller.errors import FfswarmError
from controller.job import owners
from controller.job.settings import WEBHOOK_EVENTS, OnComplete, read_on_complete
from controller.policy import Webhooks
from controller.run import hooks, status, usage
from controller.run.outbox import ORPHAN_SECONDS, Delivery, Outbox, OutboxError, Sender
from controller.run.rundir import RunDir
from controller.volume import UnsafePath

STARTED, FINISHED, CANCELLED = WEBHOOK_EVENTS
BEFORE_RUN = "before-run"  # the run an end before any run folder belongs to (its stable id's part)


def record_tenant(config: Config, job: str) -> str | None:
    """The configured tenant whose owner record (read as hostile: controller/job/owners.py) holds ``job``."""
    try:
        runner: int | None = int(config.runner_uid_gid().split(":")[0])
    except (FfswarmError, OSError, ValueError):
        runner = None
    trusted = owners.trusted_uids(config.controller_ids()[0], runner)
    return next((t for t in sorted(config.tenants) if owners.read_record(config.data_root, t, job, trusted)), None)


def outbox(config: Config) -> Outbox:
    return Outbox(config.data_root, config.webhook_delivery, record_tenant=functools.partial(record_tenant, config))


def deliverer(config: Config, box: Outbox | None = None) -> Deliverer:
    """`serve`'s deliverer: each job's deliveries signed and checked with its own tenant's section."""
    box = box or outbox(config)
    return Deliverer(box, lambda job: config.webhooks(box.tenant(job)))


def on_complete_of(job_file: bytes) -> OnComplete | None:
    """The ``on_complete`` a job file asks for, read on its own (the rest of the file may be what was
    refused); None when it is missing or not valid."""
    try:
        data = yamlio.load(job_file)
        section = data.get("on_complete") if isinstance(data, dict) else None
        return read_on_complete(section, "on_complete") if isinstance(section, dict) else None
    except (ValueError, TypeError, FfswarmError, yaml.YAMLError):
        return None


def ended_before_running(
    config: Config, job: str, tenant: str, on_complete: OnComplete, kind: str, data: dict[str, Any]
) -> Delivery | None:
    """A tenant's job that ended with no run folder: ``kind`` queued once for `serve`'s deliverer
    (a second call returns the first delivery); None when the job's webhook does not want it or its
    host is not in the tenant's ``webhooks.allow_hosts``. Never raises for the volume: logged."""
    if not wanted(on_complete, kind) or on_complete.webhook is None:
        return None
    host = (urlsplit(on_complete.webhook).hostname or "").lower()
    if host not in config.webhooks(tenant).allow_hosts:
        log.get(job=job).warning("webhook_not_queued", type=kind, error="host not allowed")
        return None
    try:
        return outbox(config).enqueue(job, kind, {**data, "tenant": tenant}, on_complete.webhook, BEFORE_RUN)
    except (OSError, FfswarmError) as e:
        log.get(job=job).warning("webhook_not_queued", type=kind, error=type(e).__name__)
        return None


def wanted(on_complete: OnComplete, kind: str) -> bool:
    return bool(on_complete.webhook) and kind in (on_complete.webhook_events or WEBHOOK_EVENTS)


def status_data(config: Config, rundir: RunDir, ended: str | None = None) -> dict[str, Any]:
    """The job's status object; ``ended`` (finished | cancelled): as it will read once this
    controller lets go of the job (it still holds its lease while the hooks run)."""
    row = status.job_status(rundir, ending=ended is not None)
    if ended is not None:
        items = dict(row["items"])
        if ended == "cancelled":
            items["cancelled"], items["pending"] = items["cancelled"] + items["pending"], 0
        row = {**row, "phase": ended, "stage": None, "controller": None, "eta_seconds": None, "items": items}
        row["usage"] = usage.of_rundir(rundir)
        reason = (rundir.report() or {}).get("reason")
        if ended == "finished" and isinstance(reason, str):  # its controller gave up on it
            row["reason"] = reason
    tenant = hooks.job_tenant(config.data_root, rundir.job)
    row = {**row, "owner": tenant, "tenant": tenant, "outcome": status.outcome_of(row)}
    if row["outcome"] is not None and row.get("finished_at") is None:  # ending now: the report not yet read back
        finished = (rundir.report() or {}).get("finished")
        row["finished_at"] = status.utc(finished if isinstance(finished, int | float) else time.time())
    return row


def notify(
    config: Config, rundir: RunDir, on_complete: OnComplete, kind: str, data: dict[str, Any], try_now: bool = True
) -> tuple[str, str] | None:
    """``kind`` put in the job's outbox and (``try_now``) tried once at once: (DELIVERED | PENDING |
    NOT_DELIVERED, why); None when the job's webhook does not want it."""
    if not wanted(on_complete, kind):
        return None
    assert on_complete.webhook is not None
    box = outbox(config)
    try:  # an end under its run's stable id: a controller restarted half-way finds the one it queued
        run = None if kind == STARTED else f"run-{box.run_number(rundir.job)}"
        d = box.enqueue(rundir.job, kind, data, on_complete.webhook, run)
        if try_now:
            d = box.attempt(d, deliverer(config, box).policy_for(rundir.job))
    except (OSError, FfswarmError) as e:
        log.get(job=rundir.job).warning("webhook_not_queued", type=kind, error=type(e).__name__)
        return hooks.NOT_DELIVERED, f"not queued: {type(e).__name__}"
    if d.state == "delivered":
        return hooks.DELIVERED, f"HTTP {d.attempts[-1].get('status')}"
    if d.state == "failed":
        last = d.attempts[-1] if d.attempts else {}
        return hooks.NOT_DELIVERED, str(last.get("status") or last.get("error"))
    due = d.next_attempt or 0.0
    why = f"receiver not reached; retried until delivered (next at {status.utc(due)}) by `ffswarm serve`"
    log.get(job=rundir.job).warning("webhook_pending", type=kind, delivery=d.id, detail=why)
    return hooks.PENDING, why


def started(config: Config, rundir: RunDir, on_complete: OnComplete, try_now: bool = True) -> None:
    """``job.started``, unless this job has announced itself before (a resumed run, a take-over);
    without ``try_now`` only queued (a pack's jobs: `serve`'s deliverer sends them)."""
    if not wanted(on_complete, STARTED):
        return
    try:
        if any(d.type == STARTED for d in outbox(config).deliveries(rundir.job)):
            return
        data = status_data(config, rundir)
    except (OSError, FfswarmError, OutboxError) as e:
        log.get(job=rundir.job).warning("webhook_not_queued", type=STARTED, error=type(e).__name__)
        return
    notify(config, rundir, on_complete, STARTED, {**data, "phase": "running"}, try_now)


def run_again(rundir: RunDir) -> None:
    """Before a job that had ended runs again (a retry, its file submitted again): its next end is
    announced anew, under the next run's id. A job still running (or never ended) keeps its run:
    its end, if a stopped controller already queued it, is not announced twice. Never raises."""
    try:
        if status.finished(rundir):
            Outbox(rundir.data_root).next_run(rundir.job)
    except (OSError, FfswarmError) as e:
        log.get(job=rundir.job).warning("webhook_run_not_counted", error=type(e).__name__)


PolicyFor = Callable[[str], Webhooks]  # a job's webhook policy (its tenant's, or the cluster's)


@dataclass
class Deliverer:
    """Sends the due deliveries of every job under the data root; `serve` runs one (``run``)."""

    outbox: Outbox
    policy_for: PolicyFor
    send: Sender | None = None
    _skip: dict[str, float] = field(default_factory=dict)  # entry → not due before (this process's cache)

    def run_due(self) -> int:
        """One pass: every due pending delivery tried once; finished ones leave the queue. How many
        were due (one another sender holds counts, though it was not sent from here)."""
        now = self.outbox.clock()
        made = 0
        seen: set[str] = set()
        for job, delivery, generation, name in self.outbox.entries():
            seen.add(name)
            if self._skip.get(name, 0.0) > now:
                continue
            try:
                made += self._one(job, delivery, generation, name, now)
            except OutboxError as e:  # a record that is not ours: never sent, the pointer dropped
                log.get(job=job).warning("webhook_record_unreadable", error=str(e))
                self.outbox.unqueue(name)
            except (OSError, FfswarmError) as e:  # one job's folder must not stop the others
                log.get(job=job).warning("webhook_not_sent", delivery=delivery, error=type(e).__name__)
        self._skip = {k: v for k, v in self._skip.items() if k in seen}
        return made

    def _one(self, job: str, delivery: str, generation: int, name: str, now: float) -> int:
        """One queue entry looked at: its delivery tried when due; 1 when an attempt was made."""
        d = self.outbox.read(job, delivery)
        if d is None:
            if self._orphaned(name, now):
                self.outbox.unqueue(name)
            return 0
        if d.generation > generation:  # redelivered since: its newer entry stands for it
            self.outbox.unqueue(name)
            return 0
        made = 0
        if d.state == "pending" and (d.next_attempt or 0.0) <= now:
            d = self.outbox.attempt(d, self.policy_for(job), self.send)
            made = 1
        if d.state != "pending":
            self.outbox.unqueue(name)
            self._skip.pop(name, None)
        elif d.next_attempt is not None:
            self._skip[name] = d.next_attempt
        return made

    def _orphaned(self, name: str, now: float) -> bool:
        """A queue entry without its record: the job was deleted, or its maker was killed before
        writing the record (after ORPHAN_SECONDS: it never will)."""
        try:
            raw = self.outbox.volume.read(self.outbox.queue / name, 200)
            at = float(json.loads(raw or b"{}").get("at", 0.0))
        except (OSError, UnsafePath, ValueError, AttributeError):
            at = 0.0
        return now - at > ORPHAN_SECONDS

    def run(self, stop: threading.Event, every: float = 2.0) -> None:
        """Passes until ``stop`` is set; a failing pass is logged, never fatal to `serve`."""
        while not stop.is_set():
            try:
                self.run_due()
            except (OSError, FfswarmError) as e:
                log.get(component="webhooks").warning("webhook_pass_failed", error=type(e).__name__)
            stop.wait(every)
