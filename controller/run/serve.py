"""`ffswarm serve`: the controller as a long-running service that runs job files dropped in an inbox.

Ops teams hand work over by dropping files, not by holding a terminal open. The inbox lives on the
shared volume (`<data_root>/inbox/`), so any manager can take over. A file moves through:

    inbox/NAME.yaml → inbox/running/NAME.yaml → inbox/done/NAME.yaml
                                              ↘ inbox/failed/NAME.yaml + NAME.yaml.reason.txt

While it serves, the controller rewrites a heartbeat beside the inbox (handover.py), so that
`ffswarm submit --detach` knows someone will run the file it drops there.

The claim is a rename (atomic on one filesystem): two controllers never run the same file. The
controller keeps no state of its own: after a restart every file still in running/ is submitted
again, and submitting a job whose run folder exists continues it (jobs.py): committed items are not
redone and chunk services that are still alive are adopted by their labels.
"""

from __future__ import annotations

import dataclasses
import os
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from contract.layout import RunLayout
from controller import log
from controller.config import Config
from controller.errors import CapacityError, FfswarmError, JobFileError
from controller.job.paths import relative_text
from controller.run import jobs as jobs_mod
from controller.run.handover import HEARTBEAT_SECONDS, HeartbeatFile
from controller.run.metrics import Metrics
from controller.run.report import exit_code
from controller.swarm.docker import DockerSwarm

JOB_SUFFIXES = (".yaml", ".yml")
RETRY_SECONDS = 30.0  # a job the swarm could not take (exit 69) waits this long in the inbox, then runs again
SETTLE_SECONDS = 1.0  # a file younger than this may still be being written (write NAME.tmp, then rename)


@dataclass(frozen=True)
class Inbox:
    path: Path

    @property
    def running(self) -> Path:
        return self.path / "running"

    @property
    def done(self) -> Path:
        return self.path / "done"

    @property
    def failed(self) -> Path:
        return self.path / "failed"

    def ensure(self) -> None:
        for d in (self.path, self.running, self.done, self.failed):
            d.mkdir(parents=True, exist_ok=True)

    def waiting(self, now: float) -> list[Path]:
        """Job files ready to claim, oldest first; hidden and half-written files are left alone."""
        files = [
            p
            for p in self.path.iterdir()
            if p.is_file()
            and p.suffix in JOB_SUFFIXES
            and not p.name.startswith(".")
            and now - p.stat().st_mtime >= SETTLE_SECONDS
        ]
        return sorted(files, key=lambda p: (p.stat().st_mtime, p.name))

    def claim(self, path: Path) -> Path | None:
        target = self.running / path.name
        try:
            path.rename(target)
        except FileNotFoundError:  # another controller claimed it first
            return None
        return target

    def put_back(self, claimed: Path, delay: float) -> Path:
        """Return a claimed file to the inbox, not to be picked again for `delay` seconds (its mtime is
        set into the future: `waiting` only takes files that have settled)."""
        target = self.path / claimed.name
        claimed.rename(target)
        later = time.time() + delay
        os.utime(target, (later, later))
        return target

    def finish(self, claimed: Path, ok: bool, reason: str | None) -> Path:
        folder = self.done if ok else self.failed
        target = folder / claimed.name
        if target.exists():  # the same file name ran before: keep both
            target = folder / f"{claimed.stem}.{time.strftime('%Y%m%dT%H%M%S')}{claimed.suffix}"
        if reason is not None:
            (folder / f"{target.name}.reason.txt").write_text(reason.rstrip() + "\n")
        claimed.rename(target)
        return target


@dataclass(frozen=True)
class Outcome:
    ok: bool
    reason: str | None
    retry: bool = False  # the swarm could not take the job now (exit 69): try again later, not failed/


def run_job_file(config: Config, path: Path, metrics: Metrics) -> Outcome:
    """One job file, start to report, as `ffswarm submit FILE` would run it (continuing its run).
    The reason names paths relative to the data root (inbox/running/NAME.yaml, hidden/in/a.jpg), as
    whoever dropped the file knows them: neither this host's data root nor the container's /data."""
    outcome = _run_job_file(config, path, metrics)
    if outcome.reason is None:
        return outcome
    return dataclasses.replace(outcome, reason=relative_text(outcome.reason, config.data_root))


