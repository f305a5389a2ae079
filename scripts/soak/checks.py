"""The soak's end checks: each a function of what is on the data root and what the tenants were told.

Nothing here calls Docker or the API: the caller hands in the status objects, usage answers, webhook
deliveries received and the engines' service and container lists it fetched, so each check can be
tried on a data root built on disk. Outputs of S3 jobs are named by their ``s3://`` URL and read
with the boto3 client the caller hands in (``s3``). Each answers a ``Check``: PASS/FAIL, how many things it looked
at, and what is wrong, naming the job, item or path (relative to the data root).

The volume is read as the controller reads it: never through a symlink (``os.walk`` does not follow
links, files are opened with ``O_NOFOLLOW``).
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import stat
import subprocess
import tempfile
from collections import Counter, defaultdict
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from contract.layout import TENANT_RUNS, run_rel
from contract.paths import CONTAINER_DATA_ROOT
from contract.results import ItemResult, ItemStatus, parse_results
from contract.s3 import META_JOB, S3Url, is_s3

END_TYPES = ("job.finished", "job.cancelled")
ENDED_PHASES = ("finished", "cancelled", "refused")
MAX_DETAILS = 20
_RESULTS = re.compile(r"(?P<chunk>[a-z0-9][a-z0-9-]*)\.a(?P<attempt>[0-9]+)\.jsonl")
_COMMITS = re.compile(r"(?P<chunk>[a-z0-9][a-z0-9-]*)\.a(?P<attempt>[0-9]+)\.commits")
_TEMP = re.compile(r"\..+\.ffswarm-[a-z0-9-]+-a[0-9]+-[0-9a-f]+\.tmp")
USAGE_SUMS = ("gpu_seconds", "runner_seconds", "attempts", "bytes_in", "bytes_out")


@dataclass
class Check:
    name: str
    looked_at: int = 0
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # what is worth saying but not a failure

    @property
    def ok(self) -> bool:
        return not self.problems

    def row(self) -> str:
        shown = "; ".join(self.problems[:3]) + (f"; … {len(self.problems) - 3} more" if len(self.problems) > 3 else "")
        return f"{'PASS' if self.ok else 'FAIL'}  {self.name:<22} {self.looked_at:>6}  {shown}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "ok": self.ok,
            "looked_at": self.looked_at,
            "problems": self.problems[:MAX_DETAILS],
            "problems_total": len(self.problems),
            "notes": self.notes[:MAX_DETAILS],
        }


def _read(path: Path) -> bytes | None:
    """A regular file's bytes, never through a link; None when it is not one or cannot be read."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        chunks = []
        while block := os.read(fd, 1 << 20):
            chunks.append(block)
        return b"".join(chunks)
    except OSError:
        return None
    finally:
        os.close(fd)


def _sha256(path: Path) -> str | None:
    data = _read(path)
    return None if data is None else hashlib.sha256(data).hexdigest()


def host_path(root: Path, container_path: str) -> Path:
    """A runner's path (``/data/…``) as seen under the data root."""
    return root / container_path.removeprefix(CONTAINER_DATA_ROOT).lstrip("/")


def named(root: Path, output: str) -> str:
    """How the checks name an output: its ``s3://`` URL, or its path relative to the data root."""
    return output if is_s3(output) else host_path(root, output).relative_to(root).as_posix()


def load(root: Path, name: str, s3: Any = None) -> bytes | None:
    """An output's bytes by its ``named`` name (an object through ``s3``, a boto3 client; a file never
    through a link); None when it is missing or cannot be read."""
    if not is_s3(name):
        return _read(root / name)
    if s3 is None:
        return None
    try:
        url = S3Url.parse(name)
        data: bytes = s3.get_object(Bucket=url.bucket, Key=url.key)["Body"].read()
    except Exception:  # noqa: BLE001 (missing, refused or unreachable: the caller names the object)
        return None
    return data


