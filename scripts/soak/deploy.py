"""The soak's cluster and controller stack, deployed as a user deploys it.

- The three-node cluster of scripts/cluster.sh (brought up, or the running one reused). A cluster the
  soak brings up gets its data root on a tmpfs of its own (``CLUSTER_DATA_SIZE``), so the volume-full
  fault fills that and never the host's disk; on a reused cluster whose data root is no mount of its
  own that fault is skipped.
- The controller image pushed to the cluster's registry and named by digest (`controller_image`).
- With ``--s3``: Ceph RGW on this host (scripts/s3-server.sh) also listening on the cluster network's
  gateway, a bucket of the soak's own, an attachable overlay network runners join to reach it
  (``storage.s3.network``), and each tenant's area ``s3://<bucket>/<tenant>/``.
- The soak's config: the cluster's, plus three tenants with their webhooks, the API with a signing
  key, packing with linger, a short webhook retry schedule; key files as Swarm secrets.
- `ffswarm render --controller` (serve, two api replicas), with two changes the soak needs, applied to
  the rendered file: the api port published in host mode, one replica per node (the routing mesh
  carries no traffic on this VM), and serve given the tenants' webhook secrets and the signing key
  (it signs deliveries and their links).
- `docker stack deploy`, then waiting until serve's heartbeat is live and both replicas are ready.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import os
import secrets
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import yaml

from scripts.soak.plan import TENANTS

if TYPE_CHECKING:
    from tests.fixtures.rgw_server import Rgw

ROOT = Path(__file__).resolve().parents[2]
STATE = ROOT / "build" / "cluster" / "state.json"
OUT = ROOT / "build" / "soak"
NET = "ffswarm-cluster"
STACK = "ffswarm"
NODES = ("ffswarm-mgr", "ffswarm-w1", "ffswarm-w2")
API_PORT = 8080
CONTROLLER_IMAGE = os.environ.get("CONTROLLER_IMAGE", "ffswarm/controller:dev")
CONTROLLER_USER = (10002, 10001)  # the API's uid; the runner's group, so it can add uploads/ to an area
S3_PORT = 7480  # scripts/s3-server.sh's
S3_NETWORK = "ffswarm-soak-s3"  # the attachable overlay network runners of s3:// jobs join
S3_REGION = "us-east-1"


def sh(*cmd: str, timeout: float = 300, check: bool = True) -> str:
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[:4])} … failed ({proc.returncode}): {proc.stderr.strip()[-2000:]}")
    return proc.stdout.strip()


def node_docker(node: str, *args: str, timeout: float = 120, check: bool = True) -> str:
    state = json.loads(STATE.read_text())
    return sh("docker", "-H", state["apis"][node], *args, timeout=timeout, check=check)


@dataclass
class Cluster:
    data_root: Path
    config: Path  # the cluster's own config (build/cluster/ffswarm.yaml)
    apis: dict[str, str]  # node → its engine's URL on loopback
    ips: dict[str, str]  # node → its address on the cluster network
    gateway: str  # the host's address on that network
    own_volume: bool  # the data root is a mount of its own (the volume-full fault may fill it)


def cluster(data_size: str) -> Cluster:
    """The running cluster, or a new one whose data root is a ``data_size`` tmpfs."""
    up = STATE.is_file() and sh("docker", "inspect", "-f", "{{.State.Running}}", NODES[0], check=False) == "true"
    if not up:
        env = {**os.environ, "CLUSTER_DATA_SIZE": data_size}
        subprocess.run([str(ROOT / "scripts" / "cluster.sh"), "up"], check=True, env=env, timeout=1800)
    state = json.loads(STATE.read_text())
    ips = {
        n: sh("docker", "inspect", "-f", f'{{{{(index .NetworkSettings.Networks "{NET}").IPAddress}}}}', n)
        for n in NODES
    }
    gateway = sh("docker", "network", "inspect", "-f", "{{(index .IPAM.Config 0).Gateway}}", NET)
    root = Path(state["data_root"])
    return Cluster(root, Path(state["config"]), dict(state["apis"]), ips, gateway, os.path.ismount(root))


def push_controller_image() -> str:
    """The controller image in the cluster's registry; its reference by digest, as nodes pull it."""
    if not sh("docker", "images", "-q", CONTROLLER_IMAGE):
        raise RuntimeError(f"{CONTROLLER_IMAGE} missing: run scripts/build-controller-image.sh")
    sh("docker", "tag", CONTROLLER_IMAGE, "127.0.0.1:5000/ffswarm/controller:soak")
    sh("docker", "push", "-q", "127.0.0.1:5000/ffswarm/controller:soak", timeout=600)
    digests = sh("docker", "image", "inspect", "-f", "{{range .RepoDigests}}{{println .}}{{end}}", CONTROLLER_IMAGE)
    digest = next(d.split("@")[1] for d in digests.splitlines() if d.startswith("127.0.0.1:5000/"))
    return f"ffswarm-registry:5000/ffswarm/controller@{digest}"


