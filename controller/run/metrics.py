"""Prometheus metrics for the people watching a cluster, fed by the supervisor's chunk events.

The supervisor already tells its story as events (chunk_started, chunk_running, chunk_done,
chunk_retry, chunk_failed, job_started, job_finished); metrics are a listener on that story, so
they can never disagree with the run folder's report. Item counts and per-item seconds are read
from the chunk's results file when the chunk ends (the runner's own timings). `prometheus_client`
does the exposition: over HTTP under `ffswarm serve`, as a node_exporter textfile under `submit`.
Each Metrics owns its registry (no process-global state), so tests and concurrent jobs stay apart.

Usage by tenant (what a platform bills by) comes from report.json's ``usage`` (controller/run/usage.py)
when a job finishes: what the report adds since the report the run started with, so a resumed job's
earlier runs are not counted twice and the counters' increases add up to the reports. The tenant is
the run folder's ``owner`` (`serve` writes it before this sink is made; a tenant's pack's with its
folder), as webhooks read it (controller/run/hooks.py job_tenant); a CLI job's is "".
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server, write_to_textfile

from controller import log
from controller.run import usage
from controller.run.fold import committed
from controller.run.hooks import job_tenant
from controller.run.rundir import RunDir

ITEM_SECONDS_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)


@dataclass
class _JobState:
    """What one running job contributes to the gauges."""

    queued: int = 0
    started: set[str] = field(default_factory=set)  # chunks with a live service
    on_gpu: set[str] = field(default_factory=set)  # chunks whose task runs (holds its GPU slots)
    gpus_per_chunk: int = 1


class Metrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self._lock = threading.Lock()
        self._jobs: dict[int, _JobState] = {}  # by sink: two runs never share a state
        r = self.registry
        self.items_done = Counter("ffswarm_items_done", "Items finished ok or without a face (no_face)", registry=r)
        self.items_failed = Counter(
            "ffswarm_items_failed", "Items that failed (their own error or their chunk's)", registry=r
        )
        self.attempts = Counter(
            "ffswarm_chunk_attempts",
            "Chunk attempts that ended, by outcome (done, retry, failed) and failure class",
            ["outcome", "failure_class"],
            registry=r,
        )
        self.item_seconds = Histogram(
            "ffswarm_item_seconds", "Seconds the runner spent on one item", buckets=ITEM_SECONDS_BUCKETS, registry=r
        )
        self.jobs_finished = Counter("ffswarm_jobs_finished", "Jobs that wrote their report", ["result"], registry=r)
        self.tenant_gpu_seconds = Counter(
            "ffswarm_tenant_gpu_seconds",
            "GPU-seconds of finished jobs' chunk attempts (runner wall seconds x GPUs reserved), by tenant",
            ["tenant"],
            registry=r,
        )
        self.tenant_items = Counter(
            "ffswarm_tenant_items",
            "Items of finished jobs by tenant and status (ok, no_face: newly done; failed: failed in that run)",
            ["tenant", "status"],
            registry=r,
        )
        Gauge("ffswarm_jobs_running", "Jobs being supervised", registry=r).set_function(self._count_jobs)
        Gauge("ffswarm_chunks_queued", "Chunks waiting for a window slot or a retry", registry=r).set_function(
            lambda: self._sum(lambda j: j.queued)
        )
        Gauge("ffswarm_chunks_running", "Chunks with a live service", registry=r).set_function(
            lambda: self._sum(lambda j: len(j.started))
        )
        Gauge("ffswarm_gpu_slots_in_use", "GPUs reserved by running chunk tasks", registry=r).set_function(
            lambda: self._sum(lambda j: len(j.on_gpu) * j.gpus_per_chunk)
        )

    def _count_jobs(self) -> float:
        with self._lock:
            return float(len(self._jobs))

    def _sum(self, part: Any) -> float:
        with self._lock:
            return float(sum(part(j) for j in self._jobs.values()))

    def sink(self, rundir: RunDir, gpus_per_chunk: int = 1) -> JobSink:
        """The on_event callable for one job (jobs.supervise forwards every event to it)."""
        return JobSink(self, rundir, gpus_per_chunk)

    def textfile_sink(self, rundir: RunDir, gpus_per_chunk: int, path: Path) -> TextfileSink:
        """The on_event callable for one job of `submit --metrics-textfile`."""
        return TextfileSink(self, self.sink(rundir, gpus_per_chunk), path)

    def write_textfile(self, path: Path) -> None:
        """node_exporter's textfile collector reads *.prom; prometheus_client writes it atomically."""
        write_to_textfile(str(path), self.registry)

    def serve_http(self, port: int, addr: str = "127.0.0.1") -> Any:
        """Start the /metrics endpoint in a daemon thread; returns the server (call .shutdown())."""
        server, _thread = start_http_server(port, addr=addr, registry=self.registry)
        return server


