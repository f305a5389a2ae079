"""The face swapper's settings (issue 20): ``face_swapper: {model, pixel_boost, weight}`` in the job
file, the manifest's ``swapper_model``/``swapper_pixel_boost``/``swapper_weight``, the runner's pixel
boost (the crop split into interleaved 128-pixel tiles, one model call each) and weight (the source
identity mixed with the target face's own), and the submit-time check of ``face_swapper.model``
against the pack's ``model:`` — on the stand-in pack's inswapper (tests/fixtures/standin_pack.py)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import cv2
import numpy as np
import pytest

from contract.errors import ManifestError
from contract.manifest import Manifest
from contract.swapper import SwapperTuning
from controller.errors import JobFileError
from controller.job.plan import chunk_manifests
from controller.run.jobs import manifest_settings
from runner_image import align, faces, models, pixel_boost, processors, swap
from runner_image.faces import Face
from tests.builders import manifest
from tests.fixtures import photos
from tests.fixtures.standin_pack import build_pack
from tests.unit.test_face_enhancers import JOB, submit

# --- the job file ------------------------------------------------------------------------------------


def parse(section: str) -> Any:
    from controller.job.files import parse_job_text

    return parse_job_text(f"{JOB}face_swapper: {section}\n", "job.yaml")


def test_the_defaults_are_inswapper_128_boost_128_and_weight_1() -> None:
    from controller.job.files import parse_job_text

    sw = parse_job_text(JOB, "job.yaml").face_swapper
    assert (sw.model, sw.pixel_boost, sw.weight) == ("inswapper_128", 128, 1.0)


def test_the_design_example_and_every_choice_are_accepted() -> None:
    sw = parse("{model: inswapper_128, pixel_boost: 128, weight: 1.0}").face_swapper
    assert (sw.model, sw.pixel_boost, sw.weight) == ("inswapper_128", 128, 1.0)
    for boost in (128, 256, 512, 1024):
        for w in (0, 0.35, 1):
            sw = parse(f"{{model: inswapper_128_fp16, pixel_boost: {boost}, weight: {w}}}").face_swapper
            assert (sw.model, sw.pixel_boost, sw.weight) == ("inswapper_128_fp16", boost, float(w))
            assert isinstance(sw.weight, float)


@pytest.mark.parametrize("model", ["simswap_512", "hyperswap_1b_256", "ghost_1_256", "INSWAPPER_128", "", 3, None])
def test_another_model_is_refused_naming_the_field_and_the_choices(model: object) -> None:
    with pytest.raises(JobFileError) as e:
        parse(json.dumps({"model": model}))
    assert e.value.field == "face_swapper.model" and e.value.exit_code == 65
    assert "unknown face_swapper model" in e.value.reason
    assert "choose from inswapper_128, inswapper_128_fp16, simswap_256, hyperswap_1a_256, ghost_256" in e.value.reason


@pytest.mark.parametrize("boost", [64, 200, 384, 2048, "256", "256x256", True, 256.0])
def test_a_pixel_boost_outside_the_choices_is_refused_naming_the_field_and_the_choices(boost: object) -> None:
    with pytest.raises(JobFileError) as e:
        parse(json.dumps({"pixel_boost": boost}))
    assert e.value.field == "face_swapper.pixel_boost"
    assert "must be one of 128, 256, 512, 1024" in e.value.reason


@pytest.mark.parametrize("weight", [-0.1, 1.5, "0.5", True, None, ".nan", ".inf"])
def test_a_weight_outside_0_1_is_refused_naming_the_field(weight: object) -> None:
    text = weight if isinstance(weight, str) and weight.startswith(".") else json.dumps(weight)
    with pytest.raises(JobFileError) as e:
        parse(f"{{weight: {text}}}")
    assert e.value.field == "face_swapper.weight"
    assert "must be a number in [0, 1]" in e.value.reason


def test_an_unknown_key_is_refused_with_a_suggestion() -> None:
    with pytest.raises(JobFileError) as e:
        parse("{pixel_bost: 256}")
    assert e.value.field == "face_swapper.pixel_bost" and "did you mean 'pixel_boost'" in e.value.reason


# --- the manifest ------------------------------------------------------------------------------------


def test_the_manifest_round_trips_model_boost_and_weight() -> None:
    m = manifest(swapper_model="inswapper_128_fp16", swapper_pixel_boost=512, swapper_weight=0.25)
    data = json.loads(m.to_json())
    assert (data["swapper_model"], data["swapper_pixel_boost"], data["swapper_weight"]) == (
        "inswapper_128_fp16",
        512,
        0.25,
    )
    back = Manifest.from_json(m.to_json())
    assert back == m and (back.swapper_model, back.swapper_pixel_boost, back.swapper_weight) == (
        "inswapper_128_fp16",
        512,
        0.25,
    )


def test_defaults_are_left_out_and_an_old_manifest_reads_as_the_defaults() -> None:
    data = json.loads(manifest().to_json())
    assert not {"swapper_model", "swapper_pixel_boost", "swapper_weight"} & set(data)  # older runners: unchanged
    old = Manifest.from_dict(data)
    assert (old.swapper_model, old.swapper_pixel_boost, old.swapper_weight) == ("inswapper_128", 128, 1.0)
    assert Manifest.from_dict({**data, "swapper_weight": 0}).swapper_weight == 0.0  # an integer weight: a float


@pytest.mark.parametrize(
    ("field", "value", "words"),
    [
        ("swapper_model", "simswap_512", "swapper_model must be one of inswapper_128, inswapper_128_fp16, simswap_256"),
        ("swapper_model", 3, "swapper_model must be a string"),
        ("swapper_pixel_boost", 300, "swapper_pixel_boost must be one of 128, 256, 512, 1024"),
        ("swapper_pixel_boost", 2048, "swapper_pixel_boost must be one of 128, 256, 512, 1024"),
        ("swapper_pixel_boost", 256.0, "swapper_pixel_boost must be an integer"),
        ("swapper_pixel_boost", True, "swapper_pixel_boost must be an integer"),
        ("swapper_weight", 1.5, "swapper_weight must be a number in [0, 1]"),
        ("swapper_weight", -0.01, "swapper_weight must be a number in [0, 1]"),
        ("swapper_weight", "0.5", "swapper_weight must be a finite number"),
        ("swapper_weight", True, "swapper_weight must be a finite number"),
    ],
)
def test_a_bad_swapper_field_in_a_manifest_is_refused_naming_it(field: str, value: object, words: str) -> None:
    data = json.loads(manifest().to_json())
    data[field] = value
    with pytest.raises(ManifestError) as e:
        Manifest.from_dict(data)
    assert words in str(e.value)


def test_a_manifest_built_in_code_is_range_checked_too() -> None:
    with pytest.raises(ManifestError, match="swapper_pixel_boost must be one of"):
        manifest(swapper_pixel_boost=192)
    with pytest.raises(ManifestError, match=r"swapper_weight must be a number in \[0, 1\]"):
        manifest(swapper_weight=float("nan"))


# --- implode / explode ---------------------------------------------------------------------------------


@pytest.mark.parametrize("k", [1, 2, 4, 8])
def test_explode_undoes_implode_and_tile_i_j_is_every_kth_pixel(k: int) -> None:
    rng = np.random.default_rng(k)
    crop = rng.integers(0, 256, size=(128 * k, 128 * k, 3), dtype=np.uint8)
    tiles = pixel_boost.implode(crop, k)
    assert tiles.shape == (k * k, 128, 128, 3)
    for i in range(k):
        for j in range(k):
            assert np.array_equal(tiles[i * k + j], crop[i::k, j::k])
    assert np.array_equal(pixel_boost.explode(tiles, k), crop)


def test_a_crop_that_does_not_split_is_refused() -> None:
    with pytest.raises(ValueError):
        pixel_boost.implode(np.zeros((300, 300, 3), np.uint8), 8)
    with pytest.raises(ValueError):
        pixel_boost.explode(np.zeros((3, 128, 128, 3), np.uint8), 2)


# --- the runner ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def loaded(tmp_path_factory: pytest.TempPathFactory) -> models.Models:
    pack_dir = build_pack(tmp_path_factory.mktemp("pack"), enhancer=False, frame_enhancer=False).parent
    return models.load_models(models.verify_pack(pack_dir), ("cpu",))


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


class Counting:
    """An onnxruntime session that counts its ``run`` calls and keeps the latents it was fed."""

    def __init__(self, session: Any) -> None:
        self._session = session
        self.calls = 0
        self.latents: list[np.ndarray] = []

    def run(self, outputs: Any, feed: dict[str, np.ndarray]) -> Any:
        self.calls += 1
        self.latents.append(np.array(feed[self._session.get_inputs()[1].name]))
        return self._session.run(outputs, feed)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._session, name)


def counting(loaded: models.Models) -> tuple[Any, Counting]:
    session = Counting(loaded.swapper.session)
    return SimpleNamespace(session=session, input_size=loaded.swapper.input_size, emap=loaded.swapper.emap), session


def _apply(loaded: models.Models, image: np.ndarray, identity: np.ndarray, **kw: object) -> np.ndarray:
    frame = image.copy()
    found = faces.detect(loaded.detector, image)
    for p in processors.build(manifest(**kw), loaded, identity):
        p.apply(frame, found, lambda stage, seconds: None)
    return frame


@pytest.mark.parametrize(("boost", "calls"), [(128, 1), (256, 4), (512, 16)])
def test_pixel_boost_calls_the_model_once_per_tile_of_each_face_with_the_same_latent(
    loaded: models.Models, images: dict[str, np.ndarray], boost: int, calls: int
) -> None:
    model, session = counting(loaded)
    found = faces.detect(loaded.detector, images["t1"])
    assert len(found) >= 2
    swapper = swap.Swapper(model, _identity(loaded, images["astronaut"]), pixel_boost=boost)
    frame = images["t1"].copy()
    processors.FaceSwapper(swapper, 0.05, 0.1).apply(frame, found, lambda stage, seconds: None)
    assert session.calls == calls * len(found)
    assert all(np.array_equal(latent, session.latents[0]) for latent in session.latents)
    one = swapper.swap(images["t1"], found[0])
    assert one.crop.shape == (boost, boost, 3)  # pasted back at the boost's size


def test_a_tile_is_swapped_as_the_model_swaps_a_crop_of_its_own_size(
    loaded: models.Models, images: dict[str, np.ndarray]
) -> None:
    # pixel boost runs the model on each tile exactly as on a 128 crop: the boosted result's tile (i, j)
    # is the model's output for the boosted crop's tile (i, j)
    identity = _identity(loaded, images["t1"])
    face = faces.detect(loaded.detector, images["astronaut"])[0]
    plain = swap.Swapper(loaded.swapper, identity)
    boosted = swap.Swapper(loaded.swapper, identity, pixel_boost=256).swap(images["astronaut"], face)
    crop, matrix = align.crop(images["astronaut"], face.kps, 256)
    assert np.allclose(boosted.matrix, matrix)
    tiles = pixel_boost.implode(crop, 2)
    for t in range(4):
        assert np.array_equal(pixel_boost.implode(boosted.crop, 2)[t], plain._run(tiles[t], plain._latent))


def test_pixel_boost_256_adds_detail_to_the_face_and_leaves_the_rest_of_the_photo_alone(
    loaded: models.Models, images: dict[str, np.ndarray]
) -> None:
    image, identity = images["astronaut"], _identity(loaded, images["t1"])
    at128 = _apply(loaded, image, identity)
    at256 = _apply(loaded, image, identity, swapper_pixel_boost=256)
    x1, y1, x2, y2 = photos.ASTRONAUT_FACE
    assert np.abs(at256.astype(int) - at128.astype(int))[y1:y2, x1:x2].mean() > 1  # the face differs

    def detail(im: np.ndarray) -> float:
        return float(cv2.Laplacian(cv2.cvtColor(im[y1:y2, x1:x2], cv2.COLOR_BGR2GRAY), cv2.CV_64F).var())

    assert detail(at256) > 1.5 * detail(at128)  # sharper: the 128 swap is upsampled back to the face
    # outside where either crop lands (its footprint, with the blur's margin) nothing changed
    face = faces.detect(loaded.detector, image)[0]
    outside = np.ones(image.shape[:2], bool)
    for boost in (128, 256):
        s = swap.Swapper(loaded.swapper, identity, pixel_boost=boost).swap(image, face)
        placed = swap.footprint(cv2.invertAffineTransform(s.matrix), boost, image.shape[1], image.shape[0])
        assert placed is not None
        r = placed[0]
        outside[r.y0 : r.y1, r.x0 : r.x1] = False
    assert outside.mean() > 0.5
    assert np.array_equal(at256[outside], image[outside]) and np.array_equal(at128[outside], image[outside])


def test_the_fp16_model_runs_boosted_too(tmp_path: Path, loaded: models.Models, images: dict[str, np.ndarray]) -> None:
    fp16 = models.load_models(models.verify_pack(build_pack(tmp_path, fp16=True, enhancer=False).parent), ("cpu",))
    identity = _identity(loaded, images["t1"])
    out16 = _apply(fp16, images["astronaut"], identity, swapper_pixel_boost=256, swapper_weight=0.5)
    out32 = _apply(loaded, images["astronaut"], identity, swapper_pixel_boost=256, swapper_weight=0.5)
    assert np.abs(out16.astype(int) - out32.astype(int)).mean() < 0.5


def test_weight_0_leaves_the_face_closer_to_the_targets_own_identity_than_weight_1(
    loaded: models.Models, images: dict[str, np.ndarray]
) -> None:
    image, identity = images["astronaut"], _identity(loaded, images["t1"])
    found = faces.detect(loaded.detector, image)
    own = faces.embed(loaded.recognizer, image, found)[0]

    def closeness(weight: float) -> float:
        out = _apply(loaded, image, identity, swapper_weight=weight)
        return float(faces.embed(loaded.recognizer, out, found)[0] @ own)

    w0, w05, w1 = closeness(0.0), closeness(0.5), closeness(1.0)
    assert w0 > w05 > w1
    # weight 0 swaps in the target face's own identity: as a job whose source is that face
    face = found[0]
    mixed = swap.Swapper(loaded.swapper, identity, weight=0.0).swap(image, face, own)
    itself = swap.Swapper(loaded.swapper, own).swap(image, face)
    assert np.abs(mixed.crop.astype(int) - itself.crop.astype(int)).max() <= 1


def test_a_weight_below_1_embeds_the_targets_in_one_run_and_times_it_as_embed(
    loaded: models.Models, images: dict[str, np.ndarray]
) -> None:
    found = faces.detect(loaded.detector, images["t1"])
    identity = _identity(loaded, images["astronaut"])
    model, session = counting(loaded)
    stages: dict[str, float] = {}
    swapper = swap.Swapper(model, identity, weight=0.5)
    step = processors.FaceSwapper(swapper, 0.05, 0.1, recognizer=loaded.recognizer)
    step.apply(images["t1"].copy(), found, lambda stage, s: stages.__setitem__(stage, stages.get(stage, 0) + s))
    assert set(stages) == {"embed", "swap", "paste"} and session.calls == len(found)
    assert len({latent.tobytes() for latent in session.latents}) == len(found)  # each face its own mix
    stages.clear()
    default = processors.FaceSwapper(swap.Swapper(model, identity), 0.05, 0.1, recognizer=loaded.recognizer)
    default.apply(images["t1"].copy(), found, lambda stage, s: stages.__setitem__(stage, s))
    assert set(stages) == {"swap", "paste"}  # weight 1: no embedding run, as before


def test_mixed_identity_is_the_normalised_blend_of_the_two_embeddings() -> None:
    rng = np.random.default_rng(7)
    src, tgt = rng.normal(size=512).astype(np.float32), rng.normal(size=512).astype(np.float32)
    unit_src, unit_tgt = src / np.linalg.norm(src), tgt / np.linalg.norm(tgt)
    for w in (0.0, 0.3, 1.0):
        want = unit_tgt * (1 - w) + unit_src * w
        got = pixel_boost.mixed_identity(src, tgt, w)
        assert np.allclose(got[0], want / np.linalg.norm(want), atol=1e-6)
    assert np.allclose(pixel_boost.mixed_identity(src, -src, 0.5), unit_src)  # opposite: nothing to blend


def today(model: Any, identity: np.ndarray, image: np.ndarray, face: Face) -> swap.Swapped:
    """The swap as it was before pixel boost and weight (runner_image/swap.py at 6f412f8), verbatim."""
    session = model.session
    inputs = session.get_inputs()
    names = [i.name for i in inputs]
    output = session.get_outputs()[0].name
    size = int(model.input_size[0])
    dtypes = [np.float16 if i.type == "tensor(float16)" else np.float32 for i in inputs]
    emap = np.asarray(model.emap, dtype=np.float32)
    latent = np.asarray(identity, dtype=np.float32).reshape(1, -1)
    latent = latent / np.linalg.norm(latent)
    latent = latent @ emap
    latent = (latent / np.linalg.norm(latent)).astype(dtypes[1])
    crop, matrix = align.crop(image, face.kps, size)
    blob = cv2.dnn.blobFromImage(crop, 1.0 / 255.0, (size, size), (0.0, 0.0, 0.0), swapRB=True)
    feed = {names[0]: blob.astype(dtypes[0]), names[1]: latent}
    pred = np.asarray(session.run([output], feed)[0], dtype=np.float32)
    fake = np.clip(255 * pred[0].transpose(1, 2, 0), 0, 255).astype(np.uint8)[:, :, ::-1]
    return swap.Swapped(crop=np.ascontiguousarray(fake), matrix=np.asarray(matrix, dtype=np.float64))


@pytest.mark.parametrize("photo", ["astronaut", "t1"])
def test_the_defaults_reproduce_todays_output_bit_for_bit(
    loaded: models.Models, images: dict[str, np.ndarray], photo: str
) -> None:
    image, identity = images[photo], _identity(loaded, images["t1" if photo == "astronaut" else "astronaut"])
    found = faces.detect(loaded.detector, image)
    expected = image.copy()
    swapped = [today(loaded.swapper, identity, image, f) for f in found]
    for s in swapped:
        swap.paste_back(expected, s)
    for kw in ({}, {"swapper_model": "inswapper_128", "swapper_pixel_boost": 128, "swapper_weight": 1.0}):
        assert np.array_equal(_apply(loaded, image, identity, **kw), expected), kw
    ours = swap.Swapper(loaded.swapper, identity)
    for f, s in zip(found, swapped, strict=True):
        got = ours.swap(image, f, faces.embed(loaded.recognizer, image, [f])[0])  # weight 1: the target unused
        assert np.array_equal(got.crop, s.crop) and np.array_equal(got.matrix, s.matrix)


# --- submit: face_swapper.model against the pack's model:, and the manifests ------------------------------

SHA = "0" * 64


def pack_files(model: str | None) -> dict[str, Any]:
    files: dict[str, Any] = {
        "det_10g.onnx": {"role": "detector", "sha256": SHA},
        "w600k_r50.onnx": {"role": "recognizer", "sha256": SHA},
        "inswapper_128_fp16.onnx": {"role": "swapper", "sha256": SHA},
    }
    if model is not None:
        files["inswapper_128_fp16.onnx"]["model"] = model
    return files


def test_a_pack_recording_another_swapper_model_is_refused_at_submit_naming_both(tmp_path: Path) -> None:
    with pytest.raises(JobFileError) as e:
        submit(tmp_path, pack_files("inswapper_128_fp16"), "")  # the job's model: the default, inswapper_128
    assert e.value.field == "face_swapper.model" and e.value.exit_code == 65
    assert e.value.reason == (
        "the pack's swapper is inswapper_128_fp16.onnx (inswapper_128_fp16 in models/default/pack.yaml), "
        "not inswapper_128"
    )
    assert not (tmp_path / "root" / "runs").exists()


def test_the_packs_own_model_or_none_recorded_is_accepted_and_the_settings_reach_every_manifest(
    tmp_path: Path,
) -> None:
    named = "face_swapper: {model: inswapper_128_fp16, pixel_boost: 512, weight: 0.6}\n"
    ((config, job),) = submit(tmp_path / "a", pack_files("inswapper_128_fp16"), named)
    settings = manifest_settings(config, job)
    assert settings.swapper == SwapperTuning("inswapper_128_fp16", 512, 0.6)
    for m in chunk_manifests(job.plan, settings).values():
        back = Manifest.from_json(m.to_json())
        assert (back.swapper_model, back.swapper_pixel_boost, back.swapper_weight) == ("inswapper_128_fp16", 512, 0.6)
    assert len(submit(tmp_path / "b", pack_files(None), "")) == 1  # no model: recorded: taken as it is


def test_jobs_with_other_face_swapper_settings_do_not_pack_together(tmp_path: Path) -> None:
    from controller.job.files import parse_job_text
    from controller.serve.packing import pack_key
    from tests.builders import JPEG
    from tests.unit.test_packing import ON, _job

    files = {"in/0.jpg": JPEG, "faces/me.jpg": JPEG}
    one = _job(tmp_path, "one", "source: faces/me.jpg\ntargets: [in/0.jpg]\noutput: o/{name}\n", files)
    base = "name: x\nproviders: [cpu]\nsource: faces/me.jpg\ntargets: [in/0.jpg]\noutput: o/{name}\n"
    same = parse_job_text(base + "face_swapper: {model: inswapper_128, pixel_boost: 128, weight: 1}\n", "x")
    assert pack_key(dataclasses.replace(one, spec=same), ON, "img") == pack_key(one, ON, "img")
    for extra in ("{pixel_boost: 256}", "{weight: 0.5}", "{model: inswapper_128_fp16}"):
        spec = parse_job_text(f"{base}face_swapper: {extra}\n", "x")
        assert pack_key(dataclasses.replace(one, spec=spec), ON, "img") != pack_key(one, ON, "img"), extra
