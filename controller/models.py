"""Model packs on the data root: ``ffswarm models verify`` and ``ffswarm models fetch``.

The rules (pack.yaml, roles, sha256) are the contract's (contract/pack.py), the runner's too, so a
pack that verifies here is one the runner accepts. onnxruntime is never imported; the I/O-signature
check reads graphs with ``onnx`` when it is installed and says it was skipped otherwise.

``fetch`` stages into a fresh ``<root>/models/.<pack>.fetch-XXXX/`` (mkdtemp: the controller's,
0700; a planted file or link of an older staging name is never used), resumes an interrupted download
with an HTTP Range request, checks every sha256 against the source's pack.yaml (pinned by
``--pack-sha256``, or trusted, and said so), and only then swaps the staged folder in for
``<root>/models/<pack>/``. https only (http with ``--allow-http``); a size cap per file. Any failure
leaves the installed pack as it was.
"""

from __future__ import annotations

import contextlib
import hashlib
import http.client
import os
import secrets
import shutil
import stat
import tempfile
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from contract import pack, swapper
from contract.errors import PackError
from contract.pack import PACK_FILE, check_file, roles_of
from controller import redact, yamlio
from controller.errors import MissingInputError, UsageError

CHUNK = 1 << 20
# What each role's graph looks like (input count, square input side or None, output count or None).
CONTRACTS: dict[str, tuple[int, int | None, set[int] | None]] = {
    "detector": (1, None, {6, 9, 10, 15}),  # SCRFD: 3 strides x score/bbox(/kps) (+batched variants)
    "recognizer": (1, 112, {1}),
    "swapper": (2, None, {1, 2}),  # its contract per model: contract/swapper.py (graph_problem)
    "swapper_converter": (1, None, {1}),  # simswap_256/ghost_256's CrossFace: [N, 512] → [N, 512]
    "enhancer": (1, 512, {1}),
    "genderage": (1, 96, {1}),  # insightface's Attribute model: the selector's gender/age filters
    "occluder": (1, None, {1}),  # mask.types occlusion, FaceFusion's xseg: NHWC [1, 256, 256, 3] (the runner checks it)
    "face_parser": (1, 512, {1}),  # mask.types region, bisenet: [1, 3, 512, 512] → [1, 19, 512, 512]
}
# An input a role's graph may take besides the counted ones: CodeFormer's fidelity (face_enhancer.weight)
EXTRA_INPUTS = {"enhancer": "weight"}


def contract_text(role: str, model: str | None = None) -> str:
    """What a graph for ``role`` (recorded as ``model``) must look like, in words, for ``models verify``."""
    if role in ("swapper", "swapper_converter"):  # per model: contract/swapper.py
        return swapper.describe(role, model)
    if role not in CONTRACTS:
        return f"none known for role {role!r} (roles: {', '.join(CONTRACTS)})"
    n_in, side, n_out = CONTRACTS[role]
    text = f"{n_in} input{'s' if n_in != 1 else ''}"
    text += f", the first N×3×{side}×{side}" if side is not None else ", any input size"
    text += f" (and {EXTRA_INPUTS[role]!r} for codeformer)" if role in EXTRA_INPUTS else ""
    if n_out is not None:
        counts = "/".join(str(n) for n in sorted(n_out))
        text += f", {counts} output{'s' if n_out != {1} else ''}"
    return text


def licence_text(entry: dict[str, Any]) -> str:
    """An entry's licence as pack.yaml records it, or that it records none."""
    licence = pack.licence_of(entry)
    return licence.describe() if licence else "unknown (pack.yaml records none)"


@dataclass
class FileReport:
    name: str
    role: str
    ok: bool
    notes: list[str] = field(default_factory=list)
    contract: str = ""
    licence: str = ""


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
        for f in self.files:
            out.append(f"  {'ok ' if f.ok else 'BAD'} {f.name} ({f.role}): {'; '.join(f.notes)}")
            out += [f"        contract: {f.contract}"] if f.contract else []
            out += [f"        licence: {f.licence}"] if f.licence else []
        out += [f"  problem: {p}" for p in self.problems]
        return out


def read_spec(pack_dir: Path, shown: str | None = None) -> dict[str, Any]:
    """pack.yaml of an installed pack, checked; PackError when it is missing, unreadable or malformed.
    ``shown``: how refusals name the folder (default: ``pack_dir``)."""
    return parse_spec(pack.read_text(pack_dir, shown), pack.where(pack_dir, shown))


def parse_spec(text: str, named: str) -> dict[str, Any]:
    """pack.yaml's text, parsed (``yaml.safe_load``) and checked; ``named`` says whose in refusals."""
    try:
        data = yamlio.load(text)
    except yaml.YAMLError as e:
        raise pack.not_yaml(named, e) from e
    return pack.check_spec(data, named)


