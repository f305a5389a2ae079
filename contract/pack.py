"""The model pack's rules: pack.yaml's shape, the roles a job's processors need, the checksums.

A pack is ``<root>/models/<name>/pack.yaml`` plus model files; pack.yaml names each file's role and
sha256, and may record its licence as its publisher states it (``licence: {name, commercial}``). Every
file is hashed before use: a truncated copy on NFS or a swapped file must fail with exit 66 naming the
file, not produce silently different faces. A job that says ``licence: commercial`` is refused at
submit when a model its processors load is not marked ``commercial: true`` (``not_commercial``).

The runner (before loading anything) and the controller (``ffswarm models verify|fetch``, the
submit-time pack check) apply the very same rules. YAML is not the standard library's, so each side
parses pack.yaml itself (``yaml.safe_load``) and hands the data to ``check_spec``; a refusal is a
PackError whose message names the pack and the file.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from contract import processors as registry
from contract import swapper
from contract.errors import PackError
from contract.processors import needs, users

PACK_FILE = "pack.yaml"
ROLES = registry.ROLES  # what each processor needs: the registry (contract/processors.py)
LICENCE_KEYS = ("name", "commercial")
MODEL_NAME = r"[a-z0-9][a-z0-9_.-]{0,63}"  # pack.yaml ``model:``: the publisher's model as FaceFusion names it
MAX_LICENCE_NAME = 200  # characters: a licence as its publisher states it, not the licence's text


@dataclass(frozen=True)
class Licence:
    """A model's licence as pack.yaml records it: ``name`` as the publisher states it, and whether
    it allows commercial use."""

    name: str
    commercial: bool

    def describe(self) -> str:
        return f"{self.name} (commercial use: {'yes' if self.commercial else 'no'})"


@dataclass(frozen=True)
class Pack:
    """A verified pack: role -> file whose sha256 matched pack.yaml."""

    dir: Path
    name: str
    standin: bool
    files: dict[str, Path]
    shown: str  # how reasons name the folder (the runner: relative to the data root, as users know it)


def sha256_file(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def where(pack_dir: Path, shown: str | None = None) -> str:
    """How refusals name the pack: ``shown`` (a runner passes its data-root-relative path) or its folder."""
    return f"model pack {pack_dir if shown is None else shown}"


def read_text(pack_dir: Path, shown: str | None = None) -> str:
    """pack.yaml's text; PackError when the folder or the file is missing or unreadable."""
    named = where(pack_dir, shown)
    try:
        return (pack_dir / PACK_FILE).read_text(encoding="utf-8")
    except FileNotFoundError:
        what = f"{PACK_FILE} not found" if pack_dir.is_dir() else "folder not found"
        raise PackError(f"{named}: {what}") from None
    except (OSError, UnicodeDecodeError) as e:
        raise PackError(f"{named}: cannot read {PACK_FILE}: {e}") from e


def not_yaml(named: str, error: Exception) -> PackError:
    """The refusal of a pack.yaml the caller's YAML parser could not read (``named``: ``where()``)."""
    return PackError(f"{named}: {PACK_FILE} is not valid YAML: {error}")


def check_spec(spec: Any, named: str) -> dict[str, Any]:
    """Parsed pack.yaml as a mapping with a ``files`` mapping of name -> {role, sha256, licence?}."""
    if not isinstance(spec, dict) or not isinstance(spec.get("files"), dict):
        raise PackError(f"{named}: {PACK_FILE} has no 'files' mapping")
    for name, entry in spec["files"].items():
        if not isinstance(entry, dict) or not isinstance(entry.get("sha256"), str):
            raise PackError(f"{named}: {PACK_FILE} entry {name!r} needs role and sha256")
        if not isinstance(name, str) or "/" in name or "\\" in name or name in ("", ".", "..") or name == PACK_FILE:
            raise PackError(f"{named}: {PACK_FILE} names an invalid file {name!r}")
        if "licence" in entry:
            parse_licence(entry["licence"], f"{named}: {PACK_FILE} entry {name!r}: licence")
        model = entry.get("model")
        if model is not None and (not isinstance(model, str) or re.fullmatch(MODEL_NAME, model) is None):
            raise PackError(f"{named}: {PACK_FILE} entry {name!r}: model must be a model name like real_esrgan_x4")
    return spec


def model_of(spec: dict[str, Any], role: str) -> tuple[str, str | None] | None:
    """(file, its recorded ``model:`` name or None) of a checked pack's file for ``role``; None: no file."""
    for name, entry in spec["files"].items():
        if entry.get("role") == role:
            model = entry.get("model")
            return name, model if isinstance(model, str) else None
    return None


def wrong_model(
    spec: dict[str, Any], role: str, wanted: str | None, shown: str, also: Iterable[str] = ()
) -> str | None:
    """Why a job that expects model ``wanted`` for ``role`` cannot use this checked pack (None: it
    can — no file for the role, no ``model:`` recorded, the same model or one of the names ``also``
    that mean it, or nothing expected). Both names are in the reason; ``shown`` is the pack's folder
    as users know it (``models/<pack>``)."""
    found = model_of(spec, role) if wanted else None
    if found is None or found[1] is None or found[1] == wanted or found[1] in tuple(also):
        return None
    return f"the pack's {role} is {found[0]} ({found[1]} in {shown}/{PACK_FILE}), not {wanted}"


