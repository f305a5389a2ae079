"""What `ffswarm submit` refuses before creating anything (no Docker needed for these)."""

from __future__ import annotations

from pathlib import Path

import pytest

from controller.config import parse_config
from controller.errors import MissingInputError
from controller.run.jobs import prepare
from tests import builders


def setup(tmp_path: Path, pack_files: dict[str, dict[str, str]]) -> Path:
    return builders.data_root(tmp_path, pack_files)


def job(tmp_path: Path, processors: str) -> Path:
    f = tmp_path / "job.yaml"
    f.write_text(
        f"name: j\nsource: faces/star.jpg\ntargets: [crowd/*.jpg]\noutput: out/{{stem}}{{ext}}\n"
        f"processors: {processors}\n"
    )
    return f


def test_missing_enhancer_model_is_a_pack_error_at_submit(tmp_path: Path) -> None:
    root = setup(tmp_path, builders.PACK)
    config = parse_config(tmp_path / "ffswarm.yaml", {"data_root": str(root)})
    with pytest.raises(MissingInputError) as e:
        prepare(config, [job(tmp_path, "[face_swapper, face_enhancer]")], new=False)
    msg = str(e.value)
    assert "job.yaml: models:" in msg and "role enhancer" in msg and "face_enhancer" in msg
    assert "models: model pack models/default: pack.yaml lists no file" in msg  # as users know the pack's path
    assert e.value.exit_code == 66
    assert not (root / "runs").exists()
    assert len(prepare(config, [job(tmp_path, "[face_swapper]")], new=False)) == 1  # the swapper alone is fine


def test_missing_pack_is_named(tmp_path: Path) -> None:
    root = setup(tmp_path, builders.PACK)
    config = parse_config(tmp_path / "ffswarm.yaml", {"data_root": str(root)})
    f = job(tmp_path, "[face_swapper]")
    f.write_text(f.read_text() + "models: studio\n")
    with pytest.raises(MissingInputError, match=r"pack 'studio' not found: models/studio/pack.yaml does not exist"):
        prepare(config, [f], new=False)
