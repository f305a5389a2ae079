"""Typed fields of a manifest read from JSON (contract/manifest.py): each refusal a ManifestError
naming the field. Standard library only."""

from __future__ import annotations

import math
from typing import Any

from contract.errors import ManifestError
from contract.handoff import read_fields as linger_fields
from contract.masks import read_fields as mask_fields
from contract.photo import read_fields as photo_fields
from contract.s3 import StorageAccess
from contract.selector import read_fields as selector_fields
from contract.swapper import read_fields as swapper_fields


def optional_fields(data: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name in ("source_embedding", "reference_embedding"):
        if data.get(name) is not None:
            out[name] = embedding_field(data[name], name)
    if data.get("identity") is not None:
        out["identity"] = text_field(data, "identity")
    for name in (
        "reference_distance",
        "detector_threshold",
        "mask_feather",
        "mask_padding",
        "enhancer_blend",
        "enhancer_weight",
        "frame_enhancer_blend",
        "identity_timeout",
    ):
        if name in data:
            out[name] = number_field(data[name], name)
    if "enhancer_model" in data:
        out["enhancer_model"] = text_field(data, "enhancer_model")
    if "overwrite" in data:
        if not isinstance(data["overwrite"], bool):
            raise ManifestError(f"overwrite must be true or false, got {data['overwrite']!r}")
        out["overwrite"] = data["overwrite"]
    if data.get("storage") is not None:
        out["storage"] = StorageAccess.from_dict(data["storage"])
    out.update(selector_fields(data))  # selector_order, selector_gender, selector_age
    out.update(mask_fields(data))  # mask_types, mask_regions
    out.update(swapper_fields(data))  # swapper_model, swapper_pixel_boost, swapper_weight
    out.update(photo_fields(data))  # photo_quality, photo_scale
    out.update(linger_fields(data))  # linger, handoff
    if "detector_size" in data:
        value = data["detector_size"]
        if not isinstance(value, int) or isinstance(value, bool):
            raise ManifestError(f"detector_size must be an integer, got {value!r}")
        out["detector_size"] = value
    return out


def number_field(value: Any, name: str) -> float:
    if not isinstance(value, int | float) or isinstance(value, bool) or not math.isfinite(value):
        raise ManifestError(f"{name} must be a finite number, got {value!r}")
    return float(value)


def embedding_field(value: Any, name: str) -> tuple[float, ...]:
    if not isinstance(value, list | tuple) or not value:
        raise ManifestError(f"{name} must be a non-empty list of numbers")
    return tuple(number_field(v, name) for v in value)


def text_field(data: dict[str, Any], key: str) -> str:
    value = data[key]
    if not isinstance(value, str) or not value:
        raise ManifestError(f"manifest field {key!r} must be a non-empty string")
    return value
