"""The paste-back mask beyond the box (job file ``mask.types``, contract/masks.py): FaceFusion's
occlusion and region masks, on two plain onnxruntime sessions.

A face's paste-back is limited to the minimum of the masks its job lists. ``box`` is the feathered
box swap.paste_back has always drawn (``feather``/``padding``; without ``box`` it is the bare crop
footprint, feather and padding 0). The two model masks are made here, in the coordinates of the
processor's crop (the swapper's 128-pixel crop, or larger with pixel boost; the enhancer's 512), and
handed to paste_back as its ``extra`` mask:

* ``occlusion`` — the occluder (FaceFusion's xseg contract): the face cropped to the ArcFace
  template at 256 × 256 (the swapper's template, twice its side), fed NHWC float32 0 … 1 in the
  frame's BGR order as FaceFusion feeds it (it does not swap channels for this model); one output
  [1, 256, 256, 1], 1 where the face is visible, 0 where something covers it;
* ``region`` — the face parser (bisenet's contract): the face cropped to the FFHQ-512 template,
  fed NCHW RGB normalised with ImageNet's mean and std; one output [1, 19, 512, 512] of class
  logits; the pixels whose argmax is one of the job's regions' classes.

Each is warped from its own crop into the processor's crop, then softened as FaceFusion does —
Gaussian blur of sigma 5 pixels, values below 0.5 dropped, the rest stretched to 0 … 1 — so its
edge falls just inside the masked area. Outside its crop the occluder knows nothing (1: the box
bounds the paste) and the parser finds no region (0). The two models are loaded only when the
manifest's ``mask_types`` lists them (contract/processors.py MASK_NEEDS); a graph of another shape
is refused naming its role before any item.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import cv2
import numpy as np

from contract.manifest import Manifest
from contract.masks import PARSER_CLASSES, Masks

from . import align
from .errors import MissingInput
from .face_enhancers import FFHQ_512
from .faces import Face
from .swap import Swapped

OCCLUDER_SIZE = 256
PARSER_SIZE = 512
PARSER_MEAN = np.array([0.485, 0.456, 0.406], np.float32)  # ImageNet's, RGB
PARSER_STD = np.array([0.229, 0.224, 0.225], np.float32)
SOFTEN_SIGMA = 5.0  # FaceFusion's blur of both masks, in the processor crop's pixels
ROLES = {"occlusion": "occluder", "region": "face_parser"}  # mask type → pack role

_DTYPES = {"tensor(float16)": np.float16, "tensor(float)": np.float32}


def _dims(value: Any) -> list[Any]:
    return list(value.shape) if value.shape is not None else []


def _fits(shape: list[Any], wanted: list[int]) -> bool:
    """``shape`` is ``[batch, *wanted]``; a symbolic dimension (a name) fits any size."""
    if len(shape) != len(wanted) + 1:
        return False
    return all(not isinstance(d, int) or d == w for d, w in zip(shape[1:], wanted, strict=True))


def _io(session: Any, what: str, wanted_in: list[int], wanted_out: list[int]) -> tuple[str, Any, str]:
    """(input name, its numpy dtype, output name) of a one-in, one-out graph of these shapes."""
    inputs, outputs = session.get_inputs(), session.get_outputs()
    shape_in = _dims(inputs[0]) if len(inputs) == 1 else []
    shape_out = _dims(outputs[0]) if len(outputs) == 1 else []
    fixed = len(shape_in) == len(wanted_in) + 1 and shape_in[1:] == wanted_in  # the input's size must be known
    if not fixed or not _fits(shape_out, wanted_out) or inputs[0].type not in _DTYPES:
        raise MissingInput(
            f"not {what} (wanted one float input [1, {', '.join(map(str, wanted_in))}] and one output "
            f"[1, {', '.join(map(str, wanted_out))}], got inputs {[_dims(i) for i in inputs]} and outputs "
            f"{[_dims(o) for o in outputs]})"
        )
    return inputs[0].name, _DTYPES[inputs[0].type], outputs[0].name


def _into(mask: np.ndarray, matrix: np.ndarray, swapped: Swapped, outside: float) -> np.ndarray:
    """A mask made in a model's crop (``matrix``: frame → that crop) in ``swapped``'s crop, softened."""
    size = swapped.crop.shape[0]
    to_model = np.vstack([matrix, [0.0, 0.0, 1.0]])
    to_crop = np.vstack([swapped.matrix, [0.0, 0.0, 1.0]])
    model_to_crop = (to_crop @ np.linalg.inv(to_model))[:2]
    warped = cv2.warpAffine(mask.astype(np.float32), model_to_crop, (size, size), borderValue=float(outside))
    soft = cv2.GaussianBlur(np.clip(warped, 0.0, 1.0), (0, 0), SOFTEN_SIGMA)
    return np.asarray((np.clip(soft, 0.5, 1.0) - 0.5) * 2.0, np.float32)


@dataclass(frozen=True)
class Occluder:
    """A loaded occluder (xseg contract): ``visible`` gives a face's occlusion mask in its crop."""

    session: Any
    _io: tuple[str, Any, str] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        side = OCCLUDER_SIZE
        object.__setattr__(self, "_io", _io(self.session, "an occluder model", [side, side, 3], [side, side, 1]))

    def visible(self, frame: np.ndarray, face: Face, swapped: Swapped) -> np.ndarray:
        name, dtype, output = self._io
        crop, matrix = align.crop(frame, face.kps, OCCLUDER_SIZE)
        blob = (crop.astype(np.float32) / np.float32(255.0))[None].astype(dtype)  # BGR, as FaceFusion feeds it
        pred = np.asarray(self.session.run([output], {name: blob})[0], np.float32)
        return _into(np.clip(pred[0, :, :, 0], 0.0, 1.0), matrix, swapped, outside=1.0)


