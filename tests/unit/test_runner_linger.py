"""A lingering runner in-process (runner_image/linger.py, contract/handoff.py): after its chunk it
takes the chunk the controller hands over, runs it as a fresh service would (its own results, attempt
record and log) on the models it already loaded, and exits once ``linger`` passes without another."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest

from contract.errors import ManifestError
from contract.handoff import Handoff
from contract.manifest import Item, Manifest
from contract.results import ItemStatus
from runner_image.__main__ import main
from tests.unit.test_runner_chunk import JOB, RUN, log_lines, results, write_manifest

HANDOFF = "/data/runs/.lanes/lane-one.json"


def run(root: Path, manifest: str, attempt: int = 1, lane: bool = True) -> int:
    """The runner as a lane's service starts it (``FFSWARM_LANE=1``), or as any other (``lane`` False)."""
    env = {"FFSWARM_LANE": "1"} if lane else {}
    return main(["--manifest", manifest, "--attempt", str(attempt), "--data-root", str(root)], env=env)


def _handoff(root: Path, h: Handoff) -> None:
    path = root / "runs" / ".lanes" / "lane-one.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(h.to_json())
    tmp.replace(path)


def test_a_lingering_runner_runs_the_chunk_handed_over_on_its_loaded_models_then_exits(data: Path) -> None:
    _handoff(data, Handoff(0))  # the lane's file exists from the start: nothing yet
    first = write_manifest(data, ["face_00.jpg"], chunk="c0001", linger=3.0, handoff=HANDOFF)
    second = write_manifest(data, ["face_02.jpg", "astronaut.jpg"], chunk="c0002", linger=3.0, handoff=HANDOFF)

    def hand_over() -> None:  # as the controller does once the first chunk's record says it ended
        record = data / "runs" / JOB / "attempts" / "c0001.a1.json"
        while not (record.exists() and json.loads(record.read_text()).get("exit")):
            time.sleep(0.05)
        _handoff(data, Handoff(1, second, attempt=2))

    t = threading.Thread(target=hand_over)
    t.start()
    started = time.monotonic()
    assert run(data, first) == 0
    took = time.monotonic() - started
    t.join()
    assert [r.status for r in results(data, "c0001")] == [ItemStatus.OK]
    lines = results(data, "c0002")
    assert sorted((Path(r.input).name, r.status, r.attempt) for r in lines) == [
        ("astronaut.jpg", ItemStatus.OK, 2), ("face_02.jpg", ItemStatus.OK, 2)
    ]  # fmt: skip  (a runner's items run concurrently: their lines come in the order they end)
    assert (data / "out" / "face_02.png").is_file() and (data / "out" / "astronaut.png").is_file()
    record = json.loads((data / "runs" / JOB / "attempts" / "c0002.a2.json").read_text())
    assert record["exit"] == "OK" and record["items_done"] == 2
    log = list(log_lines((data / "runs" / JOB / "logs" / "c0002.a2.log").read_text()))
    loaded = [line for line in log if line.get("event") == "models loaded"]
    assert loaded and loaded[0]["kept"] is True and loaded[0]["verify_s"] == 0.0  # not loaded again
    assert record["cold_start_s"] < 1.0
    assert took >= 3.0  # it waited its linger after the second chunk before exiting


def test_a_stop_or_silence_ends_the_wait_and_a_bad_handoff_is_not_followed(data: Path) -> None:
    _handoff(data, Handoff(0))
    first = write_manifest(data, ["face_00.jpg"], linger=1.0, handoff=HANDOFF)
    started = time.monotonic()
    assert run(data, first) == 0  # nothing handed over: it exits after its linger
    assert 1.0 <= time.monotonic() - started < 20
    # a hand-off that is not one (garbage, a link) is ignored like silence
    path = data / "runs" / ".lanes" / "lane-one.json"
    path.write_text('{"seq": 5, "manifest": "/etc/passwd"}')
    assert run(data, first, attempt=2) == 0
    assert {r.attempt for r in results(data)} == {1, 2}
    _handoff(data, Handoff(7))  # stop
    started = time.monotonic()
    assert run(data, first, attempt=3) == 0
    assert time.monotonic() - started < 20


def test_a_runner_not_started_as_a_lane_exits_after_its_chunk_whatever_its_manifest_says(data: Path) -> None:
    """A chunk of a job with warm runners that runs in a fresh service (a retry, a resumed job) does
    not hold its GPU waiting for a hand-off no one will write."""
    _handoff(data, Handoff(0))
    first = write_manifest(data, ["face_00.jpg"], linger=60.0, handoff=HANDOFF)
    started = time.monotonic()
    assert run(data, first, lane=False) == 0
    assert time.monotonic() - started < 30  # it did not wait out its manifest's 60 s
    assert [r.status for r in results(data)] == [ItemStatus.OK]


def test_the_manifest_and_handoff_fields_are_checked() -> None:
    for bad in (
        "[]",
        '{"seq": -1}',
        '{"seq": 1, "manifest": "/data/../etc/x.json"}',
        '{"seq": true}',
        '{"seq": 1, "x": 1}',
        '{"seq": 1, "manifest": "/data/runs/j/chunks/c1.json", "attempt": 0}',
    ):
        with pytest.raises(ManifestError):
            Handoff.from_json(bad)
    assert Handoff.from_json('{"seq": 2}').stop and not Handoff(0).stop
    item = Item("i000000", "/data/in/a.jpg", "/data/out/a.jpg")
    fields = {"job": JOB, "chunk": "c0001", "run_dir": RUN, "pack_dir": "/data/models/default",
              "source": ("/data/in/s.jpg",), "items": (item,)}  # fmt: skip
    plain = Manifest(**fields)
    assert "linger" not in json.loads(plain.to_json()) and "handoff" not in json.loads(plain.to_json())
    kept = Manifest(**fields, linger=30.0, handoff=HANDOFF)
    assert Manifest.from_json(kept.to_json()) == kept
    for linger, handoff, why in ((5.0, None, "needs handoff"), (-1.0, HANDOFF, "linger"), (9999.0, HANDOFF, "linger"),
                                 (5.0, "/etc/lanes/x.json", "handoff")):  # fmt: skip
        with pytest.raises(ManifestError, match=why):
            Manifest(**fields, linger=linger, handoff=handoff)
