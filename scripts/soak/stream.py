"""The soak's requests: the inputs in each tenant's area, each request kind as the API takes it, the
record of what was accepted, and the webhook receiver.

Every request is sent to one of the API replicas in turn (their host-mode published ports on the
cluster's own network: this VM's routing mesh carries no traffic). A request the API refuses (429,
503) is counted, never retried as the same request: the stream is steady, not insistent. Cancels and
retries reach back to the tenant's recent jobs; a job that was cancelled is never retried and a job
retried is never cancelled, so how many times each job ended is known for the webhook check.
"""

from __future__ import annotations

import io
import json
import shutil
import subprocess
import threading
import time
import zipfile
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx

from scripts.soak.plan import VARIANTS, Request

RUNNER_OWNER = (10001, 10001)
JOB_SETTINGS: dict[str, Any] = {
    "providers": ["cpu"],
    "resources": {"gpus": 1, "gpu_kind": "GPU", "memory": "1g"},
    "placement": ["node.labels.ffswarm.gpu==true"],
    "retries": 3,
    "timeout": "10m",
}
ZIP_PHOTOS = 3  # photos in one ZIP upload


def make_inputs(area: Path) -> None:
    """``soak/`` in a tenant's area: two faces, the target photos, two short videos (ffmpeg), owned by
    the runner's uid as the API's areas are. Made once; an existing folder is kept."""
    from tests.fixtures import photos  # cv2, numpy: only when a real run makes inputs

    top = area / "soak"
    if (top / "done").exists():
        return
    shutil.rmtree(top, ignore_errors=True)
    faces = top / "faces"
    photos.astronaut(faces).rename(faces / "s0.jpg")
    photos.face_photos(top / "tmp", 1)[0].rename(faces / "s1.jpg")
    targets = photos.face_photos(top / "in", VARIANTS * ZIP_PHOTOS)
    for i, p in enumerate(targets):
        p.rename(p.with_name(f"p{i:02d}.jpg"))
    (top / "video").mkdir()
    for v in range(2):
        clip = top / "video" / f"v{v}.mp4"
        subprocess.run(
            ["ffmpeg", "-v", "error", "-nostdin", "-y", "-loop", "1", "-i", str(faces / f"s{v}.jpg"),
             "-vf", "scale=320:320,format=yuv420p", "-r", "10", "-t", "2", "-c:v", "libx264", str(clip)],
            check=True,
        )  # fmt: skip
    shutil.rmtree(top / "tmp")
    (top / "done").write_text("")
    for p in [top, *top.rglob("*")]:
        shutil.chown(p, *RUNNER_OWNER)


def upload_inputs(area: Path, s3: Any, tenant_area: str) -> list[str]:
    """The tenant's faces and target photos (``soak/`` in its area on the volume) put into its area of
    the store (``tenant_area``: ``s3://BUCKET/PREFIX/``) under the same names; the URLs put."""
    bucket, _, prefix = tenant_area.removeprefix("s3://").partition("/")
    put = []
    for folder in ("faces", "in"):
        for p in sorted((area / "soak" / folder).glob("*.jpg")):
            key = f"{prefix}soak/{folder}/{p.name}"
            s3.put_object(Bucket=bucket, Key=key, Body=p.read_bytes(), ContentType="image/jpeg")
            put.append(f"s3://{bucket}/{key}")
    return put


def settings(name: str, webhook: str | None) -> dict[str, Any]:
    """What every soak job sets besides its inputs: CPU runners on the GPU workers, its webhook."""
    return {**JOB_SETTINGS, "name": name, **({"on_complete": {"webhook": webhook}} if webhook else {})}


def body(req: Request, webhook: str | None, s3_area: str | None = None) -> dict[str, Any]:
    """The JSON job of a photo, pairs, video or s3 request: paths relative to the tenant's area on the
    volume; an s3 request's source and target are objects in its area of the store (``s3_area``,
    ``s3://BUCKET/PREFIX/``), and with no ``output`` its output goes there too (``<area>out/<job>/``)."""
    v = req.variant
    common = settings(req.kind, webhook)
    if req.kind == "s3":
        if s3_area is None:
            raise ValueError(f"an s3 request of {req.tenant}, whose tenant has no storage area")
        return {**common, "source": f"{s3_area}soak/faces/s{v % 2}.jpg",
                "targets": [f"{s3_area}soak/in/p{VARIANTS + v:02d}.jpg"]}  # fmt: skip
    if req.kind == "photo":
        return {**common, "source": f"soak/faces/s{v % 2}.jpg", "targets": [f"soak/in/p{v:02d}.jpg"]}
    if req.kind == "pairs":
        pairs = [
            {"source": f"soak/faces/s{(v + i) % 2}.jpg", "target": f"soak/in/p{v * 2 + i:02d}.jpg"} for i in (0, 1)
        ]
        return {**common, "pairs": pairs}
    if req.kind == "video":
        return {**common, "source": f"soak/faces/s{v % 2}.jpg", "targets": [f"soak/video/v{v % 2}.mp4"]}
    raise ValueError(f"no JSON body for a {req.kind} request")


