"""Model packs on the data root: ``ffswarm models verify`` and ``ffswarm models fetch``.

The rules (pack.yaml, roles, sha256) are the contract's (contract/pack.py), the runner's too, so a
pack that verifies here is one the runner accepts. onnxruntime is never imported; the I/O-signature
check reads graphs with ``onnx`` when it is installed and says it was skipped otherwise.

``fetch`` stages into ``<root>/models/.<pack>.fetch/`` (kept across interrupted runs: a partial file
resumes with an HTTP Range request), checks every sha256 against the source's pack.yaml, and only
then swaps the staged folder in for ``<root>/models/<pack>/``. Any failure leaves the installed pack
as it was.
"""

from __future__ import annotations

import contextlib
import hashlib
import http.client
import os
import secrets
import shutil
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from contract import pack
from contract.errors import PackError
from contract.pack import PACK_FILE, check_file, roles_of
from controller.errors import MissingInputError

CHUNK = 1 << 20
# What each role's graph looks like (input count, square input side or None, output count or None).
CONTRACTS: dict[str, tuple[int, int | None, set[int] | None]] = {
    "detector": (1, None, {6, 9, 10, 15}),  # SCRFD: 3 strides x score/bbox(/kps) (+batched variants)
    "recognizer": (1, 112, {1}),
    "swapper": (2, 128, {1}),
    "enhancer": (1, 512, {1}),
}


@dataclass
class FileReport:
    name: str
    role: str
    ok: bool
    notes: list[str] = field(default_factory=list)


@dataclass
class PackReport:
    pack: Path
    files: list[FileReport]
    problems: list[str]

    @property
    def ok(self) -> bool:
        return not self.problems and all(f.ok for f in self.files)

    def lines(self) -> list[str]:
        out = [f"pack {self.pack}: {'OK' if self.ok else 'BROKEN'}"]
        out += [f"  {'ok ' if f.ok else 'BAD'} {f.name} ({f.role}): {'; '.join(f.notes)}" for f in self.files]
        out += [f"  problem: {p}" for p in self.problems]
        return out


def read_spec(pack_dir: Path, shown: str | None = None) -> dict[str, Any]:
    """pack.yaml of an installed pack, checked; PackError when it is missing, unreadable or malformed.
    ``shown``: how refusals name the folder (default: ``pack_dir``)."""
    return parse_spec(pack.read_text(pack_dir, shown), pack.where(pack_dir, shown))


def parse_spec(text: str, named: str) -> dict[str, Any]:
    """pack.yaml's text, parsed (``yaml.safe_load``) and checked; ``named`` says whose in refusals."""
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise pack.not_yaml(named, e) from e
    return pack.check_spec(data, named)


def signature(path: Path, role: str) -> tuple[bool, str]:
    """The graph's inputs/outputs and whether they fit the role; (True, 'skipped …') without onnx."""
    try:
        import onnx
    except ImportError:
        return True, "I/O check skipped: onnx not installed"
    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception as e:
        return False, f"not an ONNX model: {type(e).__name__}"
    init = {i.name for i in model.graph.initializer}

    def dims(v: Any) -> list[Any]:
        return [d.dim_value or d.dim_param or "?" for d in v.type.tensor_type.shape.dim]

    def dtype(v: Any) -> str:
        return str(onnx.TensorProto.DataType.Name(v.type.tensor_type.elem_type)).lower()

    ins = [i for i in model.graph.input if i.name not in init]
    outs = list(model.graph.output)
    text = "in " + ", ".join(f"{i.name}{dims(i)}:{dtype(i)}" for i in ins)
    text += " → out " + ", ".join(f"{o.name}{dims(o)}:{dtype(o)}" for o in outs)
    n_in, side, n_out = CONTRACTS.get(role, (len(ins), None, None))
    shape = dims(ins[0]) if ins else []
    fits = len(ins) == n_in and (n_out is None or len(outs) in n_out)
    if side is not None and (len(shape) != 4 or shape[2:] != [side, side]):
        fits = False
    return fits, text if fits else f"{text} — does not fit a {role}"


