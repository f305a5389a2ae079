"""The controller's object storage (docs/storage.md): s3:// URLs, the storage: config, the credentials
file, and listing / HEAD / presigned links against Ceph RGW, a real S3 server on loopback
(scripts/s3-server.sh; the ``s3`` fixture, tests/fixtures/rgw_server.py), over HTTP like any S3.

Wrong credentials and another user's bucket are refused by the server's SigV4 check and its access
control, not by us; a tampered or expired link is refused too (tests/unit/test_s3_rgw.py).
"""

from __future__ import annotations

import http.server
import socket
import threading
import traceback
from pathlib import Path

import httpx
import pytest

from contract.s3 import Credentials, S3Url
from controller.config import parse_config
from controller.errors import ConfigError, FfswarmError
from controller.settings.fields import FieldError
from controller.storage.errors import ObjectMissing, StorageAccessError, StorageTemporaryError, TooManyObjects
from controller.storage.s3 import S3Store, make_client
from controller.storage.settings import S3Settings, parse_storage, read_credentials
from controller.storage.url import parse_url
from tests.fixtures.rgw_server import MANY, Seeded

# --- URLs -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "bucket", "key", "prefix", "glob"),
    [
        ("s3://media/crowd/a.jpg", "media", "crowd/a.jpg", "crowd/a.jpg", False),
        ("s3://my.bucket-1/crowd/*.jpg", "my.bucket-1", "crowd/*.jpg", "crowd/", True),
        ("s3://b12/crowd/**/*.png", "b12", "crowd/**/*.png", "crowd/", True),
        ("s3://b12/crowd/img_?.jpg", "b12", "crowd/img_?.jpg", "crowd/img_", True),
        ("s3://b12/out/", "b12", "out/", "out/", False),
        ("s3://b12/ünï cödé [1].jpg", "b12", "ünï cödé [1].jpg", "ünï cödé [1].jpg", False),
    ],
)
def test_urls_parse_into_bucket_key_and_listing_prefix(
    text: str, bucket: str, key: str, prefix: str, glob: bool
) -> None:
    url = S3Url.parse(text)
    assert (url.bucket, url.key, url.prefix, url.is_glob) == (bucket, key, prefix, glob)
    assert str(url) == text


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("/data/crowd/a.jpg", "must be an s3://bucket/key URL"),
        ("s3://media", "s3://media names a bucket but no key"),
        ("s3://media/", "names a bucket but no key"),
        ("s3:///key", "the bucket name is empty"),
        ("s3://ab/key", "bucket 'ab' must be 3 to 63 characters long"),
        ("s3://Media/key", "bucket 'Media' may hold only a-z, 0-9"),
        ("s3://under_score/key", "may hold only a-z, 0-9"),
        ("s3://-media/key", "must begin and end with a letter or digit"),
        ("s3://my..bucket/key", "bucket 'my..bucket' must not have '..'"),
        ("s3://192.168.10.1/key", "must not be an IP address"),
        ("s3://xn--media/key", "uses a prefix or suffix S3 reserves"),
        ("s3://media/a/../etc/passwd", "has a '.' or '..' segment"),
        ("s3://media/a\x07b.jpg", "control character (U+0007)"),
        ("s3://media/a\nb.jpg", "control character (U+000A)"),
        ("s3://media/" + "é" * 513, "longer than 1024 bytes"),
        ("s3://media//a.jpg", "empty path segment"),
        ("s3://media/a//b.jpg", "empty path segment"),
        ("s3://media/crowd/a**/*.jpg", "'**' must be a whole path segment"),
    ],
)
def test_bad_urls_are_refused_naming_what_is_wrong(text: str, words: str) -> None:
    with pytest.raises(FieldError) as e:
        parse_url(text, "targets[2]")
    assert e.value.field == "targets[2]" and words in str(e.value)


def test_a_key_of_exactly_1024_bytes_is_fine() -> None:
    assert len(S3Url.parse("s3://media/" + "k" * 1024).key) == 1024


