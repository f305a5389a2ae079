"""Image references: which one a chunk service runs for the image a config names."""

from __future__ import annotations

from collections.abc import Iterable


def repository(ref: str) -> str:
    """``host:port/team/runner:tag@sha256:…`` → ``host:port/team/runner`` (the tag and digest dropped;
    a colon before the last slash is a registry's port)."""
    name = ref.partition("@")[0]
    slash, colon = name.rfind("/"), name.rfind(":")
    return name[:colon] if colon > slash else name


def familiar(name: str) -> str:
    """A repository as the engine shows it: docker.io/library/x is x, docker.io/a/b is a/b."""
    for prefix in ("docker.io/", "index.docker.io/"):
        if name.startswith(prefix):
            name = name[len(prefix) :]
            break
    return name.removeprefix("library/")


def pinned_image(ref: str, image_id: str, repo_digests: Iterable[str]) -> str:
    """What a service runs for ``ref``: the digest that ``ref``'s own repository knows the image by,
    else the image ID. A digest of another repository (the image pushed to some other registry once)
    would make every task pull from that registry, which a node may not reach or which may be gone."""
    wanted = familiar(repository(ref))
    for digest in repo_digests:
        if familiar(repository(str(digest))) == wanted:
            return str(digest)
    return image_id
