"""The ffswarm HTTP API from Python: ``Client(url, token)`` (docs/client.md).

Needs only httpx; nothing here touches Docker or the data root, so it runs on any machine that can
reach the API."""

from controller.client.client import Client
from controller.client.errors import ApiError, ClientError, FieldError, TransportError
from controller.client.models import Event, Items, Job, Submitted, Usage

__all__ = [
    "ApiError",
    "Client",
    "ClientError",
    "Event",
    "FieldError",
    "Items",
    "Job",
    "Submitted",
    "TransportError",
    "Usage",
]
