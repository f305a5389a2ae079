"""Lanes: chunk services whose runners, after their chunk, keep their models loaded and take the
next chunk handed to them (runner_image/linger.py, contract/handoff.py) instead of exiting.

Every chunk service pays a container start and a model load before its first photo. A *lane* is a
chunk service whose runner waits up to ``linger`` seconds after each chunk for the controller to
hand it another through the lane's hand-off file (in the run folder that started it, ``chunks/``:
only the controller writes there). Three kinds, one mechanism (`Lanes`, `LaneLauncher`):

- A **submit's lanes** (``runners.linger``, `shared_lanes`): the CLI jobs of one `ffswarm submit`
  (whose runners all see the whole data root) share the lanes of their kind (`lane_key`: the job's
  service but for its name), so a later job's chunks run in the runners an earlier one left warm.
  Role ``shared-lane``, a label of their own; retired when the `submit` ends (`warmth` says which
  jobs get them, and that their chunks embed their own people: no identity step to wait for).
- A **job's own lanes** (``runners.linger``, `own_lanes`): a tenant's job with more chunks than it
  runs at once runs its next chunk in the service whose runner has just finished one of its chunks
  — same job, same mounts, same settings, so nothing is widened. They are listed under the job's own
  label with the role ``job-lane``: the job's supervisor removes them when its run ends, and a later
  run of the job (resume, retry) removes any an earlier controller left, never adopting one.
- `serve`'s lanes (``packing.linger`` for packs, ``runners.linger`` for jobs; one pool, its GPUs
  counted once): a one-chunk pack's chunk (lane_allowed) or a job's (`shares_lanes`: an inbox job,
  or a tenant's API job whose run folder is in its tenant's folder of runs and whose outputs go
  under ``<area>/out``) goes to an idle lane of its kind (`lane_key`: the same service, so the same
  tenant's mounts — no lane ever runs two tenants' photos), whichever pack or job started it. Such a
  lane has a job label and the role ``lane`` of its own, so no job's supervisor adopts or removes
  it; `serve` removes it when it has expired, at its stop, and at its start (one an earlier `serve` left).

Only a lane's service says ``FFSWARM_LANE=1`` to its runner: a chunk whose manifest names a hand-off
file but that runs in a fresh service (a retry, a resumed job) exits after its chunk as always.

The supervisor starts an attempt through a `LaneLauncher` (the launcher seam, controller/run/launch.py)
and watches it like any attempt, by its attempt record and its lane service's tasks. An attempt that
ended with its items recorded gives the lane back for the next chunk; a lane whose runner died,
timed out, went unscheduled, lost its node or ended the attempt for a reason of its own is dropped
(its service removed) and the chunk runs again in a fresh service of its own, without using the
job's retries, redoing nothing committed. A lane is not used once it is older than the chunk timeout.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import os
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol, cast

from contract.handoff import ENV_LANE, Handoff
from contract.layout import RunLayout
from controller import log
from controller.errors import EngineUnavailable, FfswarmError
from controller.run.launch import FreshLauncher, Launched, Launcher, LaunchFactory
from controller.run.rundir import RunDir
from controller.swarm.backend import SwarmBackend, clear_containers
from controller.swarm.servicespec import LABEL_JOB, LABEL_ROLE, RunnerSettings, chunk_service

ROLE_LANE = "lane"  # a pack's lane, `serve`'s
ROLE_JOB_LANE = "job-lane"  # a job's own lane, listed under the job's label
ROLE_SHARED_LANE = "shared-lane"  # a lane of one `ffswarm submit`'s jobs (a CLI job's, whole data root)
LABEL_LANE_OWNER = "io.ffswarm.lane-owner"  # the `serve` whose lane it is (its heartbeat's name)
MARGIN = 2.0  # seconds: a lane whose runner stops waiting sooner than this is not handed a chunk
POLL = 0.1  # seconds between looks for an idle lane while every GPU is held by lanes
CLOSE_WAIT = 5.0  # seconds to wait for a retired lane's container to go (as a job's end waits for its own)


class LaneSwarm(SwarmBackend, Protocol):
    """The swarm as lanes use it: a job's backend, and every service of a role (DockerSwarm)."""

    def role_services(self, role: str) -> list[tuple[str, dict[str, str], bool]]: ...


