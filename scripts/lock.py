#!/usr/bin/env python3
"""Refreshes the lock files in locks/ from pyproject.toml: run it after changing a dependency.

    scripts/lock.py              # every lock
    scripts/lock.py dev build    # only these

What each lock holds is pyproject's ``[tool.ffswarm.locks]`` table: extras on top of the controller's
own dependencies (or the build system's requirements), the Python it is for, and packages pinned with
their hashes but resolved without their declared dependencies (insightface: docs/development.md#locks). Every pin
carries ``--hash`` lines, and every lock is the whole set, so it is installed with
``pip install --no-deps --require-hashes -r locks/NAME.txt``: pip then installs exactly what is listed.

Resolution is uv's at a pinned version, for Linux x86_64 (glibc 2.36, Debian 12's), against the index
this machine's pip is configured with (PyPI when none is); no index is written into a lock. uv comes
from build/lockvenv, made with this machine's pip when uv at that version is not there. Each lock's
first lines record a fingerprint of its inputs: tests/unit/test_locks.py fails when pyproject.toml
changed and the locks were not refreshed.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
LOCKS = REPO / "locks"
UV = "uv==0.13.9"
PLATFORM = "x86_64-manylinux_2_36"
FINGERPRINT = "# inputs: "


def table(pyproject: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The locks pyproject.toml declares, by name."""
    locks = pyproject["tool"]["ffswarm"]["locks"]
    assert isinstance(locks, dict)
    return locks


def requirements(pyproject: dict[str, Any], spec: dict[str, Any]) -> list[str]:
    """The direct requirements a lock resolves (its no-deps pins aside)."""
    if spec.get("build-system"):
        return list(pyproject["build-system"]["requires"])
    extras = pyproject["project"].get("optional-dependencies", {})
    return list(pyproject["project"]["dependencies"]) + [r for e in spec.get("extras", []) for r in extras[e]]


def fingerprint(pyproject: dict[str, Any], name: str) -> str:
    """A digest of everything the lock's content depends on, so a change to any of it shows."""
    spec = table(pyproject)[name]
    data = {
        "requirements": sorted(requirements(pyproject, spec)),
        "no-deps": sorted(spec.get("no-deps", [])),
        "python": spec["python"],
        "platform": PLATFORM,
        "uv": UV,
    }
    return "sha256:" + hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()


def pip_index() -> str | None:
    """The index this machine's pip uses, if one is configured (its host is never written anywhere)."""
    out = subprocess.run(
        [sys.executable, "-m", "pip", "config", "get", "global.index-url"], capture_output=True, text=True
    )
    if out.returncode != 0:
        return None
    return out.stdout.strip() or None


def uv_binary() -> Path:
    venv = REPO / "build" / "lockvenv"
    uv = venv / "bin" / "uv"
    version = UV.split("==")[1]
    if uv.exists() and version in subprocess.run([uv, "--version"], capture_output=True, text=True).stdout:
        return uv
    print(f"lock: installing {UV} into {venv.relative_to(REPO)}", file=sys.stderr)
    subprocess.run([sys.executable, "-m", "venv", "--clear", venv], check=True)
    subprocess.run([venv / "bin" / "pip", "install", "-q", UV], check=True)
    return uv


def compile_(uv: Path, reqs: list[str], python: str, no_deps: bool) -> str:
    cmd = [
        str(uv), "pip", "compile", "-", "--generate-hashes", "--no-header", "--native-tls", "--quiet",
        "--python-version", python, "--python-platform", PLATFORM,
    ]  # fmt: skip
    if no_deps:
        cmd.append("--no-deps")
    index = pip_index()
    if index:
        cmd += ["--index-url", index]
    out = subprocess.run(cmd, input="\n".join(reqs) + "\n", capture_output=True, text=True, cwd=REPO)
    if out.returncode != 0:
        sys.exit(f"lock: uv failed:\n{out.stderr}")
    return out.stdout.replace("# via -r -", "# via pyproject.toml")


def write(uv: Path, pyproject: dict[str, Any], name: str) -> Path:
    spec = table(pyproject)[name]
    body = compile_(uv, requirements(pyproject, spec), spec["python"], no_deps=False)
    head = [
        f"# {name}: written by scripts/lock.py from pyproject.toml ([tool.ffswarm.locks]); do not edit.",
        f"# Python {spec['python']}, {PLATFORM}. Install: pip install --no-deps --require-hashes -r locks/{name}.txt",
        f"{FINGERPRINT}{fingerprint(pyproject, name)}",
    ]
    text = "\n".join(head) + "\n" + body
    if spec.get("no-deps"):
        text += (
            "\n# Pinned without their declared dependencies (pyproject [tool.ffswarm.locks] no-deps):\n"
            + compile_(uv, spec["no-deps"], spec["python"], no_deps=True)
        )
    path = LOCKS / f"{name}.txt"
    path.write_text(text)
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("names", nargs="*", help="locks to refresh (default: all)")
    args = parser.parse_args()
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    names = args.names or list(table(pyproject))
    unknown = sorted(set(names) - set(table(pyproject)))
    if unknown:
        sys.exit(f"lock: no lock named {', '.join(unknown)} in pyproject.toml [tool.ffswarm.locks]")
    LOCKS.mkdir(exist_ok=True)
    uv = uv_binary()
    for name in names:
        path = write(uv, pyproject, name)
        pins = sum(1 for line in path.read_text().splitlines() if "==" in line and not line.startswith("#"))
        print(f"lock: {path.relative_to(REPO)}: {pins} pins")


if __name__ == "__main__":
    main()
