"""The manifest's tuning fields (contract/manifest.py): which of them a manifest leaves out at their
defaults (``OPTIONAL``), and their ranges as the job file allows them (``check_tuning``). Standard
library only (contract/); the per-feature checks live beside their fields (contract/swapper.py,
contract/masks.py, contract/selector.py, contract/photo.py).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from contract import processors
from contract.errors import ManifestError
from contract.handoff import LINGER_FIELDS
from contract.masks import MASK_FIELDS, check_masks
from contract.photo import PHOTO_FIELDS, check_photo
from contract.selector import Selector
from contract.swapper import SWAPPER_FIELDS, check_swapper

if TYPE_CHECKING:
    from contract.manifest import Manifest

# Left out of the JSON at their defaults: older runners read the file unchanged.
OPTIONAL = (
    "source_embedding",
    "reference_embedding",
    "identity",
    "identity_timeout",
    "reference_distance",
    "detector_threshold",
    "detector_size",
    "mask_feather",
    "mask_padding",
    "enhancer_blend",
    "frame_enhancer_blend",
    "overwrite",
    "selector_order",
    "selector_gender",
    "selector_age",
    "enhancer_model",
    "enhancer_weight",
    *MASK_FIELDS,
    *SWAPPER_FIELDS,
    *PHOTO_FIELDS,
    *LINGER_FIELDS,
)


def check_tuning(m: Manifest) -> None:
    """Ranges as the job file allows them (controller/job/spec.py); a manifest written by hand or by
    an older controller fails here (65) rather than as odd pixels."""
    for name in ("source_embedding", "reference_embedding"):
        emb = getattr(m, name)
        if emb is not None and (not emb or not all(isinstance(v, float) and math.isfinite(v) for v in emb)):
            raise ManifestError(f"{name} must be a non-empty tuple of finite floats")
    if m.source_embedding and m.reference_embedding and len(m.source_embedding) != len(m.reference_embedding):
        raise ManifestError("source_embedding and reference_embedding differ in length")
    if m.faces == "reference" and m.reference_embedding is None and m.identity is None:
        raise ManifestError("faces: reference needs reference_embedding or identity (computed at submit)")
    if not isinstance(m.overwrite, bool):
        raise ManifestError(f"overwrite must be true or false, got {m.overwrite!r}")
    object.__setattr__(m, "selector_age", Selector(m.selector_order, m.selector_gender, m.selector_age).age)
    if not 0 < m.identity_timeout <= 86400:
        raise ManifestError(f"identity_timeout must be in (0, 86400] seconds, got {m.identity_timeout!r}")
    checks = (
        ("reference_distance", m.reference_distance, 0.0, 2.0),
        ("detector_threshold", m.detector_threshold, 0.0, 1.0),
        ("mask_feather", m.mask_feather, 0.0, 0.5),
        ("mask_padding", m.mask_padding, 0.0, 0.5),
        ("enhancer_blend", m.enhancer_blend, 0.0, 1.0),
        ("enhancer_weight", m.enhancer_weight, 0.0, 1.0),
        ("frame_enhancer_blend", m.frame_enhancer_blend, 0.0, 1.0),
    )
    for name, value, lo, hi in checks:
        if not lo <= value <= hi:
            raise ManifestError(f"{name} must be in [{lo:g}, {hi:g}], got {value!r}")
    check_swapper(m.swapper_model, m.swapper_pixel_boost, m.swapper_weight)
    check_masks(m)  # mask_types, mask_regions
    check_photo(m.photo_quality, m.photo_scale)
    if m.enhancer_model not in processors.FACE_ENHANCER_MODELS:
        choices = ", ".join(processors.FACE_ENHANCER_MODELS)
        raise ManifestError(f"enhancer_model must be one of {choices}, got {m.enhancer_model!r}")
    if m.detector_size % 32 or not 160 <= m.detector_size <= 2048:
        raise ManifestError(f"detector_size must be a multiple of 32 from 160 to 2048, got {m.detector_size!r}")
