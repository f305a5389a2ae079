"""The shared volume is hostile (issue 16): the controller never follows a link on it, owns what it acts
on, and validates what it reads back. Real symlinks and FIFOs in temporary folders; every refusal is
checked together with "nothing outside the data root changed". Run as root (they chown); else skipped."""

from __future__ import annotations

import hashlib
import json
import os
import stat
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from contract.identity import IdentityResult
from contract.manifest import Segment
from controller import volume as volume_mod
from controller.config import ConfigError, parse_config
from controller.job.plan import Plan, chunk_manifests
from controller.run import identity, join
from controller.run.rundir import Control, RunDir, RunFileError
from controller.volume import UnsafePath, Volume, write_atomic
from tests.unit.test_plan import make_plan as plan_of
from tests.unit.test_plan import ms, targets

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to chown")

RUNNER = (10001, 10001)
CONTROLLER = (10000, 999)


@pytest.fixture(params=["openat2", "walk"])
def resolver(request: pytest.FixtureRequest) -> Iterator[str]:
    """Every test once with openat2 and once with the per-component O_NOFOLLOW walk (old kernels)."""
    saved = volume_mod._openat2_works
    volume_mod._openat2_works = False if request.param == "walk" else saved
    yield request.param
    volume_mod._openat2_works = saved


def snapshot(top: Path) -> dict[str, tuple[int, int, int, str]]:
    """Owner, group, mode and content digest of everything under ``top`` (links not followed)."""
    out = {}
    for p in [top, *sorted(top.rglob("*"))]:
        st = p.lstat()
        digest = hashlib.sha256(p.read_bytes()).hexdigest() if stat.S_ISREG(st.st_mode) else ""
        out[str(p.relative_to(top))] = (st.st_uid, st.st_gid, st.st_mode, digest)
    return out


def world(tmp_path: Path) -> tuple[Path, Path, dict[str, tuple[int, int, int, str]]]:
    """A data root and, beside it, a host folder with a secret in it (what an attack aims at)."""
    root, outside = tmp_path / "root", tmp_path / "host"
    root.mkdir()
    outside.mkdir(mode=0o700)
    (outside / "secret").write_text("do not touch")
    os.chmod(outside / "secret", 0o600)
    return root, outside, snapshot(outside)


def create(rundir: RunDir) -> Plan:
    plan = plan_of(rundir.job, targets(3), 2)
    rundir.create(b"name: j\n", plan, chunk_manifests(plan, ms()), Control(2), "sha256:" + "a" * 64)
    return plan


def mode(p: Path) -> tuple[int, int, int]:
    st = p.lstat()
    return st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode) | (st.st_mode & stat.S_ISGID)


# -- a symlink anywhere on a run folder's path -------------------------------------------------------------
@pytest.mark.usefixtures("resolver")
@pytest.mark.parametrize("link", ["runs/j", "runs"])
def test_a_symlinked_run_folder_is_refused_and_nothing_is_written_or_chowned_through_it(
    tmp_path: Path, link: str
) -> None:
    root, outside, before = world(tmp_path)
    (root / link).parent.mkdir(parents=True, exist_ok=True)
    (root / link).symlink_to(outside)
    with pytest.raises(UnsafePath, match=rf"{link} is a symbolic link \(never followed\)"):
        create(RunDir(root, "j", RUNNER))
    assert snapshot(outside) == before


@pytest.mark.usefixtures("resolver")
def test_a_symlink_planted_where_a_file_goes_is_replaced_never_written_through(tmp_path: Path) -> None:
    root, outside, before = world(tmp_path)
    rundir = RunDir(root, "j", RUNNER)
    rundir.make_dirs()
    rundir.layout.state.symlink_to(outside / "secret")
    rundir.write_state({})
    assert not rundir.layout.state.is_symlink() and rundir.state() is not None
    assert snapshot(outside) == before


