"""The 256-pixel swappers' packs (issue 20): each stand-in passes ``ffswarm models verify`` with its
role, contract and licence printed; a file of another shape is refused naming its role, by ``models
verify`` and by the runner before any item; the embedding converter (simswap_256, ghost_256) is
required only when the job's model takes one, named with its role and the pack when missing; and
``licence: commercial`` refuses a non-commercial swapper or converter at submit, naming it."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from contract import processors as registry
from contract.swapper import LICENCES
from controller import models as models_mod
from controller.cli import cli
from controller.errors import JobFileError, MissingInputError
from runner_image import models
from runner_image.errors import MissingInput
from tests.fixtures.standin_pack import build_pack
from tests.fixtures.standin_swappers import add_swapper
from tests.unit.test_pack_licences import MIT, entry, submit

NEW = ("simswap_256", "hyperswap_1a_256", "ghost_256")
FILES = {
    "simswap_256": "simswap_256.onnx",
    "hyperswap_1a_256": "hyperswap_1a_256.onnx",
    "ghost_256": "ghost_1_256.onnx",
}
CONVERTERS = {"simswap_256": "crossface_simswap.onnx", "ghost_256": "crossface_ghost.onnx"}


def standin(tmp_path: Path, model: str, **kw: Any) -> Path:
    pack_dir = build_pack(tmp_path / "pack", enhancer=False, frame_enhancer=False).parent
    add_swapper(pack_dir, model, **kw)
    return pack_dir


def cli_verify(tmp_path: Path, pack_dir: Path) -> Any:
    (tmp_path / "data" / "models").mkdir(parents=True, exist_ok=True)
    shutil.move(pack_dir, tmp_path / "data" / "models" / "default")
    config = tmp_path / "ffswarm.yaml"
    config.write_text(yaml.safe_dump({"data_root": str(tmp_path / "data"), "volume": {"type": "bind"}, "image": "x"}))
    return CliRunner().invoke(cli, ["--config", str(config), "models", "verify"])


def block(lines: list[str], name: str) -> list[str]:
    start = next(
        i for i, line in enumerate(lines) if line.startswith(f"  ok  {name} (") or line.startswith(f"  BAD {name} (")
    )
    return lines[start : start + 3]


# --- models verify -----------------------------------------------------------------------------------


@pytest.mark.parametrize("model", NEW)
def test_each_standin_passes_models_verify_printing_role_contract_and_licence(tmp_path: Path, model: str) -> None:
    result = cli_verify(tmp_path, standin(tmp_path, model))
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert "OK" in lines[0]
    swap = block(lines, FILES[model])
    assert swap[0].startswith(f"  ok  {FILES[model]} (swapper): sha256 ok")
    assert swap[1].startswith(f"        contract: {model}: inputs target N×3×256×256 and source [1, 512]")
    assert swap[2] == "        licence: generated stand-in, no licence restriction (commercial use: yes)"
    if model in CONVERTERS:
        conv = block(lines, CONVERTERS[model])
        assert conv[0].startswith(f"  ok  {CONVERTERS[model]} (swapper_converter): sha256 ok")
        assert (
            conv[1] == f"        contract: 1 input [N, 512] (ArcFace) and 1 output [N, 512] ({CONVERTERS[model][:-5]})"
        )
        assert conv[2].startswith("        licence: ")
        assert swap[1].endswith(f"needs swapper_converter {CONVERTERS[model][:-5]}")


@pytest.mark.parametrize("model", NEW)
def test_models_verify_refuses_a_wrong_shaped_swapper_naming_its_role(tmp_path: Path, model: str) -> None:
    report = models_mod.verify(standin(tmp_path, model, wrong=True))
    assert not report.ok
    bad = next(f for f in report.files if f.name == FILES[model])
    assert not bad.ok and bad.role == "swapper"
    assert f"does not fit a swapper: not {model}: inputs target N×3×256×256" in bad.notes[-1]
    assert "target[1, 3, 128, 128]" in bad.notes[-1]  # what the file has


@pytest.mark.parametrize("model", ["simswap_256", "ghost_256"])
def test_models_verify_refuses_a_wrong_shaped_converter_and_a_missing_one(tmp_path: Path, model: str) -> None:
    report = models_mod.verify(standin(tmp_path / "a", model, wrong_converter=True))
    bad = next(f for f in report.files if f.role == "swapper_converter")
    assert not report.ok and not bad.ok and "does not fit a swapper_converter" in bad.notes[-1]
    report = models_mod.verify(standin(tmp_path / "b", model, converter=False))
    converter = CONVERTERS[model][:-5]
    assert report.problems == [f"no file with role swapper_converter ({model} needs {converter})"]


# --- the runner: refusals before any item ---------------------------------------------------------------


def load(pack_dir: Path, model: str) -> models.Models:
    pack = models.verify_pack(pack_dir, swapper=model, shown="models/default")
    roles = registry.roles(["face_swapper"], swapper=model)
    return models.load_models(pack, ("cpu",), roles=roles, swapper_model=model)


@pytest.mark.parametrize("model", NEW)
def test_the_runner_refuses_a_wrong_shaped_swapper_naming_the_pack_file_and_role(tmp_path: Path, model: str) -> None:
    with pytest.raises(MissingInput) as e:
        load(standin(tmp_path, model, wrong=True), model)
    assert str(e.value).startswith(f"model pack models/default: {FILES[model]} (role swapper): not {model}: ")
    assert e.value.exit_code == 66


@pytest.mark.parametrize("model", ["simswap_256", "ghost_256"])
def test_the_runner_refuses_a_wrong_converter_and_requires_a_missing_one(tmp_path: Path, model: str) -> None:
    with pytest.raises(MissingInput) as e:
        load(standin(tmp_path / "a", model, wrong_converter=True), model)
    assert f"{CONVERTERS[model]} (role swapper_converter): not an embedding converter" in str(e.value)
    with pytest.raises(MissingInput) as e:
        load(standin(tmp_path / "b", model, converter=False), model)
    assert str(e.value).startswith("model pack models/default: pack.yaml lists no file with role swapper_converter")
    assert f"needed by face_swapper.model {model}: {CONVERTERS[model]}" in str(e.value)


def test_an_inswapper_file_for_a_256_model_is_refused(tmp_path: Path) -> None:
    pack_dir = build_pack(tmp_path / "pack", enhancer=False, frame_enhancer=False).parent  # inswapper_128's stand-in
    with pytest.raises(MissingInput, match=r"inswapper_128.onnx \(role swapper\): not hyperswap_1a_256"):
        load(pack_dir, "hyperswap_1a_256")


# --- submit: the converter, the recorded models, licences ------------------------------------------------


def pack_files(
    model: str, swapper: object = MIT, converter: object = MIT, *, with_converter: bool = True
) -> dict[str, Any]:
    files = {"det_10g.onnx": entry("detector", MIT), "w600k_r50.onnx": entry("recognizer", MIT)}
    files[FILES[model]] = {**entry("swapper", swapper), "model": model}
    if model in CONVERTERS and with_converter:
        files[CONVERTERS[model]] = {**entry("swapper_converter", converter), "model": CONVERTERS[model][:-5]}
    return files


def job(model: str, extra: str = "") -> str:
    return f"face_swapper: {{model: {model}}}\n{extra}"


@pytest.mark.parametrize("model", NEW)
def test_a_job_with_each_model_and_its_pack_is_accepted(tmp_path: Path, model: str) -> None:
    assert submit(tmp_path, pack_files(model), job(model, "licence: commercial\n")) == 1


@pytest.mark.parametrize("model", ["simswap_256", "ghost_256"])
def test_a_missing_converter_is_refused_at_submit_naming_the_role_and_the_pack(tmp_path: Path, model: str) -> None:
    with pytest.raises(MissingInputError) as e:
        submit(tmp_path, pack_files(model, with_converter=False), job(model))
    assert e.value.exit_code == 66
    assert "models: model pack models/default: pack.yaml lists no file with role swapper_converter" in str(e.value)
    assert f"(needed by face_swapper.model {model}: {CONVERTERS[model]}" in str(e.value)
    # an inswapper or hyperswap job needs none: the same pack without converter is fine for them
    shutil.rmtree(tmp_path / "root")
    files = pack_files(model, with_converter=False)
    files[FILES[model]]["model"] = "hyperswap_1a_256"
    assert submit(tmp_path, files, job("hyperswap_1a_256")) == 1


def test_a_pack_whose_files_record_other_models_is_refused_naming_both(tmp_path: Path) -> None:
    with pytest.raises(JobFileError) as e:
        submit(tmp_path / "a", pack_files("simswap_256"), job("ghost_256"))
    assert e.value.field == "face_swapper.model"
    assert (
        e.value.reason
        == "the pack's swapper is simswap_256.onnx (simswap_256 in models/default/pack.yaml), not ghost_256"
    )
    files = pack_files("simswap_256")
    files["crossface_simswap.onnx"]["model"] = "crossface_ghost"
    with pytest.raises(JobFileError) as e:
        submit(tmp_path / "b", files, job("simswap_256"))
    assert "the pack's swapper_converter is crossface_simswap.onnx (crossface_ghost in" in e.value.reason
    assert e.value.reason.endswith("not crossface_simswap")


@pytest.mark.parametrize("recorded", ["ghost_1_256", "ghost_2_256", "ghost_3_256", "ghost_256"])
def test_ghost_256_accepts_each_of_facefusions_ghost_files(tmp_path: Path, recorded: str) -> None:
    files = pack_files("ghost_256")
    files["ghost_1_256.onnx"]["model"] = recorded
    assert submit(tmp_path, files, job("ghost_256")) == 1


@pytest.mark.parametrize("model", ["simswap_256", "hyperswap_1a_256"])
def test_licence_commercial_refuses_the_non_commercial_swapper_naming_it(tmp_path: Path, model: str) -> None:
    name, commercial = LICENCES[model]  # as the publisher states it
    assert not commercial
    with pytest.raises(JobFileError) as e:
        submit(
            tmp_path,
            pack_files(model, swapper={"name": name, "commercial": False}),
            job(model, "licence: commercial\n"),
        )
    assert e.value.field == "licence" and e.value.exit_code == 65
    assert f"{FILES[model]} (swapper): licence {name!r}, not for commercial use" in e.value.reason
    assert not (tmp_path / "root" / "runs").exists()


def test_licence_commercial_weighs_ghosts_converter_too(tmp_path: Path) -> None:
    ghost, converter = (
        {"name": LICENCES[m][0], "commercial": LICENCES[m][1]} for m in ("ghost_256", "crossface_ghost")
    )
    with pytest.raises(JobFileError) as e:
        submit(tmp_path / "a", pack_files("ghost_256", ghost, converter), job("ghost_256", "licence: commercial\n"))
    assert "crossface_ghost.onnx (swapper_converter): licence 'OpenRAIL-MS (FaceFusion CrossFace)'" in e.value.reason
    assert "ghost_1_256.onnx" not in e.value.reason  # Apache-2.0 allows it
    assert submit(tmp_path / "b", pack_files("ghost_256", ghost, MIT), job("ghost_256", "licence: commercial\n")) == 1
    # an inswapper job does not load the converter: its licence does not count
    files = pack_files("ghost_256", ghost, converter)
    files["inswapper_128.onnx"] = entry("swapper", MIT)
    del files["ghost_1_256.onnx"]
    assert submit(tmp_path / "c", files, "licence: commercial\n") == 1


def test_an_unrecorded_licence_is_unknown_and_refused_for_commercial(tmp_path: Path) -> None:
    with pytest.raises(JobFileError) as e:
        submit(tmp_path, pack_files("hyperswap_1a_256", swapper=...), job("hyperswap_1a_256", "licence: commercial\n"))
    assert "hyperswap_1a_256.onnx (swapper): licence unknown" in e.value.reason
