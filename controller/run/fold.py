"""One fold of a run folder: the plan, every chunk's latest result lines (a packed job's read through
its pack) and the video joins, into what each item's state is. The report, `status`, the pending
chunks of a resume or a render, and the progress counts all ask it, so "which items are done, which
are pending" is answered in one place.

An item is *committed* when its latest result is ok or no_face (a re-run skips it); anything else —
no result yet, or an error — is still to do, and a chunk holding such an item is pending.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field

from contract.results import ItemResult, ItemStatus
from controller.job.plan import Plan, PlannedVideo
from controller.run import packed
from controller.run.join import joins
from controller.run.rundir import RunDir


def committed(result: ItemResult | None) -> bool:
    """The one rule for "done": a result that is not a failure (ok, or no_face per policy)."""
    return result is not None and not result.status.is_failure()


@dataclass(frozen=True)
class Fold:
    plan: Plan
    results: Mapping[str, ItemResult]  # item id (image or segment) -> its latest result
    joined: Mapping[str, ItemResult]  # video id -> its latest join
    dropped: Mapping[str, int] = field(default_factory=dict)  # chunk id -> result lines that did not parse

    @classmethod
    def read(cls, plan: Plan, rundir: RunDir, pack: packed.PackView | None = None) -> Fold:
        """The job's results; a packed job's read through its pack (controller/run/packed.py),
        ``pack`` when it has already been read for its other jobs."""
        results: dict[str, ItemResult] = {}
        dropped: dict[str, int] = {}
        through = packed.results(plan, rundir, pack)
        for chunk in plan.chunks:
            merged = packed.merged(rundir.chunk_results(chunk.id), through.get(chunk.id, []))
            results.update((i, merged.latest[i]) for i in chunk.items if i in merged.latest)
            if merged.dropped:
                dropped[chunk.id] = merged.dropped
        return cls(plan, results, joins(rundir), dropped)

    def result(self, item: str) -> ItemResult | None:
        return self.results.get(item)

    def committed(self, item: str) -> bool:
        return committed(self.results.get(item))

    def pending_chunks(self) -> list[str]:
        """Chunks with an item not committed yet: what a resume, a retry or a render runs again."""
        return [c.id for c in self.plan.chunks if not all(self.committed(i) for i in c.items)]

    def video_status(self, video: PlannedVideo) -> ItemStatus | None:
        """A video's status as the user sees it: error when it could not be planned, else its join's
        (None: not joined yet)."""
        if video.error is not None:
            return ItemStatus.ERROR
        join = self.joined.get(video.id)
        return join.status if join is not None else None

    def user_counts(self) -> Counter[str]:
        """What the user submitted, by status: images by their latest result, videos once joined
        (or refused at planning); items not ended are not counted."""
        counts: Counter[str] = Counter()
        for item in self.plan.items:
            r = self.results.get(item.id)
            if item.kind != "segment" and r is not None:
                counts[r.status.value] += 1
        for video in self.plan.videos:
            status = self.video_status(video)
            if status is not None:
                counts[status.value] += 1
        return counts

    def user_total(self) -> int:
        return sum(1 for i in self.plan.items if i.kind != "segment") + len(self.plan.videos)

    def segments(self) -> tuple[int, int]:
        """(video segments planned, segments with a result)."""
        ids = [i.id for i in self.plan.items if i.kind == "segment"]
        return len(ids), sum(1 for i in ids if i in self.results)

    def span(self) -> tuple[float, float]:
        """(first start, last finish) over every result: how fast the work goes, for an ETA."""
        rs = list(self.results.values())
        if not rs:
            return 0.0, 0.0
        return min(r.started for r in rs), max(r.finished for r in rs)