# -- ownership: the controller's files are not the runner's ------------------------------------------------
def test_the_controllers_files_are_its_own_and_only_the_runner_folders_are_the_runners(tmp_path: Path) -> None:
    root, _, _ = world(tmp_path)
    rundir = RunDir(root, "j", RUNNER)
    create(rundir)
    uid, gid = os.geteuid(), RUNNER[1]
    for name in ("job.yaml", "job.sha256", "plan.json", "control.json", "image.json", "chunks/c0000.json"):
        assert mode(rundir.path / name) == (uid, gid, 0o640), name
    for folder in (rundir.path, rundir.layout.chunks_dir):
        assert mode(folder) == (uid, gid, 0o750)
    for sub in ("results", "logs", "segments", "attempts", "identity"):
        assert mode(rundir.path / sub) == (*RUNNER, 0o2770), sub
    assert [p.name for p in rundir.path.iterdir() if p.lstat().st_uid == RUNNER[0] and p.is_file()] == []


def test_a_run_folder_a_runner_made_first_is_taken_back(tmp_path: Path) -> None:
    root, _, _ = world(tmp_path)
    (root / "runs" / "j" / "chunks").mkdir(parents=True)
    for p in (root / "runs" / "j", root / "runs" / "j" / "chunks"):
        os.chown(p, *RUNNER)
        os.chmod(p, 0o777)
    rundir = RunDir(root, "j", RUNNER)
    create(rundir)
    assert mode(rundir.path) == mode(rundir.layout.chunks_dir) == (os.geteuid(), RUNNER[1], 0o750)


@pytest.mark.parametrize("mask, expected", [(0o022, 0o640), (0o000, 0o640), (0o077, 0o600)])
def test_write_atomic_is_0640_unless_the_umask_is_stricter(tmp_path: Path, mask: int, expected: int) -> None:
    old = os.umask(mask)
    try:
        write_atomic(tmp_path / "f.json", b"{}")
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "f.json").stat().st_mode) == expected
    assert [p.name for p in tmp_path.iterdir()] == ["f.json"]  # no temporary left


@pytest.mark.parametrize("configured", [True, False])
def test_controller_user_owns_the_run_folder_files(tmp_path: Path, configured: bool) -> None:
    root, _, _ = world(tmp_path)
    extra = {"controller_user": "10000:999"} if configured else {}
    config = parse_config(tmp_path / "ffswarm.yaml", {"data_root": str(root), "runner_user": "10001:10001", **extra})
    assert config.controller_user == (CONTROLLER if configured else None)
    rundir = RunDir(root, "j", RUNNER, config.controller_ids())
    create(rundir)
    uid = CONTROLLER[0] if configured else os.geteuid()
    for p in (rundir.path, rundir.layout.plan, rundir.layout.control, rundir.layout.manifest("c0000")):
        assert (p.stat().st_uid, p.stat().st_gid) == (uid, RUNNER[1]), p.name
    rundir.write_control(Control(1, cancel=True))  # `ffswarm cancel` (no ids given): the folder's owner stays
    RunDir(root, "j").write_control(Control(1, cancel=True))
    assert (rundir.layout.control.stat().st_uid, rundir.layout.control.stat().st_gid) == (uid, RUNNER[1])


@pytest.mark.parametrize("value", ["0:999", "10000:0", "root", 10000, "10000", "-1:5", "99999999999:1"])
def test_controller_user_must_be_a_non_root_uid_gid(tmp_path: Path, value: object) -> None:
    with pytest.raises(ConfigError, match=r"controller_user must be a non-root UID:GID \(neither 0\)"):
        parse_config(tmp_path / "ffswarm.yaml", {"data_root": str(tmp_path), "controller_user": value})


# -- what is read back is validated ------------------------------------------------------------------------
def good_plan() -> dict[str, object]:
    return json.loads(plan_of("j", targets(2), 1).to_json())  # type: ignore[no-any-return]


