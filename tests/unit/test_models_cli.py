"""``ffswarm models verify|fetch``: reports, exit codes, fetching from a loopback HTTP server with
Range resume, and refusing a file whose checksum differs with the installed pack left untouched."""

from __future__ import annotations

import hashlib
import http.server
import shutil
import threading
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from controller import models as models_mod
from controller.cli import cli
from controller.errors import MissingInputError, UsageError
from tests.fixtures.standin_pack import build_pack


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_pack(tmp_path_factory.mktemp("src") / "pack").parent


class _Handler(http.server.SimpleHTTPRequestHandler):
    """Static files with ``Range: bytes=N-``; ``cut`` makes the next big response stop half-way."""

    cut: list[bool] = []
    requests: list[tuple[str, str | None]] = []

    def log_message(self, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        path = Path(self.translate_path(self.path))
        rng = self.headers.get("Range")
        self.requests.append((path.name, rng))
        if not path.is_file():
            self.send_error(404)
            return
        data = path.read_bytes()
        start = int(rng.split("=")[1].split("-")[0]) if rng else 0
        if start >= len(data) and rng:
            self.send_error(416)
            return
        body = data[start:]
        self.send_response(206 if rng else 200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.cut and len(body) > 100_000:
            self.cut.pop()
            self.wfile.write(body[: len(body) // 2])
            self.wfile.flush()
            self.connection.shutdown(2)  # the connection drops mid-file
            return
        self.wfile.write(body)


@pytest.fixture
def server(source: Path) -> Iterator[str]:
    _Handler.cut.clear()
    _Handler.requests.clear()
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), partial(_Handler, directory=str(source)))
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


def _quiet(msg: str) -> None:
    pass


def test_fetch_over_http_resumes_an_interrupted_download(tmp_path: Path, server: str, source: Path) -> None:
    root = tmp_path / "models"
    _Handler.cut.append(True)
    models_mod.fetch(root, "default", server, log=_quiet, allow_http=True)
    ranged = [(name, rng) for name, rng in _Handler.requests if rng]
    assert len(ranged) == 1 and ranged[0][1] != "bytes=0-"  # the rest only, not the whole file again
    for f in source.iterdir():
        assert (root / "default" / f.name).read_bytes() == f.read_bytes()
    assert models_mod.verify(root / "default").ok
    assert [p.name for p in root.iterdir()] == ["default"]  # no staging folder left behind


def test_fetch_refuses_http_without_the_flag_and_names_no_credentials(tmp_path: Path, server: str) -> None:
    root = tmp_path / "models"
    url = server.replace("http://", "http://user:s3cret@") + "/?token=abc"
    with pytest.raises(UsageError, match="http:// is refused") as e:
        models_mod.fetch(root, "default", url, log=_quiet)
    assert "s3cret" not in str(e.value) and "token" not in str(e.value)
    assert _Handler.requests == [] and not root.exists()
    with pytest.raises(UsageError, match="only https://"):
        models_mod.fetch(root, "default", "ftp://example.invalid/pack", log=_quiet)


def test_fetch_pins_pack_yaml_or_says_it_trusts_the_source(tmp_path: Path, server: str, source: Path) -> None:
    root = tmp_path / "models"
    said: list[str] = []
    with pytest.raises(MissingInputError, match="not the pinned"):
        models_mod.fetch(root, "default", server, log=said.append, allow_http=True, pack_sha256="0" * 64)
    assert not root.exists() or not (root / "default").exists()
    models_mod.fetch(root, "default", server, log=said.append, allow_http=True)
    assert any("trusting the source for the checksums" in line for line in said)
    said.clear()
    pin = hashlib.sha256((source / "pack.yaml").read_bytes()).hexdigest()
    models_mod.fetch(root, "default", server, log=said.append, allow_http=True, pack_sha256=pin)
    assert any("matches --pack-sha256" in line for line in said)
    assert not any("trusting" in line for line in said)


def test_fetch_never_follows_a_planted_staging_link(tmp_path: Path, server: str, source: Path) -> None:
    root = tmp_path / "models"
    victim = tmp_path / "host" / "victim.onnx"
    victim.parent.mkdir()
    victim.write_bytes(b"host file")
    stage = root / ".default.fetch"  # where fetch used to stage
    stage.mkdir(parents=True)
    for f in source.iterdir():
        (stage / f"{f.name}.part").symlink_to(victim)
    (root / ".default.fetch-x").symlink_to(victim.parent)
    models_mod.fetch(root, "default", server, log=_quiet, allow_http=True)
    assert victim.read_bytes() == b"host file" and list(victim.parent.iterdir()) == [victim]
    assert models_mod.verify(root / "default").ok
    assert not any((root / "default").joinpath(f.name).is_symlink() for f in source.iterdir())
    assert (root / "default").stat().st_mode & 0o777 == 0o755


def test_fetch_caps_each_file_and_refuses_non_regular_source_entries(tmp_path: Path, source: Path) -> None:
    root = tmp_path / "models"
    with pytest.raises(MissingInputError, match="over the limit"):
        models_mod.fetch(root, "default", str(source), log=_quiet, max_bytes=1000)
    assert not (root / "default").exists() and list(root.iterdir()) == []
    odd = tmp_path / "odd"
    shutil.copytree(source, odd)
    (odd / "w600k_r50.onnx").unlink()
    (odd / "w600k_r50.onnx").symlink_to(source / "w600k_r50.onnx")
    with pytest.raises(MissingInputError, match="w600k_r50.onnx: cannot fetch"):
        models_mod.fetch(root, "default", str(odd), log=_quiet)
    assert list(root.iterdir()) == []


def test_fetch_refuses_a_wrong_checksum_and_keeps_the_installed_pack(tmp_path: Path, source: Path) -> None:
    root = tmp_path / "models"
    models_mod.fetch(root, "default", str(source), log=_quiet)
    before = {p.name: p.read_bytes() for p in (root / "default").iterdir()}
    bad = tmp_path / "bad"
    shutil.copytree(source, bad)
    (bad / "w600k_r50.onnx").write_bytes(b"tampered")
    with pytest.raises(MissingInputError, match="w600k_r50.onnx: sha256 .* differs"):
        models_mod.fetch(root, "default", str(bad), log=_quiet)
    assert {p.name: p.read_bytes() for p in (root / "default").iterdir()} == before


def test_fetch_replaces_an_installed_pack_from_a_folder(tmp_path: Path, source: Path) -> None:
    root = tmp_path / "models"
    (root / "default").mkdir(parents=True)
    (root / "default" / "stale.onnx").write_bytes(b"old")
    models_mod.fetch(root, "default", str(source), log=_quiet)
    assert not (root / "default" / "stale.onnx").exists()
    assert [p.name for p in root.iterdir()] == ["default"]


@pytest.fixture
def config(tmp_path: Path, source: Path) -> Path:
    data = tmp_path / "data"
    shutil.copytree(source, data / "models" / "default")
    path = tmp_path / "ffswarm.yaml"
    path.write_text(yaml.safe_dump({"data_root": str(data), "volume": {"type": "bind"}, "image": "x"}))
    return path


def test_verify_reports_every_file_and_exits_0(config: Path) -> None:
    result = CliRunner().invoke(cli, ["--config", str(config), "models", "verify"])
    assert result.exit_code == 0, result.output
    assert "OK" in result.output.splitlines()[0]
    for name in ("det_10g.onnx", "w600k_r50.onnx", "inswapper_128.onnx", "gfpgan_1.4.onnx"):
        assert f"ok  {name}" in result.output
    assert "target[1, 3, 128, 128]:float" in result.output


def test_verify_names_the_damaged_file_and_exits_66(config: Path, tmp_path: Path) -> None:
    (tmp_path / "data/models/default/inswapper_128.onnx").write_bytes(b"x")
    result = CliRunner().invoke(cli, ["--config", str(config), "models", "verify", "default"])
    assert result.exit_code == 66
    assert "BAD inswapper_128.onnx (swapper): inswapper_128.onnx has the wrong checksum" in result.output


def test_verify_flags_a_file_in_the_wrong_role(config: Path, tmp_path: Path) -> None:
    pack = tmp_path / "data/models/default"
    spec = yaml.safe_load((pack / "pack.yaml").read_text())
    spec["files"]["gfpgan_1.4.onnx"]["role"] = "swapper"  # checksum right, graph wrong for the role
    (pack / "pack.yaml").write_text(yaml.safe_dump(spec))
    report = models_mod.verify(pack)
    assert not report.ok
    assert any("does not fit a swapper" in n for f in report.files for n in f.notes)


def test_verify_missing_pack(tmp_path: Path) -> None:
    report = models_mod.verify(tmp_path / "nope")
    assert not report.ok and "folder not found" in report.problems[0]


def test_sha_of_fixture_is_stable(source: Path) -> None:
    spec = yaml.safe_load((source / "pack.yaml").read_text())
    for name, entry in spec["files"].items():
        assert hashlib.sha256((source / name).read_bytes()).hexdigest() == entry["sha256"]