def missing_converter(spec: dict[str, Any]) -> str | None:
    """What a checked pack lacks when its swapper records a model that takes an embedding converter
    (simswap_256, ghost_256: contract/swapper.py) and no file has role swapper_converter (None: nothing)."""
    found = model_of(spec, "swapper")
    model = swapper.recorded_as(found[1]) if found is not None else None
    if model is None or model.converter is None or "swapper_converter" in roles_of(spec):
        return None
    return f"no file with role swapper_converter ({model.model} needs {model.converter})"


def parse_licence(value: Any, named: str) -> Licence:
    """One entry's ``licence: {name: …, commercial: true|false}``, strictly (pack.yaml may be hostile:
    its name is printed, so no control characters); ``named`` starts each refusal."""
    if not isinstance(value, dict):
        raise PackError(f"{named} must be a mapping {{name: …, commercial: true|false}}")
    unknown = [k for k in value if k not in LICENCE_KEYS]
    if unknown:
        raise PackError(f"{named}: unknown key {str(unknown[0])[:40]!r} (known: {', '.join(LICENCE_KEYS)})")
    text = value.get("name")
    if not isinstance(text, str) or not text.strip():
        raise PackError(f"{named}: name must be a non-empty string (the licence as its publisher states it)")
    if len(text) > MAX_LICENCE_NAME or not text.isprintable():
        raise PackError(f"{named}: name must be at most {MAX_LICENCE_NAME} printable characters on one line")
    commercial = value.get("commercial")
    if not isinstance(commercial, bool):
        raise PackError(f"{named}: commercial must be true or false")
    return Licence(text.strip(), commercial)


def licence_of(entry: dict[str, Any]) -> Licence | None:
    """The licence of a checked entry (check_spec's); None: pack.yaml records none (unknown)."""
    value = entry.get("licence")
    return None if value is None else parse_licence(value, "licence")


def check_file(pack_dir: Path, name: str, expected: str, shown: str | None = None) -> Path:
    """Hash one listed file; PackError names it when absent, unreadable or different."""
    path = pack_dir / name
    try:
        digest = sha256_file(path)
    except FileNotFoundError:
        missing = path if shown is None else f"{shown}/{name}"
        raise PackError(f"{where(pack_dir, shown)}: {name} is missing ({missing})") from None
    except OSError as e:
        raise PackError(f"{where(pack_dir, shown)}: cannot read {name}: {e.strerror or e}") from e
    expected = expected.strip().lower()
    if digest != expected:
        raise PackError(
            f"{where(pack_dir, shown)}: {name} has the wrong checksum "
            f"(sha256 {digest[:16]}…, pack.yaml says {expected[:16]}…)"
        )
    return path


def roles_of(spec: dict[str, Any]) -> dict[str, str]:
    """role -> file name (the first file listed for a role wins)."""
    out: dict[str, str] = {}
    for name, entry in spec["files"].items():
        role = entry.get("role")
        if isinstance(role, str) and role in ROLES:
            out.setdefault(role, name)
    return out


def missing_roles(
    pack_dir: Path,
    spec: dict[str, Any],
    processors: Iterable[str],
    shown: str | None = None,
    *,
    filters: bool = False,
    masks: Iterable[str] = (),
    swapper: str | None = None,
) -> None:
    """PackError naming the first role the processors (and, with ``filters``, the selector's gender/age
    filters; the mask types ``masks`` lists; the swapper model ``swapper``'s converter) need that
    pack.yaml lacks, and its source."""
    have = roles_of(spec)
    for need in needs(processors, filters=filters, masks=masks, swapper=swapper):
        if need.role not in have:
            users_ = users(need) or ["every job"]
            raise PackError(
                f"{where(pack_dir, shown)}: {PACK_FILE} lists no file with role {need.role} "
                f"(needed by {', '.join(users_)}: {need.usual}, from {need.where})"
            )


def verify(
    pack_dir: Path,
    spec: dict[str, Any],
    processors: Iterable[str] = ("face_swapper",),
    shown: str | None = None,
    *,
    filters: bool = False,
    masks: Iterable[str] = (),
    swapper: str | None = None,
) -> Pack:
    """Check the roles the processors (and the selector's ``filters``, the mask types ``masks``, the
    swapper model ``swapper``'s converter) need and every listed file's sha256 (``spec``: check_spec's)."""
    processors = tuple(processors)
    missing_roles(pack_dir, spec, processors, shown, filters=filters, masks=masks, swapper=swapper)
    checked = {name: check_file(pack_dir, name, entry["sha256"], shown) for name, entry in spec["files"].items()}
    files = {role: checked[name] for role, name in roles_of(spec).items()}
    name, standin = str(spec.get("name", pack_dir.name)), bool(spec.get("standin"))
    return Pack(dir=pack_dir, name=name, standin=standin, files=files, shown=str(pack_dir) if shown is None else shown)


def not_commercial(
    spec: dict[str, Any],
    processors: Iterable[str],
    *,
    filters: bool = False,
    masks: Iterable[str] = (),
    swapper: str | None = None,
) -> list[tuple[str, str, Licence | None]]:
    """(role, file, licence) of each model the processors load (detector and recogniser too,
    genderage with the selector's ``filters``, occluder/face_parser with ``masks``, the swapper model
    ``swapper``'s converter) whose licence pack.yaml does not mark ``commercial: true`` (None: no
    licence recorded)."""
    have = roles_of(spec)
    out: list[tuple[str, str, Licence | None]] = []
    for role in registry.roles(processors, filters=filters, masks=masks, swapper=swapper):
        name = have.get(role)
        if name is None:
            continue  # missing_roles names it
        licence = licence_of(spec["files"][name])
        if licence is None or not licence.commercial:
            out.append((role, name, licence))
    return out