@dataclass(frozen=True)
class ObjectStore:
    """The soak's object store: the soak reaches it on loopback (``rgw``), the stack and its runners on
    the cluster network's gateway (``endpoint``); ``bucket`` is the soak's own."""

    endpoint: str
    bucket: str
    access_key: str
    secret_key: str
    rgw: Rgw | None = None  # the running server (None where only the config is written)

    def area(self, tenant: str) -> str:
        return f"s3://{self.bucket}/{tenant}/"

    def client(self) -> Any:
        if self.rgw is None:
            raise RuntimeError("the soak's object store is not running")
        return self.rgw.client()

    def credentials(self) -> bytes:
        """The credentials file (docs/storage.md#config) the stack's secret carries."""
        return f"AWS_ACCESS_KEY_ID={self.access_key}\nAWS_SECRET_ACCESS_KEY={self.secret_key}\n".encode()


def object_store(c: Cluster, seed: int) -> ObjectStore:
    """Ceph RGW on this host, listening on the cluster's gateway too (started when it is not), an empty
    bucket ``ffswarm-soak-<seed>``, and the runners' storage network on the manager."""
    from tests.fixtures.rgw_server import rgw_server  # boto3: only for a soak with S3

    rgw = rgw_server(also=(c.gateway,))
    store = ObjectStore(f"http://{c.gateway}:{S3_PORT}", f"ffswarm-soak-{seed}", rgw.creds.access_key_id,
                        rgw.creds.secret_access_key, rgw)  # fmt: skip
    s3 = store.client()
    with contextlib.suppress(s3.exceptions.BucketAlreadyOwnedByYou, s3.exceptions.BucketAlreadyExists):
        s3.create_bucket(Bucket=store.bucket)
    empty_bucket(s3, store.bucket)
    if not node_docker(NODES[0], "network", "inspect", "-f", "{{.Name}}", S3_NETWORK, check=False):
        node_docker(NODES[0], "network", "create", "-d", "overlay", "--attachable", S3_NETWORK)
    return store


def empty_bucket(s3: Any, bucket: str) -> None:
    """Every object and open multipart upload of ``bucket`` removed (a replayed seed starts clean)."""
    for upload in s3.list_multipart_uploads(Bucket=bucket).get("Uploads", []):
        s3.abort_multipart_upload(Bucket=bucket, Key=upload["Key"], UploadId=upload["UploadId"])
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket):
        for obj in page.get("Contents", []):
            s3.delete_object(Bucket=bucket, Key=obj["Key"])


def remove_store(store: ObjectStore) -> None:
    """The bucket (memstore holds it in RAM), the anchor serve put on the storage network, the network."""
    from controller.swarm.network import storage_anchor

    with contextlib.suppress(Exception):
        s3 = store.client()
        empty_bucket(s3, store.bucket)
        s3.delete_bucket(Bucket=store.bucket)
    node_docker(NODES[0], "service", "rm", storage_anchor(S3_NETWORK), check=False)
    for _ in range(15):  # the anchor's tasks hold the network a moment longer
        if not node_docker(NODES[0], "network", "rm", S3_NETWORK, check=False, timeout=30):
            time.sleep(2)
            continue
        break


@dataclass
class Deployed:
    config: Path
    keys: dict[str, str]  # tenant → API key
    webhook_secrets: dict[str, str]  # tenant → whsec_ secret
    secret_names: list[str]


