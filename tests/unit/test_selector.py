"""The face selector (job file ``selector: {order, gender, age}``, contract/selector.py,
runner_image/selector.py): the job file's refusals, the order ``faces: one`` picks by, the gender
and age filters on the stand-in genderage model (tests/fixtures/standin_genderage.py: male when a
face is bluer than red, age from brightness) through real chunks — photos and a video's frames —
the pack check that wants genderage only from a job that filters, and the manifest's fields."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import onnxruntime as ort
import pytest
import yaml

from contract import pack, processors
from contract.errors import ManifestError, PackError
from contract.manifest import FaceSelection, Item, Manifest, NoFacePolicy, Segment
from contract.results import ItemStatus
from contract.selector import ORDERS, Selector
from controller.config import parse_config
from controller.errors import JobFileError, MissingInputError
from controller.job.files import parse_job_text
from controller.job.plan import ManifestSettings, TargetRef, chunk_manifests, make_plan
from controller.job.settings import SelectorSettings
from controller.run.jobs import prepare
from runner_image import genderage, selector
from runner_image.faces import Face
from tests import builders
from tests.builders import manifest
from tests.fixtures import photos
from tests.fixtures.standin_genderage import FILE as GENDERAGE_FILE
from tests.fixtures.standin_genderage import genderage_model
from tests.fixtures.standin_pack import build_pack
from tests.unit.test_runner_chunk import JOB, RUN, results, run, write_manifest

# ------------------------------------------------------------------------------------------ job file

JOB_TEXT = "name: j\nsource: faces/star.jpg\ntargets: [crowd/*.jpg]\noutput: out/{stem}{ext}\n"


def spec_with(selector_yaml: str) -> Any:
    return parse_job_text(JOB_TEXT + f"selector: {selector_yaml}\n", "job.yaml")


def test_the_default_selector_is_large_small_without_filters() -> None:
    spec = parse_job_text(JOB_TEXT, "job.yaml")
    assert spec.selector == SelectorSettings("large-small", "any", (0, 100)) and not spec.selector.filters
    full = spec_with("{order: left-right, gender: female, age: [20, 40]}").selector
    assert (full.order, full.gender, full.age, full.filters) == ("left-right", "female", (20, 40), True)
    assert spec_with("{age: [0, 100]}").selector.filters is False
    assert spec_with("{age: [0, 99]}").selector.filters is True


@pytest.mark.parametrize(
    ("value", "field", "words"),
    [
        ("{order: biggest}", "selector.order", "choose from " + ", ".join(ORDERS)),
        ("{gender: woman}", "selector.gender", "choose from any, female, male"),
        ("{age: [50, 10]}", "selector.age", "min ≤ max, got [50, 10]"),
        ("{age: [0, 101]}", "selector.age", "integers from 0 to 100"),
        ("{age: [-1, 30]}", "selector.age", "integers from 0 to 100"),
        ("{age: 30}", "selector.age", "[min, max]"),
        ("{age: [1.5, 30]}", "selector.age", "integers"),
        ("{age: [true, 30]}", "selector.age", "integers"),
        ("{age: [10, 20, 30]}", "selector.age", "[min, max]"),
        ("{oder: left-right}", "selector.oder", "order"),
        ("large-small", "selector", "must be a mapping"),
    ],
)
def test_job_file_refusals_name_the_field_and_the_choices(value: str, field: str, words: str) -> None:
    with pytest.raises(JobFileError) as e:
        spec_with(value)
    assert e.value.field == field and words in e.value.reason, str(e.value)
    assert e.value.exit_code == 65


# ----------------------------------------------------------------------------------------- the order


def face(x1: float, y1: float, size: float, score: float = 0.9) -> Face:
    return Face((x1, y1, x1 + size, y1 + size), score, np.zeros((5, 2), np.float32))


LEFT_SMALL, MIDDLE_BIG, RIGHT_LOW = face(10, 50, 40, 0.8), face(100, 10, 90, 0.7), face(300, 80, 60, 0.95)
FOUND = [MIDDLE_BIG, RIGHT_LOW, LEFT_SMALL]  # the detector's order (by score) is not the job's


@pytest.mark.parametrize(
    ("order", "expected"),
    [
        ("left-right", [LEFT_SMALL, MIDDLE_BIG, RIGHT_LOW]),
        ("right-left", [RIGHT_LOW, MIDDLE_BIG, LEFT_SMALL]),
        ("top-bottom", [MIDDLE_BIG, LEFT_SMALL, RIGHT_LOW]),
        ("bottom-top", [RIGHT_LOW, LEFT_SMALL, MIDDLE_BIG]),
        ("small-large", [LEFT_SMALL, RIGHT_LOW, MIDDLE_BIG]),
        ("large-small", [MIDDLE_BIG, RIGHT_LOW, LEFT_SMALL]),
        ("best-worst", [RIGHT_LOW, LEFT_SMALL, MIDDLE_BIG]),
        ("worst-best", [MIDDLE_BIG, LEFT_SMALL, RIGHT_LOW]),
    ],
)
def test_each_order_sorts_the_faces_and_faces_one_takes_the_first(order: str, expected: list[Face]) -> None:
    assert selector.ordered(FOUND, order) == expected
    image = np.zeros((200, 400, 3), np.uint8)
    for mode in (FaceSelection.ONE, FaceSelection.MANY):
        m = manifest(faces=mode, selector_order=order)
        got = selector.choose(image, FOUND, m, None, lambda img, fs: np.zeros((len(fs), 512)))
        assert got == (expected[:1] if mode is FaceSelection.ONE else expected)


def test_ties_break_left_to_right_whatever_the_detector_order() -> None:
    a, b = face(200, 0, 50), face(20, 0, 50)
    assert selector.ordered([a, b], "large-small") == selector.ordered([b, a], "large-small") == [b, a]


def test_filtering_without_a_loaded_model_is_an_item_error_not_a_silent_pass() -> None:
    m = manifest(selector_gender="male")
    with pytest.raises(Exception, match="no genderage model is loaded"):
        selector.choose(np.zeros((9, 9, 3), np.uint8), FOUND, m, None, lambda img, fs: np.zeros((0, 512)))


# ------------------------------------------------------------------------ the genderage model contract


def test_the_runner_judges_faces_as_insightfaces_attribute_class_does(tmp_path: Path) -> None:
    from insightface.app.common import Face as InsightFace
    from insightface.model_zoo import get_model
    from insightface.utils import face_align

    path = tmp_path / GENDERAGE_FILE
    path.write_bytes(genderage_model().SerializeToString())
    theirs = get_model(str(path), providers=["CPUExecutionProvider"])
    assert (type(theirs).__name__, theirs.taskname, theirs.input_size) == ("Attribute", "genderage", (96, 96))
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    ours = genderage.load(session, path)
    assert (ours.mean, ours.std) == (theirs.input_mean, theirs.input_std) == (0.0, 1.0)
    image = cv2.imread(str(three_faces(tmp_path)))
    for box in [(40.3, 60.2, 120.9, 150.0), (250, 75, 344, 198), (485.5, 77.6, 579.6, 196.1)]:
        centre = ((box[0] + box[2]) / 2, (box[1] + box[3]) / 2)
        scale = 96 / (max(box[2] - box[0], box[3] - box[1]) * 1.5)
        their_crop, _ = face_align.transform(image, centre, 96, scale, 0)
        assert np.abs(their_crop.astype(int) - genderage.crop(image, box).astype(int)).max() <= 1
        gender, age = theirs.get(image, InsightFace(bbox=np.array(box)))
        assert ours.judge(image, [Face(box, 1.0, np.zeros((5, 2), np.float32))]) == [(int(gender), age)]


def test_a_model_of_another_shape_is_refused_as_not_genderage() -> None:
    from tests.fixtures.standin_pack import recognizer_model

    session = ort.InferenceSession(recognizer_model().SerializeToString(), providers=["CPUExecutionProvider"])
    with pytest.raises(Exception, match="not a genderage model"):
        genderage.GenderAge(session)


# ------------------------------------------------------------------------------ through real chunks


def three_faces(dest: Path) -> Path:
    """``three.png``: astronaut's face three times — left small and darkened (female, ~young), middle
    as it is (female, older), right with red and blue swapped (male, older)."""
    dest.mkdir(parents=True, exist_ok=True)
    photos.astronaut(dest)
    img = cv2.imread(str(dest / "astronaut.jpg"))
    x1, y1, x2, y2 = photos.ASTRONAUT_FACE
    crop = img[max(0, y1 - 60) : y2 + 60, max(0, x1 - 60) : x2 + 60]
    small = (cv2.resize(crop, None, fx=0.7, fy=0.7) * 0.5).astype(np.uint8)
    h, w = crop.shape[:2]
    canvas = np.full((h + 40, 2 * w + small.shape[1] + 80, 3), 90, np.uint8)
    canvas[20 : 20 + small.shape[0], 20 : 20 + small.shape[1]] = small
    mid = 40 + small.shape[1]
    canvas[20 : 20 + h, mid : mid + w] = crop
    right = mid + w + 20
    canvas[20 : 20 + h, right : right + w] = crop[:, :, ::-1]
    cv2.imwrite(str(dest / "three.png"), canvas)
    return dest / "three.png"


@pytest.fixture(scope="module")
def assets(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp("selector")
    build_pack(base / "models" / "default")
    three_faces(base / "in")
    photos.face_photos(base / "in", 2)
    shutil.copyfile(base / "in" / "face_01.jpg", base / "in" / "source.jpg")
    return base


@pytest.fixture
def data(tmp_path: Path, assets: Path) -> Path:
    root = tmp_path / "data"
    shutil.copytree(assets, root)
    (root / "runs" / JOB / "chunks").mkdir(parents=True)
    return root


# Where the three faces are (the stand-in detector's boxes, with a margin): left, middle, right
THIRDS = ((0, 40 + 151), (40 + 151, 40 + 151 + 235), (40 + 151 + 235, 10_000))


def changed_faces(root: Path, output: str = "three.png", noise: float = 1) -> list[str]:
    """The faces whose part of the photo changed by more than ``noise`` (mean absolute difference)."""
    before = cv2.imread(str(root / "in" / "three.png")).astype(int)
    after = cv2.imread(str(root / "out" / output)).astype(int)
    return [name for name, (a, b) in zip(("left", "middle", "right"), THIRDS, strict=True)
            if np.abs(before[:, a:b] - after[:, a:b]).mean() > noise]  # fmt: skip


def one_photo(root: Path, **kw: Any) -> Any:
    code = run(root, write_manifest(root, ["three.png"], **kw))
    (line,) = results(root)
    return code, line


def test_the_three_faces_are_judged_as_painted(assets: Path) -> None:
    from runner_image.faces import detect
    from runner_image.insightface_lite import model_zoo

    det = model_zoo.get_model(str(assets / "models" / "default" / "det_10g.onnx"), providers=["CPUExecutionProvider"])
    det.prepare(0, input_size=(640, 640), det_thresh=0.5)
    image = cv2.imread(str(assets / "in" / "three.png"))
    found = selector.ordered(detect(det, image), "left-right")
    path = assets / "models" / "default" / GENDERAGE_FILE
    model = genderage.load(ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]), path)
    judged = model.judge(image, found)
    assert [g for g, _ in judged] == [genderage.FEMALE, genderage.FEMALE, genderage.MALE]
    assert judged[0][1] < 50 < judged[1][1] and judged[2][1] > 50


@pytest.mark.parametrize(
    ("order", "picked"), [("left-right", "left"), ("large-small", "middle"), ("right-left", "right")]
)
def test_faces_one_changes_the_face_the_order_puts_first(data: Path, order: str, picked: str) -> None:
    code, line = one_photo(data, faces=FaceSelection.ONE, selector_order=order)
    assert code == 0 and line.status is ItemStatus.OK and line.faces == 1
    assert changed_faces(data) == [picked]


@pytest.mark.parametrize(
    ("kw", "kept"),
    [
        ({"selector_gender": "female"}, ["left", "middle"]),
        ({"selector_gender": "male"}, ["right"]),
        ({"selector_age": (0, 50)}, ["left"]),
        ({"selector_gender": "female", "selector_age": (51, 100)}, ["middle"]),
        ({"selector_gender": "female", "faces": FaceSelection.ONE, "selector_order": "small-large"}, ["left"]),
        ({"selector_gender": "female", "faces": FaceSelection.ONE}, ["middle"]),
    ],
)
def test_filters_drop_the_faces_that_do_not_match_before_faces_applies(
    data: Path, kw: dict[str, Any], kept: list[str]
) -> None:
    code, line = one_photo(data, **kw)
    assert code == 0 and line.status is ItemStatus.OK and line.faces == len(kept)
    assert changed_faces(data) == kept


def test_a_photo_whose_faces_are_all_filtered_out_is_no_face(data: Path) -> None:
    code, line = one_photo(data, selector_gender="male", selector_age=(0, 50))
    assert code == 0 and line.status is ItemStatus.NO_FACE and line.faces == 0
    assert (data / "out" / "three.png").read_bytes() == (data / "in" / "three.png").read_bytes()  # copied
    for f in [*(data / "runs" / JOB / "results").iterdir(), data / "out" / "three.png"]:
        f.unlink()
    code, line = one_photo(data, selector_gender="male", selector_age=(0, 50), no_face=NoFacePolicy.FAIL)
    assert code == 3 and line.status is ItemStatus.ERROR
    assert "no face matches the selector (gender male, age 0-50)" in (line.reason or "")


def test_the_video_frame_path_applies_the_same_selector(data: Path) -> None:
    still = cv2.imread(str(data / "in" / "three.png"))
    h, w = still.shape[:2]
    clip = data / "in" / "three.mkv"
    subprocess.run(
        ["ffmpeg", "-v", "error", "-y", "-loop", "1", "-i", str(data / "in" / "three.png"), "-frames:v", "3",
         "-r", "25", "-c:v", "ffv1", "-pix_fmt", "bgr0", str(clip)],
        check=True,
    )  # fmt: skip
    seg = Segment(0, 3, "25/1", w, h, 12800, last=True, crf=0, preset="ultrafast", demuxer="matroska")
    item = Item("i000000-s0000", "/data/in/three.mkv", f"{RUN}/segments/i000000-s0000.mkv", kind="video", segment=seg)
    assert run(data, write_manifest(data, [], items=(item,), selector_gender="male")) == 0
    (line,) = results(data)
    assert line.status is ItemStatus.OK and line.faces == 3  # the male face, in each of the 3 frames
    out = data / "runs" / JOB / "segments" / "i000000-s0000.mkv"
    frame = subprocess.run(
        ["ffmpeg", "-v", "error", "-i", str(out), "-frames:v", "1", "-f", "rawvideo", "-pix_fmt", "bgr24", "-"],
        check=True, capture_output=True,
    ).stdout  # fmt: skip
    (data / "out").mkdir(exist_ok=True)
    cv2.imwrite(str(data / "out" / "frame.png"), np.frombuffer(frame, np.uint8).reshape(h, w, 3))
    assert changed_faces(data, "frame.png", noise=6) == ["right"]  # yuv420p: ~2.4 of noise everywhere


# --------------------------------------------------------------------------------------- pack checks


def test_the_genderage_role_is_needed_only_when_the_selector_filters() -> None:
    assert "genderage" not in processors.roles(["face_swapper"])
    assert processors.roles(["face_swapper"], filters=True)[-1] == "genderage"
    spec = {"files": {n: {"role": r, "sha256": "0" * 64} for n, r in BASE.items()}}
    pack.missing_roles(Path("p"), spec, ["face_swapper"])  # no filter: nothing missing
    with pytest.raises(PackError) as e:
        pack.missing_roles(Path("p"), spec, ["face_swapper"], filters=True)
    msg = str(e.value)
    assert "role genderage" in msg and "selector.gender/selector.age" in msg and "buffalo_l" in msg
    licensed = {**spec["files"], GENDERAGE_FILE: {"role": "genderage", "sha256": "0" * 64}}
    assert [r for r, _, _ in pack.not_commercial({"files": licensed}, ["face_swapper"])] == list(BASE.values())
    filtering = pack.not_commercial({"files": licensed}, ["face_swapper"], filters=True)
    assert [r for r, _, _ in filtering][-1] == "genderage"


BASE = {"det_10g.onnx": "detector", "w600k_r50.onnx": "recognizer", "inswapper_128.onnx": "swapper"}


def submit_root(tmp_path: Path, genderage_in_pack: bool) -> Path:
    files = {n: {"role": r, "sha256": "0" * 64} for n, r in BASE.items()}
    if genderage_in_pack:
        files[GENDERAGE_FILE] = {"role": "genderage", "sha256": "0" * 64}
    return builders.data_root(tmp_path, files)


def test_submit_refuses_a_filtering_job_whose_pack_has_no_genderage(tmp_path: Path) -> None:
    root = submit_root(tmp_path, genderage_in_pack=False)
    config = parse_config(tmp_path / "ffswarm.yaml", {"data_root": str(root)})
    plain, filtering = tmp_path / "plain.yaml", tmp_path / "filtering.yaml"
    plain.write_text(JOB_TEXT + "selector: {order: left-right}\n")
    filtering.write_text(JOB_TEXT.replace("name: j", "name: k") + "selector: {gender: female}\n")
    assert len(prepare(config, [plain], new=False)) == 1  # an order alone needs no model
    with pytest.raises(MissingInputError) as e:
        prepare(config, [filtering], new=False)
    assert "filtering.yaml: models:" in str(e.value) and "role genderage" in str(e.value)
    assert "selector.gender/selector.age" in str(e.value) and e.value.exit_code == 66
    ok_root = submit_root(tmp_path / "ok", genderage_in_pack=True)
    config = parse_config(tmp_path / "ffswarm.yaml", {"data_root": str(ok_root)})
    assert len(prepare(config, [filtering], new=False)) == 1


def test_a_runner_without_filters_never_needs_genderage(data: Path) -> None:
    spec_path = data / "models" / "default" / "pack.yaml"
    spec = yaml.safe_load(spec_path.read_text())
    del spec["files"][GENDERAGE_FILE]
    spec_path.write_text(yaml.safe_dump(spec))
    (data / "models" / "default" / GENDERAGE_FILE).unlink()
    code, line = one_photo(data, faces=FaceSelection.ONE, selector_order="left-right")
    assert code == 0 and line.status is ItemStatus.OK and changed_faces(data) == ["left"]
    for f in [*(data / "runs" / JOB / "results").iterdir(), data / "out" / "three.png"]:
        f.unlink()
    assert run(data, write_manifest(data, ["three.png"], selector_gender="female")) == 66  # the pack lacks it


# -------------------------------------------------------------------------------------------- manifest


def test_the_manifest_round_trips_the_selector_and_leaves_defaults_out() -> None:
    plain = manifest()
    assert "selector" not in plain.to_json()  # as older runners know manifests
    assert (plain.selector_order, plain.selector_gender, plain.selector_age) == ("large-small", "any", (0, 100))
    m = manifest(selector_order="bottom-top", selector_gender="male", selector_age=[18, 65])
    back = Manifest.from_json(m.to_json())
    assert back == m and back.selector_age == (18, 65)
    assert '"selector_age": [18, 65]' in m.to_json()


@pytest.mark.parametrize(
    ("kw", "words"),
    [
        ({"selector_order": "up-down"}, "selector_order must be one of left-right"),
        ({"selector_gender": "other"}, "selector_gender must be one of any, female, male"),
        ({"selector_age": (60, 20)}, "selector_age must be [min, max]"),
        ({"selector_age": (0, 150)}, "selector_age must be [min, max]"),
    ],
)
def test_the_manifest_refuses_bad_selector_values(kw: dict[str, Any], words: str) -> None:
    with pytest.raises(ManifestError, match=words.replace("[", r"\[")):
        manifest(**kw)


@pytest.mark.parametrize(
    ("field", "value"),
    [("selector_order", 3), ("selector_gender", None), ("selector_age", "0-100"), ("selector_age", [0, 100.0])],
)
def test_a_manifest_file_with_a_mistyped_selector_field_is_refused_naming_it(field: str, value: Any) -> None:
    import json

    data = json.loads(manifest().to_json())
    data[field] = value
    with pytest.raises(ManifestError, match=field):
        Manifest.from_dict(data)


def test_every_chunk_manifest_carries_the_jobs_selector() -> None:
    plan = make_plan("j", [TargetRef(f"in/{n}.jpg", f"out/{n}.jpg", "image") for n in range(3)], 2)
    settings = ManifestSettings(
        "default", ("s.jpg",), ("face_swapper",), ("cpu",), FaceSelection.MANY, NoFacePolicy.COPY,
        selector=Selector("top-bottom", "female", (20, 30)),
    )  # fmt: skip
    for m in chunk_manifests(plan, settings).values():
        assert (m.selector_order, m.selector_gender, m.selector_age) == ("top-bottom", "female", (20, 30))
