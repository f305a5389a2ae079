"""A job's chunks as its items ended, when the job ends without its own watch (controller/run/chunks.py
``ended_runs``: a job given up on, a job whose pack ended)."""

from __future__ import annotations

from controller.run.chunks import ended_runs
from controller.run.failures import ChunkState

CHUNKS = [("c0000", ["i0", "i1"]), ("c0001", ["i2"]), ("c0002", ["i3", "i4"])]
WITH_RESULT = {"i0", "i1", "i3"}


def test_a_chunk_is_done_only_when_every_item_has_a_result_and_the_others_fail_naming_their_items() -> None:
    runs = ended_runs(CHUNKS, WITH_RESULT.__contains__, False, lambda missing: f"lost {sorted(missing)}")
    assert {cid: run.state for cid, run in runs.items()} == {
        "c0000": ChunkState.DONE,
        "c0001": ChunkState.FAILED,
        "c0002": ChunkState.FAILED,
    }
    assert runs["c0001"].reason == "lost ['i2']" and runs["c0002"].reason == "lost ['i4']"
    assert runs["c0000"].reason is None


def test_a_cancelled_jobs_unfinished_chunks_are_cancelled_not_failed() -> None:
    runs = ended_runs(CHUNKS, WITH_RESULT.__contains__, True, lambda missing: "never asked")
    assert [run.state for run in runs.values()] == [ChunkState.DONE, ChunkState.CANCELLED, ChunkState.CANCELLED]
    assert all(run.reason is None for run in runs.values())
