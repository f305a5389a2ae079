"""The supervisor's decisions, driven through the in-memory FakeSwarm (no Docker)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from contract.results import ItemResult, ItemStatus
from controller.errors import EngineUnavailable, JobFileError
from controller.run.chunks import Policy
from controller.run.failures import ChunkState, FailureClass, classify_exit
from controller.run.rundir import Control, RunDir
from controller.run.supervisor import Supervisor
from controller.swarm.backend import ServiceState
from controller.swarm.servicespec import LABEL_ROLE, RunnerSettings, ServiceSpec, VolumeSpec, chunk_service
from tests.fakes import FakeEvents, FakeSwarm, Outcome


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        self.now += s


def settings() -> RunnerSettings:
    return RunnerSettings(
        job="j",
        image="sha256:abc",
        constraints=("node.labels.ffswarm.gpu==true",),
        gpu_kind="GPU",
        gpus=1,
        memory_bytes=2 << 30,
        volume=VolumeSpec.bind("/srv/d"),
        user="1000:1000",
    )


def make(tmp_path: Path, swarm: FakeSwarm, max_concurrent: int = 2, **policy: float) -> tuple[Supervisor, Clock]:
    rundir = RunDir(tmp_path, "j")
    rundir.path.mkdir(parents=True)
    rundir.write_control(Control(max_concurrent))
    clock = Clock()
    p = Policy(**{"retries": 2, "timeout": 60.0, "schedule_timeout": 10.0, "poll": 0.5, **policy})  # type: ignore[arg-type]
    return Supervisor(swarm, rundir, settings(), p, clock=clock, sleep=clock.sleep), clock


def test_window_never_exceeds_max_concurrent_and_all_chunks_finish(tmp_path: Path) -> None:
    swarm = FakeSwarm()
    sup, _ = make(tmp_path, swarm, max_concurrent=2)
    runs = sup.run([f"c{i:04d}" for i in range(7)])
    assert swarm.max_alive == 2
    assert all(r.state is ChunkState.DONE for r in runs.values())
    assert swarm.alive() == []  # finished services are removed
    assert len(swarm.created) == 7


def test_exit_3_is_done_not_retried(tmp_path: Path) -> None:
    swarm = FakeSwarm(script={("c0000", 1): Outcome("failed", 3)})
    sup, _ = make(tmp_path, swarm)
    runs = sup.run(["c0000"])
    assert runs["c0000"].state is ChunkState.DONE
    assert [s.name for s in swarm.created] == ["ffswarm-j-c0000-a1"]


@pytest.mark.parametrize("code", [65, 66])
def test_user_failures_are_final(tmp_path: Path, code: int) -> None:
    swarm = FakeSwarm(script={("c0000", 1): Outcome("failed", code, "task: non-zero exit")})
    sup, _ = make(tmp_path, swarm)
    runs = sup.run(["c0000"])
    assert runs["c0000"].state is ChunkState.FAILED
    assert runs["c0000"].failure is FailureClass.USER
    assert len(swarm.created) == 1


def test_retryable_failure_gets_new_attempt_services_until_budget(tmp_path: Path) -> None:
    swarm = FakeSwarm(
        script={
            ("c0000", 1): Outcome("failed", 70),
            ("c0000", 2): Outcome("failed", 137),
            ("c0000", 3): Outcome("failed", 75),
        }
    )
    sup, _ = make(tmp_path, swarm)
    runs = sup.run(["c0000"])
    assert [s.name for s in swarm.created] == ["ffswarm-j-c0000-a1", "ffswarm-j-c0000-a2", "ffswarm-j-c0000-a3"]
    assert runs["c0000"].state is ChunkState.FAILED
    assert runs["c0000"].failure is FailureClass.INFRASTRUCTURE
    assert [a.exit_code for a in runs["c0000"].attempts] == [70, 137, 75]


def test_retry_then_success(tmp_path: Path) -> None:
    swarm = FakeSwarm(script={("c0001", 1): Outcome("rejected", None, "container failed to start")})
    sup, _ = make(tmp_path, swarm)
    runs = sup.run(["c0000", "c0001"])
    assert runs["c0001"].state is ChunkState.DONE
    assert runs["c0001"].attempts[0].reason == "task rejected: container failed to start"
    assert len(runs["c0001"].attempts) == 2


def test_unschedulable_fails_with_the_schedulers_reason_after_timeout(tmp_path: Path) -> None:
    msg = "no suitable node (scheduling constraints not satisfied on 1 node)"
    swarm = FakeSwarm(script={("c0000", 1): Outcome("pending", None, msg)})
    sup, clock = make(tmp_path, swarm, schedule_timeout=10.0)
    runs = sup.run(["c0000"])
    assert runs["c0000"].state is ChunkState.FAILED
    assert runs["c0000"].failure is FailureClass.UNSCHEDULABLE
    assert msg in (runs["c0000"].reason or "")
    assert 10.0 < clock.now <= 11.0
    assert swarm.alive() == []


def test_attempt_timeout_removes_service_and_retries(tmp_path: Path) -> None:
    swarm = FakeSwarm(script={("c0000", 1): Outcome("running")})
    sup, _ = make(tmp_path, swarm, timeout=5.0)
    runs = sup.run(["c0000"])
    assert runs["c0000"].state is ChunkState.DONE
    assert "timed out" in (runs["c0000"].attempts[0].reason or "")
    assert "ffswarm-j-c0000-a1" in swarm.removed


def test_adopts_live_service_instead_of_starting_a_second(tmp_path: Path) -> None:
    swarm = FakeSwarm()
    swarm.add_orphan(chunk_service(settings(), "c0000", 2), Outcome())
    sup, _ = make(tmp_path, swarm)
    runs = sup.run(["c0000", "c0001"])
    assert [s.name for s in swarm.created] == ["ffswarm-j-c0001-a1"]
    assert runs["c0000"].state is ChunkState.DONE and runs["c0000"].current.attempt == 2


def test_cancel_removes_running_services(tmp_path: Path) -> None:
    swarm = FakeSwarm(script={("c0000", 1): Outcome("running"), ("c0001", 1): Outcome("running")})
    sup, clock = make(tmp_path, swarm, timeout=1e9)
    orig = clock.sleep

    def sleep(s: float) -> None:
        orig(s)
        if clock.now > 3:
            sup.rundir.write_control(Control(2, cancel=True))

    sup.sleep = sleep
    runs = sup.run(["c0000", "c0001", "c0002"])
    assert {r.state for r in runs.values()} == {ChunkState.CANCELLED}
    assert swarm.alive() == []


def test_exit_classes() -> None:
    assert classify_exit(0) is None and classify_exit(3) is None
    assert classify_exit(65) is FailureClass.USER and classify_exit(66) is FailureClass.USER
    assert classify_exit(70) is FailureClass.INTERNAL and classify_exit(70).is_retryable()
    assert classify_exit(137) is FailureClass.INFRASTRUCTURE and classify_exit(75) is FailureClass.INFRASTRUCTURE
    assert not FailureClass.USER.is_retryable() and not FailureClass.UNSCHEDULABLE.is_retryable()


def test_a_runner_that_died_silently_leaves_its_last_words(tmp_path: Path) -> None:
    swarm = FakeSwarm(
        script={("c0000", 1): Outcome("failed", 1)}, logs={"ffswarm-j-c0000-a1": "Traceback\nImportError: x\n"}
    )
    sup, _ = make(tmp_path, swarm, retries=0)
    runs = sup.run(["c0000"])
    assert "ImportError: x" in (runs["c0000"].reason or "")
    assert (sup.rundir.path / "logs" / "c0000.a1.log").read_text() == "Traceback\nImportError: x\n"


def test_scale_changes_the_window_live(tmp_path: Path) -> None:
    swarm = FakeSwarm()
    sup, clock = make(tmp_path, swarm, max_concurrent=1)
    orig = clock.sleep

    def sleep(s: float) -> None:
        orig(s)
        if clock.now > 2:
            sup.rundir.write_control(Control(3))

    sup.sleep = sleep
    sup.run([f"c{i:04d}" for i in range(8)])
    assert swarm.max_alive == 3


def test_node_loss_moves_the_chunk_without_using_retries(tmp_path: Path) -> None:
    from controller.swarm.backend import NodeState

    swarm = FakeSwarm(
        script={("c0000", 1): Outcome("running")},
        node_states=[NodeState("node-1", "w1", "ready", "active", 2), NodeState("node-2", "w2", "ready", "active", 2)],
    )
    sup, clock = make(tmp_path, swarm, retries=0, timeout=1e9)
    orig = clock.sleep

    def sleep(s: float) -> None:
        orig(s)
        if clock.now > 3:  # the node dies while the chunk runs on it
            swarm.node_states[0] = NodeState("node-1", "w1", "down", "active", 2)

    sup.sleep = sleep
    runs = sup.run(["c0000"])
    run = runs["c0000"]
    assert run.state is ChunkState.DONE and run.retries_used == 0
    assert [a.node for a in run.attempts] == ["node-1", "node-2"]
    assert run.attempts[0].reason == "node w1 is down"
    assert swarm.created[1].constraints[-1] == "node.id!=node-1"


def test_infrastructure_failure_avoids_the_node_only_while_another_can_run_it(tmp_path: Path) -> None:
    from controller.swarm.backend import NodeState

    two = [NodeState("node-1", "w1", "ready", "active", 2), NodeState("node-2", "w2", "ready", "active", 2)]
    swarm = FakeSwarm(script={("c0000", 1): Outcome("failed", 137)}, node_states=two)
    sup, _ = make(tmp_path, swarm, backoff_base=0.0)
    assert sup.run(["c0000"])["c0000"].state is ChunkState.DONE
    assert "node.id!=node-1" in swarm.created[1].constraints

    single = FakeSwarm(script={("c0000", 1): Outcome("failed", 137)})
    sup, _ = make(tmp_path / "b", single, backoff_base=0.0)
    assert sup.run(["c0000"])["c0000"].state is ChunkState.DONE
    assert not any(c.startswith("node.id") for c in single.created[1].constraints)


def test_resumed_chunks_continue_attempt_numbers(tmp_path: Path) -> None:
    swarm = FakeSwarm()
    sup, _ = make(tmp_path, swarm)
    (sup.rundir.path / "logs").mkdir()
    (sup.rundir.path / "logs" / "c0000.a2.log").write_text("{}\n")
    sup.run(["c0000"])
    assert [s.name for s in swarm.created] == ["ffswarm-j-c0000-a3"]
    assert (sup.rundir.state() or {})["chunks"]["c0000"]["state"] == "done"


def test_last_words_prefer_the_runners_error_field() -> None:
    from controller.run.failures import last_words

    log = '{"event": "start"}\n{"event": "runner failed", "error": "pack: w600k_r50.onnx has the wrong checksum"}\n'
    assert last_words(log) == "pack: w600k_r50.onnx has the wrong checksum"
    assert last_words("Traceback (most recent call last):\nImportError: nope\n") == "ImportError: nope"
    assert last_words("") is None


# -- a step beside the chunks (the identity step) -----------------------------------------------------
def test_chunks_start_beside_the_gate_and_the_run_waits_for_its_answer(tmp_path: Path) -> None:
    """The first chunks are created before the gate (the identity step) has answered, and the run
    does not end while it has not, even when every chunk is already done."""
    swarm = FakeSwarm()
    sup, clock = make(tmp_path, swarm, max_concurrent=2)
    seen: list[int] = []

    def gate() -> bool:
        seen.append(len(swarm.created))
        return clock.now >= 20.0  # answers long after both chunks have completed

    runs = sup.run(["c0000", "c0001"], gate=gate)
    assert seen[0] == 2  # both chunk services existed at the first look at the gate
    assert clock.now >= 20.0 and all(r.state is ChunkState.DONE for r in runs.values())


def test_a_gate_error_ends_the_run_and_propagates(tmp_path: Path) -> None:
    swarm = FakeSwarm(script={("c0000", 1): Outcome("running"), ("c0001", 1): Outcome("running")})
    sup, clock = make(tmp_path, swarm, timeout=1e9)

    def gate() -> bool:
        if clock.now > 2:
            raise JobFileError("job.yaml", "source", "faces/x.jpg: no face detected")
        return False

    with pytest.raises(JobFileError, match="no face detected"):
        sup.run(["c0000", "c0001", "c0002"], gate=gate)
    assert sorted(swarm.alive()) == ["ffswarm-j-c0000-a1", "ffswarm-j-c0001-a1"]  # left to the caller


def test_adoption_keeps_the_running_steps_service(tmp_path: Path) -> None:
    swarm = FakeSwarm()
    step = dataclasses.replace(
        chunk_service(settings(), "identity", 1),
        name="ffswarm-j-identity",
        labels={**chunk_service(settings(), "identity", 1).labels, LABEL_ROLE: "identity"},
    )
    swarm.add_orphan(step, Outcome("running"))
    sup, clock = make(tmp_path, swarm)
    sup.run(["c0000"], gate=lambda: clock.now > 5)
    assert "ffswarm-j-identity" in swarm.alive()  # the gate's owner removes it, not the supervisor


def _result_line(item: str, attempt: int) -> str:
    return ItemResult(item=item, status=ItemStatus.OK, attempt=attempt, input="/data/a", output="/data/b").to_line()


@pytest.mark.parametrize(
    ("lines", "ending"),
    [
        ([("i0", 1), ("i1", 1), ("i2", 1)], True),  # every item recorded by this attempt: about to exit
        ([("i0", 1), ("i1", 1)], False),  # one item to go
        ([("i0", 0), ("i1", 0), ("i2", 0)], False),  # an earlier attempt's lines do not count
    ],
)
def test_a_chunk_whose_items_are_all_recorded_is_watched_closely(
    tmp_path: Path, lines: list[tuple[str, int]], ending: bool
) -> None:
    """Between looks at the swarm the watch reads the results files: once the current attempt has a
    line for each item, the container is about to exit and the swarm is asked every ending_poll
    (the fake's task completes on the third look) instead of every poll."""
    swarm = FakeSwarm()
    rundir = RunDir(tmp_path, "j")
    (rundir.path / "results").mkdir(parents=True)
    rundir.write_control(Control(1))
    body = "".join(_result_line(i, a) for i, a in lines)
    (rundir.path / "results" / "c0000.a1.jsonl").write_text(body + '{"item": "i2", "stat')  # and a torn line
    clock = Clock()
    policy = Policy(retries=0, poll=0.5, ending_poll=0.05)
    sup = Supervisor(swarm, rundir, settings(), policy, clock=clock, sleep=clock.sleep, sizes={"c0000": 3})
    assert sup.run(["c0000"])["c0000"].state is ChunkState.DONE
    assert (clock.now < 0.2) if ending else (clock.now >= 1.0)


# --- Docker events -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("died", "alive", "seen_between"),
    [
        (True, True, (0.0, 0.2)),  # the container died here: the swarm is asked every ending_poll
        (False, True, (3.9, 4.2)),  # nothing heard: the swarm is asked every event_poll (2 s)
        (False, False, (1.0, 1.2)),  # the stream is gone: every poll (0.5 s), as without events
    ],
)
def test_events_decide_how_often_the_swarm_is_asked(
    tmp_path: Path, died: bool, alive: bool, seen_between: tuple[float, float]
) -> None:
    """The fake's task completes on the third look. With Docker's event stream flowing the watch
    looks every event_poll, at once when a container of the job dies; without it, every poll."""
    swarm = FakeSwarm()
    sup, clock = make(tmp_path, swarm, event_poll=2.0, ending_poll=0.05)
    exits = {"ffswarm-j-c0000-a1": 70} if died else {}  # a code the swarm's task record must explain
    swarm.job_events = FakeEvents(clock.sleep, died=exits, alive=alive)
    assert sup.run(["c0000"])["c0000"].state is ChunkState.DONE
    assert seen_between[0] <= clock.now < seen_between[1]
    assert swarm.job_events.closed  # the stream is closed with the run


