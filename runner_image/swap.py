"""Swapping: inswapper on each face's aligned 128x128 crop, then our own paste-back.

insightface's ``INSwapper.get(paste_back=True)`` warps the crop, a white mask and a diff map over
the WHOLE frame, then erodes and blurs the full-frame mask, once per face: on a 1280x886 photo with
six faces that is most of the runtime (FIELD-NOTES). The result only differs from the input inside
the warped crop's footprint, so we do the same arithmetic on that footprint alone (plus a margin as
wide as the blur, so erosion and blur see exactly the zeros they would see full-frame). The output
matches insightface's to within interpolation rounding; tests compare the two.
"""

from __future__ import annotations

import contextlib
import math
import sys
from dataclasses import dataclass
from typing import Any

import cv2
import numpy as np
from insightface.app.common import Face as InsightFace

from .faces import Face

MASK_THRESHOLD = 20  # insightface: warped white mask values above this count as inside


@dataclass(frozen=True)
class Swapped:
    """The swapped 128x128 BGR crop and the similarity transform frame -> crop (2x3)."""

    crop: np.ndarray
    matrix: np.ndarray


class Swapper:
    """inswapper bound to one source identity (the embedding is fixed for the whole chunk)."""

    def __init__(self, model: Any, identity: np.ndarray) -> None:
        self._model = model
        self._source = InsightFace(embedding=np.asarray(identity, dtype=np.float32))

    def swap(self, image: np.ndarray, face: Face) -> Swapped:
        with contextlib.redirect_stdout(sys.stderr):
            crop, matrix = self._model.get(image, InsightFace(kps=face.kps), self._source, paste_back=False)
        return Swapped(crop=crop, matrix=np.asarray(matrix, dtype=np.float64))


@dataclass(frozen=True)
class Region:
    """A frame rectangle [x0, x1) x [y0, y1)."""

    x0: int
    y0: int
    x1: int
    y1: int

    @property
    def width(self) -> int:
        return self.x1 - self.x0

    @property
    def height(self) -> int:
        return self.y1 - self.y0


def footprint(inverse: np.ndarray, size: int, frame_w: int, frame_h: int) -> tuple[Region, int] | None:
    """Where the crop lands in the frame (with a blur-wide margin), and the blur half-width.

    None when the crop lands entirely outside the frame.
    """
    corners = np.array([[0, 0, 1], [size, 0, 1], [0, size, 1], [size, size, 1]], dtype=np.float64)
    pts = corners @ inverse.T
    xs, ys = pts[:, 0], pts[:, 1]
    vis_w = min(frame_w, math.ceil(xs.max())) - max(0, math.floor(xs.min()))
    vis_h = min(frame_h, math.ceil(ys.max())) - max(0, math.floor(ys.min()))
    if vis_w <= 0 or vis_h <= 0:
        return None
    blur = max(int(math.sqrt(vis_w * vis_h)) // 20, 5)
    margin = blur + 4
    region = Region(
        max(0, math.floor(xs.min()) - margin),
        max(0, math.floor(ys.min()) - margin),
        min(frame_w, math.ceil(xs.max()) + margin),
        min(frame_h, math.ceil(ys.max()) + margin),
    )
    return region, blur


def paste_back(frame: np.ndarray, swapped: Swapped) -> Region | None:
    """Blend one swapped crop into ``frame`` in place, touching only the crop's footprint.

    Same steps as insightface's paste-back: warp crop and a white mask back, threshold the mask,
    erode it by a tenth of the face size, blur it by a twentieth, alpha-blend, truncate to uint8.
    Returns the region written (None if the face lies outside the frame).
    """
    size = swapped.crop.shape[0]
    inverse = cv2.invertAffineTransform(swapped.matrix)
    frame_h, frame_w = frame.shape[:2]
    placed = footprint(inverse, size, frame_w, frame_h)
    if placed is None:
        return None
    region, _ = placed
    local = inverse.copy()
    local[0, 2] -= region.x0
    local[1, 2] -= region.y0
    dsize = (region.width, region.height)
    fake = cv2.warpAffine(swapped.crop, local, dsize, borderValue=0.0)
    white = np.full((size, size), 255, dtype=np.float32)
    mask = cv2.warpAffine(white, local, dsize, borderValue=0.0)
    mask[mask > MASK_THRESHOLD] = 255
    rows, cols = np.nonzero(mask == 255)
    if rows.size == 0:
        return None
    mask_size = int(math.sqrt(float(rows.max() - rows.min()) * float(cols.max() - cols.min())))
    k = max(mask_size // 10, 10)
    mask = cv2.erode(mask, np.ones((k, k), np.uint8), iterations=1)
    k = max(mask_size // 20, 5)
    alpha = (cv2.GaussianBlur(mask, (2 * k + 1, 2 * k + 1), 0) / np.float32(255))[:, :, None]
    target = frame[region.y0 : region.y1, region.x0 : region.x1]
    merged = alpha * fake + (1 - alpha) * target.astype(np.float32)
    frame[region.y0 : region.y1, region.x0 : region.x1] = merged.astype(np.uint8)
    return region
