"""`ffswarm delete JOB`: a finished job's files removed (parsing only; controller/run/deletion.py)."""

from __future__ import annotations

import click

from controller.cli import context
from controller.run import deletion


@click.command()
@click.argument("job")
@click.option("--outputs", is_flag=True, help="Also remove the outputs the job wrote (a CLI job's stay without it).")
@click.pass_context
def delete(ctx: click.Context, job: str, outputs: bool) -> None:
    """Delete a finished job: its run folder and inbox done/failed file (and, with --outputs, the
    outputs it wrote). A tenant's job is deleted as DELETE /v1/jobs/{id} does it: its uploads,
    outputs, links and owner record too. Refused (exit 2) while the job is queued or running."""
    config = context.config(ctx)
    tenant = deletion.tenant_of(config, job)
    done = deletion.delete_job(config, job, tenant, outputs=outputs or tenant is not None)
    whose = f" (tenant {tenant})" if tenant else ""
    kept = f"; {len(done.kept)} output(s) kept (not this job's now)" if done.kept else ""
    click.echo(f"job {job}{whose}: deleted ({len(done.removed)} file(s) and folder(s) removed){kept}")
