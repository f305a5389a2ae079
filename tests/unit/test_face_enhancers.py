"""Face enhancer models (issue 20): ``face_enhancer: {model, blend, weight}`` in the job file, the
manifest's ``enhancer_model``/``enhancer_weight``, the runner's call built from the model's own inputs
(GFPGAN-style, or CodeFormer's extra ``weight``), and the submit-time check of ``face_enhancer.model``
against the pack's ``model:`` — with stand-in models made by code (tests/fixtures/standin_enhancers.py)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import cv2
import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from contract.errors import ManifestError
from contract.manifest import Manifest
from contract.pack import check_spec, wrong_model
from controller import models as controller_models
from controller.config import parse_config
from controller.errors import JobFileError
from controller.job.files import parse_job_text
from controller.run.jobs import manifest_settings, prepare
from runner_image import faces, models, processors
from runner_image.errors import MissingInput
from runner_image.face_enhancers import ENHANCER_SIZE, FFHQ_512, FaceEnhancer, weight_feed
from tests import builders
from tests.builders import manifest
from tests.fixtures import photos
from tests.fixtures.standin_enhancers import add_enhancer, codeformer_model, same_contract_model
from tests.fixtures.standin_pack import _finish, build_pack, enhancer_model

MODELS = ("gfpgan_1.4", "codeformer", "gpen_bfr_512", "restoreformer_plus_plus")

# --- the job file ------------------------------------------------------------------------------------

JOB = "name: j\nsource: faces/star.jpg\ntargets: [crowd/*.jpg]\noutput: out/{stem}{ext}\n"


def parse(section: str) -> Any:
    return parse_job_text(f"{JOB}processors: [face_swapper, face_enhancer]\nface_enhancer: {section}\n", "job.yaml")


def test_the_defaults_are_gfpgan_blend_0_8_and_weight_0_5() -> None:
    enh = parse_job_text(JOB, "job.yaml").face_enhancer
    assert (enh.model, enh.blend, enh.weight) == ("gfpgan_1.4", 0.8, 0.5)


@pytest.mark.parametrize("model", MODELS)
def test_every_model_is_accepted_with_blend_and_weight(model: str) -> None:
    enh = parse(f"{{model: {model}, blend: 0.8, weight: 0.25}}").face_enhancer
    assert (enh.model, enh.blend, enh.weight) == (model, 0.8, 0.25)


def test_design_example_with_a_weight_for_gfpgan_is_accepted_and_weight_is_a_float() -> None:
    # the weight is codeformer's only: other models ignore it (as FaceFusion does), so it is not refused
    enh = parse("{model: gfpgan_1.4, blend: 0.8, weight: 0.5}").face_enhancer
    assert enh.weight == 0.5
    for w in (0, 1):  # both ends of [0, 1]
        assert parse(f"{{model: codeformer, weight: {w}}}").face_enhancer.weight == float(w)


@pytest.mark.parametrize("model", ["gfpgan", "GFPGAN_1.4", "codeformer_v2", 3, "", None])
def test_an_unknown_model_is_refused_naming_the_field_and_listing_the_choices(model: object) -> None:
    with pytest.raises(JobFileError) as e:
        parse(json.dumps({"model": model}))
    assert e.value.field == "face_enhancer.model"
    assert "unknown face_enhancer model" in e.value.reason
    assert "choose from gfpgan_1.4, codeformer, gpen_bfr_512, restoreformer_plus_plus" in e.value.reason


@pytest.mark.parametrize("weight", [-0.1, 1.5, "0.5", True, None, ".nan", ".inf"])
def test_a_weight_outside_0_1_is_refused_naming_the_field(weight: object) -> None:
    text = weight if isinstance(weight, str) and weight.startswith(".") else json.dumps(weight)
    with pytest.raises(JobFileError) as e:
        parse(f"{{model: codeformer, weight: {text}}}")
    assert e.value.field == "face_enhancer.weight"
    assert "must be a number in [0, 1]" in e.value.reason


def test_an_unknown_key_is_refused_with_a_suggestion() -> None:
    with pytest.raises(JobFileError) as e:
        parse("{model: codeformer, wieght: 0.3}")
    assert e.value.field == "face_enhancer.wieght" and "did you mean 'weight'" in e.value.reason


# --- the manifest ------------------------------------------------------------------------------------


def test_the_manifest_round_trips_model_and_weight() -> None:
    m = manifest(processors=("face_enhancer",), enhancer_model="codeformer", enhancer_weight=0.25)
    data = json.loads(m.to_json())
    assert (data["enhancer_model"], data["enhancer_weight"]) == ("codeformer", 0.25)
    back = Manifest.from_json(m.to_json())
    assert back == m and (back.enhancer_model, back.enhancer_weight) == ("codeformer", 0.25)


def test_defaults_are_left_out_and_an_old_manifest_reads_as_gfpgan_0_5() -> None:
    data = json.loads(manifest().to_json())
    assert "enhancer_model" not in data and "enhancer_weight" not in data  # older runners read it unchanged
    old = Manifest.from_dict(data)
    assert (old.enhancer_model, old.enhancer_weight) == ("gfpgan_1.4", 0.5)


@pytest.mark.parametrize(
    ("field", "value", "words"),
    [
        ("enhancer_weight", 1.5, "enhancer_weight must be in [0, 1]"),
        ("enhancer_weight", -0.01, "enhancer_weight must be in [0, 1]"),
        ("enhancer_weight", "0.5", "enhancer_weight must be a finite number"),
        ("enhancer_weight", True, "enhancer_weight must be a finite number"),
        ("enhancer_model", "gfpgan", "enhancer_model must be one of gfpgan_1.4, codeformer"),
        ("enhancer_model", 3, "manifest field 'enhancer_model' must be a non-empty string"),
        ("enhancer_model", "", "manifest field 'enhancer_model' must be a non-empty string"),
    ],
)
def test_a_bad_model_or_weight_in_a_manifest_is_refused_naming_it(field: str, value: object, words: str) -> None:
    data = json.loads(manifest().to_json())
    data[field] = value
    with pytest.raises(ManifestError) as e:
        Manifest.from_dict(data)
    assert words in str(e.value)


# --- the runner: the call built from the model's inputs ----------------------------------------------


def session(model: Any) -> Any:
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])


@pytest.fixture(scope="module")
def astronaut(tmp_path_factory: pytest.TempPathFactory) -> np.ndarray:
    image = cv2.imread(str(photos.astronaut(tmp_path_factory.mktemp("photos"))))
    assert image is not None
    return np.asarray(image)


def face_in(box: tuple[int, int, int, int]) -> faces.Face:
    """A face whose five keypoints sit where FFHQ's template puts them in ``box`` (no detector needed)."""
    x1, y1, x2, y2 = box
    kps = FFHQ_512 * np.array([x2 - x1, y2 - y1], np.float32) + np.array([x1, y1], np.float32)
    return faces.Face((float(x1), float(y1), float(x2), float(y2)), 0.9, kps.astype(np.float32))


