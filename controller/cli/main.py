"""The root of the `ffswarm` command: global options, logging set up once, every command added here."""

from __future__ import annotations

import sys

import click

from controller import log
from controller.cli import api, jobs, models, ops
from controller.errors import FfswarmError


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


# Every command, added here and nowhere else (`ffswarm --help` lists them by name).
cli.add_command(jobs.submit)
cli.add_command(jobs.resume)
cli.add_command(jobs.retry)
cli.add_command(jobs.status)
cli.add_command(jobs.logs)
cli.add_command(jobs.scale)
cli.add_command(jobs.cancel)
cli.add_command(ops.render)
cli.add_command(ops.serve)
cli.add_command(ops.nodes)
cli.add_command(ops.doctor)
cli.add_command(models.models)
cli.add_command(api.api)


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
