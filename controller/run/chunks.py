"""What the supervisor keeps of each chunk: its attempts, its state, where it must not run again;
and the policy it is watched and retried by. state.json is these records (ChunkRun.as_dict).

Each attempt writes its own results file (``results/<chunk>.a<n>.jsonl``), which the controller
creates before the attempt's service (``create_results_file``): a file that exists before any node
looks it up cannot be hidden by NFS lookup caching, and it is the runner's to append to.
"""

from __future__ import annotations

import contextlib
import os
import random
import stat
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from contract.layout import RunLayout, parse_results_name, results_name
from contract.results import read_results
from controller.run.failures import ChunkState, FailureClass
from controller.swarm.backend import NodeState
from controller.volume import UnsafePath, Volume

EventSink = Callable[..., None]


class Share(Protocol):
    """A job's seat in a GPU share book (under `serve`: controller/serve/shares.py): how many chunks
    it may have running now, given what it asked for, wants and has. The use case only asks it."""

    def limit(self, asked: int, want: int, running: int) -> int: ...
    def freed(self) -> int: ...  # a count that moves whenever a job of the book gives GPUs back


@dataclass
class Attempt:
    attempt: int
    service: str
    started: float  # controller clock when the service was created (or adopted)
    running_since: float | None = None
    node: str | None = None
    exit_code: int | None = None
    outcome: str = "running"  # done | failed class name | running
    reason: str | None = None
    results_read: int = 0  # bytes of this attempt's results file already read (read_results)
    items_recorded: set[str] = field(default_factory=set)  # items with a result line of this attempt
    outage: bool = False  # the engine went away while it ran: an infrastructure ending is the engine's
    label: str = ""  # the job label its service is listed under ("" the job's own; a lane's its own)
    lane: bool = False  # it runs in a lane (controller/run/launch.py Launched)

    def read_results(self, path: Path) -> int:
        """How many items this attempt has recorded a result for, reading only what was appended to
        its results file (``path``: results/<chunk>.a<n>.jsonl) since the last call (a line still
        being written is read next time). Opened without following a symlink or blocking on a FIFO."""
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError:
            return len(self.items_recorded)
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                return len(self.items_recorded)
            new = os.pread(fd, RESULTS_READ_MAX, self.results_read)
        except OSError:
            return len(self.items_recorded)
        finally:
            os.close(fd)
        complete = new[: new.rfind(b"\n") + 1]
        self.results_read += len(complete)
        self.items_recorded.update(
            r.item for r in read_results(complete.decode("utf-8", "replace")) if r.attempt == self.attempt
        )
        return len(self.items_recorded)


RESULTS_READ_MAX = 64 * 1024**2  # read per call; the rest is read next time


