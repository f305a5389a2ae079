"""What can go wrong with object storage, as the rest of ffswarm sees it (docs/storage.md#failures).

Three kinds, kept apart as docs/failures.md keeps them: the user's (wrong credentials, no permission,
a missing bucket: exit 66, never retried), the infrastructure's (throttling, 5xx, no connection:
exit 75, retried) and one item's (a missing object: the caller turns it into that item's error).
Every message names the bucket and key; none holds a credential or text the server sent.
"""

from __future__ import annotations

from controller.errors import FfswarmError, MissingInputError
from controller.storage.url import S3Url


class StorageAccessError(MissingInputError):
    """Wrong credentials, no permission, a missing bucket, a wrong region: the user's to fix (exit 66)."""

    def __init__(self, url: S3Url | str, reason: str) -> None:
        self.url = str(url)
        self.reason = reason
        super().__init__(f"{url}: {reason}")


class StorageTemporaryError(FfswarmError):
    """Throttling, a 5xx answer, a timeout or no connection, after the client's own retries (exit 75)."""

    exit_code = 75

    def __init__(self, url: S3Url | str, reason: str) -> None:
        self.url = str(url)
        self.reason = reason
        super().__init__(f"{url}: {reason} (temporary: try again later)")


class ObjectMissing(MissingInputError):
    """One object does not exist (its bucket does): an item error, not the job's (exit 66 if uncaught)."""

    def __init__(self, url: S3Url) -> None:
        self.url = url
        super().__init__(f"{url}: no such object")

    @property
    def item_reason(self) -> str:
        """The text an item's result carries."""
        return f"input {self.url} does not exist"


class TooManyObjects(FfswarmError):
    """A glob lists more objects than the policy lets a job have (exit 65, like a job over its limits)."""

    exit_code = 65

    def __init__(self, url: S3Url, reason: str) -> None:
        self.url = url
        super().__init__(f"{url}: {reason}")
