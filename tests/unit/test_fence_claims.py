"""Outputs fenced at plan time and claimed cluster-wide (issue 16): real folders, real symlinks,
two jobs. Each refusal is exit 65 on the field ``output`` and leaves every other file as it was."""

from __future__ import annotations

import json
import os
import tempfile
import time
from pathlib import Path

import pytest

from controller.errors import JobFileError
from controller.job import claims
from controller.job.resolve import resolve_job
from controller.job.spec import JobSpec
from controller.volume import UnsafePath
from tests import builders


def _root(tmp_path: Path) -> Path:
    root = tmp_path / "data"
    for rel in ("faces/a.jpg", "alice/photos/p1.jpg", "alice/photos/p2.jpg"):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(b"jpeg " + rel.encode())
    (root / "runs" / "alicejob" / "segments").mkdir(parents=True)
    (root / "models" / "default").mkdir(parents=True)
    return root


def _spec(output: str, name: str = "j", **kw: object) -> JobSpec:
    return builders.job_spec(name=name, targets=("alice/photos/*.jpg",), output=output, **kw)


def _snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.mark.parametrize(
    ("output", "where"),
    [
        ("runs/alicejob/segments/{name}", "runs/alicejob/segments/p1.jpg"),
        ("models/default/{name}", "models/default/p1.jpg"),
        ("inbox/{name}", "inbox/p1.jpg"),
        ("tenants/acme/out/{name}", "tenants/acme/out/p1.jpg"),
    ],
)
def test_outputs_under_reserved_areas_are_refused(tmp_path: Path, output: str, where: str) -> None:
    root = _root(tmp_path)
    before = _snapshot(root)
    with pytest.raises(JobFileError) as e:
        resolve_job(_spec(output), root, "job.yaml")
    assert e.value.exit_code == 65 and e.value.field == "output" and where in e.value.reason
    assert str(root) not in str(e.value)  # paths relative to the data root
    assert _snapshot(root) == before


def test_a_symlinked_folder_into_runs_is_refused(tmp_path: Path) -> None:
    root = _root(tmp_path)
    (root / "out").symlink_to(root / "runs" / "alicejob" / "segments")
    with pytest.raises(JobFileError) as e:
        resolve_job(_spec("out/{name}"), root, "job.yaml")
    assert e.value.field == "output" and "runs/alicejob/segments/p1.jpg" in e.value.reason


def test_an_output_over_the_inputs_is_refused(tmp_path: Path) -> None:
    root = _root(tmp_path)
    before = _snapshot(root)
    with pytest.raises(JobFileError) as e:
        resolve_job(_spec("alice/photos/{name}", overwrite=True), root, "job.yaml")
    assert e.value.field == "output" and "alice/photos/p1.jpg, an input of this job" in e.value.reason
    assert _snapshot(root) == before


def test_existing_outputs_are_refused_unless_overwrite_is_true(tmp_path: Path) -> None:
    root = _root(tmp_path)
    (root / "out").mkdir()
    for n in (1, 2):
        (root / "out" / f"p{n}.jpg").write_bytes(b"bob's")
    with pytest.raises(JobFileError) as e:
        resolve_job(_spec("out/{name}"), root, "job.yaml")
    assert "2 output(s) already exist: out/p1.jpg, out/p2.jpg; set overwrite: true" in e.value.reason
    resolved = resolve_job(_spec("out/{name}", overwrite=True), root, "job.yaml")
    assert [t.output_rel for t in resolved.targets] == ["out/p1.jpg", "out/p2.jpg"]
    assert (root / "out" / "p1.jpg").read_bytes() == b"bob's"
    # the same job's own run continuing: its outputs exist because it wrote them
    (root / "runs" / "j").mkdir()
    (root / "runs" / "j" / "plan.json").write_text("{}")
    resolve_job(_spec("out/{name}"), root, "job.yaml")


