"""The face swapper's settings (job file ``face_swapper: {model, pixel_boost, weight}``), as the
manifest carries them (``swapper_model``, ``swapper_pixel_boost``, ``swapper_weight``; left out at
their defaults, so an older manifest reads as today's swap). Standard library only (contract/).

``model``: the inswapper models only for now (FaceFusion's names); the pack's file decides what runs,
the name is checked against its pack.yaml ``model:`` when that records one. ``pixel_boost``: the side
of the aligned crop in pixels, a multiple of the model's 128 — the crop is split into
(boost/128)² interleaved 128-pixel tiles, each swapped, and put back together (FaceFusion's pixel
boost; runner_image/pixel_boost.py). ``weight``: how much of the source identity goes in, 1 all of it
(as before), 0 the target face's own (runner_image/pixel_boost.py ``mixed_identity``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from contract.errors import ManifestError

SWAPPER_MODELS = ("inswapper_128", "inswapper_128_fp16")  # other swapper models: not built yet
SWAPPER_MODEL = "inswapper_128"
SWAPPER_SIZE = 128  # the inswapper models' crop side
PIXEL_BOOSTS = (128, 256, 512, 1024)
PIXEL_BOOST = 128
SWAPPER_WEIGHT = 1.0
SWAPPER_FIELDS = ("swapper_model", "swapper_pixel_boost", "swapper_weight")  # the manifest's, all optional


def model_problem(value: Any) -> str | None:
    """Why ``value`` is not a swapper model this runner has (None: it is one)."""
    if isinstance(value, str) and value in SWAPPER_MODELS:
        return None
    return f"must be one of {', '.join(SWAPPER_MODELS)} (other swapper models are not built yet)"


def pixel_boost_problem(value: Any) -> str | None:
    """Why ``value`` is not a pixel boost (None: it is one)."""
    if isinstance(value, int) and not isinstance(value, bool) and value in PIXEL_BOOSTS:
        return None
    return f"must be one of {', '.join(str(b) for b in PIXEL_BOOSTS)} (the crop's side in pixels)"


def weight_problem(value: Any) -> str | None:
    """Why ``value`` is not a weight in [0, 1] (None: it is one)."""
    number = isinstance(value, int | float) and not isinstance(value, bool)
    if number and math.isfinite(value) and 0 <= value <= 1:
        return None
    return "must be a number in [0, 1]"


def check_swapper(model: Any, pixel_boost: Any, weight: Any) -> None:
    """The manifest's three fields; ManifestError naming the first one refused."""
    for name, value, why in (
        ("swapper_model", model, model_problem(model)),
        ("swapper_pixel_boost", pixel_boost, pixel_boost_problem(pixel_boost)),
        ("swapper_weight", weight, weight_problem(weight)),
    ):
        if why is not None:
            raise ManifestError(f"{name} {why}, got {value!r}")


@dataclass(frozen=True)
class SwapperTuning:
    """A job's face_swapper settings on their way into every manifest of the job (checked when built)."""

    model: str = SWAPPER_MODEL
    pixel_boost: int = PIXEL_BOOST
    weight: float = SWAPPER_WEIGHT

    def __post_init__(self) -> None:
        check_swapper(self.model, self.pixel_boost, self.weight)

    def manifest_fields(self) -> dict[str, Any]:
        """The manifest's keyword arguments."""
        return {"swapper_model": self.model, "swapper_pixel_boost": self.pixel_boost, "swapper_weight": self.weight}


def read_fields(data: dict[str, Any]) -> dict[str, Any]:
    """The swapper's manifest fields present in ``data`` (parsed JSON), typed; the choices are checked
    when the Manifest is built (``check_swapper``)."""
    out: dict[str, Any] = {}
    if "swapper_model" in data:
        if not isinstance(data["swapper_model"], str):
            raise ManifestError(f"swapper_model must be a string, got {data['swapper_model']!r}")
        out["swapper_model"] = data["swapper_model"]
    if "swapper_pixel_boost" in data:
        value = data["swapper_pixel_boost"]
        if not isinstance(value, int) or isinstance(value, bool):
            raise ManifestError(f"swapper_pixel_boost must be an integer, got {value!r}")
        out["swapper_pixel_boost"] = value
    if "swapper_weight" in data:
        value = data["swapper_weight"]
        if not isinstance(value, int | float) or isinstance(value, bool) or not math.isfinite(value):
            raise ManifestError(f"swapper_weight must be a finite number, got {value!r}")
        out["swapper_weight"] = float(value)
    return out
