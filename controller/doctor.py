"""`ffswarm doctor`: is this cluster able to run a job? Each check names its fix.

A new GPU node that is half set up (no label, no generic resources, no image, an NFS mount that
root_squash makes read-only) fails jobs in ways that are slow to diagnose from a chunk's log. Doctor
asks the same questions up front, with the same means the jobs use: the volume and model pack are
checked by a one-shot probe service built by `servicespec.chunk_service` (the same VolumeSpec,
user, read-only root, dropped capabilities as a chunk) on every GPU node, and the pack is verified
inside it by the runner's own `verify_pack`, so the answer is the one a chunk would get.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass

from controller.config import Config, cluster_keys_fix
from controller.errors import FfswarmError
from controller.run import stores
from controller.run.oneshot import run_oneshot
from controller.swarm.admin import SwarmAdmin
from controller.swarm.backend import ImageInfo, NodeInfo
from controller.swarm.servicespec import ANCHOR_SERVICE, RUNNER_COMMAND, RUNNER_NETWORK, RunnerSettings, chunk_service

GPU_LABEL = ("ffswarm.gpu", "true")
GPU_KIND = "GPU"
MAX_HEARTBEAT_SECONDS = 2.0
PROBE_MEMORY = 1 << 30
PROBE_TIMEOUT = 120.0
PROBE_MARK = "FFSWARM-DOCTOR "
SBOM_LABEL = "io.ffswarm.sbom.sha256"  # scripts/build-runner-image.sh: sha256 of the image's /opt/ffswarm/sbom.cdx.json
# Runs in the runner image as the runner user: write a file the controller must then see, and verify
# the model pack with the runner's own code. Prints one JSON line; the controller reads service logs.
PROBE_SCRIPT = """
import json, pathlib, sys
out = {}
try:
    pathlib.Path(sys.argv[1]).write_text(sys.argv[2]); out["write"] = "ok"
except OSError as e:
    out["write"] = f"{type(e).__name__}: {e}"
try:
    from runner_image.models import verify_pack
    verify_pack(pathlib.Path(sys.argv[3])); out["pack"] = "ok"
except Exception as e:
    out["pack"] = f"{type(e).__name__}: {e}"
print("FFSWARM-DOCTOR " + json.dumps(out), flush=True)
"""


@dataclass(frozen=True)
class Check:
    """One answer. A ``warning`` passes (jobs run, doctor exits 0) but names a risk and its fix."""

    name: str
    ok: bool
    detail: str
    fix: str = ""
    warning: bool = False

    def __post_init__(self) -> None:
        if self.warning and not self.ok:
            raise ValueError("a warning is a check that passes; a failing check is a failure")

    def line(self) -> str:
        head = f"[{'FAIL' if not self.ok else 'warn' if self.warning else 'ok'}] {self.name}: {self.detail}"
        return f"{head}\n       fix: {self.fix}" if not self.ok or self.warning else head


def _ok(name: str, detail: str) -> Check:
    return Check(name, True, detail)


def check_swarm(admin: SwarmAdmin) -> Check:
    info = admin.swarm_info()
    if not info.active:
        return Check("swarm", False, "this engine is not in an active swarm", "docker swarm init (or join)")
    if not info.manager:
        return Check("swarm", False, "this engine is a worker", "run ffswarm on a manager node")
    return _ok("swarm", f"active; this node ({info.node_id[:12]}) is a manager")


def gpu_nodes(admin: SwarmAdmin) -> list[NodeInfo]:
    key, value = GPU_LABEL
    return [n for n in admin.node_infos() if n.labels.get(key) == value]


def check_gpu_nodes(nodes: list[NodeInfo], all_nodes: list[NodeInfo]) -> Check:
    name = "gpu-nodes"
    label = "=".join(GPU_LABEL)
    if not nodes:
        hosts = ", ".join(n.hostname for n in all_nodes) or "none"
        return Check(
            name, False, f"no node carries the label {label} (nodes: {hosts})", f"ffswarm nodes label NODE {label}"
        )
    bad = [n for n in nodes if n.generic_resources.get(GPU_KIND, 0) < 1]
    if bad:
        return Check(
            name,
            False,
            f"labelled node(s) advertise no {GPU_KIND} generic resource: {', '.join(n.hostname for n in bad)}",
            "nvidia-smi -L | ffswarm nodes gpu-config > daemon.json on that node, install it, restart dockerd",
        )
    down = [n for n in nodes if n.state != "ready" or n.availability != "active"]
    if down:
        what = ", ".join(f"{n.hostname} ({n.state}, {n.availability})" for n in down)
        return Check(
            name,
            False,
            f"GPU node(s) not ready/active: {what}",
            "docker node update --availability active NODE; check dockerd there",
        )
    total = sum(n.generic_resources[GPU_KIND] for n in nodes)
    return _ok(name, f"{len(nodes)} node(s) labelled {label}, {total} GPU(s) advertised")


def describe_image(ref: str, info: ImageInfo) -> str:
    """What nodes will run and pull: the image's ID, size and SBOM digest (docs/operations.md#the-runner-image)."""
    sbom = info.labels.get(SBOM_LABEL)
    contents = f"SBOM sha256 {sbom[:16]}…" if sbom else "no SBOM label (an image built before the labels)"
    return f"{ref} present: {info.image_id[:19]}, {info.size_bytes / 1e6:.0f} MB, {contents}"