def enhancer(model_proto: Any, model: str, weight: float) -> FaceEnhancer:
    return FaceEnhancer(session(model_proto), 1.0, 0.05, 0.1, weight=weight, model=model)


def aligned(frame: np.ndarray, face: faces.Face) -> np.ndarray:
    matrix = cv2.estimateAffinePartial2D(face.kps, FFHQ_512 * ENHANCER_SIZE, method=cv2.LMEDS)[0]
    return cv2.warpAffine(frame, matrix, (ENHANCER_SIZE, ENHANCER_SIZE), borderMode=cv2.BORDER_REPLICATE)


def test_codeformer_gets_its_weight_and_weight_0_and_1_give_different_crops(astronaut: np.ndarray) -> None:
    face = face_in(photos.ASTRONAUT_FACE)
    cf = codeformer_model()
    restored = enhancer(cf, "codeformer", 0.0).enhance(astronaut, face).crop
    faithful = enhancer(cf, "codeformer", 1.0).enhance(astronaut, face).crop
    half = enhancer(cf, "codeformer", 0.5).enhance(astronaut, face).crop
    diff = np.abs(restored.astype(int) - faithful.astype(int)).mean()
    assert diff > 10
    # weight 1: the input itself (the stand-in's fidelity end); weight 0: the GFPGAN stand-in's face
    assert np.abs(faithful.astype(int) - aligned(astronaut, face).astype(int)).max() <= 1
    gfpgan = enhancer(enhancer_model(), "gfpgan_1.4", 0.5).enhance(astronaut, face).crop
    assert np.abs(restored.astype(int) - gfpgan.astype(int)).max() <= 1
    between = np.abs(half.astype(int) - faithful.astype(int)).mean()
    assert 0.3 * diff < between < 0.7 * diff


