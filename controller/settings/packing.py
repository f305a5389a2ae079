"""`packing:` in the cluster config (controller/serve/packing.py packs small jobs with it)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from contract.handoff import LINGER_MAX
from controller.settings.fields import FieldError, seconds

MAX_PACK_ITEMS = 1000  # one pack's photos at most (the largest chunk `auto` makes)


@dataclass(frozen=True)
class PackingSettings:
    """``packing:`` in the cluster config. ``max_items`` 0: packing off (every job runs alone)."""

    max_items: int = 0
    window: float = 1.0  # seconds a bucket stays open after its first job (longer while slots are busy)
    pack_items: int = MAX_PACK_ITEMS
    linger: float = 0.0  # seconds a pack's chunk service waits for the next pack (controller/run/lanes.py)

    @property
    def on(self) -> bool:
        return self.max_items > 0


def parse_packing(data: Any) -> PackingSettings:
    if data is None:
        return PackingSettings()
    if not isinstance(data, Mapping) or set(data) - {"max_items", "window", "pack_items", "linger"}:
        raise FieldError("packing", "must be a mapping of max_items, window, pack_items, linger")
    max_items = data.get("max_items", 0)
    if not isinstance(max_items, int) or isinstance(max_items, bool) or not 0 <= max_items <= MAX_PACK_ITEMS:
        raise FieldError("packing.max_items", f"must be an integer from 0 (off) to {MAX_PACK_ITEMS}")
    window = seconds(data.get("window", 1.0))
    if window is None or not 0 <= window <= 60:
        raise FieldError("packing.window", "must be 0 to 60 seconds (a number, or like 500ms or 2s)")
    pack_items = data.get("pack_items", MAX_PACK_ITEMS)
    if not isinstance(pack_items, int) or isinstance(pack_items, bool) or not 1 <= pack_items <= MAX_PACK_ITEMS:
        raise FieldError("packing.pack_items", f"must be an integer from 1 to {MAX_PACK_ITEMS}")
    linger = seconds(data.get("linger", 0.0))
    if linger is None or not 0 <= linger <= LINGER_MAX:
        raise FieldError("packing.linger", f"must be 0 (off) to {LINGER_MAX:g} seconds (a number, or like 20s)")
    return PackingSettings(max_items, window, max(pack_items, max_items), linger)
