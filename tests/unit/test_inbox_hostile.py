"""The inbox as a hostile folder (issue 16): real symlinks, FIFOs, folders, hard links, big files,
two claimers and two controllers' leases; each test checks the safe outcome and that nothing else
changed."""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from pathlib import Path

import pytest

from controller.config import Config, parse_config
from controller.run.lease import Owner, Record
from controller.run.metrics import Metrics
from controller.serve.daemon import Outcome, Server
from controller.serve.inbox import Inbox
from tests.polling import until

SECRET = "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAABG5vbmUAAAAEbm9uZQ\n"


def _old(path: Path, age: float = 10.0) -> None:
    t = time.time() - age
    os.utime(path, (t, t), follow_symlinks=False)


def _inbox(tmp_path: Path, max_bytes: int = 1024**2, interval: float = 5.0) -> Inbox:
    inbox = Inbox(tmp_path / "inbox", max_bytes=max_bytes, interval=interval)
    inbox.ensure()
    return inbox


def _secret(tmp_path: Path) -> Path:
    key = tmp_path / "private" / "id_ed25519"
    key.parent.mkdir()
    key.write_text(SECRET)
    key.chmod(0o600)
    return key


def _reason(inbox: Inbox, name: str) -> str:
    return (inbox.failed / f"{name}.reason.txt").read_text()


def test_a_symlink_to_a_key_is_moved_aside_and_never_read(tmp_path: Path) -> None:
    inbox = _inbox(tmp_path)
    key = _secret(tmp_path)
    link = inbox.path / "steal.yaml"
    link.symlink_to(key)
    _old(link)
    assert inbox.waiting(time.time()) == [link]
    assert inbox.claim(link) is None
    moved = inbox.failed / "steal.yaml"
    assert moved.is_symlink() and os.readlink(moved) == str(key)  # moved as itself, not followed
    reason = _reason(inbox, "steal.yaml")
    assert "inbox/failed/steal.yaml" in reason and "symbolic link" in reason
    assert "BEGIN" not in reason and str(key) not in reason and "id_ed25519" not in reason
    assert key.read_text() == SECRET and not list(inbox.running.iterdir())


def test_a_fifo_and_a_folder_named_yaml_are_refused_without_blocking(tmp_path: Path) -> None:
    inbox = _inbox(tmp_path)
    fifo = inbox.path / "hang.yaml"
    os.mkfifo(fifo)
    folder = inbox.path / "dir.yaml"
    (folder / "inner").mkdir(parents=True)
    _old(fifo)
    _old(folder)
    t0 = time.monotonic()
    for entry in inbox.waiting(time.time()):
        assert inbox.claim(entry) is None
    assert time.monotonic() - t0 < 2  # nothing opened the FIFO for reading and waited on it
    assert "a FIFO" in _reason(inbox, "hang.yaml")
    assert (inbox.failed / "hang.yaml").is_fifo()
    (moved_dir,) = [p for p in inbox.failed.iterdir() if p.is_dir()]
    assert (moved_dir / "inner").is_dir() and "a folder" in _reason(inbox, moved_dir.name)
    assert not list(inbox.running.iterdir()) and not list(p for p in inbox.path.glob("*.yaml"))


def test_a_hard_link_and_a_file_over_the_limit_are_refused(tmp_path: Path) -> None:
    inbox = _inbox(tmp_path, max_bytes=100)
    key = _secret(tmp_path)
    linked = inbox.path / "linked.yaml"
    os.link(key, linked)
    big = inbox.path / "big.yaml"
    big.write_text("name: big\n" + "#" * 200)
    for p in (linked, big):
        _old(p)
        assert inbox.claim(p) is None
    assert "hard links" in _reason(inbox, "linked.yaml") and "BEGIN" not in _reason(inbox, "linked.yaml")
    assert "210 bytes, the limit is 100" in _reason(inbox, "big.yaml")
    assert key.read_text() == SECRET and not list(inbox.running.iterdir())


def test_a_file_that_vanishes_before_it_is_claimed_is_skipped(tmp_path: Path) -> None:
    inbox = _inbox(tmp_path)
    job = inbox.path / "a.yaml"
    job.write_text("name: a\n")
    _old(job)
    (listed,) = inbox.waiting(time.time())
    job.unlink()  # another controller claimed it between the listing and the claim
    assert inbox.claim(listed) is None
    assert not list(inbox.failed.iterdir()) and not list(inbox.running.iterdir())


def test_two_claimers_of_one_file_one_wins_and_the_content_is_the_checked_bytes(tmp_path: Path) -> None:
    inbox = _inbox(tmp_path)
    other = Inbox(inbox.path)
    job = inbox.path / "a.yaml"
    job.write_text("name: a\n")
    _old(job)
    first = inbox.claim(job)
    second = other.claim(job)
    assert first is not None and second is None
    assert first.name.startswith("a.") and first.read_text() == "name: a\n"
    assert sorted(p.name for p in inbox.running.iterdir()) == sorted([first.name, f".{first.name}.lease"])