@pytest.mark.parametrize(
    ("glob", "yes", "no"),
    [
        ("crowd/*.jpg", ["crowd/a.jpg", "crowd/.jpg"], ["crowd/sub/a.jpg", "crowd/a.png", "crowd/a.jpg.txt"]),
        ("crowd/**/*.png", ["crowd/a.png", "crowd/x/y/a.png"], ["crowd/a.jpg", "crowdy/a.png", "other/crowd/a.png"]),
        ("crowd/**", ["crowd/a", "crowd/x/y.z"], ["crowdy/a"]),
        ("crowd/img_?.jpg", ["crowd/img_1.jpg"], ["crowd/img_12.jpg", "crowd/img_/.jpg"]),
        ("crowd/[ab].jpg", ["crowd/[ab].jpg"], ["crowd/a.jpg"]),  # brackets are literal, not a class
        ("*/a.jpg", ["x/a.jpg"], ["x/y/a.jpg"]),
    ],
)
def test_globs_match_within_segments_and_double_star_across(glob: str, yes: list[str], no: list[str]) -> None:
    url = S3Url.parse(f"s3://media/{glob}")
    assert [k for k in yes if url.matches(k)] == yes
    assert [k for k in no if url.matches(k)] == []


# --- config and credentials -------------------------------------------------------------------------


def test_the_storage_section_is_read_with_its_defaults(tmp_path: Path) -> None:
    s3 = {"endpoint_url": "http://minio.internal:9000/", "credentials_secret": "ffswarm-s3", "link_ttl": "2d"}
    c = parse_config(tmp_path / "c.yaml", {"data_root": str(tmp_path), "storage": {"s3": s3}})
    assert c.storage.s3 == S3Settings(
        credentials_secret="ffswarm-s3",
        credentials_file=Path("/run/secrets/ffswarm-s3"),
        endpoint_url="http://minio.internal:9000",
        region="us-east-1",
        addressing="path",
        link_ttl=2 * 86400,
    )
    assert parse_config(tmp_path / "c.yaml", {"data_root": str(tmp_path)}).storage.s3 is None
    assert parse_storage({"s3": {"credentials_secret": "s", "addressing": "virtual"}}).s3.addressing == "virtual"  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("s3", "words"),
    [
        ({"credentials_secret": "s", "endpont_url": "http://x"}, "storage.s3.endpont_url: unknown key (did you mean"),
        ({"endpoint_url": "http://x"}, "storage.s3.credentials_secret: is required"),
        ({"credentials_secret": "bad name!"}, "storage.s3.credentials_secret: must be a Docker secret name"),
        (
            {"credentials_secret": "s", "credentials_file": "rel/path"},
            "storage.s3.credentials_file: must be an absolute",
        ),
        ({"credentials_secret": "s", "endpoint_url": "ftp://x"}, "storage.s3.endpoint_url: must be http(s)://HOST"),
        ({"credentials_secret": "s", "addressing": "dns"}, "storage.s3.addressing: unknown addressing style 'dns'"),
        ({"credentials_secret": "s", "region": "US East"}, "storage.s3.region: must be a region like us-east-1"),
        ({"credentials_secret": "s", "link_ttl": "8d"}, "storage.s3.link_ttl: S3 presigned links live at most 7d"),
        ({"credentials_secret": "s", "link_ttl": 0}, "storage.s3.link_ttl: must be a duration longer than zero"),
    ],
)
def test_bad_storage_settings_name_the_key(tmp_path: Path, s3: dict[str, object], words: str) -> None:
    with pytest.raises(ConfigError) as e:
        parse_config(tmp_path / "c.yaml", {"data_root": str(tmp_path), "storage": {"s3": s3}})
    assert words in str(e.value) and e.value.exit_code == 78


