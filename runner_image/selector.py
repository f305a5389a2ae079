"""Which faces of a frame a job changes, and in which order: the one place the image path and the
video frame path (pipeline.py ``_select``) apply the manifest's ``faces`` and its selector
(contract/selector.py).

The filters run first: with ``selector_gender``/``selector_age`` set, every face the genderage model
(genderage.py) judges otherwise is dropped, before ``faces: many | one | reference`` applies. Then
the order sorts what is left, ties broken by the box's left then top edge, so the choice never
depends on the detector's output order: ``one`` takes the first, ``many`` and ``reference`` change
them in that order. An empty result is "no face" (the job's ``no_face``); ``why_none`` says why.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from contract.manifest import FaceSelection, Manifest
from contract.selector import Selector

from . import faces
from .errors import ItemError
from .faces import Face
from .genderage import GENDERS

# each order's sort key; the box's left and top edges break ties
_KEYS: dict[str, Callable[[Face], tuple[float, ...]]] = {
    "left-right": lambda f: (f.box[0], f.box[1]),
    "right-left": lambda f: (-f.box[0], f.box[1]),
    "top-bottom": lambda f: (f.box[1], f.box[0]),
    "bottom-top": lambda f: (-f.box[1], f.box[0]),
    "small-large": lambda f: (f.area, f.box[0], f.box[1]),
    "large-small": lambda f: (-f.area, f.box[0], f.box[1]),
    "best-worst": lambda f: (-f.score, f.box[0], f.box[1]),
    "worst-best": lambda f: (f.score, f.box[0], f.box[1]),
}

Embed = Callable[[np.ndarray, Sequence[Face]], np.ndarray]
Judge = Callable[[np.ndarray, Sequence[Face]], list[tuple[int, int]]]  # genderage.GenderAge.judge


def of(manifest: Manifest) -> Selector:
    return Selector(manifest.selector_order, manifest.selector_gender, manifest.selector_age)


def ordered(found: Sequence[Face], order: str) -> list[Face]:
    """The faces in ``order`` (contract/selector.py ORDERS)."""
    return sorted(found, key=_KEYS[order])


def matching(image: np.ndarray, found: Sequence[Face], sel: Selector, judge: Judge | None) -> list[Face]:
    """The faces whose gender and age the selector accepts (all of them when it does not filter)."""
    if not sel.filters or not found:
        return list(found)
    if judge is None:  # the worker loads genderage whenever the manifest filters
        raise ItemError("the selector filters by gender or age but no genderage model is loaded")
    lo, hi = sel.age
    want = GENDERS.get(sel.gender)
    judged = judge(image, found)
    return [f for f, (g, a) in zip(found, judged, strict=True) if (want is None or g == want) and lo <= a <= hi]


def choose(
    image: np.ndarray, found: Sequence[Face], manifest: Manifest, judge: Judge | None, embed: Embed
) -> list[Face]:
    """The faces to change, in the order to change them. ``judge``: each face's (gender, age), asked
    for only when the selector filters; ``embed``: the faces' embeddings, asked for only with
    ``faces: reference`` (and only of the faces the filters kept)."""
    sel = of(manifest)
    kept = ordered(matching(image, found, sel, judge), sel.order)
    if manifest.faces is FaceSelection.MANY or not kept:
        return kept
    if manifest.faces is FaceSelection.ONE:
        return kept[:1]
    assert manifest.reference_embedding is not None  # the manifest refuses reference without it
    ref = np.asarray(manifest.reference_embedding)
    return faces.by_reference(kept, embed(image, kept), ref, manifest.reference_distance)


def why_none(manifest: Manifest, found: Sequence[Face]) -> str:
    """Why ``choose`` gave no face, for ``no_face: fail``."""
    if not found:
        return "no face detected"
    sel = of(manifest)
    reference = manifest.faces is FaceSelection.REFERENCE
    if sel.filters:
        return f"no face matches the selector ({sel.describe()})" + (" and the reference" if reference else "")
    return "no face matches the reference"