@dataclass
class Lane:
    key: str  # the kind of chunk it takes (lane_key; a job's own lane: its job's id)
    service: str
    label: str  # its service's job label (lane-<job>-<chunk>; a job's own lane: the job's)
    home: RunDir  # the run folder that holds its hand-off file
    chunk: str  # its hand-off file's chunk name
    born: float
    free_until: float = 0.0  # monotonic: its runner waits for the next chunk until then
    seq: int = 0


@dataclass
class Lanes:
    """A pool of lanes: one `serve`'s (packs'), one `submit`'s or one job's (thread-safe)."""

    backend: Callable[[], LaneSwarm]
    linger: float
    # how many lanes may exist at once: the swarm's GPUs (None: unknown, then one per pack at a time)
    capacity: Callable[[], int | None] = lambda: None
    owner: str = ""  # who starts them (a `serve`'s heartbeat name, a `submit`'s host-pid, a job): each says so
    live: Callable[[], set[str]] = set  # the owners serving now (fresh heartbeats)
    role: str = ROLE_LANE  # ROLE_JOB_LANE: one job's own lanes, under its label; ROLE_SHARED_LANE: a submit's
    clock: Callable[[], float] = time.monotonic
    sleep: Callable[[float], None] = time.sleep  # obtain's wait for an idle lane
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
            self.sleep(POLL)

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

    def give_back(self, lane: Lane, linger: float | None = None) -> None:
        """A lane whose chunk ended with its items recorded: idle, its runner waiting ``linger``
        seconds (what its chunk's manifest said; None: the pool's) for the next chunk."""
        lane.free_until = self.clock() + (self.linger if linger is None else linger)
        with self._lock:
            self._busy = max(self._busy - 1, 0)
            self._idle.append(lane)

    def make_room(self, gpus: int) -> None:
        """A chunk service that is no lane is about to be made (FreshLauncher's ``room``): while lanes
        hold the GPUs it needs, the idle lane whose runner stops waiting first is retired."""
        total = self.capacity()
        with self._lock:
            full = total is not None and gpus > 0 and (len(self._idle) + self._busy + 1) * gpus > total
            lane = min(self._idle, key=lambda x: x.free_until) if full and self._idle else None
            if lane is not None:
                self._idle.remove(lane)
        if lane is not None:
            self._retire(lane)

    def drop(self, lane: Lane | None) -> None:
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

    def close(self, wait: float = CLOSE_WAIT) -> None:
        """Its owner stops (`serve`, a `submit`, a job's run): every idle lane is told to stop and
        removed, and its container waited for (up to ``wait`` seconds) so that none is left after."""
        gone = self.drain()
        for lane in gone:
            self._retire(lane)
        for lane in gone:
            with contextlib.suppress(EngineUnavailable, FfswarmError):
                clear_containers(self.backend(), lane.label, wait, self.clock, self.sleep)

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

    # -- one pack's chunk in a lane (through LaneLauncher) --------------------------------------------
    def hand(self, lane: Lane, rundir: RunDir, chunk: str, attempt: int) -> Lane:
        """Hand an idle lane (taken) the attempt of ``rundir``'s ``chunk``: its runner runs it next."""
        lane.seq += 1
        self._hand(lane, Handoff(lane.seq, str(RunLayout.container(rundir.job).manifest(chunk)), attempt))
        return lane

    def open(self, key: str, rundir: RunDir, settings: RunnerSettings, chunk: str, attempt: int) -> Lane:
        """A new lane (room for it taken by `obtain`) whose service runs the attempt first."""
        spec = chunk_service(settings, chunk, attempt)
        if self.role == ROLE_JOB_LANE:
            label, name = rundir.job, f"{spec.name}-lane"
        else:  # a pack's, or a lane shared by jobs: a label of its own, which no job's supervisor lists
            label = f"lane-{rundir.job}-{chunk}"[:80]
            name = f"ffswarm-{label}"
        lane = Lane(key, name, label, rundir, chunk, self.clock())
        self._hand(lane, Handoff(0))  # before the service: its runner finds the file from the start
        spec = dataclasses.replace(
            spec,
            name=lane.service,
            labels={**spec.labels, LABEL_JOB: label, LABEL_ROLE: self.role, LABEL_LANE_OWNER: self.owner},
            env={**spec.env, ENV_LANE: "1"},
        )
        self.backend().create_service(spec)
        return lane

    def _hand(self, lane: Lane, handoff: Handoff) -> None:
        lane.home.write_file(lane.home.layout.lane_handoff(lane.chunk), handoff.to_json().encode())


