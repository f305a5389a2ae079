"""The job commands: submit, resume, retry, status, logs, scale, cancel (parsing only; each command
calls one function of controller/run/)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click

from contract.layout import DataRootLayout, RunLayout
from controller.cli import context
from controller.cli import models as models_mod
from controller.cli import output as out
from controller.cli.output import output_option
from controller.config import Config
from controller.errors import FfswarmError, Interrupted, UsageError
from controller.run import control, dryrun, handover, usecase
from controller.run import jobs as jobs_mod
from controller.run import progress as progress_mod
from controller.run import status as status_mod
from controller.run.metrics import Metrics
from controller.run.progress import Progress
from controller.run.report import Report, summary
from controller.run.rundir import RunDir


@click.command()
@click.argument("paths", nargs=-1, required=True, type=click.Path(exists=True, path_type=Path))
@click.option("--dry-run", is_flag=True, help="Print the plan and the services; create nothing.")
@output_option  # with --dry-run: every item, chunk and service as data
@click.option("--new", is_flag=True, help="Start a new run (job id name-2, -3 …) instead of continuing one.")
@click.option("--detach", is_flag=True, help="Hand the jobs to the controller serving the inbox and return at once.")
@click.option(
    "--inbox",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="With --detach: the inbox `ffswarm serve` watches (default <data_root>/inbox).",
)
@click.option(
    "--metrics-textfile",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Write Prometheus metrics here for node_exporter's textfile collector (*.prom).",
)
@click.pass_context
def submit(
    ctx: click.Context,
    paths: tuple[Path, ...],
    dry_run: bool,
    output: str,
    new: bool,
    detach: bool,
    inbox: Path | None,
    metrics_textfile: Path | None,
) -> None:
    """Validate job files (or folders of them), plan, and run every chunk as a one-shot service."""
    if detach and new:
        raise UsageError(
            "--detach cannot start a new run (--new): the controller runs the job named in the file, "
            "continuing its run; to start afresh, give the job file a new name"
        )
    if detach and dry_run:
        raise UsageError("--detach and --dry-run do not go together: a dry run hands nothing over")
    if inbox is not None and not detach:
        raise UsageError("--inbox goes with --detach")
    if output != "text" and not dry_run:
        raise UsageError(f"-o {output} goes with --dry-run (a job's status as data: `ffswarm status JOB -o {output}`)")
    config = context.config(ctx)
    # the command's one backend, asked for the swarm's GPU slots (a dry run plans without it if Docker is away)
    prepared = jobs_mod.prepare(config, list(paths), new, lambda: context.backend(ctx))
    if detach:
        box = inbox or DataRootLayout.host(config.data_root).inbox
        click.echo(handover.describe(handover.hand_over(box, prepared)))
        return
    if dry_run:
        lookup = _image_lookup(ctx)
        if output != "text":
            out.echo(dryrun.plan_json(config, prepared, lookup), output)
        else:
            click.echo("\n".join(dryrun.plan_lines(config, prepared, lookup)))
        return
    backend = context.backend(ctx)
    backend.check_manager()
    metrics, sinks = Metrics(), list[usecase.SinkFactory]()
    if metrics_textfile is not None:  # the same events and the job's own GPU count, as serve's endpoint
        textfile: Path = metrics_textfile
        sinks.append(lambda rundir, job: metrics.textfile_sink(rundir, job.spec.resources.gpus, textfile))
    try:
        reports: list[Report] = _run_with_progress(
            lambda progress: usecase.submit(config, backend, prepared, [progress, *sinks]),
            " · ".join(f"ffswarm resume {j.job_id}" for j in prepared),
        )
    finally:
        if metrics_textfile is not None:
            metrics.write_textfile(metrics_textfile)
    for job, report in zip(prepared, reports, strict=True):
        _summary(config, job, report)
    sys.exit(max((r.exit_code() for r in reports), default=0))


def _image_lookup(ctx: click.Context) -> Any:
    def lookup(ref: str) -> str:
        try:
            return context.backend(ctx).resolve_image(ref)
        except FfswarmError:
            return f"{ref} (unresolved: Docker unavailable)"

    return lookup


def _summary(config: Config, job: jobs_mod.PreparedJob, report: Report, err: bool = False) -> None:
    """The job's summary for people; ``err``: on stderr, when stdout carries data."""
    root = config.data_root
    standin = models_mod.is_standin(DataRootLayout.host(root).pack(job.spec.models))
    note = job.spec.models + (" (STAND-IN test pack: not real face swaps)" if standin else "")
    head, *rest = summary(report, RunLayout.host(root, report.job).report, root, note)
    click.echo(head, err=err)
    for line in rest:
        click.echo(f"  {line}", err=err)


@click.command()
@click.argument("job")
@click.pass_context
def resume(ctx: click.Context, job: str) -> None:
    """Continue a job from its run folder: after Ctrl-C, a killed controller, a restart, or `cancel`
    (its remaining items run; committed ones are never redone)."""
    _resume(ctx, job)


