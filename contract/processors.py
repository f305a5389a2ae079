"""The processor registry: every face operation a job may list, the pack roles it needs from the
model pack and the job-file keys that tune it — one table, in the spirit of FaceFusion's processors.

Everything else derives from it: the manifest's and the job file's processor names
(contract/manifest.py PROCESSORS, checked by controller/job/spec.py), the pack check's roles
(contract/pack.py) and the runner's factories (runner_image/processors.py FACTORIES, keyed by the
same names; a unit test keeps the two in step). Adding a processor is one entry here and one factory
there.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType

from contract.swapper import CONTRACTS, CONVERTERS, converter_of


@dataclass(frozen=True)
class ModelNeed:
    """A model file a processor cannot run without, and where its operator gets one."""

    role: str
    usual: str  # the file names it usually has
    where: str


@dataclass(frozen=True)
class ProcessorInfo:
    """What the controller and the pack check know of a processor (the runner adds its factory)."""

    name: str
    needs: tuple[ModelNeed, ...]  # pack roles beyond the detector and recogniser every job loads
    job_keys: tuple[str, ...]  # job-file sections that tune it (docs/job-file.md)
    # "face": changes the selected faces of a frame in place; "frame": makes a new frame from the
    # whole one (another size), so it runs after every face step (check_order)
    kind: str = "face"

    @property
    def roles(self) -> tuple[str, ...]:
        return tuple(n.role for n in self.needs)


BASE_NEEDS = (
    ModelNeed("detector", "det_10g.onnx", "insightface's buffalo_l release (SCRFD-10G)"),
    ModelNeed("recognizer", "w600k_r50.onnx", "insightface's buffalo_l release (ArcFace R50)"),
)

REGISTRY: Mapping[str, ProcessorInfo] = MappingProxyType(
    {
        p.name: p
        for p in (
            ProcessorInfo(
                "face_swapper",
                needs=(
                    ModelNeed(
                        "swapper",
                        "inswapper_128.onnx, inswapper_128_fp16.onnx, simswap_256.onnx, hyperswap_1a_256.onnx or "
                        "ghost_1_256.onnx/ghost_2_256.onnx/ghost_3_256.onnx (face_swapper.model)",
                        "the insightface project (inswapper_128); FaceFusion's models release for the fp16 export, "
                        "SimSwap, HyperSwap and GHOST (docs/operations.md#swapper-models)",
                    ),
                ),
                job_keys=("face_swapper", "mask"),
            ),
            ProcessorInfo(
                "face_enhancer",
                needs=(
                    ModelNeed(
                        "enhancer",
                        "gfpgan_1.4.onnx, codeformer.onnx, gpen_bfr_512.onnx or restoreformer_plus_plus.onnx",
                        "GFPGAN v1.4 (TencentARC), CodeFormer, GPEN-BFR-512 or RestoreFormer++ exported to ONNX, "
                        "e.g. FaceFusion's models release",
                    ),
                ),
                job_keys=("face_enhancer", "mask"),
            ),
            ProcessorInfo(
                "frame_enhancer",
                needs=(
                    ModelNeed(
                        "frame_enhancer",
                        "real_esrgan_x2.onnx or real_esrgan_x4.onnx (fp16 exports too)",
                        "xinntao's Real-ESRGAN x2plus/x4plus (BSD-3-Clause) exported to ONNX, e.g. FaceFusion's "
                        "models release",
                    ),
                ),
                job_keys=("frame_enhancer",),
                kind="frame",
            ),
        )
    }
)

# face_enhancer's models (FaceFusion's names; docs/job-file.md#face_enhancer-models): each FFHQ-512
# aligned, one [1, 3, 512, 512] image in −1…1; codeformer's graph also takes its fidelity ``weight``
FACE_ENHANCER_MODELS = ("gfpgan_1.4", "codeformer", "gpen_bfr_512", "restoreformer_plus_plus")
WEIGHTED_FACE_ENHANCERS = ("codeformer",)  # the models whose graph has a ``weight`` input

# The face selector's gender/age filters (contract/selector.py): needed only by a job that filters
SELECTOR_NEEDS = (
    ModelNeed(
        "genderage",
        "genderage.onnx",
        "insightface's buffalo_l release (its gender and age model; non-commercial, like the rest of buffalo_l)",
    ),
)
SELECTOR_USER = "selector.gender/selector.age"  # how a missing role names what needs it

# The paste-back mask's model-backed types (contract/masks.py): each needed only by a job whose
# mask.types lists it, and only when one of its processors pastes a face back (job_keys "mask")
MASK_NEEDS: Mapping[str, ModelNeed] = MappingProxyType(
    {
        "occlusion": ModelNeed(
            "occluder",
            "xseg_1.onnx, xseg_2.onnx or xseg_3.onnx",
            "FaceFusion's models release (xseg occluders)",
        ),
        "region": ModelNeed(
            "face_parser",
            "bisenet_resnet_18.onnx or bisenet_resnet_34.onnx",
            "FaceFusion's models release (bisenet face parsing, zllrunning/face-parsing.PyTorch, MIT)",
        ),
    }
)

# The swapper's embedding converter (contract/swapper.py): needed only by a job whose face_swapper.model
# takes a converted source embedding (simswap_256: crossface_simswap, ghost_256: crossface_ghost)
CONVERTER_NEEDS: Mapping[str, ModelNeed] = MappingProxyType(
    {
        name: ModelNeed(
            "swapper_converter",
            f"{file} (pack.yaml model: {name})",
            "FaceFusion's models release (models-3.4.0: its CrossFace embedding converters, OpenRAIL-MS)",
        )
        for name, file in CONVERTERS.items()
    }
)
CONVERTER_USER = "face_swapper.model"  # how a missing converter names what needs it

PROCESSORS = tuple(REGISTRY)  # the names a job file and a manifest may list
ROLES = tuple(
    dict.fromkeys(
        [
            *(n.role for n in BASE_NEEDS),
            *(r for p in REGISTRY.values() for r in p.roles),
            *(n.role for n in SELECTOR_NEEDS),
            *(n.role for n in MASK_NEEDS.values()),
            *(n.role for n in CONVERTER_NEEDS.values()),
        ]
    )
)


def needs(
    processors: Iterable[str], *, filters: bool = False, masks: Iterable[str] = (), swapper: str | None = None
) -> tuple[ModelNeed, ...]:
    """Every model the detector/recogniser base and the listed processors require, in order
    (names not in the registry add nothing: the manifest and the job file refuse them); the
    embedding converter of the face swapper's model ``swapper`` when it takes one; with
    ``filters`` (the selector drops faces by gender or age) the genderage model; then the models of
    the mask types ``masks`` lists (occluder, face_parser) when a processor pastes faces back."""
    processors = tuple(processors)
    out = list(BASE_NEEDS)
    for p in processors:
        info = REGISTRY.get(p)
        out.extend(info.needs if info is not None else ())
        if p == "face_swapper" and (converter := converter_of(swapper)) is not None:
            out.append(CONVERTER_NEEDS[converter])
    if filters:
        out.extend(SELECTOR_NEEDS)
    if any("mask" in REGISTRY[p].job_keys for p in processors if p in REGISTRY):
        out.extend(MASK_NEEDS[t] for t in dict.fromkeys(masks) if t in MASK_NEEDS)
    return tuple(out)


def roles(
    processors: Iterable[str], *, filters: bool = False, masks: Iterable[str] = (), swapper: str | None = None
) -> tuple[str, ...]:
    """Which models to load for a manifest: detector and recogniser, plus what the processors need
    (the swapper model ``swapper``'s converter, genderage when the selector ``filters``,
    occluder/face_parser when ``masks`` lists occlusion/region)."""
    return tuple(n.role for n in needs(processors, filters=filters, masks=masks, swapper=swapper))


def check_order(processors: Iterable[str]) -> str | None:
    """Why the list cannot run in this order (None: it can): a frame processor changes the frame's
    size, so no face processor may come after it, and each name is listed once."""
    names = list(processors)
    if len(set(names)) != len(names):
        return "each processor may be listed once"
    kinds = [REGISTRY[p].kind for p in names if p in REGISTRY]
    if "frame" in kinds and "face" in kinds[kinds.index("frame") :]:
        return "frame_enhancer works on the whole frame after the face steps: list it last"
    return None


def users(need: ModelNeed) -> list[str]:
    """The processors that need ``need`` (none: every job does; the selector's filters for genderage,
    the mask type for occluder and face_parser)."""
    if need in SELECTOR_NEEDS:
        return [SELECTOR_USER]
    if need in MASK_NEEDS.values():
        return [f"mask.types: {t}" for t, n in MASK_NEEDS.items() if n == need]
    if need in CONVERTER_NEEDS.values():
        takers = [c.model for c in CONTRACTS.values() if CONVERTER_NEEDS.get(c.converter or "") == need]
        return [f"{CONVERTER_USER} {m}" for m in takers]
    return [name for name, info in REGISTRY.items() if need in info.needs]
