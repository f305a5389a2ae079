"""Where a job may write: outputs fenced at plan time.

A job file names its outputs with a template, so one line can aim every output at another job's run
folder, the model packs, the inbox, or at the job's own inputs (``output: alice/photos/{name}`` over
Alice's originals). Refused here, before anything runs, each with exit 65 naming the file, the field
``output`` and the path relative to the data root:

- an output under ``runs/``, ``models/``, ``inbox/`` or ``tenants/`` (reserved for the controller,
  the packs, the inbox, and tenants' areas), also when a symlinked folder leads there;
- for a tenant's job (an API job with an owner record: controller/job/owners.py), any input or
  output outside that tenant's area ``tenants/<tenant>/``: never another tenant's, never the rest
  of the data root; nor an output at the area's top or under its ``uploads/``, which are the API's
  (only the folders outputs go to are the runner's: controller/job/access.py own_area);
- an output that is one of the job's inputs (any item's, the source photos, the reference);
- a new run whose outputs already exist, unless the job says ``overwrite: true``;
- an output another live job claims (controller/job/claims.py).
"""

from __future__ import annotations

import posixpath
from collections.abc import Callable, Iterable, Sequence

from contract.layout import RESERVED
from controller.errors import JobFileError

SHOWN = 3  # existing outputs named in a refusal
UPLOADS = "uploads"  # in a tenant's area: the API's folder of uploaded inputs (controller/api/sweep.py)
MAX_OUTPUT_MOUNTS = 16  # writable output folders one runner's service mounts (controller/swarm/servicespec.py)


def writable_outputs(area: str, folders: Iterable[str], file: str = "job") -> list[str]:
    """The folders a tenant's runner may write (tenant_mounts), covering every output folder in
    ``folders`` (each the ``area`` or under it, relative to the data root): nested ones are one, and
    more than MAX_OUTPUT_MOUNTS are merged at the deepest level below the area where they fit
    (``out/a/1`` … ``out/b/9`` into ``out/a`` and ``out/b``) — never into the area itself, whose top
    and ``uploads/`` are the API's. A JobFileError on ``output`` when even the area's top folders are
    too many: the job is refused at submit (the API's and serve's), not given its whole area."""
    unique = list(dict.fromkeys(folders))
    outputs = sorted(f for f in unique if not any(f.startswith(g + "/") for g in unique if g != f))
    if len(outputs) <= MAX_OUTPUT_MOUNTS or area in outputs:
        return outputs
    below = [f[len(area) + 1 :].split("/") for f in outputs]
    for depth in range(max(len(p) for p in below) - 1, 0, -1):
        merged = sorted({"/".join([area, *p[:depth]]) for p in below})
        if len(merged) <= MAX_OUTPUT_MOUNTS:
            return merged
    tops = len({p[0] for p in below})
    raise JobFileError(
        file,
        "output",
        f"the outputs go to {tops} folders at the top of the tenant's area, more than the {MAX_OUTPUT_MOUNTS} "
        "one runner may write: put them under fewer folders (e.g. out/)",
    )


def inside(rel: str, area: str) -> bool:
    return rel.startswith(area + "/")


def check_area(out_rel: str, target_rel: str, file: str, area: str | None = None) -> None:
    """``out_rel`` (the real path, relative to the data root) is outside the reserved areas; for a
    tenant's job (``area``: ``tenants/<tenant>``), inside that tenant's area, in a folder of it
    other than ``uploads/``: the area's top and its uploads are the API's, never the runner's."""
    if area is not None:
        if not inside(out_rel, area):
            raise JobFileError(file, "output", f"for {target_rel!r}: {out_rel} is outside the tenant's area {area}/")
        if posixpath.dirname(out_rel) == area:
            raise JobFileError(
                file,
                "output",
                f"for {target_rel!r}: {out_rel} would be at the top of the tenant's area, which is the API's: "
                "outputs go into a folder of it (out/<job>/ by default)",
            )
        if inside(out_rel, f"{area}/{UPLOADS}"):
            raise JobFileError(
                file,
                "output",
                f"for {target_rel!r}: {out_rel} would be under {UPLOADS}/, the API's folder of uploaded files: "
                "outputs go into another folder (out/<job>/ by default)",
            )
        return
    top = out_rel.split("/", 1)[0]
    if top in RESERVED or out_rel in (".", ""):
        raise JobFileError(
            file,
            "output",
            f"for {target_rel!r}: {out_rel} is under {top}/, which ffswarm keeps for itself "
            f"({', '.join(r + '/' for r in RESERVED)} never hold a job's outputs)",
        )


def check_input_area(rel: str, field: str, file: str, area: str | None) -> None:
    """A tenant's job reads only from its own area (``rel``: the real path, relative to the data root)."""
    if area is not None and not inside(rel, area):
        raise JobFileError(file, field, f"{rel} is outside the tenant's area {area}/")


def check_not_input(out_rel: str, target_rel: str, input_rels: set[str], file: str) -> None:
    if out_rel in input_rels:
        raise JobFileError(file, "output", f"{target_rel!r} would be written to {out_rel}, an input of this job")


def check_overwrite(outputs: Sequence[str], exists: Callable[[str], bool], file: str) -> None:
    """A new run never replaces files that exist already, unless ``overwrite: true``."""
    found = [rel for rel in outputs if exists(rel)]
    if not found:
        return
    shown = ", ".join(found[:SHOWN]) + (f" and {len(found) - SHOWN} more" if len(found) > SHOWN else "")
    raise JobFileError(
        file,
        "output",
        f"{len(found)} output(s) already exist: {shown}; set overwrite: true to replace them "
        "(where the cluster's policy.allow_overwrite allows it)",
    )
