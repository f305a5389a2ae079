"""`ffswarm api`: parsing only; the server is controller/api/app.py (imported when the command runs,
so other commands never load a web framework)."""

from __future__ import annotations

import click

from controller.apiconfig import MAX_WORKERS, parse_listen
from controller.cli import context
from controller.errors import UsageError
from controller.settings.fields import FieldError


@click.command()
@click.option(
    "--listen", default=None, metavar="HOST:PORT", help="Address to serve on (default: api.listen, 127.0.0.1:8080)."
)
@click.option(
    "--workers", type=click.IntRange(1, MAX_WORKERS), default=None, metavar="N",
    help="API processes sharing the address (default: api.workers, 1); about one per core.",
)  # fmt: skip
@click.pass_context
def api(ctx: click.Context, listen: str | None, workers: int | None) -> None:
    """Serve the HTTP API for tenants (docs/api.md); jobs it accepts go to the inbox `serve` watches."""
    from controller.api.app import serve  # first: without the "api" extra, that is all there is to say

    config = context.config(ctx)
    try:
        host, port = parse_listen(listen or config.api.listen, "--listen")
    except FieldError as e:
        raise UsageError(str(e)) from None
    if not config.tenants:
        raise UsageError(f"{config.path}: no tenants: add a tenants: section (docs/api.md#config)")
    n = workers or config.api.workers
    procs = f" with {n} workers" if n > 1 else ""
    click.echo(f"ffswarm api: serving {len(config.tenants)} tenant(s) on http://{host}:{port}{procs}", err=True)
    serve(config, host, port, n)
