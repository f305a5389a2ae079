"""The operators' commands: render, serve, nodes, doctor.

Added to the `cli` group by controller/cli/main.py, so the job commands and the ops commands share
one entry point and one config lookup. Parsing only: each command hands over to one module (render,
serve, gpuconfig, doctor, metrics).
"""

from __future__ import annotations

import dataclasses
import json
import re
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from contract.layout import DataRootLayout
from controller.cli import context
from controller.cli import output as out
from controller.cli.output import output_option
from controller.config import Config
from controller.doctor import Check, run_checks
from controller.errors import CapacityError, FfswarmError, UsageError
from controller.job.files import read_jobs
from controller.job.plan import ID
from controller.run import jobs as jobs_mod
from controller.run import usecase
from controller.run.fold import Fold
from controller.run.metrics import Metrics
from controller.run.rundir import RunDir
from controller.serve.daemon import Inbox, Server
from controller.settings.fields import FieldError, parse_duration
from controller.swarm import render as render_mod
from controller.swarm.admin import SwarmAdmin
from controller.swarm.backend import NodeInfo
from controller.swarm.docker import DockerSwarm
from controller.swarm.gpuconfig import GPU_KIND, daemon_json, gpus_from_list, parse_nvidia_smi, runtime_toml_line
from controller.swarm.gpuconfig import render as render_gpu_config
from controller.swarm.servicespec import RUNNER_NETWORK, ServiceSpec, chunk_service


def _emit(text: str, out: Path | None) -> None:
    if out is None:
        click.echo(text, nl=False)
    else:
        out.write_text(text)
        click.echo(f"wrote {out}", err=True)


# -- render -------------------------------------------------------------------------------------------
def job_services(
    config: Config, ref: str, attempt: int, swarm: Callable[[], DockerSwarm] | None = None
) -> list[ServiceSpec]:
    """Chunk services of a job still to do: REF is a job id with a run folder, or a job file.

    A job file is prepared as `submit` would (validated, planned, run folder created if absent) so
    that the stack's runners find their manifests; nothing is started.
    """
    backend = swarm or jobs_mod.once(lambda: DockerSwarm(config.docker_host))  # the command's one backend
    path = Path(ref)
    if path.is_file():
        found, _ = read_jobs([path], config.policy.limits.job_file)  # its errors: from render_ready, in full
        tenant = jobs_mod.run_tenant(config, found[0][1].name) if len(found) == 1 else None
        prepared, rundir, image = usecase.render_ready(config, backend(), path, tenant)
    else:
        if not ID.fullmatch(ref):  # a job id names a folder under runs/: nothing else may
            raise UsageError(f"{ref!r} is neither a job file nor a job id (a-z, 0-9 and - only)")
        rundir = RunDir(config.data_root, ref)
        if not rundir.exists():
            raise UsageError(
                f"{ref!r} is neither a job file nor a job with a run folder under {config.data_root / 'runs'}"
            )
        tenant = jobs_mod.run_tenant(config, ref)  # an API job is resolved inside its tenant's area, as serve did
        prepared = dataclasses.replace(
            jobs_mod.prepare(config, [rundir.layout.job_file], new=False, swarm=backend, tenant=tenant)[0], job_id=ref
        )
        image = rundir.image()
    settings = jobs_mod.runner_settings(config, prepared, image)
    pending = Fold.read(rundir.plan(), rundir).pending_chunks()
    if pending:  # the stack names the runners' network as external: it (and its anchor) must exist
        try:
            backend().ensure_network(RUNNER_NETWORK, image, settings.user)
        except FfswarmError as e:
            click.echo(f"warning: {e}; network {RUNNER_NETWORK} must exist before the stack is deployed", err=True)
    return [chunk_service(settings, c, attempt) for c in pending]


