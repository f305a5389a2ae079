"""An in-memory SwarmBackend: a small state machine with scripted outcomes per chunk attempt.

Unit tests drive the supervisor through it; no Docker client is mocked. Each service moves
pending → running → its scripted ending, one step per `services()` poll.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from controller.servicespec import LABEL_ATTEMPT, LABEL_CHUNK, LABEL_JOB, ServiceSpec
from controller.swarm import ServiceState, TaskState


@dataclass(frozen=True)
class Outcome:
    state: str = "complete"  # complete | failed | rejected | pending (forever) | running (forever) | shutdown
    exit_code: int | None = 0
    message: str = ""


@dataclass
class _Svc:
    spec: ServiceSpec
    outcome: Outcome
    polls: int = 0


@dataclass
class FakeSwarm:
    script: dict[tuple[str, int], Outcome] = field(default_factory=dict)  # (chunk, attempt) -> outcome
    created: list[ServiceSpec] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    max_alive: int = 0
    logs: dict[str, str] = field(default_factory=dict)  # service name -> what its container printed
    _svcs: dict[str, _Svc] = field(default_factory=dict)

    def create_service(self, spec: ServiceSpec) -> str:
        assert spec.name not in self._svcs, f"second service named {spec.name}"
        key = (spec.labels[LABEL_CHUNK], int(spec.labels[LABEL_ATTEMPT]))
        self._svcs[spec.name] = _Svc(spec, self.script.get(key, Outcome()))
        self.created.append(spec)
        self.max_alive = max(self.max_alive, len(self._svcs))
        return f"id-{spec.name}"

    def services(self, job: str) -> list[ServiceState]:
        out = []
        for name, svc in self._svcs.items():
            if svc.spec.labels[LABEL_JOB] != job:
                continue
            svc.polls += 1
            out.append(
                ServiceState(
                    name=name,
                    service_id=f"id-{name}",
                    labels=dict(svc.spec.labels),
                    created=0.0,
                    tasks=(self._task(svc),),
                )
            )
        return out

    def _task(self, svc: _Svc) -> TaskState:
        o = svc.outcome
        if o.state == "pending" or svc.polls < 2:
            state, code, msg = "pending", None, o.message if o.state == "pending" else ""
        elif o.state == "running" or svc.polls < 3:
            state, code, msg = "running", None, ""
        else:
            state, code, msg = o.state, o.exit_code, o.message
        return TaskState(
            state=state,
            desired_state="running",
            exit_code=code,
            message=msg,
            node_id="node-1",
            container_id=None,
            created=1.0,
            updated=1.0,
        )

    def remove_service(self, name: str) -> None:
        if self._svcs.pop(name, None) is not None:
            self.removed.append(name)

    def remove_exited_containers(self, job: str) -> int:
        return 0

    def service_logs(self, name: str, tail: int = 40) -> str:
        return self.logs.get(name, "")

    def alive(self) -> list[str]:
        return list(self._svcs)

    def add_orphan(self, spec: ServiceSpec, outcome: Outcome) -> None:
        """A service left by an earlier controller (for adoption tests)."""
        self._svcs[spec.name] = _Svc(spec, outcome)
