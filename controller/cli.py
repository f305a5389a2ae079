"""The `ffswarm` command: parsing only; each command calls one function."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import click

from contract.layout import RunLayout
from controller import handover, log
from controller import jobs as jobs_mod
from controller import progress as progress_mod
from controller import status as status_mod
from controller.config import load_config
from controller.errors import FfswarmError, Interrupted, UsageError
from controller.progress import Progress
from controller.report import exit_code
from controller.rundir import RunDir


@click.group()
@click.option(
    "--config",
    "config_path",
    type=click.Path(dir_okay=False),
    default=None,
    help="Config file (else $FFSWARM_CONFIG, ./ffswarm.yaml, ~/.config/ffswarm/config.yaml).",
)
@click.option("--json-logs/--console-logs", default=None, help="Log format (default: console on a terminal).")
@click.option("-v", "--verbose", is_flag=True, help="On a terminal, also print every chunk's events above the bar.")
@click.pass_context
def cli(ctx: click.Context, config_path: str | None, json_logs: bool | None, verbose: bool) -> None:
    """ffswarm: batch face swapping on a Docker Swarm of GPU machines."""
    console = log.setup(json_logs, verbose)  # the progress bar draws on it; None: JSON lines, no bar
    ctx.obj = {"config_path": config_path, "console": console}


def _config(ctx: click.Context) -> Any:
    return load_config(ctx.obj["config_path"])


@cli.command()
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
@click.pass_context
def submit(
    ctx: click.Context,
    paths: tuple[Path, ...],
    dry_run: bool,
    new: bool,
    detach: bool,
    inbox: Path | None,
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
    config = _config(ctx)
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
    from controller.swarm import DockerSwarm

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


@cli.command()
@click.argument("job")
@click.pass_context
def resume(ctx: click.Context, job: str) -> None:
    """Continue a job from its run folder (after Ctrl-C, a killed controller, a restart)."""
    config = _config(ctx)
    code, report = _run_with_progress(lambda p: jobs_mod.resume(config, job, p), f"ffswarm resume {job}")
    _summary(config, jobs_mod.open_run(config, job)[0], report)
    sys.exit(code)


@cli.command()
@click.argument("job")
@click.option("--failed", "failed_only", is_flag=True, required=True, help="Re-run only the failed items.")
@click.pass_context
def retry(ctx: click.Context, job: str, failed_only: bool) -> None:
    """Re-run a finished job's failed items (committed items are never redone)."""
    config = _config(ctx)
    jobs_mod.clear_cancel(config, job)
    code, report = _run_with_progress(lambda p: jobs_mod.resume(config, job, p), f"ffswarm resume {job}")
    _summary(config, jobs_mod.open_run(config, job)[0], report)
    sys.exit(code)


def _run_with_progress(fn: Any, how_to_resume: str) -> Any:
    bars: list[Progress] = []
    console = click.get_current_context().obj.get("console")

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


@cli.command()
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
        config = _config(ctx)
        console = None if as_json else ctx.obj.get("console")  # --json: status lines even on a terminal
        report = progress_mod.follow(RunDir(config.data_root, job), console, click.echo)
        _summary(config, jobs_mod.open_run(config, job)[0], report)
        sys.exit(exit_code(report))
    rows = status_mod.collect(_config(ctx), job)
    if as_json:
        click.echo(json.dumps(rows, indent=1))
        return
    for row in rows:
        click.echo(status_mod.describe(row))


@cli.command()
@click.argument("job")
@click.option("--chunk", default=None, help="Only this chunk (e.g. c0003).")
@click.option("-f", "--follow", is_flag=True, help="Keep printing as runners write, until the job ends.")
@click.pass_context
def logs(ctx: click.Context, job: str, chunk: str | None, follow: bool) -> None:
    """Runner logs of a job, from its run folder (runners write them there as they go)."""
    rundir = RunDir(_config(ctx).data_root, job)
    if not rundir.exists():
        raise UsageError(f"no job {job!r}")
    for line in status_mod.log_lines(rundir, chunk, follow):
        click.echo(line, nl=False)


@cli.command()
@click.argument("job")
@click.argument("n", type=click.IntRange(min=1))
@click.pass_context
def scale(ctx: click.Context, job: str, n: int) -> None:
    """Change how many chunk services of a running job may exist at once (followed within 2 s)."""
    jobs_mod.scale(_config(ctx), job, n)
    click.echo(f"job {job}: max_concurrent = {n}")


@cli.command()
@click.argument("job")
@click.pass_context
def cancel(ctx: click.Context, job: str) -> None:
    """Remove the job's services and mark it cancelled; committed outputs stay."""
    removed = jobs_mod.cancel(_config(ctx), job)
    click.echo(f"job {job}: cancelled ({removed} running chunk service(s) removed); committed outputs kept")


import controller.cli_models  # noqa: E402,F401  (registers models verify|fetch)
import controller.cli_ops  # noqa: E402,F401  (registers render, serve, nodes, doctor)


def main() -> None:
    try:
        cli.main(standalone_mode=False)
    except click.exceptions.Abort:
        sys.exit(130)
    except click.ClickException as e:
        e.show()
        sys.exit(2 if isinstance(e, click.UsageError) else e.exit_code)
    except FfswarmError as e:
        click.echo(f"ffswarm: {e}", err=True)
        sys.exit(e.exit_code)
    except KeyboardInterrupt:
        click.echo("ffswarm: interrupted", err=True)
        sys.exit(130)


if __name__ == "__main__":
    main()