def test_an_endpoint_with_a_password_in_it_is_refused(tmp_path: Path) -> None:
    with pytest.raises(FieldError) as e:
        parse_storage({"s3": {"credentials_secret": "s", "endpoint_url": "http://AKID:hunter2@minio:9000"}})
    assert e.value.field == "storage.s3.endpoint_url"


def test_the_credentials_file_is_read_with_comments_quotes_and_a_session_token(tmp_path: Path) -> None:
    f = tmp_path / "creds"
    f.write_text('# ffswarm\n\nexport AWS_ACCESS_KEY_ID="AKIDEXAMPLE"\nAWS_SECRET_ACCESS_KEY = s3cr3t/Key+\n'
                 "AWS_SESSION_TOKEN='tok'\n")  # fmt: skip
    assert read_credentials(f) == Credentials("AKIDEXAMPLE", "s3cr3t/Key+", "tok")
    assert "s3cr3t" not in repr(read_credentials(f)) and "AKID" not in str(read_credentials(f))


SECRET = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"


@pytest.mark.parametrize(
    ("text", "words"),
    [
        (f"AWS_ACCESS_KEY_ID=AKID\n{SECRET}\n", "line 2 is not KEY=value"),
        (f"AWS_ACCESS_KEY_ID=AKID\nAWS_SECRET=\n{SECRET}\n", "line 2 has an unknown key"),
        (f"AWS_ACCESS_KEY_ID=AKID\nAWS_ACCESS_KEY_ID={SECRET}\n", "line 2 gives AWS_ACCESS_KEY_ID a second time"),
        (f"AWS_ACCESS_KEY_ID=AKID\nAWS_SECRET_ACCESS_KEY={SECRET} x\n", "line 2: the value of AWS_SECRET_ACCESS_KEY"),
        ("AWS_ACCESS_KEY_ID=AKID\n", "lacks AWS_SECRET_ACCESS_KEY"),
        ("", "lacks AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY"),
    ],
)
def test_a_bad_credentials_file_names_file_and_line_never_the_value(tmp_path: Path, text: str, words: str) -> None:
    f = tmp_path / "creds"
    f.write_text(text)
    with pytest.raises(ConfigError) as e:
        read_credentials(f)
    assert str(f) in str(e.value) and words in str(e.value) and e.value.exit_code == 78
    assert SECRET not in _everything(e.value) and "AKID" not in str(e.value)


def test_an_unreadable_or_binary_credentials_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot be read: No such file"):
        read_credentials(tmp_path / "absent")
    (tmp_path / "bin").write_bytes(b"AWS_ACCESS_KEY_ID=\xff\xfe\n")
    with pytest.raises(ConfigError, match="is not UTF-8 text"):
        read_credentials(tmp_path / "bin")


# --- listing ---------------------------------------------------------------------------------------


def keys(objs: list) -> list[str]:  # type: ignore[type-arg]
    return [o.url.key for o in objs]


def test_a_glob_lists_only_its_own_folder_and_double_star_goes_down(s3: Seeded) -> None:
    store = s3.store()
    assert keys(store.list_matching(S3Url.parse("s3://media/crowd/*.jpg"), 100)) == ["crowd/a.jpg", "crowd/b.jpg"]
    assert keys(store.list_matching(S3Url.parse("s3://media/crowd/**/*.png"), 100)) == [
        "crowd/c.png",
        "crowd/sub/deep/e.png",
    ]
    everything = store.list_matching(S3Url.parse("s3://media/crowd/**"), 100)  # the folder marker crowd/ is left out
    assert keys(everything) == ["crowd/a.jpg", "crowd/b.jpg", "crowd/c.png", "crowd/f.jpg.txt", "crowd/sub/d.jpg",
                                "crowd/sub/deep/e.png"]  # fmt: skip
    assert everything[0].size == len(b"crowd/a.jpg") and everything[0].url == S3Url("media", "crowd/a.jpg")
    assert keys(store.list_matching(S3Url.parse("s3://media/crowd/a.jpg"), 100)) == ["crowd/a.jpg"]
    assert store.list_matching(S3Url.parse("s3://media/nothing/*.jpg"), 100) == []


