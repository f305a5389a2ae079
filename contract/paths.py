"""Container paths: every path the controller hands a runner is under ``/data``, the shared volume
as each container mounts it, so a manifest means the same thing on every node. And how such paths
are shown to people: relative to the data root, as a job file names them.
"""

from __future__ import annotations

import re

from contract.errors import ManifestError

CONTAINER_DATA_ROOT = "/data"


def user_path(container_path: str) -> str:
    """A container path as the user wrote it in the job file: relative to the data root
    (``/data/hidden/in/a.jpg`` → ``hidden/in/a.jpg``). Every reason a user reads (results, report,
    summary, serve's reason files) names files this way; the runner's own log lines may keep
    container paths. A path outside the data root is returned unchanged."""
    if container_path == CONTAINER_DATA_ROOT:
        return "."
    return container_path.removeprefix(CONTAINER_DATA_ROOT + "/")


def user_text(text: str, *roots: str) -> str:
    """Free text someone else wrote (a runner's last words, a traceback's last line, a result line
    of an older runner, an error naming host files) with the paths in it under the data root written
    as ``user_path`` writes them. ``roots``: other folders that are the data root (the controller
    host's); a path counts where no other path's characters come right before it."""
    for root in (CONTAINER_DATA_ROOT, *roots):
        root = root.rstrip("/")
        if root and root + "/" in text:
            text = re.sub(rf"(?<![\w./~-]){re.escape(root)}/", "", text)
    return text


def container_path(rel: str) -> str:
    """``/data/<rel>`` for a normalised path relative to the data root ("." is the root itself)."""
    return CONTAINER_DATA_ROOT if rel in ("", ".") else f"{CONTAINER_DATA_ROOT}/{rel}"


def require_container_path(path: str, what: str) -> None:
    """ManifestError unless ``path`` is a normalised path under the container's data root."""
    if not isinstance(path, str) or not (path == CONTAINER_DATA_ROOT or path.startswith(CONTAINER_DATA_ROOT + "/")):
        raise ManifestError(f"{what}: {path!r} is not a path under {CONTAINER_DATA_ROOT}")
    if "/../" in path + "/" or "/./" in path + "/":
        raise ManifestError(f"{what}: {path!r} is not normalised")
