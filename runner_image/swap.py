"""Swapping: inswapper on each face's aligned 128x128 crop, then our own paste-back (also used by
the enhancer's 512x512 crops).

insightface's ``INSwapper.get(paste_back=True)`` warps the crop, a white mask and a diff map over
the WHOLE frame, then erodes and blurs the full-frame mask, once per face: on a 1280x886 photo with
six faces that is most of the runtime (benchmarks/RESULTS.md, "Runner: insightface loop vs the
ffswarm runner"). The result only differs from the input inside
the warped crop's footprint, so we do the same arithmetic on that footprint alone (plus a margin as
wide as the blur, so erosion and blur see exactly the zeros they would see full-frame). The output
matches insightface's to within interpolation rounding; tests compare the two.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import cv2
import numpy as np

from contract.manifest import MASK_FEATHER, MASK_PADDING

from . import align, pixel_boost
from .faces import Face

MASK_THRESHOLD = 20  # insightface: warped white mask values above this count as inside


@dataclass(frozen=True)
class Swapped:
    """The swapped 128x128 BGR crop and the similarity transform frame -> crop (2x3)."""

    crop: np.ndarray
    matrix: np.ndarray


class Swapper:
    """inswapper bound to one source identity (the embedding is fixed for the whole chunk).

    Runs the session itself rather than through ``INSwapper.get``: the same arithmetic (crop by
    ``norm_crop2``, RGB/255, latent = normalise(embedding @ emap)), but it feeds and reads whatever
    float type the graph declares, so inswapper_128_fp16 (float16 I/O) works as well as the fp32
    model. ``session.run`` is thread-safe, so several items may call ``swap`` at once.
    ``pixel_boost`` (the crop's side, a multiple of the model's) and ``weight`` (below 1: the source
    identity mixed with each target face's own, whose embedding ``swap`` is then given) are
    runner_image/pixel_boost.py's; at 128 and 1 the swap is inswapper's own.
    """

    def __init__(self, model: Any, identity: np.ndarray, *, pixel_boost: int = 128, weight: float = 1.0) -> None:
        self._session = model.session
        inputs = self._session.get_inputs()
        self._names = [i.name for i in inputs]
        self._output = self._session.get_outputs()[0].name
        self._size = int(model.input_size[0])
        self._dtypes = [np.float16 if i.type == "tensor(float16)" else np.float32 for i in inputs]
        self._emap = np.asarray(model.emap, dtype=np.float32)
        self._identity = np.asarray(identity, dtype=np.float32).reshape(1, -1)
        self._latent = self._latent_of(self._identity)
        if pixel_boost % self._size:
            raise ValueError(f"pixel_boost {pixel_boost} is not a multiple of the model's {self._size}")
        self.pixel_boost, self.weight = pixel_boost, float(weight)

    def _latent_of(self, identity: np.ndarray) -> np.ndarray:
        latent = identity / np.linalg.norm(identity)
        latent = latent @ self._emap
        out: np.ndarray = (latent / np.linalg.norm(latent)).astype(self._dtypes[1])
        return out

    @property
    def needs_target(self) -> bool:
        """Whether ``swap`` wants the target face's embedding (a weight below 1)."""
        return self.weight < 1.0

    def swap(self, image: np.ndarray, face: Face, target: np.ndarray | None = None) -> Swapped:
        latent = self._latent
        if target is not None and self.needs_target:
            latent = self._latent_of(pixel_boost.mixed_identity(self._identity, target, self.weight))
        crop, matrix = align.crop(image, face.kps, self.pixel_boost)
        fake = pixel_boost.swap_tiles(crop, self._size, lambda tile: self._run(tile, latent))
        return Swapped(crop=np.ascontiguousarray(fake), matrix=np.asarray(matrix, dtype=np.float64))

    def _run(self, tile: np.ndarray, latent: np.ndarray) -> np.ndarray:
        """One model call: a 128² BGR tile in, the swapped 128² BGR tile out."""
        blob = cv2.dnn.blobFromImage(tile, 1.0 / 255.0, (self._size, self._size), (0.0, 0.0, 0.0), swapRB=True)
        feed = {self._names[0]: blob.astype(self._dtypes[0]), self._names[1]: latent}
        pred = np.asarray(self._session.run([self._output], feed)[0], dtype=np.float32)
        out: np.ndarray = np.clip(255 * pred[0].transpose(1, 2, 0), 0, 255).astype(np.uint8)[:, :, ::-1]
        return out


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


def scaled(size: float, fraction: float) -> int:
    """``fraction`` of a face ``size`` in whole pixels, never below that fraction of 100 px: at the
    defaults (0.1 erosion, 0.05 blur) exactly insightface's ``max(size//10, 10)``/``max(size//20, 5)``."""
    if fraction <= 0:
        return 0
    return max(int(size * fraction + 1e-9), round(100 * fraction))


def footprint(
    inverse: np.ndarray, size: int, frame_w: int, frame_h: int, feather: float = MASK_FEATHER
) -> tuple[Region, int] | None:
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
    blur = scaled(int(math.sqrt(vis_w * vis_h)), feather)
    margin = blur + 4
    region = Region(
        max(0, math.floor(xs.min()) - margin),
        max(0, math.floor(ys.min()) - margin),
        min(frame_w, math.ceil(xs.max()) + margin),
        min(frame_h, math.ceil(ys.max()) + margin),
    )
    return region, blur


def paste_back(
    frame: np.ndarray,
    swapped: Swapped,
    *,
    feather: float = MASK_FEATHER,
    padding: float = MASK_PADDING,
    blend: float = 1.0,
    extra: np.ndarray | None = None,
) -> Region | None:
    """Blend one processed crop into ``frame`` in place, touching only the crop's footprint.

    Same steps as insightface's paste-back: warp crop and a white mask back, threshold the mask,
    erode it by ``padding`` of the face size (insightface: a tenth), blur it by ``feather`` (a
    twentieth), alpha-blend (scaled by ``blend``), truncate to uint8. Returns the region written
    (None if the face lies outside the frame). ``extra``: a further mask (0 … 1) in the crop's own
    coordinates (runner_image/masks.py: occlusion, region), the blend limited to its minimum with the box.
    """
    size = swapped.crop.shape[0]
    inverse = cv2.invertAffineTransform(swapped.matrix)
    frame_h, frame_w = frame.shape[:2]
    placed = footprint(inverse, size, frame_w, frame_h, feather)
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
    k = scaled(mask_size, padding)
    if k > 1:
        mask = cv2.erode(mask, np.ones((k, k), np.uint8), iterations=1)
    k = scaled(mask_size, feather)
    if k > 0:
        mask = cv2.GaussianBlur(mask, (2 * k + 1, 2 * k + 1), 0)
    if extra is not None:  # warped as the crop is: zero outside it
        mask = np.minimum(mask, cv2.warpAffine(extra.astype(np.float32) * np.float32(255), local, dsize))
    alpha = (mask / np.float32(255))[:, :, None]
    if blend < 1.0:
        alpha *= np.float32(blend)
    target = frame[region.y0 : region.y1, region.x0 : region.x1]
    merged = alpha * fake + (1 - alpha) * target.astype(np.float32)
    frame[region.y0 : region.y1, region.x0 : region.x1] = merged.astype(np.uint8)
    return region