def test_listing_follows_every_page(s3: Seeded) -> None:
    store = s3.store()
    seven_a_page = store.list_matching(S3Url.parse("s3://bulk/many/*.jpg"), 5000, page_size=7)
    assert keys(seven_a_page) == [f"many/{i:05d}.jpg" for i in range(MANY)]
    two_a_page = store.list_matching(S3Url.parse("s3://media/crowd/**"), 100, page_size=2)
    assert (
        keys(two_a_page) == keys(store.list_matching(S3Url.parse("s3://media/crowd/**"), 100)) and len(two_a_page) == 6
    )


def test_a_glob_past_the_limit_stops_with_a_clear_error(s3: Seeded) -> None:
    with pytest.raises(TooManyObjects) as e:
        s3.store().list_matching(S3Url.parse("s3://bulk/many/*.jpg"), 50, page_size=7)
    assert e.value.exit_code == 65
    assert "s3://bulk/many/*.jpg: matches more than 50 objects, the limit (policy.limits.targets)" in str(e.value)
    assert len(s3.store().list_matching(S3Url.parse("s3://bulk/many/*.jpg"), MANY)) == MANY  # exactly at it


def test_a_missing_bucket_is_exit_66_naming_it(s3: Seeded) -> None:
    store = s3.store()
    for call in (lambda: store.list_matching(S3Url.parse("s3://no-such-bucket/crowd/*.jpg"), 10),
                 lambda: store.head(S3Url.parse("s3://no-such-bucket/crowd/a.jpg"))):  # fmt: skip
        with pytest.raises(StorageAccessError) as e:
            call()
        assert e.value.exit_code == 66 and "bucket 'no-such-bucket' does not exist" in str(e.value)


# --- HEAD, links -----------------------------------------------------------------------------------


def test_head_gives_size_and_metadata_and_a_missing_object_is_an_item_error(s3: Seeded) -> None:
    store = s3.store()
    obj = store.head(S3Url.parse("s3://media/meta/x.jpg"))
    assert obj.size == 5 and obj.metadata == {"ffswarm-job": "j1"} and obj.etag
    with pytest.raises(ObjectMissing) as e:
        store.head(S3Url.parse("s3://media/crowd/zzz.jpg"))
    assert e.value.exit_code == 66 and e.value.item_reason == "input s3://media/crowd/zzz.jpg does not exist"
    assert not isinstance(e.value, StorageAccessError)  # the caller fails the item, not the job


def test_a_presigned_link_downloads_the_object(s3: Seeded) -> None:
    store = s3.store()
    link = store.presign_get(S3Url.parse("s3://media/meta/x.jpg"), ttl=600)
    assert "X-Amz-Expires=600" in link and "X-Amz-Signature=" in link and s3.creds.secret_access_key not in link
    answer = httpx.get(link)
    assert answer.status_code == 200 and answer.content == b"photo"
    assert f"X-Amz-Expires={3600}" in store.presign_get(S3Url.parse("s3://media/meta/x.jpg"))  # link_ttl


def test_virtual_addressing_puts_the_bucket_in_the_host_name(s3: Seeded) -> None:
    settings = S3Settings("s", Path("/x"), endpoint_url="http://s3.example.internal", addressing="virtual")
    link = S3Store(settings, make_client(settings, s3.creds)).presign_get(S3Url.parse("s3://media/a/b.jpg"))
    assert link.startswith("http://media.s3.example.internal/a/b.jpg?")


# --- failures --------------------------------------------------------------------------------------