def create_results_file(layout: RunLayout[Path], chunk: str, attempt: int, owner: tuple[int, int] | None) -> None:
    """The attempt's empty results file, made before its service: mode 0640, owned by the runner's
    ``owner`` (uid, gid) when the controller is root, created O_EXCL and reached from the data root
    without following a symlink (controller/volume.py); one that is already there (a controller
    stopped between this and the service) is kept only if it is a regular file with one link, and
    is never chowned. OSError otherwise (the caller fails the attempt's start)."""
    name = results_name(chunk, attempt)
    if parse_results_name(name) != (chunk, attempt):
        raise ValueError(f"not a chunk id: {chunk!r}")
    vol, path = Volume(layout.dir.parent.parent), layout.results(chunk, attempt)
    try:
        try:
            fd = vol.create_exclusive(path, owner if os.geteuid() == 0 else None, 0o640)
        except FileExistsError:
            fd = vol.open(path, os.O_RDONLY | os.O_NONBLOCK)
            try:
                st = os.fstat(fd)
            finally:
                os.close(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1:
                raise OSError(f"{path.name} in results/ is not a plain file") from None
            return
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        dfd = vol.open_dir(layout.results_dir)
        try:
            with contextlib.suppress(OSError):  # durability only: some filesystems refuse a folder's fsync
                os.fsync(dfd)
        finally:
            os.close(dfd)
    except UnsafePath as e:  # a symlink on the way: as refused as any other failure to make it
        raise OSError(str(e)) from None


@dataclass
class ChunkRun:
    id: str
    state: ChunkState = ChunkState.QUEUED
    attempts: list[Attempt] = field(default_factory=list)
    retries_used: int = 0
    node_losses: int = 0  # re-attempts after node loss or an engine restart: never counted against `retries`
    avoid: set[str] = field(default_factory=set)  # node ids where it failed for infrastructure reasons
    last_attempt: int = 0  # highest attempt number already used (earlier controllers included)
    not_before: float = 0.0
    failure: FailureClass | None = None
    reason: str | None = None

    @property
    def current(self) -> Attempt:
        return self.attempts[-1]

    def avoidance(self, nodes: Iterable[NodeState], needs_gpu: bool) -> tuple[str, ...]:
        """Placement constraints keeping the chunk away from nodes where it failed for infrastructure
        reasons, while another usable node that advertises GPUs (when the job reserves any) remains."""
        others = [n for n in nodes if n.usable and n.node_id not in self.avoid and (n.gpus > 0 or not needs_gpu)]
        if not self.avoid or not others:
            return ()
        return tuple(f"node.id!={n}" for n in sorted(self.avoid))

    def requeue(self, not_before: float = 0.0) -> None:
        self.state = ChunkState.QUEUED
        self.not_before = not_before

    def end_attempt(self, failure: FailureClass, reason: str, policy: Policy, now: float) -> str:
        """The current attempt failed: record why and decide what follows. Returns the event that
        says it: ``chunk_engine_lost`` (queued again at once, not counted against retries: the engine
        restarted under it), ``chunk_retry`` (queued again after a backoff) or ``chunk_failed``."""
        att = self.current
        att.outcome = failure.value
        att.reason = f"{reason}: {att.reason}" if att.reason else reason  # after the runner's own words
        infrastructure = failure is FailureClass.INFRASTRUCTURE
        if infrastructure and att.outage and self.node_losses < policy.max_node_losses:
            self.node_losses += 1  # not the chunk's fault, nor the node's
            self.requeue()
            return "chunk_engine_lost"
        if infrastructure and att.node:
            self.avoid.add(att.node)
        if failure.is_retryable() and self.retries_used < policy.retries:
            self.retries_used += 1
            delay = min(policy.backoff_max, policy.backoff_base * 2 ** (self.retries_used - 1))
            self.requeue(now + delay * random.uniform(0.5, 1.0))
            return "chunk_retry"
        self.state = ChunkState.FAILED
        self.failure = failure
        self.reason = att.reason
        return "chunk_failed"

    def drop_lane(self, failure: FailureClass, reason: str) -> str:
        """The lane the current attempt ran in failed it: queued again at once for a fresh service
        of its own, not counted against retries (the lane, not the chunk, is given up). Returns the
        event that says it: ``chunk_lane_dropped``."""
        att = self.current
        att.outcome = failure.value
        att.reason = f"{reason}: {att.reason}" if att.reason else reason
        self.requeue()
        return "chunk_lane_dropped"

    def lose_node(self, node: NodeState) -> None:
        """The current attempt's node is gone: never the chunk's fault, so its retries are not used
        (the caller fails it once it has lost more nodes than the policy allows)."""
        att = self.current
        att.outcome = FailureClass.INFRASTRUCTURE.value
        att.reason = f"node {node.hostname or node.node_id} is {node.state}"
        self.avoid.add(node.node_id)
        self.node_losses += 1

    def as_dict(self) -> dict[str, Any]:
        return {
            "state": self.state.value,
            "failure": self.failure.value if self.failure else None,
            "reason": self.reason,
            "avoid_nodes": sorted(self.avoid),
            "attempts": [
                {
                    "attempt": a.attempt,
                    "service": a.service,
                    "node": a.node,
                    "exit_code": a.exit_code,
                    "outcome": a.outcome,
                    "reason": a.reason,
                }
                for a in self.attempts
            ],
        }


def ended_runs(
    chunks: Iterable[tuple[str, Iterable[str]]],
    has_result: Callable[[str], bool],
    cancelled: bool,
    reason: Callable[[set[str]], str],
) -> dict[str, ChunkRun]:
    """The chunks (id, items) of a job ended without its own watch (given up on, or ended with its
    pack), each as its items ended: done when every item has a result; otherwise cancelled for a
    cancelled job, else failed for ``reason`` of the items without one."""
    runs: dict[str, ChunkRun] = {}
    for cid, items in chunks:
        run = runs[cid] = ChunkRun(cid)
        missing = {i for i in items if not has_result(i)}
        if not missing:
            run.state = ChunkState.DONE
        elif cancelled:
            run.state = ChunkState.CANCELLED
        else:
            run.state, run.reason = ChunkState.FAILED, reason(missing)
    return runs


@dataclass(frozen=True)
class Policy:
    """How a job's chunks are watched and retried (the job's retries and timeout, the config's
    schedule_timeout and engine_outage; the rest are the watch's own rhythms)."""

    retries: int = 3
    timeout: float = 1800.0  # per attempt, once running
    schedule_timeout: float = 300.0
    # Swarm 20.10 emits no task events, so the watch polls: the job's services and their tasks every
    # `poll` (2 API calls), the node list every `node_poll`. With Docker's event stream (the job's
    # containers starting and dying on this engine, node changes) to wake it at once, every
    # `event_poll` instead: the poll is left for what the stream cannot see — other nodes' tasks.
    # In between it reads what the runners appended to their results files every `ending_poll`:
    # once a chunk has a line for each of its items (or its container died here) it is about to
    # end, and the swarm is asked every `ending_poll` until it has, so that a finished chunk — and
    # the job — is seen finished promptly.
    poll: float = 0.5
    event_poll: float = 2.0
    node_poll: float = 1.0
    ending_poll: float = 0.05
    cleanup_wait: float = 5.0  # at the end, for containers being removed (after a cancel: stopping)
    backoff_base: float = 1.0
    backoff_max: float = 30.0
    max_node_losses: int = 10
    engine_outage: float = 120.0  # how long the watch waits for an engine that stopped answering
    share: Share | None = None  # under `serve`: the job's seat in the GPU share book (controller/serve/shares.py)
    # Warm runners (runners.linger) keep their GPUs between chunks: no more chunks at once than the
    # swarm's GPU slots (0: no cap), so a chunk beyond waits to be handed to one, not pending behind them
    gpu_slots: int = 0
    # called at the start of every round of the watch: under `serve`, a pack's look at its jobs (their
    # cancels and leases: controller/serve/packs.py)
    on_round: Callable[[], None] = lambda: None

    def freed(self) -> int | None:
        """What the share book says of GPUs given back (None outside `serve`): a job whose chunks wait
        for a share looks again as soon as it moves, not at its next round."""
        return None if self.share is None else self.share.freed()

    def limit(self, asked: int, waiting: int, running: int) -> int:
        """Chunks the job may have running now: what it asked for (`scale`), within its GPU share."""
        asked = min(asked, self.gpu_slots) if self.gpu_slots > 0 else asked
        if self.share is None:
            return asked
        return self.share.limit(asked, waiting + running, running)