def secret(name: str, value: bytes) -> str:
    """A Swarm secret named after its content (secrets are immutable): created once, reused after."""
    full = f"soak-{name}-{hashlib.sha256(value).hexdigest()[:10]}"
    if not node_docker(NODES[0], "secret", "ls", "-q", "--filter", f"name={full}"):
        path = OUT / "secrets" / full
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        path.write_bytes(value)
        node_docker(NODES[0], "secret", "create", full, str(path))
    return full


def write_config(
    c: Cluster,
    image: str,
    receiver_host: str,
    seed: int,
    store: ObjectStore | None = None,
    make_secret: Callable[[str, bytes], str] = secret,
    out: Path = OUT,
) -> Deployed:
    """The soak's config (``out``/ffswarm.yaml) and its secrets (``make_secret``: name, content → the
    Swarm secret's name); tenant keys differ per seed. With ``store``: ``storage.s3`` reached on the
    cluster's gateway with the test user's keys as a Swarm secret, runners joining ``S3_NETWORK``, and
    each tenant's area in the soak's bucket."""
    out.mkdir(parents=True, exist_ok=True)
    data: dict[str, Any] = yaml.safe_load(c.config.read_text())
    data.pop("docker_host", None)  # serve reaches its own engine by its socket; render is told by DOCKER_HOST
    signing = make_secret("api-signing", hashlib.sha256(f"soak signing {seed}".encode()).hexdigest().encode())
    keys = {t: f"soak-key-{t}-{seed}" for t in TENANTS}
    hooks = {t: "whsec_" + base64.b64encode(hashlib.sha256(f"{t}{seed}".encode()).digest()).decode() for t in TENANTS}
    names = {t: make_secret(f"hook-{t}", hooks[t].encode()) for t in TENANTS}
    data.update(
        controller_image=image,
        controller_user=f"{CONTROLLER_USER[0]}:{CONTROLLER_USER[1]}",
        api={"signing_key_file": f"/run/secrets/{signing}", "link_ttl": "1h"},
        packing={"max_items": 50, "window": "1s", "pack_items": 1000, "linger": "20s"},
        webhooks={"retry_schedule": ["2s", "5s", "10s", "30s", "1m", "2m", "5m"]},
        tenants={
            t: {
                "api_keys_sha256": [hashlib.sha256(keys[t].encode()).hexdigest()],
                "weight": 2 if t == TENANTS[1] else 1,
                "quota": {"jobs_queued": 1000, "requests_per_second": 50, "requests_in_flight": 16},
                "webhooks": {"allow_hosts": [receiver_host], "secret_file": f"/run/secrets/{names[t]}",
                             "allow_private": True},
            }
            for t in TENANTS
        },
    )  # fmt: skip
    made = [signing, *names.values()]
    if store is not None:
        creds = make_secret("s3", store.credentials())
        data["storage"] = {"s3": {"endpoint_url": store.endpoint, "region": S3_REGION, "addressing": "path",
                                  "credentials_secret": creds, "link_ttl": "1h", "network": S3_NETWORK}}  # fmt: skip
        for t in TENANTS:
            data["tenants"][t]["s3"] = store.area(t)
        made.append(creds)
    path = out / "ffswarm.yaml"
    path.write_text(
        f"# scripts/soak.py, seed {seed}: the cluster's config plus tenants, API, packing\n" + yaml.safe_dump(data)
    )
    return Deployed(path, keys, hooks, made)


def prepare_volume(c: Cluster) -> None:
    """What the API, running as controller_user and not root, needs on the volume before its first
    request: ``tenants/`` and each tenant's area its own, 0755 (the API adds ``uploads/`` there;
    serve makes the runner's ``out/`` folders inside; docs/architecture.md), the inbox the API's."""
    tenants = c.data_root / "tenants"
    tenants.mkdir(mode=0o755, exist_ok=True)
    os.chown(tenants, *CONTROLLER_USER)
    for t in TENANTS:
        (tenants / t).mkdir(exist_ok=True)
        os.chown(tenants / t, *CONTROLLER_USER)
        os.chmod(tenants / t, 0o755)
    inbox = c.data_root / "inbox"
    inbox.mkdir(exist_ok=True)
    os.chown(inbox, *CONTROLLER_USER)
    os.chmod(inbox, 0o755)  # the API writes job files; serve (root) claims them; runners may not


