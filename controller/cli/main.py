"""The root of the `ffswarm` command: global options, logging set up once, every command added here."""

from __future__ import annotations

import sys
import tomllib
from importlib import metadata
from pathlib import Path
from typing import Any

import click

from controller import log
from controller.cli import api, delete, jobs, models, ops, remote
from controller.cli.extras import missing_extra
from controller.cli.schema import schema
from controller.errors import FfswarmError


def version() -> str:
    """The installed distribution's version; from a checkout that is not installed, pyproject's."""
    try:
        return metadata.version("ffswarm")
    except metadata.PackageNotFoundError:
        pyproject = Path(__file__).resolve().parents[2] / "pyproject.toml"
        try:
            return str(tomllib.loads(pyproject.read_text())["project"]["version"])
        except (OSError, KeyError, tomllib.TOMLDecodeError):
            return "unknown"


def _print_version(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    if value and not ctx.resilient_parsing:
        click.echo(f"ffswarm {version()}")
        ctx.exit()


class _Root(click.Group):
    """The root group: a command that needs an extra that is not installed (pyproject's api, s3 …)
    ends with one line naming the extra, not a ModuleNotFoundError traceback."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except ModuleNotFoundError as e:
            missing = missing_extra(e, ctx.invoked_subcommand)
            if missing is None:
                raise
            raise missing from None

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        """With --api, the job commands' remote forms (controller/cli/remote.py)."""
        return remote.command(ctx, cmd_name) or super().get_command(ctx, cmd_name)


@click.group(cls=_Root)
@click.option(
    "--version",
    is_flag=True,
    expose_value=False,
    is_eager=True,
    callback=_print_version,
    help="Print ffswarm's version and exit.",
)
@click.option(
    "--config",
    "config_path",
    type=click.Path(dir_okay=False),
    default=None,
    help="Config file (else $FFSWARM_CONFIG, ./ffswarm.yaml, $XDG_CONFIG_HOME/ffswarm/config.yaml).",
)
@remote.options
@click.option("--json-logs/--console-logs", default=None, help="Log format (default: console on a terminal).")
@click.option("-v", "--verbose", is_flag=True, help="On a terminal, also print every chunk's events above the bar.")
@click.pass_context
def cli(ctx: click.Context, config_path: str | None, json_logs: bool | None, verbose: bool) -> None:
    """ffswarm: batch face swapping on a Docker Swarm of GPU machines."""
    console = log.setup(json_logs, verbose)  # the progress bar draws on it; None: JSON lines, no bar
    ctx.obj = {"config_path": config_path, "console": console}


@click.command()
@click.argument("shell", type=click.Choice(["bash", "zsh", "fish"]))
def completion(shell: str) -> None:
    """Print the shell's completion script (bash: eval "$(ffswarm completion bash)" in ~/.bashrc)."""
    from click.shell_completion import get_completion_class

    script = get_completion_class(shell)
    assert script is not None  # click knows the three shells the argument allows
    click.echo(script(cli, {}, "ffswarm", "_FFSWARM_COMPLETE").source(), nl=False)


# Every command, added here and nowhere else (`ffswarm --help` lists them by name).
cli.add_command(jobs.submit)
cli.add_command(jobs.resume)
cli.add_command(jobs.retry)
cli.add_command(jobs.status)
cli.add_command(jobs.logs)
cli.add_command(jobs.scale)
cli.add_command(jobs.cancel)
cli.add_command(delete.delete)
cli.add_command(ops.render)
cli.add_command(ops.serve)
cli.add_command(ops.nodes)
cli.add_command(ops.doctor)
cli.add_command(models.models)
cli.add_command(api.api)
cli.add_command(schema)
cli.add_command(remote.results)
cli.add_command(completion)


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