def test_a_node_event_makes_the_watch_read_the_nodes_at_once(tmp_path: Path) -> None:
    """A node that dies under a running chunk is acted on when its event arrives, not at the next
    node poll (here 1,000 s away): the chunk moves to the other node and finishes."""
    from controller.swarm.backend import NodeState

    two = [NodeState("node-1", "w1", "ready", "active", 2), NodeState("node-2", "w2", "ready", "active", 2)]
    swarm = FakeSwarm(script={("c0000", 1): Outcome("running")}, node_states=two)
    sup, clock = make(tmp_path, swarm, retries=0, timeout=1e9, node_poll=1000.0, event_poll=2.0)

    def sleep(s: float) -> None:
        clock.sleep(s)
        if clock.now > 3 and swarm.node_states[0].state == "ready":
            swarm.node_states[0] = NodeState("node-1", "w1", "down", "active", 2)
            events.node_change = True

    events = swarm.job_events = FakeEvents(sleep)
    run = sup.run(["c0000"])["c0000"]
    assert run.state is ChunkState.DONE and [a.node for a in run.attempts] == ["node-1", "node-2"]
    assert clock.now < 10


def test_scale_and_cancel_are_acted_on_without_waiting_for_the_next_poll(tmp_path: Path) -> None:
    """control.json is watched between looks at the swarm: a cancel written 1 s into a job whose
    next look is 2 s away removes its service within ending_poll."""
    swarm = FakeSwarm(script={("c0000", 1): Outcome("running")})
    sup, clock = make(tmp_path, swarm, event_poll=2.0, ending_poll=0.05)
    asked: list[float] = []

    def sleep(s: float) -> None:
        clock.sleep(s)
        if clock.now > 1.0 and not asked:
            sup.rundir.write_control(Control(2, cancel=True))
            asked.append(clock.now)

    swarm.job_events = FakeEvents(sleep)
    run = sup.run(["c0000"])["c0000"]
    assert run.state is ChunkState.CANCELLED and swarm.alive() == []
    assert clock.now - asked[0] < 0.2