@dataclass
class LaneLauncher:
    """A job's (or a pack's) attempts (controller/run/launch.py): each chunk's first attempt handed to
    an idle lane of its kind, or to a lane started for it; a fresh service of its own when no lane can
    be had, and for every later attempt (the supervisor drops a lane that failed its attempt).
    ``owned``: the lanes are the job's own, retired when its run ends (close). ``linger``: how long
    its runners wait after a chunk (its manifests'; None: the pool's)."""

    lanes: Lanes
    key: str  # the kind of runner (lane_key; a job's own lanes: its id): only a lane of this kind takes it
    rundir: RunDir  # the pack's
    settings: RunnerSettings
    fresh: Launcher
    max_age: float  # the pack's chunk timeout: no lane older than that is used
    wait: float  # how long to wait for an idle lane while every GPU is held by lanes
    owned: bool = False
    linger: float | None = None
    _taken: dict[str, Lane] = field(default_factory=dict)  # service -> the lane running an attempt
    _tried: set[str] = field(default_factory=set)  # chunks already given to a lane

    def start(self, chunk: str, attempt: int, avoid: tuple[str, ...]) -> Launched:
        if chunk in self._tried or avoid:
            return self.fresh.start(chunk, attempt, avoid)
        self._tried.add(chunk)
        logger = log.get(job=self.rundir.job, component="lanes")
        lane, room = self.lanes.obtain(self.key, self.max_age, self.settings.gpus, self.wait)
        if lane is None and not room:
            return self.fresh.start(chunk, attempt, avoid)
        try:
            if lane is not None:
                lane = self.lanes.hand(lane, self.rundir, chunk, attempt)
            else:
                lane = self.lanes.open(self.key, self.rundir, self.settings, chunk, attempt)
        except (EngineUnavailable, FfswarmError, OSError) as e:
            logger.warning("lane_failed", error=str(e))
            self.lanes.drop(lane)
            return self.fresh.start(chunk, attempt, avoid)
        logger.info("lane_handed", chunk=chunk, attempt=attempt, service=lane.service, seq=lane.seq)
        self._taken[lane.service] = lane
        return Launched(lane.service, lane.label, lane=True)

    def release(self, launched: Launched, reusable: bool) -> None:
        lane = self._taken.pop(launched.service, None)
        if lane is None:
            self.fresh.release(launched, reusable)
            return
        log.get(job=self.rundir.job, component="lanes").info("lane_chunk", service=lane.service, ok=reusable)
        if reusable:
            self.lanes.give_back(lane, self.linger)
        else:
            self.lanes.drop(lane)

    def close(self) -> None:
        if self.owned:
            self.lanes.close()