def _runs(root: Path) -> Iterator[Path]:
    """Every run folder: runs/<job>/, and each tenant's packs' and API jobs' runs/.tenants/<key>/<job>/."""
    yield from _folders(root / "runs")
    for tenant in _folders(root / "runs" / TENANT_RUNS):
        yield from _folders(tenant)


def _folders(top: Path) -> Iterator[Path]:
    if top.is_dir() and not top.is_symlink():
        for p in sorted(top.iterdir()):
            if p.is_dir() and not p.is_symlink() and not p.name.startswith("."):
                yield p


def _lines(run: Path) -> dict[tuple[str, int], list[ItemResult]]:
    """(chunk, attempt) → the result lines of that attempt's file (lines claiming another attempt dropped)."""
    out: dict[tuple[str, int], list[ItemResult]] = {}
    folder = run / "results"
    if not folder.is_dir() or folder.is_symlink():
        return out
    for p in sorted(folder.iterdir()):
        m = _RESULTS.fullmatch(p.name)
        data = _read(p) if m else None
        if m and data is not None:
            attempt = int(m["attempt"])
            parsed = parse_results(data.decode("utf-8", "replace"))[0]
            out[(m["chunk"], attempt)] = [r for r in parsed if r.attempt == attempt]
    return out


def latest(run: Path) -> dict[str, ItemResult]:
    """Item → its deciding line as the controller folds them: a commit beats an error, then the newest
    attempt, then the later line; the video joins (``joins.jsonl``) after the chunks' lines."""
    ranked: dict[str, tuple[tuple[bool, int, int], ItemResult]] = {}
    order = 0
    for (_, _), lines in sorted(_lines(run).items(), key=lambda kv: kv[0][1]):
        for r in lines:
            order += 1
            key = (r.status.is_commit(), r.attempt, order)
            if r.item not in ranked or key > ranked[r.item][0]:
                ranked[r.item] = (key, r)
    out = {item: r for item, (_, r) in ranked.items()}
    joins = _read(run / "joins.jsonl")
    for r in parse_results(joins.decode("utf-8", "replace"))[0] if joins else []:
        out[r.item] = r
    return out


def job_results(root: Path, job: str) -> dict[str, ItemResult]:
    """A job's items as ``latest`` reads them; a packed job's (its run folder names its pack in
    ``packed``) from its pack's results, under the pack items that the pack's ``members.json`` gives
    this job."""
    run = root / run_rel(job)
    out = latest(run)
    raw = _read(run / "packed")
    pack = raw.decode("ascii", "replace").strip() if raw else ""
    if not re.fullmatch(r"pack-[a-z0-9-]{1,80}", pack):
        return out
    try:
        members = json.loads(_read(root / run_rel(pack) / "members.json") or b"{}")
    except ValueError:
        return out
    entry = members.get(job) if isinstance(members, dict) else None
    items = entry.get("items") if isinstance(entry, dict) else None
    if not isinstance(items, dict):
        return out
    for pack_item, r in latest(root / run_rel(pack)).items():
        own = items.get(pack_item)
        if isinstance(own, str):
            out.setdefault(own, r)
    return out


# --- every accepted request reached an end ---------------------------------------------------------


def ended(accepted: Iterable[str], statuses: Mapping[str, Mapping[str, Any] | None]) -> Check:
    """Every job the API accepted has ended: phase finished, cancelled or refused, with an outcome.
    ``statuses``: job → its ``GET /v1/jobs/{id}`` object (None: the API did not know it)."""
    check = Check("every request ended")
    for job in accepted:
        check.looked_at += 1
        status = statuses.get(job)
        if status is None:
            check.problems.append(f"{job}: lost (the API does not know it)")
        elif status.get("phase") not in ENDED_PHASES or status.get("outcome") is None:
            check.problems.append(f"{job}: stuck {status.get('phase')} (outcome {status.get('outcome')})")
    return check


# --- ok outputs equal the fault-free reference -----------------------------------------------------


