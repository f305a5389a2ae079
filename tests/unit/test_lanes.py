"""Lanes through the launcher seam (controller/run/lanes.py LaneLauncher, controller/run/launch.py):
packs' supervisors drive the in-memory FakeSwarm, a fake lane runner writes what a lingering runner
would (its attempt records, after each hand-off), and one injected clock keeps every wait virtual."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest

from contract.attempt import AttemptRecord
from contract.handoff import Handoff
from controller.errors import FfswarmError
from controller.run.chunks import Policy
from controller.run.failures import ChunkState
from controller.run.lanes import ROLE_LANE, LaneLauncher, Lanes
from controller.run.launch import FreshLauncher
from controller.run.rundir import Control, RunDir
from controller.run.supervisor import Supervisor
from controller.swarm.servicespec import LABEL_ATTEMPT, LABEL_CHUNK, LABEL_JOB, LABEL_ROLE, RunnerSettings, VolumeSpec
from tests.fakes import FakeSwarm, Outcome

CHUNK = "c0000"


class LaneRunner:
    """What a lingering runner does, seen from the run folders: its first chunk, then each chunk
    handed to it, ends with an attempt record (``exits``: a pack's ending, OK unless said; "die":
    its container is killed instead). ``clock.sleep`` calls it: the runner works while time passes."""

    def __init__(self, swarm: FakeSwarm, root: Path) -> None:
        self.swarm, self.root = swarm, root
        self.exits: dict[str, str] = {}
        self.seen: dict[str, int] = {}  # lane service -> hand-off seq last run
        self.now = 0.0

    def sleep(self, seconds: float) -> None:
        self.now += seconds
        for spec in self.swarm.created:
            if spec.labels.get(LABEL_ROLE) != ROLE_LANE or spec.name not in self.swarm.alive():
                continue
            home = RunDir(self.root, spec.labels[LABEL_JOB].removeprefix("lane-").removesuffix(f"-{CHUNK}"))
            if spec.name not in self.seen:
                self.seen[spec.name] = 0
                self._end(spec.name, home.job, spec.labels[LABEL_CHUNK], int(spec.labels[LABEL_ATTEMPT]))
                continue
            raw = home.layout.lane_handoff(CHUNK).read_text()
            handoff = Handoff.from_json(raw)
            if handoff.seq > self.seen[spec.name] and handoff.manifest is not None:
                self.seen[spec.name] = handoff.seq
                job = Path(handoff.manifest).parts[3]  # /data/runs/<job>/chunks/<chunk>.json
                self._end(spec.name, job, CHUNK, handoff.attempt)

    def __call__(self) -> float:
        return self.now

    def _end(self, service: str, job: str, chunk: str, attempt: int) -> None:
        kind = self.exits.get(job, "OK")
        if kind == "die":
            self.swarm.end(service, Outcome("failed", 137, "task: non-zero exit (137)"))
            return
        if kind == "exit":  # it stopped waiting just before the hand-off: exited 0, the attempt not run
            self.swarm.end(service, Outcome("complete", 0))
            return
        if kind == "silent":  # it hangs: no record, its service still running
            return
        t = time.time()
        record = AttemptRecord(job, chunk, attempt, t, exit=kind, finished=t)
        RunDir(self.root, job).layout.attempt_record(chunk, attempt).write_text(record.to_json())


def settings(job: str) -> RunnerSettings:
    return RunnerSettings(
        job=job,
        image="sha256:abc",
        constraints=("node.labels.ffswarm.gpu==true",),
        gpu_kind="GPU",
        gpus=1,
        memory_bytes=2 << 30,
        volume=VolumeSpec.bind("/srv/d"),
        user="1000:1000",
    )


class Serve:
    """One `serve`'s lanes, and its packs run through them, on one fake swarm and one fake clock."""

    def __init__(self, tmp_path: Path, gpus: int | None = None, **policy: float) -> None:
        self.root = tmp_path
        # a lane's service runs until it is removed: its runner waits for the next chunk
        self.swarm = FakeSwarm(script={(CHUNK, 1): Outcome("running")})
        self.runner = LaneRunner(self.swarm, tmp_path)
        clock = self.runner
        self.lanes = Lanes(
            lambda: self.swarm, 30.0, capacity=lambda: gpus, owner="serve-1", clock=clock, sleep=clock.sleep
        )
        self.policy = Policy(**{"retries": 0, "timeout": 60.0, "schedule_timeout": 10.0, "poll": 0.5, **policy})  # type: ignore[arg-type]
        self.events: list[tuple[str, dict[str, object]]] = []

    def pack(self, job: str, key: str, gate: Callable[[], bool] | None = None) -> tuple[Supervisor, RunDir]:
        """A one-chunk pack, run to its end through the lanes."""
        rundir = RunDir(self.root, job)
        rundir.make_dirs()
        rundir.write_control(Control(1))
        s = settings(job)
        launcher = LaneLauncher(self.lanes, key, rundir, s, FreshLauncher(self.swarm, s), max_age=60.0, wait=10.0)
        sup = Supervisor(
            self.swarm,
            rundir,
            s,
            self.policy,
            on_event=lambda e, **f: self.events.append((e, f)),
            clock=self.runner,
            sleep=self.runner.sleep,
            launcher=launcher,
        )
        sup.run([CHUNK], gate=gate)
        return sup, rundir

    def lane_services(self) -> list[str]:
        return [s.name for s in self.swarm.created if s.labels.get(LABEL_ROLE) == ROLE_LANE]


