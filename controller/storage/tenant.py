"""The object store as one tenant's job sees it: an S3Store that carries the tenant's area
(config ``tenants.<t>.s3``), so that the job's checks (controller/job/remote.py) refuse every
``s3://`` URL outside it before anything is listed, read or written. Its settings and client are the
tenant's own credentials when its area names them (S3Settings.for_area), never the cluster's then."""

from __future__ import annotations

from typing import Any

from controller.storage.area import StorageArea
from controller.storage.s3 import S3Settings, S3Store

__all__ = ["TenantStore"]


class TenantStore(S3Store):
    def __init__(self, settings: S3Settings, client: Any, area: StorageArea) -> None:
        super().__init__(settings, client)
        self.area = area

    def __repr__(self) -> str:
        return f"TenantStore(area={str(self.area)!r}, endpoint={self.settings.endpoint_url or 'AWS'!r})"
