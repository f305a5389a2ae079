"""A job's own lanes (``runners.linger``, controller/run/lanes.py own_lanes) through the supervisor on the
in-memory FakeSwarm: a fake runner writes what a lingering runner would (each attempt's record, after
each hand-off), so the supervisor's view is the one a real lane gives it."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any

import pytest

from contract.attempt import AttemptRecord
from contract.exits import RunnerExit
from contract.handoff import ENV_LANE, Handoff
from contract.results import ItemResult, ItemStatus
from controller.run import usecase
from controller.run.chunks import Policy
from controller.run.failures import ChunkState
from controller.run.lanes import (
    ROLE_JOB_LANE,
    ROLE_SHARED_LANE,
    gpu_slots,
    in_shared,
    own_lanes,
    shared_lanes,
)
from controller.run.rundir import Control, RunDir
from controller.run.supervisor import Supervisor
from controller.run.warmth import warmth
from controller.settings.fields import FieldError
from controller.settings.runners import RunnersSettings, parse_runners
from controller.swarm.servicespec import LABEL_ATTEMPT, LABEL_CHUNK, LABEL_JOB, LABEL_ROLE, chunk_service
from tests.builders import JPEG, make_config
from tests.fakes import FakeEvents, FakeSwarm, Outcome
from tests.unit.test_lanes import settings

JOB = "warm-job"
CHUNKS = ["c0000", "c0001", "c0002", "c0003"]


class JobLaneRunner:
    """A job lane's runner, seen from the run folder: its first chunk, then each chunk handed to it,
    ends with an attempt record (``die``: the chunk whose hand-off kills the lane's container)."""

    def __init__(self, swarm: FakeSwarm, root: Path, die: str = "", exits: dict[str, str] | None = None) -> None:
        self.swarm, self.root, self.die = swarm, root, die
        self.exits = exits or {}  # chunk -> how its attempt ends (a RunnerExit name; OK unless said)
        self.jobs: list[str] = []  # the job of each chunk run
        self.seen: dict[str, int] = {}  # lane service -> hand-off seq last run
        self.ran: list[tuple[str, str, int]] = []  # (service, chunk, attempt) in the order run
        self.at: list[float] = []  # when each of them ran (the supervisor's clock)
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds
        for spec in self.swarm.created:
            role = spec.labels.get(LABEL_ROLE)
            if role not in (ROLE_JOB_LANE, ROLE_SHARED_LANE) or spec.name not in self.swarm.alive():
                continue
            assert spec.env.get(ENV_LANE) == "1"  # only a lane's runner lingers
            first, label = spec.labels[LABEL_CHUNK], spec.labels[LABEL_JOB]
            home = label if role == ROLE_JOB_LANE else label.removeprefix("lane-").removesuffix(f"-{first}")
            if spec.name not in self.seen:
                self.seen[spec.name] = 0
                self._end(spec.name, first, int(spec.labels[LABEL_ATTEMPT]), home)
                continue
            handoff = Handoff.from_json(RunDir(self.root, home).layout.lane_handoff(first).read_text())
            if handoff.seq > self.seen[spec.name] and handoff.manifest is not None:
                self.seen[spec.name] = handoff.seq
                job, chunk = Path(handoff.manifest).parts[3], Path(handoff.manifest).stem  # /data/runs/<job>/chunks/…
                if chunk == self.die:
                    self.swarm.end(spec.name, Outcome("failed", 137, "task: non-zero exit (137)"))
                    self.die = ""
                    continue
                self._end(spec.name, chunk, handoff.attempt, job)

    def _end(self, service: str, chunk: str, attempt: int, job: str) -> None:
        self.ran.append((service, chunk, attempt))
        self.at.append(self.now)
        self.jobs.append(job)
        layout = RunDir(self.root, job).layout
        line = ItemResult(item=f"i{chunk}", status=ItemStatus.OK, attempt=attempt, input="/data/a", output="/data/b")
        layout.results(chunk, attempt).write_text(line.to_line())  # its one item, then its record
        t, code = time.time(), self.exits.get(chunk, "OK")
        if code not in ("OK", "ITEMS_FAILED"):  # the runner stops lingering: it exits with the chunk's code
            self.swarm.end(service, Outcome("failed", int(RunnerExit[code]), "task: non-zero exit"))
        layout.attempt_record(chunk, attempt).write_text(
            AttemptRecord(job, chunk, attempt, t, exit=code, finished=t).to_json()
        )


def _run(
    tmp_path: Path, swarm: FakeSwarm, die: str = "", width: int = 1, slots: int = 0, exits: dict[str, str] | None = None
) -> tuple[Supervisor, JobLaneRunner]:
    rundir = RunDir(tmp_path, JOB)
    rundir.make_dirs()
    rundir.write_control(Control(width))
    runner = JobLaneRunner(swarm, tmp_path, die, exits)
    s = settings(JOB)
    swarm.job_events = FakeEvents(runner.sleep)  # the event stream flows: the watch looks every event_poll
    policy = Policy(retries=0, timeout=60.0, schedule_timeout=10.0, poll=0.5, event_poll=2.0, gpu_slots=slots)
    events: list[tuple[str, dict[str, Any]]] = []
    sup = Supervisor(
        swarm,
        rundir,
        s,
        policy,
        on_event=lambda e, **f: events.append((e, f)),
        clock=runner,
        sleep=runner.sleep,
        sizes=dict.fromkeys(CHUNKS, 1),
        launcher=own_lanes(linger=30.0, max_age=600.0)(swarm, rundir, s),
    )
    sup.run(list(CHUNKS))
    return sup, runner


def _lane_swarm() -> FakeSwarm:
    # a lane's service runs until it is removed: its runner waits for the next chunk
    return FakeSwarm(script={(c, 1): Outcome("running") for c in CHUNKS})


def test_a_jobs_chunks_run_one_after_another_in_one_warm_service_which_is_gone_when_the_job_ends(
    tmp_path: Path,
) -> None:
    swarm = _lane_swarm()
    sup, runner = _run(tmp_path, swarm)
    assert all(sup.chunks[c].state is ChunkState.DONE for c in CHUNKS)
    (lane,) = [s for s in swarm.created]  # one service for the four chunks
    assert lane.labels[LABEL_JOB] == JOB and lane.labels[LABEL_ROLE] == ROLE_JOB_LANE  # the job's own label
    assert [(svc, c) for svc, c, _ in runner.ran] == [(lane.name, c) for c in CHUNKS]
    assert all(sup.chunks[c].current.service == lane.name and sup.chunks[c].current.attempt == 1 for c in CHUNKS)
    assert swarm.alive() == []  # retired when the job's run ended
    handoff = Handoff.from_json(RunDir(tmp_path, JOB).layout.lane_handoff("c0000").read_text())
    assert handoff.manifest is None and handoff.seq == len(CHUNKS)  # three chunks handed over, then "stop"
    # each next chunk is handed over as soon as the last one's record is read, not at the next look (2 s)
    gaps = [b - a for a, b in zip(runner.at, runner.at[1:], strict=False)]
    assert max(gaps) < 0.5, gaps


def test_two_lanes_at_width_two_and_a_lane_that_dies_is_dropped_its_chunk_run_again_fresh(tmp_path: Path) -> None:
    swarm = _lane_swarm()
    sup, runner = _run(tmp_path, swarm, die="c0002", width=2)
    assert all(sup.chunks[c].state is ChunkState.DONE for c in CHUNKS)
    lanes = [s.name for s in swarm.created if s.labels[LABEL_ROLE] == ROLE_JOB_LANE]
    fresh = [s for s in swarm.created if s.labels[LABEL_ROLE] != ROLE_JOB_LANE]
    assert len(lanes) == 2 and swarm.max_alive <= 2, swarm.created
    # the chunk whose lane died ran again in a service of its own, its retries untouched (retries: 0)
    assert [(s.labels[LABEL_CHUNK], s.labels[LABEL_ATTEMPT]) for s in fresh] == [("c0002", "2")], fresh
    assert ENV_LANE not in fresh[0].env
    assert [a.attempt for a in sup.chunks["c0002"].attempts] == [1, 2]
    assert swarm.alive() == []


def test_a_chunk_whose_inputs_fail_in_a_lane_fails_at_once_not_run_again_fresh(tmp_path: Path) -> None:
    """A source photo without a face (missing input) fails the same way in any runner: the chunk fails
    with its lane's attempt, and the job's next chunks go on in a new lane."""
    swarm = _lane_swarm()
    sup, runner = _run(tmp_path, swarm, exits={"c0001": "MISSING_INPUT"})
    failed = sup.chunks["c0001"]
    assert failed.state is ChunkState.FAILED and [a.attempt for a in failed.attempts] == [1], failed.attempts
    assert all(sup.chunks[c].state is ChunkState.DONE for c in CHUNKS if c != "c0001")
    assert all(s.labels[LABEL_ROLE] == ROLE_JOB_LANE for s in swarm.created), swarm.created  # no fresh service
    assert len(swarm.created) == 2 and swarm.alive() == []  # the lane that ended with it, and a new one


def test_no_more_warm_runners_than_gpu_slots_whatever_the_width(tmp_path: Path) -> None:
    """Warm runners keep their GPUs between chunks: a fifth service would sit pending behind them for
    the whole job, so at width 4 on 2 GPUs the job runs two, each taking the next chunk."""
    swarm = _lane_swarm()
    assert gpu_slots(swarm, 1) == 2 and gpu_slots(swarm, 2) == 1 and gpu_slots(swarm, 0) == 0
    sup, runner = _run(tmp_path, swarm, width=4, slots=gpu_slots(swarm, 1))
    assert all(sup.chunks[c].state is ChunkState.DONE for c in CHUNKS)
    assert len(swarm.created) == 2 and swarm.max_alive == 2, swarm.created
    assert len({svc for svc, _, _ in runner.ran}) == 2 and len(runner.ran) == len(CHUNKS)


def test_a_lane_an_earlier_run_left_is_removed_never_adopted(tmp_path: Path) -> None:
    swarm = _lane_swarm()
    left = chunk_service(settings(JOB), "c0001", 1)
    left = dataclasses.replace(
        left, name=f"{left.name}-lane", labels={**left.labels, LABEL_ROLE: ROLE_JOB_LANE}, env={ENV_LANE: "1"}
    )
    swarm.add_orphan(left, Outcome("running"))
    sup, runner = _run(tmp_path, swarm)
    assert left.name in swarm.removed
    assert all(sup.chunks[c].state is ChunkState.DONE and sup.chunks[c].current.service != left.name for c in CHUNKS)
    assert swarm.alive() == []


def test_runners_linger_is_checked_and_named_and_which_jobs_get_warm_runners(tmp_path: Path) -> None:
    assert parse_runners(None).linger == 0.0 and parse_runners({"linger": "10s"}).linger == 10.0
    for bad in ({"linger": "soon"}, {"linger": 2}, {"linger": 601}, {"other": 1}, ["linger"]):
        with pytest.raises(FieldError) as e:
            parse_runners(bad)
        assert (e.value.field or "").startswith("runners"), bad
    config = dataclasses.replace(make_config(tmp_path)[0], runners=RunnersSettings(linger=10.0))
    photos = {f"in/{i}.jpg": JPEG for i in range(3)} | {"faces/me.jpg": JPEG}
    for rel, data in photos.items():
        (config.data_root / rel).parent.mkdir(parents=True, exist_ok=True)
        (config.data_root / rel).write_bytes(data)
    found = {}
    for name, extra in (
        ("several", "chunk_size: 1\n"),
        ("one", "chunk_size: 10\n"),
        ("ref", "reference: faces/me.jpg\n"),
    ):
        path = config.data_root / "inbox" / f"{name}.yaml"
        path.write_text(
            f"name: {name}\nproviders: [cpu]\nsource: faces/me.jpg\ntargets: [in/*.jpg]\n"
            f"output: out/{name}/{{name}}\n{extra}"
        )
        found[name] = usecase.one_job(config, path)
    # a CLI job, of any size, may take (and leave) warm runners of `submit`'s, its chunks embedding its source
    assert len(found["several"].plan.chunks) == 3 and len(found["one"].plan.chunks) == 1
    assert all(found[n].linger == 10.0 and found[n].people_in_chunks for n in ("several", "one"))
    assert found["ref"].linger == 10.0 and not found["ref"].people_in_chunks  # its reference photo: the identity step
    # a tenant's job that cannot share lanes (its run folder outside its tenant's folder of runs, or
    # outputs outside out/): warm runners only for a next chunk of its own; the identity step as always
    several, one, ref = found["several"], found["one"], found["ref"]
    cold = {"linger": 10.0, "people_in_chunks": False}
    assert warmth(10.0, several.spec, several.plan, "acme", width=2, shared=False) == cold
    assert warmth(10.0, several.spec, several.plan, "acme", width=3, shared=False) == {}
    assert warmth(10.0, one.spec, one.plan, "acme", width=1, shared=False) == {}
    assert warmth(0.0, one.spec, one.plan, None, 1, shared=True) == {}
    # one that can (an API job writing under out/): warm runners of its tenant's kind whatever its size,
    # each chunk embedding its own source — unless a reference photo is to be embedded too
    assert warmth(10.0, one.spec, one.plan, "acme", width=1, shared=True) == {"linger": 10.0, "people_in_chunks": True}
    assert warmth(10.0, ref.spec, ref.plan, "acme", width=1, shared=True) == cold


def test_a_submits_later_job_of_the_same_kind_runs_in_the_runners_an_earlier_one_left_warm(tmp_path: Path) -> None:
    """``ffswarm submit a.yaml b.yaml c.yaml`` with runners.linger: b's chunks go to the runners a's
    chunks warmed (no service of b's own); c, of another image, retires them to make room for its own
    (the swarm's two GPUs); the pool's close at the end retires c's."""
    swarm = _lane_swarm()
    pool = shared_lanes(swarm, linger=30.0)
    runner = JobLaneRunner(swarm, tmp_path)
    swarm.job_events = FakeEvents(runner.sleep)
    policy = Policy(retries=0, timeout=60.0, schedule_timeout=10.0, poll=0.5, event_poll=2.0, gpu_slots=2)

    def job(name: str, image: str = "sha256:abc") -> Supervisor:
        rundir = RunDir(tmp_path, name)
        rundir.make_dirs()
        rundir.write_control(Control(4))
        s = dataclasses.replace(settings(name), image=image)
        launcher = in_shared(pool, max_age=600.0, wait=0.0)(swarm, rundir, s)
        sup = Supervisor(
            swarm,
            rundir,
            s,
            policy,
            clock=runner,
            sleep=runner.sleep,
            sizes=dict.fromkeys(CHUNKS[:2], 1),
            launcher=launcher,
        )
        sup.run(CHUNKS[:2])
        assert all(sup.chunks[c].state is ChunkState.DONE for c in CHUNKS[:2])
        return sup

    job("a")
    lanes = [s.name for s in swarm.created]
    assert len(lanes) == 2 and sorted(swarm.alive()) == sorted(lanes)  # kept warm past a's end
    assert all(
        s.labels[LABEL_ROLE] == ROLE_SHARED_LANE and s.labels[LABEL_JOB].startswith("lane-a-") for s in swarm.created
    )
    b = job("b")
    assert [s.name for s in swarm.created] == lanes  # no service of b's own …
    assert {b.chunks[c].current.service for c in CHUNKS[:2]} == set(lanes)  # … its chunks ran in a's runners
    assert runner.jobs == ["a", "a", "b", "b"]
    job("c", image="sha256:other")
    assert sorted(swarm.removed) == sorted(lanes) and len(swarm.alive()) == 2  # a's retired: two GPUs
    pool.close()
    assert swarm.alive() == []


def test_a_job_whose_chunks_all_run_in_another_jobs_lanes_never_lists_its_own_label(tmp_path: Path) -> None:
    """The watch lists services by the labels its running attempts are under: b's chunks run in the
    lanes a left warm (labelled a's), so asking the engine for services labelled b is a call per round
    that can find nothing (serve's packs in lanes made it every round of every pack)."""
    swarm = _lane_swarm()
    pool = shared_lanes(swarm, linger=30.0)
    runner = JobLaneRunner(swarm, tmp_path)
    swarm.job_events = FakeEvents(runner.sleep)
    policy = Policy(retries=0, timeout=60.0, schedule_timeout=10.0, poll=0.5, event_poll=2.0, gpu_slots=2)
    asked: list[str] = []
    listing = swarm.services

    def services(label: str) -> Any:
        asked.append(label)
        return listing(label)

    swarm.services = services  # type: ignore[method-assign]
    for name in ("a", "b"):
        asked.clear()
        rundir = RunDir(tmp_path, name)
        rundir.make_dirs()
        rundir.write_control(Control(4))
        launcher = in_shared(pool, max_age=600.0, wait=0.0)(swarm, rundir, settings(name))
        sup = Supervisor(
            swarm, rundir, settings(name), policy, clock=runner, sleep=runner.sleep, sizes=dict.fromkeys(CHUNKS[:2], 1),
            launcher=launcher,
        )  # fmt: skip
        sup.run(CHUNKS[:2])
        assert all(sup.chunks[c].state is ChunkState.DONE for c in CHUNKS[:2])
    assert runner.jobs == ["a", "a", "b", "b"]
    assert any(label.startswith("lane-a-") for label in asked)  # the lanes b's chunks ran in: watched
    assert asked.count("b") == 1  # its own label once: the look for an earlier run's services, at the start
    pool.close()
