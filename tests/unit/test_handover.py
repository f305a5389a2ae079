"""`submit --detach` and the heartbeat of `ffswarm serve` (no Docker needed for these)."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from controller.cli import cli
from controller.config import Config, parse_config
from controller.errors import CapacityError, UsageError
from controller.run import handover
from controller.run.handover import HEARTBEAT_DIR, Heartbeat, HeartbeatFile, hand_over, serving
from controller.run.jobs import PreparedJob, prepare
from controller.run.metrics import Metrics
from controller.serve.daemon import Inbox, Outcome, Server
from tests import builders
from tests.polling import until


def data_root(tmp_path: Path) -> tuple[Config, Path]:
    root = builders.data_root(tmp_path)
    config_file = tmp_path / "ffswarm.yaml"
    config_file.write_text(yaml.safe_dump({"data_root": str(root)}))
    return parse_config(config_file, {"data_root": str(root)}), root


def job_file(tmp_path: Path, name: str = "holiday") -> Path:
    f = tmp_path / f"{name}.yaml"
    f.write_text(
        f"name: {name}\nsource: faces/star.jpg\ntargets: [crowd/*.jpg]\noutput: out/{{stem}}{{ext}}\n"
        "resources: {gpus: 0}\n"
    )
    return f


def jobs(tmp_path: Path, config: Config, *names: str) -> list[PreparedJob]:
    return prepare(config, [job_file(tmp_path, n) for n in names or ("holiday",)], new=False)


def served(inbox: Path, now: float | None = None) -> HeartbeatFile:
    hb = HeartbeatFile(inbox, concurrent_jobs=2)
    hb.beat(running=0, now=now)
    return hb


# -- the heartbeat ------------------------------------------------------------------------------------
def test_a_heartbeat_is_alive_for_three_beats_and_at_least_fifteen_seconds(tmp_path: Path) -> None:
    inbox = tmp_path / "inbox"
    hb = served(inbox, now=1000.0)
    written = json.loads(hb.path.read_text())
    assert written["pid"] == os.getpid() and written["concurrent_jobs"] == 2 and written["updated"] == 1000.0
    assert hb.path.parent == inbox / HEARTBEAT_DIR and not [p for p in hb.path.parent.iterdir() if p != hb.path]
    assert [h.pid for h in serving(inbox, now=1014.0)] == [os.getpid()]
    assert serving(inbox, now=1016.0) == []  # 3 × 5 s < 15 s: the floor holds
    assert serving(inbox, now=984.0) == []  # a beat from the future: a broken clock, not a controller
    slow = HeartbeatFile(tmp_path / "slow", concurrent_jobs=1, interval=20.0)
    slow.beat(running=1, now=1000.0)
    assert serving(tmp_path / "slow", now=1059.0) and not serving(tmp_path / "slow", now=1061.0)


def test_each_beat_is_seen_by_the_next_question_and_a_removed_heartbeat_is_gone(tmp_path: Path) -> None:
    """Asked on every request, the heartbeats are read again whenever a beat rewrote them."""
    inbox = tmp_path / "inbox"
    hb = served(inbox, now=1000.0)
    assert serving(inbox, now=1014.0) and not serving(inbox, now=2014.0)
    for beat in (2000.0, 3000.0):
        hb.beat(running=1, now=beat)
        assert [h.updated for h in serving(inbox, now=beat + 14)] == [beat]
    hb.remove()
    assert serving(inbox, now=3014.0) == []


def test_the_heartbeat_is_removed_on_a_clean_stop_and_stale_ones_are_cleared(tmp_path: Path) -> None:
    config, root = data_root(tmp_path)
    inbox = Inbox(root / "inbox")
    stale = inbox.path / HEARTBEAT_DIR / "gone-1.json"
    stale.parent.mkdir(parents=True)
    stale.write_text(Heartbeat("gone", 1, 0.0, time.time() - 3600, 1).to_json())

    def run(config: Config, path: Path, metrics: Metrics) -> Outcome:
        return Outcome(True, None)

    server = Server(config, inbox, Metrics(), poll=0.05, run=run, heartbeat_every=0.1)
    t = threading.Thread(target=server.serve_forever, daemon=True)
    t.start()
    until(server.heartbeat.path.exists, "serve's first heartbeat")
    first = json.loads(server.heartbeat.path.read_text())["updated"]
    until(lambda: json.loads(server.heartbeat.path.read_text())["updated"] > first, "a heartbeat rewritten")
    assert not stale.exists()
    server.stop.set()
    t.join(30)
    assert not t.is_alive()
    assert not server.heartbeat.path.exists() and serving(inbox.path) == []
    assert list(stale.parent.iterdir()) == []  # no temporary left (while serving, one exists as each beat is written)


GOOD = {"host": "h", "pid": 1, "started": 0, "updated": 9e9, "concurrent_jobs": 1, "running": 0, "interval": 5}


@pytest.mark.parametrize(
    "text",
    [
        "not json",
        "[]",
        json.dumps({**GOOD, "pid": "1"}),
        json.dumps({**GOOD, "concurrent_jobs": True}),
        json.dumps({k: v for k, v in GOOD.items() if k != "host"}),
        json.dumps({**GOOD, "interval": 1e9}),  # an interval that would keep it alive for ever
        json.dumps(GOOD) + " " * 5000,  # too long to be one
    ],
)
def test_a_garbled_heartbeat_means_not_served(tmp_path: Path, text: str) -> None:
    folder = tmp_path / HEARTBEAT_DIR
    folder.mkdir()
    (folder / "h-1.json").write_text(json.dumps(GOOD))
    assert serving(tmp_path, now=9e9)  # the same file, well formed, counts
    (folder / "h-1.json").write_text(text)
    assert serving(tmp_path, now=9e9) == []


def test_a_heartbeat_behind_a_symlink_is_not_followed(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    served(elsewhere)
    (tmp_path / "inbox" / HEARTBEAT_DIR).mkdir(parents=True)
    real = next((elsewhere / HEARTBEAT_DIR).iterdir())
    (tmp_path / "inbox" / HEARTBEAT_DIR / "x-1.json").symlink_to(real)
    assert serving(tmp_path / "inbox") == []
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / HEARTBEAT_DIR).symlink_to(elsewhere / HEARTBEAT_DIR)
    assert serving(tmp_path / "other") == []


# -- the hand-over ------------------------------------------------------------------------------------
def test_hand_over_writes_the_job_file_as_its_id_atomically(tmp_path: Path) -> None:
    config, root = data_root(tmp_path)
    inbox = root / "inbox"
    served(inbox)
    prepared = jobs(tmp_path, config, "holiday", "party")
    handed = hand_over(inbox, prepared)
    assert [h.job_id for h in handed] == ["holiday", "party"]
    assert [h.file for h in handed] == [inbox / "holiday.yaml", inbox / "party.yaml"]
    assert (inbox / "holiday.yaml").read_text() == (tmp_path / "holiday.yaml").read_text()
    assert sorted(p.name for p in inbox.iterdir()) == [HEARTBEAT_DIR, "holiday.yaml", "party.yaml"]  # no temps
    assert not (root / "runs").exists()  # the controller makes the run folder, not the submit
    text = handover.describe(handed)
    assert "ffswarm status holiday --follow" in text and "ffswarm logs party -f" in text


def test_hand_over_never_replaces_a_file_in_the_inbox(tmp_path: Path) -> None:
    config, root = data_root(tmp_path)
    inbox = root / "inbox"
    served(inbox)
    (inbox / "holiday.yaml").write_text("theirs\n")
    with pytest.raises(UsageError, match=r"already handed over .*holiday.yaml"):
        hand_over(inbox, jobs(tmp_path, config, "party", "holiday"))
    assert (inbox / "holiday.yaml").read_text() == "theirs\n"
    assert not (inbox / "party.yaml").exists()  # all checked before any is written

    (inbox / "holiday.yaml").unlink()
    (inbox / "running").mkdir()
    (inbox / "running" / "holiday.yaml").write_text("running\n")
    with pytest.raises(UsageError, match="already handed over"):
        hand_over(inbox, jobs(tmp_path, config, "holiday"))


def test_a_name_taken_during_the_hand_over_is_not_replaced_and_nothing_is_left(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config, root = data_root(tmp_path)
    inbox = root / "inbox"
    served(inbox)
    prepared = jobs(tmp_path, config, "holiday", "party")
    real_link = os.link

    def racing_link(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> None:
        if Path(dst).name == "party.yaml":  # someone drops party.yaml between the check and the link
            Path(dst).write_text("theirs\n")
        real_link(src, dst)

    monkeypatch.setattr(handover.os, "link", racing_link)
    with pytest.raises(UsageError, match="appeared while handing the job over"):
        hand_over(inbox, prepared)
    assert (inbox / "party.yaml").read_text() == "theirs\n"
    assert sorted(p.name for p in inbox.iterdir()) == [HEARTBEAT_DIR, "party.yaml"]  # holiday taken back


def test_no_live_heartbeat_refuses_with_how_to_start_one_and_leaves_nothing(tmp_path: Path) -> None:
    config, root = data_root(tmp_path)
    inbox = root / "inbox"
    served(inbox, now=time.time() - 60)  # a controller killed a minute ago
    with pytest.raises(CapacityError) as e:
        hand_over(inbox, jobs(tmp_path, config))
    assert e.value.exit_code == 69
    assert "no controller is serving the inbox" in str(e.value)
    assert "ffswarm serve" in str(e.value) and "ffswarm render --controller" in str(e.value)
    assert sorted(p.name for p in inbox.iterdir()) == [HEARTBEAT_DIR]
    assert not (root / "runs").exists()


def test_a_job_whose_id_is_not_its_name_is_refused(tmp_path: Path) -> None:
    config, root = data_root(tmp_path)
    inbox = root / "inbox"
    served(inbox)
    (root / "runs" / "holiday").mkdir(parents=True)
    prepared = prepare(config, [job_file(tmp_path)], new=True)
    assert prepared[0].job_id == "holiday-2"
    with pytest.raises(UsageError, match="--new"):
        hand_over(inbox, prepared)
    assert not (inbox / "holiday.yaml").exists() and not (inbox / "holiday-2.yaml").exists()


# -- the command --------------------------------------------------------------------------------------
def test_submit_detach_prints_the_id_and_how_to_follow(tmp_path: Path) -> None:
    config, root = data_root(tmp_path)
    inbox = tmp_path / "my-inbox"
    served(inbox)
    args = ["--config", str(config.path), "submit", "--detach", "--inbox", str(inbox), str(job_file(tmp_path))]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    assert "job holiday: handed to the controller" in result.output
    assert "ffswarm status holiday --follow" in result.output and "ffswarm logs holiday -f" in result.output
    assert (inbox / "holiday.yaml").is_file()


@pytest.mark.parametrize(("extra", "match"), [(["--new"], "--new"), (["--dry-run"], "--dry-run")])
def test_submit_detach_refuses_new_and_dry_run(tmp_path: Path, extra: list[str], match: str) -> None:
    config, root = data_root(tmp_path)
    served(root / "inbox")
    args = ["--config", str(config.path), "submit", "--detach", *extra, str(job_file(tmp_path))]
    result = CliRunner().invoke(cli, args)
    assert isinstance(result.exception, UsageError) and match in str(result.exception)
    assert not (root / "inbox" / "holiday.yaml").exists()