@pytest.mark.parametrize("model", ["gfpgan_1.4", "gpen_bfr_512", "restoreformer_plus_plus"])
def test_a_gfpgan_contract_model_runs_and_ignores_the_weight(astronaut: np.ndarray, model: str) -> None:
    face = face_in(photos.ASTRONAUT_FACE)
    graph = enhancer_model() if model == "gfpgan_1.4" else same_contract_model(model)
    low = enhancer(graph, model, 0.0).enhance(astronaut, face).crop
    high = enhancer(graph, model, 1.0).enhance(astronaut, face).crop
    assert np.array_equal(low, high)
    assert np.abs(low.astype(int) - aligned(astronaut, face).astype(int)).mean() > 5  # it does change the face


def test_the_weight_is_fed_as_the_graph_declares_it() -> None:
    double1 = weight_feed(SimpleNamespace(type="tensor(double)", shape=[1]), 0.3)
    assert double1.dtype == np.float64 and double1.shape == (1,) and double1[0] == 0.3
    scalar = weight_feed(SimpleNamespace(type="tensor(float)", shape=[]), 0.3)
    assert scalar.dtype == np.float32 and scalar.shape == ()
    with pytest.raises(MissingInput, match="'weight' input is tensor\\(int64\\), not a float tensor"):
        weight_feed(SimpleNamespace(type="tensor(int64)", shape=[1]), 0.3)


def test_a_float32_scalar_weight_graph_runs_too(astronaut: np.ndarray) -> None:
    face = face_in(photos.ASTRONAUT_FACE)
    cf = codeformer_model(TensorProto.FLOAT, [])
    a = enhancer(cf, "codeformer", 0.0).enhance(astronaut, face).crop
    b = enhancer(cf, "codeformer", 1.0).enhance(astronaut, face).crop
    assert not np.array_equal(a, b)


def test_a_wrong_shaped_enhancer_is_refused_naming_the_role() -> None:
    shape = [1, 3, 256, 256]
    graph = helper.make_graph(
        [helper.make_node("Identity", ["input"], ["output"])],
        "wrong",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, shape)],
    )
    with pytest.raises(MissingInput) as e:
        enhancer(_finish(graph, "256"), "gfpgan_1.4", 0.5)
    assert "enhancer model takes [1, 3, 256, 256] inputs, not one [1, 3, 512, 512] image" in str(e.value)


@pytest.mark.parametrize(
    ("graph", "model", "words"),
    [
        ("codeformer", "gfpgan_1.4", "takes a 'weight' input (codeformer's contract), but the job's "
         "face_enhancer.model is gfpgan_1.4"),
        ("gfpgan", "codeformer", "takes one image only, but the job's face_enhancer.model is codeformer"),
    ],
)  # fmt: skip
def test_a_model_whose_inputs_disagree_with_the_jobs_model_is_refused(graph: str, model: str, words: str) -> None:
    proto = codeformer_model() if graph == "codeformer" else enhancer_model()
    with pytest.raises(MissingInput) as e:
        enhancer(proto, model, 0.5)
    assert str(e.value).startswith("enhancer model ") and words in str(e.value)


def test_a_codeformer_pack_loads_and_the_factory_passes_the_manifests_weight(
    tmp_path: Path, astronaut: np.ndarray
) -> None:
    pack_dir = build_pack(tmp_path / "pack", enhancer=False, frame_enhancer=False).parent
    add_enhancer(pack_dir, "codeformer")
    roles = ("detector", "recognizer", "enhancer")
    loaded = models.load_models(models.verify_pack(pack_dir, ("face_enhancer",)), ("cpu",), roles=roles)
    found = faces.detect(loaded.detector, astronaut)
    assert found
    out = {}
    for w in (0.0, 1.0):
        m = manifest(processors=("face_enhancer",), enhancer_model="codeformer", enhancer_weight=w, enhancer_blend=1.0)
        frame = astronaut.copy()
        for step in processors.build(m, loaded, np.zeros(512, np.float32)):
            step.apply(frame, found, lambda stage, seconds: None)
        out[w] = frame
    x1, y1, x2, y2 = photos.ASTRONAUT_FACE
    assert np.abs(out[0.0].astype(int) - out[1.0].astype(int))[y1:y2, x1:x2].mean() > 5
    with pytest.raises(MissingInput, match="face_enhancer.model is gfpgan_1.4"):
        processors.build(manifest(processors=("face_enhancer",)), loaded, np.zeros(512, np.float32))