@dataclass(frozen=True)
class FaceParser:
    """A loaded face parser (bisenet contract, 19 classes): ``regions`` gives a face's region mask."""

    session: Any
    _io: tuple[str, Any, str] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        side = PARSER_SIZE
        io = _io(self.session, "a face parser model", [3, side, side], [PARSER_CLASSES, side, side])
        object.__setattr__(self, "_io", io)

    def regions(self, frame: np.ndarray, face: Face, swapped: Swapped, classes: Sequence[int]) -> np.ndarray:
        name, dtype, output = self._io
        matrix = cv2.estimateAffinePartial2D(face.kps, FFHQ_512 * PARSER_SIZE, method=cv2.LMEDS)[0]
        crop = cv2.warpAffine(frame, matrix, (PARSER_SIZE, PARSER_SIZE), borderMode=cv2.BORDER_REPLICATE)
        rgb = crop[:, :, ::-1].astype(np.float32) / np.float32(255.0)
        blob = ((rgb - PARSER_MEAN) / PARSER_STD).transpose(2, 0, 1)[None].astype(dtype)
        logits = np.asarray(self.session.run([output], {name: blob})[0], np.float32)
        found = np.isin(logits[0].argmax(axis=0), np.asarray(classes)).astype(np.float32)
        return _into(found, np.asarray(matrix, np.float64), swapped, outside=0.0)


@dataclass(frozen=True)
class Masker:
    """The model masks one job asks for (``types`` without box), bound to the chunk's models."""

    masks: Masks
    occluder: Occluder | None = None
    parser: FaceParser | None = None

    def __post_init__(self) -> None:
        for kind, model in (("occlusion", self.occluder), ("region", self.parser)):
            if kind in self.masks.types and model is None:  # the pack check requires it; a hand-made manifest
                raise MissingInput(f"mask type {kind}: the model pack's {ROLES[kind]} model is not loaded")

    def extra(self, frame: np.ndarray, face: Face, swapped: Swapped) -> np.ndarray | None:
        """The minimum of the occlusion and region masks in ``swapped``'s crop (None: neither listed)."""
        found: list[np.ndarray] = []
        if self.occluder is not None and "occlusion" in self.masks.types:
            found.append(self.occluder.visible(frame, face, swapped))
        if self.parser is not None and "region" in self.masks.types:
            found.append(self.parser.regions(frame, face, swapped, self.masks.classes))
        return np.minimum.reduce(found) if found else None


def box(manifest: Manifest) -> tuple[float, float]:
    """(feather, padding) of the box mask: the job's when ``box`` is listed, else 0 and 0 (the bare
    crop footprint, which only the other masks then shape)."""
    if "box" in manifest.mask_types:
        return manifest.mask_feather, manifest.mask_padding
    return 0.0, 0.0


def of(manifest: Manifest, models: Any) -> Masker | None:
    """The chunk's Masker (None: the box alone, as every job before mask types)."""
    masks = Masks(manifest.mask_types, manifest.mask_regions)
    if not any(t in ROLES for t in masks.types):
        return None
    return Masker(masks, getattr(models, "occluder", None), getattr(models, "face_parser", None))


def extras(masker: Masker | None, frame: np.ndarray, faces: Sequence[Face], crops: Sequence[Swapped]) -> list[Any]:
    """Each face's extra mask for paste_back (None each without a masker), from ``frame`` as it is."""
    if masker is None:
        return [None] * len(crops)
    return [masker.extra(frame, f, c) for f, c in zip(faces, crops, strict=True)]


def load(sessions: Mapping[str, Any], files: Mapping[str, Any], shown: str) -> dict[str, Any]:
    """The loaded occluder and face parser (by role) from their sessions, each contract checked now,
    a refusal naming the pack, the file and the role (exit 66)."""
    out: dict[str, Any] = {}
    for role, kind in (("occluder", Occluder), ("face_parser", FaceParser)):
        if role in sessions:
            try:
                out[role] = kind(sessions[role])
            except MissingInput as e:
                raise MissingInput(f"model pack {shown}: {files[role].name} (role {role}): {e}") from None
    return out


def bind(step: Any, manifest: Manifest, models: Any) -> Any:
    """A face processor that pastes back (a ``masker`` field: the swapper, the face enhancer) with the
    job's masks: its Masker, and the box's feather and padding (0 without ``box``); others as they are."""
    if "masker" not in getattr(step, "__dataclass_fields__", {}):
        return step
    feather, padding = box(manifest)
    return dataclasses.replace(step, masker=of(manifest, models), feather=feather, padding=padding)
