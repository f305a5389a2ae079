"""Packs cut by a fault, as the soak found them: a pack whose `serve` was killed while it made the
pack (controller/serve/unmade.py) — its jobs' files, claimed again, run without it, none refused for
its own outputs or failed on a half-made folder — and a packed job whose end stopped after its
report (a full volume) — ended when its file comes again, not left ``stopped``."""

from __future__ import annotations

import errno
import os
import time
from pathlib import Path
from typing import Any

import pytest

from contract.identity import IdentityResult
from controller.job.claims import conflict
from controller.run import usecase
from controller.run.metrics import Metrics
from controller.run.packed import pack_of
from controller.run.rundir import RunDir, Stage
from controller.run.status import job_status
from controller.serve import jobs, packs, unmade
from controller.swarm.servicespec import LABEL_CHUNK, LABEL_JOB
from tests.fakes import FakeSwarm
from tests.unit.test_packs import commit, members, rundir


class Killed(BaseException):
    """`serve` SIGKILLed: nothing after this point of the pack's making ran."""


def cut_pack(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, where: str) -> tuple[object, list, RunDir]:
    """Jobs ``one`` and ``two`` packed; `serve` killed at job two's ``where`` ("packed": before its
    folder was begun, "create": after its ``packed`` file, before the rest of its folder)."""
    config, ms = members(tmp_path)
    real_write, real_create = RunDir.write_file, RunDir.create

    def write_file(self: RunDir, path: Path, data: bytes) -> None:
        if where == "packed" and self.job == "two" and path == self.layout.packed:
            raise Killed()
        real_write(self, path, data)

    def create(self: RunDir, *args: object, **kwargs: object) -> None:
        if where == "create" and self.job == "two":
            raise Killed()
        real_create(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(RunDir, "write_file", write_file)
    monkeypatch.setattr(RunDir, "create", create)
    with pytest.raises(Killed):
        packs.open_pack(config, FakeSwarm(), ms, config.data_root / "inbox" / "packs", 1)
    monkeypatch.undo()
    monkeypatch.setattr(jobs, "DockerSwarm", lambda _host: FakeSwarm())
    pack = RunDir(config.data_root, str(pack_of(rundir(config, "one"))))
    return config, ms, pack


def age(pack: RunDir, seconds: float) -> None:
    then = time.time() - seconds
    os.utime(pack.layout.members, (then, then))


@pytest.mark.parametrize("where", ["create", "packed"])
def test_a_pack_cut_while_made_frees_its_jobs_which_run_without_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    config, ms, pack = cut_pack(tmp_path, monkeypatch, where)
    two = ms[1].job
    assert unmade.state(config, pack.job) == unmade.MAKING  # young: it may still be being made
    first = jobs.run_job_file(config, two.file, Metrics())
    assert first.retry and not first.ok and "is being made" in (first.reason or "")
    assert pack.report() is None  # a pack being made is never touched

    age(pack, unmade.CUT_AFTER + 1)  # `serve` restarted, job two's file claimed again a minute on
    assert unmade.state(config, pack.job) == unmade.CUT
    again = jobs.run_job_file(config, two.file, Metrics())
    assert again.retry and not again.ok, again  # not refused: tried again, now without the pack
    assert "cut while it was being made" in (again.reason or "")
    assert job_status(pack)["outcome"] == "cancelled"  # the pack ended, having run nothing
    assert pack_of(rundir(config, "one")) is None and pack_of(rundir(config, "two")) is None
    assert conflict(config.data_root, "two", ["out/two/b.jpg"]) is None  # its claims released
    usecase.one_job(config, two.file)  # planned afresh: no output of its own refused as claimed
    assert rundir(config, "one").exists()  # job one's complete folder runs as a job of its own
    assert unmade.state(config, pack.job) is None


def test_a_whole_pack_is_never_unmade(tmp_path: Path) -> None:
    config, ms = members(tmp_path)
    _, runner = packs.open_pack(config, FakeSwarm(), ms, config.data_root / "inbox" / "packs", 1)
    age(runner.pack, unmade.CUT_AFTER + 1)
    assert unmade.state(config, runner.pack.job) is None  # every member made: resumed, not unmade


def test_a_packed_job_whose_end_stopped_after_its_report_ends_when_its_file_comes_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The volume filled up as the pack ended its job ``one``: its report was written, then ENOSPC
    before it was marked ended. Its file, claimed again, ends it (the soak saw it stay ``stopped``)."""
    config, ms = members(tmp_path)
    swarm = FakeSwarm()
    _, runner = packs.open_pack(config, swarm, ms, config.data_root / "inbox" / "packs", 1)
    pack = runner.pack
    swarm.on_end["c0000"] = lambda: (commit(pack, "i000000", "a", "one"), commit(pack, "i000001", "b", "two"))
    real_enter = RunDir.enter

    def enter(self: RunDir, stage: Stage, chunks: dict[str, Any] | None = None) -> dict[str, Any]:
        if self.job == "one" and stage == Stage.ENDED:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_enter(self, stage, chunks)

    monkeypatch.setattr(RunDir, "enter", enter)
    with pytest.raises(OSError):
        packs.resume(config, swarm, pack.job)
    monkeypatch.undo()
    one = rundir(config, "one")
    assert one.report() is not None and job_status(one)["phase"] != "finished"  # the soak found it "stopped"
    monkeypatch.setattr(jobs, "DockerSwarm", lambda _host: swarm)
    outcome = jobs.run_job_file(config, ms[0].job.file, Metrics())
    assert outcome.ok, outcome
    assert job_status(one)["phase"] == "finished" and job_status(one)["outcome"] == "succeeded"
    assert (one.state() or {}).get("stage") == Stage.ENDED


def test_a_packed_jobs_folder_is_made_whole_when_its_cut_pack_frees_it_to_run_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A packed job's run folder has no chunks/ and no runner folders (its chunks run in its pack's).
    Freed from a pack cut while it was made, job ``one`` runs its own chunk: its folder is made whole
    first (manifests its runner can read, the runner's folders), not refused for a missing manifest."""
    config, ms, pack = cut_pack(tmp_path, monkeypatch, "create")
    one = rundir(config, "one")
    assert one.exists() and one.made_for_pack()
    assert not one.layout.chunks_dir.exists() and not any(p.exists() for p in one.layout.runner_folders())
    age(pack, unmade.CUT_AFTER + 1)
    assert unmade.state(config, pack.job) == unmade.CUT
    swarm = FakeSwarm()
    monkeypatch.setattr(jobs, "DockerSwarm", lambda _host: swarm)
    freed = jobs.run_job_file(config, ms[0].job.file, Metrics())  # the cut pack unmade, the file tried again
    assert freed.retry and "cut while it was being made" in (freed.reason or ""), freed
    assert pack_of(one) is None
    swarm.on_end["identity"] = lambda: one.layout.identity.write_text(IdentityResult(source_embedding=(1.0,)).to_json())
    report = usecase.run(config, swarm, usecase.one_job(config, ms[0].job.file), [])  # as serve runs a job alone
    assert not one.made_for_pack() and all(p.is_dir() for p in one.layout.runner_folders())
    chunks = one.plan().chunks
    assert [one.manifest(c.id).job for c in chunks] == ["one"] * len(chunks)
    ran = [s for s in swarm.created if s.labels.get(LABEL_JOB) == "one" and s.labels.get(LABEL_CHUNK) != "identity"]
    assert [s.labels[LABEL_CHUNK] for s in ran] == [c.id for c in chunks]
    assert report.counts.chunks_done == len(chunks), report.counts