def gpu_slots(swarm: SwarmBackend, gpus: int) -> int:
    """How many runners of ``gpus`` GPUs each the swarm's usable nodes hold at once (0: no GPUs asked,
    or the swarm could not say): a job's own lanes keep their GPUs between its chunks, so its supervisor
    runs no more chunks at once (chunks.Policy.gpu_slots)."""
    if gpus <= 0:
        return 0
    try:
        return sum(n.gpus for n in swarm.nodes() if n.usable) // gpus
    except FfswarmError:
        return 0


def own_lanes(linger: float, max_age: float) -> LaunchFactory:
    """A job's own lanes (``runners.linger``): its chunks' runners take its next chunks. The pool is
    the job's alone (its key the job), retired when the run ends; at most as many lanes as the
    supervisor runs chunks at once, plus the idle ones it is about to hand a chunk."""

    def make(backend: SwarmBackend, rundir: RunDir, settings: RunnerSettings) -> Launcher:
        swarm = cast(LaneSwarm, backend)  # a job's lanes never list other services (no sweep)
        pool = Lanes(lambda: swarm, linger, owner=rundir.job, role=ROLE_JOB_LANE)
        fresh = FreshLauncher(backend, settings)
        return LaneLauncher(pool, rundir.job, rundir, settings, fresh, max_age, wait=0.0, owned=True)

    return make


def lane_key(settings: RunnerSettings) -> str:
    """The kind of a lane shared by jobs: its service as any job of the kind would make it (image,
    command, mounts, user, resources, placement, secrets, networks), the job's name left out; what a
    runner loads for a chunk follows the chunk's manifest (runner_image/worker.py keeps what matches)."""
    return hashlib.sha256(repr(dataclasses.replace(settings, job="")).encode()).hexdigest()


def shared_lanes(swarm: LaneSwarm, linger: float) -> Lanes:
    """The lanes of one `ffswarm submit` (``runners.linger``): a CLI job's runners take the chunks of
    its later jobs of the same kind (lane_key). Shared lanes an earlier `submit` left whose runners
    have exited are removed; the caller retires the pool's (close) when its jobs have ended. As many
    lanes as the swarm has GPUs: an idle lane of another kind is retired to make room for a new one."""
    for name, _, ended in swarm.role_services(ROLE_SHARED_LANE):
        if ended:
            swarm.remove_service(name)
    total = gpu_slots(swarm, 1) or None
    owner = f"{socket.gethostname()}-{os.getpid()}"
    return Lanes(lambda: swarm, linger, capacity=lambda: total, owner=owner, role=ROLE_SHARED_LANE)


def beside(lanes: Lanes) -> LaunchFactory:
    """A job's (or a pack's) attempts in fresh services of their own, beside `serve`'s lanes: each made
    after an idle lane that holds a GPU it needs is retired (Lanes.make_room)."""
    return lambda backend, rundir, settings: FreshLauncher(backend, settings, lanes.make_room)


def in_shared(lanes: Lanes, max_age: float, wait: float, linger: float | None = None) -> LaunchFactory:
    """A job's attempts handed to shared lanes of its kind (a `submit`'s, `serve`'s), or to new ones."""

    def make(backend: SwarmBackend, rundir: RunDir, settings: RunnerSettings) -> Launcher:
        fresh = FreshLauncher(backend, settings, lanes.make_room)
        return LaneLauncher(lanes, lane_key(settings), rundir, settings, fresh, max_age, wait, linger=linger)

    return make


def remove_left(swarm: LaneSwarm, live: set[str]) -> int:
    """Lane services no live `serve` owns (``live``: the owners whose heartbeat is fresh, this one
    included), and any whose runner has exited, are removed: a lane left by a `serve` that stopped or
    died would otherwise go on with a chunk that the pack's next controller runs again."""
    gone = [name for name, labels, ended in swarm.role_services(ROLE_LANE)
            if ended or labels.get(LABEL_LANE_OWNER) not in live]  # fmt: skip
    for name in gone:
        swarm.remove_service(name)
    return len(gone)
