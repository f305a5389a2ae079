"""``webhooks:`` in the cluster config: how long the webhook outbox keeps trying (controller/run/outbox.py).

Which hosts a job may post to and the signing keys stay in ``policy.webhooks`` and
``tenants.<t>.webhooks`` (controller/policy.py); this section is only the delivery schedule, the same
for every job.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from controller.settings.fields import FieldError, parse_duration

# Seconds to wait after each failed attempt; the last attempt comes about 34 h after the first.
DEFAULT_SCHEDULE = (5, 30, 120, 600, 3600, 3 * 3600, 6 * 3600, 12 * 3600, 12 * 3600)
MAX_STEPS = 50
MAX_STEP = 7 * 86400


@dataclass(frozen=True)
class WebhookSettings:
    """``retry_schedule``: the wait before each retry, in seconds; its length is the number of retries."""

    retry_schedule: tuple[int, ...] = DEFAULT_SCHEDULE

    @property
    def span(self) -> int:
        """Seconds from the first attempt to the last."""
        return sum(self.retry_schedule)


def parse_webhook_settings(data: Any) -> WebhookSettings:
    if data is None:
        return WebhookSettings()
    if not isinstance(data, Mapping) or set(data) - {"retry_schedule"}:
        raise FieldError("webhooks", "must be a mapping with retry_schedule (a list of durations like 5s, 2m, 1h)")
    raw = data.get("retry_schedule", list(DEFAULT_SCHEDULE))
    if not isinstance(raw, list) or not 1 <= len(raw) <= MAX_STEPS:
        raise FieldError("webhooks.retry_schedule", f"must be a list of 1 to {MAX_STEPS} durations like 5s, 2m, 1h")
    steps = []
    for n, value in enumerate(raw):
        seconds = parse_duration(value, f"webhooks.retry_schedule[{n}]")
        if seconds > MAX_STEP:
            raise FieldError(f"webhooks.retry_schedule[{n}]", "must be at most 7 days")
        steps.append(seconds)
    return WebhookSettings(tuple(steps))