@click.command()
@click.argument("job", required=False)
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path), help="Write here (default stdout).")
@click.option("--attempt", type=click.IntRange(min=1), default=1, show_default=True, help="Attempt number in names.")
@click.option("--stack", default=render_mod.DEFAULT_STACK, show_default=True, help="Stack name the file is meant for.")
@click.option("--controller", "controller_stack", is_flag=True, help="Render the controller stack instead.")
@click.option(
    "--image",
    default=None,
    help="Controller stack: image (default: the config's controller_image, else its image; resolved to an ID).",
)
@click.option("--concurrent-jobs", type=click.IntRange(min=1), default=1, show_default=True)
@click.option(
    "--metrics-port", type=click.IntRange(1, 65535), default=render_mod.DEFAULT_METRICS_PORT, show_default=True
)
@click.option("--inbox", default=None, help="Controller stack: inbox folder (default <data_root>/inbox).")
@click.option(
    "--api-port",
    type=click.IntRange(1, 65535),
    default=render_mod.DEFAULT_API_PORT,
    show_default=True,
    help="Controller stack with tenants: port the api service is published on.",
)
@click.option("--api-replicas", type=click.IntRange(min=1), default=render_mod.DEFAULT_API_REPLICAS, show_default=True)
@click.option("--api-user", default=None, metavar="UID:GID", help="The api service's user (default: controller_user).")
@click.pass_context
def render(
    ctx: click.Context,
    job: str | None,
    output: Path | None,
    attempt: int,
    stack: str,
    controller_stack: bool,
    image: str | None,
    concurrent_jobs: int,
    metrics_port: int,
    inbox: str | None,
    api_port: int,
    api_replicas: int,
    api_user: str | None,
) -> None:
    """Compose file for `docker stack deploy`: JOB's chunk services (a job id or a job file), or --controller."""
    config = context.config(ctx)
    if controller_stack == bool(job):
        raise UsageError("render takes either JOB or --controller")
    if job:
        try:
            services = job_services(config, job, attempt, lambda: context.backend(ctx))
            text = render_mod.render_runner_stack(services, attempt, stack)
        except ValueError as e:
            raise UsageError(str(e)) from e
        _emit(text, output)
        return
    spec = render_mod.ControllerStack(
        image=context.backend(ctx).resolve_image(image or config.controller_image or config.image),
        config_file=config.path.resolve(),
        config_text=config.path.read_text(),
        data_root=str(config.data_root),
        volume=config.volume,
        concurrent_jobs=concurrent_jobs,
        metrics_port=metrics_port,
        inbox=inbox,
        api=_api_service(config, api_port, api_replicas, api_user),
        secrets=_serve_secrets(config),
    )
    _emit(render_mod.render_controller_stack(spec), output)


def _serve_secrets(config: Config) -> tuple[str, ...]:
    """The key files `serve` reads, as Swarm secrets: webhook signing keys (the cluster's and each
    tenant's), the link key a tenant's webhook carries a results link with, object-store credentials."""
    named = [config.policy.webhooks.secret_file, config.api.signing_key_file]
    named += [t.webhooks.secret_file for t in config.tenants.values()]
    try:
        return render_mod.api_secrets([p for p in named if p is not None] + _store_key_files(config))
    except ValueError as e:
        raise UsageError(str(e)) from None


def _store_key_files(config: Config) -> list[Path]:
    """The object store's credentials files (the cluster's and tenants' own): serve lists, probes and
    joins with them, the API checks a tenant's s3:// job at submit and signs its links with them."""
    if config.storage.s3 is None:
        return []
    own = [Path(t.s3.credentials_file) for t in config.tenants.values() if t.s3 and t.s3.credentials_file]
    return [config.storage.s3.credentials_file, *own]


def _api_service(config: Config, port: int, replicas: int, user: str | None) -> render_mod.ApiService | None:
    """The controller stack's api service: only when the config has tenants (docs/api.md#config)."""
    if not config.tenants:
        return None
    if user is not None and not re.fullmatch(r"[1-9]\d{0,9}:[1-9]\d{0,9}", user):
        raise UsageError(f"--api-user {user!r}: a non-root UID:GID (neither 0)")
    ids = tuple(map(int, user.split(":"))) if user else config.controller_user
    if ids is None:
        raise UsageError(
            f"{config.path}: the api service runs as controller_user, never root: set controller_user "
            "(docs/operations.md#controller-user) or give --api-user UID:GID"
        )
    jwt = config.api.jwt
    named = (config.api.signing_key_file, *config.api.previous_signing_key_files, jwt.key_file if jwt else None)
    keys = [p for p in named if p is not None] + _store_key_files(config)
    try:
        return render_mod.ApiService((ids[0], ids[1]), port, replicas, render_mod.api_secrets(keys))
    except ValueError as e:
        raise UsageError(str(e)) from None


