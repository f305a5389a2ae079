"""One controller per job: a lease in the run folder (``lease.json``, contract/layout.py).

Whoever runs a job (submit, resume, retry, serve: all through controller/run/usecase.py) holds its
lease (controller/run/lease.py: who, on which host, since when, and a heartbeat it renews every
``interval`` seconds while it runs the job). A second controller that finds a live lease refuses
(exit 69) and says who runs the job; an expired lease (its controller was killed, its machine lost,
or it was a process on this machine that has ended) is taken over. ``ffswarm status`` reads it to tell
"running (controller on HOST)" from "stopped". The run folder belongs to the runner's uid, so the
lease is read back as hostile input: one that does not parse, or whose heartbeat lies in the future,
counts as none.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from controller.errors import CapacityError
from controller.run import lease as leases
from controller.run.lease import Owner, Record, rfc3339
from controller.run.rundir import RunDir

__all__ = ["INTERVAL", "Lease", "LeaseHeld", "Record", "held", "holder", "read", "rfc3339"]

INTERVAL = 5.0  # seconds between heartbeats
TAKE_WAIT = 10.0  # seconds acquire() waits for another controller's take-over to show before "try again"


class LeaseHeld(CapacityError):
    """Another controller runs the job (exit 69, as for any capacity the swarm lacks)."""

    def __init__(self, job: str, holder: Record) -> None:
        self.holder = holder
        super().__init__(
            f"job {job} is being run by {holder.owner.label} on {holder.owner.host} since {holder.since()}; "
            f"`ffswarm status {job} --follow` to watch it"
        )


def read(rundir: RunDir, now: float | None = None) -> Record | None:
    """The lease as recorded (alive or not); None when there is none that can be trusted."""
    return leases.read(rundir.layout.lease, time.time() if now is None else now)


def holder(rundir: RunDir, now: float | None = None) -> Record | None:
    """The controller running the job now: a live lease, else None."""
    t = time.time() if now is None else now
    record = read(rundir, t)
    return record if record is not None and not record.expired(t, Owner.me()) else None


class Lease:
    """The lease of one job for this process: acquire(), renew() (a thread does it), release()."""

    def __init__(self, rundir: RunDir, interval: float = INTERVAL, clock: Callable[[], float] = time.time) -> None:
        self.rundir = rundir
        self.interval = interval
        self.clock = clock
        self.owner = Owner.me()
        self.started = clock()
        self.lost = False  # another controller took it over (ours had expired)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def path(self) -> Path:
        return self.rundir.layout.lease

    def _record(self) -> Record:
        return Record(self.owner, self.clock(), self.interval, started=self.started)

    def acquire(self) -> None:
        """Take the lease, or raise LeaseHeld naming who holds it."""
        deadline = time.monotonic() + TAKE_WAIT
        pause = 0.005
        while True:  # each round: another controller created, took or is taking the lease meanwhile
            if leases.create(self.path, self._record()):
                return
            now = self.clock()
            current = read(self.rundir, now)
            if current is not None and current.owner.id == self.owner.id:
                return
            if current is not None and not current.expired(now, self.owner):
                raise LeaseHeld(self.rundir.job, current)
            if leases.take_over(self.path, current, self._record(), now):  # expired or unreadable
                return
            if time.monotonic() >= deadline:
                raise CapacityError(f"job {self.rundir.job}: its lease could not be taken; try again")
            time.sleep(pause)  # another taker is between its mark and its write: its lease shows next round
            pause = min(pause * 2, 0.25)

    def renew(self) -> bool:
        """A new heartbeat; False (and no write) once another controller holds the lease."""
        if not leases.renew(self.path, self.owner, self.clock(), self.interval):
            self.lost = True
            return False
        return True

    def release(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.interval + 1)
        leases.release(self.path, self.owner, self.clock())

    def start_heartbeat(self) -> None:
        def beat() -> None:
            while not self._stop.wait(self.interval):
                try:
                    if not self.renew():
                        return
                except OSError:
                    continue  # the volume hiccupped: the next beat tries again, well before expiry

        self._thread = threading.Thread(target=beat, name=f"lease-{self.rundir.job}", daemon=True)
        self._thread.start()


@contextlib.contextmanager
def held(rundir: RunDir, interval: float = INTERVAL) -> Iterator[Lease]:
    """The job's lease for the length of the block, renewed meanwhile, released at its end (also on
    Ctrl-C or an error: `status` then says no controller runs the job)."""
    lease = Lease(rundir, interval)
    lease.acquire()
    lease.start_heartbeat()
    try:
        yield lease
    finally:
        lease.release()
