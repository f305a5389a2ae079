"""How the supervisor starts a chunk attempt: one seam, whatever runs it.

The supervisor (controller/run/supervisor.py) starts every attempt through a `Launcher` and watches
every attempt the same way, by its service's tasks (listed under the job label the launcher names)
and its attempt record; the launcher only starts the attempt and lets go of its service once the
supervisor has judged it. Two launchers exist: `FreshLauncher`, a one-shot service of the chunk's
own, and a hand-off to an idle lane (a chunk service whose runner waits for the next chunk: with
``runners.linger`` a `submit`'s, a job's own or `serve`'s, with ``packing.linger`` `serve`'s too;
controller/run/lanes.py), which falls back to a fresh service when no lane can take the chunk.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from controller.run.rundir import RunDir
from controller.swarm.backend import SwarmBackend
from controller.swarm.servicespec import RunnerSettings, chunk_service


@dataclass(frozen=True)
class Launched:
    """A started attempt: the service it runs in and the job label that service is listed under.
    ``lane``: the service is a lane, which outlives the attempt: the attempt ends when its record
    says so, and a lane that fails the attempt is dropped and the chunk run again in a fresh service
    of its own, not counted against the job's retries."""

    service: str
    label: str
    lane: bool = False


class Launcher(Protocol):
    """Starts chunk attempts and lets go of their services once the supervisor has judged them."""

    def start(self, chunk: str, attempt: int, avoid: tuple[str, ...]) -> Launched:
        """Start ``attempt`` of ``chunk`` (its results file already made); ``avoid``: placement
        constraints keeping it off nodes where it failed. EngineUnavailable: nothing may have started."""
        ...

    def release(self, launched: Launched, reusable: bool) -> None:
        """The attempt has ended (``reusable``: its runner finished the chunk and may take another)
        or was given up: its service is removed, or a lane's kept for the next chunk."""
        ...

    def close(self) -> None:
        """The job's run has ended: lanes it owns are retired (their runners told to stop, their
        services removed)."""
        ...


# A job's launcher, made once its run folder and runner settings are known (None: fresh services)
LaunchFactory = Callable[[SwarmBackend, RunDir, RunnerSettings], Launcher]


@dataclass
class FreshLauncher:
    """Each attempt in a one-shot service of its own, removed once the attempt has ended. ``room``:
    called with the service's GPUs before it is made (Lanes.make_room: an idle lane that holds a GPU
    it needs is retired, so it does not sit pending behind runners waiting for other chunks)."""

    backend: SwarmBackend
    settings: RunnerSettings
    room: Callable[[int], None] | None = None

    def start(self, chunk: str, attempt: int, avoid: tuple[str, ...]) -> Launched:
        if self.room is not None:
            self.room(self.settings.gpus)
        spec = chunk_service(self.settings, chunk, attempt, avoid)
        self.backend.create_service(spec)
        return Launched(spec.name, self.settings.job)

    def release(self, launched: Launched, reusable: bool) -> None:
        self.backend.remove_service(launched.service)

    def close(self) -> None:
        pass
