"""What the runner's uid may read and write, judged at submit (controller/job/access.py): refusals name
path, owner, mode and fix; missing output folders are made for the runner, never through a symlink.
Tests run as root (they chown); as another user they are skipped."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from controller.config import Config, parse_config
from controller.errors import MissingInputError
from controller.job import access
from controller.run import join
from controller.run.jobs import prepare, start_run
from controller.run.rundir import RunDir
from tests import builders

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to chown")

RUNNER = (10001, 10001)
IMAGE = "sha256:" + "1" * 64


def data_root(tmp_path: Path, **config: str) -> tuple[Config, Path]:
    """A data root owned by the runner (as scripts/dev-swarm.sh makes it) with a pack and a source."""
    root = builders.data_root(tmp_path, photos=("faces/star.jpg",))
    for p in (root, *root.rglob("*")):
        os.chown(p, *RUNNER)
    return parse_config(tmp_path / "ffswarm.yaml", {"data_root": str(root), **config}), root


def as_root(path: Path, mode: int) -> Path:
    """What `mkdir -p` / `cp` as root leave: owned by 0:0 with `mode`."""
    os.chown(path, 0, 0)
    path.chmod(mode)
    return path


def hidden_photos(root: Path, n: int = 3) -> Path:
    """The user's case: `mkdir -p hidden/in && cp … hidden/in/` as root."""
    folder = root / "hidden" / "in"
    folder.mkdir(parents=True)
    for i in range(n):
        (folder / f"p{i}.jpg").write_bytes(b"x")
        as_root(folder / f"p{i}.jpg", 0o644)
    as_root(root / "hidden", 0o755)
    as_root(folder, 0o755)
    return folder


def job(tmp_path: Path, output: str = "hidden/out/{stem}{ext}", targets: str = "hidden/in/*.jpg") -> Path:
    f = tmp_path / "job.yaml"
    f.write_text(f"name: j\nsource: faces/star.jpg\ntargets: [{targets}]\noutput: {output}\nresources: {{gpus: 0}}\n")
    return f


def tree(root: Path) -> list[tuple[str, int, int, int]]:
    return sorted((p.relative_to(root).as_posix(), *owner(p), p.lstat().st_mode) for p in root.rglob("*"))


def owner(p: Path) -> tuple[int, int]:
    st = p.lstat()
    return st.st_uid, st.st_gid


def test_permission_bits_are_judged_for_the_runners_uid_and_gid(tmp_path: Path) -> None:
    d = tmp_path / "d"
    d.mkdir()
    cases = [
        ((0, 0, 0o755), False),  # root's folder: 10001 gets "other" r-x
        ((0, 0, 0o777), True),
        ((0, 10001, 0o775), True),  # group bits for the gid
        ((0, 10001, 0o755), False),
        ((10001, 0, 0o700), True),  # owner bits for the uid, whatever others get
        ((10001, 10001, 0o577), False),  # the owner's bits decide even when others may
    ]
    for (uid, gid, mode), writable in cases:
        os.chown(d, uid, gid)
        d.chmod(mode)
        assert access.allows(d.stat(), RUNNER, access.W | access.X) is writable, (uid, gid, oct(mode))
    assert access.parse_ids("10001:20") == (10001, 20) and access.parse_ids("10001") == (10001, 10001)


def test_root_made_input_folders_work_and_the_output_folder_is_made_for_the_runner(tmp_path: Path) -> None:
    config, root = data_root(tmp_path)
    hidden_photos(root)
    before = tree(root)
    (prepared,) = prepare(config, [job(tmp_path)], new=False)  # also what --dry-run runs: it creates nothing
    assert prepared.folders == ("hidden/out",)
    assert tree(root) == before and not (root / "hidden" / "out").exists()

    rundir = start_run(config, prepared, IMAGE)
    assert owner(root / "hidden" / "out") == RUNNER and owner(root / "hidden") == (0, 0)
    assert rundir.exists()
    start_run(config, prepared, IMAGE)  # again (a resubmit): the folder is there, nothing changes
    assert owner(root / "hidden" / "out") == RUNNER


def test_every_missing_level_is_made_for_the_runner_and_nothing_above(tmp_path: Path) -> None:
    config, root = data_root(tmp_path)
    hidden_photos(root)
    (prepared,) = prepare(config, [job(tmp_path, output="hidden/a/b/c/{stem}{ext}")], new=False)
    assert prepared.folders == ("hidden/a/b/c",)
    start_run(config, prepared, IMAGE)
    assert [owner(root / "hidden" / p) for p in ("a", "a/b", "a/b/c")] == [RUNNER] * 3
    assert owner(root / "hidden") == (0, 0)


