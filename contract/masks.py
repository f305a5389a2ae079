"""The paste-back mask's kinds (job file ``mask: {types, regions, feather, padding}``), FaceFusion's
face mask types and regions.

``types`` lists the masks a face's paste-back is limited to; the final mask is their minimum (the
intersection): ``box`` the feathered crop box (``feather``/``padding``, insightface's paste-back),
``occlusion`` where the occluder model (FaceFusion's xseg contract) sees the face unoccluded, and
``region`` the pixels the face parser model (bisenet's contract, 19 classes) labels as one of
``regions``. occlusion needs the pack's ``occluder`` role and region its ``face_parser``
(contract/processors.py MASK_NEEDS): a job loads each only when its types list it.

The manifest carries them as ``mask_types`` and ``mask_regions``, left out at their defaults
(``[box]``, every region), so older manifests read as the box mask they always were. Standard
library only (contract/).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from contract.errors import ManifestError

MASK_TYPES = ("box", "occlusion", "region")
DEFAULT_TYPES = ("box",)
# FaceFusion's region names → the face parser's class ids (bisenet on CelebAMask-HQ: 0 is background;
# ears, earrings, neck, cloth, hair and hat, 7–9 and 14–18, are not exposed)
REGION_CLASSES: Mapping[str, int] = MappingProxyType(
    {
        "skin": 1,
        "left-eyebrow": 2,
        "right-eyebrow": 3,
        "left-eye": 4,
        "right-eye": 5,
        "glasses": 6,
        "nose": 10,
        "mouth": 11,
        "upper-lip": 12,
        "lower-lip": 13,
    }
)
REGIONS = tuple(REGION_CLASSES)  # the default: every region
PARSER_CLASSES = 19  # the face parser's output channels
MASK_FIELDS = ("mask_types", "mask_regions")  # the manifest's optional fields


def types_problem(types: Any) -> tuple[int | None, str] | None:
    """(index or None for the whole list, why) when ``types`` is not a non-empty list of distinct
    mask types; None when it is."""
    return _list_problem(types, MASK_TYPES, "mask type")


def regions_problem(regions: Any) -> tuple[int | None, str] | None:
    """As ``types_problem``, for the face parser's region names."""
    return _list_problem(regions, REGIONS, "region")


def _list_problem(values: Any, choices: tuple[str, ...], what: str) -> tuple[int | None, str] | None:
    if not isinstance(values, list | tuple) or not values:
        return None, f"must be a non-empty list of {what}s ({', '.join(choices)})"
    for i, v in enumerate(values):
        if not isinstance(v, str) or v not in choices:
            shown = repr(v) if isinstance(v, str) else type(v).__name__
            return i, f"unknown {what} {shown} (choose from {', '.join(choices)})"
        if v in values[:i]:
            return i, f"{v!r} is listed twice"
    return None


@dataclass(frozen=True)
class Masks:
    """A job's mask types and regions as the manifest carries them (``mask_types``,
    ``mask_regions``); checked when built (ManifestError naming the manifest field)."""

    types: tuple[str, ...] = DEFAULT_TYPES
    regions: tuple[str, ...] = REGIONS

    def __post_init__(self) -> None:
        checks = (("mask_types", types_problem(self.types)), ("mask_regions", regions_problem(self.regions)))
        for name, problem in checks:
            if problem is not None:
                at = "" if problem[0] is None else f"[{problem[0]}]"
                raise ManifestError(f"{name}{at} {problem[1]}")
        object.__setattr__(self, "types", tuple(self.types))
        object.__setattr__(self, "regions", tuple(self.regions))

    @property
    def classes(self) -> tuple[int, ...]:
        """The face parser's class ids of ``regions``."""
        return tuple(REGION_CLASSES[r] for r in self.regions)

    def manifest_fields(self) -> dict[str, Any]:
        """The manifest's keyword arguments for these masks."""
        return {"mask_types": self.types, "mask_regions": self.regions}


def read_fields(data: dict[str, Any]) -> dict[str, Any]:
    """The masks' manifest fields present in ``data`` (parsed JSON), as tuples; their values are
    checked when the Manifest is built (``check_masks``)."""
    out: dict[str, Any] = {}
    for name in MASK_FIELDS:
        if name in data:
            if not isinstance(data[name], list):
                raise ManifestError(f"{name} must be a list of names, got {data[name]!r}")
            out[name] = tuple(data[name])
    return out


def check_masks(manifest: Any) -> Masks:
    """A manifest's two fields checked (ManifestError naming the field) and stored as tuples."""
    masks = Masks(manifest.mask_types, manifest.mask_regions)
    object.__setattr__(manifest, "mask_types", masks.types)
    object.__setattr__(manifest, "mask_regions", masks.regions)
    return masks
