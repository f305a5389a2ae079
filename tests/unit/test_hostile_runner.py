"""The runner on a hostile shared volume (issue 16, runner side): inputs that are FIFOs, symlinks,
devices or folders; output folders that are symlinks; outputs this job did not write; temporary
files of other writers; results per attempt. End to end through ``python -m runner_image``'s main
with the stand-in pack (tests/unit/test_runner_chunk.py's fixtures), on real files in a tmp folder.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import signal
import stat
from pathlib import Path

import pytest

from contract.manifest import Item
from contract.results import ItemResult, ItemStatus
from runner_image.errors import Terminated
from runner_image.safefs import EXISTS
from runner_image.volume import ResultsLog
from tests.unit.test_runner_chunk import JOB, results, run, temp_files, write_manifest

OUT = "out/astronaut.png"


def run_within(root: Path, manifest: str, seconds: int = 120, attempt: int = 1) -> int:
    """The attempt, with an alarm: a hang (a FIFO opened or read) fails the test instead of stalling it."""

    def hung(signum: int, frame: object) -> None:
        raise TimeoutError("the attempt hung")

    previous = signal.signal(signal.SIGALRM, hung)
    signal.alarm(seconds)
    try:
        return run(root, manifest, attempt)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def reasons(root: Path) -> dict[str, str | None]:
    return {Path(r.input).name: r.reason for r in results(root)}


def test_a_fifo_input_is_an_item_error_at_once_not_a_hang(data: Path) -> None:
    os.mkfifo(data / "in" / "fifo.jpg")
    assert run_within(data, write_manifest(data, ["fifo.jpg", "astronaut.jpg"])) == 3
    got = {Path(r.input).name: r for r in results(data)}
    assert got["fifo.jpg"].reason == "in/fifo.jpg: is a FIFO (named pipe), not a regular file"
    assert got["astronaut.jpg"].status is ItemStatus.OK


def test_symlinked_inputs_and_input_folders_are_not_followed(data: Path) -> None:
    secret = data.parent / "secret.jpg"  # outside the data root
    shutil.copyfile(data / "in" / "astronaut.jpg", secret)
    (data / "in" / "link.jpg").symlink_to(secret)
    (data / "linked").symlink_to(data.parent)  # a folder on the way that is a symlink
    (data / "in" / "folder.jpg").mkdir()
    items = tuple(
        Item(f"i{n:06d}", f"/data/{path}", f"/data/out/{n}.png")
        for n, path in enumerate(["in/link.jpg", "in/folder.jpg", "linked/secret.jpg"])
    )
    assert run_within(data, write_manifest(data, [], items=items)) == 3
    got = {r.input: r.reason for r in results(data)}
    assert got["/data/in/link.jpg"] == "in/link.jpg: is a symbolic link: not followed"
    assert got["/data/in/folder.jpg"] == "in/folder.jpg: is a folder, not a regular file"
    assert got["/data/linked/secret.jpg"] == "linked/secret.jpg: folder linked is a symbolic link: not followed"
    assert not (data / "out").exists()  # nothing was made of them


def test_a_device_input_is_refused_without_reading_it(data: Path) -> None:
    try:
        os.mknod(data / "in" / "zero.jpg", stat.S_IFCHR | 0o644, os.makedev(1, 5))  # /dev/zero: endless
    except PermissionError:
        pytest.skip("making a device node needs root")
    assert run_within(data, write_manifest(data, ["zero.jpg"])) == 3
    assert reasons(data)["zero.jpg"] == "in/zero.jpg: is a device, not a regular file"


def test_a_symlinked_output_folder_is_an_item_error_and_nothing_is_written_through_it(data: Path) -> None:
    private = data / "alice" / "private"
    private.mkdir(parents=True)
    (data / "out").symlink_to(private)  # m/out -> alice/private, made after planning
    assert run_within(data, write_manifest(data, ["astronaut.jpg"])) == 3
    assert reasons(data)["astronaut.jpg"] == "out/astronaut.png: folder out is a symbolic link: not followed"
    assert list(private.iterdir()) == []  # no output, no temporary file
    # deeper: a folder under the output folder that is a symlink
    (data / "out").unlink()
    (data / "out").mkdir()
    (data / "out" / "deep").symlink_to(private)
    item = Item("i000000", "/data/in/astronaut.jpg", "/data/out/deep/x/astronaut.png")
    assert run_within(data, write_manifest(data, [], items=(item,), chunk="c0002")) == 3
    (r,) = results(data, "c0002")
    assert r.reason == "out/deep/x/astronaut.png: folder out/deep is a symbolic link: not followed"
    assert list(private.iterdir()) == []


def test_an_existing_output_this_job_did_not_write_is_refused_unless_overwrite(data: Path) -> None:
    (data / "out").mkdir()
    (data / OUT).write_bytes(b"alice's picture")
    assert run_within(data, write_manifest(data, ["astronaut.jpg"])) == 3
    (r,) = results(data)
    assert (r.status, r.reason) == (ItemStatus.ERROR, f"{OUT}: {EXISTS}")
    assert (data / OUT).read_bytes() == b"alice's picture"
    assert temp_files(data) == []
    # the job says overwrite: true
    assert run_within(data, write_manifest(data, ["astronaut.jpg"], overwrite=True), attempt=2) == 0
    new = [r for r in results(data) if r.attempt == 2]
    assert [r.status for r in new] == [ItemStatus.OK]
    assert (data / OUT).read_bytes() != b"alice's picture"


def test_a_commit_is_recognised_by_its_record_not_by_the_file_existing(data: Path) -> None:
    manifest = write_manifest(data, ["astronaut.jpg"])
    assert run_within(data, manifest) == 0
    (first,) = results(data)
    body = (data / OUT).read_bytes()
    assert (first.size, first.sha256) == (len(body), hashlib.sha256(body).hexdigest())
    mtime = (data / OUT).stat().st_mtime_ns
    assert run_within(data, manifest, attempt=2) == 0  # unchanged: re-acknowledged, not rewritten
    second = [r for r in results(data) if r.attempt == 2]
    assert [(r.cached, r.sha256) for r in second] == [(True, first.sha256)]
    assert (data / OUT).stat().st_mtime_ns == mtime
    # someone else put another file at the name: not this job's commit any more, and not replaced
    (data / OUT).write_bytes(b"another writer's file")
    assert run_within(data, manifest, attempt=3) == 3
    (third,) = [r for r in results(data) if r.attempt == 3]
    assert (third.status, third.reason) == (ItemStatus.ERROR, f"{OUT}: {EXISTS}")
    assert (data / OUT).read_bytes() == b"another writer's file"


def test_a_deleted_output_is_redone_and_a_symlink_at_its_name_is_not_a_commit(data: Path) -> None:
    manifest = write_manifest(data, ["astronaut.jpg"])
    assert run_within(data, manifest) == 0
    elsewhere = data.parent / "elsewhere.png"
    shutil.move(data / OUT, elsewhere)
    (data / OUT).symlink_to(elsewhere)  # same bytes, reached through a link
    assert run_within(data, manifest, attempt=2) == 3
    (r,) = [r for r in results(data) if r.attempt == 2]
    assert (r.status, r.reason) == (ItemStatus.ERROR, f"{OUT}: {EXISTS}")
    (data / OUT).unlink()
    assert run_within(data, manifest, attempt=3) == 0
    (r,) = [r for r in results(data) if r.attempt == 3]
    assert (r.status, r.cached) == (ItemStatus.OK, False)
    assert (data / OUT).is_file() and not (data / OUT).is_symlink()


def test_stale_temps_removed_are_only_this_chunks_earlier_attempts(data: Path) -> None:
    out = data / "out"
    out.mkdir()
    mine = out / f".astronaut.png.ffswarm-{JOB}-c0001-a1-0a0b0c.tmp"
    keep = [
        out / f".astronaut.png.ffswarm-{JOB}-c0002-a1-0a0b0c.tmp",  # another chunk of this job
        out / ".astronaut.png.ffswarm-otherjob-c0001-a1-0a0b0c.tmp",  # another job's chunk c0001
        out / f".astronaut.png.ffswarm-{JOB}-c0001-a5-0a0b0c.tmp",  # a later (orphaned?) attempt's
        out / ".astronaut.png.tmp-0a0b0c0d0e0f",  # another writer's, in the old style
        out / "notes.txt",
    ]
    for p in [mine, *keep]:
        p.write_bytes(b"partial")
    assert run_within(data, write_manifest(data, ["astronaut.jpg"]), attempt=2) == 0
    assert not mine.exists()
    assert all(p.read_bytes() == b"partial" for p in keep)


def test_results_are_written_per_attempt_and_earlier_attempts_are_read(data: Path) -> None:
    manifest = write_manifest(data, ["astronaut.jpg", "no_face.jpg"])
    assert run_within(data, manifest, attempt=3) == 0
    folder = data / "runs" / JOB / "results"
    assert sorted(p.name for p in folder.glob("*.jsonl")) == ["c0001.a3.jsonl"]
    assert run_within(data, manifest, attempt=4) == 0
    assert sorted(p.name for p in folder.glob("*.jsonl")) == ["c0001.a3.jsonl", "c0001.a4.jsonl"]
    assert [r.cached for r in results(data) if r.attempt == 4] == [True, True]


def test_a_results_file_that_is_a_symlink_or_fifo_is_not_used(data: Path) -> None:
    folder = data / "runs" / JOB / "results"
    folder.mkdir(parents=True)
    target = data.parent / "host-file"
    target.write_text("precious\n")
    (folder / "c0001.a1.jsonl").symlink_to(target)
    os.mkfifo(folder / "c0001.a0.jsonl")  # an earlier attempt's "file": never read, never blocks
    assert run_within(data, write_manifest(data, ["astronaut.jpg"])) == 75  # temporary: retried
    assert target.read_text() == "precious\n"


def test_an_output_renamed_by_a_killed_attempt_before_its_result_line_is_still_this_jobs(data: Path) -> None:
    """A kill between the rename and the result line leaves the output without a record; the commit
    journal (written just before the rename) tells the next attempt it is this job's own."""
    manifest = write_manifest(data, ["astronaut.jpg"])
    real = ResultsLog.append

    def killed(self: ResultsLog, result: ItemResult) -> None:
        if result.status is ItemStatus.OK:
            raise Terminated()
        real(self, result)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(ResultsLog, "append", killed)
        assert run_within(data, manifest) == 143
    assert (data / OUT).is_file() and results(data) == []
    body = (data / OUT).read_bytes()
    assert run_within(data, manifest, attempt=2) == 0
    (r,) = results(data)
    # recorded for the first time: this line is the item's one commit, not a cached re-acknowledgement
    assert (r.status, r.cached, r.sha256) == (ItemStatus.OK, False, hashlib.sha256(body).hexdigest())
    # the journal vouches only for the file as it was renamed
    (data / OUT).write_bytes(b"replaced by someone")
    assert run_within(data, manifest, attempt=3) == 3
    (r,) = [r for r in results(data) if r.attempt == 3]
    assert r.reason == f"{OUT}: {EXISTS}"


