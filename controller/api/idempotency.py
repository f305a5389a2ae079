"""``Idempotency-Key`` on ``POST /v1/jobs``: a client whose connection dropped sends the same request
again and gets the same job, never a second one.

The API keeps no state of its own, so the key lives on the shared volume, in the tenant's record
folder (the API's, never the runner's): ``tenants/.jobs/<t>/.keys/<sha256(key)>.json``. The first
request with a key creates that file with O_EXCL semantics (a hidden temporary file hard-linked to
the name, which fails if the name exists), so of two requests racing on one key — on one replica or
two — exactly one makes the job; the other is told the first is still in progress (409) until it
is done, then gets its answer. The record holds the digest of the request's body and, once the job
is accepted, the 202 answer; the key itself is never stored.

- The same tenant and key within 24 h: the same 202 body (same id), ``Idempotent-Replayed: true``,
  nothing created, no quota spent. A different body: 422 ``idempotency_mismatch``.
- What counts as "the body": for JSON, the parsed object (whitespace and key order do not matter);
  for multipart, each part in order — its field name, its file name and the sha256 of its bytes, and
  the job part's bytes — never the boundary, which clients choose anew for each request.
- A refused request (4xx, 5xx) does not keep the key: the client may fix the cause and send it again.
- A record left in progress by a killed API process is taken over after an hour; records older than
  24 h are replaced by a new request with their key, and removed by ``sweep``.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import re
import stat
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from python_multipart.exceptions import MultipartParseError
from python_multipart.multipart import MultipartParser, parse_options_header
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.types import Message

from controller.api.area import Area
from controller.api.errors import ApiError
from controller.volume import read_nofollow, write_atomic

HEADER = "Idempotency-Key"
_KEY = re.compile(r"[\x20-\x7e]{1,200}")
TTL = 24 * 3600.0
PENDING_STALE = 3600.0  # an in-progress record this old was left by a killed API process
MAX_RECORD = 64 * 1024
FOLDER = ".keys"


def parse_key(raw: str | None) -> str | None:
    if raw is None:
        return None
    if not _KEY.fullmatch(raw):
        raise ApiError(400, "bad_request", "must be 1 to 200 printable ASCII characters", field=HEADER)
    return raw


@dataclass(frozen=True)
class Record:
    token: str  # the request that holds the key
    created: float
    body: str | None  # the body's digest; None while a multipart body is still arriving
    answer: dict[str, Any] | None  # the 202 body once the job was accepted; None: in progress

    def to_json(self) -> bytes:
        return json.dumps(
            {"token": self.token, "created": self.created, "body": self.body, "answer": self.answer}
        ).encode()

    @staticmethod
    def parse(data: bytes) -> Record | None:
        try:
            d = json.loads(data)
        except ValueError:
            return None
        if not isinstance(d, dict) or not isinstance(d.get("token"), str):
            return None
        created, body, answer = d.get("created"), d.get("body"), d.get("answer")
        if not isinstance(created, int | float) or isinstance(created, bool):
            return None
        if body is not None and not isinstance(body, str) or answer is not None and not isinstance(answer, dict):
            return None
        return Record(d["token"], float(created), body, answer)


class Keys:
    """One tenant's idempotency records."""

    def __init__(self, area: Area) -> None:
        self.folder = area.records / FOLDER
        with contextlib.suppress(FileExistsError):
            os.mkdir(self.folder, 0o755)
        st = os.lstat(self.folder)
        if not stat.S_ISDIR(st.st_mode) or st.st_uid not in (0, os.geteuid()) or st.st_mode & 0o022:
            raise OSError(f"{area.root_rel(self.folder)} is not the API's folder")

    def path(self, key: str) -> Path:
        return self.folder / f"{hashlib.sha256(key.encode()).hexdigest()}.json"

    def begin(self, key: str, body: str | None, now: float | None = None) -> tuple[str | None, Record | None]:
        """(token, None): this request holds the key now; (None, record): a request with it was
        accepted already. 409 while another request with it is in progress."""
        path = self.path(key)
        for _ in range(5):
            now_ = time.time() if now is None else now
            data = read_nofollow(path, MAX_RECORD)
            if data is None:
                token = uuid.uuid4().hex
                if self._create(path, Record(token, now_, body, None).to_json()):
                    return token, None
                continue  # another request took the key this moment: look again
            rec = Record.parse(data)
            age = now_ - rec.created if rec is not None else TTL
            if rec is None or age >= TTL or (rec.answer is None and age >= PENDING_STALE):
                self._remove_if(path, data)  # expired, abandoned or unreadable: the key is free again
                continue
            if rec.answer is None:
                raise ApiError(
                    409, "idempotency_in_progress",
                    "a request with this Idempotency-Key is still being handled; ask again in a moment",
                    headers={"Retry-After": "1"},
                )  # fmt: skip
            return None, rec
        raise ApiError(409, "idempotency_in_progress", "this Idempotency-Key is contended; ask again in a moment",
                       headers={"Retry-After": "1"})  # fmt: skip

    def finish(self, key: str, token: str, body: str, answer: dict[str, Any], created: float) -> None:
        write_atomic(self.path(key), Record(token, created, body, answer).to_json())

    def release(self, key: str, token: str) -> None:
        """Give the key up after a refusal, unless another request holds it by now."""
        path = self.path(key)
        data = read_nofollow(path, MAX_RECORD)
        rec = Record.parse(data) if data is not None else None
        if rec is not None and rec.token == token:
            self._remove_if(path, data)  # type: ignore[arg-type]

    def _create(self, path: Path, data: bytes) -> bool:
        tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
        try:
            os.write(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        try:
            os.link(tmp, path)
            return True
        except FileExistsError:
            return False
        finally:
            tmp.unlink(missing_ok=True)

    def _remove_if(self, path: Path, data: bytes) -> None:
        """Remove ``path`` if it still holds ``data``: moved aside first, and put back (never over a
        newer one) if another request had replaced it meanwhile."""
        aside = path.with_name(f".{path.name}.{uuid.uuid4().hex}.old")
        try:
            os.rename(path, aside)
        except FileNotFoundError:
            return
        try:
            if read_nofollow(aside, MAX_RECORD) != data:
                with contextlib.suppress(FileExistsError):
                    os.link(aside, path)
        finally:
            aside.unlink(missing_ok=True)


def sweep(area: Area, now: float | None = None) -> int:
    """Remove the tenant's records older than 24 h (and temporary files a killed process left)."""
    folder = area.records / FOLDER
    now = time.time() if now is None else now
    removed = 0
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return 0
    for e in entries:
        try:
            if e.is_file(follow_symlinks=False) and now - e.stat(follow_symlinks=False).st_mtime >= TTL:
                os.unlink(e.path)
                removed += 1
        except OSError:
            continue
    return removed


# -- the body's digest -----------------------------------------------------------------------------
def json_digest(body: bytes) -> str:
    try:
        canonical = json.dumps(json.loads(body), sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    except ValueError:  # refused later as not JSON; the bytes then
        return "raw:" + hashlib.sha256(body).hexdigest()
    return "json:" + hashlib.sha256(canonical.encode("utf-8", "surrogatepass")).hexdigest()


class PartsDigest:
    """Each part's field, file name and content digest, in order, fed the raw multipart bytes."""

    def __init__(self, content_type: str) -> None:
        _, params = parse_options_header(content_type)
        boundary = params.get(b"boundary") or b"-"
        self.parts: list[list[str]] = []
        self.headers: dict[bytes, bytes] = {}
        self._hf: list[bytes] = []
        self._hv: list[bytes] = []
        self.current = hashlib.sha256()
        self.ok = True
        self.parser = MultipartParser(boundary, {
            "on_part_begin": self._begin,
            "on_header_field": lambda d, s, e: self._hf.append(d[s:e]),
            "on_header_value": lambda d, s, e: self._hv.append(d[s:e]),
            "on_header_end": self._header_end,
            "on_part_data": lambda d, s, e: self.current.update(d[s:e]),
            "on_part_end": self._end,
        })  # fmt: skip

    def _begin(self) -> None:
        self.headers = {}
        self.current = hashlib.sha256()

    def _header_end(self) -> None:
        self.headers[b"".join(self._hf).lower()] = b"".join(self._hv).strip()
        self._hf.clear()
        self._hv.clear()

    def _end(self) -> None:
        _, opts = parse_options_header(self.headers.get(b"content-disposition"))
        name = opts.get(b"name", b"").decode("utf-8", "replace")
        filename = opts.get(b"filename")
        self.parts.append(
            [name, "" if filename is None else filename.decode("utf-8", "replace"), self.current.hexdigest()]
        )

    def feed(self, chunk: bytes) -> None:
        if self.ok:
            try:
                self.parser.write(chunk)
            except MultipartParseError:
                self.ok = False

    def hexdigest(self) -> str:
        return "multipart:" + hashlib.sha256(json.dumps(self.parts).encode()).hexdigest()


# -- the route -------------------------------------------------------------------------------------
Post = Callable[[Request], Awaitable[Response]]


def _replay(record: Record) -> Response:
    assert record.answer is not None
    headers = {"Idempotent-Replayed": "true"}
    if isinstance(record.answer.get("status_url"), str):
        headers["Location"] = record.answer["status_url"]
    return JSONResponse(record.answer, status_code=202, headers=headers)


def _mismatch() -> ApiError:
    return ApiError(
        422, "idempotency_mismatch",
        "this Idempotency-Key was used within 24 h with a different request body; use a new key",
        field=HEADER,
    )  # fmt: skip


async def post_job(request: Request, area: Area, post: Post, json_cap: int, upload_cap: int) -> Response:
    """``post`` (the ordinary POST /v1/jobs) run at most once per tenant and key; ``area``: the caller's."""
    key = parse_key(request.headers.get(HEADER.lower()))
    if key is None:
        return await post(request)
    keys = await asyncio.to_thread(Keys, area)
    is_json = request.headers.get("content-type", "").split(";")[0].strip().lower() == "application/json"
    if is_json:
        body = await read_body(request, json_cap, "a JSON job is at most {cap} bytes")
        digest: str | None = json_digest(body)
        token, done = await asyncio.to_thread(keys.begin, key, digest)
        if done is not None:
            if done.body != digest:
                raise _mismatch()
            return _replay(done)
        inner = Request(request.scope, _replayed(body))
        parts = None
    else:
        digest = None
        token, done = await asyncio.to_thread(keys.begin, key, None)
        parts = PartsDigest(request.headers.get("content-type", ""))
        if done is not None:  # the body is needed only for its digest: counted, never stored
            total = 0
            async for chunk in request.stream():
                total += len(chunk)
                if total > upload_cap:
                    raise ApiError(
                        413, "too_large", f"the upload passed {upload_cap} bytes, this tenant's cap per request"
                    )
                parts.feed(chunk)
            if not parts.ok or done.body != parts.hexdigest():
                raise _mismatch()
            return _replay(done)
        inner = Request(request.scope, _teed(request, parts))
    assert token is not None
    created = time.time()
    try:
        answer = await post(inner)
    except BaseException:
        await asyncio.to_thread(keys.release, key, token)
        raise
    if answer.status_code != 202:
        await asyncio.to_thread(keys.release, key, token)
        return answer
    final = digest if parts is None else parts.hexdigest()
    assert final is not None
    await asyncio.to_thread(keys.finish, key, token, final, json.loads(bytes(answer.body)), created)
    return answer


async def read_body(request: Request, cap: int, too_large: str) -> bytes:
    buf = bytearray()
    async for chunk in request.stream():
        buf += chunk
        if len(buf) > cap:
            raise ApiError(413, "too_large", too_large.format(cap=cap))
    return bytes(buf)


def _replayed(body: bytes) -> Callable[[], Awaitable[Message]]:
    sent = False

    async def receive() -> Message:
        nonlocal sent
        if sent:
            return {"type": "http.disconnect"}
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    return receive


def _teed(request: Request, parts: PartsDigest) -> Callable[[], Awaitable[Message]]:
    async def receive() -> Message:
        message = await request.receive()
        if message["type"] == "http.request":
            parts.feed(message.get("body", b""))
        return message

    return receive
