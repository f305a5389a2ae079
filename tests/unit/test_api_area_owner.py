"""The top of a tenant's area is the API's; only the folders outputs go to are the runner's. A runner
that could write the area's top (a CLI job's runner sees the whole data root) could rename
``uploads/`` or rewrite another job's inputs. Real API on loopback, real `serve` steps (claim,
prepare, start), real ownership, and the runner's uid played by a child process that becomes it.
Tests run as root (they chown and setuid); as another user they are skipped."""

from __future__ import annotations

import os
import stat
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from controller.api.area import Area
from controller.job import access
from controller.run import usecase
from controller.run.jobs import start_run
from tests.builders import JPEG, Env, api_env
from tests.unit.test_api_ops import claim

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to chown and to become the runner")

RUNNER = (10001, 10001)  # the data root's owner in tests/builders.py: the runner's uid:gid
CONTROLLER_USER = (4321, 4321)
IMAGE = "sha256:" + "1" * 64


@pytest.fixture
def env(tmp_path: Path) -> Iterator[Env]:
    yield from api_env(tmp_path)


def ids_and_mode(path: Path) -> tuple[int, int, int]:
    st = path.lstat()
    return st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)


API = (os.geteuid(), os.getegid(), 0o755)


def test_the_area_is_the_apis_after_the_first_request_and_a_jobs_outputs_folder_the_runners(env: Env) -> None:
    area = env.area()
    with env.client() as c:
        assert c.get("/v1/jobs").status_code == 200  # the area is made on first use
        assert ids_and_mode(area) == API
        (area / "crowd").mkdir()
        (area / "crowd" / "a.jpg").write_bytes(JPEG)
        (area / "crowd").chmod(0o755)
        r = c.post("/v1/jobs", json={"source": "crowd/a.jpg", "targets": ["crowd/a.jpg"], "resources": {"gpus": 0}})
        assert r.status_code == 202, r.text
        up = c.post("/v1/jobs", files=[("source", ("me.jpg", JPEG)), ("targets", ("t.jpg", JPEG))])
        assert up.status_code == 202, up.text
    job = r.json()["id"]
    assert (area / "uploads").lstat().st_uid == os.geteuid()  # uploads/ stays the API's
    rundir = start_run(env.config, usecase.one_job(env.config, claim(env.config, job), tenant="acme"), IMAGE)
    assert rundir.exists()
    assert (area / "out").lstat().st_uid == (area / "out" / job).lstat().st_uid == RUNNER[0]
    assert ids_and_mode(area) == API  # serve made out/<job>/ for the runner, and nothing above it


def test_an_area_the_runner_owns_is_taken_back_on_the_next_request(env: Env) -> None:
    area = env.area()
    (area / "in").mkdir(parents=True)
    (area / "in" / "p.jpg").write_bytes(JPEG)
    for p in (area, area / "in", area / "in" / "p.jpg"):
        os.chown(p, *RUNNER)
    area.chmod(0o777)
    with capture_logs() as logs, env.client() as c:
        assert c.get("/v1/jobs").status_code == 200
        assert c.get("/v1/jobs").status_code == 200
    assert ids_and_mode(area) == API
    assert (area / "in").lstat().st_uid == (area / "in" / "p.jpg").lstat().st_uid == RUNNER[0]  # only the top
    assert [e["tenant"] for e in logs if e["event"] == "api_area_taken_back"] == ["acme"]


def test_a_link_in_place_of_the_area_is_refused_and_nothing_is_chowned_through_it(env: Env) -> None:
    elsewhere = env.root / "elsewhere"
    elsewhere.mkdir()
    os.chown(elsewhere, *RUNNER)
    env.area().parent.mkdir(exist_ok=True)
    env.area().symlink_to(elsewhere)
    with capture_logs(), env.client() as c:
        r = c.get("/v1/jobs")
    assert r.status_code == 500 and r.json()["error"]["code"] == "internal"
    assert elsewhere.lstat().st_uid == RUNNER[0] and list(elsewhere.iterdir()) == []


# -- as another uid: a child process that becomes it ------------------------------------------------------
def as_uid(ids: tuple[int, int], body: Callable[[], int]) -> int:
    """``body`` run in a child process as ``ids`` (uid:gid, no other groups); its exit code."""
    pid = os.fork()
    if pid == 0:
        code = 99
        try:
            os.setgroups([])
            os.setgid(ids[1])
            os.setuid(ids[0])
            code = body()
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


@pytest.fixture
def shared_root() -> Iterator[Path]:
    """A data root other uids can reach (pytest's tmp_path is root's alone), owned by the runner."""
    with tempfile.TemporaryDirectory(dir="/tmp") as top:
        os.chmod(top, 0o755)
        root = Path(top) / "data"
        root.mkdir(mode=0o755)
        os.chown(root, *RUNNER)
        yield root


