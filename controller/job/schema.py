"""The job file's JSON Schema (draft 2020-12), made from the spec's own fields (controller/job/keys.py).

Editors validate and complete job files with it (``# yaml-language-server: $schema=…``), ``ffswarm
schema job`` prints it, the API's request body is it, and docs/job-file.md's key table is rendered
from it. It says what the reader refuses without looking at a disk: unknown keys, wrong types,
choices, bounds and which keys go together. Checks that need more than one value (a codec on the GPU
needs ``resources.gpus``, a processor order, an output template's placeholders) stay the reader's.
"""

from __future__ import annotations

import typing
from collections.abc import Iterator
from dataclasses import MISSING, Field, is_dataclass
from enum import Enum
from types import NoneType, UnionType
from typing import Any

from controller.job.files import REQUIRED
from controller.job.keys import keys
from controller.job.spec import JobSpec

DRAFT = "https://json-schema.org/draft/2020-12/schema"
SCHEMA_ID = "urn:ffswarm:job-file:v1"
_REPLACES_TYPE = ("anyOf", "oneOf", "const")  # a key's form that says the whole shape of its value
_API_NAME = "^[a-z0-9-]{1,31}$"  # the job's id keeps its first 21 characters (contract/layout.py tenant_job_id)


def job_schema(*, request: bool = False, ref_template: str = "#/$defs/{name}") -> dict[str, Any]:
    """The job file's JSON Schema. ``request``: the API's JSON body instead, where ``name`` (default
    ``job``, at most 31 characters) and ``output`` (default ``out/<job>/{stem}{ext}``) may be left
    out. ``ref_template`` places the sections' definitions elsewhere (an OpenAPI document's
    ``#/components/schemas/{name}``); they are under ``$defs`` either way."""
    defs: dict[str, Any] = {}
    root = _object(JobSpec, None, defs, ref_template)
    name, *sources = REQUIRED  # the API names the job and writes a default output when they are left out
    root["required"] = [] if request else [name]
    sources = [k for k in sources if not request or k != "output"]
    if request:
        root["properties"]["name"] |= {"pattern": _API_NAME, "default": "job"}
    # pairs name their own sources and targets, in one place: the keys they replace are refused beside them
    root["dependentSchemas"] = {
        "pairs": {"properties": {"source": False, "targets": False, "pairs_file": False}},
        "pairs_file": {"properties": {"source": False, "targets": False}},
    }
    root["if"] = {"anyOf": [{"required": ["pairs"]}, {"required": ["pairs_file"]}]}
    root["else"] = {"required": sources}
    what = "the JSON body of POST /v1/jobs" if request else "a job file"
    return {
        "$schema": DRAFT,
        "$id": SCHEMA_ID + (":request" if request else ""),
        "title": "ffswarm job (v1)",
        "description": f"The keys of {what} (docs/job-file.md). Paths are relative to the data root.",
        **root,
        "$defs": dict(sorted(defs.items())),
    }


def _object(kind: type[Any], parent: str | None, defs: dict[str, Any], ref: str) -> dict[str, Any]:
    hints = typing.get_type_hints(kind)
    props: dict[str, Any] = {}
    for f, a in keys(kind):
        prop: dict[str, Any] = {"title": f"{parent}.{f.name}" if parent else f.name, "description": a.doc}
        form = dict(a.form)
        shape = {} if any(k in form for k in _REPLACES_TYPE) else _type(hints[f.name], f.name, defs, ref)
        if "enum" in form and "null" in shape.get("type", ()):
            form["enum"] = [*form["enum"], None]
        if isinstance(form.get("items"), dict) and isinstance(shape.get("items"), dict):
            form["items"] = shape["items"] | form["items"]
        prop |= shape | form
        if "default" not in form and (default := _default(f)) is not None:
            prop["default"] = default
        props[f.name] = prop
    required = [f.name for f, _ in keys(kind) if f.default is MISSING and f.default_factory is MISSING]
    out: dict[str, Any] = {"type": "object", "properties": props, "additionalProperties": False}
    return out | ({"required": required} if required else {})