@pytest.mark.parametrize(
    "edit, why",
    [
        (lambda d: d["items"][0].update(output="/etc/passwd"), "an absolute path"),
        (lambda d: d["items"][0].update(output="out/../../host/secret"), "leads out of the data root"),
        (lambda d: d["items"][0].update(input="a//b.jpg"), "leads out of the data root or is not normalised"),
        (lambda d: d["items"][0].update(kind="script"), "kind 'script' is not image or segment"),
        (lambda d: d["items"][0].update(id="I0"), "not a-z, 0-9 and - only: 'I0'"),
        (lambda d: d["items"][0].update(extra=1), "an item is not"),
        (lambda d: d["chunks"][0].update(items=["i999999"]), "items must be ids of the plan's items"),
        (lambda d: d["chunks"].append(d["chunks"][0]), "an item is in more than one chunk"),
        (lambda d: d.update(job="other"), "names job other, not j"),
        (lambda d: d.update(items={}), "items must be a list"),
    ],
)
def test_an_edited_plan_is_a_clear_error_naming_the_file(tmp_path: Path, edit, why: str) -> None:  # type: ignore[no-untyped-def]
    data = good_plan()
    edit(data)
    rundir = RunDir(tmp_path, "j")
    rundir.make_dirs()
    rundir.layout.plan.write_text(json.dumps(data))
    with pytest.raises(RunFileError, match=r"^runs/j/plan.json: .*" + why.replace("(", r"\(").replace(")", r"\)")):
        rundir.plan()


def test_a_segment_output_redirected_by_an_edited_plan_is_refused() -> None:
    seg = Segment(0, 10, "25/1", 64, 48, 12800)
    plan = {
        "job": "j",
        "items": [{"id": "i000000-s0000", "input": "in/a.mp4", "output": "host/secret", "kind": "segment",
                   "parent": "i000000", "segment": seg.__dict__}],
        "chunks": [{"id": "c0000", "items": ["i000000-s0000"]}],
    }  # fmt: skip
    with pytest.raises(ValueError, match=r"a segment's output must be runs/j/segments/i000000-s0000\.mp4"):
        Plan.from_json(json.dumps(plan))


@pytest.mark.parametrize(
    "name, content, why",
    [
        ("control.json", b'{"max_concurrent": "9e9"}', "not {max_concurrent"),
        ("control.json", b"[", "not valid JSON"),
        ("state.json", b'{"chunks": {"c0000\\n  cap_add": {}}}', "not a state the controller wrote"),
        ("state.json", b'{"stage": "rm -rf"}', "not a state the controller wrote"),
        ("image.json", b'{"image": "x --privileged"}', "not an image"),
    ],
)
def test_bad_control_state_and_image_files_are_clear_errors(
    tmp_path: Path, name: str, content: bytes, why: str
) -> None:
    rundir = RunDir(tmp_path, "j")
    rundir.make_dirs()
    (rundir.path / name).write_bytes(content)
    read = {"control.json": rundir.control, "state.json": rundir.state, "image.json": rundir.image}[name]
    with pytest.raises(RunFileError, match=rf"^runs/j/{name}: {why.replace('{', '[{]')}"):
        read()


@pytest.mark.usefixtures("resolver")
def test_a_fifo_or_a_link_for_a_state_file_does_not_block_or_leak(tmp_path: Path) -> None:
    root, outside, before = world(tmp_path)
    rundir = RunDir(root, "j")
    rundir.make_dirs()
    os.mkfifo(rundir.layout.state)
    rundir.layout.control.symlink_to(outside / "secret")
    outcome: list[str] = []

    def read() -> None:
        for f in (rundir.state, rundir.control):
            try:
                f()
            except RunFileError as e:
                outcome.append(str(e))

    t = threading.Thread(target=read, daemon=True)
    t.start()
    t.join(5)
    assert outcome == [
        "runs/j/state.json: not a regular file",
        "runs/j/control.json: reading refused: runs/j/control.json is a symbolic link (never followed)",
    ]
    assert snapshot(outside) == before and "do not touch" not in "".join(outcome)


def test_identity_json_is_read_as_untrusted_data(tmp_path: Path) -> None:
    root, outside, before = world(tmp_path)
    rundir = RunDir(root, "j", RUNNER)
    rundir.make_dirs()
    answer = rundir.layout.identity
    assert answer.parent != rundir.path and answer.parent.stat().st_uid == RUNNER[0]  # not the folder's top
    answer.write_text(json.dumps({"source_embedding": [1.0] * 5000}))
    assert identity.read_result(rundir) == IdentityResult(error="the identity step's answer is malformed")
    answer.write_text(json.dumps({"error": {"not": "text"}}))
    assert identity.read_result(rundir) == IdentityResult(error="the identity step's answer is malformed")
    answer.unlink()
    answer.symlink_to(outside / "secret")
    result = identity.read_result(rundir)
    assert result is not None and result.error and "symbolic link" in result.error and not result.answered
    answer.unlink()
    os.mkfifo(answer)
    result = identity.read_result(rundir)
    assert result is not None and result.error and "not a regular file" in result.error
    assert snapshot(outside) == before


