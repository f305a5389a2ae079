"""A chunk's s3:// inputs, outputs and photos, beside its data-root ones (docs/storage.md).

A manifest that names any object carries a ``storage`` block (contract/s3.py StorageAccess): the
runner makes one client per attempt from it and the credentials file (the Swarm secret), and reads
and commits through s3io.Store. Everything here takes a manifest's path as it is, ``s3://…`` or
``/data/…``, so that the item loop has one code path for both.

boto3 is imported only when a manifest names an object: a chunk on the data volume alone does not pay
for its import.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from contract.manifest import Limits
from contract.paths import user_path
from contract.s3 import SECRETS_DIR, S3Url, StorageAccess, is_s3

from . import media
from .errors import BadManifest, ItemError, MissingInput, Temporary
from .safefs import Digest
from .volume import DataRoot, is_volume_error

if TYPE_CHECKING:
    from .s3io import Existing, Store

TMPFS_MARGIN = 32 * 1024**2  # left free on the tmpfs beside a video's copy (ffmpeg's messages …)


def url_of(text: str) -> S3Url:
    """The manifest checked every URL; a bad one here fails its item rather than the chunk."""
    try:
        return S3Url.parse(text)
    except ValueError as e:
        raise ItemError(f"{text!r}: {e}") from None


def credentials_path(storage: StorageAccess, secrets_root: str | None) -> str:
    """The credentials file as this process sees it: the manifest's path, or (tests, local runs) the
    same name beneath ``secrets_root`` standing in for /run/secrets."""
    if not secrets_root:
        return storage.credentials_file
    return os.path.join(secrets_root, storage.credentials_file.removeprefix(SECRETS_DIR))


@dataclass
class _Copy:
    lock: threading.Lock = field(default_factory=threading.Lock)
    users: int = 0
    path: Path | None = None
    close: Callable[[], Any] | None = None


@dataclass
class Objects:
    """The store as one attempt reaches it; shared by every item thread."""

    store: Store
    job: str
    tmp: str = field(default_factory=tempfile.gettempdir)  # the container's tmpfs
    _copies: dict[str, _Copy] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def check_buckets(self, outputs: Iterable[str]) -> None:
        """Each output bucket once (HeadBucket): a missing one, or one these credentials may not use,
        ends the chunk at once with 66 naming it, before any model is loaded or item read."""
        seen: set[str] = set()
        for text in outputs:
            if is_s3(text) and (url := url_of(text)).bucket not in seen:
                seen.add(url.bucket)
                self.store.check_bucket(url)

    def read(self, text: str, cap: int) -> bytes:
        return self.store.read_input(url_of(text), cap)

    def probe(self, text: str) -> Existing | None:
        return self.store.probe(url_of(text))

    def commit(
        self, text: str, data: bytes, item: str, attempt: int, overwrite: bool,
        before: Callable[[Digest], None] | None,
    ) -> Digest:  # fmt: skip
        return self.store.commit(url_of(text), data, self.job, item, attempt, overwrite, before=before).digest

    @contextlib.contextmanager
    def seekable(self, text: str) -> Iterator[Path]:
        """A video object as a file on the tmpfs (ffmpeg seeks), one copy shared by the chunk's segments
        of that video while any of them runs; at most what the tmpfs has free, less a margin."""
        with self._lock:
            entry = self._copies.setdefault(text, _Copy())
            entry.users += 1
        try:
            with entry.lock:
                if entry.path is None:
                    cap = max(0, shutil.disk_usage(self.tmp).free - TMPFS_MARGIN)
                    ctx = self.store.fetch_seekable(url_of(text), self.tmp, cap)
                    entry.path, entry.close = ctx.__enter__(), lambda: ctx.__exit__(None, None, None)
            yield entry.path
        finally:
            with self._lock:
                entry.users -= 1
                last = entry.users == 0
                if last:
                    del self._copies[text]
            if last and entry.close is not None:
                entry.close()


def connect(root: DataRoot, storage: StorageAccess | None, urls: list[str], job: str) -> Objects | None:
    """One client for the attempt when the manifest names any object (None otherwise)."""
    if not urls:
        return None
    if storage is None:  # the manifest refuses this; a hand-made one still ends here, not in a thread
        raise BadManifest("the manifest names s3:// objects but has no storage block")
    from .s3io import S3Config, Store  # boto3: only for chunks that use the store

    config = S3Config(endpoint_url=storage.endpoint_url, region=storage.region, addressing=storage.addressing,
                      conditional_complete=storage.conditional_complete)  # fmt: skip
    return Objects(Store.connect(config, credentials_path(storage, root.secrets)), job)


def read_photo(root: DataRoot, objects: Objects | None, path: str, limits: Limits) -> media.Decoded:
    """A source, reference or identity photo from the data root or the store; ItemError for the photo's
    own problems, Temporary when the volume or the store is unavailable."""
    if is_s3(path):
        if objects is None:
            raise MissingInput(f"{path}: the store is not configured for this job")
        return media.decode_image(objects.read(path, limits.max_file_bytes), limits)
    try:
        with root.fd() as root_fd:
            return media.read_target(root_fd, path, limits)
    except OSError as e:
        if is_volume_error(e):
            raise Temporary(f"{user_path(path)}: {e.strerror or e}") from e
        raise ItemError(e.strerror or str(e)) from e
