"""Photo output quality and scale (job file ``photo: {quality, scale}``, contract/photo.py,
runner_image/media.py ``encode_output``): the job file's refusals, the manifest's fields (left out at
their defaults, range-checked), every chunk manifest carrying the job's, and through real chunks on
the stand-in pack: JPEG quality, scale on a JPEG and on a PNG with alpha, after a frame enhancer,
``no_face: copy`` byte for byte only at the input's size, and the defaults giving today's bytes."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest

from contract.errors import ManifestError
from contract.manifest import FaceSelection, Manifest, NoFacePolicy
from contract.photo import PhotoTuning, scaled_size
from contract.results import ItemStatus
from controller.errors import JobFileError
from controller.job.files import parse_job_text
from controller.job.plan import ManifestSettings, TargetRef, chunk_manifests, make_plan
from controller.job.settings import PhotoSettings
from runner_image import media
from tests.fixtures import photos
from tests.fixtures.standin_pack import build_pack
from tests.unit.test_runner_chunk import JOB, results, run, write_manifest
from tests.unit.test_selector import manifest

# ------------------------------------------------------------------------------------------ job file

JOB_TEXT = "name: j\nsource: faces/star.jpg\ntargets: [crowd/*.jpg]\noutput: out/{stem}{ext}\n"


def test_the_default_photo_section_is_quality_95_scale_1() -> None:
    spec = parse_job_text(JOB_TEXT, "job.yaml")
    assert spec.photo == PhotoSettings(95, 1.0)
    given = parse_job_text(JOB_TEXT + "photo: {quality: 40, scale: 2}\n", "job.yaml").photo
    assert (given.quality, given.scale) == (40, 2.0) and isinstance(given.scale, float)
    assert parse_job_text(JOB_TEXT + "photo: {scale: 0.25}\n", "job.yaml").photo.scale == 0.25
    assert parse_job_text(JOB_TEXT + "photo: {quality: 1, scale: 4}\n", "job.yaml").photo.quality == 1


@pytest.mark.parametrize(
    ("value", "field", "words"),
    [
        ("{quality: 0}", "photo.quality", "integer from 1 to 100"),
        ("{quality: 101}", "photo.quality", "integer from 1 to 100"),
        ("{quality: 90.5}", "photo.quality", "integer from 1 to 100"),
        ("{quality: true}", "photo.quality", "integer from 1 to 100"),
        ("{quality: high}", "photo.quality", "integer from 1 to 100"),
        ("{scale: 0.2}", "photo.scale", "number in [0.25, 4]"),
        ("{scale: 4.5}", "photo.scale", "number in [0.25, 4]"),
        ("{scale: 0}", "photo.scale", "number in [0.25, 4]"),
        ("{scale: .nan}", "photo.scale", "number in [0.25, 4]"),
        ("{scale: '2'}", "photo.scale", "number in [0.25, 4]"),
        ("{sclae: 2}", "photo.sclae", "scale"),
        ("95", "photo", "must be a mapping"),
    ],
)
def test_job_file_refusals_name_the_field(value: str, field: str, words: str) -> None:
    with pytest.raises(JobFileError) as e:
        parse_job_text(JOB_TEXT + f"photo: {value}\n", "job.yaml")
    assert e.value.field == field and words in e.value.reason, str(e.value)
    assert e.value.exit_code == 65


# -------------------------------------------------------------------------------------------- manifest


def test_the_manifest_round_trips_the_photo_fields_and_leaves_defaults_out() -> None:
    plain = manifest()
    assert "photo_" not in plain.to_json()  # as older runners know manifests
    assert (plain.photo_quality, plain.photo_scale) == (95, 1.0)
    old = json.loads(plain.to_json())  # an older controller's manifest reads as today's outputs
    assert Manifest.from_dict(old) == plain
    m = manifest(photo_quality=40, photo_scale=0.5)
    back = Manifest.from_json(m.to_json())
    assert back == m and (back.photo_quality, back.photo_scale) == (40, 0.5)
    assert '"photo_quality": 40' in m.to_json() and '"photo_scale": 0.5' in m.to_json()
    only = Manifest.from_json(manifest(photo_scale=2.0).to_json())
    assert (only.photo_quality, only.photo_scale) == (95, 2.0) and "photo_quality" not in only.to_json()


@pytest.mark.parametrize(
    ("kw", "words"),
    [
        ({"photo_quality": 0}, "photo_quality must be an integer from 1 to 100"),
        ({"photo_quality": 101}, "photo_quality must be an integer from 1 to 100"),
        ({"photo_quality": 95.0}, "photo_quality must be an integer from 1 to 100"),
        ({"photo_scale": 0.1}, r"photo_scale must be a number in \[0.25, 4\]"),
        ({"photo_scale": 5.0}, r"photo_scale must be a number in \[0.25, 4\]"),
        ({"photo_scale": float("inf")}, r"photo_scale must be a number in \[0.25, 4\]"),
    ],
)
def test_the_manifest_refuses_out_of_range_photo_values(kw: dict[str, Any], words: str) -> None:
    with pytest.raises(ManifestError, match=words):
        manifest(**kw)


@pytest.mark.parametrize(
    ("field", "value"),
    [("photo_quality", "95"), ("photo_quality", 9.5), ("photo_quality", True), ("photo_scale", "1"),
     ("photo_scale", None), ("photo_scale", 10), ("photo_quality", 0)],
)  # fmt: skip
def test_a_manifest_file_with_a_bad_photo_field_is_refused_naming_it(field: str, value: Any) -> None:
    data = json.loads(manifest().to_json())
    data[field] = value
    with pytest.raises(ManifestError, match=field):
        Manifest.from_dict(data)


def test_every_chunk_manifest_carries_the_jobs_photo_settings() -> None:
    plan = make_plan("j", [TargetRef(f"in/{n}.jpg", f"out/{n}.jpg", "image") for n in range(3)], 2)
    settings = ManifestSettings(
        "default", ("s.jpg",), ("face_swapper",), ("cpu",), FaceSelection.MANY, NoFacePolicy.COPY,
        photo=PhotoTuning(70, 1.5),
    )  # fmt: skip
    for m in chunk_manifests(plan, settings).values():
        assert (m.photo_quality, m.photo_scale) == (70, 1.5)
    with pytest.raises(ManifestError, match="photo_scale"):
        PhotoTuning(95, 8)


def test_outputs_round_to_whole_pixels_at_least_one() -> None:
    assert scaled_size(641, 481, 0.5) == (320, 240)  # round half to even, as Python rounds
    assert scaled_size(3, 1, 0.25) == (1, 1)
    assert scaled_size(100, 50, 1.5) == (150, 75)


# ------------------------------------------------------------------------------ encode_output alone


@pytest.mark.parametrize("ext", sorted(media.ENCODERS))
def test_the_defaults_encode_exactly_as_the_encoder_table_always_did(ext: str) -> None:
    rng = np.random.default_rng(3)
    frame = cv2.GaussianBlur(rng.integers(0, 256, (60, 80, 3), dtype=np.uint8), (5, 5), 0)
    decoded = media.Decoded(frame, b"", "PNG", 1)
    encoder, params = media.ENCODERS[ext]
    assert media.encode_output(frame, decoded, ext)[0] == cv2.imencode(encoder, frame, params)[1].tobytes()
    if ext not in media.LOSSY:  # lossless: quality is ignored
        assert media.encode_output(frame, decoded, ext, quality=10)[0] == media.encode_output(frame, decoded, ext)[0]


# ------------------------------------------------------------------------------ through real chunks


@pytest.fixture(scope="module")
def assets(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp("photo")
    build_pack(base / "models" / "default")  # with the stand-in Real-ESRGAN x2 frame enhancer
    inputs = base / "in"
    photos.astronaut(inputs)
    photos.no_face_photo(inputs)
    photos.face_photos(inputs, 2)
    shutil.copyfile(inputs / "face_01.jpg", inputs / "source.jpg")
    bgr = cv2.imread(str(inputs / "astronaut.jpg"))
    h, w = bgr.shape[:2]
    alpha = np.tile(np.linspace(40, 255, w, dtype=np.float32), (h, 1)).astype(np.uint8)  # a left-right ramp
    cv2.imwrite(str(inputs / "clear.png"), np.dstack([bgr, alpha]))
    return base


@pytest.fixture
def data(tmp_path: Path, assets: Path) -> Path:
    root = tmp_path / "data"
    shutil.copytree(assets, root)
    (root / "runs" / JOB / "chunks").mkdir(parents=True)
    return root


def one(root: Path, name: str, ext: str, chunk: str = "c0001", **kw: Any) -> tuple[Any, bytes]:
    """Run one photo through a chunk; its result line and its output's bytes (the file is taken away,
    so that the next chunk writes its own)."""
    assert run(root, write_manifest(root, [name], chunk=chunk, ext=ext, **kw)) == 0
    (line,) = results(root, chunk)
    output = root / "out" / f"{Path(name).stem}{ext}"
    data = output.read_bytes()
    output.unlink()
    return line, data


def size_of(data: bytes) -> tuple[int, int, int]:
    """Height, width and channels of an encoded image, as decoded unchanged."""
    image = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_UNCHANGED)
    return image.shape[0], image.shape[1], 1 if image.ndim == 2 else image.shape[2]


def input_size(root: Path, name: str) -> tuple[int, int]:
    h, w = cv2.imread(str(root / "in" / name)).shape[:2]
    return h, w


def test_quality_40_gives_a_smaller_jpeg_of_the_same_size(data: Path) -> None:
    line95, best = one(data, "astronaut.jpg", ".jpg")
    line40, low = one(data, "astronaut.jpg", ".jpg", chunk="c0002", photo_quality=40)
    assert line95.status is line40.status is ItemStatus.OK and line40.faces >= 1
    assert len(low) < len(best) * 0.8
    assert size_of(low) == size_of(best) == (*input_size(data, "astronaut.jpg"), 3)
    # and it is the same picture, coarser
    a, b = (cv2.imdecode(np.frombuffer(x, np.uint8), cv2.IMREAD_COLOR).astype(int) for x in (best, low))
    assert np.abs(a - b).mean() < 6


def test_the_defaults_give_exactly_todays_bytes(data: Path) -> None:
    _, default = one(data, "astronaut.jpg", ".jpg")
    _, explicit = one(data, "astronaut.jpg", ".jpg", chunk="c0002", photo_quality=95, photo_scale=1.0)
    assert default == explicit
    assert "photo_" not in (data / "runs" / JOB / "chunks" / "c0001.json").read_text()
    # a lossless output is the processed pixels under today's encoder table, byte for byte
    _, png = one(data, "astronaut.jpg", ".png", chunk="c0003")
    pixels = cv2.imdecode(np.frombuffer(png, np.uint8), cv2.IMREAD_UNCHANGED)
    assert cv2.imencode(".png", pixels, [cv2.IMWRITE_PNG_COMPRESSION, 3])[1].tobytes() == png


def test_scale_half_halves_both_sides_of_a_jpeg(data: Path) -> None:
    h, w = input_size(data, "astronaut.jpg")
    line, out = one(data, "astronaut.jpg", ".jpg", photo_scale=0.5)
    assert line.status is ItemStatus.OK and line.faces >= 1
    assert size_of(out) == (round(h / 2), round(w / 2), 3)
    # the swapped photo, shrunk (INTER_AREA): close to the full-size output shrunk the same way
    _, full = one(data, "astronaut.jpg", ".jpg", chunk="c0002")
    big = cv2.imdecode(np.frombuffer(full, np.uint8), cv2.IMREAD_COLOR)
    expected = cv2.resize(big, (round(w / 2), round(h / 2)), interpolation=cv2.INTER_AREA).astype(int)
    assert np.abs(cv2.imdecode(np.frombuffer(out, np.uint8), cv2.IMREAD_COLOR).astype(int) - expected).mean() < 4


def test_scale_half_halves_a_png_and_keeps_its_alpha_resized_the_same_way(data: Path) -> None:
    h, w = input_size(data, "clear.png")
    line, out = one(data, "clear.png", ".png", photo_scale=0.5)
    assert line.status is ItemStatus.OK and line.note is None
    assert size_of(out) == (round(h / 2), round(w / 2), 4)
    alpha = cv2.imread(str(data / "in" / "clear.png"), cv2.IMREAD_UNCHANGED)[:, :, 3]
    got = cv2.imdecode(np.frombuffer(out, np.uint8), cv2.IMREAD_UNCHANGED)[:, :, 3]
    want = cv2.resize(alpha, (round(w / 2), round(h / 2)), interpolation=cv2.INTER_AREA)
    assert np.array_equal(got, want)


def test_a_frame_enhancer_then_scale_half_gives_the_inputs_size_enhanced(data: Path) -> None:
    h, w = input_size(data, "clear.png")
    chain = ("face_swapper", "frame_enhancer")
    line, out = one(data, "clear.png", ".png", processors=chain, photo_scale=0.5)
    assert line.status is ItemStatus.OK and size_of(out) == (h, w, 4)
    _, twice = one(data, "clear.png", ".png", chunk="c0002", processors=chain)
    assert size_of(twice) == (2 * h, 2 * w, 4)  # the enhancer's own x2, its alpha enlarged to match
    # no face, copied: resized like the others, so every output of the job has one size
    line, copied = one(data, "no_face.jpg", ".jpg", chunk="c0003", processors=chain, photo_scale=0.5)
    assert line.status is ItemStatus.NO_FACE and size_of(copied) == (*input_size(data, "no_face.jpg"), 3)
    assert copied != (data / "in" / "no_face.jpg").read_bytes()


def test_no_face_copy_is_byte_for_byte_at_scale_1_and_resized_otherwise(data: Path) -> None:
    original = (data / "in" / "no_face.jpg").read_bytes()
    h, w = input_size(data, "no_face.jpg")
    line, same = one(data, "no_face.jpg", ".jpg", photo_quality=40)  # quality alone changes no size
    assert line.status is ItemStatus.NO_FACE and same == original
    line, bigger = one(data, "no_face.jpg", ".jpg", chunk="c0002", photo_scale=2.0)
    assert line.status is ItemStatus.NO_FACE and line.output is not None
    assert size_of(bigger) == (2 * h, 2 * w, 3)
    assert line.size == len(bigger)
