"""runner_image pieces tested as data: face selection, identity, providers, paths, results, paste-back.

The paste-back test runs insightface's own ``INSwapper.get(paste_back=True)`` and ours on the same
faces with the stand-in pack, and requires the same pixels (within interpolation rounding).
"""

from __future__ import annotations

import subprocess
import sys
import warnings
from pathlib import Path

import cv2
import numpy as np
import pytest

from contract.manifest import FaceSelection
from contract.results import ItemResult, ItemStatus, merge_attempts
from runner_image import faces, models, swap
from runner_image.errors import ItemError, MissingInput, Temporary
from runner_image.faces import Face
from runner_image.volume import DataRoot, committed
from tests.fixtures import photos
from tests.fixtures.standin_pack import build_pack


def _face(x1: float, y1: float, x2: float, y2: float) -> Face:
    return Face((x1, y1, x2, y2), 0.9, np.zeros((5, 2), np.float32))


def test_many_keeps_every_face_in_order() -> None:
    fs = [_face(0, 0, 10, 10), _face(50, 0, 70, 20)]
    assert faces.select(fs, FaceSelection.MANY) == fs


def test_one_takes_the_largest_box() -> None:
    small, big = _face(0, 0, 10, 10), _face(50, 0, 70, 20)
    assert faces.select([small, big], FaceSelection.ONE) == [big]


def test_one_breaks_ties_left_to_right() -> None:
    right, left = _face(100, 0, 120, 20), _face(10, 5, 30, 25)
    assert faces.select([right, left], FaceSelection.ONE) == [left]
    assert faces.select([left, right], FaceSelection.ONE) == [left]


def test_one_of_nothing_is_nothing() -> None:
    assert faces.select([], FaceSelection.ONE) == []


def test_reference_needs_embeddings() -> None:
    with pytest.raises(ItemError, match="reference needs the faces' embeddings"):
        faces.select([_face(0, 0, 1, 1)], FaceSelection.REFERENCE)


def test_by_reference_keeps_faces_within_the_cosine_distance_in_order() -> None:
    fs = [_face(0, 0, 10, 10), _face(20, 0, 30, 10), _face(40, 0, 50, 10)]
    emb = np.array([[1.0, 0.0], [0.0, 1.0], [3.0, 0.3]], np.float32)  # norms differ: cosine only
    picked = faces.by_reference(fs, emb, np.array([2.0, 0.0]), 0.1)
    assert picked == [fs[0], fs[2]]
    assert faces.by_reference(fs, emb, np.array([1.0, 0.0]), 1.0) == fs  # orthogonal: distance exactly 1
    assert np.allclose(faces.cosine_distance(emb[:2], np.array([0.0, 5.0])), [1.0, 0.0])


def test_identity_averages_normed_embeddings_then_renormalises() -> None:
    a = np.zeros(512, np.float32)
    a[0] = 10.0  # norms differ: each photo must weigh the same
    b = np.zeros(512, np.float32)
    b[1] = 0.5
    ident = faces.identity([a, b])
    assert np.isclose(np.linalg.norm(ident), 1.0)
    assert np.isclose(ident[0], ident[1])
    assert np.isclose(ident[0], 1 / np.sqrt(2))


CPU, CUDA = "CPUExecutionProvider", "CUDAExecutionProvider"


def test_cuda_first_when_available_with_cpu_behind_it() -> None:
    plan = models.plan_providers(("cuda", "cpu"), [CUDA, CPU])
    assert plan.name == "cuda"
    assert plan.ort_providers == [CUDA, CPU]
    assert plan.ort_options[0] == {"device_id": "0"}
    assert plan.fallback is None


def test_cuda_missing_falls_back_to_cpu_only_if_listed() -> None:
    plan = models.plan_providers(("cuda", "cpu"), [CPU])
    assert plan.name == "cpu"
    assert plan.ort_providers == [CPU]
    assert plan.fallback is not None and "CUDAExecutionProvider is not available" in plan.fallback
    with pytest.raises(Temporary, match="no usable execution provider"):
        models.plan_providers(("cuda",), [CPU])


def test_cuda_only_plan_keeps_cpu_out() -> None:
    plan = models.plan_providers(("cuda",), [CUDA, CPU])
    assert plan.ort_providers == [CUDA]
    assert not plan.allow_cpu


def test_cpu_budget_is_positive() -> None:
    assert models.cpu_budget() >= 1


def test_data_root_maps_container_paths_only(tmp_path: Path) -> None:
    root = DataRoot(tmp_path)
    assert root.path("/data/runs/j/chunks/c0001.json") == tmp_path / "runs/j/chunks/c0001.json"
    assert root.path("/data") == tmp_path
    assert root.manifest_location("/elsewhere/m.json") == Path("/elsewhere/m.json")
    with pytest.raises(ValueError):
        root.path("/database/x")
    assert DataRoot.from_env({}).local == Path("/data")
    assert DataRoot.from_env({"FFSWARM_DATA_ROOT": str(tmp_path)}).local == tmp_path


def test_committed_keeps_done_items_and_redoes_errors() -> None:
    def line(item: str, status: ItemStatus, attempt: int) -> ItemResult:
        return ItemResult(item=item, status=status, attempt=attempt, input="/data/i", output="/data/o")

    first = [line("a", ItemStatus.OK, 1), line("b", ItemStatus.ERROR, 1), line("c", ItemStatus.NO_FACE, 1)]
    second = [line("a", ItemStatus.ERROR, 2)]  # an error never undoes a committed output
    done = committed(merge_attempts([(1, "".join(r.to_line() for r in first)), (2, second[0].to_line())]))
    assert sorted(done) == ["a", "c"]


