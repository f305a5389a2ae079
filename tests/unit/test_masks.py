"""Mask types (job file ``mask: {types, regions}``, contract/masks.py, runner_image/masks.py): the job
file's refusals, the occlusion and region masks through real chunks on the stand-in occluder and face
parser (tests/fixtures/standin_masks.py: the occluder hides what is green, the parser calls red
"mouth" and blue "nose"), the pack check that wants each model only from a job that lists its type,
the manifest's fields and the models' contracts."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import onnxruntime as ort
import pytest
import yaml

from contract import pack, processors
from contract.errors import ManifestError, PackError
from contract.manifest import FaceSelection, Manifest, NoFacePolicy
from contract.masks import REGIONS, Masks
from contract.results import ItemStatus
from controller.config import parse_config
from controller.errors import JobFileError, MissingInputError
from controller.job.files import parse_job_text
from controller.job.plan import ManifestSettings, TargetRef, chunk_manifests, make_plan
from controller.job.settings import MaskSettings
from controller.run.jobs import prepare
from runner_image import masks
from runner_image.errors import MissingInput
from tests import builders
from tests.fixtures import photos
from tests.fixtures.standin_masks import OCCLUDER_FILE, PARSER_FILE, face_parser_model, occluder_model
from tests.fixtures.standin_pack import build_pack, recognizer_model
from tests.unit.test_runner_chunk import JOB, results, run, write_manifest
from tests.unit.test_selector import manifest

# ------------------------------------------------------------------------------------------ job file

JOB_TEXT = "name: j\nsource: faces/star.jpg\ntargets: [crowd/*.jpg]\noutput: out/{stem}{ext}\n"


def spec_with(mask_yaml: str) -> Any:
    return parse_job_text(JOB_TEXT + f"mask: {mask_yaml}\n", "job.yaml")


def test_the_default_mask_is_the_box_and_types_and_regions_are_read() -> None:
    plain = parse_job_text(JOB_TEXT, "job.yaml").mask
    assert plain == MaskSettings(0.05, 0.1, ("box",), REGIONS)
    full = spec_with("{types: [box, occlusion, region], regions: [skin, nose, mouth], feather: 0.02}").mask
    assert (full.types, full.regions, full.feather, full.padding) == (
        ("box", "occlusion", "region"), ("skin", "nose", "mouth"), 0.02, 0.1,
    )  # fmt: skip
    assert set(REGIONS) == {
        "skin", "left-eyebrow", "right-eyebrow", "left-eye", "right-eye", "glasses", "nose", "mouth", "upper-lip",
        "lower-lip",
    }  # fmt: skip


@pytest.mark.parametrize(
    ("value", "field", "words"),
    [
        ("{types: [box, oval]}", "mask.types[1]", "unknown mask type 'oval' (choose from box, occlusion, region)"),
        ("{types: [occlusion, occlusion]}", "mask.types[1]", "'occlusion' is listed twice"),
        ("{types: []}", "mask.types", "must be a non-empty list of mask types (box, occlusion, region)"),
        ("{types: box}", "mask.types", "must be a non-empty list of mask types"),
        ("{types: [1]}", "mask.types[0]", "unknown mask type int"),
        ("{regions: [mouth, teeth]}", "mask.regions[1]", "unknown region 'teeth' (choose from skin, left-eyebrow"),
        ("{regions: []}", "mask.regions", "must be a non-empty list of regions"),
        ("{type: [box]}", "mask.type", "types"),
    ],
)
def test_job_file_refusals_name_the_field_and_the_choices(value: str, field: str, words: str) -> None:
    with pytest.raises(JobFileError) as e:
        spec_with(value)
    assert e.value.field == field and words in e.value.reason, str(e.value)
    assert e.value.exit_code == 65


# ------------------------------------------------------------------------------ through real chunks

GREEN = (115, 145, 195, 225)  # y0, y1, x0, x1: over the astronaut's left cheek
RED = (148, 166, 208, 244)  # over her mouth


@pytest.fixture(scope="module")
def assets(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp("masks")
    build_pack(base / "models" / "default")
    photos.astronaut(base / "in")
    photos.face_photos(base / "in", 2)
    shutil.copyfile(base / "in" / "face_01.jpg", base / "in" / "source.jpg")
    image = cv2.imread(str(base / "in" / "astronaut.jpg"))
    for name, (y0, y1, x0, x1), bgr in (("green.png", GREEN, (40, 200, 40)), ("red.png", RED, (40, 40, 210))):
        patched = image.copy()
        patched[y0:y1, x0:x1] = bgr
        cv2.imwrite(str(base / "in" / name), patched)
    return base


@pytest.fixture
def data(tmp_path: Path, assets: Path) -> Path:
    root = tmp_path / "data"
    shutil.copytree(assets, root)
    (root / "runs" / JOB / "chunks").mkdir(parents=True)
    return root


def swapped(root: Path, name: str, **kw: Any) -> np.ndarray:
    """The output of one chunk swapping ``name`` (its results cleared afterwards for the next run)."""
    assert run(root, write_manifest(root, [name], **kw)) == 0
    (line,) = results(root)
    assert line.status is ItemStatus.OK and line.faces == 1
    out = root / "out" / name
    image = cv2.imread(str(out)).astype(int)
    for f in [*(root / "runs" / JOB / "results").iterdir(), *(root / "runs" / JOB).glob("commits*/*"), out]:
        f.unlink()
    return image


def inside(patch: tuple[int, int, int, int], shape: tuple[int, ...], grow: int) -> np.ndarray:
    y0, y1, x0, x1 = patch
    where = np.zeros(shape[:2], bool)
    where[max(0, y0 - grow) : y1 + grow, max(0, x0 - grow) : x1 + grow] = True
    return where


def test_occlusion_keeps_the_targets_pixels_under_a_green_patch_and_swaps_the_rest(data: Path) -> None:
    before = cv2.imread(str(data / "in" / "green.png")).astype(int)
    box = swapped(data, "green.png")
    occluded = swapped(data, "green.png", mask_types=("box", "occlusion"))
    y0, y1, x0, x1 = GREEN
    centre = (slice(y0 + 4, y1 - 4), slice(x0 + 4, x1 - 4))
    assert np.abs(box - before)[centre].max() > 20  # the box alone swaps over the patch
    assert np.array_equal(occluded[centre], before[centre])  # the occluded part stays the target's
    far = ~inside(GREEN, before.shape, 20)  # beyond the occlusion mask's soft edge
    assert (np.abs(occluded - before).max(axis=2)[far] > 0).sum() > 10_000  # the rest of the face changed
    assert np.abs(occluded - box).max(axis=2)[far].max() <= 1  # … exactly as the box alone swaps it


def test_region_mouth_changes_only_the_red_mouth(data: Path) -> None:
    before = cv2.imread(str(data / "in" / "red.png")).astype(int)
    mouth = swapped(data, "red.png", mask_types=("region",), mask_regions=("mouth",))
    changed = np.abs(mouth - before).max(axis=2) > 0
    y0, y1, x0, x1 = RED
    assert changed[y0 + 6 : y1 - 6, x0 + 6 : x1 - 6].all()  # the mouth swapped …
    assert not (changed & ~inside(RED, before.shape, 2)).any()  # … and nothing else
    nose = swapped(data, "red.png", mask_types=("box", "region"), mask_regions=("nose",))
    assert np.array_equal(nose, before)  # the photo has no blue "nose": nothing changes
    skin = swapped(data, "red.png", mask_types=("region",), mask_regions=("skin", "mouth"))
    assert (np.abs(skin - before).max(axis=2) > 0).sum() > 10 * changed.sum()  # the whole face


def test_the_face_enhancer_pastes_back_through_the_same_masks(data: Path) -> None:
    before = cv2.imread(str(data / "in" / "green.png")).astype(int)
    kw: dict[str, Any] = {"processors": ("face_enhancer",)}
    plain = swapped(data, "green.png", **kw)
    occluded = swapped(data, "green.png", mask_types=("box", "occlusion"), **kw)
    y0, y1, x0, x1 = GREEN
    centre = (slice(y0 + 4, y1 - 4), slice(x0 + 4, x1 - 4))
    assert np.abs(plain - before)[centre].max() > 0
    assert np.array_equal(occluded[centre], before[centre])
    assert (np.abs(occluded - before).max(axis=2) > 0).sum() > 5_000


def test_without_the_box_the_occlusion_mask_alone_bounds_the_paste(data: Path) -> None:
    before = cv2.imread(str(data / "in" / "green.png")).astype(int)
    alone = swapped(data, "green.png", mask_types=("occlusion",))
    boxed = swapped(data, "green.png", mask_types=("box", "occlusion"))
    changed_alone = np.abs(alone - before).max(axis=2) > 0
    changed_boxed = np.abs(boxed - before).max(axis=2) > 0
    assert changed_alone.sum() > changed_boxed.sum()  # no erosion: up to the crop's edge
    y0, y1, x0, x1 = GREEN
    assert np.array_equal(alone[y0 + 4 : y1 - 4, x0 + 4 : x1 - 4], before[y0 + 4 : y1 - 4, x0 + 4 : x1 - 4])


# --------------------------------------------------------------------------------------- pack checks

BASE = {"det_10g.onnx": "detector", "w600k_r50.onnx": "recognizer", "inswapper_128.onnx": "swapper"}


def test_the_mask_models_are_needed_only_for_their_types() -> None:
    assert processors.roles(["face_swapper"]) == processors.roles(["face_swapper"], masks=["box"])
    assert processors.roles(["face_swapper"], masks=["box", "occlusion"])[-1] == "occluder"
    assert processors.roles(["face_swapper"], masks=["region"])[-1] == "face_parser"
    both = processors.roles(["face_swapper", "face_enhancer"], masks=["region", "occlusion"])
    assert both[-2:] == ("face_parser", "occluder")
    assert "occluder" not in processors.roles(["frame_enhancer"], masks=["occlusion"])  # pastes nothing back
    spec = {"files": {n: {"role": r, "sha256": "0" * 64} for n, r in BASE.items()}}
    pack.missing_roles(Path("p"), spec, ["face_swapper"], masks=["box"])
    for types, role, words in (
        (["box", "occlusion"], "occluder", ["mask.types: occlusion", "xseg", "FaceFusion's models release"]),
        (["region"], "face_parser", ["mask.types: region", "bisenet", "MIT"]),
    ):
        with pytest.raises(PackError) as e:
            pack.missing_roles(Path("p"), spec, ["face_swapper"], masks=types)
        assert f"role {role}" in str(e.value) and all(w in str(e.value) for w in words), str(e.value)
    files = {**spec["files"], OCCLUDER_FILE: {"role": "occluder", "sha256": "0" * 64}}
    refused = pack.not_commercial({"files": files}, ["face_swapper"], masks=["occlusion"])
    assert [r for r, _, _ in refused][-1] == "occluder"
    assert "occluder" not in [r for r, _, _ in pack.not_commercial({"files": files}, ["face_swapper"])]


def submit_root(tmp_path: Path, extra: dict[str, str]) -> Path:
    files = {n: {"role": r, "sha256": "0" * 64} for n, r in {**BASE, **extra}.items()}
    return builders.data_root(tmp_path, files)


def test_submit_refuses_a_mask_type_whose_model_the_pack_lacks(tmp_path: Path) -> None:
    config = parse_config(tmp_path / "ffswarm.yaml", {"data_root": str(submit_root(tmp_path, {}))})
    jobs = {}
    for name, mask in (("a", "{feather: 0.1}"), ("b", "{types: [box, occlusion]}"), ("c", "{types: [region]}")):
        jobs[name] = tmp_path / f"{name}.yaml"
        jobs[name].write_text(JOB_TEXT.replace("name: j", f"name: {name}") + f"mask: {mask}\n")
    assert len(prepare(config, [jobs["a"]], new=False)) == 1  # the box needs no model
    for name, role in (("b", "occluder"), ("c", "face_parser")):
        with pytest.raises(MissingInputError) as e:
            prepare(config, [jobs[name]], new=False)
        assert f"{name}.yaml: models:" in str(e.value) and f"role {role}" in str(e.value)
        assert e.value.exit_code == 66
    full = submit_root(tmp_path / "ok", {OCCLUDER_FILE: "occluder", PARSER_FILE: "face_parser"})
    config = parse_config(tmp_path / "ffswarm.yaml", {"data_root": str(full)})
    (prepared,) = prepare(config, [jobs["b"]], new=False)
    assert prepared.spec.mask.types == ("box", "occlusion")


def drop(root: Path, name: str) -> None:
    spec_path = root / "models" / "default" / "pack.yaml"
    spec = yaml.safe_load(spec_path.read_text())
    del spec["files"][name]
    spec_path.write_text(yaml.safe_dump(spec))
    (root / "models" / "default" / name).unlink()


def test_a_runner_loads_the_mask_models_only_when_asked(data: Path) -> None:
    drop(data, OCCLUDER_FILE)
    drop(data, PARSER_FILE)
    swapped(data, "green.png")  # the box alone: neither file needed
    assert run(data, write_manifest(data, ["green.png"], mask_types=("box", "occlusion"))) == 66


@pytest.mark.parametrize(("role", "name"), [("occluder", OCCLUDER_FILE), ("face_parser", PARSER_FILE)])
def test_a_mask_model_of_another_shape_is_refused_naming_its_role(
    data: Path, role: str, name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    path = data / "models" / "default" / name
    path.write_bytes(recognizer_model().SerializeToString())
    spec_path = data / "models" / "default" / "pack.yaml"
    spec = yaml.safe_load(spec_path.read_text())
    spec["files"][name]["sha256"] = hashlib.sha256(path.read_bytes()).hexdigest()
    spec_path.write_text(yaml.safe_dump(spec))
    kind = "occlusion" if role == "occluder" else "region"
    assert run(data, write_manifest(data, ["green.png"], mask_types=("box", kind))) == 66
    err = capsys.readouterr()
    assert f"{name} (role {role})" in err.out + err.err
    assert results(data) == []  # refused before any item


def test_the_model_contracts_are_checked_by_shape() -> None:
    cpu = ["CPUExecutionProvider"]
    occluder = ort.InferenceSession(occluder_model().SerializeToString(), providers=cpu)
    parser = ort.InferenceSession(face_parser_model().SerializeToString(), providers=cpu)
    masks.Occluder(occluder)
    masks.FaceParser(parser)
    with pytest.raises(MissingInput, match=r"not an occluder model \(wanted one float input \[1, 256, 256, 3\]"):
        masks.Occluder(parser)
    with pytest.raises(MissingInput, match=r"not a face parser model .*\[1, 19, 512, 512\]"):
        masks.FaceParser(occluder)
    small = ort.InferenceSession(occluder_model(side=128).SerializeToString(), providers=cpu)
    with pytest.raises(MissingInput, match="not an occluder model"):
        masks.Occluder(small)
    with pytest.raises(MissingInput, match="not a face parser model"):
        masks.FaceParser(ort.InferenceSession(face_parser_model(classes=18).SerializeToString(), providers=cpu))


# -------------------------------------------------------------------------------------------- manifest


def test_the_manifest_round_trips_the_masks_and_leaves_defaults_out() -> None:
    plain = manifest()
    assert "mask_types" not in plain.to_json() and "mask_regions" not in plain.to_json()  # as older runners know
    old = json.loads(plain.to_json())
    assert (Manifest.from_dict(old).mask_types, Manifest.from_dict(old).mask_regions) == (("box",), REGIONS)
    m = manifest(mask_types=["box", "region"], mask_regions=["mouth", "nose"])
    assert (m.mask_types, m.mask_regions) == (("box", "region"), ("mouth", "nose"))
    back = Manifest.from_json(m.to_json())
    assert back == m and '"mask_types": ["box", "region"]' in m.to_json()


@pytest.mark.parametrize(
    ("kw", "words"),
    [
        ({"mask_types": ("oval",)}, "mask_types[0] unknown mask type 'oval'"),
        ({"mask_types": ()}, "mask_types must be a non-empty list"),
        ({"mask_regions": ("skin", "ears")}, "mask_regions[1] unknown region 'ears'"),
    ],
)
def test_the_manifest_refuses_bad_mask_values(kw: dict[str, Any], words: str) -> None:
    with pytest.raises(ManifestError) as e:
        manifest(**kw)
    assert words in str(e.value)


def test_a_manifest_file_with_a_mistyped_mask_field_is_refused_naming_it() -> None:
    data = json.loads(manifest().to_json())
    data["mask_types"] = "box"
    with pytest.raises(ManifestError, match="mask_types must be a list"):
        Manifest.from_dict(data)


def test_every_chunk_manifest_carries_the_jobs_masks() -> None:
    plan = make_plan("j", [TargetRef(f"in/{n}.jpg", f"out/{n}.jpg", "image") for n in range(3)], 2)
    settings = ManifestSettings(
        "default", ("s.jpg",), ("face_swapper",), ("cpu",), FaceSelection.MANY, NoFacePolicy.COPY,
        masks=Masks(("occlusion", "region"), ("mouth",)),
    )  # fmt: skip
    for m in chunk_manifests(plan, settings).values():
        assert (m.mask_types, m.mask_regions) == (("occlusion", "region"), ("mouth",))