def test_an_output_committed_meanwhile_by_another_attempt_fails_the_item_without_a_journal_entry(data: Path) -> None:
    """Two attempts of one chunk at once (a drained node's runner still finishing): the one that
    finds the output committed when it comes to commit neither replaces it nor journals it."""
    from runner_image import safefs

    manifest = write_manifest(data, ["astronaut.jpg"])
    real = safefs._digest_fd

    def other_attempt_first(fd: int) -> safefs.Digest:
        (data / OUT).write_bytes(b"the other attempt's commit")
        return real(fd)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(safefs, "_digest_fd", other_attempt_first)
        assert run_within(data, manifest) == 3
    (r,) = results(data)
    assert (r.status, r.reason) == (ItemStatus.ERROR, f"{OUT}: {EXISTS}")
    assert (data / OUT).read_bytes() == b"the other attempt's commit"
    journals = list(data.rglob("*.commits"))
    assert journals and all(j.read_text() == "" for j in journals)


def test_a_file_where_an_output_folder_should_be_is_named(data: Path) -> None:
    (data / "out").write_bytes(b"a file, not a folder")
    assert run_within(data, write_manifest(data, ["astronaut.jpg"], overwrite=True)) == 3
    assert reasons(data)["astronaut.jpg"] == "out/astronaut.png: out is a file, not a folder"