def test_a_pack_is_handed_to_the_idle_lane_of_its_kind_and_not_run_again(tmp_path: Path) -> None:
    serve = Serve(tmp_path)
    first, a = serve.pack("pack-aaaa", "tenant-a/kind")
    assert first.chunks[CHUNK].state is ChunkState.DONE
    (lane,) = serve.lane_services()
    assert lane in serve.swarm.alive()  # it waits for the next pack, kept by the lanes
    second, b = serve.pack("pack-bbbb", "tenant-a/kind")
    run = second.chunks[CHUNK]
    assert run.state is ChunkState.DONE and [x.attempt for x in run.attempts] == [1]  # run once, in the lane
    assert run.current.service == lane and run.current.exit_code == 0
    assert [s.name for s in serve.swarm.created] == [lane]  # no service of its own
    handoff = Handoff.from_json(a.layout.lane_handoff(CHUNK).read_text())
    assert handoff.seq == 1 and handoff.manifest == "/data/runs/pack-bbbb/chunks/c0000.json"
    state = b.state()
    assert state is not None and state["chunks"][CHUNK]["attempts"][0]["service"] == lane  # state.json names it


def test_a_pack_run_in_lanes_waits_for_no_container_of_its_own_and_one_run_fresh_does(tmp_path: Path) -> None:
    serve = Serve(tmp_path)
    serve.pack("pack-aaaa", "tenant-a/kind")  # a new lane, its service labelled by the lane, not the pack
    serve.pack("pack-bbbb", "tenant-a/kind")  # handed to that lane
    assert serve.swarm.swept == []  # no container of either pack to wait for: the engine is not asked
    serve.runner.exits["pack-cccc"] = "die"
    sup, _ = serve.pack("pack-cccc", "tenant-a/kind")  # its chunk run again in a service of its own
    assert sup.chunks[CHUNK].current.service == "ffswarm-pack-cccc-c0000-a2"
    assert serve.swarm.swept == ["pack-cccc"]  # whose container the run waits to see removed


def test_a_pack_of_another_key_starts_a_lane_of_its_own(tmp_path: Path) -> None:
    serve = Serve(tmp_path)
    _, a = serve.pack("pack-aaaa", "tenant-a/kind")
    other, _ = serve.pack("pack-cccc", "tenant-b/kind")  # another tenant: never the first one's lane
    assert other.chunks[CHUNK].state is ChunkState.DONE
    assert serve.lane_services() == ["ffswarm-lane-pack-aaaa-c0000", "ffswarm-lane-pack-cccc-c0000"]
    assert other.chunks[CHUNK].current.service == "ffswarm-lane-pack-cccc-c0000"
    assert Handoff.from_json(a.layout.lane_handoff(CHUNK).read_text()).seq == 0  # nothing handed to it


