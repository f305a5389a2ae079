"""``ffswarm models verify|fetch``: parsing only; the work is in controller/models.py."""

from __future__ import annotations

import sys

import click

from controller import models as models_mod
from controller.cli import context


@click.group()
def models() -> None:
    """Model packs under <data_root>/models/."""


@models.command()
@click.argument("pack", default="default")
@click.pass_context
def verify(ctx: click.Context, pack: str) -> None:
    """Check PACK's pack.yaml, every file's sha256, and each model's inputs/outputs for its role."""
    report = models_mod.verify(context.config(ctx).data_root / "models" / pack)
    click.echo("\n".join(report.lines()))
    sys.exit(0 if report.ok else 66)


@models.command()
@click.argument("pack")
@click.option("--from", "source", required=True, help="URL or folder holding pack.yaml and the model files.")
@click.pass_context
def fetch(ctx: click.Context, pack: str, source: str) -> None:
    """Download (resuming) or copy PACK, check every sha256, then install it in one swap."""
    target = models_mod.fetch(context.config(ctx).data_root / "models", pack, source, log=click.echo)
    click.echo(f"installed {target}")