def item_name(root: Path, tenant: str, job: str, result: ItemResult) -> str:
    """An item's input named the same in every job of the same request: relative to the job's upload
    folder when it was uploaded, else to the tenant's area (an object: to the tenant's prefix in its
    bucket, ``s3://BUCKET/<tenant>/``)."""
    if is_s3(result.input):
        key = result.input.removeprefix("s3://").partition("/")[2]
        return key.removeprefix(f"{tenant}/")
    rel = host_path(root, result.input).relative_to(root).as_posix()
    rel = rel.removeprefix(f"tenants/{tenant}/")
    return rel.removeprefix(f"uploads/{job}/")


def outputs(root: Path, tenant: str, job: str) -> dict[str, str]:
    """Input name → the ok output (``named``: its path relative to the data root, or its URL), for a
    job's committed photo and video outputs (never video segments inside the run folder)."""
    out: dict[str, str] = {}
    for r in job_results(root, job).values():
        if r.status is not ItemStatus.OK or r.output is None:
            continue
        rel = named(root, r.output)
        if not rel.startswith("runs/"):
            out[item_name(root, tenant, job, r)] = rel
    return out


# The CPU runner is not byte-deterministic: onnxruntime's threaded kernels may round a few values the
# other way, so the same request run twice can give JPEGs one level apart in a handful of pixels (and
# a video re-encoded from such frames). Two outputs show the same picture when they decode to arrays of
# one shape whose mean difference is at most MEAN_LEVELS and where at most FAR_SHARE of the values are
# more than FAR_LEVELS apart; a wrong face, a missing swap or a truncated file is far outside that.
MEAN_LEVELS = 1.0
FAR_LEVELS = 8
FAR_SHARE = 0.005
VIDEO = (".mp4", ".mov", ".mkv", ".webm", ".avi")


def _decoded(data: bytes, suffix: str) -> Any:
    import numpy as np

    if suffix.lower() in VIDEO:  # through a file: an MP4's index may come last, which a pipe cannot seek to
        with tempfile.NamedTemporaryFile(suffix=suffix) as f:
            f.write(data)
            f.flush()
            raw = subprocess.run(
                ["ffmpeg", "-v", "error", "-nostdin", "-i", f.name, "-f", "rawvideo", "-pix_fmt", "rgb24", "-"],
                capture_output=True,
                timeout=120,
                check=True,
            ).stdout
        return np.frombuffer(raw, dtype=np.uint8)
    from PIL import Image

    with Image.open(io.BytesIO(data)) as im:
        return np.asarray(im.convert("RGB"), dtype=np.uint8)


def compare(root: Path, a: str, b: str, s3: Any = None) -> str | None:
    """None when the two outputs (``named`` names: under ``root``, or objects read through ``s3``) are
    byte-identical, "close" when they differ only as the runner's rounding does (see MEAN_LEVELS),
    else why they are not the same picture."""
    da, db = load(root, a, s3), load(root, b, s3)
    if da is None or db is None:
        return f"{a if da is None else b} is missing or not a regular file"
    if da == db:
        return None
    try:
        pa, pb = _decoded(da, PurePosixPath(a).suffix), _decoded(db, PurePosixPath(b).suffix)
    except (OSError, ValueError, subprocess.SubprocessError) as e:
        return f"cannot be decoded ({type(e).__name__})"
    if pa.shape != pb.shape:
        return f"a different size or length ({pa.shape} against {pb.shape})"
    diff = abs(pa.astype("int16") - pb.astype("int16"))
    mean, far = float(diff.mean()) if diff.size else 0.0, float((diff > FAR_LEVELS).mean()) if diff.size else 0.0
    if mean <= MEAN_LEVELS and far <= FAR_SHARE:
        return "close"
    return f"a different picture (mean {mean:.2f} levels apart, {far:.2%} of values more than {FAR_LEVELS} apart)"


