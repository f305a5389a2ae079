"""What each key of the job file is, written once beside its field (controller/job/spec.py, settings.py).

A field of a job-file dataclass carries an ``About`` in its metadata: the description a person reads,
how the file's value becomes the field's (``read``: ``30m`` → 1800), what the file may hold beyond what
the field's type says (``form``: JSON Schema keywords such as bounds, choices or the file's own shape of
the value), which setting of the chunk manifests it fills (``manifest``), whether it names files
(``path``: rebased when a tenant's job moves from its area to the data root) and, for the top-level
keys, what a pack of small jobs does with it (``pack``). The reader (controller/job/files.py), the JSON
Schema (controller/job/schema.py), the key table in docs/job-file.md, the manifests' settings
(controller/run/jobs.py) and the packer (controller/serve/packing.py, packs.py) all take it from there.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Mapping
from dataclasses import Field, dataclass, field, fields, is_dataclass
from enum import StrEnum
from types import MappingProxyType
from typing import Any

from controller.settings.fields import Reader, as_nested, same

ABOUT = "ffswarm.about"  # the metadata entry


class Pack(StrEnum):
    """What packing (controller/serve/packing.py) does with a top-level key."""

    SHARED = "shared"  # what the runner loads or how it treats each item: every member of a pack agrees on it
    OWN = "own"  # each member's own (name, inputs, outputs, limits); the pack's job file has its own value
    FIRST = "first"  # cannot differ in what a pack runs (no videos, no reference): the pack keeps the first's


@dataclass(frozen=True)
class About:
    """One key: ``doc`` for people; ``read`` turns the file's value into the field's (None: as written;
    a section's keys are read by the section's own fields); ``form``: JSON Schema keywords for the
    file's value, over those the field's type gives; ``manifest``: the ManifestSettings field it fills
    (controller/job/plan.py; ``masks.types``: an argument of that field's value object), None when
    the runner never sees it; ``pack``: for top-level keys; ``path``: the value names files or
    objects relative to the data root (a path, a glob, an output template, or items holding some)."""

    doc: str
    read: Reader | None = None
    form: Mapping[str, Any] = field(default_factory=dict)
    manifest: str | None = None
    pack: Pack | None = None
    path: bool = False


def about(
    doc: str,
    *,
    read: Reader | None = None,
    manifest: str | None = None,
    pack: Pack | None = None,
    path: bool = False,
    **form: Any,
) -> Mapping[str, About]:
    """The metadata of one field: ``field(default=…, metadata=about("what it is", minimum=1))``."""
    return MappingProxyType({ABOUT: About(doc, read, MappingProxyType(form), manifest, pack, path)})


def about_of(f: Field[Any]) -> About:
    """A field's ``About``; a field without one is a bug the tests catch (every key is described)."""
    found = f.metadata.get(ABOUT)
    if not isinstance(found, About):
        raise TypeError(f"the job-file field {f.name!r} has no description (metadata=about(...))")
    return found


def keys(kind: type[Any]) -> Iterator[tuple[Field[Any], About]]:
    """The keys of a job-file dataclass, in the order they are written."""
    assert is_dataclass(kind)
    for f in fields(kind):
        yield f, about_of(f)


@functools.cache
def key_names(kind: type[Any]) -> tuple[str, ...]:
    """The keys a mapping of ``kind`` may hold (the file's keys are the field names); a class's keys
    never change while it runs, so they are worked out once per class."""
    return tuple(f.name for f, _ in keys(kind))


def path_keys(kind: type[Any]) -> tuple[str, ...]:
    """The keys of ``kind`` whose values name files relative to the data root (``path=True``)."""
    return tuple(f.name for f, a in keys(kind) if a.path)


def section(f: Field[Any]) -> type[Any] | None:
    """The section class a key holds (``video:`` → VideoSettings), None for a plain value."""
    kind = f.default_factory
    return kind if isinstance(kind, type) and is_dataclass(kind) else None


def readers(kind: type[Any]) -> dict[str, Reader]:
    """How the file's value of each key of ``kind`` becomes the field's (sections: key by key)."""
    out: dict[str, Reader] = {}
    for f, a in keys(kind):
        inner = section(f)
        if a.read is not None:
            out[f.name] = a.read
        elif inner is not None:
            out[f.name] = as_nested(inner, {k: r for k, r in readers(inner).items() if r is not same})
        else:
            out[f.name] = same
    return out


def manifest_values(spec: object) -> dict[str, Any]:
    """What a checked job gives its chunk manifests: ``{ManifestSettings field: value}`` for every key
    (a section's too) with ``manifest=``; dotted targets are grouped (``{"masks": {"types": …}}``)."""
    out: dict[str, Any] = {}

    def put(target: str, value: Any) -> None:
        group, _, name = target.partition(".")
        if name:
            out.setdefault(group, {})[name] = value
        else:
            out[target] = value

    for f, a in keys(type(spec)):
        value = getattr(spec, f.name)
        if a.manifest is not None:
            put(a.manifest, value)
        inner = section(f)
        for g, b in keys(inner) if inner is not None else ():
            if b.manifest is not None:
                put(b.manifest, getattr(value, g.name))
    return out


def packed(kind: type[Any], *classes: Pack) -> tuple[str, ...]:
    """The top-level keys of ``kind`` that packing treats as one of ``classes``."""
    return tuple(f.name for f, a in keys(kind) if a.pack in classes)


def one_or_more(item: Mapping[str, Any]) -> dict[str, Any]:
    """The form of a key that takes one value or a list of them (``source: a.jpg`` or ``[a.jpg, b.jpg]``)."""
    return {"anyOf": [dict(item), {"type": "array", "items": dict(item), "minItems": 1}]}


# what controller/settings/fields.py parse_duration and parse_memory read
DURATION: dict[str, Any] = {
    "anyOf": [{"type": "integer", "minimum": 1}, {"type": "string", "pattern": r"^(\d+h)?(\d+m)?(\d+s)?$"}]
}
SIZE: dict[str, Any] = {
    "anyOf": [{"type": "integer", "minimum": 1}, {"type": "string", "pattern": r"^\d+[kmgtKMGT]?$"}]
}
