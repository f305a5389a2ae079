"""An in-memory SwarmBackend: a small state machine with scripted outcomes per chunk attempt.

Unit tests drive the supervisor through it; no Docker client is mocked. Each service moves
pending → running → its scripted ending, one step per `services()` poll.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from controller.errors import EngineUnavailable
from controller.swarm.backend import NodeState, ServiceState, TaskState
from controller.swarm.servicespec import LABEL_ATTEMPT, LABEL_CHUNK, LABEL_JOB, LABEL_ROLE, ServiceSpec


@dataclass(frozen=True)
class Outcome:
    state: str = "complete"  # complete | failed | rejected | pending (forever) | running (forever) | shutdown
    exit_code: int | None = 0
    message: str = ""


@dataclass
class _Svc:
    spec: ServiceSpec
    outcome: Outcome
    node: str | None
    polls: int = 0


@dataclass
class FakeSwarm:
    script: dict[tuple[str, int], Outcome] = field(default_factory=dict)  # (chunk, attempt) -> outcome
    created: list[ServiceSpec] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    swept: list[str] = field(default_factory=list)  # jobs whose exited containers were looked for
    max_alive: int = 0
    labels: dict[str, str] = field(default_factory=lambda: {"ffswarm.gpu": "true"})
    logs: dict[str, str] = field(default_factory=dict)  # service name -> what its container printed
    node_states: list[NodeState] = field(default_factory=lambda: [NodeState("node-1", "n1", "ready", "active", 2)])
    # chunk label -> what its container does before it ends (e.g. the identity step writes its answer)
    on_end: dict[str, Callable[[], None]] = field(default_factory=dict)
    job_events: FakeEvents | None = None  # what events(job) gives: None, like an engine without a stream
    # An engine restart: the next `down` calls raise EngineUnavailable, and the containers running
    # when it went down end with exit 137 (what a dockerd restart does to them).
    down: int = 0
    images: dict[str, str] = field(default_factory=dict)  # tag -> what resolve_image pins (else the tag)
    encoders: frozenset[str] | None = None  # what image_encoders says of every image (None: no label)
    _svcs: dict[str, _Svc] = field(default_factory=dict)

    def resolve_image(self, ref: str) -> str:
        return self.images.get(ref, ref)

    def image_encoders(self, ref: str) -> frozenset[str] | None:
        return self.encoders

    def _answer(self) -> None:
        if self.down <= 0:
            return
        self.down -= 1
        for svc in self._svcs.values():
            if svc.node is not None and svc.polls >= 2 and svc.outcome.state in ("complete", "running"):
                svc.outcome = Outcome("failed", 137, "task: non-zero exit (137)")
                svc.polls = max(svc.polls, 3)
        raise EngineUnavailable("cannot reach the Docker engine: Connection refused")

    def create_service(self, spec: ServiceSpec) -> str:
        self._answer()
        assert spec.name not in self._svcs, f"second service named {spec.name}"
        key = (spec.labels[LABEL_CHUNK], int(spec.labels[LABEL_ATTEMPT]))
        self._svcs[spec.name] = _Svc(spec, self.script.get(key, _from_command(spec)), self._place(spec))
        self.created.append(spec)
        self.max_alive = max(self.max_alive, len(self._svcs))
        return f"id-{spec.name}"

    def services(self, job: str) -> list[ServiceState]:
        self._answer()
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

    def _place(self, spec: ServiceSpec) -> str | None:
        """Like Swarm's scheduler, on a small scale: label constraints and node.id!= exclusions."""
        for n in self.node_states:
            if not n.usable:
                continue
            if all(_satisfied(c, n.node_id, self.labels) for c in spec.constraints):
                return n.node_id
        return None

    def _task(self, svc: _Svc) -> TaskState:
        o = svc.outcome
        if svc.node is None:
            return TaskState("pending", "running", None, NO_NODE, None, None, 1.0, 1.0)
        if o.state == "pending" or svc.polls < 2:
            state, code, msg = "pending", None, o.message if o.state == "pending" else ""
        elif o.state == "running" or svc.polls < 3:
            state, code, msg = "running", None, ""
        else:
            state, code, msg = o.state, o.exit_code, o.message
            effect = self.on_end.pop(svc.spec.labels[LABEL_CHUNK], None)
            if effect is not None:
                effect()
        return TaskState(
            state=state,
            desired_state="running",
            exit_code=code,
            message=msg,
            node_id=svc.node,
            container_id=None,
            created=1.0,
            updated=1.0,
        )

    def remove_service(self, name: str) -> None:
        self._answer()
        if self._svcs.pop(name, None) is not None:
            self.removed.append(name)

    def remove_exited_containers(self, job: str, service: str | None = None) -> int:
        self.swept.append(job)
        return 0  # a removed service's container is gone at once here: none left

    def service_logs(self, name: str, tail: int = 40) -> str:
        return self.logs.get(name, "")

    def nodes(self) -> list[NodeState]:
        self._answer()
        return list(self.node_states)

    def events(self, job: str) -> FakeEvents | None:
        return self.job_events

    def alive(self) -> list[str]:
        return list(self._svcs)

    def role_services(self, role: str) -> list[tuple[str, dict[str, str], bool]]:
        """Every service with this role label: name, labels, whether its task has ended (DockerSwarm's)."""
        return [
            (name, dict(svc.spec.labels), svc.polls >= 3 and svc.outcome.state not in ("pending", "running"))
            for name, svc in self._svcs.items()
            if svc.spec.labels.get(LABEL_ROLE) == role
        ]

    def end(self, name: str, outcome: Outcome) -> None:
        """A service's container ends now as ``outcome`` says (killed, crashed): seen at the next poll."""
        svc = self._svcs[name]
        svc.outcome = outcome
        svc.polls = max(svc.polls, 3)

    def add_orphan(self, spec: ServiceSpec, outcome: Outcome) -> None:
        """A service left by an earlier controller (for adoption tests)."""
        self._svcs[spec.name] = _Svc(spec, outcome, self._place(spec))


@dataclass
class FakeEvents:
    """JobEvents that a test drives: the services whose containers died, a node change, whether the
    stream still flows. Waiting advances the test's clock through `sleep`, which may change things."""

    sleep: Callable[[float], None]
    died: dict[str, int] = field(default_factory=dict)  # service name -> exit code
    node_change: bool = False
    alive: bool = True
    closed: bool = False

    def wait(self, timeout: float) -> bool:
        if self.node_change:
            return True
        self.sleep(timeout)
        return self.node_change

    def exit_code(self, service: str) -> int | None:
        return self.died.get(service)

    def nodes_changed(self) -> bool:
        changed, self.node_change = self.node_change, False
        return changed

    def close(self) -> None:
        self.closed = True


NO_NODE = "no suitable node (scheduling constraints not satisfied on 1 node)"


def _satisfied(constraint: str, node_id: str, labels: dict[str, str]) -> bool:
    key, op, value = constraint.replace("!=", " != ").replace("==", " == ").split()
    actual = node_id if key == "node.id" else labels.get(key.removeprefix("node.labels."))
    return (actual == value) == (op == "==")


def _from_command(spec: ServiceSpec) -> Outcome:
    """`sh -c "exit N"` behaves like it would in a container; anything else completes."""
    if spec.command[:2] == ("/bin/sh", "-c") and spec.command[2].startswith("exit "):
        code = int(spec.command[2].split()[1])
        return Outcome("complete", 0) if code == 0 else Outcome("failed", code, "task: non-zero exit")
    if spec.command[:2] == ("/bin/sh", "-c") and spec.command[2].startswith("sleep "):
        return Outcome("running")
    return Outcome()
