"""The `ffswarm` command: parsing only; each command calls one function."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import click

from controller import jobs as jobs_mod
from controller import log
from controller.config import load_config
from controller.errors import FfswarmError, Interrupted, UsageError
from controller.progress import Progress
from controller.rundir import Control, RunDir


@click.group()
@click.option(
    "--config",
    "config_path",
    type=click.Path(dir_okay=False),
    default=None,
    help="Config file (else $FFSWARM_CONFIG, ./ffswarm.yaml, ~/.config/ffswarm/config.yaml).",
)
@click.option("--json-logs/--console-logs", default=None, help="Log format (default: console on a terminal).")
@click.pass_context
def cli(ctx: click.Context, config_path: str | None, json_logs: bool | None) -> None:
    """ffswarm: batch face swapping on a Docker Swarm of GPU machines."""
    log.setup(json_logs)
    ctx.obj = {"config_path": config_path}


def _config(ctx: click.Context) -> Any:
    return load_config(ctx.obj["config_path"])


@cli.command()
@click.argument("paths", nargs=-1, required=True, type=click.Path(exists=True, path_type=Path))
@click.option("--dry-run", is_flag=True, help="Print the plan and the services; create nothing.")
@click.option("--new", is_flag=True, help="Start a new run (job id name-2, -3 …) instead of continuing one.")
@click.pass_context
def submit(ctx: click.Context, paths: tuple[Path, ...], dry_run: bool, new: bool) -> None:
    """Validate job files (or folders of them), plan, and run every chunk as a one-shot service."""
    config = _config(ctx)
    prepared = jobs_mod.prepare(config, list(paths), new)
    if dry_run:
        click.echo(json.dumps(jobs_mod.dry_run(config, prepared, _image_lookup(config)), indent=1))
        return
    progress: dict[str, Progress] = {}

    def make_progress(rundir: RunDir, total: int) -> Progress:
        progress[rundir.job] = Progress(rundir, total)
        return progress[rundir.job]

    try:
        code, reports = jobs_mod.submit(config, prepared, make_progress)
    except KeyboardInterrupt:
        names = " ".join(j.job_id for j in prepared)
        raise Interrupted(
            f"detached; chunk services keep running. Continue with: ffswarm submit {' '.join(map(str, paths))}"
            f" (job {names})"
        ) from None
    finally:
        for p in progress.values():
            p.close()
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
    click.echo(f"  report: {root / 'runs' / report['job'] / 'report.json'}")


@cli.command()
@click.argument("job", required=False)
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def status(ctx: click.Context, job: str | None, as_json: bool) -> None:
    """Jobs and how far they got (from their run folders)."""
    config = _config(ctx)
    runs = config.data_root / "runs"
    names = (
        [job] if job else sorted(p.name for p in runs.iterdir() if (p / "plan.json").is_file()) if runs.is_dir() else []
    )
    out = []
    for name in names:
        rundir = RunDir(config.data_root, name)
        if not rundir.exists():
            raise UsageError(f"no job {name!r} under {runs}")
        plan = rundir.plan()
        done = failed = 0
        for chunk in plan.chunks:
            for r in rundir.latest_results(chunk.id).values():
                failed += r.status.is_failure()
                done += not r.status.is_failure()
        report = rundir.report()
        out.append(
            {
                "job": name,
                "items": len(plan.items),
                "done": done,
                "failed": failed,
                "chunks": len(plan.chunks),
                "finished": report is not None,
                "control": rundir.control().__dict__,
            }
        )
    if as_json:
        click.echo(json.dumps(out, indent=1))
    else:
        for j in out:
            state = "finished" if j["finished"] else "in progress"
            click.echo(
                f"{j['job']}: {state}; {j['done']}/{j['items']} items done, {j['failed']} failed, {j['chunks']} chunks"
            )


@cli.command()
@click.argument("job")
@click.option("--chunk", default=None, help="Only this chunk (e.g. c0003).")
@click.pass_context
def logs(ctx: click.Context, job: str, chunk: str | None) -> None:
    """Runner logs of a job, from its run folder."""
    rundir = RunDir(_config(ctx).data_root, job)
    files = sorted((rundir.path / "logs").glob(f"{chunk or '*'}.a*.log"))
    if not files:
        raise UsageError(f"no runner logs for job {job!r}" + (f" chunk {chunk}" if chunk else ""))
    for f in files:
        click.echo(f"==> {f.name} <==")
        click.echo(f.read_text(), nl=False)


@cli.command()
@click.argument("job")
@click.argument("n", type=click.IntRange(min=1))
@click.pass_context
def scale(ctx: click.Context, job: str, n: int) -> None:
    """Change how many chunk services of a running job may exist at once."""
    _set_control(ctx, job, max_concurrent=n)
    click.echo(f"job {job}: max_concurrent = {n}")


@cli.command()
@click.argument("job")
@click.pass_context
def cancel(ctx: click.Context, job: str) -> None:
    """Ask the job's controller to remove its services; committed outputs stay."""
    _set_control(ctx, job, cancel=True)
    click.echo(f"job {job}: cancel requested")


def _set_control(ctx: click.Context, job: str, **change: Any) -> None:
    config = _config(ctx)
    rundir = RunDir(config.data_root, job, _owner_of(config))
    if not rundir.exists():
        raise UsageError(f"no job {job!r} under {config.data_root / 'runs'}")
    current = rundir.control()
    rundir.write_control(
        Control(
            max_concurrent=change.get("max_concurrent", current.max_concurrent),
            cancel=change.get("cancel", current.cancel),
        )
    )


def _owner_of(config: Any) -> tuple[int, int]:
    uid, gid = config.runner_uid_gid().split(":")
    return int(uid), int(gid)


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
