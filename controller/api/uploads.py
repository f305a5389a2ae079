"""Multipart uploads, streamed to a staging folder inside the tenant's area with every byte counted.

Each request has one byte ``Budget`` (controller/api/submit.py ``request_budget``): every file's
bytes, and later every archive's unpacked bytes, are charged to it before they are written, and the
file or archive that would pass it is refused (413, naming it); the request's body beyond its files
(multipart framing, the job part) may add at most ``FRAMING`` bytes. The cap is decided when the
request begins; what other requests of the tenant reserve meanwhile is seen by its quota ledger,
which holds every charged byte (the budget's ``claim``) before it is written, or refuses it (413).
On refusal the staging folder is emptied: nothing half-made stays; a process killed mid-upload
leaves its folder unlocked, and the next sweep of any API replica removes it
(controller/api/sweep.py). Everything is written through the staging folder's descriptor
(controller/folder.py), never by a path a runner could swap for a link. Each file part is sniffed
by its first bytes (never by name alone): a photo, a video or a ZIP, else 415. File names are
reduced to one safe component; the extension follows what the content is.
"""

from __future__ import annotations

import os
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from python_multipart.exceptions import MultipartParseError
from python_multipart.multipart import MultipartParser, parse_options_header

from controller.api.errors import ApiError
from controller.api.quota import Claim
from controller.api.slow import Lane
from controller.folder import Folder
from controller.job.ledger import OverQuota
from controller.volume import write_all

MAX_JOB_PART = 1024**2
MAX_PARTS = 10_000
RECEIVE_AHEAD = 1024**2  # a body of no declared length reserves this much ahead of its bytes, as it fits
FRAMING = MAX_JOB_PART + 4 * 1024**2  # body bytes that are not file content: the job part, part headers
_SAFE = re.compile(r"[^A-Za-z0-9._-]+")
IMAGE_EXT = {"jpeg": ".jpg", "png": ".png", "webp": ".webp", "bmp": ".bmp", "tiff": ".tif"}
VIDEO_EXT = {"mp4": ".mp4", "mkv": ".mkv", "avi": ".avi"}
KNOWN_EXT = {".jpg", ".jpeg", ".png", ".webp", ".bmp", ".tif", ".tiff", ".mp4", ".mov", ".mkv", ".webm", ".avi"}


def sniff(head: bytes) -> tuple[str, str] | None:
    """(kind, format) of a file from its first bytes: kind is image, video or zip; None: neither."""
    if head.startswith(b"\xff\xd8\xff"):
        return "image", "jpeg"
    if head.startswith(b"\x89PNG\r\n\x1a\n"):
        return "image", "png"
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return "image", "webp"
    if head[:4] == b"RIFF" and head[8:12] == b"AVI ":
        return "video", "avi"
    if head.startswith(b"BM") and len(head) >= 14:
        return "image", "bmp"
    if head[:4] in (b"II*\x00", b"MM\x00*"):
        return "image", "tiff"
    if head[4:8] == b"ftyp":
        return "video", "mp4"
    if head.startswith(b"\x1a\x45\xdf\xa3"):
        return "video", "mkv"
    if head[:4] in (b"PK\x03\x04", b"PK\x05\x06"):
        return "zip", "zip"
    return None


def safe_name(raw: str, fmt: str, kind: str) -> str:
    """One path component: the base name's safe characters, with an extension that says what it is."""
    base = _SAFE.sub("_", raw.replace("\\", "/").rsplit("/", 1)[-1]).strip("._") or "file"
    stem, ext = os.path.splitext(base)
    if kind == "zip":
        return (stem or "file")[:100] + ".zip"
    ok = (ext.lower() in KNOWN_EXT) and (kind == "image") == (
        ext.lower() not in {".mp4", ".mov", ".mkv", ".webm", ".avi"}
    )
    wanted = IMAGE_EXT.get(fmt) if kind == "image" else VIDEO_EXT.get(fmt)
    return (stem or "file")[:100] + (ext.lower() if ok else wanted or ext)


