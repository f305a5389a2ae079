"""Which jobs get warm runners, and which lanes they may use (the mechanism: controller/run/lanes.py).

A lane's service mounts what any chunk it may be handed needs: a CLI job's the data root; a tenant's
its area read-only, ``<area>/out`` writable and the tenant's folder of run folders
(``runs/.tenants/<key>``, controller/run/jobs.py data_mounts). So a tenant's pack or job goes to a
lane only when its run folder is in that folder (its id carries the tenant key) and its outputs are
all under ``out/``; anything else runs in services that mount exactly its folders.
"""

from __future__ import annotations

from typing import Any

from contract.layout import run_tenant_key
from contract.manifest import FaceSelection
from contract.s3 import is_s3
from controller.job.owners import outputs_rel
from controller.job.plan import Plan
from controller.job.spec import JobSpec


def warmth(linger: float, spec: JobSpec, plan: Plan, tenant: str | None, width: int, shared: bool) -> dict[str, Any]:
    """What a job prepared with ``runners.linger`` gets (PreparedJob's ``linger``, ``people_in_chunks``):
    a job whose runners may take the chunks of later jobs of its kind (``shared``: shares_lanes — a
    `submit`'s or `serve`'s lanes) embeds its source photos in each chunk after its models load, as a
    pack's do — a warm runner then starts on its first photo at once, no identity step's container to
    wait for — unless a reference photo is to be embedded too. Any other tenant's job (mounts of its
    own) has warm runners only for a next chunk of its own: when it has more chunks than it runs at once."""
    if linger <= 0 or (not shared and len(plan.chunks) <= width):
        return {}
    own = not shared or spec.reference is not None or spec.faces is FaceSelection.REFERENCE
    return {"linger": linger, "people_in_chunks": not own}


def writes_in_out(plan: Plan, tenant: str | None) -> bool:
    """Whether every output of a tenant's job goes under ``<area>/out`` (or to ``s3://``), the one
    folder of its area a lane mounts writable (a CLI job's lane mounts the data root)."""
    out = "" if tenant is None else outputs_rel(tenant) + "/"
    return all(is_s3(i.output) or i.output.startswith(out) for i in plan.items)


def shares_lanes(job: str, plan: Plan, tenant: str | None) -> bool:
    """Whether a job's chunks may run in lanes that run other jobs' chunks too (a `submit`'s, `serve`'s):
    a CLI job (its runners see the data root), or a tenant's job whose run folder is in its tenant's
    folder of runs (its id carries the tenant key: an API job's, a pack's) and that writes only under
    ``<area>/out`` (writes_in_out) — what a lane of its tenant mounts (controller/run/jobs.py
    data_mounts), so a lane never sees another tenant's folders."""
    return tenant is None or (run_tenant_key(job) is not None and writes_in_out(plan, tenant))


def lane_allowed(plan: Plan, tenant: str | None) -> bool:
    """Whether a pack's chunk may run in a lane: the one place that decides (controller/serve/packs.py
    build; its ``linger`` then says so to the launcher, the mounts and the manifests). A lane runs a
    one-chunk pack, then the later packs of its tenant and kind it is handed, whose output folders are
    unknown when its service is made; so of a tenant's area it mounts only ``<area>/out`` writable
    (controller/run/jobs.py data_mounts), and a tenant's pack that writes anywhere else in its area
    (a job file may name any folder there) never goes to a lane: it runs in a service of its own that
    mounts exactly its folders (writes_in_out). A CLI jobs' pack's lane mounts the data root."""
    return len(plan.chunks) == 1 and writes_in_out(plan, tenant)
