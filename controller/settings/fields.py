"""Field checks shared by every settings parser: the job spec's dataclasses and its YAML reader, and
the config file's sections.

Each check raises ``FieldError`` naming the (dotted) field, so a spec built in code and a spec read
from a file fail with the same words; the reader adds the file name and turns it into
``JobFileError`` (or ``ConfigError``).
"""

from __future__ import annotations

import difflib
import math
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import fields
from enum import Enum
from typing import Any

import yaml

from controller import yamlio

_DURATION = re.compile(r"(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?")
_TTL = re.compile(r"(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?")
_MEMORY = re.compile(r"(\d+)([kmgt]?)", re.IGNORECASE)  # Docker's form: 6g
_SIZE = re.compile(r"(\d+)\s*([kmgt]?)(i?b)?", re.IGNORECASE)  # the API's limits: 2GiB, 512m
_UNITS = {"": 1, "k": 1024, "m": 1024**2, "g": 1024**3, "t": 1024**4}


class FieldError(ValueError):
    """A value that a job spec refuses; ``field`` is dotted (``resources.gpus``, ``targets[1]``)."""

    def __init__(self, field: str | None, reason: str) -> None:
        super().__init__(f"{field}: {reason}" if field else reason)
        self.field = field
        self.reason = reason

    def within(self, parent: str) -> FieldError:
        return FieldError(f"{parent}.{self.field}" if self.field else parent, self.reason)


