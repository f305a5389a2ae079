"""Runs a job's chunks: the window, the watch, the classification, the retries. The only place that
decides what happens to a chunk: it starts every attempt through a launcher (a one-shot service, or a
lane: controller/run/launch.py) and watches each the same way, by its service's tasks and its attempt
record. It talks to the Swarm only through SwarmBackend (real daemon in production, an in-memory fake
in unit tests) and keeps its truth in the run folder and the services' labels, so a restarted
controller adopts the services it finds (docs/architecture.md). Chunk records, policy: chunks.py."""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any

from controller.errors import EngineUnavailable
from controller.run import history
from controller.run.attempts import recorded_exit, runner_reason
from controller.run.chunks import Attempt, ChunkRun, EventSink, Policy, create_results_file
from controller.run.failures import ChunkState, FailureClass, classify_exit, describe_exit
from controller.run.lanes import ROLE_JOB_LANE
from controller.run.launch import FreshLauncher, Launched, Launcher
from controller.run.rundir import RunDir
from controller.swarm.backend import (
    ENDED,
    LOST_STATES,
    PENDING_STATES,
    JobEvents,
    NodeState,
    ServiceState,
    SwarmBackend,
    clear_containers,
)
from controller.swarm.servicespec import LABEL_ATTEMPT, LABEL_CHUNK, LABEL_ROLE, ROLE_RUNNER, RunnerSettings


