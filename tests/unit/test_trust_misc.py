"""Smaller parts of issue 15 (f): values read back from the shared volume are checked, and the
metrics endpoint listens on loopback unless told otherwise."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from controller.cli import ops
from controller.config import Config, parse_config
from controller.run import timings
from controller.run.metrics import Metrics
from controller.serve.daemon import MAX_STARTS, Inbox, Outcome, Server

GOOD = {"cold_start_s": 4.0, "item_s": 0.5, "job": "j", "measured_at": 1.0}


@pytest.mark.parametrize(
    "entry",
    [
        {**GOOD, "item_s": "0.5"},
        {**GOOD, "item_s": 0},
        {**GOOD, "item_s": float("inf")},
        {**GOOD, "cold_start_s": float("nan")},
        {**GOOD, "cold_start_s": -1},
        {**GOOD, "cold_start_s": True},
        {**GOOD, "job": 5},
        {**GOOD, "extra": 1},
        [1, 2],
        "x",
    ],
)
def test_a_bad_timing_value_is_ignored_and_logged(tmp_path: Path, entry: object) -> None:
    (tmp_path / "runs").mkdir()
    (tmp_path / timings.FILE).write_text(json.dumps({"default/cuda": entry}, allow_nan=True))
    with capture_logs() as logs:
        assert timings.lookup(tmp_path, "default", ("cuda",)) is None  # as if none: the job goes on
    assert [(e["event"], e["key"]) for e in logs] == [("timing_ignored", "default/cuda")]


def test_a_good_timing_value_is_used(tmp_path: Path) -> None:
    (tmp_path / "runs").mkdir()
    (tmp_path / timings.FILE).write_text(json.dumps({"default/cuda": GOOD}))
    assert timings.lookup(tmp_path, "default", ("cuda",)) == timings.Timing(4.0, 0.5, "j", 1.0)


def test_metrics_listen_on_loopback_by_default() -> None:
    option = next(p for p in ops.serve.params if p.name == "metrics_addr")
    assert option.default == "127.0.0.1"
    server = Metrics().serve_http(0)
    try:
        assert server.server_address[0] == "127.0.0.1"
    finally:
        server.shutdown()


# -- an inbox file that kills the controller ---------------------------------------------------------------
def _server(tmp_path: Path, calls: list[str]) -> tuple[Server, Inbox]:
    config = parse_config(tmp_path / "ffswarm.yaml", {"data_root": str(tmp_path)})
    inbox = Inbox(tmp_path / "inbox")
    inbox.ensure()

    def run(config: Config, path: Path, metrics: Metrics) -> Outcome:
        calls.append(path.name)
        return Outcome(True, None)

    return Server(config, inbox, Metrics(), run=run), inbox


def test_a_file_that_killed_the_controller_n_times_is_moved_to_failed(tmp_path: Path) -> None:
    calls: list[str] = []
    server, inbox = _server(tmp_path, calls)
    claimed = inbox.running / "j.yaml"
    claimed.write_text("name: j\n")
    for n in range(1, MAX_STARTS + 1):  # each controller started it, then died with it
        assert inbox.count_start(claimed) == n
    server.start_job(claimed)
    assert calls == []  # not run again
    assert not claimed.exists() and (inbox.failed / "j.yaml").read_text() == "name: j\n"
    assert (inbox.failed / "j.yaml.reason.txt").read_text() == (
        f"the controller stopped {MAX_STARTS} times while running this file (crashed or was killed, e.g. out of "
        "memory); it is not resumed again. Submit it again once the cause is fixed.\n"
    )
    assert [p.name for p in inbox.running.iterdir()] == []  # the count went with it


def test_a_file_that_finishes_leaves_no_count_behind(tmp_path: Path) -> None:
    calls: list[str] = []
    server, inbox = _server(tmp_path, calls)
    claimed = inbox.running / "j.yaml"
    claimed.write_text("name: j\n")
    inbox.count_start(claimed)  # one controller died with it: resumed once more
    server.start_job(claimed)
    server._active["j.yaml"].join(5)
    assert calls == ["j.yaml"] and (inbox.done / "j.yaml").exists()
    assert [p.name for p in inbox.running.iterdir()] == []


# -- ids read back ----------------------------------------------------------------------------------------
def test_ids_read_back_from_plan_json_are_checked() -> None:
    from controller.job.plan import Plan

    good = {"job": "j", "items": [{"id": "i000000", "input": "a.jpg", "output": "b.jpg", "kind": "image"}]}
    assert (
        Plan.from_json(json.dumps({**good, "chunks": [{"id": "c0000", "items": ["i000000"]}]})).chunks[0].id == "c0000"
    )
    evil = {**good, "chunks": [{"id": "c0000:\n    cap_add: [ALL]", "items": ["i000000"]}]}
    with pytest.raises(ValueError, match=r"plan.json holds an id that is not a-z, 0-9 and - only: 'c0000:\\n"):
        Plan.from_json(json.dumps(evil))


@pytest.mark.parametrize("ref", ["../etc", "J", "a/b", "x\ny"])
def test_render_job_validates_the_job_id(tmp_path: Path, ref: str) -> None:
    from controller.errors import UsageError

    config = parse_config(tmp_path / "ffswarm.yaml", {"data_root": str(tmp_path)})
    with pytest.raises(UsageError, match=r"is neither a job file nor a job id \(a-z, 0-9 and - only\)"):
        ops.job_services(config, ref, 1)


def test_scale_is_bounded_by_the_policy(tmp_path: Path) -> None:
    from controller.errors import UsageError
    from controller.run import control

    config = parse_config(tmp_path / "ffswarm.yaml", {"data_root": str(tmp_path)})
    with pytest.raises(UsageError, match=r"^scale j 65: asks for 65, the limit is 64 \(the cluster's policy.limits\)$"):
        control.scale(config, "j", 65)
    assert not (tmp_path / "runs").exists()
