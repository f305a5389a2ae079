"""Packing: many small jobs that arrive close together run in shared chunk services.

A platform's typical request is one selfie onto one photo. Run alone, each pays an identity step, a
chunk service, a container start and a model load for one photo, while the runner in process does
dozens of photos a second (benchmarks/RESULTS.md). `serve` therefore holds a small job for a moment
(``packing.window``) and runs it together with the others that arrived meanwhile and agree on
everything the runner loads and every rule an item follows: one *pack* job (controller/serve/packs.py),
a pairs job whose every target keeps its own job's person, output and result, while each job keeps
its own run folder, status, events, report, webhook and inbox file.

What packs together (``pack_key``): jobs of at most ``packing.max_items`` photos (no videos: their
segments are joined per job), without a reference face, whose image, model pack, providers,
processors and their settings, face selection, no_face policy, resources, placement and overwrite are
the same. A job's name, sources, targets, outputs, retries, timeout and on_complete are its own.

The packer is adaptive: a bucket opens with its first job and is launched once its window has passed
*and* `serve` has a free job slot *and* a GPU that no other pack holds; while it waits it keeps taking
jobs, so a burst makes fewer, fuller packs instead of a queue of tiny ones — up to ``pack_items``, and
no more than one chunk of ``PACK_CHUNK_ITEMS`` per GPU of the swarm: a burst's pack launched onto the
one GPU free at that moment would otherwise run all of it on that GPU while the others go idle. With
lanes (``packing.linger``) a pack holds at most ``LANE_ITEMS``: each pack is one chunk in a lane, and a
burst flows through as many warm lanes as there are GPUs instead of packs of several fresh chunk
services, each paying a cold start and exiting after its chunk.
A pack runs one chunk service per ``PACK_CHUNK_ITEMS`` photos at most, within the GPUs free for packs
(``width``): packs launched into job slots alone would queue their chunks behind one another's on
a few GPUs, every chunk paying its own container start and model load for a handful of photos.
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from contract.manifest import FaceSelection
from controller.job.keys import Pack, packed
from controller.job.spec import JobSpec
from controller.run.jobs import PreparedJob
from controller.settings.packing import PackingSettings

# What the runner loads and how it treats every item: members of one pack agree on all of it. Every other
# key of a job file is its own or does not reach a photo's manifest. Each key says which it is beside its
# field (controller/job/spec.py, ``pack=``), so a new key cannot be forgotten here.
SHARED_KEYS = packed(JobSpec, Pack.SHARED)
NOT_SHARED = packed(JobSpec, Pack.OWN, Pack.FIRST)


def pack_key(job: PreparedJob, settings: PackingSettings, default_image: str) -> str | None:
    """What a job must share with the others of its pack (a digest), or None: it runs alone."""
    spec = job.spec
    if not settings.on or job.resolved is None or job.plan.videos or len(job.plan.items) > settings.max_items:
        return None
    if not job.plan.items or spec.reference is not None or spec.faces is FaceSelection.REFERENCE:
        return None
    if job.resolved.uses_s3:  # runs alone: a pack writes its members' reports without presigned links
        return None
    # The tenant first: a pack's chunk services, and a lane's runner, never see two tenants' photos.
    # image: the one the job runs (the config's when the job names none)
    same = (job.tenant, *(spec.image or default_image if k == "image" else getattr(spec, k) for k in SHARED_KEYS))
    return hashlib.sha256(repr(same).encode()).hexdigest()


WAITING_PACKS = 2  # packs' worth of jobs held waiting in the packer at most (room)
PACK_CHUNK_ITEMS = 50  # a pack's photos per chunk service before a second one pays for its own cold start
LANE_ITEMS = 2 * PACK_CHUNK_ITEMS  # photos of a pack that runs as one chunk when lanes are on (width)


def width(items: int, gpus: int, free: int | None, max_concurrent: int, lanes: bool = False) -> int:
    """How many chunk services a pack of ``items`` photos runs at once: one per PACK_CHUNK_ITEMS, no
    more than the ``free`` GPUs no other pack holds (None: unknown, then max_concurrent alone) allow.
    With ``lanes`` (packing.linger) a pack of at most LANE_ITEMS runs as one chunk, in a lane: on models
    a lane has loaded, it beats two chunks of half as many photos that each pay a cold start."""
    if lanes and items <= LANE_ITEMS:
        return 1
    n = min(max(1, -(-items // PACK_CHUNK_ITEMS)), max(1, max_concurrent))
    if gpus > 0 and free is not None:
        n = min(n, max(1, free // gpus))
    return n


@dataclass(frozen=True)
class Member:
    """One job waiting in (or run by) a pack: its claimed inbox file, its prepared job, its tenant."""

    claimed: Path
    job: PreparedJob
    tenant: str | None


@dataclass
class _Bucket:
    key: str
    opened: float
    members: list[Member] = field(default_factory=list)
    items: int = 0


class Packer:
    """Buckets of waiting members by key, thread-safe (job threads offer, the serve loop launches)."""

    def __init__(
        self,
        settings: PackingSettings,
        default_image: str,
        *,
        clock: Any = time.monotonic,
        gpus: Callable[[], int | None] | None = None,
    ) -> None:
        """``gpus``: the GPUs the swarm advertises (None, or unknown: ``pack_items`` alone bounds a pack)."""
        self.settings = settings
        self.default_image = default_image
        self.clock = clock
        self.gpus = gpus
        self._lock = threading.Lock()
        self._open: dict[str, _Bucket] = {}  # still taking members
        self._full: list[_Bucket] = []  # reached their limit (_limit): waiting for a slot, taking no more

    def offer(self, member: Member) -> bool:
        """Take the member into its bucket (True), or say it runs alone (False)."""
        key = pack_key(member.job, self.settings, self.default_image)
        if key is None:
            return False
        n = len(member.job.plan.items)
        limit = self._limit(member.job.spec.resources.gpus)
        with self._lock:
            bucket = self._open.get(key)
            if bucket is not None and bucket.items + n > limit:
                self._full.append(self._open.pop(key))
                bucket = None
            if bucket is None:
                bucket = self._open[key] = _Bucket(key, self.clock())
            bucket.members.append(member)
            bucket.items += n
        return True

    def _limit(self, gpus: int) -> int:
        """A bucket's photos at most: pack_items, and one chunk of PACK_CHUNK_ITEMS per GPU slot; with
        lanes one lane's chunk (LANE_ITEMS)."""
        if self.settings.linger > 0:
            return min(self.settings.pack_items, LANE_ITEMS)
        total = self.gpus() if self.gpus is not None and gpus > 0 else None
        if not total:
            return self.settings.pack_items
        return min(self.settings.pack_items, PACK_CHUNK_ITEMS * max(1, total // gpus))

    def due(self, slots: int, free_gpus: int | None = None, gpus_only: bool = False) -> list[list[Member]]:
        """At most ``slots`` packs to launch now: full buckets first, then those whose window passed;
        with ``free_gpus`` (the GPUs no pack holds), only packs whose chunk fits in what is left;
        ``gpus_only``: only packs that reserve GPUs."""
        out: list[list[Member]] = []
        left = free_gpus

        def fits(bucket: _Bucket) -> bool:
            nonlocal left
            gpus = bucket.members[0].job.spec.resources.gpus
            if gpus == 0:
                return not gpus_only
            if left is None:
                return True
            if gpus > left:
                return False
            left -= gpus
            return True

        with self._lock:
            for bucket in list(self._full):
                if len(out) < slots and fits(bucket):
                    self._full.remove(bucket)
                    out.append(bucket.members)
            now = self.clock()
            for key, bucket in sorted(self._open.items(), key=lambda kv: kv[1].opened):
                if len(out) >= slots:
                    break
                if now - bucket.opened >= self.settings.window and fits(bucket):
                    out.append(self._open.pop(key).members)
        return out

    def held(self) -> list[Path]:
        """Every waiting member's claimed inbox file (their leases are renewed by `serve`)."""
        with self._lock:
            buckets = [*self._full, *self._open.values()]
            return [m.claimed for b in buckets for m in b.members]

    def room(self) -> int:
        """How many more jobs are worth taking from the inbox: two full packs' worth (the next pack and
        the one after) less those waiting. A file left in the inbox costs nothing; a claimed one has its
        lease renewed every heartbeat until its pack ends."""
        return WAITING_PACKS * self._limit(1) - self.waiting()

    def waiting(self) -> int:
        with self._lock:
            return sum(len(b.members) for b in [*self._full, *self._open.values()])
