"""One byte budget per upload request, and ZIP archives checked entry by entry, through the real API
on loopback: what crosses a limit is refused (413 or 400) naming the file, archive and entry, and
nothing of the request stays on the volume or reaches the inbox; no refusal is a 500 or an error log."""

from __future__ import annotations

import io
import random
import struct
import warnings
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
import yaml
from structlog.testing import capture_logs

from controller.config import parse_config
from tests.builders import JPEG, Env, beat, leftovers, make_config, serve_api, zip_bytes


def _env(tmp_path: Path, quota: dict[str, object], api: dict[str, object] | None = None) -> Iterator[Env]:
    config, key = make_config(tmp_path, quota=quota)
    if api:
        data = yaml.safe_load(config.path.read_text())
        data["api"].update(api)
        config.path.write_text(yaml.safe_dump(data))
        config = parse_config(config.path, data)
    beat(config)
    for url in serve_api(config):
        yield Env(config, config.data_root, url, key)


@pytest.fixture
def env(tmp_path: Path) -> Iterator[Env]:
    yield from _env(tmp_path, {"upload": "64k", "jobs_queued": 100})


def post(env: Env, files: list[tuple[str, tuple[str, bytes]]]) -> httpx.Response:
    with capture_logs() as logs, env.client() as c:
        r = c.post("/v1/jobs", files=[("source", ("me.jpg", JPEG)), *files])
    assert not [e for e in logs if e.get("log_level") in ("error", "critical")], logs  # never a traceback
    return r


def nothing_kept(env: Env) -> None:
    assert leftovers(env.area()) == []
    assert not list((env.root / "inbox").glob("*.yaml"))


def compressible(n: int, seed: int = 1) -> bytes:
    """A photo of ``n`` bytes that deflates about eightfold: well within the ratio."""
    return JPEG + bytes(random.Random(seed).choices(b"ab", k=n - len(JPEG)))