@pytest.mark.parametrize("code", [0, 3])
def test_a_container_that_exited_here_ends_its_chunk_before_the_swarm_records_it(tmp_path: Path, code: int) -> None:
    """Swarm's task record lags the container's exit; a die event whose exit code ends the chunk (0,
    or 3: some items failed) is enough — here the record would say "running" forever."""
    swarm = FakeSwarm(script={("c0000", 1): Outcome("running")})
    sup, clock = make(tmp_path, swarm, event_poll=2.0, ending_poll=0.05)
    swarm.job_events = FakeEvents(clock.sleep, died={"ffswarm-j-c0000-a1": code})
    run = sup.run(["c0000"])["c0000"]
    assert run.state is ChunkState.DONE and run.current.exit_code == code
    assert swarm.alive() == [] and clock.now < 0.2


# -- the engine restarting under a running job (Tried as a new user, part 6) ------------------------
class RestartingSwarm(FakeSwarm):
    """Goes down for `down_for` calls once its `at`-th services() call has answered."""

    def __init__(self, at: int, down_for: int, **kw: object) -> None:
        super().__init__(**kw)  # type: ignore[arg-type]
        self.at, self.down_for, self.calls = at, down_for, 0

    def services(self, job: str) -> list[ServiceState]:
        out = super().services(job)
        self.calls += 1
        if self.calls == self.at:
            self.down = self.down_for
        return out


