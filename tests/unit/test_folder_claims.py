"""A job writing many outputs into one folder claims them there with one file (controller/job/claims.py):
it still never shares an output with another live job, whichever of the two claims first and whether
the other claims output by output or by folder, and it lets them all go at its end."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from controller.errors import JobFileError
from controller.job import claims

MANY = claims.FOLDER_AT + 4  # outputs in one folder: claimed by a folder claim


def _root(tmp_path: Path) -> Path:
    root = tmp_path / "data"
    (root / "runs").mkdir(parents=True)
    return root


def _outputs(folder: str, n: int = MANY, start: int = 0) -> list[str]:
    return [f"{folder}/p{i:03d}.jpg" for i in range(start, start + n)]


def _files(root: Path) -> dict[str, bytes]:
    base = root / "runs" / ".claims"
    return {str(p.relative_to(base)): p.read_bytes() for p in sorted(base.rglob("*")) if p.is_file()}


def _claim_files(root: Path) -> list[str]:
    return [name for name in _files(root) if not name.startswith("jobs/")]


def test_a_big_job_claims_a_folder_with_one_file_and_lets_every_output_go_at_its_end(tmp_path: Path) -> None:
    root = _root(tmp_path)
    outputs = _outputs("out", 1000)
    assert claims.claim(root, "big", outputs, "big.yaml") == 1000
    assert len(_claim_files(root)) == 1  # one file, not 1,000
    assert claims.claim(root, "big", outputs, "big.yaml") == 0  # its own: idempotent
    assert claims.holder_of(root, "out/p500.jpg") == "big"
    assert claims.holders(root, ["out/p001.jpg", "elsewhere/x.jpg"]) == {"out/p001.jpg": "big"}
    assert claims.conflict(root, "other", ["out/p999.jpg"]) == (["out/p999.jpg"], "big")
    assert claims.conflict(root, "other", ["out/p1000.jpg"]) is None  # another name in the same folder
    assert claims.release(root, "big") == 1000
    assert _claim_files(root) == []
    assert claims.holder_of(root, "out/p500.jpg") is None
    assert claims.claim(root, "next", ["out/p500.jpg"], "next.yaml") == 1


@pytest.mark.parametrize("second", ["small", "big"])
def test_an_output_a_big_job_claims_is_refused_to_a_later_job(tmp_path: Path, second: str) -> None:
    root = _root(tmp_path)
    claims.claim(root, "first", _outputs("out"), "first.yaml")
    before = _files(root)
    theirs = ["elsewhere/x.jpg", "out/p003.jpg"] if second == "small" else _outputs("out", MANY, start=MANY - 2)
    with pytest.raises(JobFileError) as e:
        claims.claim(root, "second", theirs, "second.yaml")
    assert e.value.field == "output" and "claimed by job first" in e.value.reason
    assert "out/p003.jpg" in e.value.reason if second == "small" else f"out/p{MANY - 1:03d}.jpg" in e.value.reason
    after = _files(root)
    assert {k: v for k, v in after.items() if not k.startswith("jobs/")} == {
        k: v for k, v in before.items() if not k.startswith("jobs/")
    }  # the second job's claims undone, the first's untouched


def test_a_big_job_is_refused_an_output_a_small_job_claimed_first(tmp_path: Path) -> None:
    root = _root(tmp_path)
    claims.claim(root, "small", ["out/p007.jpg"], "small.yaml")
    with pytest.raises(JobFileError, match="claimed by job small"):
        claims.claim(root, "big", _outputs("out"), "big.yaml")
    assert not [name for name in _claim_files(root) if name.startswith("dirs/")]  # its folder claim taken back
    assert claims.holder_of(root, "out/p008.jpg") is None
    claims.release(root, "small")
    assert claims.claim(root, "big", _outputs("out"), "big.yaml") == MANY


def test_two_big_jobs_share_a_folder_when_their_names_differ(tmp_path: Path) -> None:
    root = _root(tmp_path)
    assert claims.claim(root, "a", _outputs("out", MANY, 0), "a.yaml") == MANY
    assert claims.claim(root, "b", _outputs("out", MANY, MANY), "b.yaml") == MANY
    assert claims.holder_of(root, "out/p000.jpg") == "a" and claims.holder_of(root, f"out/p{MANY:03d}.jpg") == "b"
    # a job adding outputs to its own folder claim keeps the earlier ones (a re-plan, a pack made again)
    assert claims.claim(root, "a", _outputs("out", MANY, 3 * MANY), "a.yaml") == MANY
    assert claims.holder_of(root, "out/p001.jpg") == "a"


def test_a_refused_job_keeps_what_it_had_claimed_before(tmp_path: Path) -> None:
    root = _root(tmp_path)
    claims.claim(root, "a", _outputs("out", MANY, 0), "a.yaml")
    claims.claim(root, "b", ["out/p900.jpg"], "b.yaml")
    with pytest.raises(JobFileError, match="claimed by job b"):
        claims.claim(root, "a", _outputs("out", MANY, 890), "a.yaml")  # wants p900 too
    assert claims.holder_of(root, "out/p000.jpg") == "a"  # its first claim stands
    assert claims.holder_of(root, "out/p890.jpg") is None  # this call's new names taken back


def test_a_forged_folder_claim_naming_another_folder_binds_nothing(tmp_path: Path) -> None:
    root = _root(tmp_path)
    claims.claim(root, "a", _outputs("out"), "a.yaml")
    (path,) = [p for p in (root / "runs" / ".claims" / "dirs").rglob("*") if p.is_file()]
    record = json.loads(path.read_text())
    path.write_text(json.dumps({**record, "folder": "elsewhere"}))
    assert claims.conflict(root, "b", ["out/p001.jpg"]) is None
    assert claims.holder_of(root, "out/p001.jpg") is None
