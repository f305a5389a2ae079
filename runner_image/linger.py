"""A lingering runner (``packing.linger``, contract/handoff.py): after its chunk, the chunks the
controller hands it over, each run as a fresh service would run it, on the models already loaded.

It waits on the hand-off file its first manifest names, at most ``linger`` seconds after each chunk.
The file is read as hostile would be (no link followed, bounded, every field checked); a file that is
missing, half-written or not a hand-off is read again until the wait ends. A chunk that ends the
attempt for another reason than its items (a bad manifest, the volume gone) ends the runner too: the
controller then runs that chunk again in a service of its own.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

from contract.errors import ManifestError
from contract.exits import RunnerExit
from contract.handoff import MAX_HANDOFF_BYTES, Handoff
from contract.manifest import Manifest
from contract.results import read_regular

from . import safefs
from .volume import DataRoot

POLL = 0.05  # seconds between reads of the hand-off file
GOING_ON = (RunnerExit.OK, RunnerExit.ITEMS_FAILED)  # a chunk that ended so: wait for the next one


def read_handoff(root: DataRoot, path: str) -> Handoff | None:
    try:
        local = root.path(path)
        dfd = os.open(local.parent, safefs.DIR_FLAGS)
    except (OSError, ValueError):
        return None
    try:
        got = read_regular(dfd, local.name, MAX_HANDOFF_BYTES)
    finally:
        os.close(dfd)
    if got is None or got[1]:  # not a regular file, or longer than a hand-off can be
        return None
    try:
        return Handoff.from_json(got[0].decode("utf-8"))
    except (ManifestError, UnicodeDecodeError):
        return None


def next_chunk(
    root: DataRoot,
    manifest: Manifest,
    seen: int,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> Handoff | None:
    """The next hand-off after ``seen`` within ``manifest.linger`` seconds; None when none came (or
    the controller said stop)."""
    if manifest.linger <= 0 or manifest.handoff is None:
        return None
    deadline = clock() + manifest.linger
    while clock() < deadline:
        handoff = read_handoff(root, manifest.handoff)
        if handoff is not None and handoff.seq > seen:
            return None if handoff.stop else handoff
        sleep(POLL)
    return None


def run_lingering(
    root: DataRoot, first: Manifest, run_chunk: Callable[[str, int], int], code: int, logger: object = None
) -> int:
    """After the first chunk ended with ``code``: each handed-over chunk in turn, until none comes;
    the exit code of the last one run."""
    seen = 0
    while code in GOING_ON:
        handoff = next_chunk(root, first, seen)
        if handoff is None or handoff.manifest is None:
            break
        seen = handoff.seq
        code = run_chunk(handoff.manifest, handoff.attempt)
    return code