def show(value: object) -> str:
    """A value as the user wrote it in YAML, for messages (``true`` not ``True``)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, str):
        return repr(value)
    if isinstance(value, int | float):
        return str(value)
    if isinstance(value, list | tuple):
        return "a list"
    if isinstance(value, dict):
        return "a mapping"
    return f"a {type(value).__name__}"


def check_int(value: object, field: str, *, minimum: int, maximum: int | None = None) -> int:
    if (
        not isinstance(value, int)
        or isinstance(value, bool)
        or value < minimum
        or (maximum is not None and value > maximum)
    ):
        bound = f"from {minimum} to {maximum}" if maximum is not None else f"≥ {minimum}"
        raise FieldError(field, f"must be an integer {bound}, got {show(value)}")
    return value


def check_number(value: object, field: str, *, above: float, at_most: float | None = None) -> float:
    if (
        not isinstance(value, int | float)
        or isinstance(value, bool)
        or not math.isfinite(value)
        or value <= above
        or (at_most is not None and value > at_most)
    ):
        bound = f"in ({above:g}, {at_most:g}]" if at_most is not None else f"> {above:g}"
        raise FieldError(field, f"must be a number {bound}, got {show(value)}")
    return float(value)


def check_range(value: object, field: str, lo: float, hi: float) -> float:
    """A number in the closed range [lo, hi] (both ends allowed), as a float."""
    if isinstance(value, int | float) and not isinstance(value, bool) and lo <= value <= hi:
        return float(value)
    raise FieldError(field, f"must be a number in [{lo:g}, {hi:g}], got {show(value)}")


def check_bool(value: object, field: str) -> bool:
    if not isinstance(value, bool):
        raise FieldError(field, f"must be true or false, got {show(value)}")
    return value


def check_str(value: object, field: str, *, pattern: str | None = None, hint: str = "") -> str:
    if not isinstance(value, str) or not value:
        raise FieldError(field, f"must be a non-empty string, got {show(value)}")
    if pattern is not None and not re.fullmatch(pattern, value):
        raise FieldError(field, f"must be {hint or 'of the form ' + pattern}, got {show(value)}")
    return value


def check_choice(value: object, field: str, choices: Iterable[str], what: str) -> str:
    options = tuple(choices)
    if not isinstance(value, str) or value not in options:
        raise FieldError(field, f"unknown {what} {show(value)} (choose from {', '.join(options)})")
    return value


def check_unique(values: tuple[str, ...], field: str) -> None:
    for i, v in enumerate(values):
        if v in values[:i]:
            raise FieldError(f"{field}[{i}]", f"{show(v)} is listed twice")


def check_items(values: object, name: str, what: str, *, minimum: int = 1) -> tuple[object, ...]:
    """A tuple of at least ``minimum`` values (a spec built in code must pass tuples, as the reader does)."""
    if not isinstance(values, tuple):
        raise FieldError(name, f"must be a tuple of {what}s, got {show(values)}")
    if len(values) < minimum:
        raise FieldError(name, f"must list at least {minimum} {what}")
    return values


def item_field(name: str, i: int, count: int) -> str:
    """How errors name one value of a key that took one or several (``source``, ``source[2]``)."""
    return name if count == 1 else f"{name}[{i}]"


def check_kinds(spec: object, kinds: tuple[tuple[str, type], ...]) -> None:
    """Each named attribute of ``spec`` is of its kind (sections are their settings classes)."""
    for name, kind in kinds:
        if not isinstance(getattr(spec, name), kind):
            raise FieldError(name, f"must be a {kind.__name__}, got {show(getattr(spec, name))}")


def check_keys(data: Mapping[Any, Any], known: Iterable[str], parent: str | None = None) -> None:
    """Refuse keys no spec field has, suggesting the nearest known one (typos are the usual cause)."""
    names = list(known)
    for key in data:
        if isinstance(key, str) and key in names:
            continue
        field = f"{parent}.{key}" if parent else str(key)
        close = difflib.get_close_matches(str(key), names, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise FieldError(field, f"unknown key{hint}")


def parse_duration(value: object, field: str) -> int:
    """``30m``, ``90s``, ``2h``, ``1h30m`` or whole seconds → seconds (> 0)."""
    return _seconds(value, field, _DURATION, "a duration like 30m, 90s, 2h or 1h30m, or whole seconds")


def parse_ttl(value: object, field: str) -> int:
    """``7d``, ``12h``, ``30m``, ``1d12h`` or whole seconds → seconds (> 0): parse_duration's units
    and days, for lifetimes (links, tokens, retention)."""
    return _seconds(value, field, _TTL, "a duration like 7d, 12h or 30m, or whole seconds")


def _seconds(value: object, field: str, units: re.Pattern[str], hint: str) -> int:
    if isinstance(value, int) and not isinstance(value, bool):
        seconds = value
    else:
        m = units.fullmatch(value) if isinstance(value, str) and value else None
        if m is None:
            raise FieldError(field, f"must be {hint}, got {show(value)}")
        *days, h, mins, s = (int(g) if g else 0 for g in m.groups())
        seconds = sum(days) * 86400 + h * 3600 + mins * 60 + s
    if seconds <= 0:
        raise FieldError(field, f"must be a duration longer than zero, got {show(value)}")
    return seconds


def parse_memory(value: object, field: str) -> int:
    """``6g``, ``512m``, ``1024k`` (binary units, as Docker reads them) or whole bytes → bytes (> 0)."""
    return _bytes(value, field, _MEMORY, "6g, 512m or 1024k, or whole bytes")


def parse_size(value: object, field: str) -> int:
    """``2GiB``, ``512m``, ``10k`` or whole bytes (binary units) → bytes (> 0)."""
    return _bytes(value, field, _SIZE, "2GiB, 512m or whole bytes")


def _bytes(value: object, field: str, form: re.Pattern[str], like: str) -> int:
    """Whole bytes, or digits and a binary unit as ``form`` reads them (group 1 the number, group 2
    the unit's letter) → bytes (> 0); else FieldError saying what it should look ``like``."""
    if isinstance(value, int) and not isinstance(value, bool):
        size = value
    else:
        m = form.fullmatch(value.strip()) if isinstance(value, str) else None
        if m is None:
            raise FieldError(field, f"must be a size like {like}, got {show(value)}")
        size = int(m.group(1)) * _UNITS[m.group(2).lower()]
    if size <= 0:
        raise FieldError(field, f"must be a size above zero, got {show(value)}")
    return size


Reader = Callable[[object, str], Any]
"""Turns one value as YAML gave it into what the spec field holds, or raises FieldError."""


def as_list(what: str, *, str_ok: bool = False) -> Reader:
    def read(value: object, f: str) -> Any:
        if str_ok and isinstance(value, str):
            return (value,)
        if not isinstance(value, list):
            kind = f"a {what} or a list of {what}s" if str_ok else f"a list of {what}s"
            raise FieldError(f, f"must be {kind}, got {show(value)}")
        return tuple(value)

    return read


def as_enum(kind: type[Enum], what: str) -> Reader:
    def read(value: object, f: str) -> Any:
        return kind(check_choice(value, f, (m.value for m in kind), what))

    return read


def as_nested(kind: type[Any], readers: dict[str, Reader]) -> Reader:
    def read(value: object, f: str) -> Any:
        if not isinstance(value, dict):
            raise FieldError(f, f"must be a mapping, got {show(value)}")
        check_keys(value, (x.name for x in fields(kind)), parent=f)
        try:
            return kind(**{k: readers.get(k, same)(v, k) for k, v in value.items()})
        except FieldError as e:
            raise e.within(f) from None

    return read


def same(value: object, f: str) -> Any:
    return value


def duplicate_key(text: str) -> tuple[str, int] | None:
    """The first mapping key written twice, with its line (1-based); YAML would keep the last silently.

    Only composes nodes (no objects are built), so it is as safe as ``yaml.safe_load``; a malformed
    document returns None and is reported by ``safe_load``.
    """
    try:
        root = yamlio.compose(text)
    except yaml.YAMLError:
        return None
    stack: list[yaml.Node] = [root] if root is not None else []
    visited: set[int] = set()  # aliases share nodes: without this, "billion laughs" never ends
    while stack:
        node = stack.pop()
        if id(node) in visited:
            continue
        visited.add(id(node))
        if isinstance(node, yaml.MappingNode):
            seen: set[str] = set()
            for key, value in node.value:
                if isinstance(key, yaml.ScalarNode):
                    if key.value in seen:
                        return str(key.value), key.start_mark.line + 1
                    seen.add(key.value)
                stack.append(value)
        elif isinstance(node, yaml.SequenceNode):
            stack.extend(node.value)
    return None


def seconds(value: Any) -> float | None:
    """A config's number of seconds: a number, or a string like ``500ms`` or ``20s``; None: not one."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, str):
        for suffix, scale in (("ms", 0.001), ("s", 1.0)):
            if value.endswith(suffix):
                try:
                    return float(value[: -len(suffix)]) * scale
                except ValueError:
                    return None
    return None
