"""``s3://`` URLs in job files: contract/s3.py's S3Url, with refusals as job-file errors naming the field."""

from __future__ import annotations

from contract.s3 import S3Url
from controller.settings.fields import FieldError

__all__ = ["S3Url", "parse_url"]


def parse_url(text: object, field: str | None = None) -> S3Url:
    """``s3://bucket/key`` (or a key glob) → S3Url; a refusal is a FieldError naming ``field``."""
    try:
        return S3Url.parse(text)
    except ValueError as e:
        raise FieldError(field, str(e)) from None
