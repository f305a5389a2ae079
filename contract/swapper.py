"""The face swapper's settings (job file ``face_swapper: {model, pixel_boost, weight}``), as the
manifest carries them (``swapper_model``, ``swapper_pixel_boost``, ``swapper_weight``; left out at
their defaults, so an older manifest reads as today's swap), and each swapper model's contract.
Standard library only (contract/).

``model``: one of SWAPPER_MODELS (FaceFusion's names; ``ghost_256`` stands for FaceFusion's
ghost_1_256, ghost_2_256 and ghost_3_256, one contract); the pack's file decides what runs, the name is
checked against its pack.yaml ``model:`` when that records one. ``pixel_boost``: the side of the
aligned crop in pixels, a multiple of the model's own side (128 for inswapper, 256 for the others) —
the crop is split into (boost/side)² interleaved tiles of the model's side, each swapped, and put
back together (FaceFusion's pixel boost; runner_image/pixel_boost.py); left out, the model's own.
``weight``: how much of the source identity goes in, 1 all of it (the plain swap), 0 the target face's
own (runner_image/pixel_boost.py ``mixed_identity``, on the ArcFace embeddings, before any converter).

The contracts (CONTRACTS), as FaceFusion 3.x's public source defines them
(facefusion/processors/modules/face_swapper/core.py ``create_static_model_set``, ``prepare_crop_frame``,
``normalize_crop_frame``, ``prepare_source_embedding``; facefusion/face_helper.py ``WARP_TEMPLATE_SET``
and ``warp_face_by_face_landmark_5``), with the exporters in facefusion/facefusion-labs
(hyperswap/src/exporting.py, crossface/src/exporting.py, crossface/src/models/crossface.py):

* every model: the target crop is the frame warped onto the model's template (five points, a
  fraction of the side; the similarity fit by ``estimateAffinePartial2D``, RANSAC threshold 100;
  FaceFusion warps with ``BORDER_REPLICATE`` and ``INTER_AREA``), taken BGR → RGB, /255, then
  ``(x − mean)/std``, NCHW float32 — fed as the input named ``target``; the identity is the input
  named ``source`` [1, 512]; the first output [1, 3, side, side] is the swapped RGB crop;
* ``inswapper_128``/``_fp16`` (insightface): side 128, template ``arcface_128``, mean 0 std 1; source
  = ``normalise(embedding) @ emap`` (the graph's last initializer), normalised; output 0 … 1, taken
  as it is (runner_image/swap.py);
* ``simswap_256`` (neuralchen/SimSwap): side 256, template ``arcface_112_v1``, ImageNet's mean
  (0.485, 0.456, 0.406) and std (0.229, 0.224, 0.225); source = the embedding converter
  ``crossface_simswap`` (``input`` [1, 512] → ``output`` [1, 512]) run on the ArcFace embedding, then
  L2-normalised; output taken as 0 … 1 (not de-normalised), clipped;
* ``hyperswap_1a_256`` (FaceFusion): side 256, template ``arcface_128``, mean 0.5 std 0.5; source =
  the L2-normalised ArcFace embedding, no converter; output de-normalised (``x·std + mean``) then
  clipped to 0 … 1. Its export has a second output, ``mask`` [1, 1, 256, 256] (a sigmoid, 0 … 1),
  which FaceFusion 3.x does not use; neither does ffswarm (the job's mask decides the paste-back);
* ``ghost_256`` (ai-forever's GHOST, sber-swap): side 256, template ``arcface_112_v1``, mean 0.5
  std 0.5; source = the converter ``crossface_ghost`` run on the ArcFace embedding, used as it comes
  (not normalised); output de-normalised (``x·std + mean``), clipped.

CrossFace normalises its input before its first layer (``input / norm(input)``), so feeding it our
unit-length identity (the runner keeps no raw ArcFace norms) gives what FaceFusion's raw embedding gives.

Licences, as each publisher states them (LICENCES; pack.yaml records the operator's copy, which is
what ``licence: commercial`` reads): inswapper — insightface, non-commercial; SimSwap — CC BY-NC 4.0
(neuralchen/SimSwap's LICENSE; FaceFusion: "Non-Commercial"); HyperSwap — ResearchRAIL-MS
(facefusion-labs; FaceFusion's model set: "ResearchRAIL"), research use only; GHOST — Apache-2.0 (as
FaceFusion's model set records ai-forever's); the CrossFace converters — OpenRAIL-MS
(facefusion-labs crossface/LICENSE.md, which gives the name only, no text).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from contract.errors import ManifestError

Points = tuple[tuple[float, float], ...]

# FaceFusion 3.x facefusion/face_helper.py WARP_TEMPLATE_SET: (x, y) of the eyes, nose tip and mouth
# corners as fractions of the crop's side
TEMPLATES: dict[str, Points] = {
    # insightface's 112-pixel ArcFace points centred in 128 (what runner_image/align.py template(128) gives)
    "arcface_128": (
        (0.36167656, 0.40387734),
        (0.63696719, 0.40235469),
        (0.50019687, 0.56044219),
        (0.38710391, 0.72160547),
        (0.61507734, 0.72034453),
    ),
    # the older ArcFace 112 points (39.730, 51.138) … / 112: SimSwap's and GHOST's crops
    "arcface_112_v1": (
        (0.35473214, 0.45658929),
        (0.64526786, 0.45658929),
        (0.50000000, 0.61154464),
        (0.37913393, 0.77687500),
        (0.62086607, 0.77687500),
    ),
}
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
EMBEDDING_SIZE = 512  # ArcFace w600k_r50's, and every model's ``source``


@dataclass(frozen=True)
class SwapperContract:
    """What one swapper model takes and gives (see the module's docstring for where each fact is from)."""

    model: str  # the job file's name
    family: str  # inswapper | simswap | hyperswap | ghost: how the runner calls it
    size: int  # the crop side the graph takes
    template: str  # a TEMPLATES key
    mean: tuple[float, float, float]
    std: tuple[float, float, float]
    # how ``source`` is made from the ArcFace identity: "emap" (inswapper's graph initializer), "unit"
    # (the identity itself), "converted_unit" (the converter's output, normalised), "converted" (as it comes)
    source: str
    denormalise: bool  # the output is ``x·std + mean`` (else taken as 0 … 1 already)
    converter: str | None  # the embedding converter's model name (pack role swapper_converter), if any
    files: tuple[str, ...]  # the file names it usually has (FaceFusion's)
    recorded: tuple[str, ...]  # the pack.yaml ``model:`` names that mean this model
    outputs: tuple[int, ...] = (1,)  # how many outputs the graph may have

    @property
    def points(self) -> Points:
        return TEMPLATES[self.template]

    def describe(self) -> str:
        """The contract in words, for ``ffswarm models verify`` and refusals."""
        outs = "/".join(str(n) for n in self.outputs)
        text = (
            f"{self.model}: inputs target N×3×{self.size}×{self.size} and source [1, {EMBEDDING_SIZE}], "
            f"{outs} output{'s' if self.outputs != (1,) else ''} (template {self.template})"
        )
        return text + (f"; needs swapper_converter {self.converter}" if self.converter else "")


def _inswapper(model: str) -> SwapperContract:
    return SwapperContract(
        model,
        family="inswapper",
        size=128,
        template="arcface_128",
        mean=(0.0, 0.0, 0.0),
        std=(1.0, 1.0, 1.0),
        source="emap",
        denormalise=False,
        converter=None,
        files=(f"{model}.onnx",),
        recorded=(model,),
    )


CONTRACTS: dict[str, SwapperContract] = {
    c.model: c
    for c in (
        _inswapper("inswapper_128"),
        _inswapper("inswapper_128_fp16"),
        SwapperContract(
            "simswap_256",
            family="simswap",
            size=256,
            template="arcface_112_v1",
            mean=IMAGENET_MEAN,
            std=IMAGENET_STD,
            source="converted_unit",
            denormalise=False,
            converter="crossface_simswap",
            files=("simswap_256.onnx",),
            recorded=("simswap_256",),
        ),
        SwapperContract(
            "hyperswap_1a_256",
            family="hyperswap",
            size=256,
            template="arcface_128",
            mean=(0.5, 0.5, 0.5),
            std=(0.5, 0.5, 0.5),
            source="unit",
            denormalise=True,
            converter=None,
            files=("hyperswap_1a_256.onnx",),
            recorded=("hyperswap_1a_256",),
            outputs=(1, 2),  # output, and the mask FaceFusion leaves unused
        ),
        SwapperContract(
            "ghost_256",
            family="ghost",
            size=256,
            template="arcface_112_v1",
            mean=(0.5, 0.5, 0.5),
            std=(0.5, 0.5, 0.5),
            source="converted",
            denormalise=True,
            converter="crossface_ghost",
            files=("ghost_1_256.onnx", "ghost_2_256.onnx", "ghost_3_256.onnx"),
            recorded=("ghost_256", "ghost_1_256", "ghost_2_256", "ghost_3_256"),
        ),
    )
}
CONVERTERS = {"crossface_simswap": "crossface_simswap.onnx", "crossface_ghost": "crossface_ghost.onnx"}
# As each publisher states it (name, commercial use allowed): what docs/operations.md tells operators to
# record in pack.yaml; HyperSwap's research-only and an unstated licence count as not commercial.
LICENCES: dict[str, tuple[str, bool]] = {
    "inswapper_128": ("non-commercial research only (insightface)", False),
    "inswapper_128_fp16": ("non-commercial research only (insightface)", False),
    "simswap_256": ("CC BY-NC 4.0 (neuralchen/SimSwap)", False),
    "hyperswap_1a_256": ("ResearchRAIL-MS (FaceFusion), research use only", False),
    "ghost_256": ("Apache-2.0 (ai-forever/sber-swap)", True),
    "crossface_simswap": ("OpenRAIL-MS (FaceFusion CrossFace)", False),
    "crossface_ghost": ("OpenRAIL-MS (FaceFusion CrossFace)", False),
}

SWAPPER_MODELS = tuple(CONTRACTS)
SWAPPER_MODEL = "inswapper_128"
SWAPPER_SIZE = 128  # the default (inswapper) model's crop side
PIXEL_BOOSTS = (128, 256, 512, 1024)
PIXEL_BOOST = 128
SWAPPER_WEIGHT = 1.0
SWAPPER_FIELDS = ("swapper_model", "swapper_pixel_boost", "swapper_weight")  # the manifest's, all optional


def contract_of(model: str) -> SwapperContract:
    """The contract of a swapper model name (KeyError: not one; check with ``model_problem``)."""
    return CONTRACTS[model]


def converter_of(model: Any) -> str | None:
    """The embedding converter model ``model`` needs (None: none, or not a swapper model)."""
    found = CONTRACTS.get(model) if isinstance(model, str) else None
    return None if found is None else found.converter


Dims = Sequence[Any]  # a graph value's shape: ints, or names/None where the dimension is symbolic


def recorded_as(name: Any) -> SwapperContract | None:
    """The contract a pack.yaml ``model:`` name (or a job's) means: ghost_1_256 is ghost_256's (None: none)."""
    return next((c for c in CONTRACTS.values() if name in c.recorded), None)


def _fits(dims: Dims, wanted: Sequence[int | None]) -> bool:
    """``dims`` has ``wanted``'s rank and each fixed size (None in ``wanted``, or a symbolic dimension, fits any)."""
    if len(dims) != len(wanted):
        return False
    return all(w is None or not isinstance(d, int) or d == w for d, w in zip(dims, wanted, strict=True))


def _graph_fits(c: SwapperContract, inputs: Sequence[tuple[str, Dims]], outputs: Sequence[Dims]) -> bool:
    image, vector = [None, 3, c.size, c.size], [None, EMBEDDING_SIZE]
    if len(inputs) != 2 or len(outputs) not in c.outputs or not _fits(outputs[0], image):
        return False
    if c.family == "inswapper":  # by shape: an fp16 export may name its inputs otherwise
        shapes = sorted((list(d) for _, d in inputs), key=len)
        return _fits(shapes[0], vector) and _fits(shapes[1], image)
    named = dict(inputs)  # FaceFusion feeds these by name
    return _fits(named.get("target", []), image) and _fits(named.get("source", []), vector)


def graph_problem(model: str | None, inputs: Sequence[tuple[str, Dims]], outputs: Sequence[Dims]) -> str | None:
    """Why a swapper graph with these inputs (name, dims) and output dims does not fit ``model``'s
    contract (None: it fits); ``model`` None or unknown: whether it fits any swapper model's."""
    found = recorded_as(model)
    wanted = [found] if found is not None else list(CONTRACTS.values())
    if any(_graph_fits(c, inputs, outputs) for c in wanted):
        return None
    if len(wanted) == 1:
        return f"not {wanted[0].describe()}"
    return "not a swapper model's graph (" + "; ".join(c.describe() for c in CONTRACTS.values()) + ")"


CONVERTER_CONTRACT = f"1 input [N, {EMBEDDING_SIZE}] (ArcFace) and 1 output [N, {EMBEDDING_SIZE}]"


def describe(role: str, model: str | None) -> str:
    """The contract of a pack's ``swapper`` or ``swapper_converter`` file whose pack.yaml records
    ``model:`` (None: the choices), in words (``ffswarm models verify``)."""
    if role == "swapper_converter":
        return CONVERTER_CONTRACT + (f" ({model})" if model else "")
    if (found := recorded_as(model)) is not None:
        return found.describe()
    sides = {c.size: [d.model for d in CONTRACTS.values() if d.size == c.size] for c in CONTRACTS.values()}
    each = " or ".join(f"N×3×{side}×{side} ({', '.join(names)})" for side, names in sides.items())
    return f"2 inputs, target {each} and source [1, {EMBEDDING_SIZE}]; 1 output (hyperswap_1a_256: 2)"


def converter_problem(inputs: Sequence[tuple[str, Dims]], outputs: Sequence[Dims]) -> str | None:
    """Why an embedding converter graph does not fit CrossFace's contract (None: it fits): one
    input (``input`` in FaceFusion's export) [N, 512] and one output [N, 512]."""
    vector = [None, EMBEDDING_SIZE]
    if len(inputs) == 1 and len(outputs) == 1 and _fits(inputs[0][1], vector) and _fits(outputs[0], vector):
        return None
    return f"not an embedding converter ({CONVERTER_CONTRACT})"


def model_problem(value: Any) -> str | None:
    """Why ``value`` is not a swapper model this runner has (None: it is one)."""
    if isinstance(value, str) and value in SWAPPER_MODELS:
        return None
    return f"must be one of {', '.join(SWAPPER_MODELS)}"


def boosts_for(model: str) -> tuple[int, ...]:
    """The pixel boosts ``model`` may run at: PIXEL_BOOSTS that are multiples of its side."""
    size = CONTRACTS[model].size if model in CONTRACTS else SWAPPER_SIZE
    return tuple(b for b in PIXEL_BOOSTS if b % size == 0)


def pixel_boost_problem(value: Any, model: str = SWAPPER_MODEL) -> str | None:
    """Why ``value`` is not a pixel boost for ``model`` (None: it is one)."""
    if not isinstance(value, int) or isinstance(value, bool) or value not in PIXEL_BOOSTS:
        return f"must be one of {', '.join(str(b) for b in PIXEL_BOOSTS)} (the crop's side in pixels)"
    allowed = boosts_for(model)
    if value not in allowed:
        side = CONTRACTS[model].size
        return (
            f"{value} is smaller than {model}'s own {side}-pixel crop: choose "
            f"{', '.join(str(b) for b in allowed[:-1])} or {allowed[-1]} for {model}"
        )
    return None


def weight_problem(value: Any) -> str | None:
    """Why ``value`` is not a weight in [0, 1] (None: it is one)."""
    number = isinstance(value, int | float) and not isinstance(value, bool)
    if number and math.isfinite(value) and 0 <= value <= 1:
        return None
    return "must be a number in [0, 1]"


def check_swapper(model: Any, pixel_boost: Any, weight: Any) -> None:
    """The manifest's three fields; ManifestError naming the first one refused."""
    if (why := model_problem(model)) is not None:
        raise ManifestError(f"swapper_model {why}, got {model!r}")
    for name, value, problem in (
        ("swapper_pixel_boost", pixel_boost, pixel_boost_problem(pixel_boost, model)),
        ("swapper_weight", weight, weight_problem(weight)),
    ):
        if problem is not None:
            raise ManifestError(f"{name} {problem}, got {value!r}")


def own_boost(model: Any, pixel_boost: int | None) -> int:
    """``pixel_boost`` as given, or (None) the model's own side — the default boost of every model."""
    if pixel_boost is not None:
        return pixel_boost
    return CONTRACTS[model].size if isinstance(model, str) and model in CONTRACTS else PIXEL_BOOST


@dataclass(frozen=True)
class SwapperTuning:
    """A job's face_swapper settings on their way into every manifest of the job (checked when built;
    ``pixel_boost`` None: the model's own side)."""

    model: str = SWAPPER_MODEL
    pixel_boost: int | None = None
    weight: float = SWAPPER_WEIGHT

    def __post_init__(self) -> None:
        object.__setattr__(self, "pixel_boost", own_boost(self.model, self.pixel_boost))
        check_swapper(self.model, self.pixel_boost, self.weight)

    def manifest_fields(self) -> dict[str, Any]:
        """The manifest's keyword arguments."""
        return {"swapper_model": self.model, "swapper_pixel_boost": self.pixel_boost, "swapper_weight": self.weight}


def read_fields(data: dict[str, Any]) -> dict[str, Any]:
    """The swapper's manifest fields present in ``data`` (parsed JSON), typed; the choices are checked
    when the Manifest is built (``check_swapper``). A model without a pixel boost runs at its own side."""
    out: dict[str, Any] = {}
    if "swapper_model" in data:
        if not isinstance(data["swapper_model"], str):
            raise ManifestError(f"swapper_model must be a string, got {data['swapper_model']!r}")
        out["swapper_model"] = data["swapper_model"]
        if "swapper_pixel_boost" not in data:
            out["swapper_pixel_boost"] = own_boost(data["swapper_model"], None)
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
