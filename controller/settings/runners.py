"""`runners:` in the cluster config: how a job's chunk services are used (controller/run/lanes.py)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from contract.handoff import LINGER_MAX
from controller.settings.fields import FieldError, seconds


@dataclass(frozen=True)
class RunnersSettings:
    """``runners:``. ``linger`` > 0: a job of several chunks runs its next chunk in a service whose
    runner has just finished one of its chunks, its models still loaded, instead of a fresh service;
    the runner waits that long for it (a few seconds is plenty: the controller hands the next chunk
    over as soon as the last one's record says it ended). 0: every chunk in a service of its own."""

    linger: float = 0.0


def parse_runners(data: Any) -> RunnersSettings:
    if data is None:
        return RunnersSettings()
    if not isinstance(data, Mapping) or set(data) - {"linger"}:
        raise FieldError("runners", "must be a mapping of linger")
    linger = seconds(data.get("linger", 0.0))
    if linger is None or not (linger == 0 or 5 <= linger <= LINGER_MAX):
        raise FieldError("runners.linger", f"must be 0 (off) or 5 to {LINGER_MAX:g} seconds (a number, or like 10s)")
    return RunnersSettings(linger)
