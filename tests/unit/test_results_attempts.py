"""Results per attempt (issue 16, "Results"): one file per attempt, created by the controller before
the attempt's service; one reader that merges every attempt (a commit beats an error, the newest
attempt wins) and counts what it could not parse; the old single file read as attempt 0."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from contract.layout import RunLayout, parse_results_name
from contract.results import ItemResult, ItemStatus, chunk_results, merge_attempts
from controller.run.chunks import Attempt, create_results_file
from controller.run.rundir import RunDir


def line(item: str, status: ItemStatus, attempt: int, **kw: object) -> str:
    return ItemResult(item, status, attempt, "/data/in/x.jpg", "/data/out/x.jpg", **kw).to_line()  # type: ignore[arg-type]


OK, ERR, NOFACE = ItemStatus.OK, ItemStatus.ERROR, ItemStatus.NO_FACE


def test_a_late_error_of_an_orphaned_earlier_attempt_never_hides_a_newer_commit() -> None:
    a1 = line("i1", OK, 1) + line("i2", ERR, 1) + line("i1", ERR, 1, reason="orphan, late")  # written last
    a2 = line("i1", OK, 2, cached=True) + line("i2", OK, 2)
    merged = merge_attempts([(2, a2), (1, a1)])
    assert {k: (r.status, r.attempt) for k, r in merged.latest.items()} == {"i1": (OK, 2), "i2": (OK, 2)}
    assert merged.dropped == 0


def test_a_commit_beats_an_error_whatever_the_attempt_and_the_newest_wins_among_equals() -> None:
    merged = merge_attempts([(1, line("i1", NOFACE, 1)), (2, line("i1", ERR, 2)), (3, line("i2", ERR, 3))])
    assert (merged.latest["i1"].status, merged.latest["i1"].attempt) == (NOFACE, 1)
    merged = merge_attempts([(1, line("i1", ERR, 1, reason="old")), (2, line("i1", ERR, 2, reason="new"))])
    assert merged.latest["i1"].reason == "new"


@pytest.mark.parametrize(
    "bad",
    [
        "not json\n",
        '{"item": "i9", "status": "o',  # torn: a writer killed mid-line
        '{"item": "i9", "status": "ok", "attempt": 1, "input": "/x", "output": null, "evil": 1}\n',  # unknown key
        '{"item": 7, "status": "ok", "attempt": 1, "input": "/x", "output": null}\n',  # wrong type
        '{"item": "i9", "status": "done", "attempt": 1, "input": "/x", "output": null}\n',  # unknown status
        '{"item": "i9", "status": "ok", "attempt": 1, "input": "/x", "output": null, "sha256": "zz"}\n',
        "[1, 2]\n",
    ],
)
def test_lines_that_do_not_parse_are_counted_not_silently_dropped(bad: str) -> None:
    merged = merge_attempts([(1, line("i1", OK, 1) + bad)])
    assert (sorted(merged.latest), merged.dropped) == (["i1"], 1)


def test_a_line_claiming_another_attempt_than_its_file_is_dropped() -> None:
    merged = merge_attempts([(2, line("i1", OK, 5))])  # attempt 2's file cannot speak for attempt 5
    assert (merged.latest, merged.dropped) == ({}, 1)


def test_chunk_results_reads_every_attempt_and_the_old_single_file_as_attempt_0(tmp_path: Path) -> None:
    folder = tmp_path / "results"
    folder.mkdir()
    (folder / "c0001.jsonl").write_text(line("i1", ERR, 1) + line("i2", OK, 1))  # made before this change
    (folder / "c0001.a2.jsonl").write_text(line("i1", OK, 2) + "garbage\n")
    (folder / "c0002.a1.jsonl").write_text(line("i9", OK, 1))  # another chunk
    (folder / ".c0001.a3.jsonl.tmp-1").write_text(line("i1", ERR, 3))  # not a results file
    got = chunk_results(folder, "c0001")
    assert {k: (r.status, r.attempt) for k, r in got.latest.items()} == {"i1": (OK, 2), "i2": (OK, 1)}
    assert got.dropped == 1
    assert [parse_results_name(n) for n in ("c0001.jsonl", "c0001.a12.jsonl", "x.log", "../c.a1.jsonl")] == [
        ("c0001", 0), ("c0001", 12), None, None,
    ]  # fmt: skip


def test_chunk_results_never_follows_or_blocks_on_what_a_runner_planted(tmp_path: Path) -> None:
    folder = tmp_path / "results"
    folder.mkdir()
    host = tmp_path / "host.jsonl"
    host.write_text(line("i1", OK, 1))
    (folder / "c0001.a1.jsonl").symlink_to(host)
    os.mkfifo(folder / "c0001.a2.jsonl")  # opened O_NONBLOCK and refused: never read
    (folder / "c0001.a3.jsonl").mkdir()
    got = chunk_results(folder, "c0001")
    assert (got.latest, got.dropped) == ({}, 3)
    linked = tmp_path / "linked"
    linked.symlink_to(folder)
    with pytest.raises(OSError):
        chunk_results(linked, "c0001")  # results/ itself a symlink: not followed


def test_rundir_latest_results_merge_attempts_and_report_dropped_lines(tmp_path: Path) -> None:
    rundir = RunDir(tmp_path, "j")
    rundir.layout.results_dir.mkdir(parents=True)
    rundir.layout.results("c0000", 1).write_text(line("i1", OK, 1))
    rundir.layout.results("c0000", 2).write_text(line("i1", ERR, 2) + "{torn")  # a newer attempt's error
    with rundir.layout.results("c0000", 1).open("a") as f:
        f.write(line("i1", ERR, 1))  # the orphaned first attempt's late line
    assert (rundir.latest_results("c0000")["i1"].status, rundir.latest_results("c0000")["i1"].attempt) == (OK, 1)
    assert len(rundir.results("c0000")) == 3
    assert rundir.results_dropped("c0000") == 1
    assert rundir.latest_results("c0404") == {}


def test_the_controller_creates_each_attempts_results_file_before_its_service(tmp_path: Path) -> None:
    layout = RunLayout.host(tmp_path, "j")
    layout.results_dir.mkdir(parents=True)
    owner = (12345, 12346) if os.geteuid() == 0 else None
    create_results_file(layout, "c0007", 3, owner)
    st = os.stat(layout.results("c0007", 3))
    assert stat.S_ISREG(st.st_mode) and st.st_size == 0 and stat.S_IMODE(st.st_mode) == 0o640
    if owner is not None:
        assert (st.st_uid, st.st_gid) == owner
    layout.results("c0007", 3).write_text(line("i1", OK, 3))
    create_results_file(layout, "c0007", 3, owner)  # a controller restarted in between: kept as it is
    assert layout.results("c0007", 3).read_text() == line("i1", OK, 3)


def test_the_controller_never_creates_or_chowns_through_a_planted_link(tmp_path: Path) -> None:
    layout = RunLayout.host(tmp_path, "j")
    layout.results_dir.mkdir(parents=True)
    host = tmp_path / "host-file"
    host.write_text("precious")
    os.chmod(host, 0o600)
    layout.results("c0001", 2).symlink_to(host)
    with pytest.raises(OSError):
        create_results_file(layout, "c0001", 2, (12345, 12345))
    os.link(host, layout.results("c0001", 3))  # a hard link to a host file
    with pytest.raises(OSError):
        create_results_file(layout, "c0001", 3, (12345, 12345))
    assert stat.S_IMODE(host.stat().st_mode) == 0o600 and host.stat().st_uid == os.geteuid()
    assert host.read_text() == "precious"
    other = RunLayout.host(tmp_path, "k")
    other.dir.mkdir()
    os.symlink(tmp_path / "elsewhere", other.results_dir)
    (tmp_path / "elsewhere").mkdir()
    with pytest.raises(OSError):
        create_results_file(other, "c0001", 1, None)  # results/ itself a symlink
    assert list((tmp_path / "elsewhere").iterdir()) == []
    with pytest.raises(ValueError):
        create_results_file(layout, "../x", 1, None)


def test_the_watch_counts_only_its_own_attempts_lines(tmp_path: Path) -> None:
    layout = RunLayout.host(tmp_path, "j")
    layout.results_dir.mkdir(parents=True)
    layout.results("c0001", 1).write_text(line("i1", OK, 1) + line("i2", OK, 1))  # an orphan's file
    layout.results("c0001", 2).write_text(line("i1", OK, 2) + '{"item": "i2", "sta')  # mid-append
    att = Attempt(2, "svc", started=0.0)
    assert att.read_results(layout.results("c0001", 2)) == 1
    with layout.results("c0001", 2).open("a") as f:
        f.write('tus": "ok"}\n' + line("i2", OK, 2))
    assert att.read_results(layout.results("c0001", 2)) == 2
    os.unlink(layout.results("c0001", 2))
    os.mkfifo(layout.results("c0001", 2))
    assert att.read_results(layout.results("c0001", 2)) == 2  # a FIFO now: not read, no hang