@dataclass
class Budget:
    """The bytes one request may leave on the volume, and those it has so far (``used``). ``why``
    names the limit that sets ``cap``, for the 413.

    ``claim``: the request's reservation in the tenant's quota ledger. The bytes it holds for the
    request (``held``) are taken there before they are written, checked against ``quota.stored``
    with everything the area holds and other requests have reserved at that moment — the cap alone
    was decided before they reserved anything. Without a claim, ``held`` is the most ever used."""

    cap: int
    why: str
    used: int = 0
    held: int = 0
    claim: Claim | None = field(default=None, repr=False, compare=False)

    @property
    def left(self) -> int:
        return self.cap - self.used

    def charge(self, n: int, what: str, file: str, ahead: int = 0) -> None:
        """``n`` more bytes of ``what`` (a file or an archive's entry), before they are written;
        ``ahead``: how many more to reserve at once when the ledger is asked (as they fit)."""
        if self.used + n > self.cap:
            raise too_large(self, what, file)
        self.hold(self.used + n, what, file, ahead)
        self.used += n

    def hold(self, upto: int, what: str, file: str | None, ahead: int = 0) -> None:
        """At least ``upto`` bytes held for the request (a ledger transaction only when that is more
        than it holds); 413 naming ``what`` when the tenant's stored quota has no room for them."""
        if upto <= self.held:
            return
        if self.claim is None:
            self.held = upto
            return
        try:
            self.held += self.claim.hold(upto - self.held, max(min(ahead, self.cap - upto), 0))
        except OverQuota:
            raise ApiError(
                413, "too_large",
                f"{what} would pass what is left of this tenant's stored quota (quota.stored, {self.claim.limit} "
                "bytes, less what its area holds and its other requests are writing)",
                file=file,
            ) from None  # fmt: skip

    def let_go(self) -> None:
        """The claim's lent descriptor closed (a worker process's copy) and the claim dropped: the
        budget goes back to the API as numbers."""
        if self.claim is not None:
            self.claim.lent.close()
            self.claim = None

    def release(self, n: int) -> None:
        """Bytes removed again (an archive, once unpacked)."""
        self.used -= n


def too_large(budget: Budget, what: str, file: str | None = None) -> ApiError:
    return ApiError(
        413, "too_large", f"{what} passed this request's budget of {budget.cap} bytes ({budget.why})", file=file
    )


@dataclass
class Part:
    field: str
    filename: str
    name: str = ""  # its name in the staging folder's ``<field>/`` once complete
    head: bytes = b""
    size: int = 0
    kind: str = ""
    shown: str = ""  # as errors name it


@dataclass
class Upload:
    folder: Folder  # the staging folder (held open; not closed by the Upload)
    job: bytes | None = None
    files: list[Part] = field(default_factory=list)
    total: int = 0


