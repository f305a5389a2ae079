"""What the root group hands its commands (click's context object): the config file's location, the
console the progress bar draws on (None: JSON log lines, no bar), and the command's one Swarm
backend, built the first time a command asks for it (a dry run, `status` or `logs` never do, so they
work without Docker)."""

from __future__ import annotations

import click
from rich.console import Console

from controller.config import Config, find_config, load_config
from controller.errors import ConfigError
from controller.swarm.docker import DockerSwarm


def config(ctx: click.Context) -> Config:
    """The cluster config, found as the root's --config (or the usual places) says (exit 78 if none)."""
    root = ctx.find_root().obj
    cached: Config | None = root.get("config")
    if cached is not None:
        return cached
    explicit = root["config_path"]
    try:
        path = find_config(explicit)
    except ConfigError as e:
        where = (
            "pass an existing file" if explicit else "export FFSWARM_CONFIG=/path/to/ffswarm.yaml (or pass --config)"
        )
        raise ConfigError(f"{e}; {where}") from None
    root["config"] = load_config(str(path))
    return root["config"]  # type: ignore[no-any-return]


def console(ctx: click.Context) -> Console | None:
    console: Console | None = ctx.find_root().obj.get("console")
    return console


def backend(ctx: click.Context) -> DockerSwarm:
    """The command's one Swarm backend (a Docker connection), made on first use and passed down."""
    root = ctx.find_root().obj
    made: DockerSwarm | None = root.get("backend")
    if made is None:
        made = DockerSwarm(config(ctx).docker_host)
        root["backend"] = made
    return made
