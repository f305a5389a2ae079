"""The job commands: submit, resume, retry, status, logs, scale, cancel (parsing only; each command
calls one function of controller/run/)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import click
import structlog

from contract.layout import RunLayout
from controller.cli import context
from controller.config import Config
from controller.errors import FfswarmError, Interrupted, UsageError
from controller.run import handover
from controller.run import jobs as jobs_mod
from controller.run import progress as progress_mod
from controller.run import status as status_mod
from controller.run.metrics import JobSink, Metrics
from controller.run.progress import Progress
from controller.run.report import exit_code
from controller.run.rundir import RunDir
from controller.swarm.docker import DockerSwarm

JOB_EVENTS = frozenset(
    {"job_started", "chunk_started", "chunk_adopted", "chunk_running", "chunk_done", "chunk_retry", "chunk_failed"}
    | {"job_cancelled", "job_finished"}
)


@click.command()
@click.argument("paths", nargs=-1, required=True, type=click.Path(exists=True, path_type=Path))
@click.option("--dry-run", is_flag=True, help="Print the plan and the services; create nothing.")
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
    new: bool,
    detach: bool,
    inbox: Path | None,
    metrics_textfile: Path | None,
) -> None:
    """Validate job files (or folders of them), plan, and run every chunk as a one-shot service."""
    if metrics_textfile is None:
        _submit(ctx, paths, dry_run, new, detach, inbox)
        return
    metrics = Metrics()
    tee = _EventTee(context.config(ctx), metrics, metrics_textfile)
    structlog.configure(processors=[tee, *structlog.get_config()["processors"]])
    try:
        _submit(ctx, paths, dry_run, new, detach, inbox)
    finally:
        metrics.write_textfile(metrics_textfile)


def _submit(
    ctx: click.Context, paths: tuple[Path, ...], dry_run: bool, new: bool, detach: bool, inbox: Path | None
) -> None:
    if detach and new:
        raise UsageError(
            "--detach cannot start a new run (--new): the controller runs the job named in the file, "
            "continuing its run; to start afresh, give the job file a new name"
        )
    if detach and dry_run:
        raise UsageError("--detach and --dry-run do not go together: a dry run hands nothing over")
    if inbox is not None and not detach:
        raise UsageError("--inbox goes with --detach")
    config = context.config(ctx)
    prepared = jobs_mod.prepare(config, list(paths), new)
    if detach:
        click.echo(handover.describe(handover.hand_over(inbox or config.data_root / "inbox", prepared)))
        return
    if dry_run:
        click.echo(json.dumps(jobs_mod.dry_run(config, prepared, _image_lookup(config)), indent=1))
        return
    names = " ".join(j.job_id for j in prepared)
    code, reports = _run_with_progress(
        lambda p: jobs_mod.submit(config, prepared, p), f"ffswarm resume JOB (job {names})"
    )
    for job, report in zip(prepared, reports, strict=True):
        _summary(config, job, report)
    sys.exit(code)


def _image_lookup(config: Any) -> Any:
    def lookup(ref: str) -> str:
        try:
            return DockerSwarm(config.docker_host).resolve_image(ref)
        except FfswarmError:
            return f"{ref} (unresolved: Docker unavailable)"

    return lookup


def _summary(config: Any, job: jobs_mod.PreparedJob, report: dict[str, Any]) -> None:
    c = report["counts"]
    root = config.data_root
    pack = root / "models" / job.spec.models / "pack.yaml"
    standin = "standin: true" in pack.read_text() if pack.is_file() else False
    click.echo(
        f"job {report['job']}: {c['ok']} ok, {c['no_face']} without a face, {c['failed']} failed "
        f"of {c['items']} items in {c['chunks']} chunks"
    )
    outputs = sorted({str(Path(i["output"]).parent) for i in report["items"].values() if i["output"]})
    for o in outputs:
        click.echo(f"  outputs: {root / o}")
    for f in report["failures"]:
        click.echo(f"  failed: {f['input']}: {f['reason']}")
    click.echo(f"  model pack: {job.spec.models}" + (" (STAND-IN test pack: not real face swaps)" if standin else ""))
    click.echo(f"  report: {RunLayout.host(root, report['job']).report}")


@click.command()
@click.argument("job")
@click.pass_context
def resume(ctx: click.Context, job: str) -> None:
    """Continue a job from its run folder (after Ctrl-C, a killed controller, a restart)."""
    config = context.config(ctx)
    code, report = _run_with_progress(lambda p: jobs_mod.resume(config, job, p), f"ffswarm resume {job}")
    _summary(config, jobs_mod.open_run(config, job)[0], report)
    sys.exit(code)


@click.command()
@click.argument("job")
@click.option("--failed", "failed_only", is_flag=True, required=True, help="Re-run only the failed items.")
@click.pass_context
def retry(ctx: click.Context, job: str, failed_only: bool) -> None:
    """Re-run a finished job's failed items (committed items are never redone)."""
    config = context.config(ctx)
    jobs_mod.clear_cancel(config, job)
    code, report = _run_with_progress(lambda p: jobs_mod.resume(config, job, p), f"ffswarm resume {job}")
    _summary(config, jobs_mod.open_run(config, job)[0], report)
    sys.exit(code)