# -- the join: its writes and deletes stay in the data root ------------------------------------------------
def test_the_join_never_writes_through_a_symlinked_output_folder(tmp_path: Path) -> None:
    from tests.unit.test_video import job_on, make_clip, rerun_with, run_segments

    root, outside, before = world(tmp_path)
    make_clip(root / "in" / "a.mp4", seconds=1)
    spec, plan = job_on(root, segment_seconds=0.5, output="deliver/{stem}{ext}")
    run_segments(root, plan)
    (root / "deliver").symlink_to(outside)
    events: list[dict[str, object]] = []
    join.finish(
        plan, RunDir(root, plan.job, RUNNER), spec, rerun_with(root, plan, []), {}, lambda e, **k: events.append(k)
    )
    (joined,) = [e for e in events if "status" in e]
    assert joined["status"] == "error" and "deliver: cannot create output folder deliver: a symlink" in str(
        joined["reason"]
    )
    assert snapshot(outside) == before


def test_the_join_reads_no_segment_through_a_link_and_deletes_only_the_link(tmp_path: Path) -> None:
    from tests.unit.test_video import job_on, make_clip, rerun_with, run_segments

    root, outside, before = world(tmp_path)
    make_clip(root / "in" / "a.mp4", seconds=1)
    spec, plan = job_on(root, segment_seconds=0.5)
    run_segments(root, plan)
    first = root / plan.item(plan.videos[0].segments[0]).output
    first.unlink()
    first.symlink_to(outside / "secret")  # a runner swapped its segment for a link to a host file
    calls: list[list[str]] = []
    rundir = RunDir(root, plan.job, RUNNER)
    join.finish(plan, rundir, spec, rerun_with(root, plan, calls), {}, lambda e, **k: None)
    assert calls == [["c0000"]] and not first.is_symlink()  # the link deleted, the segment redone
    joined = join.joins(rundir)[plan.videos[0].id]
    assert joined.output == "out/a.mp4" and joined.reason is None and (root / "out" / "a.mp4").is_file()
    assert mode(root / "out" / "a.mp4")[:2] == RUNNER
    assert [p.name for p in (root / "out").iterdir()] == ["a.mp4"]  # no temporary left beside it
    assert mode(rundir.layout.joins) == (os.geteuid(), RUNNER[1], 0o640)
    assert snapshot(outside) == before


@pytest.mark.parametrize(
    ("given", "rel"),
    [
        ("a/b.json", "a/b.json"),
        ("./a//b/./c", "a/b/c"),
        ("", ""),
        ("{root}", ""),
        ("{root}/a/b.json", "a/b.json"),
        ("{root}//a/./b", "a/b"),
        ("{root}/", ""),
    ],
)
def test_volume_names_a_path_relative_to_its_root(tmp_path: Path, given: str, rel: str) -> None:
    vol = Volume(tmp_path / "root")
    text = given.format(root=tmp_path / "root")
    assert vol.rel(text) == rel
    assert vol.rel(Path(text)) == rel


def test_volume_refuses_an_absolute_path_beside_its_root(tmp_path: Path) -> None:
    vol = Volume(tmp_path / "root")
    for bad in (f"{tmp_path}/rooted/a", f"{tmp_path}/root/../x", "a/../../x"):
        with pytest.raises(UnsafePath):
            vol.rel(bad)


def test_volume_paths_cannot_leave_the_root(tmp_path: Path) -> None:
    root, outside, before = world(tmp_path)
    vol = Volume(root)
    for bad in ("../host/secret", "a/../../host/secret", str(outside / "secret")):
        with pytest.raises(UnsafePath):
            vol.write_atomic(bad, b"x")
        with pytest.raises(UnsafePath):
            vol.unlink(bad)
    assert snapshot(outside) == before


