"""The API's requests and answers as pydantic models: the contract /openapi.json is generated from.

The handlers build their answers as plain dicts (no validation on the request path: the API's rate
matters); the contract tests hold every live answer to these models, and the OpenAPI document
(controller/api/openapi.py) takes its components from them. A field a client may rely on is
required (``| None`` without a default: present, and null where it has no value yet); one that
appears only in some states has a default and may be absent. Their examples are
controller/api/examples.py.
"""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class Phase(StrEnum):
    """Where a job is: ``queued`` until a controller takes it; ``stopped`` when no controller runs
    it before its end (``ffswarm resume``); ``unreadable`` when its run folder cannot be read."""

    QUEUED = "queued"
    RUNNING = "running"
    STOPPED = "stopped"
    FINISHED = "finished"
    CANCELLED = "cancelled"
    REFUSED = "refused"
    UNREADABLE = "unreadable"


class Outcome(StrEnum):
    """How a job ended (null until it has): every item ok or without a face · some failed ·
    none ended well, or refused · cancelled."""

    SUCCEEDED = "succeeded"
    PARTIAL = "partial"
    FAILED = "failed"
    CANCELLED = "cancelled"


class ChunkState(StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"
    CANCELLED = "cancelled"
    UNKNOWN = "unknown"


class ItemStatus(StrEnum):
    """A reported item's end: ``error`` is a failure; ``cancelled`` was not run (``resume`` runs it)."""

    OK = "ok"
    NO_FACE = "no_face"
    ERROR = "error"
    CANCELLED = "cancelled"


class Model(BaseModel):
    """Answers name every field they carry: an undocumented field is a contract test's failure."""

    model_config = ConfigDict(extra="forbid")


# --- errors ---------------------------------------------------------------------------------------
class FieldError(Model):
    field: str = Field(description="the request field, as the job file names it (dots for nesting)")
    message: str


class ErrorDetail(Model):
    code: str = Field(description="stable, for programs: not_found, invalid_job, too_large, quota_exceeded, …")
    message: str = Field(description="for people; paths relative to the tenant's area")
    field: str | None = Field(None, description="the (first) request field at fault")
    file: str | None = Field(None, description="the uploaded file or ZIP entry at fault")
    errors: list[FieldError] | None = Field(None, description="one entry per field at fault")


class Error(Model):
    """Every answer with a status of 400 or more, the framework's own 404, 405 and 413 included."""

    error: ErrorDetail


# --- usage ----------------------------------------------------------------------------------------
class ItemUsage(Model):
    ok: int = Field(ge=0)
    no_face: int = Field(ge=0)
    failed: int = Field(ge=0)
    cancelled: int = Field(ge=0)


class Usage(Model):
    """What a job used, as a platform bills it (measured by the runners)."""

    gpu_seconds: float = Field(ge=0, description="runner wall seconds of every chunk attempt × GPUs reserved")
    runner_seconds: float = Field(ge=0, description="runner wall seconds of every chunk attempt")
    attempts: int = Field(ge=0)
    attempts_untimed: int = Field(ge=0, description="attempts that left no timing")
    bytes_in: int = Field(ge=0, description="distinct input files read")
    bytes_out: int = Field(ge=0, description="committed outputs")
    items: ItemUsage


class ReportUsage(Usage):
    gpus_per_chunk: int = Field(ge=0)
    attempt_seconds: dict[str, float] = Field(description="each chunk attempt's wall seconds")


class JobUsage(Model):
    job: str
    finished: float = Field(description="unix seconds")
    finished_at: datetime
    usage: Usage


class UsagePage(Model):
    """GET /v1/usage: the tenant's usage summed over its jobs that ended in [from, to), and those jobs."""

    tenant: str
    from_: float = Field(alias="from", description="unix seconds, inclusive")
    to: float = Field(description="unix seconds, exclusive")
    from_at: datetime
    to_at: datetime
    jobs: int = Field(ge=0)
    jobs_without_usage: int = Field(ge=0, description="ended in the range with a report from before usage")
    usage: Usage
    job_usage: list[JobUsage]
    next_cursor: str | None


# --- the status object ----------------------------------------------------------------------------
class ItemCounts(Model):
    total: int = Field(ge=0)
    ok: int = Field(ge=0)
    no_face: int = Field(ge=0)
    failed: int = Field(ge=0)
    cancelled: int = Field(ge=0)
    pending: int = Field(ge=0)


class SegmentCounts(Model):
    total: int = Field(ge=0)
    done: int = Field(ge=0)


class ChunkCounts(Model):
    """The job's chunks: how many, and how many are in each state (a state none is in is absent)."""

    total: int = Field(ge=0)
    queued: int | None = Field(None, ge=0)
    running: int | None = Field(None, ge=0)
    done: int | None = Field(None, ge=0)
    failed: int | None = Field(None, ge=0)
    cancelled: int | None = Field(None, ge=0)
    unknown: int | None = Field(None, ge=0)


class Controller(Model):
    owner: str
    host: str
    pid: int
    since: datetime


class JobStatus(Model):
    """One job's status, as an element of ``ffswarm status --json``. A job a controller has not
    taken yet (queued, refused, cancelled before it started) has only the fields that are required."""

    job: str
    phase: Phase
    outcome: Outcome | None = Field(description="null until the job has ended")
    owner: str = Field(description="the tenant")
    created: float = Field(description="unix seconds")
    created_at: datetime | None
    started_at: datetime | None
    finished_at: datetime | None
    stage: str | None = Field(None, description="what a running job's controller is doing")
    items: ItemCounts | None = None
    segments: SegmentCounts | None = None
    chunks: ChunkCounts | None = None
    attempts: int | None = Field(None, ge=0)
    nodes: list[str] | None = None
    max_concurrent: int | None = Field(None, ge=1)
    eta_seconds: int | None = None
    controller: Controller | None = None
    usage: Usage | None = None
    reason: str | None = Field(None, description="why `serve` refused the job, or gave up on it")
    results_url: str | None = Field(None, description="results.zip by a signed link (no token needed)")
    output_urls: dict[str, str] | None = Field(None, description="item → link of its object in the store")
    output_urls_more: int | None = Field(None, ge=0, description="objects beyond output_urls")


class JobPage(Model):
    """GET /v1/jobs: the tenant's jobs, newest first."""

    jobs: list[JobStatus]
    next_cursor: str | None = Field(description="pass as `cursor` for the next page; null on the last")


# --- writes ---------------------------------------------------------------------------------------
class Accepted(Model):
    """202 to POST /v1/jobs: the job is durable; follow ``status_url`` or ``events_url``."""

    id: str
    status_url: str
    events_url: str
    notes: list[str] | None = Field(None, description="what the API changed or noticed (e.g. skipped files)")


class Scale(Model):
    """POST /v1/jobs/{job}/scale: how many of the job's chunks run at once."""

    max_concurrent: int = Field(ge=1)


class Scaled(Model):
    job: str
    max_concurrent: int = Field(ge=1)


class Retried(Model):
    id: str
    status_url: str
    events_url: str
    items: int = Field(ge=0, description="items to run again")


class Cancelled(Model):
    job: str
    cancelled: bool


class Revoked(Model):
    id: str
    links_revoked: bool


class Health(Model):
    ok: bool


class Readiness(Model):
    ready: bool
    reasons: list[str] | None = Field(None, description="why not (only with a valid token)")


# --- the report -----------------------------------------------------------------------------------
class ReportCounts(Model):
    items: int = Field(ge=0)
    ok: int = Field(ge=0)
    no_face: int = Field(ge=0)
    failed: int = Field(ge=0)
    chunks: int = Field(ge=0)
    chunks_done: int = Field(ge=0)
    chunks_failed: int = Field(ge=0)
    chunks_cancelled: int = Field(ge=0)
    cancelled: int = Field(ge=0, description="items not run because the job was cancelled")
    segments: int = Field(ge=0, description="video segments beside the items submitted")


class Failure(Model):
    item: str
    input: str
    reason: str | None
    chunk: str | None


class ReportItem(Model):
    """One item submitted: a photo, or a video (``kind: video``, with its segments and probe facts)."""

    input: str
    output: str | None = Field(description="null unless an output was written")
    status: ItemStatus
    reason: str | None
    chunk: str | None
    kind: str | None = Field(None, description="video")
    segments: int | None = Field(None, ge=0)
    info: dict[str, Any] | None = None
    output_url: str | None = Field(None, description="an s3:// output's link, signed at this answer")


class Attempt(Model):
    attempt: int | None
    service: str | None
    node: str | None
    exit_code: int | None
    outcome: str | None
    reason: str | None


class ChunkRecord(Model):
    state: ChunkState
    failure: str | None = Field(description="the failure's class: user, infra, …")
    reason: str | None
    avoid_nodes: list[str]
    attempts: list[Attempt]


class Timing(Model):
    provider: str
    cold_start_s: float
    item_s: float


class Report(Model):
    """report.json: what happened to every item, video and chunk of a job that ended."""

    job: str
    image: str
    started: float
    finished: float
    started_at: datetime
    finished_at: datetime
    counts: ReportCounts
    failures: list[Failure]
    items: dict[str, ReportItem]
    chunks: dict[str, ChunkRecord]
    timing: Timing | None = None
    hooks: dict[str, str] | None = Field(None, description="each on_complete hook's outcome")
    dropped_result_lines: dict[str, int] | None = Field(None, description="chunk → result lines that did not parse")
    usage: ReportUsage | None = None


# --- the web page's routes ------------------------------------------------------------------------
class ItemRow(Model):
    id: str
    kind: str = Field(description="image or video")
    input: str | None = Field(description="relative to the tenant's area; null outside it")
    output: str | None
    status: str | None = Field(description="ok, no_face, error; null while pending")
    reason: str | None
    has_output: bool = Field(description="the output is committed and can be fetched")


class ItemPage(Model):
    items: list[ItemRow]
    next_cursor: str | None


class EventsLink(Model):
    url: str
    expires: int


# --- webhook deliveries ---------------------------------------------------------------------------
class WebhookType(StrEnum):
    STARTED = "job.started"
    FINISHED = "job.finished"
    CANCELLED = "job.cancelled"


class DeliveryState(StrEnum):
    PENDING = "pending"
    DELIVERED = "delivered"
    FAILED = "failed"


class DeliveryAttempt(Model):
    at: datetime
    status: int | None = Field(None, ge=100, le=599, description="the receiver's HTTP status")
    error: str | None = Field(None, description="why no status was read: the error's class")


class Delivery(Model):
    """One webhook delivery of a job, without its URL or body; its id is the same on every try."""

    id: str = Field(pattern="^msg_[0-9a-f]{32}$", description="webhook-id")
    type: WebhookType
    created_at: datetime
    state: DeliveryState
    next_attempt_at: datetime | None
    attempts: list[DeliveryAttempt]


class DeliveryPage(Model):
    job: str
    deliveries: list[Delivery] = Field(description="oldest first")


ANSWERS: tuple[type[BaseModel], ...] = (
    Error, JobStatus, JobPage, Accepted, Scale, Scaled, Retried, Cancelled, Revoked, Health, Readiness, Report,
    UsagePage, ItemPage, EventsLink, Delivery, DeliveryPage,
)  # fmt: skip
