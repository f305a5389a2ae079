"""Identity once at submit (``python -m runner_image identity``) and ``faces: reference``, end to end
in-process with the stand-in pack; plus the manifest/IdentityRequest/IdentityResult contract."""

from __future__ import annotations

import json
from pathlib import Path

import cv2
import numpy as np
import pytest

from contract.errors import ManifestError
from contract.identity import IdentityRequest, IdentityResult, SourceFaces
from contract.manifest import FaceSelection, Manifest, NoFacePolicy
from contract.results import ItemStatus
from runner_image.__main__ import main
from tests.builders import manifest as _manifest
from tests.fixtures import photos
from tests.unit.test_runner_chunk import (
    JOB,
    RUN,
    by_input,
    changed,
    only_near,
    pixels,
    results,
    run,
    write_manifest,
)

REQUEST = f"{RUN}/identity-request.json"
OUTPUT = f"{RUN}/identity.json"
T1_FIRST = photos.T1_FACES[0]
STRICT = 0.25  # the stand-in recogniser (tests/fixtures/standin_pack.py) is no ArcFace: other faces sit from ~0.4


def identity(root: Path, sources: tuple[str, ...], reference: str | None = None) -> tuple[int, IdentityResult | None]:
    req = IdentityRequest(
        job=JOB,
        pack_dir="/data/models/default",
        sources=sources,
        output=OUTPUT,
        providers=("cpu",),
        reference=reference,
    )
    path = root / "runs" / JOB / "identity-request.json"
    path.write_text(req.to_json())
    code = main(["identity", "--request", REQUEST, "--data-root", str(root)], env={})
    out = root / "runs" / JOB / "identity.json"
    return code, IdentityResult.from_json(out.read_text()) if out.exists() else None


@pytest.fixture
def refdata(data: Path) -> Path:
    """data + the first t1 face alone (the reference) and a mirrored t1 (the same people, moved)."""
    photos.face_photos(data / "in", 2)  # face_01.jpg: t1's first face, cropped
    t1 = cv2.imread(str(data / "in/t1.jpg"))
    cv2.imwrite(str(data / "in/t1_mirror.jpg"), np.ascontiguousarray(t1[:, ::-1]), [cv2.IMWRITE_JPEG_QUALITY, 95])
    return data


def test_identity_writes_averaged_embedding_and_reference(refdata: Path) -> None:
    code, one = identity(refdata, ("/data/in/source.jpg",))
    assert code == 0 and one is not None and one.error is None
    assert np.isclose(np.linalg.norm(one.source_embedding), 1.0, atol=1e-5)
    assert one.reference_embedding is None and one.provider == "cpu"
    assert one.sources == (SourceFaces("/data/in/source.jpg", 1),)

    code, two = identity(refdata, ("/data/in/source.jpg", "/data/in/face_02.jpg"), reference="/data/in/face_01.jpg")
    assert code == 0 and two is not None and two.reference_embedding is not None
    assert len(two.source_embedding) == len(two.reference_embedding) == 512
    assert not np.allclose(one.source_embedding, two.source_embedding, atol=1e-3)
    assert (refdata / "runs" / JOB / "logs" / "identity.log").is_file()


@pytest.mark.parametrize(
    ("source", "message"),
    [
        ("no_face.jpg", "source photo in/no_face.jpg: no face detected"),
        ("t1.jpg", "source photo in/t1.jpg: 6 faces found"),
        ("broken.jpg", "source photo in/broken.jpg: not an image"),
        ("gone.jpg", "source photo in/gone.jpg: file not found"),
    ],
)
def test_bad_source_photo_is_an_error_naming_the_file(data: Path, source: str, message: str) -> None:
    code, result = identity(data, ("/data/in/source.jpg", f"/data/in/{source}"))
    assert code == 66 and result is not None
    assert result.error is not None and message in result.error
    assert result.source_embedding == ()


def test_identity_bad_request_exits_65_and_missing_one_66(data: Path) -> None:
    (data / "runs" / JOB / "identity-request.json").write_text('{"schema": 1, "job": "j"}')
    assert main(["identity", "--request", REQUEST, "--data-root", str(data)], env={}) == 65
    (data / "runs" / JOB / "identity-request.json").unlink()
    assert main(["identity", "--request", REQUEST, "--data-root", str(data)], env={}) == 66


def test_identity_honours_the_data_root_env(data: Path) -> None:
    req = IdentityRequest(job=JOB, pack_dir="/data/models/default", sources=("/data/in/source.jpg",), output=OUTPUT)
    (data / "runs" / JOB / "identity-request.json").write_text(json.dumps(json.loads(req.to_json())))
    env = {"FFSWARM_DATA_ROOT": str(data)}
    assert main(["identity", "--request", REQUEST], env=env) == 0  # providers default: cuda, cpu


def test_manifest_embedding_is_used_without_reading_sources(data: Path) -> None:
    _, ident = identity(data, ("/data/in/source.jpg",))
    assert ident is not None
    (data / "in/source.jpg").unlink()  # the chunk must not need it any more
    manifest = write_manifest(data, ["astronaut.jpg"], source_embedding=ident.source_embedding)
    assert run(data, manifest) == 0
    assert results(data)[0].status is ItemStatus.OK


