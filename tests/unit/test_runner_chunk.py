"""The runner end to end, in-process: ``python -m runner_image``'s ``main`` on real photos with the
stand-in pack, real insightface and onnxruntime (CPU).

Manifests speak in ``/data/...`` container paths; ``--data-root`` points that at a temporary folder
(volume.DataRoot, the documented dev/test aid), so nothing here needs a container.
"""

from __future__ import annotations

import hashlib
import io
import json
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest
import yaml
from PIL import Image

from contract.identity import IdentityRequest, IdentityResult
from contract.manifest import FaceSelection, Item, Limits, Manifest, NoFacePolicy
from contract.results import ItemResult, ItemStatus, chunk_results
from runner_image.__main__ import main
from runner_image.errors import Terminated
from tests.builders import RUNNER_JOB
from tests.fixtures import photos

JOB, RUN = RUNNER_JOB, f"/data/runs/{RUNNER_JOB}"


def write_manifest(root: Path, names: list[str], *, chunk: str = "c0001", ext: str = ".png", **kw: Any) -> str:
    items = tuple(
        Item(id=f"i{i:06d}", input=f"/data/in/{n}", output=f"/data/out/{Path(n).stem}{ext}")
        for i, n in enumerate(names)
    )
    fields: dict[str, Any] = {
        "job": JOB,
        "chunk": chunk,
        "run_dir": RUN,
        "pack_dir": "/data/models/default",
        "source": ("/data/in/source.jpg",),
        "items": items,
        "providers": ("cpu",),
    }
    fields.update(kw)
    manifest = Manifest(**fields)
    (root / "runs" / JOB / "chunks" / f"{chunk}.json").write_text(manifest.to_json())
    return f"{RUN}/chunks/{chunk}.json"


def run(root: Path, manifest: str, attempt: int = 1) -> int:
    return main(["--manifest", manifest, "--attempt", str(attempt), "--data-root", str(root)], env={})


def results(root: Path, chunk: str = "c0001") -> list[ItemResult]:
    """Every line of every attempt's results file of the chunk (results/<chunk>.a<n>.jsonl)."""
    return list(chunk_results(root / "runs" / JOB / "results", chunk).lines)


def by_input(lines: list[ItemResult], attempt: int | None = None) -> dict[str, ItemResult]:
    return {Path(r.input).name: r for r in lines if attempt is None or r.attempt == attempt}


def temp_files(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if ".tmp-" in p.name or p.name.endswith(".tmp")]


def log_lines(text: str) -> Iterator[dict[str, Any]]:
    for line in text.splitlines():
        if line.startswith("{"):
            yield json.loads(line)


def pixels(path: Path) -> np.ndarray:
    image = cv2.imread(str(path), cv2.IMREAD_COLOR)
    assert image is not None, path
    return np.asarray(image, dtype=np.int16)