def verify(pack_dir: Path) -> PackReport:
    """Every listed file: present, sha256 as pack.yaml says, I/O signature fit for its role."""
    try:
        spec = read_spec(pack_dir)
    except PackError as e:
        return PackReport(pack_dir, [], [str(e)])
    files: list[FileReport] = []
    for name, entry in spec["files"].items():
        role = str(entry.get("role"))
        report = FileReport(name, role, True)
        try:
            check_file(pack_dir, name, entry["sha256"])
            report.notes.append(f"sha256 ok, {(pack_dir / name).stat().st_size} bytes")
            fits, text = signature(pack_dir / name, role)
            report.ok = fits
            report.notes.append(text)
        except PackError as e:
            report.ok = False
            report.notes.append(str(e).split(": ", 1)[-1])
        files.append(report)
    have = roles_of(spec)
    problems = [f"no file with role {r}" for r in ("detector", "recognizer", "swapper") if r not in have]
    return PackReport(pack_dir, files, problems)


# --- fetch ----------------------------------------------------------------------------------------


def _is_url(source: str) -> bool:
    return source.startswith(("http://", "https://"))


def _read_source_spec(source: str) -> tuple[str, dict[str, Any]]:
    where = f"source {source}"
    try:
        if _is_url(source):
            with urllib.request.urlopen(source.rstrip("/") + "/" + PACK_FILE, timeout=30) as r:
                text = r.read(1 << 20).decode("utf-8")
        else:
            text = (Path(source) / PACK_FILE).read_text(encoding="utf-8")
    except (OSError, urllib.error.URLError, UnicodeDecodeError) as e:
        raise MissingInputError(f"{where}: cannot read {PACK_FILE}: {e}") from e
    try:
        return text, parse_spec(text, where)
    except PackError as e:
        raise MissingInputError(str(e)) from e


def _sha256(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def _download(url: str, part: Path) -> None:
    """Append the rest of ``url`` to ``part`` (HTTP Range from its current size)."""
    have = part.stat().st_size if part.exists() else 0
    req = urllib.request.Request(url, headers={"Range": f"bytes={have}-"} if have else {})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            mode = "ab" if have and r.status == 206 else "wb"  # 200: the server ignored Range
            length = int(r.headers.get("Content-Length") or -1)
            written = 0
            with open(part, mode) as f:
                while block := r.read(CHUNK):
                    f.write(block)
                    written += len(block)
            if 0 <= written < length:
                raise ConnectionError(f"connection closed after {written} of {length} bytes")
    except http.client.HTTPException as e:  # IncompleteRead and friends: keep the part, resume later
        raise ConnectionError(f"download interrupted: {e!r}") from e
    except urllib.error.HTTPError as e:
        if e.code == 416 and have:  # nothing left: the part is complete (or too long: sha decides)
            return
        raise


def fetch(models_root: Path, pack: str, source: str, log: Any = print) -> Path:
    """Install ``pack`` from a URL or folder holding pack.yaml and its files; returns the pack dir."""
    if not pack or "/" in pack or pack.startswith("."):
        raise MissingInputError(f"invalid pack name {pack!r}")
    text, spec = _read_source_spec(source)
    stage = models_root / f".{pack}.fetch"
    stage.mkdir(parents=True, exist_ok=True)
    for name, entry in spec["files"].items():
        want = entry["sha256"].strip().lower()
        final, part = stage / name, stage / f"{name}.part"
        if final.exists() and _sha256(final) == want:
            log(f"{name}: already fetched")
            continue
        try:
            if _is_url(source):
                _download(source.rstrip("/") + "/" + name, part)
            else:
                shutil.copyfile(Path(source) / name, part)
        except (OSError, urllib.error.URLError) as e:
            raise MissingInputError(f"{name}: cannot fetch from {source}: {e} (run again to resume)") from e
        got = _sha256(part)
        if got != want:
            part.unlink()
            raise MissingInputError(
                f"{name}: sha256 {got[:16]}… differs from the source's {PACK_FILE} ({want[:16]}…); "
                "nothing was installed"
            )
        os.replace(part, final)
        log(f"{name}: fetched, sha256 ok")
    (stage / PACK_FILE).write_text(text, encoding="utf-8")
    return _install(models_root, pack, stage)


def _install(models_root: Path, pack: str, stage: Path) -> Path:
    """Swap the verified staging folder in; the old pack is moved aside first and removed last."""
    target = models_root / pack
    old = models_root / f".{pack}.old-{secrets.token_hex(4)}"
    if target.exists():
        os.rename(target, old)
    try:
        os.rename(stage, target)
    except OSError:
        if old.exists():
            os.rename(old, target)
        raise
    with contextlib.suppress(FileNotFoundError):
        shutil.rmtree(old)
    return target