class Supervisor:
    def __init__(
        self,
        backend: SwarmBackend,
        rundir: RunDir,
        settings: RunnerSettings,
        policy: Policy,
        on_event: EventSink | None = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        sizes: Mapping[str, int] | None = None,
        launcher: Launcher | None = None,
    ) -> None:
        self.backend = backend
        self.launcher = launcher or FreshLauncher(backend, settings)
        self.sizes = dict(sizes or {})  # chunk id -> items (from the plan): tells an ending chunk
        self._nodes_at = -math.inf
        self.rundir, self.settings, self.policy, self.clock, self.sleep = rundir, settings, policy, clock, sleep
        self.chunks: dict[str, ChunkRun] = {}
        self.nodes: dict[str, NodeState] = {}
        self.events: JobEvents | None = None
        self._gate_service: str | None = None
        self._outage_since: float | None = None  # when the engine stopped answering (None: it answers)
        self._outage_naps = 0
        self._dirty = True
        self.history: dict[str, dict[str, Any]] = {}  # chunk records of earlier runs (kept, appended to)

        def emit(event: str, **fields: Any) -> None:
            self._dirty = True
            sink(event, **fields)

        sink: EventSink = on_event or (lambda *a, **k: None)
        self.emit = emit

    # -- the loop ---------------------------------------------------------------------------------
    def run(
        self, chunk_ids: list[str], gate: Callable[[], bool] | None = None, gate_service: str | None = None
    ) -> dict[str, ChunkRun]:
        """Run the chunks to their ends. `gate`, when given, is a step that runs beside them (the
        identity step, whose service is `gate_service`): polled once per round until it returns
        True; whatever it raises ends the run and propagates, the chunks' services left to the caller."""
        self._gate_service = gate_service
        self._found_own = gate_service is not None  # a service of the job: a step's beside, or one found (_adopt)
        self.history = history.recorded(self.rundir)
        queue: deque[str] = deque()
        for cid in chunk_ids:
            used = max(self.rundir.last_attempt(cid), history.last_attempt(self.history, cid))
            self.chunks[cid] = ChunkRun(cid, last_attempt=used)
            queue.append(cid)
        self.events = self.backend.events(self.settings.job)
        try:
            self._adopt(queue, keep_steps=gate is not None, first=True)
            self._loop(queue, gate)
        finally:
            for run in (r for r in self._running() if r.current.lane):  # no one adopts a lane's attempt: dropped
                self._release(run)
            self.launcher.close()  # the job's own lanes retired before the wait for its containers
            if self.events is not None:
                self.events.close()
                self.events = None
        # A chunk ends at its container's exit, before the swarm has tidied up: wait for the containers it still
        # removes, unless no service of the job was made or found (every attempt in lanes labelled by the lane).
        job = self.settings.job
        if self._found_own or any((a.label or job) == job for r in self.chunks.values() for a in r.attempts):
            clear_containers(self.backend, job, self.policy.cleanup_wait, self.clock, self.sleep)
        return self.chunks

    def _loop(self, queue: deque[str], gate: Callable[[], bool] | None) -> None:
        while queue or self._running() or gate:
            self.policy.on_round()
            if (control := self.rundir.control()).cancel:
                self._cancel_all(queue)
                break
            try:
                gate = self._round(queue, gate, control.max_concurrent)
            except EngineUnavailable as e:
                self._ride_out(e)
        self._save_state()

    def _round(self, queue: deque[str], gate: Callable[[], bool] | None, limit: int) -> Callable[[], bool] | None:
        """One look at the swarm: start what fits, watch what runs, then wait for the next look.
        Returns the gate, or None once it has passed."""
        if self._outage_since is not None:
            self._recover(queue)
        if self.events is not None and self.events.nodes_changed():
            self._nodes_at = -math.inf
        if self.clock() - self._nodes_at >= self.policy.node_poll:
            self.nodes = {n.node_id: n for n in self.backend.nodes()}
            self._nodes_at = self.clock()
        self._fill(queue, self.policy.limit(limit, len(queue), len(self._running())))  # within a GPU share
        if gate is not None and gate():
            gate = None
        labels = dict.fromkeys(r.current.label or self.settings.job for r in self._running())  # none: no look
        by_name = {s.name: s for label in labels for s in self.backend.services(label)}
        before = len(self._running())
        for run in self._running():
            self._watch(run, by_name.get(run.current.service), queue)
        self._save_state()
        if (queue or self._running() or gate) and not (queue and len(self._running()) < before):  # freed: fill now
            self._pause(gate, self.policy.freed() if queue else None)
        return gate

    # -- the engine going away (a restart, an upgrade) ---------------------------------------------
    def _ride_out(self, error: EngineUnavailable) -> None:
        """The engine stopped answering mid-round. Wait for it with backoff (the run folder and the
        services' labels hold the truth meanwhile); after `engine_outage`, give up with the way back."""
        now = self.clock()
        if self._outage_since is None:
            self._outage_since = now
            for run in self._running():
                run.current.outage = True
            self.emit("engine_unavailable", error=str(error), waiting_s=self.policy.engine_outage)
        waited = now - self._outage_since
        if waited > self.policy.engine_outage:
            self._save_state()
            raise EngineUnavailable(
                f"the Docker engine has not answered for {waited:.0f}s ({error}); the job's services and run "
                f"folder are kept: continue with `ffswarm resume {self.settings.job}` once the engine is back"
            ) from error
        self._outage_naps += 1
        self.sleep(min(5.0, 0.25 * 2 ** min(self._outage_naps, 5)))

    def _recover(self, queue: deque[str]) -> None:
        """The engine answers again: listen to its events afresh (the old stream died with it), and
        take back what it holds — a chunk whose service was created just before it went away is
        adopted, never started twice. Chunks whose containers it killed end as infrastructure
        failures that do not count against `retries` (Attempt.outage)."""
        self.backend.nodes()  # raises again if it is still away
        if self.events is not None:
            self.events.close()
        self.events = self.backend.events(self.settings.job)
        self._nodes_at = -math.inf
        self._adopt(queue, keep_steps=self._gate_service is not None)
        self.emit("engine_back", seconds=round(self.clock() - (self._outage_since or self.clock()), 1))
        self._outage_since = None
        self._outage_naps = 0

    def _pause(self, gate: Callable[[], bool] | None, freed: int | None = None) -> None:
        """Wait until the next look at the swarm is due, or an event says to look now, watching the
        running chunks' results files meanwhile (a local read of what was appended): a chunk that
        has recorded every item is about to exit, so the swarm is asked again within `ending_poll`.
        While a step is pending the swarm is asked every `poll` (the step is short, its answer what the
        job waits for); a changed control.json, or GPUs given back (``freed``) while chunks wait, end it."""
        events = self.events if self.events is not None and self.events.alive else None
        gated = gate is not None
        due = self.clock() + (self.policy.event_poll if events and not gated else self.policy.poll)
        asked = self._control_stamp()
        while True:
            step_ended = gated and events is not None and events.exit_code(self._gate_service or "") is not None
            if step_ended or any(self._ending(run) for run in self._running()):
                self._nap(events, self.policy.ending_poll)
                return
            left = due - self.clock()
            if left <= 1e-9 or self._nap(events, min(self.policy.ending_poll, left)):
                return
            if self._control_stamp() != asked or (freed is not None and self.policy.freed() != freed):
                return

    def _control_stamp(self) -> tuple[int, int] | None:
        try:
            st = self.rundir.layout.control.stat()
        except OSError:
            return None
        return st.st_ino, st.st_mtime_ns

    def _nap(self, events: JobEvents | None, seconds: float) -> bool:
        """Sleep up to `seconds`; True when an event cut it short."""
        if events is None:
            self.sleep(seconds)
            return False
        return events.wait(seconds)

    def _ending(self, run: ChunkRun) -> bool:
        """Whether the current attempt has recorded a result for each of its chunk's items, or it died."""
        att = run.current
        if self.events is not None and self.events.exit_code(att.service) is not None:
            return True
        size = self.sizes.get(run.id)
        if not size:
            return False
        if len(att.items_recorded) >= size:
            return True
        return att.read_results(self.rundir.layout.results(run.id, att.attempt)) >= size

    def _save_state(self) -> None:
        """state.json: chunk states and attempts, for `ffswarm status` while the job runs; earlier
        runs' records stay, this run's attempts appended to them (controller/run/history.py)."""
        if self._dirty:
            now = {cid: run.as_dict() for cid, run in self.chunks.items()}
            self.rundir.write_state(history.merge(self.history, now))
            self._dirty = False

    def _running(self) -> list[ChunkRun]:
        return [c for c in self.chunks.values() if c.state is ChunkState.RUNNING]

    def _adopt(self, queue: deque[str], keep_steps: bool = False, first: bool = False) -> None:
        """Services left by an earlier controller: keep the live ones, never start a second one. A step's
        service is kept while the step runs; an earlier run's lane (``first``) is removed, its attempt redone."""
        for svc in self.backend.services(self.settings.job):
            self._found_own = True
            role = svc.labels.get(LABEL_ROLE, ROLE_RUNNER)
            if role == ROLE_JOB_LANE and not first or keep_steps and role not in (ROLE_RUNNER, ROLE_JOB_LANE):
                continue  # this run's lanes are its launcher's; a step's service is kept while it runs
            cid = svc.labels.get(LABEL_CHUNK, "")
            run = self.chunks.get(cid)
            if run is not None and run.state is ChunkState.RUNNING and run.current.service == svc.name:
                continue  # its own live attempt (adopting again after an engine outage)
            if run is None or run.state is not ChunkState.QUEUED or role == ROLE_JOB_LANE:  # never adopted
                if run is None and role == ROLE_RUNNER:  # an earlier run's, ended unwatched
                    ended = svc.latest_task()
                    self._dirty |= history.note_ended(self.history, cid, svc.labels.get(LABEL_ATTEMPT), ended)
                self.backend.remove_service(svc.name)
                continue
            attempt = int(svc.labels.get(LABEL_ATTEMPT, "1"))
            run.last_attempt = max(run.last_attempt, attempt)
            run.attempts.append(Attempt(attempt, svc.name, started=self.clock()))
            run.state = ChunkState.RUNNING
            queue.remove(cid)
            self.emit("chunk_adopted", chunk=cid, attempt=attempt, service=svc.name)

    def _fill(self, queue: deque[str], limit: int) -> None:
        now = self.clock()
        waiting: list[str] = []
        try:
            while queue and len(self._running()) < limit:
                cid = queue.popleft()
                run = self.chunks[cid]
                if run.not_before > now:
                    waiting.append(cid)
                    continue
                self._start(run, queue)
        finally:
            queue.extendleft(reversed(waiting))

    def _start(self, run: ChunkRun, queue: deque[str]) -> None:
        run.last_attempt = attempt = run.last_attempt + 1
        avoid = run.avoidance(self.nodes.values(), self.settings.gpus > 0)
        try:  # before the service: NFS lookup caching cannot hide a file that exists first
            create_results_file(self.rundir.layout, run.id, attempt, self.rundir.owner)
        except OSError as e:  # the runner creates it itself; say why it was not made here
            self.emit("results_file_not_created", chunk=run.id, attempt=attempt, reason=e.strerror or str(e))
        try:
            got = self.launcher.start(run.id, attempt, avoid)
        except EngineUnavailable:
            queue.appendleft(run.id)  # started after the outage, or adopted if the engine made it anyway
            raise
        run.attempts.append(Attempt(attempt, got.service, started=self.clock(), label=got.label, lane=got.lane))
        run.state = ChunkState.RUNNING
        self.emit("chunk_started", chunk=run.id, attempt=attempt, service=got.service)

    def _release(self, run: ChunkRun, reusable: bool = False) -> None:
        att = run.current
        self.launcher.release(Launched(att.service, att.label or self.settings.job, att.lane), reusable)

    # -- one chunk --------------------------------------------------------------------------------
    def _watch(self, run: ChunkRun, svc: ServiceState | None, queue: deque[str]) -> None:
        att, now = run.current, self.clock()
        if att.lane and (code := recorded_exit(self.rundir, run.id, att.attempt)) is not None:
            # a lane outlives its attempt: the attempt record says when (and how) the attempt ended
            if (failure := classify_exit(code)) is None:
                self._finish(run, code)
            else:
                att.exit_code = code
                self._end(run, failure, describe_exit(code), queue)
            return
        if svc is None:
            if att.lane:
                self._release(run)
            self._fail(run, FailureClass.INFRASTRUCTURE, "service disappeared (removed outside ffswarm)", queue)
            return
        task = svc.latest_task()
        if task and task.node_id:
            att.node = task.node_id
            node = self.nodes.get(task.node_id)
            if node is not None and node.state != "ready" and task.state not in ("complete", "failed"):
                self._node_lost(run, node, queue)
                return
        exited = self.events.exit_code(att.service) if self.events is not None else None
        if exited is not None and classify_exit(exited) is None and (task is None or task.state not in ENDED):
            # Its container exited here with a code that ends the chunk (0, or 3: some items failed):
            # done now, not when the swarm's task record catches up (it lags the exit).
            self._finish(run, exited)
            return
        if task is None or task.state in PENDING_STATES:
            if now - att.started > self.policy.schedule_timeout:
                why = task.message if task and task.message else "no task was scheduled"
                why = f"not scheduled within {self.policy.schedule_timeout:.0f}s: {why}"
                self._end(run, FailureClass.UNSCHEDULABLE, why, queue)
            return
        if task.state == "complete" and not att.lane:
            self._finish(run, 0)
        elif task.state in ("complete", "failed"):  # a lane's runner that exited before its attempt ended failed it
            code = task.exit_code if task.exit_code is not None else (0 if task.state == "complete" else -1)
            failure = classify_exit(code) or (FailureClass.INFRASTRUCTURE if att.lane else None)
            if failure is None:
                self._finish(run, code)
            else:
                att.exit_code = code
                self._end(run, failure, f"{describe_exit(code)}: {task.message}".rstrip(": "), queue)
        elif task.state == "rejected":
            self._end(run, FailureClass.INFRASTRUCTURE, f"task rejected: {task.message}", queue)
        elif task.state in LOST_STATES:
            self._end(run, FailureClass.INFRASTRUCTURE, f"task {task.state}: {task.message or 'node lost'}", queue)
        else:  # preparing, starting, running
            if task.state == "running" and att.running_since is None:
                att.running_since = now
                self.emit("chunk_running", chunk=run.id, attempt=att.attempt, node=task.node_id)
            if att.running_since is not None and now - att.running_since > self.policy.timeout:
                self._end(run, FailureClass.INFRASTRUCTURE, f"timed out after {self.policy.timeout:.0f}s", queue)

    def _finish(self, run: ChunkRun, code: int) -> None:
        att = run.current
        att.exit_code, att.outcome = code, "done"
        run.state = ChunkState.DONE
        self._release(run, reusable=True)
        self.emit("chunk_done", chunk=run.id, attempt=att.attempt, exit_code=code)

    def _end(self, run: ChunkRun, failure: FailureClass, reason: str, queue: deque[str]) -> None:
        self._keep_logs(run)
        self._release(run)
        self._fail(run, failure, reason, queue)

    def _keep_logs(self, run: ChunkRun) -> None:
        """Put the runner's own reason into the attempt's (controller/run/attempts.py runner_reason)."""
        att = run.current  # a lane's service logs are every chunk's it ran: not this attempt's
        logs = (lambda: "") if att.lane else (lambda: self.backend.service_logs(att.service))
        att.reason = runner_reason(self.rundir, run.id, att.attempt, logs) or att.reason

    def _node_lost(self, run: ChunkRun, node: NodeState, queue: deque[str]) -> None:
        """Swarm (engine 20.10) never moves a task off a dead node: the controller does. Node loss is
        not the chunk's fault and does not use up its retries (a lane's: the lane is dropped)."""
        self._release(run)
        if run.current.lane:
            self._fail(run, FailureClass.INFRASTRUCTURE, f"node {node.hostname or node.node_id} is {node.state}", queue)
            return
        run.lose_node(node)
        if run.node_losses > self.policy.max_node_losses:
            self._fail(run, FailureClass.INFRASTRUCTURE, f"lost {run.node_losses} nodes", queue)
            return
        run.requeue()
        queue.appendleft(run.id)
        att = run.current
        self.emit("chunk_node_lost", chunk=run.id, attempt=att.attempt, node=node.node_id, reason=att.reason)

    def _fail(self, run: ChunkRun, failure: FailureClass, reason: str, queue: deque[str]) -> None:
        att, now = run.current, self.clock()  # a lane that failed its attempt is dropped: run again fresh …
        lane = att.lane and failure is not FailureClass.USER  # … unless the same inputs would fail again
        event = run.drop_lane(failure, reason) if lane else run.end_attempt(failure, reason, self.policy, now)
        if event in ("chunk_engine_lost", "chunk_lane_dropped"):
            queue.appendleft(run.id)
            self.emit(event, chunk=run.id, attempt=att.attempt, reason=att.reason)
            return
        if event == "chunk_retry":
            queue.append(run.id)
        self.emit(event, chunk=run.id, attempt=att.attempt, failure=failure.value, reason=att.reason)

    def _cancel_all(self, queue: deque[str]) -> None:
        for run in self._running():
            self._release(run)
            run.current.outcome = "cancelled"
        for run in (r for r in self.chunks.values() if not r.state.is_terminal()):
            run.state = ChunkState.CANCELLED
        queue.clear()
        self.emit("job_cancelled")