def _type(tp: Any, name: str, defs: dict[str, Any], ref: str) -> dict[str, Any]:
    """The JSON Schema of a field's Python type (str, int, float, bool, an enum, a tuple, a section, X | None)."""
    args = typing.get_args(tp)
    if typing.get_origin(tp) in (UnionType, typing.Union):
        inner = [_type(t, name, defs, ref) for t in args if t is not NoneType]
        if NoneType not in args:
            return {"anyOf": inner}
        if len(inner) == 1 and isinstance(inner[0].get("type"), str):
            return inner[0] | {"type": [inner[0]["type"], "null"]}
        return {"anyOf": [*inner, {"type": "null"}]}
    if typing.get_origin(tp) is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            return {"type": "array", "items": _type(args[0], name, defs, ref)}
        return {"type": "array", "items": _type(args[0], name, defs, ref), "minItems": len(args), "maxItems": len(args)}
    if isinstance(tp, type) and issubclass(tp, Enum):
        return {"type": "string", "enum": [m.value for m in tp]}
    if isinstance(tp, type) and is_dataclass(tp):
        if tp.__name__ not in defs:
            defs[tp.__name__] = {}  # before its fields: a section that names itself stops here
            doc = " ".join((tp.__doc__ or "").split("\n\n")[0].split())
            defs[tp.__name__] = {"title": name, "description": doc, **_object(tp, name, defs, ref)}
        return {"$ref": ref.format(name=tp.__name__)}
    simple = {str: "string", bool: "boolean", int: "integer", float: "number"}
    if tp in simple:
        return {"type": simple[tp]}
    raise TypeError(f"the job file's {name!r} has a type the schema cannot say: {tp!r}")


def _default(f: Field[Any]) -> Any:
    """The default as the file writes it; None when there is none worth showing (a section, a required
    key, or an empty or absent value)."""
    if f.default is MISSING or f.default is None or f.default in ("", ()):
        return None
    return _plain(f.default)


def _plain(value: Any) -> Any:
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, tuple | list):
        return [_plain(v) for v in value]
    return value


# --- docs/job-file.md's key table ------------------------------------------------------------------


def key_table() -> str:
    """Every key of the job file, sections' keys dotted, as a Markdown table (docs/job-file.md#keys)."""
    schema = job_schema()
    lines = ["| key | value | default | meaning |", "|---|---|---|---|"]
    for key, prop, need in _rows(schema, schema["$defs"], ""):
        default = f"`{_yaml(prop['default'])}`" if "default" in prop else need
        lines.append(f"| `{key}` | {_value(prop, schema['$defs'])} | {default} | {prop['description']} |")
    return "\n".join(lines) + "\n"


def _rows(obj: dict[str, Any], defs: dict[str, Any], prefix: str) -> Iterator[tuple[str, dict[str, Any], str]]:
    """(dotted key, its schema, "required…" or "") for every key of ``obj`` and of its sections."""
    needed = {k: "required" for k in obj.get("required", ())}
    needed |= {k: "required without pairs" for k in obj.get("else", {}).get("required", ())}
    for name, prop in obj["properties"].items():
        yield prefix + name, prop, needed.get(name, "")
        if (target := _ref_name(prop)) is not None:
            yield from _rows(defs[target], defs, f"{prefix}{name}.")
        elif (target := _ref_name(prop.get("items", {}))) is not None:  # pairs: each item's keys
            yield from _rows(defs[target], defs, f"{prefix}{name}[].")


def _ref_name(prop: dict[str, Any]) -> str | None:
    ref = prop.get("$ref")
    return ref.rsplit("/", 1)[-1] if isinstance(ref, str) else None


def _value(prop: dict[str, Any], defs: dict[str, Any], plain: bool = False) -> str:
    """A short phrase for what a key holds: ``integer ≥ 1``, ``one of `a` `b```, ``list of …``."""
    if _ref_name(prop) is not None:
        return "mapping"
    if "anyOf" in prop:
        return " or ".join(_value(p, defs) for p in prop["anyOf"])
    if "const" in prop:
        return f"`{prop['const']}`"
    if "enum" in prop:
        return ("" if plain else "one of ") + " ".join(f"`{_yaml(v)}`" for v in prop["enum"])
    kind = prop.get("type")
    if kind == "array":
        items = prop.get("items", {})
        if _ref_name(items) is not None:
            return "list of mappings"
        fixed = "minItems" in prop and prop["minItems"] == prop.get("maxItems")
        return (f"{prop['minItems']} of " if fixed else "list of ") + _value(items, defs, plain=True)
    words = {
        "string": "text",
        "integer": "integer",
        "number": "number",
        "boolean": "`true` or `false`",
        "null": "`null`",
    }
    kinds = kind if isinstance(kind, list) else [kind]
    text = " or ".join(words.get(str(k), str(k)) for k in kinds)
    return text + _bounds(prop)


def _bounds(prop: dict[str, Any]) -> str:
    low = ("≥", prop["minimum"]) if "minimum" in prop else ("&gt;", prop.get("exclusiveMinimum"))
    high = prop.get("maximum")
    if low[1] is not None and high is not None:
        return f" in {'[' if low[0] == '≥' else '('}{low[1]}, {high}]"
    if low[1] is not None:
        return f" {low[0]} {low[1]}"
    return f" ≤ {high}" if high is not None else ""


def _yaml(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, list):
        return "[" + ", ".join(_yaml(v) for v in value) + "]"
    return str(value)


__all__ = ["DRAFT", "SCHEMA_ID", "job_schema", "key_table"]