# -- serve --------------------------------------------------------------------------------------------
@click.command()
@click.option("--inbox", type=click.Path(file_okay=False, path_type=Path), help="Default: <data_root>/inbox.")
@click.option(
    "--concurrent-jobs", type=click.IntRange(min=1), default=1, show_default=True, envvar="FFSWARM_CONCURRENT_JOBS"
)
@click.option(
    "--metrics-port",
    type=click.IntRange(0, 65535),
    default=render_mod.DEFAULT_METRICS_PORT,
    show_default=True,
    help="0: no endpoint.",
)
@click.option(
    "--metrics-addr", default="127.0.0.1", show_default=True, help="Address /metrics listens on; 0.0.0.0 to widen."
)
@click.option("--poll", type=click.FloatRange(min=0.1), default=1.0, show_default=True, help="Inbox poll seconds.")
@click.pass_context
def serve(
    ctx: click.Context, inbox: Path | None, concurrent_jobs: int, metrics_port: int, metrics_addr: str, poll: float
) -> None:
    """Run job files dropped in the inbox; move each to done/ or failed/ (+ .reason.txt)."""
    config = context.config(ctx)
    context.backend(ctx).check_manager()
    metrics = Metrics()
    http = metrics.serve_http(metrics_port, metrics_addr) if metrics_port else None
    server = Server(config, Inbox(inbox or DataRootLayout.host(config.data_root).inbox), metrics, concurrent_jobs, poll)
    signal.signal(signal.SIGTERM, lambda *_: server.shutdown())
    try:
        server.serve_forever()
    finally:
        if http is not None:
            http.shutdown()


# -- nodes --------------------------------------------------------------------------------------------
@click.group()
def nodes() -> None:
    """GPU node set-up: daemon config from nvidia-smi, node labels."""


@nodes.command("gpu-config")
@click.option("--from", "source", type=click.File("r"), help="`nvidia-smi -L` output (default: stdin).")
@click.option("--gpus", help="Comma-separated GPU UUIDs instead of nvidia-smi output.")
@click.option("--kind", default=GPU_KIND, show_default=True, help="Generic resource kind (no hyphen).")
@click.option(
    "--out-dir",
    type=click.Path(file_okay=False, path_type=Path),
    help="Write daemon.json and nvidia-runtime.toml here.",
)
def gpu_config(source: Any, gpus: str | None, kind: str, out_dir: Path | None) -> None:
    """daemon.json (nvidia runtime, node-generic-resources) and the runtime's swarm-resource line."""
    if gpus and source:
        raise UsageError("give --from or --gpus, not both")
    if not kind.replace("_", "").isalnum():
        raise UsageError(f"--kind {kind!r}: letters, digits and _ only (sh drops env names with '-')")
    if gpus:
        found = gpus_from_list(gpus.split(","))
    else:
        stream = source or sys.stdin
        if stream.isatty():
            raise UsageError("pipe `nvidia-smi -L` in, or use --from FILE or --gpus UUID,…")
        found = parse_nvidia_smi(stream.read())
    if out_dir is None:
        click.echo(render_gpu_config(found, kind), nl=False)
        return
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "daemon.json").write_text(json.dumps(daemon_json(found, kind), indent=2) + "\n")
    (out_dir / "nvidia-runtime.toml").write_text(runtime_toml_line(kind) + "\n")
    click.echo(f"wrote {out_dir / 'daemon.json'} ({len(found)} GPUs) and {out_dir / 'nvidia-runtime.toml'}")


@nodes.command("label")
@click.argument("node")
@click.argument("labels", nargs=-1)
@click.option("--remove", multiple=True, help="Label key to remove (repeatable).")
@click.pass_context
def label(ctx: click.Context, node: str, labels: tuple[str, ...], remove: tuple[str, ...]) -> None:
    """Set node labels (default ffswarm.gpu=true); NODE is a hostname or node id."""
    if not labels and not remove:
        labels = ("ffswarm.gpu=true",)
    pairs = [x.partition("=") for x in labels]
    bad = [k for k, eq, _ in pairs if not eq or not k]
    if bad:
        raise UsageError(f"labels are KEY=VALUE, got {bad[0]!r}")
    info = SwarmAdmin(context.config(ctx).docker_host).update_node_labels(node, {k: v for k, _, v in pairs}, remove)
    click.echo(
        f"{info.hostname} ({info.node_id[:12]}): " + " ".join(f"{k}={v}" for k, v in sorted(info.labels.items()))
    )


