"""`ffswarm serve`: the controller as a long-running service that runs job files dropped in an inbox.

Ops teams hand work over by dropping files, not by holding a terminal open. The inbox lives on the
shared volume (`<data_root>/inbox/`), so any manager can take over. A file moves through:

    inbox/NAME.yaml → inbox/running/NAME.<uuid>.yaml → inbox/done/NAME.yaml
                                                     ↘ inbox/failed/NAME.yaml + NAME.yaml.reason.txt

The inbox is read as a hostile folder (controller/serve/inbox.py): only regular files are taken, a
claim never replaces a file, and each claim carries a lease this controller renews with its
heartbeat. While it serves, the controller also rewrites a heartbeat beside the inbox
(controller/run/handover.py), so that `ffswarm submit --detach` knows someone will run the file it
drops there.

A file the HTTP API handed over (controller/api/submit.py) is a tenant's job when the API's owner
record claims it for exactly the bytes claimed (controller/job/owners.py): it is resolved inside
that tenant's area alone, and its run folder records ``owner``. Any other file is a CLI job, whose
outputs never enter ``tenants/``.

The controller keeps no state of its own: a file in running/ whose lease has expired (its controller
is gone) is taken over and submitted again, and submitting a job whose run folder exists continues
it (controller/run/jobs.py): committed items are not redone and chunk services that are still alive
are adopted by their labels. A live controller's files are never taken over.

Beside the inbox loop a thread sends the webhook deliveries still pending in the jobs' outboxes
(controller/run/outbox.py), so one pending when a `serve` stopped is sent after the next one starts.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

from controller import log
from controller.config import Config, warn_cluster_keys
from controller.errors import FfswarmError, volume_full
from controller.job import ledger
from controller.run import giveup, webhooks
from controller.run.handover import HEARTBEAT_SECONDS, HeartbeatFile, live_owners
from controller.run.lanes import Lanes
from controller.run.metrics import Metrics
from controller.run.packed import pack_of
from controller.run.rundir import RunDir
from controller.serve import refusals
from controller.serve.inbox import JOB_SUFFIXES, SETTLE_SECONDS, Inbox, original_name
from controller.serve.jobs import (
    Outcome,
    Running,
    SwarmGpus,
    job_owner,
    record_owner,
    run_job_file,
    run_pack,
)
from controller.serve.packing import Member, Packer, width
from controller.serve.retention import Retention
from controller.serve.shares import ShareBook
from controller.swarm.backend import SwarmBackend
from controller.swarm.docker import DockerSwarm

__all__ = [
    "JOB_SUFFIXES",
    "SETTLE_SECONDS",
    "Inbox",
    "Outcome",
    "Server",
    "job_owner",
    "record_owner",
    "run_job_file",
]

MAX_STARTS = 3  # a file still in running/ after this many controller starts is moved to failed/
RETRY_SECONDS = 30.0  # a job the swarm could not take (exit 69) waits this long in the inbox, then runs again
PACK_AHEAD_GPUS = 1  # packs are launched while this many GPUs more than are free would fit them
PREPARE_AHEAD = 16  # with packing: files being read and planned at once (each then packed or run)
SENDER_GRACE = 15.0  # seconds a stopping serve waits for a webhook attempt under way (one try: 10 s at most)


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
        inbox.on_end = self._job_ended  # a tenant's job leaves its quota ledger's count (controller/job/ledger.py)
        self.metrics = metrics
        self.concurrent_jobs = concurrent_jobs
        self.poll = poll
        # GPU slots shared between the jobs running at once, by tenant weight (controller/serve/shares.py)
        self.gpus = SwarmGpus(config)
        self.book = ShareBook(self.gpus)
        # Small jobs packed into shared chunk services (controller/serve/packing.py), read ahead of the slots
        self.packer = Packer(config.packing, config.image, gpus=self.gpus) if config.packing.on else None
        # lanes (controller/run/lanes.py): packs' chunk services wait for the next pack (packing.linger),
        # jobs' for the next chunk of a job of their kind (runners.linger); one pool holds both
        linger = (config.packing.linger if self.packer else 0.0) or config.runners.linger
        self.lanes: Lanes | None = None
        self.slots = threading.Semaphore(concurrent_jobs) if self.packer else None
        self.retry_after = retry_after
        self.stop = threading.Event()
        # set when a job or pack thread ends, or a pack's GPUs come free: the loop takes the next
        # files and launches the next pack now, not at its next poll
        self._wake = threading.Event()
        self._active: dict[str, threading.Thread] = {}
        self._pack_gpus: dict[int, int] = {}  # GPUs each running pack holds at most
        self._pack_ids = itertools.count()
        self._pack_lock = threading.Lock()
        self.heartbeat = HeartbeatFile(inbox.path, concurrent_jobs, heartbeat_every)
        if linger > 0:  # lanes carry this serve's heartbeat name; another serve's are left to it while it beats
            swarm = functools.partial(DockerSwarm, config.docker_host)
            live = functools.partial(live_owners, inbox.path)
            self.lanes = Lanes(swarm, linger, capacity=self.book.total, owner=self.heartbeat.path.stem, live=live)
        running = Running(self.book, self.packer, self.slots, self.gpus, self.lanes)
        self.run = run or functools.partial(run_job_file, running=running)
        self.retention = Retention(config)  # tenants.<t>.retention: old finished jobs deleted (at most once a minute)
        # webhook deliveries still pending (this serve's, an earlier one's, a CLI job's): sent on their schedule
        self.deliverer = webhooks.deliverer(config)
        # the swarm a job given up on has its services removed from (controller/run/giveup.py)
        self.swarm: Callable[[], SwarmBackend | None] = functools.partial(DockerSwarm, config.docker_host)
        self.log = log.get(component="serve", inbox=str(inbox.path))

    def start_job(self, claimed: Path, starts: int | None = None) -> None:
        """Run a claimed file in its own thread; ``starts``: already counted in its lease (a file
        this controller has just claimed), else counted now."""
        starts = self.inbox.count_start(claimed) if starts is None else starts
        if starts > MAX_STARTS:
            reason = (
                f"the controller stopped {starts - 1} times while running this file (crashed or was "
                f"killed, e.g. out of memory); it is not resumed again. Submit it again once the cause is fixed."
            )
            moved = self._failed(claimed, reason)
            self.log.error("job_file_given_up", file=claimed.name, starts=starts - 1, moved_to=str(moved))
            return

        def work() -> None:
            try:
                run()
            finally:
                self._wake.set()

        def run() -> None:
            self.log.info("job_file_started", file=claimed.name)
            outcome = self.run(self.config, claimed, self.metrics)
            if outcome.packed:  # the packer holds it now; its pack's thread ends it
                self.log.info("job_file_packed", file=claimed.name)
                return
            if outcome.retry:
                delay = self.retry_after if outcome.delay is None else outcome.delay
                self.inbox.put_back(claimed, delay)
                self.log.warning("job_file_deferred", file=claimed.name, reason=outcome.reason, seconds=delay)
                return
            if outcome.ok:
                moved = self.inbox.finish(claimed, True, outcome.reason)
            else:
                moved = self._failed(claimed, outcome.reason)
            self.log.info("job_file_finished", file=claimed.name, ok=outcome.ok, moved_to=str(moved))

        thread = threading.Thread(target=work, name=f"job-{claimed.name}", daemon=True)
        self._active[claimed.name] = thread
        thread.start()

    def start_pack(self, members: list[Member], parallel: int | None = None, slot: bool = True) -> None:
        """A pack of held jobs in its own thread (holding ``parallel`` chunks' GPUs of the packs' budget, and
        a job slot when ``slot``); each job's file is moved to done/ or failed/ by its own outcome."""
        assert self.slots is not None
        key = next(self._pack_ids)
        with self._pack_lock:  # counted before its thread starts: the next launch sees it
            self._pack_gpus[key] = members[0].job.spec.resources.gpus * (parallel or 1)

        def release_gpus() -> None:
            with self._pack_lock:
                self._pack_gpus.pop(key, None)
            self._wake.set()

        def work() -> None:
            try:
                files = [m.claimed.name for m in members]
                self.log.info("pack_started", jobs=len(members), parallel=parallel, files=files)
                folder = self.inbox.path / "packs"
                outcomes = run_pack(
                    self.config, members, self.metrics, self.book, folder, parallel, release_gpus, self.lanes
                )
            finally:
                if slot:
                    self.slots.release()  # type: ignore[union-attr]
                release_gpus()
            for m in members:
                outcome = outcomes[m.job.job_id]
                if outcome.retry:
                    self.inbox.put_back(m.claimed, self.retry_after)
                    continue
                if outcome.ok:
                    moved = self.inbox.finish(m.claimed, True, outcome.reason)
                else:
                    moved = self._failed(m.claimed, outcome.reason)
                self.log.info("job_file_finished", file=m.claimed.name, ok=outcome.ok, moved_to=str(moved))
            self._give_up_packs(members, outcomes)

        thread = threading.Thread(target=work, name=f"pack-{members[0].claimed.name}", daemon=True)
        for m in members:
            self._active[m.claimed.name] = thread
        thread.start()

    def _failed(self, claimed: Path, reason: str | None) -> Path:
        """A job file moved to failed/ with its reason. A job that has a run folder it has not ended
        (an internal error, a controller that kept stopping) ends first, failed for that reason, as
        any job ends (controller/run/giveup.py); one refused before it ran has its refusal announced."""
        name = original_name(claimed.name)
        job = os.path.splitext(name)[0]
        shown = (reason or "").replace(f"{self.inbox.running.name}/{claimed.name}", f"{self.inbox.failed.name}/{name}")
        self._give_up(job, shown.strip() or "serve gave up on the job")
        refusals.announce(self.config, claimed, reason)
        return self.inbox.finish(claimed, False, reason)

    def _give_up(self, job: str, reason: str) -> None:
        """End ``job``'s run (giveup.give_up); never raises: a job that cannot be ended now stays
        stopped (`ffswarm resume` continues it) and the controller goes on."""
        try:
            giveup.give_up(self.config, job, reason, self.swarm())
        except Exception:  # one job's end must not stop the controller or its other jobs
            self.log.exception("job_not_given_up", job=job)

    def _give_up_packs(self, members: list[Member], outcomes: dict[str, Outcome]) -> None:
        """A pack whose jobs were all failed by serve (an internal error): the pack's own run ends
        too, so that its claims on their outputs are let go of."""
        if any(outcomes[m.job.job_id].ok or outcomes[m.job.job_id].retry for m in members):
            return
        found = set()
        for m in members:
            with contextlib.suppress(OSError, FfswarmError):
                found.add(pack_of(RunDir(self.config.data_root, m.job.job_id)))
        for pack in sorted(p for p in found if p is not None):
            self._give_up(pack, outcomes[members[0].job.job_id].reason or "serve gave up on the pack")

    def _job_ended(self, job: str) -> None:
        try:
            ledger.job_ended(self.config.data_root, self.config.tenants, job)
        except (OSError, FfswarmError) as e:  # the API's recount sets the count right later
            self.log.warning("quota_ledger_not_updated", job=job, error=type(e).__name__)

    def _held(self) -> list[Path]:
        """Files claimed and held: by a job or pack thread, or waiting in the packer."""
        alive = [self.inbox.running / n for n, t in self._active.items() if t.is_alive()]
        return alive + (self.packer.held() if self.packer else [])

    def _beat(self) -> None:
        """Tell `submit --detach` this inbox is served, and renew the lease of every file this
        controller runs; a failed write must not stop the controller."""
        try:
            self.heartbeat.beat(len({id(t) for t in self._active.values() if t.is_alive()}))
        except OSError as e:
            self.log.warning("heartbeat_not_written", file=str(self.heartbeat.path), error=str(e))
        for path in self._held():
            name = path.name
            try:
                if not self.inbox.renew(path) and os.path.lexists(path):  # gone: it ended meanwhile
                    self.log.error("job_file_lease_lost", file=name)
            except OSError as e:
                self.log.warning("lease_not_renewed", file=name, error=e.strerror or type(e).__name__)

    def serve_forever(self) -> None:
        warn_cluster_keys(self.config, "serve")
        self.inbox.ensure()
        self.heartbeat.clear_stale()
        self._beat()
        sender = threading.Thread(target=self.deliverer.run, args=(self.stop,), name="webhooks", daemon=True)
        sender.start()
        try:
            self._loop()
        finally:  # a clean stop (SIGTERM, Ctrl-C) says so at once; a killed one goes stale
            self.heartbeat.remove()
            if self.lanes is not None:
                self.lanes.close()
            self.stop.set()
            sender.join(SENDER_GRACE)  # an attempt under way is recorded before serve exits

    def _tidy_lanes(self) -> None:
        """Expired lanes' services removed, and those an earlier `serve` left once their runners exited."""
        if self.lanes is None:
            return
        try:
            self.lanes.sweep()
        except FfswarmError as e:
            self.log.warning("lanes_not_tidied", error=str(e))

    def _resume_expired(self) -> int:
        """Files in running/ whose controller is gone (lease expired): taken over and continued
        (beyond MAX_STARTS, once, to fail them); a live controller's are left alone."""
        held = {p.name for p in self._held()}
        taken = [p for p in self.inbox.expired(time.time()) if p.name not in held]
        for claimed in taken:
            self.log.info("job_file_resumed", file=claimed.name)
            self.start_job(claimed)
        return len(taken)

    def _loop(self) -> None:
        self._tidy_lanes()  # an earlier serve's lanes, before its packs are continued here
        resumed: list[int] = []
        self._room(lambda: resumed.append(self._resume_expired()))
        self.log.info("serving", concurrent_jobs=self.concurrent_jobs, resumed=sum(resumed))
        beat_due = time.monotonic() + self.heartbeat.interval
        while not self.stop.is_set():
            self._wake.clear()  # what wakes it from here on is looked at in this round or the next
            if time.monotonic() >= beat_due:
                self._beat()
                self._room(self._resume_expired)
                self._tidy_lanes()
                self.retention.tick()
                beat_due = time.monotonic() + self.heartbeat.interval
            self._active = {k: t for k, t in self._active.items() if t.is_alive()}
            self._room(self._take_waiting)
            self._wake.wait(min(self.poll, max(beat_due - time.monotonic(), 0.05)))

    def shutdown(self) -> None:
        """Stop serving (SIGTERM): the loop ends now, the jobs' threads as their runs allow."""
        self.stop.set()
        self._wake.set()

    def _take_waiting(self) -> None:
        """Claim and start the oldest waiting files, as many as there is room for."""
        free = self._launch_packs() if self.packer else self.concurrent_jobs - len(self._active)
        for path in self.inbox.waiting(time.time(), free) if free > 0 else ():  # a full server lists nothing
            if free <= 0:
                break
            taken = self.inbox.claim(path, starts=1)  # None: vanished, taken by another, or refused to failed/
            if taken is not None:
                self.start_job(taken, starts=1)
                free -= 1

    def _room(self, step: Callable[[], object]) -> bool:
        """``step`` done, or put off because the shared volume is full (a claim's lease, a take-over
        cannot be written): the files wait where they are and the next round tries again, rather
        than serve stopping. False when put off."""
        try:
            step()
        except OSError as e:
            if not volume_full(e):
                raise
            self.log.warning("serve_volume_full", error=str(e))
            return False
        return True

    def _gpus_free_for_packs(self) -> int | None:
        """The swarm's GPUs less those the running packs hold (None: the swarm's size unknown, or no GPU). Jobs
        that run alone are not counted: a pack launched beside them gets its share as their chunks end."""
        total = self.book.total()
        if not total:  # unknown, or none yet: packs launch and wait as any job (CapacityError retries)
            return None
        with self._pack_lock:
            return total - sum(self._pack_gpus.values())  # below 0 while a pack waits ahead

    def _launch_packs(self) -> int:
        """Packs whose window has passed; then how many files to read ahead (jobs being read and planned are
        not yet in a slot). A pack that reserves GPUs is bounded by the GPUs no other pack holds, not by a
        job slot (fewer slots than GPUs left GPUs idle); one without, or any while they are unknown, takes one."""
        assert self.packer is not None and self.slots is not None
        while True:
            free = self._gpus_free_for_packs()
            # one pack more than the free GPUs is made ready ahead: its folders are made while the
            # others run, and its chunk starts the moment one of them ends (the share book waits it)
            within = None if free is None else free + PACK_AHEAD_GPUS
            due = [] if within is None else self.packer.due(1, within, gpus_only=True)  # no job slot needed
            slot = not due and self.slots.acquire(blocking=False)
            if slot and not (due := self.packer.due(1, within)):
                self.slots.release()
            if not due:
                break
            members = due[0]
            first = members[0].job.spec
            items = sum(len(m.job.plan.items) for m in members)
            widest = max(m.job.spec.max_concurrent for m in members)
            parallel = width(items, first.resources.gpus, free, widest, lanes=self.config.packing.linger > 0)
            self.start_pack(members, parallel, slot)
        preparing = sum(1 for t in self._active.values() if t.name.startswith("job-") and t.is_alive())
        return min(PREPARE_AHEAD - preparing, self.packer.room() - preparing)
