"""What the CLI's remote mode does between parsing and the API (controller/cli/remote.py parses):
the client made from --api/--token-file, the client's errors as the CLI's exit codes, a job followed
with the same progress bar as a local run, and its end in the same words and exit code.

Exit codes as a local run's (docs/failures.md#exit-codes): 0 every item ok, 1 failed or cancelled
items (or a job refused or stopped), 2 no such job or a state that does not allow it, 65 a job
the API refused (422, a bad upload), 66 a local file missing, 69 the API unreachable or over
capacity (429, 503), 70 an internal error, 78 no token or a token refused (401, 403).
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

from controller.cli import context
from controller.client import ApiError, Client, ClientError, Job, TransportError
from controller.client.errors import LocalFileError
from controller.errors import ConfigError, FfswarmError, Interrupted, UsageError
from controller.run import progress
from controller.run import status as status_mod
from controller.run.report import MAX_GROUPS, Report, summary

META = "ffswarm.remote"  # click's ctx.meta key: the root's --api and --token-file


@dataclass(frozen=True)
class Remote:
    url: str
    token_file: Path | None

    def token(self) -> str | None:
        """--token-file's first line, else $FFSWARM_TOKEN; None: no token (the API will say 401)."""
        if self.token_file is None:
            return os.environ.get("FFSWARM_TOKEN") or None
        try:
            text = self.token_file.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            raise ConfigError(f"--token-file {self.token_file}: cannot be read") from None
        token = text.strip().splitlines()[0].strip() if text.strip() else ""
        if not token:
            raise ConfigError(f"--token-file {self.token_file}: holds no token")
        return token


def remote(ctx: click.Context) -> Remote | None:
    found = ctx.find_root().meta.get(META)
    return found if isinstance(found, Remote) else None


def connect(ctx: click.Context) -> Client:
    """The command's one client (closed when the command ends)."""
    where = remote(ctx)
    if where is None:
        name = ctx.info_name or "this command"
        raise UsageError(f"`ffswarm {name}` talks to an API: give --api URL (or set FFSWARM_API_URL)")
    client = Client(where.url, where.token(), retries=3)  # an API that is not there: said within ~4 s
    ctx.call_on_close(client.close)
    return client


class RemoteError(FfswarmError):
    """A client error in the CLI's words, with the exit code a local run would have for it."""

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def exit_code(e: ApiError) -> int:
    if e.status in (400, 413, 415, 422):
        return 65
    if e.status in (401, 403):
        return 78
    if e.status in (404, 409):
        return 2
    if e.status in (429, 503):
        return 69
    return 70


@contextlib.contextmanager
def translated() -> Iterator[None]:
    """Client errors raised as RemoteError: the message, each field the API named, the exit code."""
    try:
        yield
    except ApiError as e:
        head = e.message if e.field is None or e.message.startswith(e.field) else f"{e.field}: {e.message}"
        lines = [head, *(f"  {f.field}: {f.message}" for f in e.errors if len(e.errors) > 1)]
        if e.status == 401:
            lines.append("  (a token: --token-file FILE or FFSWARM_TOKEN)")
        raise RemoteError("\n".join(lines), exit_code(e)) from None
    except TransportError as e:
        raise RemoteError(str(e), 69) from None
    except LocalFileError as e:
        raise RemoteError(str(e), 66) from None
    except ClientError as e:
        raise RemoteError(str(e), 2) from None


def snapshot(row: dict[str, Any]) -> progress.Snapshot:
    """The bar of an API status object: as a run folder's row draws it; empty before the job has one."""
    try:
        return progress.snapshot(row)
    except (KeyError, TypeError, ValueError, AttributeError):
        return progress.Snapshot(0, 0, 0, 0, 0, 0, 0)


def follow(ctx: click.Context, client: Client, job: str, json_lines: bool = False) -> int:
    """Watch the job's events with the bar (off a terminal, or ``json_lines``: one JSON status line
    per change) until it ends; then its summary; returns the exit code."""
    console = None if json_lines else context.console(ctx)
    bar = progress.bar_for(console)
    try:
        for event in client.events(job):
            if event.name != "progress" or not isinstance(event.data, dict):
                continue
            if bar is not None:
                bar.show(snapshot(event.data))
            else:
                click.echo(json.dumps(event.data, sort_keys=True))
    except KeyboardInterrupt:
        how = f"ffswarm --api {client_url(ctx)} status {job} --follow"
        raise Interrupted(f"stopped watching; the job keeps running. Watch it again with: {how}") from None
    finally:
        if bar is not None:
            bar.stop()
    return ended(ctx, client, client.get(job))


def client_url(ctx: click.Context) -> str:
    where = remote(ctx)
    return where.url if where is not None else "URL"


def ended(ctx: click.Context, client: Client, job: Job, echo: Callable[[str], None] = click.echo) -> int:
    """The end of a job in the local run's words (its report's counts and failures), and its exit code."""
    if job.phase == "refused":
        echo(f"job {job.id}: refused: {job.reason or 'no reason given'}")
        return 1
    if job.phase == "stopped":
        echo(f"job {job.id}: stopped: no controller runs it now")
        return 1
    report = read_report(client, job.id)
    if report is None:
        echo(f"job {job.id}: {job.phase}" + (f" ({job.outcome})" if job.outcome else ""))
        return 0 if job.outcome == "succeeded" else 1
    head, *rest = summary(report, f"GET /v1/jobs/{job.id}/report", None, max_failures=MAX_GROUPS)
    echo(head)
    for line in rest:
        echo(f"  {line}")
    echo(f"  results: ffswarm --api {client_url(ctx)} results {job.id} -o {job.id}.zip")
    return report.exit_code()


def read_report(client: Client, job: str) -> Report | None:
    """The job's report as a local run reads it; None when it has none or it reads otherwise."""
    try:
        return Report.from_dict(client.report(job))
    except ApiError as e:
        if e.status == 404:
            return None
        raise
    except (KeyError, TypeError, ValueError, AttributeError):
        return None


def describe(row: dict[str, Any]) -> str:
    """One job as `ffswarm status` words it; a job with no run yet by its phase (and reason)."""
    try:
        text = status_mod.describe(row)
    except (KeyError, TypeError, AttributeError):
        text = f"{row.get('job') or row.get('id')}: {row.get('phase')}"
    if isinstance(row.get("outcome"), str):
        text += f" · outcome {row['outcome']}"
    if isinstance(row.get("reason"), str):
        text += f" · {row['reason']}"
    return text
