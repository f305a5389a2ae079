"""The contract's own refusals: what a side reads back does not satisfy the contract.

Plain exceptions (the contract knows no exit codes of its own processes): the runner turns a
ManifestError into exit 65 and a PackError into exit 66 (contract/exits.py); the controller turns
them into its own errors, naming the job file.
"""

from __future__ import annotations


class ManifestError(ValueError):
    """A manifest or identity request is malformed or of an unknown schema version (runner exit 65)."""


class PackError(Exception):
    """The model pack is missing, unreadable, lacks a role or has a wrong checksum (runner exit 66).
    The message names the pack folder and the file, as the caller asked them to be shown."""


class RecordError(ValueError):
    """An attempt record (contract/attempt.py) is malformed, of an unknown schema, or holds absurd values.
    The message names the field, never the value read: the file is the runner's, untrusted."""
