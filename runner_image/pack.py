"""The runner's reading of a model pack: pack.yaml parsed here, the rules applied by contract/pack.py
(the same the controller applies), and a refusal turned into MissingInput (exit 66)."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml

from contract import pack
from contract.errors import PackError
from contract.pack import Pack

from .errors import MissingInput


def read_spec(pack_dir: Path, shown: str | None = None) -> dict[str, Any]:
    """pack.yaml, checked; PackError when it is missing, unreadable or malformed."""
    named = pack.where(pack_dir, shown)
    text = pack.read_text(pack_dir, shown)
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise pack.not_yaml(named, e) from e
    return pack.check_spec(data, named)


def verify_pack(
    pack_dir: Path,
    processors: Iterable[str] = ("face_swapper",),
    shown: str | None = None,
    *,
    filters: bool = False,
    masks: Iterable[str] = (),
    swapper: str | None = None,
) -> Pack:
    """Check pack.yaml, the roles the processors (and the selector's ``filters``: genderage) need, and
    every listed file's sha256. ``shown``: how reasons name the folder (the runner passes its
    data-root-relative path); ``masks``: the mask types (occlusion: the occluder, region: the face parser);
    ``swapper``: the face swapper's model (simswap_256, ghost_256: its embedding converter too)."""
    try:
        spec = read_spec(pack_dir, shown)
        return pack.verify(pack_dir, spec, processors, shown, filters=filters, masks=masks, swapper=swapper)
    except PackError as e:
        raise MissingInput(str(e)) from e
