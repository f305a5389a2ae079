"""The face selector (job file ``selector: {order, gender, age}``): which detected faces of a frame a
job may change, and in which order — FaceFusion's face_selector_order names and its gender/age
filters.

``order`` sorts the faces of a frame: ``faces: one`` takes the first, ``many`` and ``reference``
process them in that order. ``gender``/``age`` drop the faces that do not match before ``faces:``
applies; judging them needs the pack's ``genderage`` model (contract/processors.py SELECTOR_NEEDS),
so a job loads it only when it filters (``filters``). A frame whose faces are all dropped has no
face (the job's ``no_face``).

The default order, ``large-small`` with ties broken left to right then top to bottom, is what
``faces: one`` always took (the largest box), so jobs without a selector pick the same face as
before. Standard library only (contract/).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from contract.errors import ManifestError

ORDERS = (
    "left-right",
    "right-left",
    "top-bottom",
    "bottom-top",
    "small-large",
    "large-small",
    "best-worst",
    "worst-best",
)
GENDERS = ("any", "female", "male")
DEFAULT_ORDER = "large-small"
AGE_LIMITS = (0, 100)  # the genderage model's range (its third output is age / 100)


def filters(gender: str, age: tuple[int, int]) -> bool:
    """Whether a selector drops faces by gender or age (and so needs the genderage model)."""
    return gender != "any" or tuple(age) != AGE_LIMITS


def age_problem(age: Any) -> str | None:
    """Why ``age`` is not ``[min, max]`` of integers 0..100 with min ≤ max (None: it is)."""
    ints = isinstance(age, list | tuple) and len(age) == 2
    ints = ints and all(isinstance(v, int) and not isinstance(v, bool) for v in age)
    lo, hi = AGE_LIMITS
    if not ints or not lo <= age[0] <= age[1] <= hi:
        return f"must be [min, max], integers from {lo} to {hi} with min ≤ max"
    return None


@dataclass(frozen=True)
class Selector:
    """A job's selector as the manifest carries it (``selector_order``, ``selector_gender``,
    ``selector_age``); checked when built (ManifestError naming the manifest field)."""

    order: str = DEFAULT_ORDER
    gender: str = "any"
    age: tuple[int, int] = AGE_LIMITS

    def __post_init__(self) -> None:
        if self.order not in ORDERS:
            raise ManifestError(f"selector_order must be one of {', '.join(ORDERS)}, got {self.order!r}")
        if self.gender not in GENDERS:
            raise ManifestError(f"selector_gender must be one of {', '.join(GENDERS)}, got {self.gender!r}")
        if (why := age_problem(self.age)) is not None:
            raise ManifestError(f"selector_age {why}, got {self.age!r}")
        object.__setattr__(self, "age", (int(self.age[0]), int(self.age[1])))

    @property
    def filters(self) -> bool:
        return filters(self.gender, self.age)

    def describe(self) -> str:
        """The filters in the job file's words, for a "no face matches" reason."""
        parts = [f"gender {self.gender}"] if self.gender != "any" else []
        if tuple(self.age) != AGE_LIMITS:
            parts.append(f"age {self.age[0]}-{self.age[1]}")
        return ", ".join(parts) or "no filter"

    def manifest_fields(self) -> dict[str, Any]:
        """The manifest's keyword arguments for this selector."""
        return {"selector_order": self.order, "selector_gender": self.gender, "selector_age": self.age}


def read_fields(data: dict[str, Any]) -> dict[str, Any]:
    """The selector's manifest fields present in ``data`` (parsed JSON), typed; the ranges are
    checked when the Manifest is built (``check``)."""
    out: dict[str, Any] = {}
    for name in ("selector_order", "selector_gender"):
        if name in data:
            if not isinstance(data[name], str):
                raise ManifestError(f"{name} must be a string, got {data[name]!r}")
            out[name] = data[name]
    if "selector_age" in data:
        age = data["selector_age"]
        if (why := age_problem(age)) is not None:
            raise ManifestError(f"selector_age {why}, got {age!r}")
        out["selector_age"] = (age[0], age[1])
    return out


def check(order: str, gender: str, age: tuple[int, int]) -> Selector:
    """The manifest's three fields as a checked Selector (ManifestError naming the field)."""
    return Selector(order, gender, age)
