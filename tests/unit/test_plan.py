"""Planning: items and chunks, manifests that round-trip, run folder and job ids."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from contract.errors import ManifestError
from contract.manifest import FaceSelection, Manifest, NoFacePolicy
from controller.job.plan import ManifestSettings, Plan, TargetRef, chunk_manifests, make_plan
from controller.run.rundir import Control, RunDir, next_job_id


def targets(n: int) -> list[TargetRef]:
    return [TargetRef(input=f"crowd/p{i:02d}.jpg", output=f"out/p{i:02d}.jpg", kind="image") for i in range(n)]


def test_chunks_cover_every_item_once_in_order() -> None:
    plan = make_plan("h", targets(14), 5)
    assert [len(c.items) for c in plan.chunks] == [5, 5, 4]
    assert [c.id for c in plan.chunks] == ["c0000", "c0001", "c0002"]
    flat = [i for c in plan.chunks for i in c.items]
    assert flat == [i.id for i in plan.items] == [f"i{n:06d}" for n in range(14)]


def test_plan_json_round_trip() -> None:
    plan = make_plan("h", targets(3), 2)
    assert Plan.from_json(plan.to_json()) == plan


def test_zero_chunk_size_refused() -> None:
    with pytest.raises(ValueError):
        make_plan("h", targets(3), 0)


def ms() -> ManifestSettings:
    return ManifestSettings(
        pack="default",
        sources=("faces/a.jpg", "faces/b.jpg"),
        processors=("face_swapper",),
        providers=("cpu",),
        faces=FaceSelection.ONE,
        no_face=NoFacePolicy.SKIP,
    )


def test_manifests_use_container_paths_and_round_trip() -> None:
    plan = make_plan("h", targets(3), 2)
    manifests = chunk_manifests(plan, ms())
    m = manifests["c0001"]
    assert m.items[0].input == "/data/crowd/p02.jpg" and m.items[0].output == "/data/out/p02.jpg"
    assert m.source == ("/data/faces/a.jpg", "/data/faces/b.jpg")
    assert m.pack_dir == "/data/models/default" and m.run_dir == "/data/runs/h"
    assert m.results_path(2) == "/data/runs/h/results/c0001.a2.jsonl"
    assert Manifest.from_json(m.to_json()) == m


@pytest.mark.parametrize(
    "mutate, match",
    [
        (lambda d: d.update(schema=3), "unknown manifest schema version 3"),
        (lambda d: d.update(schema=2), "schema version 2 needs an identity table"),
        (lambda d: d.pop("schema"), "unknown manifest schema version None"),
        (lambda d: d["items"][0].update(input="/etc/passwd"), "not a path under /data"),
        (lambda d: d["items"][0].update(output="/data/../etc/x"), "not normalised"),
        (lambda d: d.update(processors=["rm -rf"]), "unknown processor"),
        (lambda d: d.pop("job"), "malformed manifest"),
        (lambda d: d.update(identity="/etc/identity.json"), "not a path under /data"),
        (lambda d: d.update(identity=7), "field .identity. must be a non-empty string"),
        (lambda d: d.update(identity="/data/runs/h/identity.json", identity_timeout=0), "identity_timeout"),
        (lambda d: d.update(faces="reference"), "faces: reference needs reference_embedding or identity"),
    ],
)
def test_bad_manifests_refused(mutate, match) -> None:  # type: ignore[no-untyped-def]
    import json

    data = json.loads(chunk_manifests(make_plan("h", targets(1), 1), ms())["c0000"].to_json())
    mutate(data)
    with pytest.raises(ManifestError, match=match):
        Manifest.from_dict(data)


def test_run_folder_layout_and_atomic_files(tmp_path: Path) -> None:
    plan = make_plan("h", targets(3), 2)
    rd = RunDir(tmp_path, "h")
    rd.create(b"name: h\n", plan, chunk_manifests(plan, ms()), Control(2), "sha256:x")
    names = sorted(str(p.relative_to(rd.path)) for p in rd.path.rglob("*"))
    assert names == [
        "attempts",  # the runner folders, made by the controller: the folder's top is not the runner's (issue 16)
        "chunks",
        "chunks/c0000.json",
        "chunks/c0001.json",
        "control.json",
        "identity",
        "image.json",
        "job.sha256",  # the job file's identity (issue 15)
        "job.yaml",
        "logs",
        "plan.json",
        "results",
        "segments",
    ]
    assert rd.plan() == plan and rd.control() == Control(2) and rd.image() == "sha256:x"
    assert rd.manifest("c0000").chunk == "c0000"


def test_job_ids_with_new(tmp_path: Path) -> None:
    assert next_job_id(tmp_path, "h", new=True) == "h"
    (tmp_path / "runs" / "h").mkdir(parents=True)
    assert next_job_id(tmp_path, "h", new=False) == "h"
    assert next_job_id(tmp_path, "h", new=True) == "h-2"
    (tmp_path / "runs" / "h-2").mkdir()
    assert next_job_id(tmp_path, "h", new=True) == "h-3"


def test_identity_from_submit_reaches_every_manifest() -> None:
    settings = dataclasses.replace(
        ms(),
        faces=FaceSelection.REFERENCE,
        source_embedding=(0.6, 0.8),
        reference_embedding=(1.0, 0.0),
        reference_distance=0.4,
    )
    for m in chunk_manifests(make_plan("h", targets(3), 2), settings).values():
        assert m.source_embedding == (0.6, 0.8) and m.reference_embedding == (1.0, 0.0)
        assert m.reference_distance == 0.4
        assert Manifest.from_json(m.to_json()) == m


def test_pending_identity_is_named_in_every_manifest() -> None:
    """A new job's identity is computed beside its first chunks: manifests name identity.json and how
    long to wait for it (faces: reference included: its reference embedding comes from there too)."""
    settings = dataclasses.replace(ms(), faces=FaceSelection.REFERENCE, identity_timeout=420.0)
    for m in chunk_manifests(make_plan("h", targets(3), 2), settings).values():
        assert m.identity == "/data/runs/h/identity/identity.json" and m.identity_timeout == 420.0
        assert m.source_embedding is None and m.reference_embedding is None
        assert Manifest.from_json(m.to_json()) == m
    without = chunk_manifests(make_plan("h", targets(1), 1), ms())["c0000"]
    assert without.identity is None and "identity" not in without.to_json()  # older runners read it unchanged


def test_job_tuning_reaches_every_manifest() -> None:
    settings = dataclasses.replace(
        ms(), detector_threshold=0.3, detector_size=320, mask_feather=0.0, mask_padding=0.2, enhancer_blend=0.5
    )
    for m in chunk_manifests(make_plan("h", targets(3), 2), settings).values():
        assert (m.detector_threshold, m.detector_size) == (0.3, 320)
        assert (m.mask_feather, m.mask_padding, m.enhancer_blend) == (0.0, 0.2, 0.5)
        assert Manifest.from_json(m.to_json()) == m


def test_auto_chunk_size_is_one_wave_over_the_slots_capped() -> None:
    from controller.job.plan import AUTO_MAX_CHUNK, auto_chunk_size

    assert auto_chunk_size(1000, 2) == 500
    assert auto_chunk_size(1001, 2) == 501
    assert auto_chunk_size(3, 8) == 1
    assert auto_chunk_size(100_000, 4) == AUTO_MAX_CHUNK  # 25 waves of 4 chunks
    assert auto_chunk_size(5000, 2) == 834  # 3 full waves of 2, not 5 chunks leaving a slot idle
    assert auto_chunk_size(10, 0) == 10
