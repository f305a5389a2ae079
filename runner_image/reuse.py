"""Whether an item is already done, or must not be done: what a retry decides before any model loads.

An item whose ok/no_face line is in a results file of this chunk (any attempt) and whose output still
is what that line records (size and sha256) is only re-acknowledged (``cached``); so is one the commit
journal recorded just before the commit of an attempt killed before its result line (then recorded
for the first time). An output that exists without such a record was not written by this job: the
item fails, naming it, unless the job says ``overwrite: true``.

For an object (``s3://``) "what it is" is its metadata (s3io.py): the object is this job's commit of
this item only when it says so, with the digest the line or journal records. One HEAD per item.
"""

from __future__ import annotations

from typing import NamedTuple

from contract.manifest import Item, Manifest
from contract.results import ItemResult, ItemStatus
from contract.s3 import is_s3

from . import safefs
from .objects import Objects
from .volume import Intent


class Prior(NamedTuple):
    """An earlier commit that still stands (``result``; ``cached``: it had its result line), or an
    output this job may not replace (``refused``), or neither: the item is to be done."""

    result: ItemResult | None = None
    cached: bool = False
    refused: bool = False


def decide(
    root_fd: int,
    objects: Objects | None,
    manifest: Manifest,
    item: Item,
    line: ItemResult | None,
    intents: list[Intent],
) -> Prior:
    # The output is hashed only when a line or the journal could make it this job's commit.
    needed = (line is not None and line.output == item.output) or any(i.output == item.output for i in intents)
    exists, found = _output(root_fd, objects, manifest.job, item, needed)
    recorded = _reusable(item, line, found)
    if recorded is not None:
        return Prior(recorded, cached=True)
    journaled = _journaled(item, intents, found)
    if journaled is not None:
        return Prior(journaled)
    # A video segment's output is in the job's own run folder: always its own.
    refused = not manifest.overwrite and item.kind == "image" and exists
    return Prior(refused=refused)


def _output(
    root_fd: int, objects: Objects | None, job: str, item: Item, needed: bool
) -> tuple[bool, safefs.Digest | None]:
    """Whether anything is at the output's name, and its digest when it may be this job's commit."""
    if is_s3(item.output):
        if objects is None:
            return False, None
        there = objects.probe(item.output)
        if there is None:
            return False, None
        if there.mine(job, item.id) and there.sha256 is not None:
            return True, safefs.Digest(there.size, there.sha256)
        return True, None  # another job's, or no metadata of ours: not this job's commit
    found = safefs.digest_of(root_fd, item.output) if needed else None
    return (found is not None or safefs.exists(root_fd, item.output)), found


def _reusable(item: Item, prior: ItemResult | None, found: safefs.Digest | None) -> ItemResult | None:
    """The earlier commit of ``item`` if it still stands: a no_face without output, or an output that
    still is what the line records (size and sha256; a line of an older runner without them: a
    regular file, no symlink, at the output's name)."""
    if prior is None:
        return None
    if prior.output is None:
        return prior if prior.status is ItemStatus.NO_FACE else None
    if prior.output != item.output or found is None:
        return None
    if prior.sha256 is not None and (found.size, found.sha256) != (prior.size, prior.sha256):
        return None
    return prior


def _journaled(item: Item, intents: list[Intent], found: safefs.Digest | None) -> ItemResult | None:
    """An output an earlier attempt committed but was killed before its result line: the journal
    recorded it just before the commit, and the output is still exactly that."""
    if found is None:
        return None
    for intent in reversed([i for i in intents if i.output == item.output]):
        if (found.size, found.sha256) == (intent.size, intent.sha256):
            return ItemResult(item.id, intent.status, 0, item.input, item.output, faces=intent.faces,
                              size=intent.size, sha256=intent.sha256)  # fmt: skip
    return None
