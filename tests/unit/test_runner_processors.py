"""Processors in order (swapper, enhancer), the fp16 swapper, mask/blend settings, and output that
matches insightface's own paste-back (PSNR over each face box) — real models from the stand-in pack."""

from __future__ import annotations

import warnings
from pathlib import Path

import cv2
import numpy as np
import pytest

from contract.manifest import Item
from contract.results import ItemStatus
from runner_image import faces, models, pipeline, processors, swap
from runner_image.volume import DataRoot
from tests.builders import manifest as _manifest
from tests.fixtures import photos
from tests.fixtures.standin_pack import build_pack

ALL = ("detector", "recognizer", "swapper", "enhancer")


@pytest.fixture(scope="module")
def loaded(tmp_path_factory: pytest.TempPathFactory) -> models.Models:
    pack_dir = build_pack(tmp_path_factory.mktemp("pack")).parent
    return models.load_models(models.verify_pack(pack_dir, ("face_swapper", "face_enhancer")), ("cpu",), roles=ALL)


@pytest.fixture(scope="module")
def images(tmp_path_factory: pytest.TempPathFactory) -> dict[str, np.ndarray]:
    d = tmp_path_factory.mktemp("photos")
    out = {}
    for name, make in (("astronaut", photos.astronaut), ("t1", photos.group)):
        image = cv2.imread(str(make(d)))
        assert image is not None
        out[name] = np.asarray(image)
    return out


def _identity(loaded: models.Models, image: np.ndarray) -> np.ndarray:
    found = faces.detect(loaded.detector, image)
    return faces.identity([faces.embed(loaded.recognizer, image, found[:1])[0]])


def _apply(
    loaded: models.Models, image: np.ndarray, identity: np.ndarray, on: np.ndarray | None = None, **kw: object
) -> np.ndarray:
    """The manifest's processors on ``image``, for the faces detected on ``on`` (default: the image)."""
    frame = image.copy()
    found = faces.detect(loaded.detector, image if on is None else on)
    for p in processors.build(_manifest(**kw), loaded, identity):
        p.apply(frame, found, lambda stage, seconds: None)
    return frame


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = float(np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2))
    return float("inf") if mse == 0 else 10 * np.log10(255.0**2 / mse)


@pytest.mark.parametrize("photo", ["astronaut", "t1"])
def test_output_matches_insightface_paste_back_psnr_30_over_each_face(
    loaded: models.Models, images: dict[str, np.ndarray], photo: str
) -> None:
    from insightface.app.common import Face as InsightFace

    image = images[photo]
    identity = _identity(loaded, images["astronaut"])
    ours = _apply(loaded, image, identity)
    reference = image.copy()
    found = faces.detect(loaded.detector, image)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for f in found:  # the plain insightface loop: each face pasted over the whole frame in turn
            source = InsightFace(embedding=identity)
            reference = loaded.swapper.get(reference, InsightFace(kps=f.kps), source, paste_back=True)
    assert np.abs(ours.astype(int) - image.astype(int)).mean() > 0.5
    for f in found:
        x1, y1, x2, y2 = (int(v) for v in f.box)
        assert psnr(ours[y1:y2, x1:x2], reference[y1:y2, x1:x2]) >= 30.0, f.box


def test_enhancer_runs_after_the_swapper_in_the_listed_order(
    loaded: models.Models, images: dict[str, np.ndarray]
) -> None:
    image, identity = images["astronaut"], _identity(loaded, images["t1"])
    swapped = _apply(loaded, image, identity, processors=("face_swapper",))
    both = _apply(loaded, image, identity, processors=("face_swapper", "face_enhancer"))
    # the same as enhancing the swapped frame ...
    enhanced_after = _apply(loaded, swapped, identity, on=image, processors=("face_enhancer",))
    assert np.array_equal(both, enhanced_after)
    # ... and not what the other order gives
    reverse = _apply(loaded, image, identity, processors=("face_enhancer", "face_swapper"))
    x1, y1, x2, y2 = photos.ASTRONAUT_FACE
    assert np.abs(both.astype(int) - swapped.astype(int))[y1:y2, x1:x2].mean() > 3
    assert np.abs(both.astype(int) - reverse.astype(int))[y1:y2, x1:x2].mean() > 1