def _run_with_progress(fn: Any, how_to_resume: str) -> Any:
    bars: list[Progress] = []
    console = context.console(click.get_current_context())

    def make_progress(rundir: RunDir, total: int) -> Progress:
        if bars:
            bars[-1].close()  # one live bar at a time: the previous job of this submit has ended
        bars.append(Progress(rundir, total, console))
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
@click.option("--json", "as_json", is_flag=True)
@click.option(
    "-f",
    "--follow",
    is_flag=True,
    help="Watch JOB (running anywhere) with the progress bar until it ends; then its summary and exit code.",
)
@click.pass_context
def status(ctx: click.Context, job: str | None, as_json: bool, follow: bool) -> None:
    """Jobs, chunks by state, items ok/failed/pending, attempts, nodes, ETA (from the run folders)."""
    if follow:
        if job is None:
            raise UsageError("--follow needs a JOB")
        config = context.config(ctx)
        console = None if as_json else context.console(ctx)  # --json: status lines even on a terminal
        report = progress_mod.follow(RunDir(config.data_root, job), console, click.echo)
        _summary(config, jobs_mod.open_run(config, job)[0], report)
        sys.exit(exit_code(report))
    rows = status_mod.collect(context.config(ctx), job)
    if as_json:
        click.echo(json.dumps(rows, indent=1))
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
    for line in status_mod.log_lines(rundir, chunk, follow):
        click.echo(line, nl=False)


@click.command()
@click.argument("job")
@click.argument("n", type=click.IntRange(min=1))
@click.pass_context
def scale(ctx: click.Context, job: str, n: int) -> None:
    """Change how many chunk services of a running job may exist at once (followed within 2 s)."""
    jobs_mod.scale(context.config(ctx), job, n)
    click.echo(f"job {job}: max_concurrent = {n}")


@click.command()
@click.argument("job")
@click.pass_context
def cancel(ctx: click.Context, job: str) -> None:
    """Remove the job's services and mark it cancelled; committed outputs stay."""
    removed = jobs_mod.cancel(context.config(ctx), job)
    click.echo(f"job {job}: cancelled ({removed} running chunk service(s) removed); committed outputs kept")


class _EventTee:
    """A structlog processor that hands jobs.supervise's logged events to metric sinks, for
    `submit --metrics-textfile`: the textfile follows the event stream jobs.supervise logs (one line
    per event, bound to the job id)."""

    def __init__(self, config: Config, metrics: Metrics, path: Path) -> None:
        self.config, self.metrics, self.path = config, metrics, path
        self.sinks: dict[str, JobSink] = {}

    def __call__(self, _logger: Any, _method: str, event_dict: Any) -> Any:
        job, event = event_dict.get("job"), event_dict.get("event")
        if job and event in JOB_EVENTS:
            try:
                if job not in self.sinks:
                    self.sinks[job] = self.metrics.sink(RunDir(self.config.data_root, str(job)))
                fields = {k: v for k, v in event_dict.items() if k not in ("event", "job")}
                self.sinks[job](str(event), **fields)
                self.metrics.write_textfile(self.path)
            except Exception as e:  # metrics must never stop a job
                click.echo(f"ffswarm: metrics textfile {self.path}: {e}", err=True)
        return event_dict