def check_image(admin: SwarmAdmin, ref: str) -> tuple[Check, str | None]:
    """Present on this manager (a digest reference may also be pulled by nodes). Nodes: the probe."""
    info = admin.image_info(ref)
    if info is None and "@sha256:" in ref:
        return _ok("image", f"{ref}: not on this manager; nodes pull it by digest"), ref
    if info is None:
        return (
            Check(
                "image",
                False,
                f"runner image {ref} is not present on this manager",
                f"build it (scripts/build-runner-image.sh {ref}) or docker pull it, on every GPU node; "
                "or set image: in the config",
            ),
            None,
        )
    return _ok("image", describe_image(ref, info)), ref if "@sha256:" in ref else info.image_id


def probe_node(admin: SwarmAdmin, config: Config, node: NodeInfo, image: str, pack: str) -> dict[str, str]:
    """One probe service on `node`, shaped like a chunk service; its findings, or why it did not run."""
    token = uuid.uuid4().hex[:10]
    name = f"probe-{token}.txt"
    settings = RunnerSettings(
        job=f"doctor-{token}",
        image=image,
        constraints=(f"node.id=={node.node_id}",),
        gpu_kind=GPU_KIND,
        gpus=0,  # a probe must not wait for a free GPU
        memory_bytes=PROBE_MEMORY,
        volume=config.volume,
        user=config.runner_uid_gid(),
        command=(RUNNER_COMMAND[0], "-c", PROBE_SCRIPT, f"/data/.ffswarm-{name}", token, f"/data/models/{pack}"),
        nano_cpus=config.policy.limits.cpus * 10**9,  # built like a chunk service, limits included
    )
    spec = chunk_service(settings, "probe", 1)
    seen = config.data_root / f".ffswarm-{name}"
    outcome = run_oneshot(admin, spec, timeout=PROBE_TIMEOUT, schedule_timeout=PROBE_TIMEOUT)
    logs = outcome.logs
    found: dict[str, str] = {
        "task": "not scheduled in time" if outcome.state == "unscheduled" else f"{outcome.state}: {outcome.message}"
    }
    for line in logs.splitlines():
        if PROBE_MARK in line:
            found.update(json.loads(line.split(PROBE_MARK, 1)[1]))
    try:
        found["seen"] = "ok" if seen.read_text() == token else "wrong content"
        seen.unlink()
    except OSError as e:
        found["seen"] = f"{type(e).__name__}: {e.strerror or e}"
    return found


