"""A tenant's objects in the store as the API serves them (docs/api.md#object-storage): presigned links
for its ``s3://`` outputs (status, report, items, the item route's 302), the store bound to its area
for checking a job at submit, and the committed objects results.zip streams.

One S3 client per credentials file, made on first use: a tenant whose ``tenants.<t>.s3`` names its
own keys is served with a client of its own, never the cluster's (``storage.s3``); the file is read
then, not at start, so an API without object storage never needs a secret. Links are signed locally
(nothing is asked of the server) and live ``storage.s3.link_ttl``. Only objects inside the caller's
area (``tenants.<t>.s3``) are ever linked or read, whatever a run folder says.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from contract.s3 import S3Url, is_s3
from controller.api.area import Area
from controller.api.errors import ApiError
from controller.config import Config
from controller.errors import FfswarmError
from controller.run.fold import Fold
from controller.run.rundir import RunDir
from controller.storage.area import StorageArea
from controller.storage.settings import S3Settings

if TYPE_CHECKING:
    from controller.storage.s3 import S3Store

__all__ = [
    "MAX_LINKS",
    "Committed",
    "Objects",
    "committed_objects",
    "fresh_links",
    "in_area",
    "job_links",
    "output_urls",
]

MAX_LINKS = 100  # presigned links a status object or a webhook carries inline; the rest: report, items, results.zip


class Objects:
    """The API's way to the store; thread-safe (boto3 clients are)."""

    def __init__(self, settings: S3Settings | None) -> None:
        self.settings = settings
        self._clients: dict[Path, Any] = {}  # credentials file → its client
        self._lock = threading.Lock()

    def settings_for(self, area: StorageArea | None) -> S3Settings:
        """How the store is reached for ``area``'s tenant: its own credentials, or the cluster's."""
        if self.settings is None:
            raise ApiError(503, "storage_unavailable", "object storage is not configured on this API")
        return self.settings.for_area(area)

    def client(self, area: StorageArea | None = None) -> Any:
        """The client made from the credentials ``area``'s tenant uses (the cluster's without one)."""
        settings = self.settings_for(area)
        with self._lock:
            made = self._clients.get(settings.credentials_file)
            if made is None:
                from controller.storage.s3 import make_client  # boto3: only for an API that uses the store

                try:
                    made = self._clients[settings.credentials_file] = make_client(settings)
                except FfswarmError:  # the credentials file: its error names it; never said to a tenant
                    raise ApiError(
                        503, "storage_unavailable", "object storage cannot be used now; try again later",
                        headers={"Retry-After": "30"},
                    ) from None  # fmt: skip
            return made

    def store(self, area: StorageArea | None = None) -> S3Store:
        """The store; bound to a tenant's area when given (every URL outside it is refused) and reached
        with that tenant's credentials."""
        from controller.storage.s3 import S3Store
        from controller.storage.tenant import TenantStore

        settings, client = self.settings_for(area), self.client(area)
        return S3Store(settings, client) if area is None else TenantStore(settings, client, area)

    def link(self, url: str, area: StorageArea | None = None) -> str | None:
        """A presigned GET link for one object, signed with ``area``'s tenant's credentials; None when
        none can be made (no storage, no credentials)."""
        try:
            return self.store(area).presign_get(S3Url.parse(url))
        except (ApiError, FfswarmError, ValueError):
            return None


def in_area(area: Area, url: str | None) -> bool:
    """Whether ``url`` is an object in the caller's part of the store."""
    return url is not None and is_s3(url) and area.s3 is not None and area.s3.relative(url) is not None


@dataclass(frozen=True)
class Committed:
    """An object a committed item wrote, as its result line recorded it."""

    item: str
    url: str
    size: int | None
    sha256: str | None
    video: bool = False


def committed_objects(fold: Fold, area: Area) -> list[Committed]:
    """The job's committed outputs that are objects in the caller's area, in item order."""
    out: list[Committed] = []
    for item in fold.plan.items:
        r = fold.result(item.id)
        done = item.kind == "image" and fold.committed(item.id) and r is not None and r.output is not None
        if done and r is not None and in_area(area, item.output):
            out.append(Committed(item.id, item.output, r.size, r.sha256))
    for video in fold.plan.videos:
        s, join = fold.video_status(video), fold.joined.get(video.id)
        if s is not None and not s.is_failure() and join is not None and in_area(area, video.output):
            out.append(Committed(video.id, video.output, join.size, join.sha256, video=True))
    return sorted(out, key=lambda c: c.item)


def output_urls(
    objects: Objects, outputs: list[Committed], limit: int = MAX_LINKS, area: StorageArea | None = None
) -> dict[str, Any]:
    """``{"output_urls": {item: link}}`` for at most ``limit`` objects (the first in item order), and
    ``output_urls_more``: how many more there are (their links: the report, the items, results.zip).
    Signed with ``area``'s tenant's credentials."""
    if not outputs:
        return {}
    links = {c.item: objects.link(c.url, area) for c in outputs[:limit]}
    out: dict[str, Any] = {"output_urls": {k: v for k, v in links.items() if v is not None}}
    if len(outputs) > limit:
        out["output_urls_more"] = len(outputs) - limit
    return out


def job_links(config: Config, area: Area, job: str, objects: Objects) -> dict[str, Any]:
    """What ``GET /v1/jobs/{id}`` adds for a tenant with a storage area: ``output_urls`` (bounded)."""
    rundir = RunDir(config.data_root, job)
    if area.s3 is None or not rundir.exists():
        return {}
    try:
        fold = Fold.read(rundir.plan(), rundir)
    except (FfswarmError, ValueError, OSError):  # a run folder being written or odd: links next time
        return {}
    return output_urls(objects, committed_objects(fold, area), area=area.s3)


def fresh_links(report: dict[str, Any], area: Area, objects: Objects) -> dict[str, Any]:
    """The report with each item's ``output_url`` signed now (the one in report.json was signed when
    the job ended); an object outside the caller's area gets none."""
    items = report.get("items")
    if not isinstance(items, dict):
        return report
    fresh: dict[str, Any] = {}
    for key, entry in items.items():
        if isinstance(entry, dict) and ("output_url" in entry or is_s3(entry.get("output"))):
            entry = {k: v for k, v in entry.items() if k != "output_url"}
            link = objects.link(entry["output"], area.s3) if in_area(area, entry.get("output")) else None
            if link is not None:
                entry["output_url"] = link
        fresh[key] = entry
    return {**report, "items": fresh}
