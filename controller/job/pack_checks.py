"""The job's model pack, checked at submit: it exists, has a file for every role the job's
processors need, records the models the job asks for, and allows commercial use when the job says
``licence: commercial`` (controller/run/jobs.py and the API's submit call it)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from contract.errors import PackError
from contract.pack import missing_roles, not_commercial, wrong_model
from contract.swapper import contract_of, converter_of
from controller.config import Config
from controller.errors import JobFileError, MissingInputError
from controller.job.spec import JobSpec
from controller.models import read_spec

_SPECS: dict[Path, tuple[tuple[int, ...], dict[str, Any]]] = {}  # pack folder → (pack.yaml's version, spec)


def cached_spec(pack_dir: Path, shown: str) -> dict[str, Any]:
    """pack.yaml read and checked (read_spec) once per version of the file — read again when its
    inode, size, mtime or ctime change — rather than parsed on every submit. Shared: not to be changed."""
    try:
        st = os.lstat(pack_dir / "pack.yaml")
    except OSError:
        return read_spec(pack_dir, shown)  # its refusal names what is wrong
    version = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
    known = _SPECS.get(pack_dir)
    if known is not None and known[0] == version:
        return known[1]
    spec = read_spec(pack_dir, shown)  # a link or odd file is refused here, never cached
    _SPECS[pack_dir] = (version, spec)
    return spec


def check_pack(config: Config, spec: JobSpec, file: Path) -> None:
    """The pack exists and has a file for every role the job's processors need, each of whose
    licences allows commercial use when the job says ``licence: commercial`` (no hashing here: the
    identity step verifies every checksum on a GPU node, where the files are read anyway)."""
    shown = f"models/{spec.models}"  # reasons name paths relative to the data root, as users know them
    pack_dir = config.data_root / shown
    if not (pack_dir / "pack.yaml").is_file():
        raise MissingInputError(
            f"{file}: models: pack {spec.models!r} not found: {shown}/pack.yaml does not exist "
            f"(install one with `ffswarm models fetch` or see docs/operations.md#models)"
        )
    try:
        pack_spec = cached_spec(pack_dir, shown)
        masks, swapper = spec.mask.types, spec.face_swapper.model  # the occluder/face parser, the converter
        filters = spec.selector.filters
        missing_roles(pack_dir, pack_spec, spec.processors, shown, filters=filters, masks=masks, swapper=swapper)
    except PackError as e:
        raise MissingInputError(f"{file}: models: {e}") from None
    if spec.licence == "commercial":
        check_commercial(pack_spec, spec, file, shown)
    # each model a processor expects against what the pack's file records (pack.yaml ``model:``)
    for processor, role, wanted, also in (
        ("frame_enhancer", "frame_enhancer", spec.frame_enhancer.model, ()),
        ("face_enhancer", "enhancer", spec.face_enhancer.model, ()),
        ("face_swapper", "swapper", swapper, contract_of(swapper).recorded),
        ("face_swapper", "swapper_converter", converter_of(swapper), ()),
    ):
        why = wrong_model(pack_spec, role, wanted, shown, also) if processor in spec.processors else None
        if why is not None:
            raise JobFileError(str(file), f"{processor}.model", why)


def check_commercial(pack_spec: dict[str, Any], spec: JobSpec, file: Path, shown: str) -> None:
    """``licence: commercial``: every model the job's processors load (detector and recogniser too)
    must be marked ``commercial: true`` in pack.yaml; a refusal names each other one (exit 65)."""
    filters, masks, swapper = spec.selector.filters, spec.mask.types, spec.face_swapper.model
    refused = not_commercial(pack_spec, spec.processors, filters=filters, masks=masks, swapper=swapper)
    if not refused:
        return
    each = "; ".join(
        f"{name} ({role}): " + (f"licence {lic.name!r}, not for commercial use" if lic else "licence unknown")
        for role, name, lic in refused
    )
    raise JobFileError(
        str(file),
        "licence",
        f"commercial use needs every model to allow it, and model pack {shown} has {each} "
        f"(pack.yaml's licence entries: docs/operations.md#models)",
    )
