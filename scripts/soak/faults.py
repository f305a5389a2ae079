"""The soak's faults, each done to the cluster through its engines (the nodes' on loopback, the host's
for the node containers themselves). Every fault that lasts undoes itself, and ``heal`` undoes them
all whatever happened (unpause, reactivate, remove the filler, start the store), so a soak stopped
half-way leaves a cluster that works.

A fault with nothing to act on (no runner container running at that moment, no object store, a data
root that is no mount of its own) is recorded as skipped with the reason, never counted as injected.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx

from scripts.soak.deploy import NODES, ROOT, STACK, Cluster, node_docker, sh
from scripts.soak.plan import Fault
from scripts.soak.stream import Accepted, Stream, slow_zip

WORKERS = NODES[1:]
FILLER = ".soak-fill"
KILLED = "upload-killed"  # the request key of an upload that beat its replica's kill
S3_SERVER = ROOT / "scripts" / "s3-server.sh"


@dataclass(frozen=True)
class RgwSwitch:
    """Stops and starts Ceph RGW on this host for the store fault: radosgw alone, since the monitor and
    the OSD hold the objects (memstore keeps them in RAM: stopping those would lose the bucket).
    ``run``: runs one command (the script and its arguments), raising when it fails."""

    gateway: str  # the cluster network's gateway: the address RGW must listen on again
    run: Callable[..., str] = sh

    def stop(self) -> None:
        self.run(str(S3_SERVER), "gateway-kill", timeout=60)

    def start(self) -> None:
        """Start radosgw when it is not running; returns once it answers (the script waits for that)."""
        self.run(str(S3_SERVER), "start", "--also", self.gateway, timeout=180)


@dataclass
class Done:
    kind: str
    at: float  # seconds into the faulted run, when it was done
    target: str
    injected: bool
    note: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class Faults:
    def __init__(
        self,
        cluster: Cluster,
        stream: Stream,
        store: RgwSwitch | None,
        sleep: Callable[[float], None] = time.sleep,
        run: Callable[..., str] = sh,
    ) -> None:
        """``sleep``, ``run``: how a fault waits and runs a command on this host (``sh``'s form)."""
        self.c, self.stream, self.store, self.sleep, self.run = cluster, stream, store, sleep, run
        self.done: list[Done] = []
        self.lock = threading.Lock()
        self.paused: set[str] = set()  # workers a pause fault holds now

    def inject(self, fault: Fault, t0: float) -> None:
        """Do one fault (in the caller's thread: those that last keep it until they are undone)."""
        at = round(time.monotonic() - t0, 1)
        try:
            target, note = getattr(self, fault.kind)(fault)
            done = Done(fault.kind, at, target, injected=not note.startswith("skipped"), note=note)
        except Exception as e:  # a fault that could not be done is recorded, and the soak goes on
            done = Done(fault.kind, at, "", injected=False, note=f"failed: {type(e).__name__}: {str(e)[:300]}")
        with self.lock:
            self.done.append(done)
        print(f"soak: fault {done.kind} {done.target} at {done.at}s {done.note}", flush=True)

    def _containers(self, node: str, label: str) -> list[str]:
        return node_docker(node, "ps", "-q", "--filter", f"label={label}", "--filter", "status=running").split()

    def kill_runner(self, f: Fault) -> tuple[str, str]:
        found = [(n, c) for n in WORKERS for c in self._containers(n, "io.ffswarm.job")]
        if not found:
            return "", "skipped: no runner container running"
        node, cid = found[f.pick % len(found)]
        node_docker(node, "kill", "-s", "KILL", cid)
        return f"{node}/{cid[:12]}", ""

    def kill_serve(self, f: Fault) -> tuple[str, str]:
        found = self._containers(NODES[0], f"com.docker.swarm.service.name={STACK}_controller")
        if not found:
            return "", "skipped: serve is not running (restarting)"
        node_docker(NODES[0], "kill", "-s", "KILL", found[0])
        return f"{NODES[0]}/{found[0][:12]}", ""

    def kill_api_mid_upload(self, f: Fault) -> tuple[str, str]:
        """Start a slow ZIP upload to one replica, kill -9 that replica's container while it streams."""
        urls = list(self.stream.replicas)
        if not urls:
            return "", "skipped: no api replica"
        url = urls[f.pick % len(urls)]
        node = next(n for n, ip in self.c.ips.items() if f"//{ip}:" in url)
        tenant = sorted(self.stream.keys)[f.pick % len(self.stream.keys)]
        stop = threading.Event()
        answer: list[str] = []

        def upload() -> None:
            try:
                r = httpx.post(f"{url}/v1/jobs", content=slow_zip(self.c.data_root / "tenants" / tenant, stop),
                               headers={"Authorization": f"Bearer {self.stream.keys[tenant]}",
                                        "Content-Type": "multipart/form-data; boundary=soakb"}, timeout=60)  # fmt: skip
                answer.append(str(r.status_code))
                if r.status_code == 202:  # the upload beat the kill: a job like any other
                    job = r.json()["id"]
                    with self.stream.record.lock:
                        self.stream.record.accepted[job] = Accepted(job, tenant, KILLED, 0.0)
            except httpx.HTTPError as e:
                answer.append(type(e).__name__)

        thread = threading.Thread(target=upload, daemon=True)
        thread.start()
        time.sleep(2.0)
        found = self._containers(node, f"com.docker.swarm.service.name={STACK}_api")
        if found:
            node_docker(node, "kill", "-s", "KILL", found[0])
        stop.set()
        thread.join(90)
        if not found:
            return node, f"skipped: no api container on {node} (upload answered {answer})"
        return f"{node}/{found[0][:12]}", f"upload answered {answer[0] if answer else 'nothing'}"

    def restart_engine(self, f: Fault) -> tuple[str, str]:
        node = WORKERS[f.pick % len(WORKERS)]
        sh("docker", "restart", "-t", "30", node, timeout=120)  # longer than any container's stop grace
        deadline = time.monotonic() + 120
        while node_docker(node, "info", "-f", "{{.Swarm.LocalNodeState}}", check=False, timeout=10) != "active":
            if time.monotonic() > deadline:
                return node, "engine restarted; not back in the swarm after 120 s"
            time.sleep(1)
        return node, ""

    def drain_worker(self, f: Fault) -> tuple[str, str]:
        node = WORKERS[f.pick % len(WORKERS)]
        node_docker(NODES[0], "node", "update", "--availability", "drain", node)
        try:
            time.sleep(f.duration)
        finally:
            node_docker(NODES[0], "node", "update", "--availability", "active", node)
        return node, f"drained {f.duration:g}s"

    def stop_store(self, f: Fault) -> tuple[str, str]:
        """Stop the object store's gateway for the fault's duration, then start it and wait until it
        answers (started again even when the stop failed half-way)."""
        if self.store is None:
            return "", "skipped: no object store (a soak without --s3)"
        try:
            self.store.stop()
            self.sleep(f.duration)
        finally:
            self.store.start()
        return f"rgw:{self.store.gateway}", f"stopped {f.duration:g}s"

    def pause_worker(self, f: Fault) -> tuple[str, str]:
        with self.lock:  # faults overlap: a worker paused by an earlier fault is not picked again
            free = [w for w in WORKERS if w not in self.paused]
            if not free:
                return "", "skipped: every worker is paused already"
            node = free[f.pick % len(free)]
            self.paused.add(node)
        try:
            return self._pause(node, f)
        finally:
            with self.lock:
                self.paused.discard(node)

    def _pause(self, node: str, f: Fault) -> tuple[str, str]:
        for attempt in range(3):  # runc gives up freezing a busy node ("unable to freeze"); it thaws it
            try:
                self.run("docker", "pause", node)
                break
            except RuntimeError:
                if attempt == 2:
                    raise
                self.sleep(2.0)
        try:
            self.sleep(f.duration)
        finally:
            self.run("docker", "unpause", node, check=False)
        return node, f"paused {f.duration:g}s"

    def fill_volume(self, f: Fault) -> tuple[str, str]:
        if not self.c.own_volume:
            return "", "skipped: the data root is no mount of its own (it would fill the host's disk)"
        path = self.c.data_root / FILLER
        try:
            filled = fill(path)
            time.sleep(f.duration)
        finally:
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
        return str(self.c.data_root), f"filled {filled >> 20} MiB for {f.duration:g}s"

    def heal(self) -> None:
        """Undo every lasting fault, whatever state the run stopped in."""
        for node in WORKERS:
            sh("docker", "unpause", node, check=False)
            node_docker(NODES[0], "node", "update", "--availability", "active", node, check=False)
        with contextlib.suppress(FileNotFoundError):
            (self.c.data_root / FILLER).unlink()
        if self.store is not None:
            with contextlib.suppress(Exception):  # said by the soak's checks: S3 jobs that cannot end
                self.store.start()


def fill(path: Path) -> int:
    """Write ``path`` until the file system is full; the bytes written."""
    st = os.statvfs(path.parent)
    size = st.f_bavail * st.f_frsize
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        with contextlib.suppress(OSError):
            os.posix_fallocate(fd, 0, size)
        written = os.lseek(fd, 0, os.SEEK_END)  # then whatever is left, a MiB at a time
        block = b"\0" * (1 << 20)
        while True:
            try:
                n = os.write(fd, block)
            except OSError:
                break
            if n == 0:
                break
            written += n
    finally:
        os.close(fd)
    return written
