"""The face swappers beyond inswapper: simswap_256, hyperswap_1a_256 and ghost_256, on plain
onnxruntime sessions (insightface's model_zoo knows none of them). Their contracts — input size,
normalisation, template, how the source embedding is made, how the output is read — are
contract/swapper.py's (CONTRACTS, with where each fact comes from); this module only applies them.

Each face is cropped onto the model's template at the job's pixel boost (a multiple of the model's
256), split into interleaved 256-pixel tiles (runner_image/pixel_boost.py, as inswapper's 128 ones),
each tile run with the same source, and the crop goes back through swap.paste_back like inswapper's.
The source is made once per chunk from the job's ArcFace identity: normalised (hyperswap), or run
through the pack's embedding converter (simswap: then normalised; ghost: as it comes). A weight
below 1 mixes the ArcFace embeddings first (pixel_boost.mixed_identity), then converts the mix.

Both graphs are checked when the chunk loads (``load``), before any item: a file of another shape is
refused naming the pack, the file and its role (exit 66). ``session.run`` is thread-safe, so several
items may call ``swap`` at once.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from contract.swapper import SwapperContract, converter_problem, graph_problem

from . import align, pixel_boost
from .errors import MissingInput
from .faces import Face
from .swap import Swapped

_DTYPES = {"tensor(float16)": np.float16, "tensor(float)": np.float32}


def _dims(value: Any) -> list[Any]:
    return list(value.shape) if value.shape is not None else []


def _signature(session: Any) -> tuple[list[tuple[str, list[Any]]], list[list[Any]]]:
    return [(i.name, _dims(i)) for i in session.get_inputs()], [_dims(o) for o in session.get_outputs()]


@dataclass(frozen=True)
class SwapperModel:
    """A loaded swapper of one of these contracts, and its embedding converter when it takes one."""

    contract: SwapperContract
    session: Any
    converter: Any = None  # an onnxruntime session: contract.converter's model

    def convert(self, identity: np.ndarray) -> np.ndarray:
        """The converter's output [1, 512] for an ArcFace identity (CrossFace normalises its input itself)."""
        given = self.converter.get_inputs()[0]
        feed = {given.name: identity.reshape(1, -1).astype(_DTYPES.get(given.type, np.float32))}
        out = self.converter.run([self.converter.get_outputs()[0].name], feed)[0]
        return np.asarray(out, dtype=np.float32).reshape(1, -1)


def load(contract: SwapperContract, sessions: Mapping[str, Any], files: Mapping[str, Any], shown: str) -> SwapperModel:
    """The chunk's swapper (and converter) from their sessions, each graph checked against
    ``contract`` now; a refusal names the pack, the file and the role (exit 66)."""
    why = graph_problem(contract.model, *_signature(sessions["swapper"]))
    if why is not None:
        raise MissingInput(f"model pack {shown}: {files['swapper'].name} (role swapper): {why}")
    converter = None
    if contract.converter is not None:
        if "swapper_converter" not in sessions:  # the pack check requires it; this guards a call by hand
            raise MissingInput(
                f"model pack {shown}: no swapper_converter loaded ({contract.model} needs {contract.converter})"
            )
        converter = sessions["swapper_converter"]
        if (why := converter_problem(*_signature(converter))) is not None:
            raise MissingInput(f"model pack {shown}: {files['swapper_converter'].name} (role swapper_converter): {why}")
    return SwapperModel(contract, sessions["swapper"], converter)


@dataclass
class EmbeddingSwapper:
    """One of these swappers bound to a source identity, at a pixel boost and weight (the same
    meaning as swap.Swapper's: see runner_image/pixel_boost.py)."""

    model: SwapperModel
    identity: np.ndarray
    pixel_boost: int = 256
    weight: float = 1.0
    _io: dict[str, Any] = field(default_factory=dict, init=False, repr=False)

    def __post_init__(self) -> None:
        c, session = self.model.contract, self.model.session
        if self.pixel_boost % c.size:
            raise ValueError(f"pixel_boost {self.pixel_boost} is not a multiple of {c.model}'s {c.size}")
        inputs = {i.name: i for i in session.get_inputs()}
        self.identity = np.asarray(self.identity, dtype=np.float32).reshape(1, -1)
        self._io = {
            "target": ("target", _DTYPES.get(inputs["target"].type, np.float32)),
            "source": ("source", _DTYPES.get(inputs["source"].type, np.float32)),
            "output": session.get_outputs()[0].name,
            "points": np.asarray(c.points, dtype=np.float32),
            "mean": np.asarray(c.mean, dtype=np.float32),
            "std": np.asarray(c.std, dtype=np.float32),
        }
        self._io["fixed"] = self.source_of(self.identity)

    @property
    def needs_target(self) -> bool:
        """Whether ``swap`` wants the target face's embedding (a weight below 1)."""
        return self.weight < 1.0

    def source_of(self, identity: np.ndarray) -> np.ndarray:
        """The graph's ``source`` [1, 512] for an ArcFace identity, as the contract prepares it."""
        how = self.model.contract.source
        vector = self.model.convert(identity) if how.startswith("converted") else identity.reshape(1, -1)
        if how in ("unit", "converted_unit"):
            vector = vector / max(float(np.linalg.norm(vector)), 1e-12)
        out: np.ndarray = vector.astype(self._io["source"][1])
        return out

    def swap(self, image: np.ndarray, face: Face, target: np.ndarray | None = None) -> Swapped:
        source = self._io["fixed"]
        if target is not None and self.needs_target:
            source = self.source_of(pixel_boost.mixed_identity(self.identity, target, self.weight))
        crop, matrix = align.crop_onto(image, face.kps, self._io["points"], self.pixel_boost)
        fake = pixel_boost.swap_tiles(crop, self.model.contract.size, lambda tile: self.run(tile, source))
        return Swapped(crop=np.ascontiguousarray(fake), matrix=np.asarray(matrix, dtype=np.float64))

    def run(self, tile: np.ndarray, source: np.ndarray) -> np.ndarray:
        """One model call: a BGR tile of the model's side in, the swapped BGR tile out."""
        mean, std = self._io["mean"], self._io["std"]
        rgb = tile[:, :, ::-1].astype(np.float32) / np.float32(255.0)
        (target, dtype), (name, _) = self._io["target"], self._io["source"]
        blob = ((rgb - mean) / std).transpose(2, 0, 1)[None].astype(dtype)
        pred = np.asarray(self.model.session.run([self._io["output"]], {target: blob, name: source})[0], np.float32)
        out = pred[0].transpose(1, 2, 0)
        if self.model.contract.denormalise:
            out = out * std + mean
        bgr = np.clip(out, 0.0, 1.0)[:, :, ::-1] * np.float32(255.0)
        result: np.ndarray = np.rint(bgr).astype(np.uint8)
        return result
