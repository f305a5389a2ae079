"""``ffswarm models list|verify|fetch``: parsing only; the work is in controller/models.py."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import click

from contract.errors import PackError
from contract.layout import DataRootLayout
from controller import models as models_mod
from controller.cli import context
from controller.cli import output as out
from controller.cli.output import output_option
from controller.errors import MissingInputError

STANDIN_NOTE = "the STAND-IN test pack: not real face swaps (real packs: docs/operations.md#models)"


@click.group()
def models() -> None:
    """Model packs under <data_root>/models/."""


def is_standin(pack_dir: Path) -> bool:
    """Whether pack.yaml says ``standin: true`` (the test pack scripts/dev-swarm.sh installs)."""
    try:
        return bool(models_mod.read_spec(pack_dir).get("standin"))
    except PackError:
        return False


def installed(models_dir: Path) -> list[str]:
    """The packs under models/: folders holding a pack.yaml."""
    if not models_dir.is_dir():
        return []
    return sorted(p.name for p in models_dir.iterdir() if p.is_dir() and (p / "pack.yaml").is_file())


@models.command("list")
@output_option
@click.pass_context
def list_packs(ctx: click.Context, output: str) -> None:
    """The packs installed under models/ (-o json|yaml: {"packs": [{"name", "standin"}]})."""
    models_dir = DataRootLayout.host(context.config(ctx).data_root).models
    packs = [{"name": name, "standin": is_standin(models_dir / name)} for name in installed(models_dir)]
    if output != "text":
        out.echo({"packs": packs}, output)
        return
    if not packs:
        click.echo(f"no packs under {models_dir}; `ffswarm models fetch NAME --from …` installs one")
    for p in packs:
        click.echo(f"{p['name']}" + (f" — {STANDIN_NOTE}" if p["standin"] else ""))


@models.command()
@click.argument("pack", default="default")
@output_option
@click.pass_context
def verify(ctx: click.Context, pack: str, output: str) -> None:
    """Check PACK's pack.yaml, every file's sha256, and each model's inputs/outputs for its role.

    Exit 0 when all is well, 66 when not; -o json|yaml: {"pack", "ok", "standin", "files", "problems"}."""
    models_dir = DataRootLayout.host(context.config(ctx).data_root).models
    if pack not in installed(models_dir):
        found = ", ".join(installed(models_dir)) or "none"
        raise MissingInputError(
            f"no pack {pack!r} under models/ (installed: {found}); `ffswarm models fetch {pack} --from …` installs one"
        )
    report = models_mod.verify(models_dir / pack)
    if output != "text":
        files = [dataclasses.asdict(f) for f in report.files]
        standin = is_standin(models_dir / pack)
        out.echo(
            {"pack": pack, "ok": report.ok, "standin": standin, "files": files, "problems": report.problems}, output
        )
        sys.exit(0 if report.ok else 66)
    lines = report.lines()
    if report.ok and is_standin(models_dir / pack):
        lines[0] += f" — {STANDIN_NOTE}"
    click.echo("\n".join(lines))
    sys.exit(0 if report.ok else 66)


@models.command()
@click.argument("pack")
@click.option("--from", "source", required=True, help="https URL or folder holding pack.yaml and the model files.")
@click.option("--pack-sha256", "pack_sha256", metavar="HEX", help="Pin the source's pack.yaml (its sha256).")
@click.option("--allow-http", is_flag=True, help="Allow an http:// source (a trusted network only).")
@click.pass_context
def fetch(ctx: click.Context, pack: str, source: str, pack_sha256: str | None, allow_http: bool) -> None:
    """Download (resuming) or copy PACK, check every sha256, then install it in one swap."""
    root = DataRootLayout.host(context.config(ctx).data_root).models
    target = models_mod.fetch(root, pack, source, log=click.echo, allow_http=allow_http, pack_sha256=pack_sha256)
    click.echo(f"installed {target}")
