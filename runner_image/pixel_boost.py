"""The face swapper's ``pixel_boost`` and ``weight`` (job file ``face_swapper``, contract/swapper.py).

Pixel boost, as FaceFusion does it (face_swapper/core.py, face_helper.py): the face is cropped at
``boost`` pixels with the same ArcFace template scaled to that size, the crop is split into k² tiles
of the model's 128 pixels by taking every k-th pixel (k = boost/128; tile (i, j) = crop[i::k, j::k],
"implode"), the model runs on each tile with the same source latent, and the outputs go back where
their pixels came from ("explode"). Each tile is the whole face at 128 pixels, offset by a fraction
of a pixel, so the model sees what it was trained on while the result has k times the detail; the
boost-sized result is pasted back like a 128 one (runner_image/swap.py paste_back).

Weight: ``normalise(target·(1 − weight) + source·weight)`` of the two L2-normalised ArcFace
embeddings — the target face's own and the job's source — is the identity projected through
``emap`` (1: the source alone, the plain swap; 0: the target face's own). FaceFusion's
``face_swapper_weight`` is a different curve: it maps its weight onto α from +0.35 to −0.35 and feeds
``latent·(1 − α) + target·α`` (so its 0.5 is the source alone and its 1 pushes past it, away from
the target); ffswarm keeps 1 as the plain swap and 0 as the target's own identity.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from . import faces
from .errors import MissingInput
from .faces import Face

Model = Callable[[np.ndarray], np.ndarray]  # one 128² BGR uint8 tile -> the swapped 128² BGR uint8 tile


def implode(crop: np.ndarray, k: int) -> np.ndarray:
    """The k² tiles of an (n·k)² crop, tile i·k + j being ``crop[i::k, j::k]`` (FaceFusion's
    ``implode_pixel_boost``), as one array [k², n, n, channels]."""
    size = crop.shape[0]
    if crop.shape[1] != size or size % k:
        raise ValueError(f"a {crop.shape[1]}x{size} crop does not split into {k}x{k} tiles")
    n = size // k
    tiles = crop.reshape(n, k, n, k, -1).transpose(1, 3, 0, 2, 4)
    return np.ascontiguousarray(tiles.reshape(k * k, n, n, -1))


def explode(tiles: np.ndarray, k: int) -> np.ndarray:
    """The inverse of ``implode``: tile i·k + j's pixels back at ``[i::k, j::k]`` of one crop
    (FaceFusion's ``explode_pixel_boost``)."""
    count, n = tiles.shape[0], tiles.shape[1]
    if count != k * k:
        raise ValueError(f"{count} tiles are not {k}x{k}")
    crop = tiles.reshape(k, k, n, n, -1).transpose(2, 0, 3, 1, 4)
    return np.ascontiguousarray(crop.reshape(n * k, n * k, -1))


def swap_tiles(crop: np.ndarray, size: int, model: Model) -> np.ndarray:
    """The boost-sized ``crop`` swapped tile by tile by ``model`` (one call per tile) and put back
    together; a crop of the model's own ``size`` is one call, as without pixel boost."""
    k = crop.shape[0] // size
    if k == 1:
        return model(crop)
    tiles = implode(crop, k)
    return explode(np.stack([model(t) for t in tiles]), k)


def mixed_identity(source: np.ndarray, target: np.ndarray, weight: float) -> np.ndarray:
    """The identity a face is swapped to: ``normalise(target·(1 − weight) + source·weight)`` of the
    two L2-normalised embeddings (see the module's docstring for how FaceFusion's weight differs)."""
    src = np.asarray(source, dtype=np.float32).reshape(1, -1)
    tgt = np.asarray(target, dtype=np.float32).reshape(1, -1)
    src = src / np.linalg.norm(src)
    tgt = tgt / np.linalg.norm(tgt)
    mixed = tgt * np.float32(1.0 - weight) + src * np.float32(weight)
    norm = float(np.linalg.norm(mixed))
    return src if norm < 1e-6 else mixed / np.float32(norm)  # opposite identities at 0.5: the source's


def target_embeddings(recognizer: Any, frame: np.ndarray, found: Sequence[Face], needed: bool) -> list[Any]:
    """Each face's own ArcFace embedding (one batched run) when the swapper's weight ``needed`` it,
    else None for each: at weight 1 nothing more runs than before."""
    if not needed or not found:
        return [None] * len(found)
    if recognizer is None:  # the recogniser is loaded for every chunk; this guards a processor built by hand
        raise MissingInput("face_swapper: a weight below 1 needs the pack's recognizer")
    return list(faces.embed(recognizer, frame, found))