def signature(path: Path, role: str, recorded: str | None = None) -> tuple[bool, str]:
    """The graph's inputs/outputs and whether they fit the role (the swapper: the ``recorded`` model's
    contract, or any swapper's); (True, 'skipped …') without onnx."""
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
    if role in ("swapper", "swapper_converter"):  # their contracts: contract/swapper.py, the runner's too
        shapes = [(i.name, dims(i)) for i in ins], [dims(o) for o in outs]
        why = swapper.graph_problem(recorded, *shapes) if role == "swapper" else swapper.converter_problem(*shapes)
        return why is None, text if why is None else f"{text} — does not fit a {role}: {why}"
    counted = [i for i in ins if i.name != EXTRA_INPUTS.get(role)]
    n_in, side, n_out = CONTRACTS.get(role, (len(counted), None, None))
    shape = dims(counted[0]) if counted else []
    fits = len(counted) == n_in and (n_out is None or len(outs) in n_out)
    if side is not None and (len(shape) != 4 or shape[2:] != [side, side]):
        fits = False
    return fits, text if fits else f"{text} — does not fit a {role}"


def verify(pack_dir: Path) -> PackReport:
    """Every listed file: present, sha256 as pack.yaml says, I/O signature fit for its role; with
    its role's contract and its licence as pack.yaml records it."""
    try:
        spec = read_spec(pack_dir)
    except PackError as e:
        return PackReport(pack_dir, [], [str(e)])
    files: list[FileReport] = []
    for name, entry in spec["files"].items():
        role, model = str(entry.get("role")), entry.get("model")
        report = FileReport(name, role, True, contract=contract_text(role, model), licence=licence_text(entry))
        try:
            check_file(pack_dir, name, entry["sha256"])
            report.notes.append(f"sha256 ok, {(pack_dir / name).stat().st_size} bytes")
            fits, text = signature(pack_dir / name, role, model)
            report.ok = fits
            report.notes.append(text)
        except PackError as e:
            report.ok = False
            report.notes.append(str(e).split(": ", 1)[-1])
        files.append(report)
    have = roles_of(spec)
    problems = [f"no file with role {r}" for r in ("detector", "recognizer", "swapper") if r not in have]
    problems += [why] if (why := pack.missing_converter(spec)) else []  # a simswap/ghost swapper's converter
    return PackReport(pack_dir, files, problems)


# --- fetch ---------------------------------------------------------------------------------------
MAX_FILE_BYTES = 8 * 1024**3  # one model file; a bigger download is refused, not stored
MAX_SPEC_BYTES = 1 << 20
TRIES = 3  # an interrupted download is resumed (HTTP Range) this many times within one fetch
_NEW = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


def _is_url(source: str) -> bool:
    return "://" in source


def _check_source(source: str, allow_http: bool) -> None:
    if not _is_url(source):
        return
    scheme = source.split("://", 1)[0].lower()
    if scheme == "https" or (scheme == "http" and allow_http):
        return
    if scheme == "http":
        raise UsageError(
            f"source {redact.url(source)}: http:// is refused (use https://, or --allow-http on a trusted network)"
        )
    raise UsageError(f"source {redact.url(source)}: only https:// URLs (or a local folder) can be fetched from")


