"""What `ffswarm submit` refuses before creating anything (no Docker needed for these)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

from controller.config import parse_config
from controller.errors import MissingInputError
from controller.run.jobs import prepare


def setup(tmp_path: Path, pack_files: dict[str, dict[str, str]]) -> Path:
    root = tmp_path / "root"
    (root / "models" / "default").mkdir(parents=True)
    (root / "models" / "default" / "pack.yaml").write_text(yaml.safe_dump({"name": "default", "files": pack_files}))
    (root / "faces").mkdir()
    (root / "faces" / "star.jpg").write_bytes(b"x")
    (root / "crowd").mkdir()
    (root / "crowd" / "a.jpg").write_bytes(b"x")
    if os.geteuid() == 0:  # runners run as the data root's owner, never root (as scripts/dev-swarm.sh sets it up)
        os.chown(root, 10001, 10001)
    return root


BASE = {
    "det_10g.onnx": {"role": "detector", "sha256": "0" * 64},
    "w600k_r50.onnx": {"role": "recognizer", "sha256": "0" * 64},
    "inswapper_128.onnx": {"role": "swapper", "sha256": "0" * 64},
}


def job(tmp_path: Path, processors: str) -> Path:
    f = tmp_path / "job.yaml"
    f.write_text(
        f"name: j\nsource: faces/star.jpg\ntargets: [crowd/*.jpg]\noutput: out/{{stem}}{{ext}}\n"
        f"processors: {processors}\n"
    )
    return f


def test_missing_enhancer_model_is_a_pack_error_at_submit(tmp_path: Path) -> None:
    root = setup(tmp_path, BASE)
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
    root = setup(tmp_path, BASE)
    config = parse_config(tmp_path / "ffswarm.yaml", {"data_root": str(root)})
    f = job(tmp_path, "[face_swapper]")
    f.write_text(f.read_text() + "models: studio\n")
    with pytest.raises(MissingInputError, match=r"pack 'studio' not found: models/studio/pack.yaml does not exist"):
        prepare(config, [f], new=False)