def test_averaged_sources_differ_from_a_single_source(data: Path) -> None:
    assert run(data, write_manifest(data, ["astronaut.jpg"], chunk="c0001")) == 0
    single = pixels(data / "out/astronaut.png")
    two = ("/data/in/source.jpg", "/data/in/face_02.jpg")
    assert run(data, write_manifest(data, ["astronaut.jpg"], chunk="c0002", source=two, overwrite=True)) == 0
    averaged = pixels(data / "out/astronaut.png")
    x1, y1, x2, y2 = photos.ASTRONAUT_FACE
    assert np.abs(single - averaged)[y1:y2, x1:x2].mean() > 1


def _mirror(box: tuple[int, int, int, int], width: int) -> tuple[int, int, int, int]:
    x1, y1, x2, y2 = box
    return width - x2, y1, width - x1, y2


def test_reference_selects_the_same_person_across_two_chunks_and_nothing_else(refdata: Path) -> None:
    code, ident = identity(refdata, ("/data/in/source.jpg",), reference="/data/in/face_01.jpg")
    assert code == 0 and ident is not None and ident.reference_embedding is not None
    common = {
        "faces": FaceSelection.REFERENCE,
        "source_embedding": ident.source_embedding,
        "reference_embedding": ident.reference_embedding,
        "reference_distance": STRICT,
    }
    assert run(refdata, write_manifest(refdata, ["t1.jpg"], chunk="c0001", **common)) == 0
    assert run(refdata, write_manifest(refdata, ["t1_mirror.jpg"], chunk="c0002", **common)) == 0
    assert [r.faces for r in results(refdata, "c0001") + results(refdata, "c0002")] == [1, 1]

    mask = changed(pixels(refdata / "in/t1.jpg"), pixels(refdata / "out/t1.png"))
    assert mask[T1_FIRST[1] : T1_FIRST[3], T1_FIRST[0] : T1_FIRST[2]].mean() > 0.3
    assert only_near(mask, [T1_FIRST], by=0.8)

    mirrored = pixels(refdata / "in/t1_mirror.jpg")
    mask = changed(mirrored, pixels(refdata / "out/t1_mirror.png"))
    box = _mirror(T1_FIRST, mirrored.shape[1])
    assert mask[box[1] : box[3], box[0] : box[2]].mean() > 0.3
    assert only_near(mask, [box], by=0.8)


def test_reference_matching_nobody_follows_the_no_face_policy(refdata: Path) -> None:
    code, ident = identity(refdata, ("/data/in/source.jpg",), reference="/data/in/face_01.jpg")
    assert code == 0 and ident is not None
    manifest = write_manifest(
        refdata,
        ["astronaut.jpg"],
        faces=FaceSelection.REFERENCE,
        reference_embedding=ident.reference_embedding,
        reference_distance=0.01,
        no_face=NoFacePolicy.FAIL,
    )
    assert run(refdata, manifest) == 3
    r = by_input(results(refdata))["astronaut.jpg"]
    assert r.status is ItemStatus.ERROR and r.reason == "in/astronaut.jpg: no face matches the reference"


# --- the contract ------------------------------------------------------------------------------------


def test_new_manifest_fields_round_trip_and_stay_out_at_defaults() -> None:
    plain = _manifest()
    assert "source_embedding" not in plain.to_json() and "mask_feather" not in plain.to_json()
    tuned = _manifest(
        faces=FaceSelection.REFERENCE,
        source_embedding=(0.6, 0.8),
        reference_embedding=(1.0, 0.0),
        reference_distance=0.4,
        detector_threshold=0.3,
        detector_size=320,
        mask_feather=0.1,
        mask_padding=0.0,
        enhancer_blend=0.5,
    )
    assert Manifest.from_json(tuned.to_json()) == tuned


def test_old_manifest_without_new_fields_still_reads() -> None:
    data = json.loads(_manifest().to_json())
    assert Manifest.from_dict(data).reference_distance == 0.6


@pytest.mark.parametrize(
    ("changes", "match"),
    [
        ({"faces": FaceSelection.REFERENCE}, "faces: reference needs reference_embedding"),
        ({"source_embedding": (1.0,), "reference_embedding": (1.0, 0.0)}, "differ in length"),
        ({"source_embedding": ()}, "non-empty"),
        ({"detector_size": 100}, "multiple of 32"),
        ({"mask_feather": 0.9}, r"mask_feather must be in \[0, 0.5\]"),
        ({"enhancer_blend": -0.1}, "enhancer_blend"),
        ({"reference_distance": 3.0}, "reference_distance"),
    ],
)
def test_bad_tuning_is_a_bad_manifest(changes: dict[str, object], match: str) -> None:
    with pytest.raises(ManifestError, match=match):
        _manifest(**changes)


def test_bad_embedding_in_json_is_a_bad_manifest() -> None:
    data = json.loads(_manifest().to_json())
    data["source_embedding"] = ["x"]
    with pytest.raises(ManifestError, match="source_embedding must be a finite number"):
        Manifest.from_dict(data)


def test_identity_request_and_result_round_trip() -> None:
    sources = ("/data/a.jpg", "/data/b.jpg")
    req = IdentityRequest(job="j", pack_dir="/data/models/p", sources=sources, output=OUTPUT, reference="/data/r.jpg")
    assert IdentityRequest.from_json(req.to_json()) == req
    res = IdentityResult(source_embedding=(1.0,), reference_embedding=None, sources=(SourceFaces("/data/a.jpg", 1),))
    assert IdentityResult.from_json(res.to_json()) == res
    with pytest.raises(ManifestError, match="not a path under /data"):
        IdentityRequest(job="j", pack_dir="/data/m", sources=("a.jpg",), output=OUTPUT)
    with pytest.raises(ManifestError, match="malformed identity result"):
        IdentityResult.from_json("[1]")