def identical(
    root: Path, jobs: Mapping[str, tuple[str, str]], reference: Mapping[str, Mapping[str, str]], s3: Any = None
) -> Check:
    """Every ok output of a soak job shows the same picture as the same request's output in the
    fault-free reference run (``compare``): byte-identical, or apart only by the runner's rounding
    (counted in a note). ``jobs``: job → (tenant, request key); ``reference``: key → input name → the
    reference output (``named``); ``s3``: how objects are read."""
    check = Check("outputs = reference")
    close = 0
    for job, (tenant, key) in sorted(jobs.items()):
        ref = reference.get(key)
        for name, rel in sorted(outputs(root, tenant, job).items()):
            check.looked_at += 1
            if ref is None:
                check.problems.append(f"{job}: no reference for request {key}")
                break
            if name not in ref:
                check.problems.append(f"{job}: {name} has no output in the reference of {key}")
                continue
            why = compare(root, ref[name], rel, s3)
            if why == "close":
                close += 1
            elif why is not None:
                check.problems.append(f"{job}: {rel} differs from the reference of {key} ({name}): {why}")
    if close:
        check.notes.append(
            f"{close} of {check.looked_at} outputs equal the reference within the runner's rounding, not byte for byte"
        )
    return check


def deterministic(root: Path, rounds: Sequence[Mapping[str, Mapping[str, str]]], s3: Any = None) -> Check:
    """The reference rounds against the first: each later round's outputs show the same pictures
    (``compare``); byte-identical ones and close ones are counted in a note."""
    check = Check("runner deterministic")
    exact = close = 0
    for n, found in enumerate(rounds[1:], 2):
        for key, outs in sorted(found.items()):
            first = rounds[0].get(key)
            if first is None:
                continue
            if set(outs) != set(first):
                check.problems.append(f"{key}: round {n} made outputs for other inputs than round 1")
                continue
            for name, rel in sorted(outs.items()):
                check.looked_at += 1
                why = compare(root, first[name], rel, s3)
                if why is None:
                    exact += 1
                elif why == "close":
                    close += 1
                else:
                    check.problems.append(f"{key}: round {n}'s {name} differs from round 1: {why}")
    check.notes.append(f"{exact} byte-identical, {close} within the runner's rounding, of {check.looked_at}")
    return check


# --- no internal error -----------------------------------------------------------------------------


def no_internal_errors(answers: Mapping[str, int], fault_notes: Iterable[str]) -> Check:
    """No request answered with a server error other than 503 (the full volume, serve down: said with
    ``Retry-After``, by design): a 500 is a bug whatever the fault. ``answers``: ``"<kind> <code>"`` →
    how many (the stream's); ``fault_notes``: what each fault saw (the upload a replica kill cut)."""
    check = Check("no internal errors")
    for key, n in sorted(answers.items()):
        code = key.rpartition(" ")[2]
        check.looked_at += n
        if re.fullmatch(r"5[0-9][0-9]", code) and code != "503":
            check.problems.append(f"{n} × {key}")
    for note in fault_notes:
        m = re.search(r"\banswered (5[0-9][0-9])\b", note)
        if m and m[1] != "503":
            check.problems.append(f"a fault's request: {note}")
    return check


# --- nothing committed twice, no other job's file touched ------------------------------------------


def _journal(run: Path) -> dict[str, list[int]]:
    """Item → the attempts whose commit journal names it."""
    out: dict[str, list[int]] = defaultdict(list)
    folder = run / "results"
    if not folder.is_dir() or folder.is_symlink():
        return out
    for p in sorted(folder.iterdir()):
        m = _COMMITS.fullmatch(p.name)
        data = _read(p) if m else None
        for line in (data or b"").decode("utf-8", "replace").splitlines():
            try:
                item = json.loads(line)["item"]
            except (ValueError, TypeError, KeyError):
                continue
            if m and isinstance(item, str):
                out[item].append(int(m["attempt"]))
    return out


