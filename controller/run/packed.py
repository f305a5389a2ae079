"""A packed job read through its pack: the results of a job that `serve` ran inside a pack.

A packed job's run folder has a ``packed`` file naming its pack (``runs/pack-<id>/``), whose
``members.json`` maps each of the pack's items to its job's own item. The fold reads a packed job's
results here, from the pack's results files, under the job's own item ids, so that status, events,
report and results.zip see the job as if it had run alone, while the pack runs and after it.

The pack's files are on the shared volume and read as hostile: bounded, never through a link. A
job sees a pack item only when its own entry of ``members.json`` names it for one of its own items
and the pack planned that item as exactly this job's work (the same input and output); anything
else in the record is ignored, so a job never sees another job's items.
"""

from __future__ import annotations

import dataclasses
import json
from collections import Counter, defaultdict
from typing import Any

from contract.results import ChunkResults, ItemResult, merge_lines
from controller.job.plan import ID, Plan, PlannedItem
from controller.run.rundir import RunDir, RunFileError
from controller.volume import read_nofollow

MAX_MEMBERS_BYTES = 64 * 1024**2


def pack_of(rundir: RunDir) -> str | None:
    """The pack a job's run folder says it runs in (None: it runs alone)."""
    raw = read_nofollow(rundir.layout.packed, 256)
    text = raw.decode("ascii", "replace").strip() if raw else ""
    return text if text.startswith("pack-") and ID.fullmatch(text) else None


def read_members(pack: RunDir) -> dict[str, Any]:
    """A pack's members.json: job id -> {"tenant", "items": {pack item: the job's item}}."""
    raw = pack.read_file(pack.layout.members, MAX_MEMBERS_BYTES)
    try:
        data = json.loads(raw) if raw else None
    except ValueError:
        data = None
    if not isinstance(data, dict):
        raise RunFileError(f"{pack.rel(pack.layout.members)}: not a members record")
    return data


class PackView:
    """A pack's plan, members record and chunks' latest results, each read once however many of its
    jobs are read through it: a pack's end reports every one of its jobs from one reading of the
    pack, not one per job. Only for a pack whose chunks have ended (nothing it holds changes)."""

    def __init__(self, pack: RunDir) -> None:
        self.pack = pack
        self._plan: Plan | None = None
        self._items: dict[str, PlannedItem] | None = None
        self._members: dict[str, Any] | None = None
        self._latest: dict[str, dict[str, ItemResult]] = {}

    def plan(self) -> Plan:
        if self._plan is None:
            self._plan = self.pack.plan()
        return self._plan

    def items(self) -> dict[str, PlannedItem]:
        if self._items is None:
            self._items = {i.id: i for i in self.plan().items}
        return self._items

    def members(self) -> dict[str, Any]:
        if self._members is None:
            self._members = read_members(self.pack)
        return self._members

    def latest(self, chunk: str) -> dict[str, ItemResult]:
        if chunk not in self._latest:
            self._latest[chunk] = self.pack.chunk_results(chunk).latest
        return self._latest[chunk]


def results(plan: Plan, rundir: RunDir, view: PackView | None = None) -> dict[str, list[ItemResult]]:
    """The job's chunk id -> what its pack recorded for that chunk's items, each line under the
    job's own item id and as attempt 0 (older than any run of the job's own). Empty for a job that
    runs alone, or whose pack's run folder is gone. ``view``: its pack as already read, when it is
    the pack the job's folder names."""
    name = pack_of(rundir)
    if name is None:
        return {}
    if view is None or view.pack.job != name:
        pack = RunDir(rundir.data_root, name)
        if not pack.exists():
            return {}
        view = PackView(pack)
    mine = _own(view.members().get(rundir.job), plan, view.items())
    chunk_of = {i: c.id for c in plan.chunks for i in c.items}
    out: dict[str, list[ItemResult]] = defaultdict(list)
    for chunk in view.plan().chunks:  # only the pack's chunks that hold items of this job are read
        items = [i for i in chunk.items if i in mine]
        latest = view.latest(chunk.id) if items else {}
        for pack_item in items:
            r = latest.get(pack_item)
            if r is not None:
                own = mine[pack_item]
                out[chunk_of[own]].append(dataclasses.replace(r, item=own, attempt=0))
    return dict(out)


def own_items(entry: object, plan: Plan, pack_plan: Plan) -> dict[str, str]:
    """Pack item -> the job's item, from the job's entry of members.json: only pairs naming an item
    of the pack and an item of the job that the pack planned as the same work (input and output),
    each item used once."""
    return _own(entry, plan, {i.id: i for i in pack_plan.items})


def _own(entry: object, plan: Plan, theirs: dict[str, PlannedItem]) -> dict[str, str]:
    items = entry.get("items") if isinstance(entry, dict) else None
    if not isinstance(items, dict):
        return {}
    ours = {i.id: i for i in plan.items}
    pairs = [(p, o) for p, o in items.items() if isinstance(o, str) and o in ours and p in theirs]
    used = Counter(o for _, o in pairs)
    return {
        p: o
        for p, o in pairs
        if used[o] == 1 and (theirs[p].input, theirs[p].output) == (ours[o].input, ours[o].output)
    }


def merged(own: ChunkResults, pack: list[ItemResult]) -> ChunkResults:
    """One chunk of a packed job: its pack's lines, then any of its own (a retry run alone, or lines
    an earlier controller copied), merged by the one rule of contract/results.py (both parsed
    already: no text in between)."""
    if not pack:
        return own
    return merge_lines([*pack, *own.lines], own.dropped)