def test_models_verify_accepts_a_codeformer_file_and_says_its_contract(tmp_path: Path) -> None:
    pack_dir = build_pack(tmp_path / "pack", enhancer=False, frame_enhancer=False).parent
    name = add_enhancer(pack_dir, "codeformer")
    report = controller_models.verify(pack_dir)
    entry = next(f for f in report.files if f.name == name)
    assert entry.ok, entry.notes
    assert entry.contract == "1 input, the first N×3×512×512 (and 'weight' for codeformer), 1 output"


# --- submit: face_enhancer.model against the pack's model: -------------------------------------------

SHA = "0" * 64


def pack_files(model: str | None) -> dict[str, Any]:
    files: dict[str, Any] = {
        "det_10g.onnx": {"role": "detector", "sha256": SHA},
        "w600k_r50.onnx": {"role": "recognizer", "sha256": SHA},
        "inswapper_128.onnx": {"role": "swapper", "sha256": SHA},
        "codeformer.onnx": {"role": "enhancer", "sha256": SHA},
    }
    if model is not None:
        files["codeformer.onnx"]["model"] = model
    return files


def submit(tmp_path: Path, files: dict[str, Any], extra: str) -> list[Any]:
    root = builders.data_root(tmp_path, files)
    job = tmp_path / "job.yaml"
    job.write_text(JOB + extra)
    config = parse_config(tmp_path / "ffswarm.yaml", {"data_root": str(root)})
    return [(config, j) for j in prepare(config, [job], new=False)]


ENHANCE = "processors: [face_swapper, face_enhancer]\n"


def test_a_face_enhancer_model_other_than_the_packs_is_refused_naming_both(tmp_path: Path) -> None:
    with pytest.raises(JobFileError) as e:
        submit(tmp_path, pack_files("codeformer"), ENHANCE)  # the job's model: the default, gfpgan_1.4
    assert e.value.field == "face_enhancer.model" and e.value.exit_code == 65
    assert e.value.reason == (
        "the pack's enhancer is codeformer.onnx (codeformer in models/default/pack.yaml), not gfpgan_1.4"
    )
    assert not (tmp_path / "root" / "runs").exists()


def test_the_packs_own_model_or_a_pack_that_records_none_is_accepted_and_reaches_the_manifest(
    tmp_path: Path,
) -> None:
    named = ENHANCE + "face_enhancer: {model: codeformer, weight: 0.7}\n"
    ((config, job),) = submit(tmp_path / "a", pack_files("codeformer"), named)
    settings = manifest_settings(config, job)
    assert (settings.enhancer_model, settings.enhancer_weight) == ("codeformer", 0.7)
    assert len(submit(tmp_path / "b", pack_files(None), ENHANCE)) == 1  # no model: recorded: taken as it is
    # without face_enhancer in its processors a job's face_enhancer.model is not checked
    assert len(submit(tmp_path / "c", pack_files("codeformer"), "processors: [face_swapper]\n")) == 1


def test_wrong_model_is_the_one_check_for_both_enhancers() -> None:
    spec = check_spec({"files": pack_files("codeformer")}, "model pack models/p")
    assert wrong_model(spec, "enhancer", "codeformer", "models/p") is None
    assert wrong_model(spec, "enhancer", None, "models/p") is None  # nothing expected
    assert wrong_model(spec, "frame_enhancer", "real_esrgan_x4", "models/p") is None  # no file for the role
    assert wrong_model(spec, "enhancer", "gpen_bfr_512", "models/p") == (
        "the pack's enhancer is codeformer.onnx (codeformer in models/p/pack.yaml), not gpen_bfr_512"
    )