def committed_once(root: Path) -> Check:
    """Each item of each run folder committed its output once: one result line that wrote it (later
    attempts only say ``cached``), and no attempt after that one journaling it again; and no output
    path committed by two jobs (a packed job's items are its pack's lines, counted once, in the pack's
    folder)."""
    check = Check("committed once")
    owners: dict[str, set[str]] = defaultdict(set)
    for run in _runs(root):
        first: dict[str, int] = {}
        writes: Counter[str] = Counter()
        for (_, attempt), lines in _lines(run).items():
            for r in lines:
                if r.status is ItemStatus.OK and not r.cached and r.output is not None:
                    writes[r.item] += 1
                    first[r.item] = min(first.get(r.item, attempt), attempt)
                    if not (run / "packed").exists():
                        owners[named(root, r.output)].add(run.name)
        check.looked_at += len(writes)
        check.problems += [f"{run.name}: {item} committed {n} times" for item, n in sorted(writes.items()) if n > 1]
        for item, attempts in sorted(_journal(run).items()):
            later = sorted(a for a in attempts if item in first and a > first[item])
            if later:
                check.problems.append(f"{run.name}: {item} journaled again by attempt {later[0]} after its commit")
    for rel, jobs in sorted(owners.items()):
        if len(jobs) > 1 and not rel.startswith("runs/"):
            check.problems.append(f"{rel}: committed by {len(jobs)} jobs ({', '.join(sorted(jobs))})")
    return check


# --- nothing left behind ---------------------------------------------------------------------------


def _walk(top: Path) -> Iterator[tuple[Path, list[str], list[str]]]:
    for dirpath, dirnames, filenames in os.walk(top):  # never follows a link
        yield Path(dirpath), dirnames, filenames


def left_on_volume(root: Path) -> Check:
    """What a finished soak must not leave on the volume: upload staging folders, temporary outputs,
    job leases, queued or claimed inbox files, pending webhook deliveries, held quota slots."""
    check = Check("nothing left (volume)")

    def rel(p: Path) -> str:
        return p.relative_to(root).as_posix()

    tenants = root / "tenants"
    for area in sorted(tenants.iterdir()) if tenants.is_dir() else []:
        uploads = area / "uploads"
        if not area.name.startswith(".") and uploads.is_dir() and not uploads.is_symlink():
            check.problems += [f"{rel(p)}: upload staging left" for p in sorted(uploads.glob(".incoming-*"))]
    for top in (tenants, root / "runs"):
        for d, _, files in _walk(top) if top.is_dir() else []:
            check.looked_at += len(files)
            check.problems += [f"{rel(d / f)}: temporary file left" for f in sorted(files) if _TEMP.fullmatch(f)]
    for run in _runs(root):
        if (run / "lease.json").exists():
            check.problems.append(f"{rel(run / 'lease.json')}: lease left")
    inbox = root / "inbox"
    for pattern in ("*.yaml", "running/*"):
        check.problems += [f"{rel(p)}: still in the inbox" for p in sorted(inbox.glob(pattern)) if p.is_file()]
    packs = sorted(inbox.glob("packs/*.yaml"))
    if packs:  # a pack's job file, kept as a finished job's is: said, not failed
        check.notes.append(f"{len(packs)} pack job files kept in inbox/packs/")
    queue = root / "runs" / ".outbox"
    if queue.is_dir():
        check.problems += [f"{rel(p)}: webhook delivery still pending" for p in sorted(queue.iterdir())]
    quota = tenants / ".quota"
    for ledger in sorted(quota.glob("*/ledger")) if quota.is_dir() else []:
        data = _read(ledger)
        try:
            jobs = json.loads(data or b"{}").get("jobs", 0)
        except ValueError:
            jobs = "unreadable"
        if jobs != 0:
            check.problems.append(f"{rel(ledger)}: counts {jobs} unfinished jobs")
        check.problems += [f"{rel(p)}: quota slot held" for p in sorted((ledger.parent / "open").glob("*"))]
    return check


