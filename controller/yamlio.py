"""YAML as plain data, read and written by libyaml (PyYAML's C scanner and emitter) when this PyYAML
has it, by PyYAML's pure-Python classes otherwise. Both build the same documents through the same
safe constructor and resolver; the C classes take a small fraction of the CPU, which matters where
every request or job reads YAML (job files, pack.yaml, the inbox). A document that fails to parse is
parsed again by the pure-Python loader, so refusals read the same whichever is installed."""

from __future__ import annotations

from typing import Any

import yaml

_LOADER: type[Any] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_DUMPER: type[Any] = getattr(yaml, "CSafeDumper", yaml.SafeDumper)


def load(text: str | bytes) -> Any:
    """``yaml.safe_load``: tags such as ``!!python/object`` fail; errors as the pure-Python loader words them."""
    try:
        return yaml.load(text, Loader=_LOADER)  # noqa: S506 - a safe loader, C or Python
    except yaml.YAMLError:
        if _LOADER is yaml.SafeLoader:
            raise
    return yaml.safe_load(text)  # raises the same refusal, worded as the pure-Python loader words it


def compose(text: str) -> yaml.Node | None:
    """The document's node tree (with each node's line and column), no objects built."""
    try:
        return yaml.compose(text, Loader=_LOADER)
    except yaml.YAMLError:
        if _LOADER is yaml.SafeLoader:
            raise
    return yaml.compose(text, Loader=yaml.SafeLoader)


def dump(data: Any, **options: Any) -> str:
    """``yaml.safe_dump`` to a string (options as safe_dump's: sort_keys, allow_unicode, …)."""
    return str(yaml.dump(data, Dumper=_DUMPER, **options))