def test_in_a_tenants_area_out_is_made_for_the_runner_but_never_the_area_itself(tmp_path: Path) -> None:
    """What serve makes for an API job's default outputs (``out/<job>/``), or for a lane (``out/``)."""
    root = tmp_path / "root"
    root.mkdir()
    area = root / "tenants" / "acme"
    made = access.make_folders(root, ["tenants/acme/out/j1"], RUNNER)
    assert made == ["tenants/acme/out", "tenants/acme/out/j1"]
    assert owner(area / "out") == owner(area / "out" / "j1") == RUNNER  # a lane makes out/<job>/ in out/
    assert owner(area) == (os.geteuid(), os.getegid()) and stat.S_IMODE(area.stat().st_mode) == 0o755
    access.remove_folders(root, made)  # a refused job: its folders go, the tenant's area stays
    assert area.is_dir() and not (area / "out").exists()

    older = root / "tenants" / "globex"  # made the runner's by an older ffswarm
    older.mkdir()
    os.chown(older, *RUNNER)
    older.chmod(0o777)
    access.make_folders(root, ["tenants/globex/out/j2"], RUNNER)
    assert owner(older) == (os.geteuid(), os.getegid()) and stat.S_IMODE(older.stat().st_mode) == 0o755
    assert owner(older / "out" / "j2") == RUNNER


def test_an_existing_output_folder_the_runner_cannot_write_refuses_the_job(tmp_path: Path) -> None:
    config, root = data_root(tmp_path)
    hidden_photos(root)
    (root / "hidden" / "out").mkdir()
    as_root(root / "hidden" / "out", 0o755)
    before = tree(root)
    with pytest.raises(MissingInputError) as e:
        prepare(config, [job(tmp_path)], new=False)
    assert e.value.exit_code == 66
    lines = str(e.value).splitlines()
    assert (
        lines[0]
        == f"{tmp_path / 'job.yaml'}: the runner (uid:gid 10001:10001) could not do this job; nothing was created:"
    )
    assert lines[1] == "  hidden/out: output folder the runner cannot write (owner 0:0, mode 0755)"
    assert lines[2] == f"fix (as root, in {root}): chown -R 10001:10001 hidden/out && chmod -R u+rwX hidden/out"
    assert lines[3].startswith(f"or set runner_user: UID:GID in {tmp_path / 'ffswarm.yaml'}")
    assert tree(root) == before and not (root / "runs").exists()


def test_every_problem_is_listed_at_once_with_its_owner_and_mode(tmp_path: Path) -> None:
    config, root = data_root(tmp_path)
    folder = hidden_photos(root)
    as_root(folder / "p1.jpg", 0o600)  # copied from a private folder
    os.chown(root / "faces" / "star.jpg", 0, 0)
    (root / "faces" / "star.jpg").chmod(0o640)
    (root / "locked").mkdir()
    as_root(root / "locked", 0o555)
    f = job(tmp_path, output="locked/{stem}{ext}")
    with pytest.raises(MissingInputError) as e:
        prepare(config, [f], new=False)
    msg = str(e.value)
    assert "  faces/star.jpg: input the runner cannot read (owner 0:0, mode 0640)" in msg
    assert "  hidden/in/p1.jpg: input the runner cannot read (owner 0:0, mode 0600)" in msg
    assert "hidden/in/p0.jpg" not in msg and "hidden/in/p2.jpg" not in msg  # readable: not named
    assert "  locked: output folder the runner cannot write (owner 0:0, mode 0555)" in msg
    assert "chown -R 10001:10001 faces hidden/in locked && chmod -R u+rwX faces hidden/in locked" in msg


def test_a_folder_the_runner_cannot_enter_is_named_once_not_each_file_below(tmp_path: Path) -> None:
    config, root = data_root(tmp_path)
    hidden_photos(root, n=5)
    as_root(root / "hidden", 0o700)
    with pytest.raises(MissingInputError) as e:
        prepare(config, [job(tmp_path, output="out/{stem}{ext}")], new=False)
    (problem,) = [ln for ln in str(e.value).splitlines() if ln.startswith("  ")]
    assert problem == "  hidden: folder the runner cannot enter (owner 0:0, mode 0700)"
    assert not (root / "out").exists()


def test_a_long_list_is_cut_with_a_count(tmp_path: Path) -> None:
    config, root = data_root(tmp_path)
    for i in range(15):
        (root / f"o{i:02d}").mkdir()
        as_root(root / f"o{i:02d}", 0o755)
    with pytest.raises(MissingInputError) as e:
        access.check(config, [], [f"o{i:02d}" for i in range(15)], "job.yaml")
    lines = str(e.value).splitlines()
    assert lines[1:11] == [
        f"  o{i:02d}: output folder the runner cannot write (owner 0:0, mode 0755)" for i in range(10)
    ]
    assert lines[11] == "  … and 5 more"
    assert "chown -R 10001:10001 o00 o01" in lines[12] and lines[12].count(" …") == 2  # paths capped too


def test_group_access_and_runner_user_are_honoured(tmp_path: Path) -> None:
    config, root = data_root(tmp_path)
    hidden_photos(root)
    out = root / "hidden" / "out"
    out.mkdir()
    os.chown(out, 0, 10001)
    out.chmod(0o2775)  # a shared group folder, setgid
    (prepared,) = prepare(config, [job(tmp_path)], new=False)
    assert prepared.folders == ()
    other = parse_config(tmp_path / "ffswarm.yaml", {"data_root": str(root), "runner_user": "20000:10001"})
    resolved = prepared.resolved
    assert resolved is not None
    assert access.check_job(other, resolved, "job.yaml") == ()
    out.chmod(0o755)
    with pytest.raises(MissingInputError, match=r"uid:gid 20000:10001"):
        access.check_job(other, resolved, "job.yaml")


