"""The CLI's remote mode: ``ffswarm --api URL`` (or ``$FFSWARM_API_URL``) makes the job commands talk
to an ffswarm API (controller/client/) instead of the Docker Swarm and the data root, so they work
from any machine that reaches the API: submit (uploads local photos, videos, folders and ZIPs),
status (one job, --follow, or the list), logs (failure reasons), cancel, retry, scale, delete and
results. The token comes from ``--token-file`` or ``$FFSWARM_TOKEN``. Parsing only: the work is in
controller/cli/remote_run.py and the client. Other commands ignore --api.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from controller.cli.output import echo as output_echo
from controller.cli.output import output_option
from controller.cli.remote_run import META, Remote, connect, describe, follow, read_report, translated
from controller.client import jobfile
from controller.errors import UsageError

F = TypeVar("F", bound=Callable[..., Any])
JOB_FILES = (".yaml", ".yml")
PHASES = ("queued", "running", "stopped", "finished", "cancelled", "refused", "unreadable")
OUTCOMES = ("succeeded", "partial", "failed", "cancelled")


def _keep(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
    meta: dict[str, Any] = ctx.meta.setdefault(META + ".raw", {})
    meta[param.name or ""] = value
    url, token_file = meta.get("api_url"), meta.get("token_file")
    if url:
        ctx.meta[META] = Remote(str(url).rstrip("/"), Path(token_file) if token_file else None)
    return value


def options(f: F) -> F:
    """The root's --api and --token-file (kept in click's ctx.meta for the commands below)."""
    f = click.option(
        "--token-file",
        type=click.Path(dir_okay=False, path_type=Path),
        expose_value=False,
        callback=_keep,
        help="With --api: a file holding the API token (else $FFSWARM_TOKEN).",
    )(f)
    return click.option(
        "--api",
        "api_url",
        envvar="FFSWARM_API_URL",
        metavar="URL",
        expose_value=False,
        callback=_keep,
        help="Talk to an ffswarm API instead of the swarm: submit, status, logs, cancel, retry, scale, delete, "
        "results (else $FFSWARM_API_URL).",
    )(f)


def command(ctx: click.Context, name: str) -> click.Command | None:
    """The remote form of command ``name`` when --api is given; None: the command as it is."""
    return REMOTE.get(name) if ctx.meta.get(META) is not None else None


@click.command("submit")
@click.argument("paths", nargs=-1, required=True, type=click.Path(exists=True, path_type=Path))
@click.option("--source", "sources", multiple=True, type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="A photo of the face to put in (repeat for several photos of one person).")  # fmt: skip
@click.option("--name", default=None, help="The job's name (its id is NAME-xxxxxxxx).")
@click.option("--detach", is_flag=True, help="Return once the API has accepted the job.")
@click.pass_context
def submit(ctx: click.Context, paths: tuple[Path, ...], sources: tuple[Path, ...], name: str | None,
           detach: bool) -> None:  # fmt: skip
    """Upload photos, videos, folders and ZIPs (and at most one job file, whose source and targets
    are read relative to its folder and whose other fields are sent as options) as one job; follow
    it with the progress bar until it ends. Exit 0: every item ok; 1: some failed."""
    job_files = [p for p in paths if p.is_file() and p.suffix.lower() in JOB_FILES]
    if len(job_files) > 1:
        raise UsageError("at most one job file per remote submit (each job file is a job: submit them one by one)")
    targets = [p for p in paths if p not in job_files]
    client = connect(ctx)
    with translated():
        local = jobfile.read(job_files[0]) if job_files else jobfile.LocalJob((), (), {})
        if not sources and not local.source:
            raise UsageError("a source photo is needed: --source PHOTO (or source: in a job file)")
        opts = {**local.options, **({"name": name} if name else {})}
        accepted = client.submit(source=list(sources) or list(local.source),
                                 files=[*local.targets, *targets], options=opts)  # fmt: skip
        click.echo(
            f"job {accepted.id}: accepted" + (" (the same request again: no new job)" if accepted.replayed else "")
        )
        for note in accepted.notes:
            click.echo(f"  note: {note}")
        if detach:
            return
        sys.exit(follow(ctx, client, accepted.id))


@click.command("status")
@click.argument("job", required=False)
@output_option
@click.option("-f", "--follow", "follow_", is_flag=True, help="Watch JOB with the progress bar until it ends.")
@click.option("--phase", type=click.Choice(PHASES), default=None, help="Without JOB: only jobs in this phase.")
@click.option("--outcome", type=click.Choice(OUTCOMES), default=None, help="Without JOB: only jobs with this outcome.")
@click.option(
    "--limit", type=click.IntRange(min=1), default=None, help="Without JOB: at most this many (newest first)."
)
@click.pass_context
def status(ctx: click.Context, job: str | None, output: str, follow_: bool, phase: str | None,
           outcome: str | None, limit: int | None) -> None:  # fmt: skip
    """A job's status, or the list of your jobs (newest first); --follow watches one to its end."""
    client = connect(ctx)
    with translated():
        if follow_:
            if job is None:
                raise UsageError("--follow needs a JOB")
            if output == "yaml":
                raise UsageError("--follow prints JSON lines: -o json, or text")
            sys.exit(follow(ctx, client, job, json_lines=output == "json"))
        rows = [dict(client.get(job).raw)] if job else [dict(j.raw) for j in client.list(phase=phase,
                outcome=outcome, limit=limit)]  # fmt: skip
    if output != "text":  # the API's objects, as a local `status -o json|yaml` prints them
        output_echo(rows[0] if job else {"jobs": rows, "next_cursor": None}, output)
        return
    for row in rows:
        click.echo(describe(row))