def render(d: Deployed) -> Path:
    """`ffswarm render --controller`, then the soak's two changes (``adapt``)."""
    stack = OUT / "controller.yml"
    cmd = [sys.executable, "-m", "controller.cli", "--config", str(d.config), "render", "--controller",
           "--concurrent-jobs", "4", "--api-port", str(API_PORT), "--api-replicas", "2", "-o", str(stack)]  # fmt: skip
    env = {**os.environ, "DOCKER_HOST": json.loads(STATE.read_text())["apis"][NODES[0]]}
    subprocess.run(cmd, check=True, cwd=ROOT, timeout=120, env=env)
    head = "# scripts/soak.py: `ffswarm render --controller`, api ports in host mode, serve given its secrets\n"
    stack.write_text(head + adapt(stack.read_text(), d.secret_names))
    return stack


def adapt(rendered: str, secret_names: list[str]) -> str:
    """The rendered controller stack with the api's port published in host mode on each node that runs
    a replica (at most one per node), and serve given ``secret_names`` (root-only) as Swarm secrets."""
    doc = yaml.safe_load(rendered)
    api = doc["services"]["api"]
    port = api["ports"][0]["published"]
    api["ports"] = [{"target": api["ports"][0]["target"], "published": port, "protocol": "tcp", "mode": "host"}]
    api["deploy"].setdefault("placement", {})["max_replicas_per_node"] = 1
    serve = doc["services"]["controller"]
    has = {s["target"] for s in serve.get("secrets") or []}  # a render that gives serve its secrets itself
    keys = {n: "soak_" + n.replace("-", "_").replace(".", "_") for n in secret_names if n not in has}
    serve["secrets"] = (serve.get("secrets") or []) + [
        {"source": key, "target": n, "uid": "0", "gid": "0", "mode": 0o400} for n, key in keys.items()
    ]
    doc.setdefault("secrets", {}).update({key: {"external": True, "name": n} for n, key in keys.items()})
    return str(yaml.safe_dump(doc, sort_keys=False))


def deploy(stack: Path) -> None:
    node_docker(NODES[0], "stack", "deploy", "--resolve-image", "never", "-c", str(stack), STACK, timeout=300)


def api_urls(c: Cluster) -> list[str]:
    """Where the api replicas answer: the host-mode port on each node running one."""
    out = node_docker(
        NODES[0], "service", "ps", f"{STACK}_api", "--filter", "desired-state=running", "--format", "{{.Node}}"
    )
    return [f"http://{c.ips[n]}:{API_PORT}" for n in sorted(set(out.split())) if n in c.ips]


def wait_ready(c: Cluster, key: str, timeout: float = 600) -> list[str]:
    """Until both replicas answer /readyz ready (a live serve heartbeat behind them); their URLs."""
    deadline = time.monotonic() + timeout
    why = "no api replica running"
    while time.monotonic() < deadline:
        urls = api_urls(c)
        ready = []
        for url in urls:
            try:
                r = httpx.get(f"{url}/readyz", headers={"Authorization": f"Bearer {key}"}, timeout=5)
                if r.status_code == 200:
                    ready.append(url)
                why = f"{url}: {r.status_code} {r.text[:300]}"
            except httpx.HTTPError as e:
                why = f"{url}: {type(e).__name__}"
        if len(ready) >= 2:
            return ready
        time.sleep(2)
    raise RuntimeError(f"the api replicas did not get ready in {timeout:.0f} s (last: {why})")


def remove_stack(secret_names: list[str]) -> None:
    node_docker(NODES[0], "stack", "rm", STACK, check=False)
    for _ in range(30):
        if not node_docker(NODES[0], "service", "ls", "-q", "--filter", f"name={STACK}_", check=False):
            break
        time.sleep(2)
    for n in secret_names:
        node_docker(NODES[0], "secret", "rm", n, check=False)
    shutil.rmtree(OUT / "secrets", ignore_errors=True)


def random_seed() -> int:
    return secrets.randbelow(1 << 31)