def changed(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.asarray(np.abs(a - b).max(axis=2) > 0)


def grow(box: tuple[int, int, int, int], by: float, shape: tuple[int, ...]) -> tuple[int, int, int, int]:
    x1, y1, x2, y2 = box
    dx, dy = int((x2 - x1) * by), int((y2 - y1) * by)
    return max(0, x1 - dx), max(0, y1 - dy), min(shape[1], x2 + dx), min(shape[0], y2 + dy)


def only_near(mask: np.ndarray, boxes: list[tuple[int, int, int, int]], by: float) -> bool:
    """True when every changed pixel lies within ``by`` box-sizes of one of ``boxes``."""
    allowed = np.zeros_like(mask)
    for box in boxes:
        x1, y1, x2, y2 = grow(box, by, mask.shape)
        allowed[y1:y2, x1:x2] = True
    return not np.any(mask & ~allowed)


def test_mixed_chunk_swaps_faces_copies_no_face_and_fails_the_broken_file(
    data: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    names = ["astronaut.jpg", "face_00.jpg", "face_02.jpg", "face_03.jpg", "no_face.jpg", "broken.jpg"]
    assert run(data, write_manifest(data, names)) == 3

    lines = by_input(results(data))
    assert sorted(lines) == sorted(names)
    for name in ["astronaut.jpg", "face_00.jpg", "face_02.jpg", "face_03.jpg"]:
        r = lines[name]
        assert r.status is ItemStatus.OK and r.faces >= 1 and r.attempt == 1 and not r.cached
        assert r.provider == "cpu" and set(r.timings) == {
            "decode",
            "detect",
            "embed",
            "swap",
            "paste",
            "encode",
            "write",
        }
        assert r.finished >= r.started > 0
        assert changed(pixels(data / "in" / name), pixels(data / "out" / f"{Path(name).stem}.png")).any()

    # astronaut: different inside the face box, byte-identical pixels away from it (PNG output)
    before, after = pixels(data / "in/astronaut.jpg"), pixels(data / "out/astronaut.png")
    x1, y1, x2, y2 = photos.ASTRONAUT_FACE
    assert np.abs(before[y1:y2, x1:x2] - after[y1:y2, x1:x2]).mean() > 5
    assert only_near(changed(before, after), [photos.ASTRONAUT_FACE], by=0.8)

    copy = lines["no_face.jpg"]
    assert copy.status is ItemStatus.NO_FACE and copy.output == "/data/out/no_face.png"
    assert (data / "out/no_face.png").read_bytes() == (data / "in/no_face.jpg").read_bytes()

    broken = lines["broken.jpg"]
    assert broken.status is ItemStatus.ERROR and broken.output is None
    assert broken.reason == "in/broken.jpg: not an image (unknown magic bytes)"
    assert not (data / "out/broken.png").exists()
    assert temp_files(data) == []

    # every line (stdout and the attempt's log file) carries job, chunk and attempt
    stdout = list(log_lines(capsys.readouterr().out))
    logged = list(log_lines((data / "runs" / JOB / "logs" / "c0001.a1.log").read_text()))
    assert logged and len(logged) == len(stdout)
    for line in logged:
        assert (line["job"], line["chunk"], line["attempt"]) == (JOB, "c0001", 1)
    assert any(line["event"] == "models loaded" and line["provider"] == "cpu" for line in logged)


def test_group_photo_many_swaps_all_six_faces_and_nothing_else(data: Path) -> None:
    assert run(data, write_manifest(data, ["t1.jpg"])) == 0
    (r,) = results(data)
    assert r.faces == 6
    mask = changed(pixels(data / "in/t1.jpg"), pixels(data / "out/t1.png"))
    for x1, y1, x2, y2 in photos.T1_FACES:
        assert mask[y1:y2, x1:x2].mean() > 0.3
    assert only_near(mask, list(photos.T1_FACES), by=0.8)


def test_one_swaps_only_the_largest_face(data: Path) -> None:
    assert run(data, write_manifest(data, ["t1.jpg"], faces=FaceSelection.ONE)) == 0
    (r,) = results(data)
    assert r.status is ItemStatus.OK and r.faces == 1
    mask = changed(pixels(data / "in/t1.jpg"), pixels(data / "out/t1.png"))
    touched = [box for box in photos.T1_FACES if mask[box[1] : box[3], box[0] : box[2]].any()]
    largest = max(photos.T1_FACES, key=lambda b: (b[2] - b[0]) * (b[3] - b[1]))
    assert touched == [largest]
    assert only_near(mask, [largest], by=0.8)


def test_reference_selection_without_its_embedding_exits_65(data: Path) -> None:
    manifest = write_manifest(data, ["astronaut.jpg"])
    path = data / "runs" / JOB / "chunks" / "c0001.json"
    raw = json.loads(path.read_text())
    raw["faces"] = "reference"  # an older controller: no reference_embedding computed at submit
    path.write_text(json.dumps(raw))
    assert run(data, manifest) == 65


@pytest.mark.parametrize(
    ("policy", "code", "status", "has_output"),
    [
        (NoFacePolicy.COPY, 0, ItemStatus.NO_FACE, True),
        (NoFacePolicy.SKIP, 0, ItemStatus.NO_FACE, False),
        (NoFacePolicy.FAIL, 3, ItemStatus.ERROR, False),
    ],
)
def test_no_face_policies(data: Path, policy: NoFacePolicy, code: int, status: ItemStatus, has_output: bool) -> None:
    assert run(data, write_manifest(data, ["no_face.jpg"], no_face=policy, ext=".jpg")) == code
    (r,) = results(data)
    assert r.status is status
    assert (data / "out/no_face.jpg").exists() is has_output
    assert (r.output is not None) is has_output
    if policy is NoFacePolicy.FAIL:
        assert r.reason == "in/no_face.jpg: no face detected"
    if has_output:
        assert (data / "out/no_face.jpg").read_bytes() == (data / "in/no_face.jpg").read_bytes()


def test_second_attempt_reuses_committed_items_without_rewriting(
    data: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    manifest = write_manifest(data, ["astronaut.jpg", "no_face.jpg", "broken.jpg"])
    assert run(data, manifest) == 3
    outputs = [data / "out/astronaut.png", data / "out/no_face.png"]
    stamps = [p.stat().st_mtime_ns for p in outputs]
    capsys.readouterr()

    assert run(data, manifest, attempt=2) == 3  # the broken file is retried and fails again
    second = by_input(results(data), attempt=2)
    assert second["astronaut.jpg"].cached and second["astronaut.jpg"].status is ItemStatus.OK
    assert second["no_face.jpg"].cached and second["no_face.jpg"].status is ItemStatus.NO_FACE
    assert not second["broken.jpg"].cached and second["broken.jpg"].status is ItemStatus.ERROR
    assert [p.stat().st_mtime_ns for p in outputs] == stamps
    assert (data / "runs" / JOB / "logs" / "c0001.a2.log").is_file()
    assert temp_files(data) == []


def test_fully_done_chunk_exits_0_without_loading_models(data: Path, capsys: pytest.CaptureFixture[str]) -> None:
    manifest = write_manifest(data, ["astronaut.jpg", "no_face.jpg"], no_face=NoFacePolicy.SKIP)
    assert run(data, manifest) == 0
    shutil.rmtree(data / "models")  # nothing left to do must not need the pack
    capsys.readouterr()
    assert run(data, manifest, attempt=2) == 0
    assert all(r.cached for r in results(data) if r.attempt == 2)
    assert not any(line["event"] == "models loaded" for line in log_lines(capsys.readouterr().out))


def test_lost_output_is_redone(data: Path) -> None:
    manifest = write_manifest(data, ["astronaut.jpg"])
    assert run(data, manifest) == 0
    (data / "out/astronaut.png").unlink()
    assert run(data, manifest, attempt=2) == 0
    (_, second) = results(data)
    assert not second.cached and (data / "out/astronaut.png").is_file()


def _corrupt_checksum(data: Path) -> None:
    (data / "models/default/w600k_r50.onnx").write_bytes(b"not the recogniser")


def _drop_file(data: Path) -> None:
    (data / "models/default/inswapper_128.onnx").unlink()


@pytest.mark.parametrize(
    ("damage", "message"),
    [(_corrupt_checksum, "w600k_r50.onnx has the wrong checksum"), (_drop_file, "inswapper_128.onnx is missing")],
)
def test_broken_pack_exits_66_naming_file_and_pack(
    data: Path, capsys: pytest.CaptureFixture[str], damage: Any, message: str
) -> None:
    damage(data)
    assert run(data, write_manifest(data, ["astronaut.jpg"])) == 66
    errors = [line for line in log_lines(capsys.readouterr().out) if line["level"] == "error"]
    assert len(errors) == 1
    assert message in errors[0]["error"] and errors[0]["error"].startswith("model pack models/default: ")
    assert not (data / "out").exists()


def test_source_without_face_exits_66(data: Path, capsys: pytest.CaptureFixture[str]) -> None:
    manifest = write_manifest(data, ["astronaut.jpg"], source=("/data/in/no_face.jpg",))
    assert run(data, manifest) == 66
    assert "source photo in/no_face.jpg: no face detected" in capsys.readouterr().out


def test_missing_source_exits_66(data: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run(data, write_manifest(data, ["astronaut.jpg"], source=("/data/in/gone.jpg",))) == 66
    assert "source photo in/gone.jpg: file not found" in capsys.readouterr().out


def test_unknown_schema_exits_65(data: Path) -> None:
    manifest = write_manifest(data, ["astronaut.jpg"])
    path = data / "runs" / JOB / "chunks" / "c0001.json"
    raw = json.loads(path.read_text())
    raw["schema"] = 99
    path.write_text(json.dumps(raw))
    assert run(data, manifest) == 65


def test_malformed_manifest_exits_65(data: Path) -> None:
    (data / "runs" / JOB / "chunks" / "c0001.json").write_text("{not json")
    assert run(data, f"{RUN}/chunks/c0001.json") == 65


def test_missing_run_folder_exits_75(data: Path) -> None:
    shutil.rmtree(data / "runs" / JOB)
    assert run(data, f"{RUN}/chunks/c0001.json") == 75


def test_missing_data_root_exits_75(tmp_path: Path) -> None:
    assert run(tmp_path / "not-mounted", f"{RUN}/chunks/c0001.json") == 75


def test_missing_manifest_in_existing_folder_exits_66(data: Path) -> None:
    assert run(data, f"{RUN}/chunks/c0042.json") == 66


def test_cuda_only_on_a_cpu_machine_exits_75(data: Path) -> None:
    assert run(data, write_manifest(data, ["astronaut.jpg"], providers=("cuda",))) == 75


def test_cuda_then_cpu_falls_back_and_says_so(data: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run(data, write_manifest(data, ["astronaut.jpg"], providers=("cuda", "cpu"))) == 0
    warnings = [line for line in log_lines(capsys.readouterr().out) if line["event"] == "provider fallback"]
    assert warnings and "CUDAExecutionProvider" in warnings[0]["reason"]
    assert results(data)[0].provider == "cpu"


def test_gpu_id_from_swarm_is_recorded(data: Path) -> None:
    manifest = write_manifest(data, ["astronaut.jpg"])
    code = main(["--manifest", manifest, "--data-root", str(data)], env={"DOCKER_RESOURCE_GPU": "GPU-a"})
    assert code == 0
    assert results(data)[0].gpu == "GPU-a"


def test_env_inputs_are_used(data: Path) -> None:
    manifest = write_manifest(data, ["astronaut.jpg"])
    env = {"FFSWARM_MANIFEST": manifest, "FFSWARM_ATTEMPT": "4", "FFSWARM_DATA_ROOT": str(data)}
    assert main([], env=env) == 0
    assert results(data)[0].attempt == 4


def test_bad_attempt_number_exits_65(data: Path) -> None:
    assert main(["--manifest", write_manifest(data, ["astronaut.jpg"]), "--attempt", "0"], env={}) == 65


@pytest.mark.parametrize("cap", ["pixels", "bytes"])
def test_size_caps_fail_the_item(data: Path, cap: str) -> None:
    # caps apply to every decoded file, the source photo included: set them just above the source's
    source = data / "in/source.jpg"
    with Image.open(source) as im:
        source_pixels = im.size[0] * im.size[1]
    if cap == "pixels":
        limits = Limits(max_pixels=source_pixels)
        reason = f"in/astronaut.jpg: image too large: 512x512 pixels exceeds limit {source_pixels}"
    else:
        limits = Limits(max_file_bytes=source.stat().st_size)
        size = (data / "in/astronaut.jpg").stat().st_size
        reason = f"in/astronaut.jpg: file too large: {size} bytes exceeds limit {limits.max_file_bytes}"
    assert source_pixels < 512 * 512 and source.stat().st_size < (data / "in/astronaut.jpg").stat().st_size
    assert run(data, write_manifest(data, ["astronaut.jpg"], limits=limits)) == 3
    (r,) = results(data)
    assert r.status is ItemStatus.ERROR and r.reason == reason


def test_exif_rotation_is_honoured(data: Path) -> None:
    upright = pixels(data / "in/astronaut.jpg").astype(np.uint8)[:400]  # 512 wide, 400 tall: not square
    stored = cv2.rotate(upright, cv2.ROTATE_90_COUNTERCLOCKWISE)  # sideways on disk ...
    exif = Image.Exif()
    exif[0x0112] = 6  # ... and tagged "rotate 90° clockwise to display"
    buf = io.BytesIO()
    Image.fromarray(stored[:, :, ::-1]).save(buf, "JPEG", quality=95, exif=exif.tobytes())
    (data / "in/sideways.jpg").write_bytes(buf.getvalue())

    assert run(data, write_manifest(data, ["sideways.jpg"])) == 0
    (r,) = results(data)
    assert r.status is ItemStatus.OK and r.faces == 1
    out = pixels(data / "out/sideways.png")
    assert out.shape == (400, 512, 3)
    x1, y1, x2, y2 = photos.ASTRONAUT_FACE
    far = np.ones(out.shape[:2], bool)
    gx1, gy1, gx2, gy2 = grow(photos.ASTRONAUT_FACE, 0.8, out.shape)
    far[gy1:gy2, gx1:gx2] = False
    assert np.abs(out - upright.astype(np.int16))[far].mean() < 3  # upright, like the original
    assert np.abs(out - upright.astype(np.int16))[y1:y2, x1:x2].mean() > 5  # and the face was swapped


def test_unwritable_output_is_an_item_error_without_temp_files(data: Path) -> None:
    (data / "out").mkdir()
    (data / "out" / "astronaut.png").mkdir()  # a folder where the output should go
    # overwrite: the job may replace files; a folder still cannot be (without it: test_hostile_runner)
    assert run(data, write_manifest(data, ["astronaut.jpg"], overwrite=True)) == 3
    (r,) = results(data)
    assert r.status is ItemStatus.ERROR
    assert r.reason == "out/astronaut.png: cannot write output: Is a directory"
    assert temp_files(data) == []


def test_unsupported_output_extension_is_an_item_error(data: Path) -> None:
    assert run(data, write_manifest(data, ["astronaut.jpg"], ext=".gif")) == 3
    (r,) = results(data)
    assert r.reason is not None and r.reason.startswith("out/astronaut.gif: unsupported output extension '.gif'")


def test_torn_line_from_a_killed_writer_does_not_hide_later_lines(data: Path) -> None:
    manifest = write_manifest(data, ["astronaut.jpg"])
    results_file = data / "runs" / JOB / "results" / "c0001.a1.jsonl"
    results_file.parent.mkdir(parents=True)
    results_file.write_text('{"item": "i000000", "status": "o')  # killed mid-line, no newline
    assert run(data, manifest) == 0
    text = results_file.read_text()
    assert len(results(data)) == 1  # the torn fragment is skipped, our line parses
    assert text.endswith("\n")


def test_unexpected_error_exits_70_with_a_traceback(data: Path, capsys: pytest.CaptureFixture[str]) -> None:
    def broken(detector: Any, image: np.ndarray) -> list[Any]:
        raise RuntimeError("bug in detection")

    manifest = write_manifest(data, ["astronaut.jpg"])
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("runner_image.faces.detect", broken)
        assert run(data, manifest) == 70
    (line,) = [x for x in log_lines(capsys.readouterr().out) if x["level"] == "error"]
    assert "RuntimeError: bug in detection" in line["exception"]


def test_sigterm_mid_write_exits_143_and_leaves_no_partial_output(data: Path) -> None:
    def killed(fd: int) -> None:
        raise Terminated()

    manifest = write_manifest(data, ["astronaut.jpg"])
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("runner_image.media.os.fsync", killed)
        assert run(data, manifest) == 143
    assert not (data / "out/astronaut.png").exists()
    assert temp_files(data) == []


def test_several_source_photos_make_one_identity(data: Path) -> None:
    manifest = write_manifest(data, ["astronaut.jpg"], source=("/data/in/source.jpg", "/data/in/face_02.jpg"))
    assert run(data, manifest) == 0
    assert results(data)[0].status is ItemStatus.OK


def test_enhancer_missing_from_the_pack_exits_66_naming_role_and_source(
    data: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pack = data / "models/default"
    spec = yaml.safe_load((pack / "pack.yaml").read_text())
    del spec["files"]["gfpgan_1.4.onnx"]
    (pack / "pack.yaml").write_text(yaml.safe_dump(spec))
    manifest = write_manifest(data, ["astronaut.jpg"], processors=("face_swapper", "face_enhancer"))
    assert run(data, manifest) == 66
    out = capsys.readouterr().out
    assert "lists no file with role enhancer (needed by face_enhancer: gfpgan_1.4.onnx" in out
    assert not (data / "out").exists()


def test_pack_file_that_is_not_a_model_exits_66(data: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pack = data / "models/default"
    garbage = b"not an onnx model at all"
    (pack / "det_10g.onnx").write_bytes(garbage)
    spec = yaml.safe_load((pack / "pack.yaml").read_text())
    spec["files"]["det_10g.onnx"]["sha256"] = hashlib.sha256(garbage).hexdigest()
    (pack / "pack.yaml").write_text(yaml.safe_dump(spec))
    assert run(data, write_manifest(data, ["astronaut.jpg"])) == 66
    assert "det_10g.onnx does not load" in capsys.readouterr().out


# -- the identity step running beside the first chunks (manifest.identity) ------------------------------
def identity_file(root: Path, source: str, name: str) -> Path:
    """identity.json as the submit-time step writes it, for `source`, by the real identity subcommand."""
    req = IdentityRequest(
        job=JOB, pack_dir="/data/models/default", sources=(source,), output=f"{RUN}/{name}", providers=("cpu",)
    )
    (root / "runs" / JOB / f"{name}.request").write_text(req.to_json())
    assert main(["identity", "--request", f"{RUN}/{name}.request", "--data-root", str(root)], env={}) == 0
    return root / "runs" / JOB / name


def test_runner_waits_for_the_pending_identity_and_swaps_in_that_identity(
    data: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Manifests of a new job name identity.json, which says "pending" until the identity step
    answers: the runner waits, then swaps in exactly the identity the step computed (face_02 here,
    not the manifest's source photo), as if the embedding had been in the manifest."""
    ready = identity_file(data, "/data/in/face_02.jpg", "identity-ready.json")
    target = data / "runs" / JOB / "identity.json"
    target.write_text(IdentityResult(pending=True).to_json())
    manifest = write_manifest(data, ["astronaut.jpg"], identity=f"{RUN}/identity.json")
    answer = threading.Timer(0.6, lambda: ready.replace(target))
    answer.start()
    try:
        assert run(data, manifest) == 0
    finally:
        answer.join()
    waited = [r["waited_s"] for r in log_lines(capsys.readouterr().out) if r["event"] == "identity ready"]
    # It waited (no bound on how long: the runner's own start-up overlaps the 0.6 s, more on a busy
    # machine); that it swapped in the identity that only existed after the wait is the pixels below.
    assert len(waited) == 1 and waited[0] > 0
    via_file = pixels(data / "out/astronaut.png")
    # The same photo, the identity embedded by the runner itself from the manifest's source.
    direct = write_manifest(data, ["astronaut.jpg"], chunk="c0002", ext=".bmp", source=("/data/in/face_02.jpg",))
    assert run(data, direct) == 0
    other = write_manifest(data, ["astronaut.jpg"], chunk="c0003", ext=".tif")
    assert run(data, other) == 0
    assert np.abs(via_file - pixels(data / "out/astronaut.bmp")).max() <= 1  # float rounding at most
    assert np.abs(via_file - pixels(data / "out/astronaut.tif")).max() > 10  # the manifest's own source differs


def test_identity_step_error_exits_66_and_commits_nothing(data: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (data / "runs" / JOB / "identity.json").write_text(
        IdentityResult(error="source photo /data/in/x.jpg: no face detected").to_json()
    )
    manifest = write_manifest(data, ["astronaut.jpg", "face_00.jpg"], identity=f"{RUN}/identity.json")
    assert run(data, manifest) == 66
    assert not (data / "out").exists()
    errors = [r.get("error", "") for r in log_lines(capsys.readouterr().out)]
    assert any("identity step failed: source photo /data/in/x.jpg: no face detected" in e for e in errors)


def test_identity_that_never_answers_is_temporary(data: Path) -> None:
    (data / "runs" / JOB / "identity.json").write_text(IdentityResult(pending=True).to_json())
    manifest = write_manifest(data, ["astronaut.jpg"], identity=f"{RUN}/identity.json", identity_timeout=0.3)
    assert run(data, manifest) == 75
    assert not (data / "out").exists()


def test_reasons_name_files_as_the_job_file_does(data: Path) -> None:
    """A user wrote ``hidden/in/fake.jpg`` in the job file: the reason says that, not the container's
    ``/data/hidden/in/fake.jpg``; the result's ``input``/``output`` stay container paths (the contract)."""
    hidden = data / "hidden" / "in"
    hidden.mkdir(parents=True)
    shutil.copyfile(data / "in" / "broken.jpg", hidden / "fake.jpg")
    shutil.copyfile(data / "in" / "astronaut.jpg", hidden / "astronaut.jpg")
    (data / "hidden" / "out" / "astronaut.png").mkdir(parents=True)  # a folder where the output goes
    items = tuple(
        Item(id=f"i{i:06d}", input=f"/data/hidden/in/{n}", output=f"/data/hidden/out/{Path(n).stem}.png")
        for i, n in enumerate(["fake.jpg", "astronaut.jpg"])
    )
    manifest = Manifest(
        job=JOB,
        chunk="c0001",
        run_dir=RUN,
        pack_dir="/data/models/default",
        source=("/data/in/source.jpg",),
        items=items,
        providers=("cpu",),
        overwrite=True,  # the folder is in the way even so
    )
    (data / "runs" / JOB / "chunks" / "c0001.json").write_text(manifest.to_json())
    assert run(data, f"{RUN}/chunks/c0001.json") == 3
    got = {Path(r.input).name: r for r in results(data)}
    assert got["fake.jpg"].reason == "hidden/in/fake.jpg: not an image (unknown magic bytes)"
    assert got["astronaut.jpg"].reason == "hidden/out/astronaut.png: cannot write output: Is a directory"
    assert got["fake.jpg"].input == "/data/hidden/in/fake.jpg"