def test_a_runs_folder_made_first_by_the_output_claims_is_shared_with_the_runner(tmp_path: Path) -> None:
    """The output claims (runs/.claims) may make runs/ before the run folder: as root's 0750, runners
    could not reach their manifests (seen on the three-node cluster: every chunk "Permission denied")."""
    from controller.job import claims

    root = tmp_path / "data"
    root.mkdir()
    claims.claim(root, "j", ["out/a.jpg"], "job.yaml")
    assert (root / "runs").stat().st_gid == os.getegid()
    rd = RunDir(root, "j", (10001, 10002), None)
    rd.make_dirs()
    st = (root / "runs").stat()
    assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode) & 0o050) == (os.geteuid(), 10002, 0o050)


def test_a_runs_folder_a_root_controller_made_is_handed_to_controller_user(tmp_path: Path) -> None:
    """serve runs as root (the Docker socket) and the API as controller_user: runs/, made as root's by
    the output claims, must become controller_user's, or the API cannot read any run folder."""
    from controller.job import claims

    root = tmp_path / "data"
    root.mkdir()
    claims.claim(root, "j", ["out/a.jpg"], "job.yaml")
    assert (root / "runs").stat().st_uid == 0
    RunDir(root, "j", (10001, 10001), (10002, 10001)).make_dirs()
    st = (root / "runs").stat()
    assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode) & 0o050) == (10002, 10001, 0o050)


@pytest.fixture(params=["renameat2", "check-then-rename"])
def rename(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Once with RENAME_NOREPLACE, once as on a filesystem without it (NFS)."""
    if request.param != "renameat2":
        monkeypatch.setattr(volume_mod, "_renameat2_works", False)
    return str(request.param)


def test_a_folder_made_for_the_runner_appears_only_with_its_owner_and_mode(
    tmp_path: Path, rename: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two of serve's jobs writing into one new output folder (seen in CI): while one made it, the
    other's access check saw it as root's 0700 and refused the job ("folder the runner cannot enter").
    Whoever looks at the folder's name, at any moment, sees it missing or finished."""
    root = tmp_path / "data"
    root.mkdir()
    seen: list[tuple[int, int, int] | None] = []
    real_own = volume_mod.own

    def own_and_look(fd: int, owner: tuple[int, int] | None, mode: int | None, rel: str) -> None:
        real_own(fd, owner, mode, rel)
        for where in ("out", "out/sub"):  # what another process sees now, between give and show
            try:
                st = (root / where).lstat()
                seen.append((st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)))
            except FileNotFoundError:
                seen.append(None)

    monkeypatch.setattr(volume_mod, "own", own_and_look)
    made = Volume(root).mkdirs("out/sub", RUNNER, 0o755)
    assert made == ["out", "out/sub"]
    assert seen == [None, None, (*RUNNER, 0o750), None]  # out/ shown only once given; sub/ likewise
    assert ((root / "out/sub").stat().st_uid, stat.S_IMODE((root / "out/sub").stat().st_mode)) == (RUNNER[0], 0o755)
    assert sorted(p.name for p in (root / "out").iterdir()) == ["sub"]


def test_a_folder_another_process_made_meanwhile_is_used_and_nothing_is_left(
    tmp_path: Path, rename: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "data"
    root.mkdir()
    real_own = volume_mod.own

    def own_while_another_makes_it(fd: int, owner: tuple[int, int] | None, mode: int | None, rel: str) -> None:
        real_own(fd, owner, mode, rel)
        if not (root / "out").exists():
            (root / "out").mkdir()
            os.chown(root / "out", *CONTROLLER)
            (root / "out" / "theirs.jpg").write_bytes(b"x")

    monkeypatch.setattr(volume_mod, "own", own_while_another_makes_it)
    assert Volume(root).mkdirs("out", RUNNER, 0o755) == []
    assert [p.name for p in root.iterdir()] == ["out"]  # no temporary folder left beside it
    assert (root / "out").stat().st_uid == CONTROLLER[0]  # theirs, not replaced
    assert (root / "out" / "theirs.jpg").read_bytes() == b"x"