def test_two_live_jobs_never_claim_one_output(tmp_path: Path) -> None:
    root = _root(tmp_path)
    first = resolve_job(_spec("out/{name}", name="first"), root, "first.yaml")
    outputs = [t.output_rel for t in first.targets]
    assert claims.claim(root, "first", outputs, "first.yaml") == 2
    assert claims.claim(root, "first", outputs, "first.yaml") == 0  # its own: idempotent
    with pytest.raises(JobFileError) as e:  # planning the second job
        resolve_job(_spec("out/{name}", name="second"), root, "second.yaml")
    assert e.value.field == "output" and "claimed by job first" in e.value.reason and "out/p1.jpg" in e.value.reason
    claims_before = _snapshot(root / "runs" / ".claims")
    with pytest.raises(JobFileError, match="claimed by job first"):  # two controllers racing past planning
        claims.claim(root, "second", ["elsewhere/x.jpg", *outputs], "second.yaml")
    after = _snapshot(root / "runs" / ".claims")
    assert {k: v for k, v in after.items() if "jobs/" not in k} == {
        k: v for k, v in claims_before.items() if "jobs/" not in k
    }  # its one new claim (elsewhere/x.jpg) undone, the first job's untouched
    # another job's outputs do not collide
    claims.claim(root, "third", ["other/p1.jpg"], "third.yaml")
    assert claims.release(root, "first") == 2
    assert claims.conflict(root, "second", outputs) is None
    assert claims.conflict(root, "second", ["other/p1.jpg"]) == (["other/p1.jpg"], "third")
    # a big job's outputs are looked up through the shard listings: the same answer
    many = [f"big/{n}.jpg" for n in range(claims.DIRECT + 5)]
    assert claims.conflict(root, "second", [*many, "other/p1.jpg"]) == (["other/p1.jpg"], "third")
    assert claims.conflict(root, "second", many) is None


@pytest.mark.parametrize("count", [1, claims.FOLDER_AT + 2], ids=["own claims", "a folder claim"])
def test_claims_of_an_ended_or_cancelled_job_are_taken_over(tmp_path: Path, count: int) -> None:
    root = _root(tmp_path)
    outputs = [f"out/p{n}.jpg" for n in range(1, count + 1)]
    claims.claim(root, "old", outputs, "old.yaml")
    run = root / "runs" / "old"
    run.mkdir()
    (run / "plan.json").write_text("{}")
    (run / "state.json").write_text(json.dumps({"stage": "chunks"}))
    assert claims.conflict(root, "new", ["out/p1.jpg"]) == (["out/p1.jpg"], "old")
    (run / "state.json").write_text(json.dumps({"stage": "ended"}))
    assert claims.conflict(root, "new", ["out/p1.jpg"]) is None
    assert claims.claim(root, "new", outputs, "new.yaml") == count
    claims.release(root, "old")  # the old job's release leaves the new holder's claims
    assert claims.conflict(root, "other", ["out/p1.jpg"]) == (["out/p1.jpg"], "new")


def test_an_orphan_claim_binds_only_for_a_while(tmp_path: Path) -> None:
    root = _root(tmp_path)
    claims.claim(root, "ghost", ["out/p1.jpg"], "ghost.yaml")  # no run folder ever appeared
    assert claims.conflict(root, "new", ["out/p1.jpg"]) is not None
    (claim,) = [p for p in (root / "runs" / ".claims").rglob("*") if p.is_file() and "jobs" not in p.parts]
    old = time.time() - claims.ORPHAN_SECONDS - 5
    os.utime(claim, (old, old))
    assert claims.conflict(root, "new", ["out/p1.jpg"]) is None


def test_a_planted_symlink_claim_folder_is_not_followed(tmp_path: Path) -> None:
    root = _root(tmp_path)
    outside = tmp_path / "outside"
    outside.mkdir()
    (root / "runs" / ".claims").mkdir()
    (root / "runs" / ".claims" / "jobs").symlink_to(outside)
    with pytest.raises(UnsafePath, match="runs/.claims/jobs is a symbolic link"):
        claims.claim(root, "j", ["out/p1.jpg"], "j.yaml")
    assert list(outside.iterdir()) == []


def _tenant_root(tmp_path: Path) -> Path:
    root = _root(tmp_path)
    for rel in ("tenants/acme/faces/me.jpg", "tenants/acme/in/p1.jpg", "tenants/globex/in/secret.jpg"):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(b"jpeg " + rel.encode())
    return root


def _tenant_spec(
    output: str, targets: str = "tenants/acme/in/*.jpg", source: str = "tenants/acme/faces/me.jpg"
) -> JobSpec:
    return JobSpec(name="j", source=(source,), targets=(targets,), output=output)


