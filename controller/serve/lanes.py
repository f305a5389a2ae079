"""Lanes: pack chunk services that linger for the next pack (``packing.linger``, issue "Many small requests").

Every chunk service pays a container start and a model load before its first photo: 36–41% of a
pack's chunk time on the dev swarm at 10 one-photo requests a second (scripts/bench_small.py). With
``packing.linger``, `serve` runs a one-chunk pack's chunk in a *lane*: a service whose runner, after
the chunk, keeps its models loaded and waits up to ``linger`` seconds for the next pack of the same
kind (runner_image/linger.py). The next such pack is handed to it through the lane's hand-off file
(contract/handoff.py) — in the run folder of the pack that started the lane, ``chunks/`` (only the
controller writes there) — instead of starting a service of its own.

A lane is a first try, never the only one: the pack's chunk runs in it as attempt n (its own results,
attempt record and log, as any attempt), and the pack then runs as always (usecase.run), which finds
that chunk done — or, if the lane's runner died, timed out or ended the attempt for a reason of its
own, runs the chunk again in a service of its own, redoing nothing committed. A lane's service has a
role and job label of its own (``lane``), so no job's supervisor adopts or removes it; `serve` removes
it when the lane has expired, at its stop, and at its start (a lane an earlier `serve` left). A lane is
not used once it is older than the pack's chunk timeout: no runner gets more than that.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from contract.exits import RunnerExit
from contract.handoff import Handoff
from contract.layout import RunLayout
from controller import log
from controller.errors import EngineUnavailable, FfswarmError
from controller.run.attempts import read_record
from controller.run.chunks import create_results_file
from controller.run.rundir import RunDir
from controller.serve.shares import Share
from controller.swarm.backend import ENDED, LOST_STATES, PENDING_STATES, SwarmBackend
from controller.swarm.docker import DockerSwarm
from controller.swarm.servicespec import LABEL_JOB, LABEL_ROLE, RunnerSettings, chunk_service

ROLE_LANE = "lane"
LABEL_LANE_OWNER = "io.ffswarm.lane-owner"  # the `serve` whose lane it is (its heartbeat's name)
MARGIN = 2.0  # seconds: a lane whose runner stops waiting sooner than this is not handed a chunk
POLL = 0.1  # seconds between looks at the attempt record while a lane runs a chunk
SWARM_POLL = 1.0  # … and at the lane's service
ENDED_FINE = {RunnerExit.OK.name, RunnerExit.ITEMS_FAILED.name}


@dataclass
class Lane:
    key: str  # what its runner loaded (packing.pack_key)
    service: str
    label: str  # its services' job label (lane-<pack>-<chunk>)
    home: RunDir  # the run folder that holds its hand-off file
    chunk: str  # its hand-off file's chunk name
    born: float
    free_until: float = 0.0  # monotonic: its runner waits for the next chunk until then
    seq: int = 0


@dataclass
class Lanes:
    """The lanes of one `serve` (thread-safe)."""

    backend: Callable[[], DockerSwarm]
    linger: float
    # how many lanes may exist at once: the swarm's GPUs (None: unknown, then one per pack at a time)
    capacity: Callable[[], int | None] = lambda: None
    owner: str = ""  # this `serve` (its heartbeat's name): every lane it starts says so
    live: Callable[[], set[str]] = set  # the owners serving now (fresh heartbeats)
    clock: Callable[[], float] = time.monotonic
    _idle: list[Lane] = field(default_factory=list)
    _busy: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def obtain(self, key: str, max_age: float, gpus: int, wait: float) -> tuple[Lane | None, bool]:
        """An idle lane of this kind (taken), or (None, True): start one — there is room for it, or an
        idle lane of another kind was retired to make room. While every GPU is held by a lane, waits up
        to ``wait`` seconds for one of them to be idle (a new lane's service would only sit pending
        behind lanes that hold their GPUs while they wait); (None, False) when none came: no lane."""
        deadline = self.clock() + wait
        while True:
            lane = self.take(key, max_age)
            if lane is not None:
                return lane, False
            total = self.capacity()
            now = self.clock()
            with self._lock:
                room = total is None or (len(self._idle) + self._busy) * max(gpus, 1) < total
                # an idle lane no pack of this kind can use (another kind, about to stop, too old)
                unusable = (
                    x for x in self._idle if x.key != key or x.free_until - now <= MARGIN or now - x.born >= max_age
                )
                other = next(unusable, None) if not room else None
                if other is not None:
                    self._idle.remove(other)
                if room or other is not None:
                    self._busy += 1
            if other is not None:
                self._retire(other)
            if room or other is not None:
                return None, True
            if self.clock() >= deadline:
                return None, False
            time.sleep(POLL)

    def take(self, key: str, max_age: float) -> Lane | None:
        """An idle lane of this kind that waits long enough and is young enough; None: start one."""
        now = self.clock()
        with self._lock:
            for lane in self._idle:
                if lane.key == key and lane.free_until - now > MARGIN and now - lane.born < max_age:
                    self._idle.remove(lane)
                    self._busy += 1
                    return lane
        return None

    def give_back(self, lane: Lane) -> None:
        lane.free_until = self.clock() + self.linger
        with self._lock:
            self._busy = max(self._busy - 1, 0)
            self._idle.append(lane)

    def _done(self, lane: Lane | None) -> None:
        """A taken lane (or the room for one) that ran no chunk to its end: removed."""
        with self._lock:
            self._busy = max(self._busy - 1, 0)
        if lane is not None:
            self._remove(lane)

    def expired(self) -> list[Lane]:
        """Idle lanes whose runners have stopped waiting (their services are removed by the caller)."""
        now = self.clock()
        with self._lock:
            gone = [lane for lane in self._idle if lane.free_until <= now]
            self._idle = [lane for lane in self._idle if lane.free_until > now]
        return gone

    def drain(self) -> list[Lane]:
        with self._lock:
            out, self._idle = self._idle, []
        return out

    def sweep(self) -> None:
        """Remove the services of expired lanes (their runners have exited by now), and lanes an
        earlier `serve` left once their runners have exited."""
        for lane in self.expired():
            self._remove(lane)
        remove_left(self.backend(), {*self.live(), self.owner})

    def close(self) -> None:
        """`serve` stops: every idle lane is told to stop and removed."""
        for lane in self.drain():
            self._retire(lane)

    def _retire(self, lane: Lane) -> None:
        lane.seq += 1
        with contextlib.suppress(OSError, FfswarmError):
            self._hand(lane, Handoff(lane.seq))  # stop waiting
        self._remove(lane)

    def _remove(self, lane: Lane) -> None:
        try:
            self.backend().remove_service(lane.service)
        except (EngineUnavailable, FfswarmError) as e:
            log.get(component="lanes").warning("lane_not_removed", service=lane.service, error=str(e))

    # -- one pack's chunk in a lane ----------------------------------------------------------------
    def run(
        self,
        key: str,
        rundir: RunDir,
        settings: RunnerSettings,
        timeout: float,
        schedule_timeout: float,
        share: Share | None = None,
    ) -> tuple[str, ...]:
        """Run a one-chunk pack's chunk in a lane (an idle one, or one started now); the chunk when
        its attempt ended there with its items recorded (some may have failed on their own, as in a
        service of its own). None returned: the pack runs its chunk as always."""
        plan = rundir.plan()
        if len(plan.chunks) != 1:
            return ()
        chunk = plan.chunks[0].id
        attempt = rundir.last_attempt(chunk) + 1
        logger = log.get(job=rundir.job, component="lanes")
        backend = self.backend()
        lane, start = self.obtain(key, timeout, settings.gpus, schedule_timeout)
        if lane is None and not start:
            return ()
        try:
            create_results_file(rundir.layout, chunk, attempt, rundir.owner)
        except OSError:
            if lane is not None:
                self.give_back(lane)
            else:
                self._done(None)
            return ()
        if share is not None:
            share.limit(1, 1, 1)  # the GPU it takes, reserved in the share book meanwhile
        manifest = str(RunLayout.container(rundir.job).manifest(chunk))
        try:
            if lane is not None:
                lane.seq += 1
                self._hand(lane, Handoff(lane.seq, manifest, attempt))
            else:
                lane = self._start(key, rundir, settings, chunk, attempt, backend)
            logger.info("lane_handed", chunk=chunk, attempt=attempt, service=lane.service, seq=lane.seq)
            ok = self._wait(lane, rundir, chunk, attempt, timeout, schedule_timeout, backend)
        except (EngineUnavailable, FfswarmError, OSError) as e:
            logger.warning("lane_failed", error=str(e))
            ok = False
        if ok and lane is not None:
            self.give_back(lane)
        else:
            self._done(lane)
        logger.info("lane_chunk", chunk=chunk, attempt=attempt, ok=ok, service=lane.service if lane else None)
        return (chunk,) if ok else ()

    def _hand(self, lane: Lane, handoff: Handoff) -> None:
        lane.home.write_file(lane.home.layout.lane_handoff(lane.chunk), handoff.to_json().encode())

    def _start(
        self, key: str, rundir: RunDir, settings: RunnerSettings, chunk: str, attempt: int, backend: SwarmBackend
    ) -> Lane:
        label = f"lane-{rundir.job}-{chunk}"[:80]
        lane = Lane(key, f"ffswarm-{label}", label, rundir, chunk, self.clock())
        self._hand(lane, Handoff(0))  # before the service: its runner finds the file from the start
        spec = chunk_service(settings, chunk, attempt)
        spec = dataclasses.replace(
            spec,
            name=lane.service,
            labels={**spec.labels, LABEL_JOB: label, LABEL_ROLE: ROLE_LANE, LABEL_LANE_OWNER: self.owner},
        )
        backend.create_service(spec)
        return lane

    def _wait(
        self,
        lane: Lane,
        rundir: RunDir,
        chunk: str,
        attempt: int,
        timeout: float,
        schedule_timeout: float,
        backend: SwarmBackend,
    ) -> bool:
        """Until the attempt's record says it ended (True when its items were recorded), its lane's
        service ended, went unscheduled for ``schedule_timeout`` or lost its node first, or
        ``timeout`` passed (False)."""
        start = self.clock()
        looked = -float("inf")
        while self.clock() - start < timeout:
            record = read_record(rundir, chunk, attempt)
            if record is not None and record.exit is not None:
                return record.exit in ENDED_FINE
            if self.clock() - looked >= SWARM_POLL:
                looked = self.clock()
                if not self._alive(lane, backend, self.clock() - start < schedule_timeout):
                    record = read_record(rundir, chunk, attempt)  # written just before it ended
                    return record is not None and record.exit in ENDED_FINE
            time.sleep(POLL)
        return False

    @staticmethod
    def _alive(lane: Lane, backend: SwarmBackend, may_wait: bool) -> bool:
        services = [s for s in backend.services(lane.label) if s.name == lane.service]
        task = services[0].latest_task() if services else None
        if task is None or task.state in PENDING_STATES:
            return bool(services) and may_wait  # not scheduled yet
        if task.state in ENDED or task.state in LOST_STATES or task.state == "rejected":
            return False
        if task.node_id:
            node = next((n for n in backend.nodes() if n.node_id == task.node_id), None)
            if node is not None and node.state != "ready":
                return False
        return True


def remove_left(swarm: DockerSwarm, live: set[str]) -> int:
    """Lane services no live `serve` owns (``live``: the owners whose heartbeat is fresh, this one
    included), and any whose runner has exited, are removed: a lane left by a `serve` that stopped or
    died would otherwise go on with a chunk that the pack's next controller runs again."""
    gone = [name for name, labels, ended in swarm.role_services(ROLE_LANE)
            if ended or labels.get(LABEL_LANE_OWNER) not in live]  # fmt: skip
    for name in gone:
        swarm.remove_service(name)
    return len(gone)