def _read_local(path: Path, limit: int) -> bytes:
    """A regular file of a local source, never through a symlink at its end, at most ``limit`` bytes."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise OSError(f"{path.name} is not a regular file")
        if st.st_size > limit:
            raise OSError(f"{path.name} is {st.st_size} bytes, over the limit of {limit}")
        chunks: list[bytes] = []
        left = limit + 1
        while left > 0 and (block := os.read(fd, min(left, CHUNK))):
            chunks.append(block)
            left -= len(block)
        if left <= 0:
            raise OSError(f"{path.name} grew over the limit of {limit} bytes")
        return b"".join(chunks)
    finally:
        os.close(fd)


def _read_source_spec(source: str) -> tuple[bytes, dict[str, Any]]:
    where = f"source {redact.url(source) if _is_url(source) else source}"
    try:
        if _is_url(source):
            with urllib.request.urlopen(source.rstrip("/") + "/" + PACK_FILE, timeout=30) as r:
                raw = r.read(MAX_SPEC_BYTES + 1)
        else:
            raw = _read_local(Path(source) / PACK_FILE, MAX_SPEC_BYTES)
        if len(raw) > MAX_SPEC_BYTES:
            raise OSError(f"{PACK_FILE} is over {MAX_SPEC_BYTES} bytes")
        text = raw.decode("utf-8")
    except (OSError, urllib.error.URLError, UnicodeDecodeError) as e:
        raise MissingInputError(f"{where}: cannot read {PACK_FILE}: {e}") from e
    try:
        return raw, parse_spec(text, where)
    except PackError as e:
        raise MissingInputError(str(e)) from e


def _sha256(path: Path) -> str:
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    with os.fdopen(fd, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def _download(url: str, fd: int, have: int, limit: int) -> int:
    """Write the rest of ``url`` (from byte ``have``: HTTP Range) to ``fd``; returns the bytes now held."""
    req = urllib.request.Request(url, headers={"Range": f"bytes={have}-"} if have else {})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            if have and r.status != 206:  # the server ignored Range: start over
                os.ftruncate(fd, 0)
                os.lseek(fd, 0, os.SEEK_SET)
                have = 0
            length = int(r.headers.get("Content-Length") or -1)
            if length > limit - have:
                raise OSError(f"{have + length} bytes, over the limit of {limit}")
            written = 0
            while block := r.read(CHUNK):
                written += len(block)
                if have + written > limit:
                    raise OSError(f"over the limit of {limit} bytes")
                view = memoryview(block)
                while view:
                    view = view[os.write(fd, view) :]
            if 0 <= written < length:
                raise ConnectionError(f"connection closed after {written} of {length} bytes")
            return have + written
    except http.client.HTTPException as e:  # IncompleteRead and friends: resume
        raise ConnectionError(f"download interrupted: {type(e).__name__}") from e
    except urllib.error.HTTPError as e:
        if e.code == 416 and have:  # nothing left: complete (or too long: the checksum decides)
            return have
        raise


def _fetch_file(source: str, name: str, part: Path, limit: int) -> None:
    fd = os.open(part, _NEW, 0o644)  # a fresh name in a fresh folder: never through a planted link
    try:
        if not _is_url(source):
            data = _read_local(Path(source) / name, limit)
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
        else:
            have = 0
            for attempt in range(TRIES):
                try:
                    have = _download(source.rstrip("/") + "/" + name, fd, have, limit)
                    break
                except ConnectionError:
                    if attempt + 1 == TRIES:
                        raise
                    have = os.fstat(fd).st_size
        os.fsync(fd)
    finally:
        os.close(fd)


def fetch(
    models_root: Path,
    pack: str,
    source: str,
    log: Any = print,
    *,
    allow_http: bool = False,
    pack_sha256: str | None = None,
    max_bytes: int = MAX_FILE_BYTES,
) -> Path:
    """Install ``pack`` from an https URL (http with ``allow_http``) or a local folder holding
    pack.yaml and its files; returns the pack dir.

    Staged in a fresh folder (mkdtemp: the controller's, 0700) beside the packs, every file created
    O_EXCL|O_NOFOLLOW there, each checked against pack.yaml's sha256 and ``max_bytes``. pack.yaml
    itself is pinned by ``pack_sha256``; without it, the source is trusted for the checksums, and
    this says so."""
    if not pack or "/" in pack or pack.startswith("."):
        raise MissingInputError(f"invalid pack name {pack!r}")
    _check_source(source, allow_http)
    raw, spec = _read_source_spec(source)
    got = hashlib.sha256(raw).hexdigest()
    if pack_sha256 is not None:
        if got != pack_sha256.strip().lower():
            raise MissingInputError(
                f"{PACK_FILE} from the source has sha256 {got[:16]}…, not the pinned {pack_sha256[:16]}…; "
                "nothing was installed"
            )
        log(f"{PACK_FILE}: sha256 matches --pack-sha256")
    else:
        log(
            f"{PACK_FILE}: not pinned: trusting the source for the checksums (sha256 {got}; "
            "pass --pack-sha256 to pin it)"
        )
    models_root.mkdir(parents=True, exist_ok=True)
    if not stat.S_ISDIR(os.lstat(models_root).st_mode):
        raise MissingInputError(f"{models_root.name}: not a folder (a symlink is never followed)")
    stage = Path(tempfile.mkdtemp(prefix=f".{pack}.fetch-", dir=models_root))
    try:
        for name, entry in spec["files"].items():
            want = entry["sha256"].strip().lower()
            part = stage / f"{name}.part"
            try:
                _fetch_file(source, name, part, max_bytes)
            except (OSError, urllib.error.URLError) as e:
                raise MissingInputError(
                    f"{name}: cannot fetch from {_shown(source)}: {e}; nothing was installed"
                ) from e
            got = _sha256(part)
            if got != want:
                raise MissingInputError(
                    f"{name}: sha256 {got[:16]}… differs from the source's {PACK_FILE} ({want[:16]}…); "
                    "nothing was installed"
                )
            os.rename(part, stage / name)
            log(f"{name}: fetched, sha256 ok")
        fd = os.open(stage / PACK_FILE, _NEW, 0o644)
        try:
            os.write(fd, raw)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.chmod(stage, 0o755)  # the runners read the installed pack
        return _install(models_root, pack, stage)
    finally:
        if stage.exists():
            shutil.rmtree(stage, ignore_errors=True)


def _shown(source: str) -> str:
    return redact.url(source) if _is_url(source) else source


def _install(models_root: Path, pack: str, stage: Path) -> Path:
    """Swap the verified staging folder in; the old pack is moved aside first and removed last."""
    target = models_root / pack
    old = models_root / f".{pack}.old-{secrets.token_hex(4)}"
    if os.path.lexists(target):
        os.rename(target, old)
    try:
        os.rename(stage, target)
    except OSError:
        if os.path.lexists(old):
            os.rename(old, target)
        raise
    with contextlib.suppress(FileNotFoundError):
        if os.path.islink(old):
            os.unlink(old)
        else:
            shutil.rmtree(old)
    return target