def test_the_runner_cannot_write_at_the_areas_top_only_in_its_outputs_folders(shared_root: Path) -> None:
    area = Area(shared_root, "acme")
    area.ensure(RUNNER)
    (area.path / "uploads" / "j0").mkdir(parents=True)
    (area.path / "uploads" / "j0" / "face.jpg").write_bytes(JPEG)
    access.make_folders(shared_root, ["tenants/acme/out/j1"], RUNNER)

    def runner() -> int:
        refused = 0
        for attempt in (
            lambda: (area.path / "planted.jpg").write_bytes(b"x"),
            lambda: (area.path / "uploads").rename(area.path / "moved"),
            lambda: (area.path / "uploads" / "j0").rename(area.path / "uploads" / "j9"),
            lambda: (area.path / "uploads" / "j0" / "face.jpg").write_bytes(b"x"),
        ):
            try:
                attempt()
            except PermissionError:
                refused += 1
        (area.path / "out" / "j1" / "a.jpg").write_bytes(JPEG)  # its outputs
        (area.path / "out" / "j2").mkdir()  # a lane's later job, inside out/
        return 0 if refused == 4 else 1

    assert as_uid(RUNNER, runner) == 0
    assert sorted(p.name for p in area.path.iterdir()) == ["out", "uploads"]
    assert (area.path / "uploads" / "j0" / "face.jpg").read_bytes() == JPEG
    assert (area.path / "out" / "j2").lstat().st_uid == RUNNER[0]


def test_an_api_not_running_as_root_leaves_a_runners_area_as_it_is_and_says_so_once(shared_root: Path) -> None:
    (shared_root / "tenants").mkdir(mode=0o755)
    os.chown(shared_root / "tenants", *CONTROLLER_USER)  # the API's (controller_user's) own, as it made it
    area = shared_root / "tenants" / "acme"
    area.mkdir(mode=0o755)
    os.chown(area, *RUNNER)  # an older ffswarm's

    def api() -> int:
        with capture_logs() as logs:
            found = Area(shared_root, "acme")
            found.ensure(RUNNER)
            found.ensure(RUNNER)
        said = [e for e in logs if e["event"] == "api_area_runners"]
        return 0 if len(said) == 1 and said[0]["log_level"] == "warning" else 1

    assert as_uid(CONTROLLER_USER, api) == 0
    assert area.lstat().st_uid == RUNNER[0]
    assert (shared_root / "tenants" / ".jobs" / "acme").lstat().st_uid == CONTROLLER_USER[0]


def test_an_area_a_root_serve_makes_first_is_controller_users_so_the_api_can_add_uploads(shared_root: Path) -> None:
    """The stack's `serve` runs as root and its `api` as controller_user. When serve meets a tenant
    first (a JSON job's output folders), it makes the area as controller_user's, not root's: the API,
    not root, then adds ``uploads/`` (it answered 500 "cannot create folder" in the soak). An area an
    older root serve left as root's is handed over the same way."""
    access.make_folders(shared_root, ["tenants/acme/out/j1"], RUNNER, CONTROLLER_USER)  # serve, as root
    access.make_folders(shared_root, ["tenants/beta/out/j1"], RUNNER)  # an older serve: the area root's
    assert ids_and_mode(shared_root / "tenants" / "acme") == (*CONTROLLER_USER, 0o755)
    assert (shared_root / "tenants").lstat().st_uid == CONTROLLER_USER[0]
    assert (shared_root / "tenants" / "beta").lstat().st_uid == 0
    found = access.own_area(shared_root, "tenants/beta", RUNNER, CONTROLLER_USER)  # its next job, as root
    assert found is access.AreaTop.TAKEN_BACK
    assert ids_and_mode(shared_root / "tenants" / "beta") == (*CONTROLLER_USER, 0o755)
    assert (shared_root / "tenants" / "beta" / "out").lstat().st_uid == RUNNER[0]  # below the top: untouched

    def api() -> int:
        for tenant in ("acme", "beta"):
            area = Area(shared_root, tenant)
            area.ensure(RUNNER, CONTROLLER_USER)
            (area.path / "uploads").mkdir()  # what the API's upload staging does first
        return 0

    assert as_uid(CONTROLLER_USER, api) == 0
    for tenant in ("acme", "beta"):
        assert (shared_root / "tenants" / tenant / "uploads").lstat().st_uid == CONTROLLER_USER[0]
    assert access.own_area(shared_root, "tenants/acme", RUNNER, CONTROLLER_USER) is access.AreaTop.OURS