def test_footprint_covers_the_warped_crop_plus_margin() -> None:
    inverse = np.array([[2.0, 0.0, 100.0], [0.0, 2.0, 50.0]])  # crop 128 -> 256 px at (100, 50)
    placed = swap.footprint(inverse, 128, 1000, 1000)
    assert placed is not None
    region, blur = placed
    assert blur == 256 // 20
    assert (region.x0, region.y0) == (100 - blur - 4, 50 - blur - 4)
    assert (region.x1, region.y1) == (356 + blur + 4, 306 + blur + 4)
    assert swap.footprint(inverse, 128, 90, 40) is None  # entirely off-frame


def test_pack_without_its_yaml_names_the_pack(tmp_path: Path) -> None:
    with pytest.raises(MissingInput, match=rf"model pack {tmp_path}: pack.yaml not found"):
        models.verify_pack(tmp_path)


def _read(path: Path) -> np.ndarray:
    image = cv2.imread(str(path))
    assert image is not None, path
    return np.asarray(image)


@pytest.fixture(scope="module")
def loaded(tmp_path_factory: pytest.TempPathFactory) -> models.Models:
    pack_dir = build_pack(tmp_path_factory.mktemp("pack")).parent
    return models.load_models(models.verify_pack(pack_dir), ("cpu",))


@pytest.mark.parametrize("photo", [photos.astronaut, photos.group])
def test_paste_back_matches_insightface(loaded: models.Models, photo: object, tmp_path: Path) -> None:
    from insightface.app.common import Face as InsightFace

    assert callable(photo)
    image = _read(photo(tmp_path))
    found = faces.detect(loaded.detector, image)
    assert found
    identity = faces.identity([faces.embed(loaded.recognizer, image, found[:1])[0]])
    reference, ours = image.copy(), image.copy()
    swapper = swap.Swapper(loaded.swapper, identity)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for f in found:
            reference = loaded.swapper.get(
                reference, InsightFace(kps=f.kps), InsightFace(embedding=identity), paste_back=True
            )
            assert swap.paste_back(ours, swapper.swap(ours, f)) is not None
    diff = np.abs(reference.astype(int) - ours.astype(int))
    assert np.abs(image.astype(int) - ours.astype(int)).mean() > 0.5  # something was swapped
    assert diff.max() <= 3
    assert (diff > 1).mean() < 1e-4


def test_paste_back_touches_only_the_face_region(loaded: models.Models, tmp_path: Path) -> None:
    image = _read(photos.astronaut(tmp_path))
    found = faces.detect(loaded.detector, image)
    identity = faces.identity([faces.embed(loaded.recognizer, image, found)[0]])
    out = image.copy()
    region = swap.paste_back(out, swap.Swapper(loaded.swapper, identity).swap(image, found[0]))
    assert region is not None
    changed = np.argwhere(np.any(out != image, axis=2))
    assert changed.size
    assert changed[:, 0].min() >= region.y0 and changed[:, 0].max() < region.y1
    assert changed[:, 1].min() >= region.x0 and changed[:, 1].max() < region.x1
    assert region.width * region.height < 0.5 * image.shape[0] * image.shape[1]


def test_the_runner_loads_insightface_models_without_the_packages_app_layer() -> None:
    """Every chunk's cold start pays the runner's imports: insightface's own __init__ (app and
    thirdparty, and scipy through the app's addons) is skipped, and aligning the first face does not
    pull scipy in either (align.py); the model classes are insightface's."""
    code = (
        "import sys, numpy as np, runner_image.__main__ as m\n"
        "from runner_image import align\n"
        "from runner_image.insightface_lite import model_zoo\n"
        "align.crop(np.zeros((64, 64, 3), np.uint8), align.template(112) / 3 + 5, 112)\n"  # a first face
        "print(sorted(n for n in ('insightface.app', 'insightface.thirdparty', 'scipy') if n in sys.modules))\n"
        "print(model_zoo.__name__, model_zoo.get_model.__module__)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split("\n")
    assert out[0] == "[]"
    assert out[1] == "insightface.model_zoo.model_zoo insightface.model_zoo.model_zoo"


@pytest.mark.parametrize("size", [112, 128])
def test_alignment_fits_the_same_transform_as_insightface(size: int) -> None:
    """The crops the recognizer and the swapper see are insightface's own, to within a thousandth of
    a pixel, for faces of any scale, angle and landmark noise (OpenCV's fit, not scikit-image's)."""
    from insightface.utils import face_align

    from runner_image import align

    rng = np.random.default_rng(size)
    worst = 0.0
    for _ in range(300):
        scale, angle = rng.uniform(0.3, 4.0), rng.uniform(-0.8, 0.8)
        rot = np.array([[np.cos(angle), -np.sin(angle)], [np.sin(angle), np.cos(angle)]]) * scale
        noise = rng.normal(0.0, rng.uniform(0.0, 6.0), (5, 2))
        kps = (face_align.arcface_dst @ rot.T + rng.uniform(-200, 600, 2) + noise).astype(np.float32)
        theirs = face_align.estimate_norm(kps, size)
        ours = align.estimate(kps, size)
        mapped = [kps @ m[:, :2].T + m[:, 2] for m in (theirs, ours)]
        worst = max(worst, float(np.abs(mapped[0] - mapped[1]).max()))
    assert worst < 1e-3
    image = rng.integers(0, 255, (480, 640, 3), dtype=np.uint8)
    crop, matrix = align.crop(image, kps, size)
    assert crop.shape == (size, size, 3) and matrix.shape == (2, 3)
