"""The 256-pixel face swappers (issue 20): ``face_swapper.model`` simswap_256, hyperswap_1a_256 and
ghost_256 in the job file and the manifest, their pixel boost (tiles of 256), weight, embedding
converter (simswap, ghost) and the runner's swap, on stand-in models made by code with the
publishers' contracts (tests/fixtures/standin_swappers.py). The pack side — ``models verify``,
refusals, licences, the converter at submit — is tests/unit/test_swapper_packs.py."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest

from contract import processors as registry
from contract.errors import ManifestError
from contract.manifest import Manifest
from contract.swapper import CONTRACTS, TEMPLATES, SwapperTuning
from controller.errors import JobFileError
from runner_image import align, faces, models, pixel_boost, processors, swap, swappers
from runner_image.errors import MissingInput
from tests.fixtures import photos
from tests.fixtures.standin_pack import build_pack
from tests.unit.test_face_enhancers import JOB, manifest

NEW = ("simswap_256", "hyperswap_1a_256", "ghost_256")


def parse(section: str) -> Any:
    from controller.job.files import parse_job_text

    return parse_job_text(f"{JOB}face_swapper: {section}\n", "job.yaml").face_swapper


# --- the job file and the manifest ---------------------------------------------------------------------


@pytest.mark.parametrize("model", NEW)
def test_each_model_is_accepted_and_runs_at_its_own_256_unless_told(model: str) -> None:
    assert (parse(f"{{model: {model}}}").model, parse(f"{{model: {model}}}").pixel_boost) == (model, 256)
    for boost in (256, 512, 1024):
        assert parse(f"{{model: {model}, pixel_boost: {boost}, weight: 0.5}}").pixel_boost == boost
    assert parse("{model: inswapper_128}").pixel_boost == 128  # inswapper's own, as before


@pytest.mark.parametrize("model", NEW)
def test_pixel_boost_128_is_refused_for_a_256_model_naming_the_field(model: str) -> None:
    with pytest.raises(JobFileError) as e:
        parse(f"{{model: {model}, pixel_boost: 128}}")
    assert e.value.field == "face_swapper.pixel_boost" and e.value.exit_code == 65
    assert e.value.reason == (
        f"128 is smaller than {model}'s own 256-pixel crop: choose 256, 512 or 1024 for {model}, got 128"
    )


@pytest.mark.parametrize("model", NEW)
def test_the_manifest_carries_the_model_and_a_missing_boost_reads_as_its_own(model: str) -> None:
    m = manifest(**SwapperTuning(model, weight=0.5).manifest_fields())
    data = json.loads(m.to_json())
    assert (data["swapper_model"], data["swapper_pixel_boost"]) == (model, 256)  # not the default: written
    assert Manifest.from_json(m.to_json()) == m
    del data["swapper_pixel_boost"]
    assert Manifest.from_dict(data).swapper_pixel_boost == 256
    with pytest.raises(ManifestError, match=f"swapper_pixel_boost 128 is smaller than {model}'s own"):
        Manifest.from_dict({**data, "swapper_pixel_boost": 128})


def test_the_contracts_record_facefusions_facts() -> None:
    sim, hyper, ghost = (CONTRACTS[m] for m in NEW)
    assert (sim.size, sim.template, sim.mean, sim.std) == (
        256,
        "arcface_112_v1",
        (0.485, 0.456, 0.406),
        (0.229, 0.224, 0.225),
    )
    assert (sim.converter, sim.source, sim.denormalise) == ("crossface_simswap", "converted_unit", False)
    assert (hyper.template, hyper.mean, hyper.converter, hyper.source, hyper.outputs) == (
        "arcface_128", (0.5, 0.5, 0.5), None, "unit", (1, 2)
    )  # fmt: skip
    assert (ghost.template, ghost.converter, ghost.source, ghost.denormalise) == (
        "arcface_112_v1", "crossface_ghost", "converted", True
    )  # fmt: skip
    assert ghost.files == ("ghost_1_256.onnx", "ghost_2_256.onnx", "ghost_3_256.onnx")
    # arcface_128 is insightface's 112 template centred in 128: what inswapper's align.template gives
    assert np.allclose(np.asarray(TEMPLATES["arcface_128"]) * 256, align.template(256), atol=1e-3)
    assert np.allclose(np.asarray(TEMPLATES["arcface_112_v1"][0]) * 112, (39.73, 51.138), atol=1e-4)


# --- the runner ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def packs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, models.Models]:
    out = {}
    for model in NEW:
        pack_dir = build_pack(tmp_path_factory.mktemp(model), enhancer=False, frame_enhancer=False, swapper=model)
        pack = models.verify_pack(pack_dir.parent, swapper=model)
        roles = registry.roles(["face_swapper"], swapper=model)
        out[model] = models.load_models(pack, ("cpu",), roles=roles, swapper_model=model)
    return out


@pytest.fixture(scope="module")
def images(tmp_path_factory: pytest.TempPathFactory) -> dict[str, np.ndarray]:
    d = tmp_path_factory.mktemp("photos")
    return {
        name: np.asarray(cv2.imread(str(make(d))))
        for name, make in (("astronaut", photos.astronaut), ("t1", photos.group))
    }


def sources(loaded: models.Models, image: np.ndarray) -> list[np.ndarray]:
    """Two different people of the group photo, as the identity step makes them."""
    found = faces.detect(loaded.detector, image)
    return [faces.identity([faces.embed(loaded.recognizer, image, [f])[0]]) for f in found[:2]]


def apply(loaded: models.Models, image: np.ndarray, identity: np.ndarray, model: str, **kw: Any) -> np.ndarray:
    frame = image.copy()
    found = faces.detect(loaded.detector, image)
    for step in processors.build(manifest(**SwapperTuning(model, **kw).manifest_fields()), loaded, identity):
        step.apply(frame, found, lambda stage, seconds: None)
    return frame


@pytest.mark.parametrize("model", NEW)
def test_a_job_swaps_the_face_only_and_two_sources_give_two_faces(
    packs: dict[str, models.Models], images: dict[str, np.ndarray], model: str
) -> None:
    loaded, image = packs[model], images["astronaut"]
    assert isinstance(loaded.swapper, swappers.SwapperModel) and loaded.swapper.contract.model == model
    one, two = (apply(loaded, image, s, model) for s in sources(loaded, images["t1"]))
    x1, y1, x2, y2 = photos.ASTRONAUT_FACE
    changed = np.abs(one.astype(int) - image.astype(int))
    assert changed[y1:y2, x1:x2].mean() > 5  # the face visibly changed
    assert np.abs(one.astype(int) - two.astype(int))[y1:y2, x1:x2].mean() > 2  # and depends on the source
    face = faces.detect(loaded.detector, image)[0]
    s = swappers.EmbeddingSwapper(loaded.swapper, sources(loaded, images["t1"])[0]).swap(image, face)
    assert s.crop.shape == (256, 256, 3)
    placed = swap.footprint(cv2.invertAffineTransform(s.matrix), 256, image.shape[1], image.shape[0])
    assert placed is not None
    outside = np.ones(image.shape[:2], bool)
    outside[placed[0].y0 : placed[0].y1, placed[0].x0 : placed[0].x1] = False
    assert outside.mean() > 0.5 and not changed[outside].any()  # nothing outside the face's crop


@pytest.mark.parametrize("model", NEW)
def test_the_crop_is_the_face_on_the_models_template(
    packs: dict[str, models.Models], images: dict[str, np.ndarray], model: str
) -> None:
    face = faces.detect(packs[model].detector, images["astronaut"])[0]
    points = np.asarray(CONTRACTS[model].points, np.float32)
    for boost in (256, 512):
        _, matrix = align.crop_onto(images["astronaut"], face.kps, points, boost)
        landed = np.c_[face.kps, np.ones(5)] @ matrix.T
        assert np.abs(landed - points * boost).max() < 0.06 * boost  # five points, four degrees of freedom


class Counting:
    """An onnxruntime session that counts its ``run`` calls and keeps the sources it was fed."""

    def __init__(self, session: Any) -> None:
        self._session = session
        self.calls = 0
        self.sources: list[np.ndarray] = []

    def run(self, outputs: Any, feed: dict[str, np.ndarray]) -> Any:
        self.calls += 1
        self.sources.append(np.array(feed["source"] if "source" in feed else feed["input"]))
        return self._session.run(outputs, feed)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._session, name)


@pytest.mark.parametrize("model", NEW)
@pytest.mark.parametrize(("boost", "calls"), [(256, 1), (512, 4), (1024, 16)])
def test_pixel_boost_calls_the_model_once_per_256_tile_of_each_face(
    packs: dict[str, models.Models], images: dict[str, np.ndarray], model: str, boost: int, calls: int
) -> None:
    loaded = packs[model]
    counted = Counting(loaded.swapper.session)
    wrapped = swappers.SwapperModel(loaded.swapper.contract, counted, loaded.swapper.converter)
    found = faces.detect(loaded.detector, images["t1"])
    assert len(found) >= 2
    swapper = swappers.EmbeddingSwapper(wrapped, sources(loaded, images["astronaut"])[0], pixel_boost=boost)
    processors.FaceSwapper(swapper, 0.05, 0.1).apply(images["t1"].copy(), found, lambda stage, seconds: None)
    assert counted.calls == calls * len(found)
    assert all(np.array_equal(s, counted.sources[0]) for s in counted.sources)  # one source per chunk
    # each tile is swapped as the model swaps a crop of its own size
    face, identity = found[0], sources(loaded, images["astronaut"])[0]
    boosted = swappers.EmbeddingSwapper(loaded.swapper, identity, pixel_boost=boost).swap(images["t1"], face)
    crop, _ = align.crop_onto(images["t1"], face.kps, np.asarray(CONTRACTS[model].points), boost)
    plain = swappers.EmbeddingSwapper(loaded.swapper, identity)
    k = boost // 256
    assert np.array_equal(
        pixel_boost.implode(boosted.crop, k)[k - 1],
        plain.run(pixel_boost.implode(crop, k)[k - 1], plain.source_of(identity)),
    )


@pytest.mark.parametrize("model", NEW)
def test_the_source_is_prepared_as_the_contract_says(packs: dict[str, models.Models], model: str) -> None:
    loaded = packs[model]
    identity = np.random.default_rng(1).normal(size=512).astype(np.float32)
    identity /= np.linalg.norm(identity)
    got = swappers.EmbeddingSwapper(loaded.swapper, identity).source_of(identity)
    assert got.shape == (1, 512) and got.dtype == np.float32
    if model == "hyperswap_1a_256":
        assert np.allclose(got[0], identity, atol=1e-6)  # the unit ArcFace embedding itself
        return
    converted = loaded.swapper.convert(identity)
    assert not np.allclose(converted[0] / np.linalg.norm(converted), identity, atol=0.1)  # converted: another space
    if model == "simswap_256":
        assert (
            np.allclose(got, converted / np.linalg.norm(converted), atol=1e-6) and abs(np.linalg.norm(got) - 1) < 1e-5
        )
    else:  # ghost: the converter's output as it comes
        assert np.allclose(got, converted, atol=1e-6) and np.linalg.norm(got) > 2
    # CrossFace normalises its input first: the scale of the ArcFace embedding does not matter
    assert np.allclose(loaded.swapper.convert(identity * 20), converted, atol=1e-5)


@pytest.mark.parametrize("model", NEW)
def test_a_weight_below_1_mixes_the_arcface_embeddings_before_the_converter(
    packs: dict[str, models.Models], images: dict[str, np.ndarray], model: str
) -> None:
    loaded, image = packs[model], images["astronaut"]
    face = faces.detect(loaded.detector, image)[0]
    own = faces.embed(loaded.recognizer, image, [face])[0]
    identity = sources(loaded, images["t1"])[0]
    mixed = swappers.EmbeddingSwapper(loaded.swapper, identity, weight=0.0).swap(image, face, own)
    itself = swappers.EmbeddingSwapper(loaded.swapper, own).swap(image, face)
    assert np.abs(mixed.crop.astype(int) - itself.crop.astype(int)).max() <= 1  # weight 0: the target's own
    half = swappers.EmbeddingSwapper(loaded.swapper, identity, weight=0.5)
    assert half.needs_target
    want = half.source_of(pixel_boost.mixed_identity(identity, own, 0.5))
    counted = Counting(loaded.swapper.session)
    wrapped = swappers.EmbeddingSwapper(
        swappers.SwapperModel(loaded.swapper.contract, counted, loaded.swapper.converter), identity, weight=0.5
    )
    wrapped.swap(image, face, own)
    assert np.allclose(counted.sources[-1], want, atol=1e-6)
    full = apply(loaded, image, identity, model)
    part = apply(loaded, image, identity, model, weight=0.5)
    x1, y1, x2, y2 = photos.ASTRONAUT_FACE
    assert np.abs(full.astype(int) - part.astype(int))[y1:y2, x1:x2].mean() > 0.5


def test_the_factory_refuses_a_loaded_swapper_other_than_the_manifests(
    packs: dict[str, models.Models],
) -> None:
    identity = np.ones(512, np.float32) / np.sqrt(512)
    with pytest.raises(MissingInput, match="not the manifest's ghost_256"):
        processors.build(manifest(swapper_model="ghost_256", swapper_pixel_boost=256), packs["simswap_256"], identity)
    with pytest.raises(MissingInput, match="not the manifest's inswapper_128"):
        processors.build(manifest(), packs["hyperswap_1a_256"], identity)


def test_a_boost_that_is_not_a_multiple_of_256_is_refused_by_the_swapper_too(packs: dict[str, models.Models]) -> None:
    with pytest.raises(ValueError, match="not a multiple of simswap_256's 256"):
        swappers.EmbeddingSwapper(packs["simswap_256"].swapper, np.ones(512, np.float32), pixel_boost=128)


def test_hyperswaps_mask_output_is_there_and_left_unused(packs: dict[str, models.Models]) -> None:
    outputs = [o.name for o in packs["hyperswap_1a_256"].swapper.session.get_outputs()]
    assert outputs == ["output", "mask"]


def test_the_default_pack_is_unchanged_by_the_new_models(tmp_path: Path) -> None:
    import yaml

    spec = yaml.safe_load(build_pack(tmp_path / "p").read_text())
    assert [e["role"] for e in spec["files"].values()].count("swapper") == 1
    assert "inswapper_128.onnx" in spec["files"] and "swapper_converter" not in {
        e["role"] for e in spec["files"].values()
    }