def test_wrong_credentials_are_exit_66_naming_the_bucket_never_the_secret(s3: Seeded, tmp_path: Path) -> None:
    wrong_secret = tmp_path / "wrong"
    wrong_secret.write_text(f"AWS_ACCESS_KEY_ID={s3.creds.access_key_id}\nAWS_SECRET_ACCESS_KEY={SECRET}\n")
    stores = [S3Store(s3.settings(wrong_secret), make_client(s3.settings(wrong_secret), max_attempts=1)),
              s3.store(Credentials("AKIAUNKNOWNKEY000000", SECRET))]  # fmt: skip
    for store in stores:
        for call in (lambda s=store: s.list_matching(S3Url.parse("s3://media/crowd/*.jpg"), 10),
                     lambda s=store: s.head(S3Url.parse("s3://media/crowd/a.jpg"))):  # fmt: skip
            with pytest.raises(StorageAccessError) as e:
                call()
            assert e.value.exit_code == 66 and "'media'" in str(e.value) and "crowd/" in str(e.value)
            assert SECRET not in _everything(e.value) and SECRET not in repr(store)
    with pytest.raises(StorageAccessError, match="the storage refused the credentials"):
        stores[0].list_matching(S3Url.parse("s3://media/crowd/*.jpg"), 10)


def test_a_denied_bucket_is_exit_66_naming_it(s3: Seeded) -> None:
    with pytest.raises(StorageAccessError) as e:
        s3.store().list_matching(S3Url.parse("s3://forbidden/a/*.jpg"), 10)
    assert e.value.exit_code == 66 and "access denied (S3 AccessDenied, HTTP 403)" in str(e.value)
    assert "bucket 'forbidden'" in str(e.value)
    assert s3.creds.secret_access_key not in _everything(e.value)


class _Answers(http.server.BaseHTTPRequestHandler):
    """A loopback 'S3' that answers every request with one status and S3 error code, and counts them."""

    status = 503
    code = "SlowDown"
    seen = 0

    def _answer(self) -> None:
        type(self).seen += 1
        body = f"<Error><Code>{self.code}</Code><Message>go away</Message></Error>".encode()
        self.send_response(self.status)
        self.send_header("Content-Type", "application/xml")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    do_GET = do_HEAD = _answer

    def log_message(self, *args: object) -> None:
        pass


@pytest.mark.parametrize(("status", "code"), [(503, "SlowDown"), (500, "InternalError"), (502, "BadGateway")])
def test_throttling_and_5xx_are_temporary_after_the_clients_own_retries(status: int, code: str) -> None:
    handler = type("H", (_Answers,), {"status": status, "code": code, "seen": 0})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        settings = S3Settings("s", Path("/x"), endpoint_url=f"http://127.0.0.1:{server.server_port}")
        store = S3Store(settings, make_client(settings, Credentials("AKID", SECRET), max_attempts=2))
        for call in (lambda: store.list_matching(S3Url.parse("s3://media/crowd/*.jpg"), 10),
                     lambda: store.head(S3Url.parse("s3://media/crowd/a.jpg"))):  # fmt: skip
            with pytest.raises(StorageTemporaryError) as e:
                call()
            assert e.value.exit_code == 75 and "s3://media/crowd/" in str(e.value)
            assert SECRET not in _everything(e.value)
        assert handler.seen == 4  # two calls, each tried twice ('standard' retries)
    finally:
        server.shutdown()
        server.server_close()


def test_no_connection_is_temporary() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again below: nothing listens there
    settings = S3Settings("s", Path("/x"), endpoint_url=f"http://127.0.0.1:{port}")
    store = S3Store(settings, make_client(settings, Credentials("AKID", SECRET), max_attempts=1))
    with pytest.raises(StorageTemporaryError) as e:
        store.head(S3Url.parse("s3://media/a.jpg"))
    assert e.value.exit_code == 75 and "no answer from the storage endpoint" in str(e.value)


def _everything(error: BaseException) -> str:
    """All a log could show of an error: its text, repr and the whole traceback with its causes."""
    assert isinstance(error, FfswarmError | ConfigError | ValueError)
    return str(error) + repr(error) + "".join(traceback.format_exception(error))
