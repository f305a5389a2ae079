"""What the root group hands its commands (click's context object): the config file's location and
the console the progress bar draws on (None: JSON log lines, no bar)."""

from __future__ import annotations

import click
from rich.console import Console

from controller.config import Config, load_config


def config(ctx: click.Context) -> Config:
    """The cluster config, found as the root's --config (or the usual places) says."""
    return load_config(ctx.find_root().obj["config_path"])


def console(ctx: click.Context) -> Console | None:
    console: Console | None = ctx.find_root().obj.get("console")
    return console