def recorded_objects(root: Path) -> dict[str, set[str]]:
    """Object URL → the jobs whose result lines (chunks' and joins') or commit journals name it as an
    output: every object a job wrote, whether its item then ended ok or not."""
    out: dict[str, set[str]] = defaultdict(set)
    for run in _runs(root):
        lines = [r for rs in _lines(run).values() for r in rs]
        joins = _read(run / "joins.jsonl")
        lines += parse_results(joins.decode("utf-8", "replace"))[0] if joins else []
        for r in lines:
            if r.output is not None and is_s3(r.output):
                out[r.output].add(run.name)
        folder = run / "results"
        for p in sorted(folder.iterdir()) if folder.is_dir() and not folder.is_symlink() else []:
            data = _read(p) if _COMMITS.fullmatch(p.name) else None
            for line in (data or b"").decode("utf-8", "replace").splitlines():
                try:
                    output = json.loads(line).get("output")
                except (ValueError, AttributeError):
                    continue
                if isinstance(output, str) and is_s3(output):
                    out[output].add(run.name)
    return out


def left_in_store(root: Path, s3: Any, bucket: str, inputs: Iterable[str]) -> Check:
    """What a finished soak must not leave in its bucket: a multipart upload not completed or aborted,
    or an object that is neither an input (under one of the ``inputs`` key prefixes) nor an output some
    job recorded (``recorded_objects``: a temporary or stray object); and a recorded output whose
    metadata names a job that did not record it (another job's object replaced)."""
    check = Check("nothing left (store)")
    prefixes = tuple(inputs)
    for page in s3.get_paginator("list_multipart_uploads").paginate(Bucket=bucket):
        for u in page.get("Uploads", []):
            check.problems.append(f"s3://{bucket}/{u['Key']}: multipart upload {u['UploadId'][:12]} left")
    recorded = recorded_objects(root)
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket):
        for obj in page.get("Contents", []):
            check.looked_at += 1
            url = f"s3://{bucket}/{obj['Key']}"
            if obj["Key"].startswith(prefixes):
                continue
            jobs = recorded.get(url)
            if not jobs:
                check.problems.append(f"{url}: no job recorded this object (a temporary or stray object)")
                continue
            owner = s3.head_object(Bucket=bucket, Key=obj["Key"]).get("Metadata", {}).get(META_JOB)
            if owner not in jobs:
                check.problems.append(f"{url}: its metadata names job {owner}, recorded by {', '.join(sorted(jobs))}")
    return check


def left_in_swarm(services: Iterable[Mapping[str, Any]], containers: Mapping[str, list[Mapping[str, Any]]]) -> Check:
    """No ffswarm chunk, lane or step service and no job container left: ``services`` as the manager's
    engine lists them, ``containers``: node → its engine's containers (all states)."""
    check = Check("nothing left (swarm)")
    for s in services:
        check.looked_at += 1
        labels = s.get("Spec", {}).get("Labels") or {}
        if "io.ffswarm.job" in labels:
            check.problems.append(f"service {s['Spec'].get('Name')} ({labels.get('io.ffswarm.role', '?')}) left")
    for node, found in sorted(containers.items()):
        for c in found:
            check.looked_at += 1
            labels = c.get("Labels") or {}
            if "io.ffswarm.job" in labels:
                names = ",".join(n.lstrip("/") for n in c.get("Names") or [])
                check.problems.append(f"{node}: container {names or c.get('Id', '?')[:12]} ({c.get('State')}) left")
    return check


# --- webhooks: each job end delivered once by id ---------------------------------------------------


def outbox(root: Path) -> dict[str, list[dict[str, Any]]]:
    """Job → its end deliveries as the outbox on the volume holds them: ``runs/<job>/deliveries/``,
    and for a job that never got a run folder (refused, cancelled while queued) its tenant's
    ``tenants/.jobs/<t>/<job>.deliveries/``."""
    folders = [(run.name, run / "deliveries") for run in _runs(root)]
    jobs = root / "tenants" / ".jobs"
    for tenant in sorted(jobs.iterdir()) if jobs.is_dir() and not jobs.is_symlink() else []:
        if tenant.is_dir() and not tenant.is_symlink():
            folders += [(p.name.removesuffix(".deliveries"), p) for p in sorted(tenant.glob("*.deliveries"))]
    out: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for job, folder in folders:
        for p in sorted(folder.glob("*.json")) if folder.is_dir() and not folder.is_symlink() else []:
            try:
                d = json.loads(_read(p) or b"")
            except ValueError:
                continue
            if isinstance(d, dict) and d.get("type") in END_TYPES:
                out[job].append(d)
    return out


