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
from controller.errors import CapacityError, FfswarmError
from controller.job.paths import relative_text
from controller.run import usecase
from controller.run.handover import HEARTBEAT_SECONDS, HeartbeatFile
from controller.run.metrics import Metrics
from controller.run.report import summary
from controller.swarm.docker import DockerSwarm

JOB_SUFFIXES = (".yaml", ".yml")
MAX_STARTS = 3  # a file still in running/ after this many controller starts is moved to failed/
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

    def _starts_file(self, claimed: Path) -> Path:
        return self.running / f".{claimed.name}.starts"

    def count_start(self, claimed: Path) -> int:
        """How many times a controller has started this claimed file, this time included (kept beside
        the claim: a file that kills the controller would otherwise be resumed forever)."""
        counter = self._starts_file(claimed)
        try:
            text = counter.read_text()[:20]
            before = int(text) if text.strip().isdigit() else 0
        except OSError:
            before = 0
        counter.write_text(f"{before + 1}\n")
        return before + 1

    def _forget_starts(self, claimed: Path) -> None:
        self._starts_file(claimed).unlink(missing_ok=True)

    def put_back(self, claimed: Path, delay: float) -> Path:
        """Return a claimed file to the inbox, not to be picked again for `delay` seconds (its mtime is
        set into the future: `waiting` only takes files that have settled)."""
        target = self.path / claimed.name
        claimed.rename(target)
        self._forget_starts(claimed)
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
        self._forget_starts(claimed)
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
        job = usecase.one_job(config, path)  # a bad file is refused before Docker is asked
        backend = DockerSwarm(config.docker_host)
        backend.check_manager()
        report = usecase.run(config, backend, job, [lambda rundir, job: metrics.sink(rundir, job.spec.resources.gpus)])
    except CapacityError as e:
        return Outcome(False, f"{type(e).__name__} (exit {e.exit_code}): {e}", retry=True)
    except FfswarmError as e:
        return Outcome(False, f"{type(e).__name__} (exit {e.exit_code}): {e}")
    except Exception as e:  # one job's failure must not stop the controller or its other jobs
        return Outcome(False, f"internal error: {e}\n{traceback.format_exc()}")
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