def test_a_second_file_of_the_same_name_never_replaces_the_first(tmp_path: Path) -> None:
    inbox = _inbox(tmp_path)
    texts = ["name: one\n", "name: two\n"]
    claimed = []
    for text in texts:
        job = inbox.path / "nightly.yaml"
        job.write_text(text)
        _old(job)
        got = inbox.claim(job)
        assert got is not None
        claimed.append(got)
    assert claimed[0] != claimed[1] and [c.read_text() for c in claimed] == texts  # both still there
    done = [inbox.finish(c, True, None) for c in claimed]
    assert done[0].name == "nightly.yaml" and done[1].name != "nightly.yaml"
    assert sorted(d.read_text() for d in done) == texts
    failed_first = inbox.failed / "x.yaml"
    failed_first.write_text("someone's file")
    job = inbox.path / "x.yaml"
    job.write_text("name: x\n")
    _old(job)
    got = inbox.claim(job)
    assert got is not None
    where = inbox.finish(got, False, f"JobFileError (exit 65): inbox/running/{got.name}: name: bad")
    assert failed_first.read_text() == "someone's file" and where != failed_first
    reason = _reason(inbox, where.name)
    assert f"inbox/failed/{where.name}" in reason and "running/" not in reason


def test_a_reason_escapes_terminal_control_characters(tmp_path: Path) -> None:
    inbox = _inbox(tmp_path)
    job = inbox.path / "evil\x1b]0;owned\x07.yaml"
    job.write_text("name: a\n")
    _old(job)
    got = inbox.claim(job)
    assert got is not None
    where = inbox.finish(got, False, f"{got.name}: bad \x1b[2J")
    text = _reason(inbox, where.name)
    assert "\x1b" not in text and "\x07" not in text and "\\x1b" in text


def test_a_live_controllers_claim_is_never_resumed_an_expired_one_is(tmp_path: Path) -> None:
    mine = _inbox(tmp_path, interval=0.2)
    job = mine.path / "a.yaml"
    job.write_text("name: a\n")
    _old(job)
    claimed = mine.claim(job)
    assert claimed is not None and mine.count_start(claimed) == 1
    other = Inbox(mine.path, interval=0.2)
    assert other.expired(time.time()) == []  # renewed just now by a live controller
    lease = mine.lease(claimed)
    assert lease is not None
    # a controller on another host stopped renewing 3 intervals ago
    far = Owner("other-host", 4242, "boot", "ns", "x" * 32)
    stale = Record(far, time.time() - 1.0, 0.2, lease.starts)
    mine.lease_file(claimed).write_bytes(stale.to_json())
    assert other.expired(time.time()) == [claimed]
    assert Inbox(mine.path, interval=0.2).expired(time.time()) == []  # taken over once, by one controller
    assert other.count_start(claimed) == 2  # counted in the claim
    assert not mine.renew(claimed)  # the old holder no longer owns it


def test_a_holder_that_is_not_running_on_this_machine_is_resumed_at_once(tmp_path: Path) -> None:
    inbox = _inbox(tmp_path, interval=60)
    job = inbox.path / "a.yaml"
    job.write_text("name: a\n")
    _old(job)
    claimed = inbox.claim(job)
    assert claimed is not None
    me = inbox.owner
    dead = Owner(me.host, 2**22 + 12345, me.boot, me.pidns, "d" * 32)  # no such pid
    inbox.lease_file(claimed).write_bytes(Record(dead, time.time(), 60, 1).to_json())
    assert Inbox(inbox.path, interval=60).expired(time.time()) == [claimed]


def _config(tmp_path: Path) -> Config:
    return parse_config(tmp_path / "ffswarm.yaml", {"data_root": str(tmp_path)})


def test_serve_leaves_a_live_controllers_running_file_alone_and_fails_a_symlink(tmp_path: Path) -> None:
    live = _inbox(tmp_path)  # renewed by the loop below, far within its expiry however late it runs
    job = live.path / "theirs.yaml"
    job.write_text("name: theirs\n")
    _old(job)
    theirs = live.claim(job)
    assert theirs is not None
    key = _secret(tmp_path)
    (live.path / "steal.yaml").symlink_to(key)
    _old(live.path / "steal.yaml")
    ran: list[Path] = []

    def run(config: Config, path: Path, metrics: Metrics) -> Outcome:
        ran.append(path)
        return Outcome(True, None)

    inbox = Inbox(live.path)
    server = Server(_config(tmp_path), inbox, Metrics(), poll=0.05, run=run, heartbeat_every=0.2)
    t = threading.Thread(target=server.serve_forever, daemon=True)
    t.start()
    beats: set[float] = set()

    def looked_enough() -> bool:  # several beats, each a look at running/ for expired leases
        assert live.renew(theirs)  # the other controller is alive
        with contextlib.suppress(OSError, ValueError):
            beats.add(json.loads(server.heartbeat.path.read_text())["updated"])
        return len(beats) >= 5 and (inbox.failed / "steal.yaml.reason.txt").exists()

    try:
        until(looked_enough, "serve to beat five times and fail the symlink")
    finally:
        server.stop.set()
        t.join(30)
    assert ran == [] and theirs.read_text() == "name: theirs\n"
    assert "symbolic link" in _reason(inbox, "steal.yaml") and key.read_text() == SECRET


