"""One webhook delivery's record, as the outbox keeps it on the shared volume: written by ffswarm,
read back as hostile (every field's type checked; an error names the file, never its content).
The outbox that keeps them is controller/run/outbox.py."""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from controller.errors import FfswarmError
from controller.job.plan import ID
from controller.job.settings import WEBHOOK_EVENTS
from controller.run.status import utc

DELIVERY_ID = re.compile(r"msg_[0-9a-f]{32}")
STATES = ("pending", "delivered", "failed")


class OutboxError(FfswarmError):
    """A delivery record that is not what the controller wrote; names the file, never its content."""


@dataclass(frozen=True)
class Delivery:
    id: str
    job: str
    type: str
    url: str
    body: str  # the envelope as sent, fixed at enqueue
    created: float
    state: str = "pending"
    next_attempt: float | None = None
    attempts: tuple[dict[str, Any], ...] = ()  # {"at": float, "status": int} | {"at": float, "error": str}
    tries: int = 0  # attempts since the delivery was (re)queued: the position in the schedule
    generation: int = 0  # bumped by each redelivery: names its queue entry

    def view(self) -> dict[str, Any]:
        """What the API shows: no URL (it may carry a token) and no body."""
        return {
            "id": self.id,
            "type": self.type,
            "created_at": utc(self.created),
            "state": self.state,
            "next_attempt_at": utc(self.next_attempt) if self.next_attempt is not None else None,
            "attempts": [{**a, "at": utc(a["at"])} for a in self.attempts],
        }

    def to_json(self) -> bytes:
        return json.dumps({**asdict(self), "attempts": list(self.attempts)}).encode()

    @staticmethod
    def parse(raw: bytes, where: str) -> Delivery:
        """A record read back from the volume, every field's type checked."""
        try:
            data = json.loads(raw)
        except ValueError:
            raise OutboxError(f"{where}: not valid JSON (edited or truncated?)") from None
        try:
            _need(isinstance(data, dict))
            d = Delivery(
                id=_str(data, "id"),
                job=_str(data, "job"),
                type=_str(data, "type"),
                url=_str(data, "url"),
                body=_str(data, "body"),
                created=_num(data["created"]),
                state=_str(data, "state"),
                next_attempt=None if data.get("next_attempt") is None else _num(data["next_attempt"]),
                attempts=tuple(_attempt(a) for a in data.get("attempts", [])),
                tries=int(_num(data.get("tries", 0))),
                generation=int(_num(data.get("generation", 0))),
            )
            _need(bool(DELIVERY_ID.fullmatch(d.id) and ID.fullmatch(d.job)))
            _need(d.state in STATES and d.type in WEBHOOK_EVENTS)
        except (KeyError, TypeError, ValueError):
            raise OutboxError(f"{where}: not a delivery record (edited?)") from None
        return d


def _need(ok: bool) -> None:
    """A record's field is not what ffswarm writes (a ValueError: Delivery.parse names the file)."""
    if not ok:
        raise ValueError("not a delivery record")


def _str(data: Mapping[str, Any], key: str) -> str:
    value = data[key]
    _need(isinstance(value, str))
    return str(value)


def _num(value: object) -> float:
    if not isinstance(value, int | float) or isinstance(value, bool) or not math.isfinite(value) or value < 0:
        raise ValueError("not a time or count")
    return float(value)


def _attempt(a: object) -> dict[str, Any]:
    if not isinstance(a, dict):
        raise ValueError("not an attempt")
    at = _num(a.get("at"))
    if "status" in a:
        status = a["status"]
        _need(isinstance(status, int) and not isinstance(status, bool) and 100 <= status <= 599)
        return {"at": at, "status": status}
    error = a.get("error")
    _need(isinstance(error, str) and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_.]{0,80}", error) is not None)
    return {"at": at, "error": error}


def stable_id(job: str, kind: str, run: str) -> str:
    """The delivery id of ``kind`` for one run of ``job``: the same on every call, so an end queued
    twice (a controller restarted half-way) is one delivery."""
    return "msg_" + hashlib.sha256(f"{job}\0{kind}\0{run}".encode()).hexdigest()[:32]