def test_a_tenants_job_writes_into_its_own_area_and_nowhere_else(tmp_path: Path) -> None:
    root = _tenant_root(tmp_path)
    ok = resolve_job(_tenant_spec("tenants/acme/out/{name}"), root, "job.yaml", tenant="acme")
    assert [t.output_rel for t in ok.targets] == ["tenants/acme/out/p1.jpg"]
    before = _snapshot(root)
    for output in ("tenants/globex/out/{name}", "out/{name}", "runs/alicejob/segments/{name}", "inbox/{name}"):
        with pytest.raises(JobFileError) as e:
            resolve_job(_tenant_spec(output), root, "job.yaml", tenant="acme")
        assert e.value.field == "output" and "outside the tenant's area tenants/acme/" in e.value.reason, output
    for output, said in (
        ("tenants/acme/{stem}-swapped{ext}", "at the top of"),
        ("tenants/acme/uploads/j/{name}", "under uploads/"),
    ):
        with pytest.raises(JobFileError) as e:  # the area's top and its uploads are the API's, never the runner's
            resolve_job(_tenant_spec(output), root, "job.yaml", tenant="acme")
        assert e.value.field == "output" and said in e.value.reason and "the API's" in e.value.reason, output
    (root / "tenants" / "acme" / "away").symlink_to(root / "tenants" / "globex" / "in")  # a link in its area
    with pytest.raises(JobFileError) as e:
        resolve_job(_tenant_spec("tenants/acme/away/{name}"), root, "job.yaml", tenant="acme")
    assert "tenants/globex/in/p1.jpg is outside the tenant's area" in e.value.reason
    assert _snapshot(root) == before


@pytest.mark.parametrize(
    ("source", "targets", "field"),
    [
        ("tenants/globex/in/secret.jpg", "tenants/acme/in/*.jpg", "source"),
        ("faces/a.jpg", "tenants/acme/in/*.jpg", "source"),
        ("tenants/acme/faces/me.jpg", "tenants/globex/in/*.jpg", "targets"),
        ("tenants/acme/faces/me.jpg", "tenants/acme/peek/*.jpg", "targets"),  # a symlink to globex's folder
    ],
)
def test_a_tenants_job_reads_only_its_own_area(tmp_path: Path, source: str, targets: str, field: str) -> None:
    root = _tenant_root(tmp_path)
    (root / "tenants" / "acme" / "peek").symlink_to(root / "tenants" / "globex" / "in")
    with pytest.raises(JobFileError) as e:
        resolve_job(_tenant_spec("tenants/acme/out/{name}", targets, source), root, "job.yaml", tenant="acme")
    assert e.value.field == field and "outside the tenant's area tenants/acme/" in e.value.reason
    assert str(root) not in str(e.value)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to make claims as one uid and release them as another")
def test_claims_made_by_a_root_serve_are_released_by_an_api_running_as_controller_user() -> None:
    """A deployed stack: `serve` (root) claims a job's outputs, the API (controller_user) deletes the
    job later; the claim folders belong to controller_user, so the API's release removes them and the
    output is free for the next job — also when the claims' folders were made earlier as root."""
    with tempfile.TemporaryDirectory(dir="/tmp") as top:  # pytest's tmp_path is root's alone: not reachable by 4321
        os.chmod(top, 0o755)
        _released_by_controller_user(_root(Path(top)))


def _released_by_controller_user(root: Path) -> None:
    ctl = (4321, 4321)
    claims.claim(root, "early", ["out/early.jpg"], "early.yaml")  # an older serve, no owner given
    many = [f"big/{n}.jpg" for n in range(claims.FOLDER_AT + 1)]  # claimed as a folder
    claims.claim(root, "early-big", [f"big/e{n}.jpg" for n in range(claims.FOLDER_AT + 1)], "early.yaml")
    assert claims.claim(root, "first", ["out/p1.jpg", "out/p2.jpg", *many], "first.yaml", ctl) == 2 + len(many)
    for folder in (root / "runs" / ".claims", root / "runs" / ".claims" / "jobs"):
        assert (folder.stat().st_uid, folder.stat().st_gid) == ctl, folder
    pid = os.fork()
    if pid == 0:  # the API, as controller_user
        code = 1
        try:
            os.setgid(ctl[1])
            os.setuid(ctl[0])
            code = 0 if claims.release(root, "first") == 2 + len(many) else 2
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, "controller_user could not release the job's claims"
    assert claims.holder_of(root, "out/p1.jpg") is None and claims.holder_of(root, "big/0.jpg") is None
    assert claims.claim(root, "second", ["out/p1.jpg", "big/0.jpg"], "second.yaml", ctl) == 2