def test_a_lane_whose_service_dies_is_dropped_and_the_chunk_reruns_as_a_fresh_service(tmp_path: Path) -> None:
    serve = Serve(tmp_path)  # retries 0: the lane's failure is not the chunk's
    serve.pack("pack-aaaa", "tenant-a/kind")
    (lane,) = serve.lane_services()
    serve.runner.exits["pack-bbbb"] = "die"
    sup, _ = serve.pack("pack-bbbb", "tenant-a/kind")
    run = sup.chunks[CHUNK]
    assert run.state is ChunkState.DONE and run.retries_used == 0
    assert [(x.attempt, x.service) for x in run.attempts] == [(1, lane), (2, "ffswarm-pack-bbbb-c0000-a2")]
    assert "137" in (run.attempts[0].reason or "") and run.attempts[0].outcome == "infrastructure"
    assert lane in serve.swarm.removed and lane not in serve.swarm.alive()  # the dead lane is not trusted
    assert [e for e, _ in serve.events].count("chunk_lane_dropped") == 1
    assert serve.lanes.take("tenant-a/kind", 600) is None  # nor kept for the next pack
    third, _ = serve.pack("pack-dddd", "tenant-a/kind")  # the next pack starts a lane afresh
    assert third.chunks[CHUNK].current.service == "ffswarm-lane-pack-dddd-c0000"


def test_a_lane_whose_runner_hangs_times_out_and_the_chunk_reruns_fresh_without_waiting(tmp_path: Path) -> None:
    serve = Serve(tmp_path, timeout=120.0)
    serve.pack("pack-aaaa", "tenant-a/kind")
    serve.runner.exits["pack-bbbb"] = "silent"
    started = time.monotonic()
    sup, _ = serve.pack("pack-bbbb", "tenant-a/kind")
    run = sup.chunks[CHUNK]
    assert run.state is ChunkState.DONE and [x.attempt for x in run.attempts] == [1, 2]
    assert "timed out after 120s" in (run.attempts[0].reason or "") and run.retries_used == 0
    assert serve.runner.now > 120 and time.monotonic() - started < 5  # the clock's time, not the test's


def test_a_lane_attempt_that_ended_for_its_own_reason_is_run_again_in_a_fresh_service(tmp_path: Path) -> None:
    serve = Serve(tmp_path)
    serve.pack("pack-aaaa", "tenant-a/kind")
    serve.runner.exits["pack-bbbb"] = "TEMPORARY"
    sup, _ = serve.pack("pack-bbbb", "tenant-a/kind")
    run = sup.chunks[CHUNK]
    assert run.state is ChunkState.DONE and run.attempts[0].exit_code == 75 and run.retries_used == 0
    assert run.attempts[1].service == "ffswarm-pack-bbbb-c0000-a2"
    assert serve.lane_services() == ["ffswarm-lane-pack-aaaa-c0000"] and not serve.swarm.alive()


def test_items_failed_in_a_lane_end_the_chunk_and_keep_the_lane(tmp_path: Path) -> None:
    serve = Serve(tmp_path)
    serve.pack("pack-aaaa", "tenant-a/kind")
    serve.runner.exits["pack-bbbb"] = "ITEMS_FAILED"
    sup, _ = serve.pack("pack-bbbb", "tenant-a/kind")
    run = sup.chunks[CHUNK]
    assert run.state is ChunkState.DONE and run.current.exit_code == 3 and len(run.attempts) == 1
    assert serve.lanes.take("tenant-a/kind", 600) is not None  # given back for the next pack


def test_a_lane_whose_runner_exited_before_the_hand_off_is_not_trusted(tmp_path: Path) -> None:
    serve = Serve(tmp_path)
    serve.pack("pack-aaaa", "tenant-a/kind")
    serve.runner.exits["pack-bbbb"] = "exit"
    sup, _ = serve.pack("pack-bbbb", "tenant-a/kind")
    run = sup.chunks[CHUNK]
    assert [(x.attempt, x.outcome) for x in run.attempts] == [(1, "infrastructure"), (2, "done")]
    assert run.state is ChunkState.DONE and run.current.service == "ffswarm-pack-bbbb-c0000-a2"


def test_a_watch_that_ends_early_drops_the_lane_it_held(tmp_path: Path) -> None:
    """A lane's attempt is never adopted by a later controller: a watch that stops while one runs
    (here its gate refuses the job) removes the lane and frees its GPU for the next pack."""
    serve = Serve(tmp_path, gpus=1)
    serve.pack("pack-aaaa", "tenant-a/kind")
    serve.runner.exits["pack-bbbb"] = "silent"
    looks = iter([False, False])

    def gate() -> bool:
        if next(looks, None) is None:
            raise FfswarmError("refused")
        return False

    with pytest.raises(FfswarmError):
        serve.pack("pack-bbbb", "tenant-a/kind", gate=gate)
    assert "ffswarm-lane-pack-aaaa-c0000" in serve.swarm.removed
    assert serve.lanes.obtain("tenant-b/kind", 60.0, 1, wait=0) == (None, True)  # its GPU is free again
