"""`ffswarm serve`: the controller as a long-running service that runs job files dropped in an inbox.

Ops teams hand work over by dropping files, not by holding a terminal open. The inbox lives on the
shared volume (`<data_root>/inbox/`), so any manager can take over. A file moves through:

    inbox/NAME.yaml → inbox/running/NAME.<uuid>.yaml → inbox/done/NAME.yaml
                                                     ↘ inbox/failed/NAME.yaml + NAME.yaml.reason.txt

The inbox is read as a hostile folder (controller/run/inbox.py): only regular files are taken, a
claim never replaces a file, and each claim carries a lease this controller renews with its
heartbeat. While it serves, the controller also rewrites a heartbeat beside the inbox (handover.py),
so that `ffswarm submit --detach` knows someone will run the file it drops there.

A file the HTTP API handed over (controller/api/submit.py) is a tenant's job when the API's owner
record claims it for exactly the bytes claimed (controller/job/owners.py): it is resolved inside
that tenant's area alone, and its run folder records ``owner``. Any other file is a CLI job, whose
outputs never enter ``tenants/``.

The controller keeps no state of its own: a file in running/ whose lease has expired (its controller
is gone) is taken over and submitted again, and submitting a job whose run folder exists continues
it (jobs.py): committed items are not redone and chunk services that are still alive are adopted by
their labels. A live controller's files are never taken over.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from contract.layout import RunLayout
from controller import log
from controller.config import Config
from controller.errors import CapacityError, FfswarmError, JobFileError
from controller.job import owners
from controller.job.paths import relative_text
from controller.redact import printable
from controller.run import usecase
from controller.run.handover import HEARTBEAT_SECONDS, HeartbeatFile
from controller.run.inbox import JOB_SUFFIXES, SETTLE_SECONDS, Inbox, original_name
from controller.run.jobs import PreparedJob
from controller.run.metrics import Metrics
from controller.run.report import summary
from controller.run.rundir import RunDir, read_nofollow
from controller.run.shares import Share, ShareBook
from controller.run.usecase import SinkFactory
from controller.swarm.docker import DockerSwarm

__all__ = ["JOB_SUFFIXES", "SETTLE_SECONDS", "Inbox", "Outcome", "Server", "run_job_file"]

MAX_STARTS = 3  # a file still in running/ after this many controller starts is moved to failed/
RETRY_SECONDS = 30.0  # a job the swarm could not take (exit 69) waits this long in the inbox, then runs again
MAX_REASON_CHARS = 20_000


def kind(e: FfswarmError) -> str:
    """The error's kind as reason files name it (one or many job-file errors are a JobFileError)."""
    return "JobFileError" if isinstance(e, JobFileError) else type(e).__name__


@dataclass(frozen=True)
class Outcome:
    ok: bool
    reason: str | None
    retry: bool = False  # the swarm could not take the job now (exit 69): try again later, not failed/


def run_job_file(config: Config, path: Path, metrics: Metrics, book: ShareBook | None = None) -> Outcome:
    """One job file, start to report, as `ffswarm submit FILE` would run it (continuing its run).
    The reason names paths relative to the data root (inbox/running/NAME.yaml, hidden/in/a.jpg), as
    whoever dropped the file knows them: neither this host's data root nor the container's /data.
    ``book``: the GPU share book of the jobs this `serve` runs at once (controller/run/shares.py)."""
    outcome = _run_job_file(config, path, metrics, book)
    if outcome.reason is None:
        return outcome
    reason = printable(relative_text(outcome.reason, config.data_root), newlines=True)[:MAX_REASON_CHARS]
    return dataclasses.replace(outcome, reason=reason)


def job_owner(config: Config, claimed: Path) -> str | None:
    """The tenant whose API job ``claimed`` is (its owner record names these very bytes), or None:
    a CLI job."""
    if not config.tenants:
        return None
    data = read_nofollow(claimed, config.policy.limits.job_file + 1)
    if data is None:
        return None
    job = os.path.splitext(original_name(claimed.name))[0]
    trusted = owners.trusted_uids(config.controller_ids()[0], int(config.runner_uid_gid().split(":")[0]))
    return owners.owner_of(config.data_root, job, data, sorted(config.tenants), trusted)