def zip_upload(area: Path, req: Request) -> tuple[bytes, bytes]:
    """(the source photo, a ZIP of the variant's target photos) for a multipart upload."""
    base = area / "soak"
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for i in range(ZIP_PHOTOS):
            n = req.variant * ZIP_PHOTOS + i
            zf.writestr(f"photos/p{n:02d}.jpg", (base / "in" / f"p{n:02d}.jpg").read_bytes())
    return (base / "faces" / f"s{req.variant % 2}.jpg").read_bytes(), buf.getvalue()


@dataclass
class Accepted:
    job: str
    tenant: str
    key: str  # the request's key (plan.Request.key): same key, same outputs
    at: float  # seconds into the run
    reference: bool = False


@dataclass
class Record:
    """What the stream did: accepted jobs, answers by request kind and status code, ends per job."""

    accepted: dict[str, Accepted] = field(default_factory=dict)
    answers: Counter[str] = field(default_factory=Counter)  # "<kind> <code>" ("error <class>": no answer)
    retried: Counter[str] = field(default_factory=Counter)  # job → retries the API accepted
    cancelled: set[str] = field(default_factory=set)  # jobs a cancel was sent for
    lock: threading.Lock = field(default_factory=threading.Lock)

    def to_dict(self) -> dict[str, Any]:
        kinds: Counter[str] = Counter(a.key.split("-")[0] for a in self.accepted.values() if not a.reference)
        return {"accepted": len(self.accepted), "accepted_by_kind": dict(kinds), "answers": dict(self.answers),
                "retries_accepted": sum(self.retried.values()), "cancels_sent": len(self.cancelled)}  # fmt: skip


class Stream:
    """Sends requests for the three tenants to the API replicas in turn."""

    def __init__(
        self,
        root: Path,
        replicas: list[str],
        keys: dict[str, str],
        webhook: str | None,
        record: Record,
        s3_areas: dict[str, str] | None = None,
    ) -> None:
        self.root, self.replicas, self.keys, self.webhook, self.record = root, replicas, keys, webhook, record
        self.s3_areas = s3_areas or {}  # tenant → its area of the store (s3 requests)
        self._turn = 0

    def client(self, tenant: str, timeout: float = 60) -> httpx.Client:
        self._turn += 1
        url = self.replicas[self._turn % len(self.replicas)]
        return httpx.Client(base_url=url, headers={"Authorization": f"Bearer {self.keys[tenant]}"}, timeout=timeout)

    def offer(self, req: Request, at: float, reference: bool = False) -> str | None:
        """Send one request; the job id when a job was accepted (202)."""
        try:
            with self.client(req.tenant) as c:
                code, job = self._send(c, req)
        except (httpx.HTTPError, ValueError, KeyError) as e:  # no answer, or one that is not the API's
            code, job = f"error {type(e).__name__}", None
        with self.record.lock:
            self.record.answers[f"{req.kind} {code}"] += 1
            if job and req.kind not in ("cancel", "retry"):
                self.record.accepted[job] = Accepted(job, req.tenant, req.key, at, reference)
        return job

    def _send(self, c: httpx.Client, req: Request) -> tuple[str, str | None]:
        if req.kind == "zip":
            source, archive = zip_upload(self.root / "tenants" / req.tenant, req)
            opts = settings("zip", self.webhook)
            files = [("source", ("s.jpg", source, "image/jpeg")), ("targets", ("p.zip", archive, "application/zip"))]
            r = c.post("/v1/jobs", files=files, data={"job": json.dumps(opts)})
        elif req.kind in ("cancel", "retry"):
            job = self._reach_back(req)
            if job is None:
                return "none", None
            r = c.post(f"/v1/jobs/{job}/{req.kind}")
            if r.status_code < 300:
                with self.record.lock:
                    if req.kind == "cancel":
                        self.record.cancelled.add(job)
                    else:
                        self.record.retried[job] += 1
            return str(r.status_code), None
        else:
            r = c.post("/v1/jobs", json=body(req, self.webhook, self.s3_areas.get(req.tenant)))
        return str(r.status_code), (r.json().get("id") if r.status_code == 202 else None)

    def _reach_back(self, req: Request) -> str | None:
        """The tenant's ``variant``-th latest job a cancel (never retried) or retry (never cancelled) may take."""
        with self.record.lock:
            jobs = [a.job for a in self.record.accepted.values() if a.tenant == req.tenant and not a.reference]
            if req.kind == "cancel":
                jobs = [j for j in jobs if j not in self.record.retried]
            else:
                jobs = [j for j in jobs if j not in self.record.cancelled]
        return jobs[-req.variant] if len(jobs) >= req.variant else None

    def status(self, tenant: str, job: str) -> dict[str, Any] | None:
        with self.client(tenant, timeout=30) as c:
            r = c.get(f"/v1/jobs/{job}")
        if r.status_code == 404:
            return None
        r.raise_for_status()
        data: dict[str, Any] = r.json()
        return data

    def jobs(self, tenant: str) -> Iterator[dict[str, Any]]:
        """Every job of the tenant as its list shows it (its own view), newest first."""
        cursor = None
        with self.client(tenant, timeout=60) as c:
            while True:
                r = c.get("/v1/jobs", params={"limit": 1000, **({"cursor": cursor} if cursor else {})})
                r.raise_for_status()
                page = r.json()
                yield from page["jobs"]
                cursor = page.get("next_cursor")
                if not cursor:
                    return

    def usage(self, tenant: str) -> dict[str, Any]:
        with self.client(tenant, timeout=60) as c:
            r = c.get("/v1/usage", params={"to": int(time.time()) + 3600})
        r.raise_for_status()
        data: dict[str, Any] = r.json()["usage"]
        return data