def deflated(entries: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        for name, data in entries.items():
            zf.writestr(name, data)
    return buf.getvalue()


# --- one budget per request ---------------------------------------------------------------------


def test_archives_share_one_budget_and_the_archive_that_crosses_it_is_413_naming_it(env: Env) -> None:
    a, b = deflated({"a.jpg": compressible(40_000)}), deflated({"b.jpg": compressible(40_000, 2)})
    assert len(a) + len(b) < 20_000  # each alone fits the 64 KiB; both unpacked do not
    r = post(env, [("targets", ("a.zip", a)), ("targets", ("b.zip", b))])
    assert r.status_code == 413, r.text
    err = r.json()["error"]
    assert err["code"] == "too_large" and err["file"] == "b.zip"
    assert (
        "archive 'b.zip'" in err["message"] and "65536 bytes (this tenant's upload cap per request)" in err["message"]
    )
    nothing_kept(env)
    ok = post(env, [("targets", ("a.zip", a))])
    assert ok.status_code == 202, ok.text


def test_plain_files_and_unpacked_bytes_count_together(env: Env) -> None:
    archive = deflated({"a.jpg": compressible(40_000)})
    r = post(env, [("targets", ("a.zip", archive)), ("targets", ("big.jpg", compressible(30_000)))])
    assert r.status_code == 413 and r.json()["error"]["file"] == "a.zip", r.text
    nothing_kept(env)


def test_a_file_over_what_is_left_of_the_stored_quota_is_413_naming_it(tmp_path: Path) -> None:
    for env in _env(tmp_path, {"upload": "64k", "stored": "50k"}):
        env.area().mkdir(parents=True)
        (env.area() / "old.jpg").write_bytes(b"\0" * 40_000)  # 10 KiB or so left of 50 KiB
        r = post(env, [("targets", ("t.jpg", compressible(20_000)))])
        assert r.status_code == 413, r.text
        err = r.json()["error"]
        assert err["file"] == "t.jpg" and "what is left of this tenant's stored quota" in err["message"]
        assert leftovers(env.area()) == ["old.jpg"]
        assert post(env, [("targets", ("t.jpg", compressible(5_000)))]).status_code == 202


def test_api_max_request_bytes_caps_every_tenant(tmp_path: Path) -> None:
    for env in _env(tmp_path, {"upload": "64k"}, api={"max_request_bytes": "16k"}):
        r = post(env, [("targets", ("a.zip", deflated({"a.jpg": compressible(20_000)})))])
        assert r.status_code == 413 and "(api.max_request_bytes)" in r.json()["error"]["message"], r.text
        assert r.json()["error"]["file"] == "a.zip"
        nothing_kept(env)


# --- ZIP archives --------------------------------------------------------------------------------


def test_a_small_entry_that_unpacks_past_the_ratio_is_refused_however_small(env: Env) -> None:
    bomb = deflated({"ok.jpg": JPEG, "bomb.jpg": JPEG + b"\0" * (1024**2 - len(JPEG))})
    packed = next(i.compress_size for i in zipfile.ZipFile(io.BytesIO(bomb)).infolist() if i.filename == "bomb.jpg")
    assert packed < 1_200  # 1 MiB from about a kilobyte: over 200 times
    r = post(env, [("targets", ("small.zip", bomb))])
    assert r.status_code == 400, r.text
    assert r.json()["error"] == {
        "code": "bad_zip", "file": "small.zip",
        "message": "small.zip: entry 'bomb.jpg' unpacks more than 200 times its packed size",
    }  # fmt: skip
    nothing_kept(env)


def _central(data: bytes, name: str) -> int:
    """Offset of ``name``'s central directory header (walked from the end record)."""
    at = int(struct.unpack_from("<I", data, data.rindex(b"PK\x05\x06") + 16)[0])
    while data[at : at + 4] == b"PK\x01\x02":
        n, m, k = struct.unpack_from("<HHH", data, at + 28)
        if data[at + 46 : at + 46 + n] == name.encode():
            return at
        at += 46 + n + m + k
    raise AssertionError(name)


def _local(data: bytes, name: str) -> int:
    return int(struct.unpack_from("<I", data, _central(data, name) + 42)[0])


def _patch(data: bytes, at: int, fmt: str, value: int) -> bytes:
    out = bytearray(data)
    struct.pack_into(fmt, out, at, value)
    return bytes(out)


def _lying_sizes() -> bytes:  # the directory claims a megabyte was packed: each entry passes, the archive not
    data = deflated({"big.jpg": JPEG + b"\0" * 1024**2})
    return _patch(data, _central(data, "big.jpg") + 20, "<I", 1024**2)


def _bad_crc() -> bytes:
    data = zip_bytes({"ok.jpg": JPEG, "a.jpg": JPEG})
    at = _local(data, "a.jpg") + 30 + len("a.jpg") + 100  # a byte of a.jpg's content (stored)
    return data[:at] + bytes([data[at] ^ 0xFF]) + data[at + 1 :]


def _corrupt_deflate() -> bytes:
    data = deflated({"a.jpg": compressible(5_000)})
    at = _local(data, "a.jpg") + 30 + len("a.jpg")
    return data[:at] + b"\xff" * 64 + data[at + 64 :]


def _method(method: int) -> Callable[[], bytes]:
    def make() -> bytes:
        data = zip_bytes({"a.jpg": JPEG})
        data = _patch(data, _local(data, "a.jpg") + 8, "<H", method)
        return _patch(data, _central(data, "a.jpg") + 10, "<H", method)

    return make


def _encrypted() -> bytes:
    data = zip_bytes({"a.jpg": JPEG})
    return _patch(data, _central(data, "a.jpg") + 8, "<H", 0x1)


def _duplicate() -> bytes:
    buf = io.BytesIO()
    with warnings.catch_warnings(), zipfile.ZipFile(buf, "w") as zf:
        warnings.simplefilter("ignore")  # zipfile warns of the duplicate name it writes
        zf.writestr("set/a.jpg", JPEG)
        zf.writestr("set/a.jpg", JPEG)
    return buf.getvalue()


@pytest.mark.parametrize(
    ("make", "entry", "words"),
    [
        (_lying_sizes, None, "p.zip: unpacks more than 200 times its size"),
        (_bad_crc, "a.jpg", "is damaged (its CRC-32 does not match)"),
        (_corrupt_deflate, "a.jpg", "is damaged or truncated (it cannot be decompressed)"),
        (_method(99), "a.jpg", "uses compression method 99 (stored, deflate, bzip2 and LZMA are unpacked)"),
        (_encrypted, "a.jpg", "is encrypted"),
        (
            lambda: deflated({"a.jpg": compressible(5_000)})[:-40],
            None,
            "not a readable ZIP archive (damaged or truncated)",
        ),
        (_duplicate, "set/a.jpg", "appears twice in the archive"),
        (lambda: zip_bytes({"a/b/c/d/e/f/g/h/i/x.jpg": JPEG}), "a/b/c/d/e/f/g/h/i/x.jpg", "more than 8 folders deep"),
        (lambda: zip_bytes({"x" * 256 + ".jpg": JPEG}), "x" * 196, "has a folder or file name over 255 bytes"),
        (lambda: zip_bytes({"/".join(["d" * 200] * 30) + "/x.jpg": JPEG}), "d" * 190, "has a name over 1024 bytes"),
        (lambda: zip_bytes({"x.jpg": JPEG, "x.jpg/y.jpg": JPEG}), "x.jpg/y.jpg", "has the name of another entry's"),
    ],
    ids=[
        "lying-sizes",
        "bad-crc",
        "corrupt-deflate",
        "unknown-method",
        "encrypted",
        "truncated",
        "duplicate",
        "too-deep",
        "long-name",
        "long-path",
        "file-and-folder",
    ],  # fmt: skip
)
def test_a_malformed_archive_is_400_naming_the_archive_and_entry_and_leaves_nothing(
    env: Env, make: Callable[[], bytes], entry: str | None, words: str
) -> None:
    r = post(env, [("targets", ("ok.jpg", JPEG)), ("targets", ("p.zip", make()))])
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["code"] == "bad_zip" and err["file"] == "p.zip" and err["message"].startswith("p.zip: ")
    assert words in err["message"]
    if entry is not None:
        assert f"entry '{entry}" in err["message"]
    nothing_kept(env)


def test_limits_are_settings_and_a_legit_archive_within_them_unpacks(tmp_path: Path) -> None:
    api: dict[str, object] = {"max_zip_depth": 2, "max_zip_ratio": 2000, "max_zip_name_bytes": 20}
    for env in _env(tmp_path, {"upload": "4m"}, api=api):
        deep = zip_bytes({"a/b/c/x.jpg": JPEG})
        assert "more than 2 folders deep" in post(env, [("targets", ("p.zip", deep))]).text
        assert "over 20 bytes" in post(env, [("targets", ("p.zip", zip_bytes({"n" * 21 + ".jpg": JPEG})))]).text
        fine = deflated({"a/b/x.jpg": JPEG + b"\0" * 300_000, "a/y.jpg": compressible(3_000)})  # ~1000x: allowed here
        r = post(env, [("targets", ("p.zip", fine))])
        assert r.status_code == 202, r.text
        up = env.area() / "uploads" / r.json()["id"]
        assert sorted(p.relative_to(up).as_posix() for p in up.rglob("*") if p.is_file()) == [
            "source/me.jpg", "targets/p/a/b/x.jpg", "targets/p/a/y.jpg"
        ]  # fmt: skip