def record_owner(tenant: str) -> SinkFactory:
    """Writes ``owner`` into the job's run folder (the controller's file) as soon as it exists."""

    def make(rundir: RunDir, job: object) -> Callable[..., None]:
        rundir.write_file(rundir.layout.owner, f"{tenant}\n".encode())
        return lambda event, **fields: None

    return make


class SwarmGpus:
    """The GPUs the swarm advertises on usable nodes, asked at most every ``every`` seconds; the last
    answer while the engine does not answer (None before any: then only quotas limit)."""

    def __init__(self, config: Config, every: float = 10.0) -> None:
        self.config = config
        self.every = every
        self._at = -float("inf")
        self._value: int | None = None
        self._lock = threading.Lock()

    def __call__(self) -> int | None:
        with self._lock:
            if time.monotonic() - self._at >= self.every:
                self._at = time.monotonic()
                try:
                    nodes = DockerSwarm(self.config.docker_host).nodes()
                    self._value = sum(n.gpus for n in nodes if n.usable)
                except FfswarmError as e:
                    log.get(component="serve").warning("gpus_not_counted", error=str(e))
            return self._value


def join_book(config: Config, book: ShareBook | None, job: PreparedJob, tenant: str | None) -> Share | None:
    """The job's seat in the share book, when it reserves GPUs: its tenant's weight and quota.gpus."""
    gpus = job.spec.resources.gpus
    if book is None or gpus == 0:
        return None
    t = config.tenants.get(tenant) if tenant is not None else None
    return book.join(job.job_id, tenant, t.weight if t else 1, t.quota.gpus if t else None, gpus)


def _run_job_file(config: Config, path: Path, metrics: Metrics, book: ShareBook | None) -> Outcome:
    share: Share | None = None
    try:
        tenant = job_owner(config, path)
        # a bad file is refused before Docker is asked; a tenant's job is resolved inside its area
        job = usecase.one_job(config, path) if tenant is None else usecase.one_job(config, path, tenant=tenant)
        backend = DockerSwarm(config.docker_host)
        backend.check_manager()
        sinks: list[SinkFactory] = [lambda rundir, job: metrics.sink(rundir, job.spec.resources.gpus)]
        if tenant is not None:
            sinks.insert(0, record_owner(tenant))
        share = join_book(config, book, job, tenant)
        report = usecase.run(config, backend, job, sinks, share=share)
    except CapacityError as e:
        return Outcome(False, f"{kind(e)} (exit {e.exit_code}): {e}", retry=True)
    except FfswarmError as e:
        return Outcome(False, f"{kind(e)} (exit {e.exit_code}): {e}")
    except Exception as e:  # one job's failure must not stop the controller or its other jobs
        # the traceback goes to the controller's log, never into the reason file beside the job
        log.get(component="serve", file=path.name).exception("job_file_internal_error")
        return Outcome(False, f"internal error (exit 70): {type(e).__name__}; the controller's log has the details")
    finally:
        if share is not None:
            share.leave()
    if report.exit_code() == 0:
        return Outcome(True, None)
    return Outcome(False, "\n".join(summary(report, RunLayout.relative(report.job).report, max_failures=50)))