def slow_zip(area: Path, stop: threading.Event, seconds: float = 30.0) -> Iterator[bytes]:
    """A multipart body that trickles in over ``seconds`` (or until ``stop``): an upload in flight for
    the API-replica kill. Its boundary is fixed; the caller sets the content type."""
    head = (b'--soakb\r\nContent-Disposition: form-data; name="source"; filename="s.jpg"\r\n'
            b"Content-Type: image/jpeg\r\n\r\n" + (area / "soak" / "faces" / "s0.jpg").read_bytes() + b"\r\n"
            b'--soakb\r\nContent-Disposition: form-data; name="targets"; filename="big.zip"\r\n'
            b"Content-Type: application/zip\r\n\r\n")  # fmt: skip
    yield head
    end = time.monotonic() + seconds
    while time.monotonic() < end and not stop.is_set():
        yield b"\0" * 65536
        time.sleep(0.2)
    yield b"\r\n--soakb--\r\n"


# --- the webhook receiver --------------------------------------------------------------------------


class Receiver:
    """An HTTP server on the cluster network's gateway (the host side: `serve` on the manager reaches
    it) recording each delivery's ``webhook-id``, type, job and whether its signature verified."""

    def __init__(self, host: str, secrets: dict[str, str]) -> None:
        from standardwebhooks.webhooks import Webhook

        self.got: list[dict[str, Any]] = []
        self.lock = threading.Lock()
        verifiers = {t: Webhook(s) for t, s in secrets.items()}
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                headers = {k.lower(): v for k, v in self.headers.items()}
                try:
                    event = json.loads(raw)
                    data = event.get("data") or {}
                except ValueError:
                    event, data = {}, {}
                tenant = str(data.get("tenant"))
                verified = False
                if tenant in verifiers:
                    try:
                        verifiers[tenant].verify(raw, headers)
                        verified = True
                    except Exception:  # a bad signature is recorded, not raised
                        verified = False
                with receiver.lock:
                    receiver.got.append({"id": headers.get("webhook-id"), "type": event.get("type"),
                                         "job": data.get("job"), "tenant": tenant, "verified": verified,
                                         "at": time.time()})  # fmt: skip
                self.send_response(204)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer((host, 0), Handler)
        self.url = f"http://{host}:{self.server.server_address[1]}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def received(self) -> list[dict[str, Any]]:
        with self.lock:
            return list(self.got)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