def check_probes(results: dict[str, dict[str, str]], config: Config, pack: str) -> list[Check]:
    vol_bad: list[str] = []
    pack_bad: list[str] = []
    img_bad: list[str] = []
    for host, r in results.items():
        task = r.get("task", "")
        if "write" not in r:  # the container never ran our script
            (img_bad if "image" in task.lower() else vol_bad).append(f"{host}: {task}")
            continue
        if r["write"] != "ok" or r.get("seen") != "ok":
            vol_bad.append(f"{host}: written in the container: {r['write']}; seen by the controller: {r.get('seen')}")
        if r.get("pack") != "ok":
            pack_bad.append(f"{host}: {r.get('pack')}")
    user = config.runner_user or "the data root's owner"
    checks = [
        Check(
            "image-on-nodes",
            not img_bad,
            "; ".join(img_bad) or "the probe ran on every GPU node",
            "load the runner image on those nodes (docker save | docker -H NODE load, or a registry)",
        ),
        Check(
            "data-volume",
            not vol_bad,
            "; ".join(vol_bad) or "a file written on every GPU node was seen here",
            f"make {config.data_root} (and the NFS export) writable by the runner uid:gid ({user}): "
            f"chown -R UID:GID {config.data_root}; check the export/mount (swarm/nfs-*.sh)",
        ),
        Check(
            "model-pack",
            not pack_bad,
            "; ".join(pack_bad) or f"pack {pack!r} verified on every GPU node",
            f"install the pack under {config.data_root}/models/{pack}/ with a pack.yaml whose sha256 match "
            "(docs/operations.md#models)",
        ),
    ]
    return checks


def check_heartbeat(admin: SwarmAdmin) -> Check:
    beat = admin.swarm_info().heartbeat_seconds
    if beat is None or beat > MAX_HEARTBEAT_SECONDS:
        return Check(
            "heartbeat",
            False,
            f"dispatcher heartbeat is {beat if beat is not None else 'unknown'} s: a lost node is noticed after ~14 s",
            "docker swarm update --dispatcher-heartbeat 1s (node loss visible in ~3 s)",
        )
    return _ok("heartbeat", f"dispatcher heartbeat {beat:g} s")


def check_policy(config: Config) -> Check:
    """Not a test that can fail: what job files may ask for on this cluster (config `policy:`)."""
    head, *rest = config.policy.describe()
    return _ok("policy", head.removeprefix("policy: ") + "".join(f"\n       {line}" for line in rest))


def check_tenant_keys(config: Config) -> Check | None:
    """Tenants whose S3 area is the plain URL: their runners get the cluster's storage.s3 keys, which
    reach beyond the area. Allowed (configs written before tenant keys keep working), so a warning;
    None when no tenant has an area."""
    areas = {name: t.s3 for name, t in config.tenants.items() if t.s3 is not None}
    if config.storage.s3 is None or not areas:
        return None
    shared = config.tenants_on_cluster_keys()
    if not shared:
        return _ok("tenant-keys", f"every tenant's S3 area has keys of its own ({', '.join(areas)})")
    who = ", ".join(f"{name} ({areas[name]})" for name in shared)
    detail = f"the runners of tenant(s) {who} get storage.s3's keys, which reach beyond their areas"
    return Check("tenant-keys", True, detail, cluster_keys_fix(shared), warning=True)