def test_serve_never_writes_a_traceback_into_a_reason(tmp_path: Path) -> None:
    from controller.run import usecase
    from controller.serve import daemon as serve

    inbox = _inbox(tmp_path)
    job = inbox.path / "a.yaml"
    job.write_text("name: a\nsource: s.jpg\ntargets: t/*.jpg\noutput: o/{name}\n")
    _old(job)
    claimed = inbox.claim(job)
    assert claimed is not None

    def boom(config: Config, path: Path, *_: object, **__: object) -> None:
        raise RuntimeError(f"secret detail {SECRET}")

    mp = pytest.MonkeyPatch()
    mp.setattr(usecase, "one_job", boom)
    try:
        outcome = serve.run_job_file(_config(tmp_path), claimed, Metrics())
    finally:
        mp.undo()
    assert outcome.reason is not None and "RuntimeError" in outcome.reason
    assert "Traceback" not in outcome.reason and "BEGIN" not in outcome.reason


def test_serves_claim_counts_its_start_in_the_lease_it_creates_and_a_take_over_counts_the_next(
    tmp_path: Path,
) -> None:
    mine = _inbox(tmp_path, interval=0.2)
    job = mine.path / "a.yaml"
    job.write_text("name: a\n")
    _old(job)
    claimed = mine.claim(job, starts=1)  # as serve's loop claims
    assert claimed is not None and not job.exists() and claimed.read_text() == "name: a\n"
    lease = mine.lease(claimed)
    assert lease is not None and lease.starts == 1 and lease.owner.id == mine.owner.id
    # its controller stops: its lease goes stale; the next controller's take-over is the second start
    far = Owner("other-host", 4242, "boot", "ns", "x" * 32)
    mine.lease_file(claimed).write_bytes(Record(far, time.time() - 1.0, 0.2, lease.starts).to_json())
    other = Inbox(mine.path, interval=0.2)
    assert other.expired(time.time()) == [claimed]
    assert other.count_start(claimed) == 2


def test_a_renewal_that_races_the_files_end_leaves_no_lease_behind(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The renewal thread read the lease (ours), the job's thread then finished the file (moved to
    done/, lease removed), and the renewal's write put the lease back: it must not stay for ever."""
    from controller.run import lease as leases

    inbox = _inbox(tmp_path)
    job = inbox.path / "a.yaml"
    job.write_text("name: a\n")
    _old(job)
    claimed = inbox.claim(job, starts=1)
    assert claimed is not None
    write = leases.write

    def finished_meanwhile(path: Path, record: Record, durable: bool = True) -> None:
        inbox.finish(claimed, True, None)  # between the renewal's read and its write
        write(path, record, durable)

    monkeypatch.setattr(leases, "write", finished_meanwhile)
    assert not inbox.renew(claimed)
    assert sorted(p.name for p in inbox.running.iterdir()) == []
    assert (inbox.done / "a.yaml").read_text() == "name: a\n"


def test_a_lease_whose_file_was_never_written_is_removed_once_it_has_expired(tmp_path: Path) -> None:
    """A controller killed between a claim's lease and its file leaves a lease of a file that never
    existed; a claim under way (its lease fresh, its file not written yet) is left alone."""
    from controller.run import lease as leases

    inbox = _inbox(tmp_path, interval=60)
    me = inbox.owner
    dead = Owner(me.host, 2**22 + 12345, me.boot, me.pidns, "d" * 32)  # no such pid: expired at once
    killed = inbox.lease_file(inbox.running / "a.0123456789abcdef0123456789abcdef.yaml")
    assert leases.create(killed, Record(dead, time.time(), 60, 1))
    under_way = inbox.lease_file(inbox.running / "b.fedcba9876543210fedcba9876543210.yaml")
    assert leases.create(under_way, Record(me, time.time(), 60, 1))
    assert Inbox(inbox.path, interval=60).expired(time.time()) == []
    assert sorted(p.name for p in inbox.running.iterdir()) == [under_way.name]
