"""How many packs `serve` runs at once (controller/serve/daemon.py ``_launch_packs``): packs that reserve
GPUs are bounded by the swarm's GPUs that no other pack holds (plus one pack made ready ahead), not by
`--concurrent-jobs`, whose default is 1: a swarm of 4 GPUs behind one job slot ran one pack at a time,
three GPUs idle through a burst. A pack that reserves no GPU, or any pack while the swarm's size is
unknown, still takes a job slot."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
import yaml

from controller.config import parse_config
from controller.errors import EngineUnavailable
from controller.run.metrics import Metrics
from controller.serve import jobs
from controller.serve.daemon import PACK_AHEAD_GPUS, Inbox, Server
from controller.serve.packing import Member
from controller.swarm.backend import NodeState
from tests.builders import JPEG, make_config
from tests.fakes import FakeSwarm
from tests.unit.test_packing import _job

ONE = "source: faces/me.jpg\ntargets: [in/0.jpg]\noutput: o/{name}\n"


def serve_with(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, gpus: int | None) -> tuple[Server, list[Any]]:
    """serve with packing on (a pack of one photo each) and one job slot, on a swarm of ``gpus``
    (None: the engine not answering); start_pack records each launch instead of running it."""
    make_config(tmp_path)
    path = tmp_path / "ffswarm.yaml"
    data = yaml.safe_load(path.read_text())
    data["packing"] = {"max_items": 1, "window": "1s", "pack_items": 1}
    path.write_text(yaml.safe_dump(data))
    config = parse_config(path, data)
    swarm = FakeSwarm()
    swarm.node_states = [NodeState("n1", "gpu-1", "ready", "active", gpus or 0)]

    def engine(host: str | None) -> FakeSwarm:
        if gpus is None:
            raise EngineUnavailable("the engine is not answering")
        return swarm

    monkeypatch.setattr(jobs, "DockerSwarm", engine)
    serve = Server(config, Inbox(config.data_root / "inbox"), Metrics(), concurrent_jobs=1)
    launched: list[Any] = []

    def start_pack(members: list[Member], parallel: int | None = None, slot: bool = True) -> None:
        launched.append((members[0].job.job_id, slot))
        serve._pack_gpus[len(launched)] = members[0].job.spec.resources.gpus * (parallel or 1)

    monkeypatch.setattr(serve, "start_pack", start_pack)
    return serve, launched


def offer(serve: Server, tmp_path: Path, names: list[str], extra: str = "") -> None:
    job = _job(serve.config, "one", extra + ONE, {"in/0.jpg": JPEG, "faces/me.jpg": JPEG})
    assert serve.packer is not None
    for n in names:
        member = Member(Path(f"/inbox/running/{n}.yaml"), dataclasses.replace(job, job_id=n), None)
        assert serve.packer.offer(member)
    serve.packer.clock = lambda: 1e9  # every window has passed


def test_a_swarm_of_4_gpus_runs_as_many_packs_as_its_gpus_allow_behind_one_job_slot(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    serve, launched = serve_with(tmp_path, monkeypatch, gpus=4)
    packer = serve.packer
    assert packer is not None and packer.gpus is not None and packer.gpus() == 4  # the swarm's GPUs: pack sizes
    offer(serve, tmp_path, [f"p{n}" for n in range(8)])
    serve._launch_packs()
    assert len(launched) == 4 + PACK_AHEAD_GPUS  # every GPU, and one pack ready ahead
    assert not any(slot for _, slot in launched)
    assert serve.slots is not None and serve.slots.acquire(blocking=False)  # the job slot is still free


def test_packs_without_gpus_or_on_a_swarm_of_unknown_size_take_the_job_slot(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    serve, launched = serve_with(tmp_path, monkeypatch, gpus=4)
    offer(serve, tmp_path, ["c0", "c1"], extra="resources: {gpus: 0}\n")
    serve._launch_packs()
    assert launched == [("c0", True)]  # the one job slot: the other waits for it

    unknown, launched = serve_with(tmp_path / "u", monkeypatch, gpus=None)
    offer(unknown, tmp_path, ["g0", "g1"])
    unknown._launch_packs()
    assert launched == [("g0", True)]