def run_checks(
    config: Config, pack: str = "default", say: Callable[[Check], None] = lambda c: None, store: str | None = None
) -> list[Check]:
    """Every check, in order; later checks that need an earlier one's result say they were skipped.
    ``store`` (``s3://bucket/prefix/``): also what the configured object store honours, tried there."""
    out: list[Check] = []

    def add(c: Check) -> None:
        out.append(c)
        say(c)

    add(check_policy(config))
    tenant_keys = check_tenant_keys(config)
    if tenant_keys is not None:
        add(tenant_keys)
    if store is not None:
        add(check_store(config, store))
    try:
        admin = SwarmAdmin(config.docker_host)
        add(check_swarm(admin))
    except FfswarmError as e:
        add(Check("swarm", False, str(e), "start dockerd; docker swarm init"))
        return out
    if not out[-1].ok:
        return out
    nodes = gpu_nodes(admin)
    add(check_gpu_nodes(nodes, admin.node_infos()))
    image_check, image = check_image(admin, config.image)
    add(image_check)
    usable = [n for n in nodes if n.state == "ready"]
    if image is None or not usable:
        add(Check("probe", False, "skipped: needs the runner image and a ready GPU node", "fix the checks above"))
    else:
        results: dict[str, dict[str, str]] = {}
        for node in usable:
            try:
                results[node.hostname] = probe_node(admin, config, node, image, pack)
            except FfswarmError as e:
                results[node.hostname] = {"task": f"probe not created: {e}"}
        for c in check_probes(results, config, pack):
            add(c)
        add(check_runner_network(admin))  # the probes made it, as a job's first runner does
    add(check_heartbeat(admin))
    return out


def check_runner_network(admin: SwarmAdmin) -> Check:
    """The runners' internal network and its anchor on every ready node (controller/swarm/network.py)."""
    missing = admin.missing_anchors(RUNNER_NETWORK)
    fix = (
        f"ffswarm makes {RUNNER_NETWORK} and {ANCHOR_SERVICE} before a job's first runner; if a node's anchor "
        f"cannot start, see `docker service ps {ANCHOR_SERVICE}` (its image must be on the node)"
    )
    if missing is None:
        return Check("runner-network", False, f"{RUNNER_NETWORK} is missing or not an internal overlay network", fix)
    if missing:
        return Check("runner-network", False, f"no running anchor on {', '.join(missing)}", fix)
    return _ok("runner-network", f"{RUNNER_NETWORK}: internal (no egress), anchored on every ready node")


def check_store(config: Config, where: str, wait: Callable[[float], None] = time.sleep) -> Check:
    """What ``storage.s3`` honours, tried on scratch keys under ``where`` (controller/storage/probe.py):
    fails when a commit could not be made safely there (no atomic create, no If-Match in any form)."""
    from contract.s3 import S3Url
    from controller.storage.probe import expired_is_refused, probe
    from controller.storage.s3 import S3Store, make_client

    fix_config = "set storage.s3 (docs/storage.md) and its credentials file"
    if config.storage.s3 is None:
        return Check("store", False, "no storage.s3 in the config", fix_config)
    try:
        url = S3Url.parse(where)
    except ValueError as e:
        return Check(
            "store", False, f"--store {where!r}: {e}", "give s3://BUCKET/PREFIX/ of a bucket ffswarm may write"
        )
    settings = config.storage.s3
    try:
        client = make_client(settings, max_attempts=2)
        store = S3Store(settings, client)
        found = probe(client, url, presign=lambda key: store.presign_get(S3Url(url.bucket, key), ttl=1),
                      expiry=lambda link: expired_is_refused(link, wait))  # fmt: skip
    except FfswarmError as e:
        return Check("store", False, str(e), fix_config)
    except Exception as e:  # noqa: BLE001  (a store's answer must not end doctor; its text is not shown)
        return Check(
            "store", False, f"{url}: the probe failed ({type(e).__name__})", "check the endpoint and credentials"
        )
    kept = stores.records(config)
    kept.save(stores.endpoint(settings), url.bucket, found)  # what jobs writing to this bucket rely on
    detail = f"{settings.endpoint_url or 'AWS S3'}, tried under {url}" + "".join(f"\n       {x}" for x in found.lines())
    detail += f"\n       recorded for jobs: {kept.path(stores.endpoint(settings), url.bucket)}"
    if not found.safe:
        return Check("store", False, detail, f"use a store that honours conditional PUT ({found.missing()} is "
                     "not): ffswarm refuses jobs with outputs there, since a commit could replace another "
                     "job's object")  # fmt: skip
    return _ok("store", detail)
