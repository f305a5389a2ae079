"""One one-shot service run to its end: for steps that are not chunks (the submit-time identity step,
doctor's probes). Same spec data, same hardening, same backend.

`OneShot` is the non-blocking form (created, then polled, e.g. from the supervisor's loop while the
job's first chunks start); `run_oneshot` waits for it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from controller.swarm.backend import ENDED, PENDING_STATES, SwarmBackend, TaskState
from controller.swarm.servicespec import ServiceSpec


@dataclass(frozen=True)
class OneShotResult:
    state: str  # complete | failed | rejected | … | unscheduled
    exit_code: int | None
    message: str  # the engine's or scheduler's words
    logs: str  # the container's last output lines

    @property
    def ok(self) -> bool:
        return self.state == "complete"


class OneShot:
    """Creates the service at once; `poll()` answers None until its task has ended (or no node took
    it within `schedule_timeout`, or it has not ended within `timeout`), then collects its logs and
    removes it. `abort()` removes it whatever its state."""

    def __init__(self, backend: SwarmBackend, spec: ServiceSpec, timeout: float, schedule_timeout: float) -> None:
        self.backend = backend
        self.spec = spec
        self.timeout = timeout
        self.schedule_timeout = schedule_timeout
        self.job = spec.labels["io.ffswarm.job"]
        self.result: OneShotResult | None = None
        self.task: TaskState | None = None  # as last seen
        backend.remove_service(spec.name)  # left by a controller killed mid-step: start it afresh
        backend.create_service(spec)
        self.started = time.monotonic()

    def poll(self) -> OneShotResult | None:
        if self.result is not None:
            return self.result
        states = [s for s in self.backend.services(self.job) if s.name == self.spec.name]
        task = self.task = states[0].latest_task() if states else None
        elapsed = time.monotonic() - self.started
        ended = task is not None and task.state in ENDED
        unscheduled = (task is None or task.state in PENDING_STATES) and elapsed > self.schedule_timeout
        if not (ended or unscheduled or elapsed > self.timeout):
            return None
        try:
            logs = self.backend.service_logs(self.spec.name, tail=40)
        finally:
            self.abort()
        if task is None or task.state not in ENDED:
            why = task.message if task is not None and task.message else "no task started"
            self.result = OneShotResult("unscheduled", None, why, logs)
        else:
            self.result = OneShotResult(task.state, task.exit_code, task.message, logs)
        return self.result

    def abort(self) -> None:
        self.backend.remove_service(self.spec.name)
        self.backend.remove_exited_containers(self.job, self.spec.name)  # never the chunks' beside it


def run_oneshot(
    backend: SwarmBackend, spec: ServiceSpec, timeout: float, schedule_timeout: float, poll: float = 0.1
) -> OneShotResult:
    """Create, wait until the task ends, collect logs, remove (always)."""
    shot = OneShot(backend, spec, timeout, schedule_timeout)
    try:
        while (result := shot.poll()) is None:
            time.sleep(poll)
    except BaseException:
        shot.abort()
        raise
    return result