def test_an_engine_restart_is_ridden_out_and_killed_chunks_rerun_without_using_retries(tmp_path: Path) -> None:
    swarm = RestartingSwarm(at=4, down_for=6)
    events: list[str] = []
    sup, clock = make(tmp_path, swarm, max_concurrent=2, retries=0)
    sup.emit = lambda event, **f: events.append(event)  # type: ignore[method-assign]
    runs = sup.run(["c0000", "c0001", "c0002"])
    assert all(r.state is ChunkState.DONE for r in runs.values()), {k: r.as_dict() for k, r in runs.items()}
    killed = [r for r in runs.values() if len(r.attempts) == 2]
    assert killed, "the restart killed no running chunk: the test did not test anything"
    for r in killed:
        assert r.attempts[0].outcome == "infrastructure" and "137" in (r.attempts[0].reason or "")
        assert r.retries_used == 0  # retries=0, and still re-run: the engine's fault, not the chunk's
    assert "engine_unavailable" in events and "engine_back" in events
    assert events.count("engine_unavailable") == 1
    names = [s.name for s in swarm.created]
    assert len(names) == len(set(names))  # never two services with one name
    assert clock.now < 60  # waited with backoff, not for the whole outage budget


def test_an_engine_that_stays_away_ends_the_watch_with_how_to_resume(tmp_path: Path) -> None:
    swarm = RestartingSwarm(at=2, down_for=10_000)
    sup, clock = make(tmp_path, swarm, engine_outage=30.0)
    with pytest.raises(EngineUnavailable) as raised:
        sup.run(["c0000"])
    assert "ffswarm resume j" in str(raised.value) and "\n" not in str(raised.value)
    assert 30 <= clock.now < 40
    state = sup.rundir.state()
    assert state is not None and state["chunks"]["c0000"]["state"] == "running"  # kept for resume


def test_a_create_refused_by_a_stopping_engine_loses_no_chunk(tmp_path: Path) -> None:
    swarm = FakeSwarm()
    sup, _ = make(tmp_path, swarm, max_concurrent=4)
    original = swarm.create_service
    failed_once: list[str] = []

    def create(spec: ServiceSpec) -> str:
        if not failed_once:
            failed_once.append(spec.name)
            raise EngineUnavailable("cannot reach the Docker engine: Connection refused")
        return original(spec)

    swarm.create_service = create  # type: ignore[method-assign]
    runs = sup.run(["c0000", "c0001", "c0002"])
    assert all(r.state is ChunkState.DONE for r in runs.values())
    assert sorted({s.labels["io.ffswarm.chunk"] for s in swarm.created}) == ["c0000", "c0001", "c0002"]