def test_an_output_path_through_a_file_is_refused(tmp_path: Path) -> None:
    config, root = data_root(tmp_path)
    hidden_photos(root)
    (root / "hidden" / "out").write_bytes(b"a file")
    with pytest.raises(MissingInputError, match=r"hidden/out: not a folder, but the job's paths go through it"):
        access.check(config, [], ["hidden/out/deeper"], "job.yaml")


def test_folders_are_never_made_through_a_symlink_swapped_in_after_the_check(tmp_path: Path) -> None:
    config, root = data_root(tmp_path)
    hidden_photos(root)
    (root / "hidden" / "away").mkdir()
    outside = tmp_path / "outside"
    outside.mkdir()
    (prepared,) = prepare(config, [job(tmp_path, output="hidden/away/out/{stem}{ext}")], new=False)
    assert prepared.folders == ("hidden/away/out",)
    (root / "hidden" / "away").rmdir()
    (root / "hidden" / "away").symlink_to(outside)
    with pytest.raises(MissingInputError, match=r"hidden/away: cannot create output folder hidden/away/out: a symlink"):
        start_run(config, prepared, IMAGE)
    assert list(outside.iterdir()) == [] and not (root / "runs").exists()
    with pytest.raises(MissingInputError, match="a symlink is in the way"):
        access.make_folders(root, ["hidden/away"], RUNNER)  # the link itself is never taken for a folder


def test_resume_checks_the_folders_of_what_is_left(tmp_path: Path) -> None:
    config, root = data_root(tmp_path)
    hidden_photos(root)
    (prepared,) = prepare(config, [job(tmp_path)], new=False)
    plan = prepared.plan
    assert access.check_plan(config, plan, [c.id for c in plan.chunks], "job.yaml") == ("hidden/out",)
    as_root(root / "hidden" / "in" / "p0.jpg", 0o600)
    with pytest.raises(MissingInputError, match="hidden/in/p0.jpg: input the runner cannot read"):
        access.check_plan(config, plan, [c.id for c in plan.chunks], "job.yaml")
    assert access.check_plan(config, plan, [], "job.yaml") == ()  # all done: their inputs and folders not needed


def test_the_video_join_makes_its_output_folder_for_the_runner(tmp_path: Path) -> None:
    from tests.unit.test_video import job_on, make_clip, rerun_with, run_segments

    make_clip(tmp_path / "in" / "a.mp4", seconds=1)
    spec, plan = job_on(tmp_path, segment_seconds=0.5, output="deliver/nc/{stem}{ext}")
    run_segments(tmp_path, plan)
    rundir = RunDir(tmp_path, plan.job, RUNNER)
    join.finish(plan, rundir, spec, rerun_with(tmp_path, plan, []), {}, lambda e, **k: None)
    assert (tmp_path / "deliver" / "nc" / "a.mp4").is_file()
    assert owner(tmp_path / "deliver") == owner(tmp_path / "deliver" / "nc") == RUNNER
    assert owner(tmp_path / "deliver" / "nc" / "a.mp4") == RUNNER


def test_the_plan_of_many_targets_is_checked_per_folder(tmp_path: Path) -> None:
    """100 targets in 2 folders: the folders' stats are cached (a sanity check, not a benchmark)."""
    config, root = data_root(tmp_path)
    for d in ("x", "y"):
        (root / d).mkdir()
        for i in range(50):
            (root / d / f"{i}.jpg").write_bytes(b"x")
    calls: list[str] = []
    real = os.lstat

    def counting(path: str) -> os.stat_result:
        calls.append(path)
        return real(path)

    with pytest.MonkeyPatch.context() as m:
        m.setattr(os, "lstat", counting)
        access.check(config, [f"{d}/{i}.jpg" for d in "xy" for i in range(50)], ["out/x", "out/y"], "job.yaml")
    below = [c for c in calls if c.startswith(f"{root}/")]
    assert len(below) == 100 + 2 + 1  # one per file; x and y; out (missing) once for both output folders


def test_a_refused_job_takes_back_exactly_the_folders_made_for_it(tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / "keep" / "empty").mkdir(parents=True)  # the user's own empty folder: never removed
    made = access.make_folders(root, ["keep/empty/a/b", "keep/c"], RUNNER)
    assert made == ["keep/c", "keep/empty/a", "keep/empty/a/b"]
    (root / "keep" / "c" / "late.jpg").write_bytes(b"x")  # written after all: kept with its folder
    access.remove_folders(root, made)
    assert not (root / "keep" / "empty" / "a").exists()
    assert (root / "keep" / "empty").is_dir() and (root / "keep" / "c" / "late.jpg").is_file()