class _Receiver:
    def __init__(self, folder: Folder, budget: Budget) -> None:
        self.up = Upload(folder)
        self.budget = budget
        self.headers: dict[bytes, bytes] = {}
        self._hf: list[bytes] = []
        self._hv: list[bytes] = []
        self.part: Part | None = None
        self.fd = -1
        self.parts: Folder | None = None  # ``.parts/``: files while they arrive
        self.fields: dict[str, Folder] = {}  # ``source/``, ``targets/``
        self.job = bytearray()
        self.in_job = False
        self.names: set[str] = set()

    def callbacks(self) -> dict[str, object]:
        return {
            "on_part_begin": self.begin,
            "on_header_field": lambda d, s, e: self._hf.append(d[s:e]),
            "on_header_value": lambda d, s, e: self._hv.append(d[s:e]),
            "on_header_end": self.header_end,
            "on_headers_finished": self.headers_done,
            "on_part_data": self.data,
            "on_part_end": self.end,
        }

    def begin(self) -> None:
        self.headers = {}

    def header_end(self) -> None:
        self.headers[b"".join(self._hf).lower()] = b"".join(self._hv).strip()
        self._hf.clear()
        self._hv.clear()

    def headers_done(self) -> None:
        _, opts = parse_options_header(self.headers.get(b"content-disposition"))
        name = opts.get(b"name", b"").decode("utf-8", "replace")
        filename = opts.get(b"filename")
        if name == "job" and filename is None:
            self.in_job = True
            return
        if name not in ("source", "targets"):
            raise ApiError(
                400, "bad_request", f"unknown form field {name[:40]!r} (source, targets, job)", field=name[:40]
            )
        if len(self.up.files) >= MAX_PARTS:
            raise ApiError(400, "bad_request", f"more than {MAX_PARTS} files in one request")
        self.part = Part(name, (filename or b"file").decode("utf-8", "replace"))
        self.part.shown = safe_name(self.part.filename, "", "image")[:80]
        if self.parts is None:
            self.parts = self.up.folder.sub(".parts", create=True)
        self.fd = self.parts.create(str(len(self.up.files)))

    def data(self, d: bytes, s: int, e: int) -> None:
        chunk = d[s:e]
        if self.in_job:
            self.job += chunk
            if len(self.job) > MAX_JOB_PART:
                raise ApiError(413, "too_large", f"the job part is over {MAX_JOB_PART} bytes", field="job")
            return
        part = self.part
        assert part is not None and self.fd >= 0
        self.budget.charge(len(chunk), f"{part.field} file {part.shown!r}", part.shown, RECEIVE_AHEAD)
        if len(part.head) < 16:
            part.head += chunk[: 16 - len(part.head)]
        part.size += len(chunk)
        write_all(self.fd, chunk)

    def end(self) -> None:
        if self.in_job:
            self.in_job = False
            self.up.job = bytes(self.job)
            return
        assert self.part is not None and self.fd >= 0 and self.parts is not None
        os.close(self.fd)
        self.fd = -1
        part, self.part = self.part, None
        found = sniff(part.head)
        if found is None or (part.field == "source" and found[0] != "image"):
            what = "a photo" if part.field == "source" else "a photo, a video or a ZIP archive"
            raise ApiError(
                415, "unsupported_media", f"{part.field} file {part.shown!r} is not {what}",
                field=part.field, file=part.shown,
            )  # fmt: skip
        part.kind = found[0]
        name = safe_name(part.filename, found[1], found[0])
        stem, ext = os.path.splitext(name)
        n = 2
        while f"{part.field}/{name}" in self.names:
            name, n = f"{stem}-{n}{ext}", n + 1
        self.names.add(f"{part.field}/{name}")
        if part.field not in self.fields:
            self.fields[part.field] = self.up.folder.sub(part.field, create=True)
        self.parts.move(str(len(self.up.files)), self.fields[part.field], name)
        part.name = name
        self.up.files.append(part)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
        for folder in [self.parts, *self.fields.values()]:
            if folder is not None:
                folder.close()


async def receive(
    content_type: str, length: str | None, body: AsyncIterator[bytes], folder: Folder, budget: Budget, lane: Lane
) -> Upload:
    """Stream a multipart body into the staging ``folder``: an empty folder this process holds
    (controller/api/sweep.py ``Staging``: its lock proves the upload alive to other replicas' sweeps).
    Each piece is parsed and written in the tenant's ``lane`` of the slow pool, never on the event
    loop or the threads of quick reads. On any refusal the staging folder is emptied before the
    error is raised."""
    ctype, params = parse_options_header(content_type)
    boundary = params.get(b"boundary")
    if ctype != b"multipart/form-data" or not boundary:
        raise ApiError(415, "unsupported_media", "send JSON (application/json) or multipart/form-data")
    cap = budget.left + FRAMING
    if length is not None and length.isdigit() and int(length) > cap:
        raise too_large(budget, f"the request ({int(length)} bytes)")
    rx = _Receiver(folder, budget)
    try:
        parser = MultipartParser(boundary, rx.callbacks())  # type: ignore[arg-type]
        async for chunk in body:  # each piece on disk as it comes: the upload's progress is visible
            rx.up.total += len(chunk)
            if rx.up.total > cap:
                raise too_large(budget, f"the request (over {cap} bytes with its framing)")
            await lane.run(parser.write, chunk)
        await lane.run(parser.finalize)
        if rx.part is not None or rx.in_job:
            raise ApiError(400, "bad_request", "the multipart body ended inside a part")
        rx.close()
        folder.remove(".parts")
        return rx.up
    except MultipartParseError:
        rx.close()
        folder.clear()
        raise ApiError(400, "bad_request", "the multipart body could not be parsed") from None
    except BaseException:
        rx.close()
        folder.clear()
        raise
