"""`ffswarm schema job`: the job file's JSON Schema, for editors and generated clients (parsing only;
controller/job/schema.py). Needs no config, data root or Docker."""

from __future__ import annotations

import json

import click

from controller.job.schema import job_schema, key_table


@click.group()
def schema() -> None:
    """Print the schemas of ffswarm's files."""


@schema.command()
@click.option("--request", is_flag=True, help="The API's JSON body (POST /v1/jobs): name and output may be left out.")
@click.option("--table", is_flag=True, help="The key table of docs/job-file.md (Markdown) instead of the schema.")
def job(request: bool, table: bool) -> None:
    """Print the job file's JSON Schema (draft 2020-12). Save it and point an editor at it, e.g. a first
    line `# yaml-language-server: $schema=job.schema.json` in a job file (docs/job-file.md)."""
    if table:
        click.echo(key_table(), nl=False)
        return
    click.echo(json.dumps(job_schema(request=request), indent=2, ensure_ascii=False))
