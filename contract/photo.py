"""A job's photo outputs (job file ``photo: {quality, scale}``), as the manifest carries them
(``photo_quality``, ``photo_scale``; left out at their defaults, so an older manifest reads as today's
outputs). Standard library only (contract/).

``quality``: the JPEG and WebP encoders' quality, 1 … 100 (PNG, BMP and TIFF are lossless and ignore
it). ``scale``: every photo output is resized by it after the processors (after a frame enhancer
too), rounded to whole pixels, at least 1 (runner_image/media.py ``encode_output``). Videos are not
affected: their quality is the job file's ``video.crf``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from contract.errors import ManifestError

PHOTO_QUALITY = 95  # the JPEG/WebP quality photo outputs always had
PHOTO_SCALE = 1.0
QUALITY_RANGE = (1, 100)
SCALE_RANGE = (0.25, 4.0)
PHOTO_FIELDS = ("photo_quality", "photo_scale")  # the manifest's, both optional


def quality_problem(value: Any) -> str | None:
    """Why ``value`` is not a photo quality (None: it is one)."""
    if isinstance(value, int) and not isinstance(value, bool) and QUALITY_RANGE[0] <= value <= QUALITY_RANGE[1]:
        return None
    return "must be an integer from 1 to 100"


def scale_problem(value: Any) -> str | None:
    """Why ``value`` is not a photo scale (None: it is one)."""
    number = isinstance(value, int | float) and not isinstance(value, bool)
    if number and math.isfinite(value) and SCALE_RANGE[0] <= value <= SCALE_RANGE[1]:
        return None
    return "must be a number in [0.25, 4]"


def check_photo(quality: Any, scale: Any) -> None:
    """The manifest's two fields; ManifestError naming the first one refused."""
    for name, value, why in (
        ("photo_quality", quality, quality_problem(quality)),
        ("photo_scale", scale, scale_problem(scale)),
    ):
        if why is not None:
            raise ManifestError(f"{name} {why}, got {value!r}")


def scaled_size(width: int, height: int, scale: float) -> tuple[int, int]:
    """``width`` × ``height`` resized by ``scale``, rounded to whole pixels (at least 1)."""
    return max(1, round(width * scale)), max(1, round(height * scale))


@dataclass(frozen=True)
class PhotoTuning:
    """A job's photo settings on their way into every manifest of the job (checked when built)."""

    quality: int = PHOTO_QUALITY
    scale: float = PHOTO_SCALE

    def __post_init__(self) -> None:
        check_photo(self.quality, self.scale)
        object.__setattr__(self, "scale", float(self.scale))

    def manifest_fields(self) -> dict[str, Any]:
        """The manifest's keyword arguments."""
        return {"photo_quality": self.quality, "photo_scale": self.scale}


def read_fields(data: dict[str, Any]) -> dict[str, Any]:
    """The photo fields present in ``data`` (parsed JSON), typed; the ranges are checked when the
    Manifest is built (``check_photo``)."""
    out: dict[str, Any] = {}
    if "photo_quality" in data:
        value = data["photo_quality"]
        if not isinstance(value, int) or isinstance(value, bool):
            raise ManifestError(f"photo_quality must be an integer, got {value!r}")
        out["photo_quality"] = value
    if "photo_scale" in data:
        value = data["photo_scale"]
        if not isinstance(value, int | float) or isinstance(value, bool) or not math.isfinite(value):
            raise ManifestError(f"photo_scale must be a finite number, got {value!r}")
        out["photo_scale"] = float(value)
    return out