class JobSink:
    """Turns one job's supervisor events into metric updates."""

    def __init__(self, metrics: Metrics, rundir: RunDir, gpus_per_chunk: int) -> None:
        self.m = metrics
        self.rundir = rundir
        self.state = _JobState(gpus_per_chunk=gpus_per_chunk)
        self.tenant = ""
        self.before: dict[str, Any] = usage.zero()  # the usage of the report this run started with

    def __call__(self, event: str, **fields: Any) -> None:
        chunk = str(fields.get("chunk", ""))
        with self.m._lock:
            jobs, st = self.m._jobs, self.state
            if event == "job_started":
                st.queued = int(fields.get("pending", 0))
                jobs[id(self)] = st
            elif event in ("chunk_started", "chunk_adopted"):
                st.queued = max(0, st.queued - 1)
                st.started.add(chunk)
            elif event == "chunk_running":
                st.on_gpu.add(chunk)
            elif event in ("chunk_done", "chunk_retry", "chunk_failed"):
                st.started.discard(chunk)
                st.on_gpu.discard(chunk)
                st.queued += event == "chunk_retry"
            elif event == "job_cancelled":
                st.queued = 0
                st.started.clear()
                st.on_gpu.clear()
            elif event == "job_finished":
                jobs.pop(id(self), None)
        if event == "chunk_done":
            self._count_items(chunk, int(fields.get("attempt", 0)))
            self.m.attempts.labels("done", "none").inc()
        elif event == "chunk_retry":
            self.m.attempts.labels("retry", str(fields.get("failure", "unknown"))).inc()
        elif event == "chunk_failed":
            self._count_items(chunk, int(fields.get("attempt", 0)))
            self.m.attempts.labels("failed", str(fields.get("failure", "unknown"))).inc()
        elif event == "job_finished":
            failed = int(fields.get("failed", 0)) or int(fields.get("chunks_failed", 0))
            self.m.jobs_finished.labels("failed_items" if failed else "ok").inc()
            self._count_usage()
        if event == "job_started":
            self._start_usage()

    def _start_usage(self) -> None:
        self.tenant = job_tenant(self.rundir.data_root, self.rundir.job) or ""
        self.before = usage.of_rundir(self.rundir) or usage.zero()

    def _count_usage(self) -> None:
        """What this run's report adds to the report it started with (never negative)."""
        now = usage.of_rundir(self.rundir)
        if now is None:
            return
        before, tenant = self.before, self.tenant
        self.m.tenant_gpu_seconds.labels(tenant).inc(max(0.0, now["gpu_seconds"] - before["gpu_seconds"]))
        for status in ("ok", "no_face"):
            self.m.tenant_items.labels(tenant, status).inc(max(0, now["items"][status] - before["items"][status]))
        self.m.tenant_items.labels(tenant, "failed").inc(now["items"]["failed"])
        self.before = now

    def _count_items(self, chunk: str, attempt: int) -> None:
        """A chunk that ended: its items' latest results; an item without one failed with its chunk."""
        latest = self.rundir.latest_results(chunk)
        try:
            items = next(c.items for c in self.rundir.plan().chunks if c.id == chunk)
        except (StopIteration, OSError, ValueError):
            items = tuple(latest)
        for item in items:
            r = latest.get(item)
            if not committed(r):  # the one rule (controller/run/fold.py), as report.json counts it
                self.m.items_failed.inc()
            else:
                self.m.items_done.inc()
            if r is not None and not r.cached and r.attempt == attempt and r.finished >= r.started > 0:
                self.m.item_seconds.observe(r.finished - r.started)


class TextfileSink:
    """A job's events into the metrics, the textfile rewritten after each (`submit
    --metrics-textfile`): the same events and GPU count the endpoint of `serve` gets. A file that
    cannot be written is logged and the job goes on: metrics never stop a job."""

    def __init__(self, metrics: Metrics, sink: JobSink, path: Path) -> None:
        self.metrics, self.sink, self.path = metrics, sink, path

    def __call__(self, event: str, **fields: Any) -> None:
        self.sink(event, **fields)
        try:
            self.metrics.write_textfile(self.path)
        except OSError as e:
            log.get(job=self.sink.rundir.job).warning("metrics_textfile_not_written", file=str(self.path), error=str(e))