def _resume(ctx: click.Context, job: str) -> None:
    config = context.config(ctx)
    prepared, _ = jobs_mod.open_run(config, job)  # no such job: said before Docker is asked
    backend = context.backend(ctx)
    backend.check_manager()
    report: Report = _run_with_progress(
        lambda progress: usecase.resume(config, backend, job, [progress]), f"ffswarm resume {job}"
    )
    _summary(config, prepared, report)
    sys.exit(report.exit_code())


@click.command()
@click.argument("job")
@click.option(
    "--failed", "failed_only", is_flag=True, help="Re-run only the failed items (the default; kept for scripts)."
)
@click.pass_context
def retry(ctx: click.Context, job: str, failed_only: bool) -> None:
    """Re-run a job's failed and remaining items (committed items are never redone)."""
    _resume(ctx, job)


def _run_with_progress(fn: Any, how_to_resume: str) -> Any:
    bars: list[Progress] = []
    console = context.console(click.get_current_context())

    def make_progress(rundir: RunDir, job: jobs_mod.PreparedJob) -> Progress:
        if bars:
            bars[-1].close()  # one live bar at a time: the previous job of this submit has ended
        bars.append(Progress(rundir, len(job.plan.items), console))
        return bars[-1]

    try:
        return fn(make_progress)
    except KeyboardInterrupt:
        raise Interrupted(f"detached; chunk services keep running. Continue with: {how_to_resume}") from None
    finally:
        for b in bars:
            b.close()


@click.command()
@click.argument("job", required=False)
@output_option
@click.option(
    "-f",
    "--follow",
    is_flag=True,
    help="Watch JOB (running anywhere) with the progress bar until it ends; then its summary and exit code.",
)
@click.pass_context
def status(ctx: click.Context, job: str | None, output: str, follow: bool) -> None:
    """Jobs, chunks by state, items ok/failed/pending, attempts, nodes, ETA (from the run folders).

    With -o json|yaml: JOB's status object, as GET /v1/jobs/{job} answers it; without JOB, every
    job's, as GET /v1/jobs answers them ({"jobs": [...], "next_cursor": null})."""
    if follow:
        if job is None:
            raise UsageError("--follow needs a JOB")
        if output == "yaml":
            raise UsageError("--follow prints one status object per line as it changes, in JSON: use -o json")
        config = context.config(ctx)
        console = None if output == "json" else context.console(ctx)  # -o json: status lines even on a terminal
        report = Report.from_dict(progress_mod.follow(RunDir(config.data_root, job), console, click.echo))
        _summary(config, jobs_mod.open_run(config, job)[0], report, err=output == "json")  # stdout: JSON lines only
        sys.exit(report.exit_code())
    rows = status_mod.collect(context.config(ctx), job)
    if output != "text":
        out.echo(rows[0] if job else {"jobs": rows, "next_cursor": None}, output)
        return
    for row in rows:
        click.echo(status_mod.describe(row))


@click.command()
@click.argument("job")
@click.option("--chunk", default=None, help="Only this chunk (e.g. c0003).")
@click.option("-f", "--follow", is_flag=True, help="Keep printing as runners write, until the job ends.")
@click.pass_context
def logs(ctx: click.Context, job: str, chunk: str | None, follow: bool) -> None:
    """Runner logs of a job, from its run folder (runners write them there as they go)."""
    rundir = RunDir(context.config(ctx).data_root, job)
    if not rundir.exists():
        raise UsageError(f"no job {job!r}")
    chunks = [c.id for c in rundir.plan().chunks]
    if chunk is not None and chunk not in chunks:
        shown = ", ".join(chunks[:5]) + (f" … {chunks[-1]}" if len(chunks) > 5 else "")
        raise UsageError(f"job {job} has no chunk {chunk!r}; its {len(chunks)} chunk(s): {shown}")
    for line in status_mod.log_lines(rundir, chunk, follow):
        click.echo(line, nl=False)


@click.command()
@click.argument("job")
@click.argument("n", type=click.IntRange(min=1))
@click.pass_context
def scale(ctx: click.Context, job: str, n: int) -> None:
    """Change how many chunk services of a running job may exist at once (followed within 2 s)."""
    control.scale(context.config(ctx), job, n)
    click.echo(f"job {job}: max_concurrent = {n}")


@click.command()
@click.argument("job")
@click.pass_context
def cancel(ctx: click.Context, job: str) -> None:
    """Remove the job's services and mark it cancelled; committed outputs stay."""
    removed = control.cancel(context.config(ctx), job, context.backend(ctx))
    click.echo(
        f"job {job}: cancelled ({removed} running chunk service(s) removed); committed outputs kept; "
        f"`ffswarm resume {job}` continues it"
    )
