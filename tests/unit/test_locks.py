"""The lock files agree with pyproject.toml, and every install from them is hash-checked.

locks/*.txt are written by scripts/lock.py from pyproject's dependencies and its [tool.ffswarm.locks]
table; the runner image (Dockerfile.runner) and the dev venv (scripts/dev-swarm.sh) install from them
with ``pip install --no-deps --require-hashes``. A dependency changed in pyproject.toml without
running scripts/lock.py fails here, naming the lock to refresh.
"""

from __future__ import annotations

import importlib.util
import re
import tomllib
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[2]
REFRESH = "refresh the locks: scripts/lock.py (docs/development.md#locks)"


def _script(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"_ffswarm_{name}", ROOT / "scripts" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


lock = _script("lock")
sbom = _script("sbom")  # the image's SBOM reads locks with the same parser
PYPROJECT: dict[str, Any] = tomllib.loads((ROOT / "pyproject.toml").read_text())
LOCKS: dict[str, dict[str, Any]] = lock.table(PYPROJECT)


def pins(name: str) -> dict[str, tuple[str, list[str]]]:
    result: dict[str, tuple[str, list[str]]] = sbom.read_lock(ROOT / "locks" / f"{name}.txt")[0]
    return result


def test_every_declared_lock_exists_and_no_other() -> None:
    assert {p.stem for p in (ROOT / "locks").glob("*.txt")} == set(LOCKS)


@pytest.mark.parametrize("name", sorted(LOCKS))
def test_lock_was_written_from_this_pyproject(name: str) -> None:
    _, inputs = sbom.read_lock(ROOT / "locks" / f"{name}.txt")
    assert inputs == lock.fingerprint(PYPROJECT, name), f"pyproject.toml changed since locks/{name}.txt: {REFRESH}"


@pytest.mark.parametrize("name", sorted(LOCKS))
def test_every_direct_requirement_is_pinned_within_its_bounds(name: str) -> None:
    pinned = pins(name)
    for text in lock.requirements(PYPROJECT, LOCKS[name]):
        req = Requirement(text)
        key = sbom.canonical(req.name)
        assert key in pinned, f"{req.name} (pyproject.toml) is not in locks/{name}.txt: {REFRESH}"
        assert req.specifier.contains(pinned[key][0], prereleases=True), (
            f"locks/{name}.txt pins {req.name}=={pinned[key][0]}, outside {text!r}: {REFRESH}"
        )


@pytest.mark.parametrize("name", sorted(LOCKS))
def test_no_deps_packages_are_pinned_exactly(name: str) -> None:
    pinned = pins(name)
    for text in LOCKS[name].get("no-deps", []):
        pkg, _, version = text.partition("==")
        assert version, f"no-deps entries are exact pins (name==version), got {text!r}"
        assert pinned.get(sbom.canonical(pkg), ("",))[0] == version, f"locks/{name}.txt lacks {text}: {REFRESH}"


@pytest.mark.parametrize("name", sorted(LOCKS))
def test_every_pin_has_a_hash_and_no_index_is_named(name: str) -> None:
    text = (ROOT / "locks" / f"{name}.txt").read_text()
    pinned = pins(name)
    assert pinned, f"locks/{name}.txt pins nothing"
    assert not [p for p, (_, hashes) in pinned.items() if not hashes]
    # Which index to use is each machine's pip configuration; a lock names none (no hosts in the repo).
    assert not re.search(r"^\s*(-i|-f|--index-url|--extra-index-url|--find-links|--trusted-host)\b", text, re.M)
    assert "://" not in text


@pytest.mark.parametrize("name", ["runner-cpu", "runner-gpu"])
def test_runner_locks_hold_only_what_the_runner_imports(name: str) -> None:
    """The image's size is mostly its libraries: scipy, scikit-image and networkx came only through
    insightface's declared dependencies and are not imported (runner_image/similarity.py); the
    opencv-python GUI build and a second onnxruntime would shadow the chosen ones (docs/development.md#locks)."""
    pinned = pins(name)
    unwanted = {"scipy", "scikit-image", "networkx", "opencv-python", "pip", "setuptools", "wheel"}
    assert not unwanted & set(pinned)
    ort = {"onnxruntime", "onnxruntime-gpu"} & set(pinned)
    assert ort == {"onnxruntime" if name.endswith("cpu") else "onnxruntime-gpu"}
    assert "insightface" in pinned and "opencv-python-headless" in pinned


def test_installs_use_the_locks_with_hashes() -> None:
    dockerfile = (ROOT / "Dockerfile.runner").read_text()
    assert "--require-hashes -r /locks/runner-${ORT_EXTRA}.txt" in dockerfile
    dev = (ROOT / "scripts" / "dev-swarm.sh").read_text()
    assert "--require-hashes -r locks/dev.txt" in dev