def webhooks_once(root: Path, ends: Mapping[str, int | None], received: Iterable[Mapping[str, Any]]) -> Check:
    """Each job end was delivered, once by id: ``ends``: job → how many times it ended (1 + the retries
    that ran again; None for a job that never started — cancelled while queued, refused — whose
    outbox may hold nothing); ``received``: every delivery the receiver took, ``{"id", "type",
    "job"}``. A redelivery of an id already received is allowed (receivers deduplicate on it) and noted."""
    check = Check("webhooks once by id")
    got: Counter[str] = Counter()
    by_job: dict[str, set[str]] = defaultdict(set)
    for d in received:
        if d.get("type") in END_TYPES:
            got[str(d["id"])] += 1
            by_job[str(d.get("job"))].add(str(d["id"]))
    box = outbox(root)
    known = {str(d.get("id")) for ds in box.values() for d in ds}
    for job, n in sorted(ends.items()):
        check.looked_at += 1
        ids = {str(d.get("id")) for d in box.get(job, [])}
        n = len(ids) if n is None else n
        if len(ids) != n:
            check.problems.append(f"{job}: {len(ids)} end deliveries in its outbox for {n} end(s)")
        for d in box.get(job, []):
            if d.get("state") != "delivered":
                check.problems.append(f"{job}: {d.get('type')} {d.get('id')} not delivered ({d.get('state')})")
            elif str(d.get("id")) not in got:
                check.problems.append(f"{job}: {d.get('type')} {d.get('id')} marked delivered, never received")
        if len(by_job.get(job, set())) != n:
            check.problems.append(f"{job}: receiver got {len(by_job.get(job, set()))} distinct end ids for {n} end(s)")
    check.problems += [f"{i}: received but in no job's outbox" for i in sorted(set(got) - known)]
    again = sorted(i for i, n in got.items() if n > 1)
    if again:
        check.notes.append(f"{len(again)} ids redelivered (same id, deduplicated): {', '.join(again[:5])}")
    return check


# --- usage adds up ---------------------------------------------------------------------------------


def usage_adds_up(
    totals: Mapping[str, Mapping[str, Any]], jobs: Mapping[str, Iterable[Mapping[str, Any] | None]]
) -> Check:
    """Per tenant, ``GET /v1/usage``'s totals equal the sum of its jobs' own ``usage``: GPU-seconds,
    runner seconds, attempts, bytes in and out, and the item counts. ``totals``: tenant → the answer's
    ``usage``; ``jobs``: tenant → each job's ``usage`` from its status object (None: no report yet)."""
    check = Check("usage adds up")
    for tenant, total in sorted(totals.items()):
        check.looked_at += 1
        sums: Counter[str] = Counter()
        items: Counter[str] = Counter()
        for u in jobs.get(tenant, []):
            if u:
                sums.update({k: u.get(k) or 0 for k in USAGE_SUMS})
                items.update(u.get("items") or {})
        for k in USAGE_SUMS:
            want, have = float(sums[k]), float(total.get(k) or 0)
            if abs(want - have) > 1e-6 * max(1.0, abs(want)) + 0.01:
                check.problems.append(f"{tenant}: {k} {have:g} in /v1/usage, {want:g} over its jobs")
        have_items = +Counter(total.get("items") or {})
        if +items != have_items:
            check.problems.append(f"{tenant}: items {dict(have_items)} in /v1/usage, {dict(+items)} over its jobs")
    return check
