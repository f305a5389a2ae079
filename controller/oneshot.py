"""Run one one-shot service to its end and return what happened: for steps that are not chunks
(the submit-time identity step, doctor's probes). Same spec data, same hardening, same backend."""

from __future__ import annotations

import time
from dataclasses import dataclass

from controller.servicespec import ServiceSpec
from controller.supervisor import PENDING_STATES
from controller.swarm import SwarmBackend

ENDED = {"complete", "failed", "rejected", "shutdown", "orphaned"}


@dataclass(frozen=True)
class OneShotResult:
    state: str  # complete | failed | rejected | … | unscheduled
    exit_code: int | None
    message: str  # the engine's or scheduler's words
    logs: str  # the container's last output lines

    @property
    def ok(self) -> bool:
        return self.state == "complete"


def run_oneshot(
    backend: SwarmBackend, spec: ServiceSpec, timeout: float, schedule_timeout: float, poll: float = 0.1
) -> OneShotResult:
    """Create, wait until the task ends, collect logs, remove (always). Gives up when no node took
    the task within `schedule_timeout`, or it has not ended within `timeout`."""
    job = spec.labels["io.ffswarm.job"]
    backend.remove_service(spec.name)  # left by a controller killed mid-step: start it afresh
    backend.create_service(spec)
    task = None
    try:
        start = time.monotonic()
        while time.monotonic() - start < timeout:
            states = [s for s in backend.services(job) if s.name == spec.name]
            task = states[0].latest_task() if states else None
            if task is not None and task.state in ENDED:
                break
            if (task is None or task.state in PENDING_STATES) and time.monotonic() - start > schedule_timeout:
                break
            time.sleep(poll)
        logs = backend.service_logs(spec.name, tail=40)
    finally:
        backend.remove_service(spec.name)
        backend.remove_exited_containers(job)
    if task is None or task.state not in ENDED:
        why = task.message if task is not None and task.message else "no task started"
        return OneShotResult("unscheduled", None, why, logs)
    return OneShotResult(task.state, task.exit_code, task.message, logs)