@click.command("logs")
@click.argument("job")
@click.option("--chunk", default=None, help="Only this chunk's items (e.g. c0003).")
@click.pass_context
def logs(ctx: click.Context, job: str, chunk: str | None) -> None:
    """Why the job's items failed, from its report (runner logs stay on the swarm)."""
    client = connect(ctx)
    with translated():
        report = read_report(client, job)
    if report is None:
        raise UsageError(f"job {job} has no report yet: failure reasons come with it")
    for f in report.failures:
        if chunk is None or f.chunk == chunk:
            click.echo(f"{f.chunk or '-'} {f.item} {f.input}: {f.reason or 'no reason recorded'}")


@click.command("cancel")
@click.argument("job")
@click.pass_context
def cancel(ctx: click.Context, job: str) -> None:
    """Cancel the job (a queued one never starts); committed outputs stay."""
    with translated():
        connect(ctx).cancel(job)
    click.echo(f"job {job}: cancelled; committed outputs kept; `ffswarm retry {job}` runs the rest")


@click.command("retry")
@click.argument("job")
@click.option("--failed", "failed_only", is_flag=True, help="Re-run only the failed items (the default).")
@click.option("--detach", is_flag=True, help="Return once the API has queued the job again.")
@click.pass_context
def retry(ctx: click.Context, job: str, failed_only: bool, detach: bool) -> None:
    """Run a finished job's failed and remaining items again, and follow it to its end."""
    client = connect(ctx)
    with translated():
        again = client.retry(job)
        items = again.raw.get("items")
        click.echo(f"job {again.id}: queued again" + (f" ({items} item(s) to run)" if isinstance(items, int) else ""))
        if not detach:
            sys.exit(follow(ctx, client, again.id))


@click.command("scale")
@click.argument("job")
@click.argument("n", type=click.IntRange(min=1))
@click.pass_context
def scale(ctx: click.Context, job: str, n: int) -> None:
    """How many of the job's chunks may run at once."""
    with translated():
        connect(ctx).scale(job, n)
    click.echo(f"job {job}: max_concurrent = {n}")


@click.command("delete")
@click.argument("job")
@click.pass_context
def delete(ctx: click.Context, job: str) -> None:
    """Delete a finished job: its uploads, outputs, records (refused while it runs)."""
    with translated():
        connect(ctx).delete(job)
    click.echo(f"job {job}: deleted")


@click.command("results")
@click.argument("job")
@click.option("-o", "--output", "out", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Where to write the ZIP (default JOB.zip here).")  # fmt: skip
@click.pass_context
def results(ctx: click.Context, job: str, out: Path | None) -> None:
    """Download the job's outputs as a ZIP (needs --api; on a manager they are on the volume)."""
    client = connect(ctx)
    with translated():
        written = client.results(job, out or Path(f"{job}.zip"))
    click.echo(f"job {job}: results written to {written} ({written.stat().st_size} bytes)")


REMOTE: dict[str, click.Command] = {
    c.name or "": c for c in (submit, status, logs, cancel, retry, scale, delete, results)
}
__all__ = ["command", "options", "results"]