@nodes.command("ls")
@output_option
@click.pass_context
def nodes_ls(ctx: click.Context, output: str) -> None:
    """Nodes with their role, state, labels and advertised generic resources."""
    infos = SwarmAdmin(context.config(ctx).docker_host).node_infos()
    if output != "text":
        out.echo({"nodes": [node_data(n) for n in infos]}, output)
        return
    for n in infos:
        res = " ".join(f"{k}×{v}" for k, v in sorted(n.generic_resources.items())) or "-"
        labels = " ".join(f"{k}={v}" for k, v in sorted(n.labels.items())) or "-"
        click.echo(f"{n.hostname}\t{n.node_id[:12]}\t{n.role}\t{n.state}/{n.availability}\t{res}\t{labels}")


@nodes.command("sweep")
@click.option("--older-than", default="1h", show_default=True, help="Only containers that ended this long ago.")
@click.option("--docker-host", metavar="URL", help="This node's engine (default: DOCKER_HOST, else the local socket).")
@click.option("--dry-run", is_flag=True, help="Name what would go; remove nothing.")
@output_option
def sweep(older_than: str, docker_host: str | None, dry_run: bool, output: str) -> None:
    """Remove this node's ended job containers that its engine kept (run on every node, e.g. from the
    timer swarm/gpu-node.sh installs; needs no config). The swarm removes them itself, except on an
    engine restarted while it was doing so (docs/failures.md#engine-restarts)."""
    try:
        age = parse_duration(older_than, "--older-than")
    except FieldError as e:
        raise UsageError(str(e)) from None
    removed, kept = SwarmAdmin(docker_host).sweep_ended_job_containers(age, time.time(), dry_run)
    if output != "text":
        rows = [{"id": c.container_id, "name": c.name, "job": c.job, "finished_at": c.finished_at} for c in removed]
        out.echo({"removed" if not dry_run else "would_remove": rows, "kept": len(kept)}, output)
        return
    verb = "would remove" if dry_run else "removed"
    for c in removed:
        click.echo(f"{verb} {c.name} ({c.container_id}, job {c.job or '?'})")
    click.echo(f"{verb} {len(removed)} ended job container(s); {len(kept)} ended less than {older_than} ago kept")


def node_data(n: NodeInfo) -> dict[str, Any]:
    """A node as `nodes ls -o json|yaml` prints it."""
    return {
        "id": n.node_id,
        "hostname": n.hostname,
        "role": n.role,
        "state": n.state,
        "availability": n.availability,
        "generic_resources": dict(sorted(n.generic_resources.items())),
        "labels": dict(sorted(n.labels.items())),
    }


# -- doctor -------------------------------------------------------------------------------------------
@click.command()
@click.option("--models", default="default", show_default=True, help="Model pack to verify.")
@click.option(
    "--store", metavar="S3_URL", help="Also probe what storage.s3 honours, on scratch keys under s3://BUCKET/PREFIX/."
)
@output_option
@click.pass_context
def doctor(ctx: click.Context, models: str, store: str | None, output: str) -> None:
    """Check the cluster can run jobs; each failing check names its fix, and so does a warning (a
    check that passes but names a risk). Exit 0 only when all pass.

    With -o json|yaml: {"ok": bool, "checks": [{"name", "ok", "detail", "fix", "warning"}]} once all
    have run (the exit code as without)."""
    say = (lambda c: click.echo(c.line())) if output == "text" else (lambda c: None)
    checks = run_checks(context.config(ctx), models, say=say, store=store)
    failed: list[Check] = [c for c in checks if not c.ok]
    if output != "text":
        out.echo({"ok": not failed, "checks": [dataclasses.asdict(c) for c in checks]}, output)
    if failed:
        raise CapacityError(f"{len(failed)} check(s) failed: {', '.join(c.name for c in failed)}")
    if output == "text":
        warned = [c.name for c in checks if c.warning]
        click.echo("all checks passed" + (f"; warning(s): {', '.join(warned)}" if warned else ""))