def test_enhancer_blend_zero_changes_nothing_and_one_more_than_default(
    loaded: models.Models, images: dict[str, np.ndarray]
) -> None:
    image, identity = images["astronaut"], _identity(loaded, images["t1"])
    x1, y1, x2, y2 = photos.ASTRONAUT_FACE
    none = _apply(loaded, image, identity, processors=("face_enhancer",), enhancer_blend=0.0)
    assert np.array_equal(none, image)
    full = _apply(loaded, image, identity, processors=("face_enhancer",), enhancer_blend=1.0)
    default = _apply(loaded, image, identity, processors=("face_enhancer",))
    d_full = np.abs(full.astype(int) - image.astype(int))[y1:y2, x1:x2].mean()
    d_default = np.abs(default.astype(int) - image.astype(int))[y1:y2, x1:x2].mean()
    assert d_full > d_default > 2


def test_mask_settings_change_the_blend_edge(loaded: models.Models, images: dict[str, np.ndarray]) -> None:
    image, identity = images["t1"], _identity(loaded, images["astronaut"])
    default = _apply(loaded, image, identity)
    tight = _apply(loaded, image, identity, mask_padding=0.3)
    hard = _apply(loaded, image, identity, mask_feather=0.0)
    changed_default = np.any(default != image, axis=2).sum()
    assert np.any(tight != image, axis=2).sum() < 0.8 * changed_default  # the edge pulled further in
    assert not np.array_equal(hard, default)


def test_fp16_swapper_takes_and_gives_float16(tmp_path: Path, images: dict[str, np.ndarray]) -> None:
    pack_dir = build_pack(tmp_path / "fp16", fp16=True, enhancer=False).parent
    fp16 = models.load_models(models.verify_pack(pack_dir), ("cpu",))
    assert fp16.swapper.session.get_inputs()[0].type == "tensor(float16)"
    identity = _identity(fp16, images["astronaut"])
    out16 = _apply(fp16, images["t1"], identity)
    pack32 = build_pack(tmp_path / "fp32", enhancer=False).parent
    fp32 = models.load_models(models.verify_pack(pack32), ("cpu",))
    out32 = _apply(fp32, images["t1"], identity)
    assert np.abs(out16.astype(int) - images["t1"].astype(int)).mean() > 0.5
    assert psnr(out16, out32) > 35


def test_paste_back_defaults_are_insightfaces_sizes() -> None:
    assert swap.scaled(140, 0.1) == 14 and swap.scaled(60, 0.1) == 10  # max(size // 10, 10)
    assert swap.scaled(140, 0.05) == 7 and swap.scaled(60, 0.05) == 5  # max(size // 20, 5)
    assert swap.scaled(500, 0.0) == 0


def test_pipeline_runs_items_concurrently_with_the_same_results(
    loaded: models.Models, tmp_path: Path, images: dict[str, np.ndarray]
) -> None:
    (tmp_path / "in").mkdir()
    names = []
    for i in range(4):
        name = f"p{i}.png"
        cv2.imwrite(str(tmp_path / "in" / name), images["t1" if i % 2 else "astronaut"])
        names.append(name)
    items = tuple(Item(f"i{i:06d}", f"/data/in/{n}", f"/data/out/{n}") for i, n in enumerate(names))
    manifest = _manifest(items=items, overwrite=True)  # the second pass replaces the first's outputs
    identity = _identity(loaded, images["astronaut"])

    def engine() -> pipeline.Engine:
        procs = tuple(processors.build(manifest, loaded, identity))
        return pipeline.Engine(
            DataRoot(tmp_path), manifest, loaded.detector, loaded.recognizer, procs, 1, None, loaded.provider
        )

    serial: dict[str, bytes] = {}
    got: list[str] = []
    pipeline.run_items(engine(), items, 1, lambda r: got.append(r.item) if r.status is ItemStatus.OK else None)
    for n in names:
        serial[n] = (tmp_path / "out" / n).read_bytes()
    got.clear()
    pipeline.run_items(engine(), items, 3, lambda r: got.append(r.item) if r.status is ItemStatus.OK else None)
    assert sorted(got) == [i.id for i in items]
    for n in names:
        assert (tmp_path / "out" / n).read_bytes() == serial[n]