def _run_job_file(config: Config, path: Path, metrics: Metrics) -> Outcome:
    try:
        prepared = jobs_mod.prepare(config, [path], new=False)
        if len(prepared) != 1:
            raise JobFileError(str(path), None, f"an inbox file holds one job, found {len(prepared)}")
        job = prepared[0]
        backend = DockerSwarm(config.docker_host)
        backend.check_manager()
        image = backend.resolve_image(job.spec.image or config.image)
        rundir = jobs_mod.start_run(config, job, image)
        sink = metrics.sink(rundir, job.spec.resources.gpus)
        report = jobs_mod.supervise(config, backend, job, rundir, image, sink)
    except CapacityError as e:
        return Outcome(False, f"{type(e).__name__} (exit {e.exit_code}): {e}", retry=True)
    except FfswarmError as e:
        return Outcome(False, f"{type(e).__name__} (exit {e.exit_code}): {e}")
    except Exception as e:  # one job's failure must not stop the controller or its other jobs
        return Outcome(False, f"internal error: {e}\n{traceback.format_exc()}")
    c = report["counts"]
    summary = (
        f"job {report['job']}: {c['ok']} ok, {c['no_face']} without a face, {c['failed']} failed of {c['items']} "
        f"items; report: {RunLayout.relative(report['job']).report}"
    )
    if exit_code(report) == 0:
        return Outcome(True, None)
    lines = [summary, *(f"failed: {f['input']}: {f['reason']}" for f in report["failures"][:50])]
    return Outcome(False, "\n".join(lines))


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
        run: Callable[[Config, Path, Metrics], Outcome] = run_job_file,
        retry_after: float = RETRY_SECONDS,
        heartbeat_every: float = HEARTBEAT_SECONDS,
    ) -> None:
        if concurrent_jobs < 1:
            raise ValueError("concurrent_jobs must be at least 1")
        self.config = config
        self.inbox = inbox
        self.metrics = metrics
        self.concurrent_jobs = concurrent_jobs
        self.poll = poll
        self.run = run
        self.retry_after = retry_after
        self.stop = threading.Event()
        self._active: dict[str, threading.Thread] = {}
        self.heartbeat = HeartbeatFile(inbox.path, concurrent_jobs, heartbeat_every)
        self.log = log.get(component="serve", inbox=str(inbox.path))

    def start_job(self, claimed: Path) -> None:
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
        """Tell `submit --detach` this inbox is served; a failed write must not stop the controller."""
        try:
            self.heartbeat.beat(sum(t.is_alive() for t in self._active.values()))
        except OSError as e:
            self.log.warning("heartbeat_not_written", file=str(self.heartbeat.path), error=str(e))

    def serve_forever(self) -> None:
        self.inbox.ensure()
        self.heartbeat.clear_stale()
        self._beat()
        try:
            self._loop()
        finally:  # a clean stop (SIGTERM, Ctrl-C) says so at once; a killed one goes stale
            self.heartbeat.remove()

    def _loop(self) -> None:
        resumed = sorted(p for p in self.inbox.running.iterdir() if p.is_file() and p.suffix in JOB_SUFFIXES)
        for claimed in resumed:  # claimed by an earlier controller: continue (beyond the limit, once)
            self.log.info("job_file_resumed", file=claimed.name)
            self.start_job(claimed)
        self.log.info("serving", concurrent_jobs=self.concurrent_jobs, resumed=len(resumed))
        beat_due = time.monotonic() + self.heartbeat.interval
        while not self.stop.is_set():
            if time.monotonic() >= beat_due:
                self._beat()
                beat_due = time.monotonic() + self.heartbeat.interval
            self._active = {k: t for k, t in self._active.items() if t.is_alive()}
            free = self.concurrent_jobs - len(self._active)
            for path in self.inbox.waiting(time.time())[: max(free, 0)]:
                taken = self.inbox.claim(path)
                if taken is not None:
                    self.start_job(taken)
            self.stop.wait(min(self.poll, max(beat_due - time.monotonic(), 0.05)))