class Server:
    """The inbox loop: claims up to `concurrent_jobs` files, each supervised in its own thread.

    Job threads are daemons: stopping the controller (SIGTERM, a crash) leaves chunk services
    running, and the next controller adopts them, which is what a restart must do anyway.
    """

    def __init__(
        self,
        config: Config,
        inbox: Inbox,
        metrics: Metrics,
        concurrent_jobs: int = 1,
        poll: float = 1.0,
        run: Callable[[Config, Path, Metrics], Outcome] | None = None,
        retry_after: float = RETRY_SECONDS,
        heartbeat_every: float = HEARTBEAT_SECONDS,
    ) -> None:
        if concurrent_jobs < 1:
            raise ValueError("concurrent_jobs must be at least 1")
        self.config = config
        self.inbox = inbox
        if inbox.max_bytes is None:
            inbox.max_bytes = config.policy.limits.job_file
        inbox.interval = heartbeat_every  # leases are renewed with the heartbeat
        self.metrics = metrics
        self.concurrent_jobs = concurrent_jobs
        self.poll = poll
        # GPU slots shared between the jobs running at once, by tenant weight (controller/run/shares.py)
        self.book = ShareBook(SwarmGpus(config))
        self.run = run or functools.partial(run_job_file, book=self.book)
        self.retry_after = retry_after
        self.stop = threading.Event()
        self._active: dict[str, threading.Thread] = {}
        self.heartbeat = HeartbeatFile(inbox.path, concurrent_jobs, heartbeat_every)
        self.log = log.get(component="serve", inbox=str(inbox.path))

    def start_job(self, claimed: Path) -> None:
        starts = self.inbox.count_start(claimed)
        if starts > MAX_STARTS:
            reason = (
                f"the controller stopped {starts - 1} times while running this file (crashed or was "
                f"killed, e.g. out of memory); it is not resumed again. Submit it again once the cause is fixed."
            )
            moved = self.inbox.finish(claimed, False, reason)
            self.log.error("job_file_given_up", file=claimed.name, starts=starts - 1, moved_to=str(moved))
            return

        def work() -> None:
            self.log.info("job_file_started", file=claimed.name)
            outcome = self.run(self.config, claimed, self.metrics)
            if outcome.retry:
                self.inbox.put_back(claimed, self.retry_after)
                self.log.warning(
                    "job_file_deferred", file=claimed.name, reason=outcome.reason, seconds=self.retry_after
                )
                return
            moved = self.inbox.finish(claimed, outcome.ok, outcome.reason)
            self.log.info("job_file_finished", file=claimed.name, ok=outcome.ok, moved_to=str(moved))

        thread = threading.Thread(target=work, name=f"job-{claimed.name}", daemon=True)
        self._active[claimed.name] = thread
        thread.start()

    def _beat(self) -> None:
        """Tell `submit --detach` this inbox is served, and renew the lease of every file this
        controller runs; a failed write must not stop the controller."""
        try:
            self.heartbeat.beat(sum(t.is_alive() for t in self._active.values()))
        except OSError as e:
            self.log.warning("heartbeat_not_written", file=str(self.heartbeat.path), error=str(e))
        for name, thread in list(self._active.items()):
            if not thread.is_alive():
                continue
            try:
                if not self.inbox.renew(self.inbox.running / name):
                    self.log.error("job_file_lease_lost", file=name)
            except OSError as e:
                self.log.warning("lease_not_renewed", file=name, error=e.strerror or type(e).__name__)

    def serve_forever(self) -> None:
        self.inbox.ensure()
        self.heartbeat.clear_stale()
        self._beat()
        try:
            self._loop()
        finally:  # a clean stop (SIGTERM, Ctrl-C) says so at once; a killed one goes stale
            self.heartbeat.remove()

    def _resume_expired(self) -> int:
        """Files in running/ whose controller is gone (lease expired): taken over and continued
        (beyond MAX_STARTS, once, to fail them); a live controller's are left alone."""
        taken = [p for p in self.inbox.expired(time.time()) if p.name not in self._active]
        for claimed in taken:
            self.log.info("job_file_resumed", file=claimed.name)
            self.start_job(claimed)
        return len(taken)

    def _loop(self) -> None:
        resumed = self._resume_expired()
        self.log.info("serving", concurrent_jobs=self.concurrent_jobs, resumed=resumed)
        beat_due = time.monotonic() + self.heartbeat.interval
        while not self.stop.is_set():
            if time.monotonic() >= beat_due:
                self._beat()
                self._resume_expired()
                beat_due = time.monotonic() + self.heartbeat.interval
            self._active = {k: t for k, t in self._active.items() if t.is_alive()}
            free = self.concurrent_jobs - len(self._active)
            for path in self.inbox.waiting(time.time(), free) if free > 0 else ():  # a full server lists nothing
                if free <= 0:
                    break
                taken = self.inbox.claim(path)  # None: vanished, taken by another, or refused to failed/
                if taken is not None:
                    self.start_job(taken)
                    free -= 1
            self.stop.wait(min(self.poll, max(beat_due - time.monotonic(), 0.05)))
