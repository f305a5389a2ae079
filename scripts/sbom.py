#!/usr/bin/env python3
"""A CycloneDX 1.5 SBOM (JSON) of a Python environment and the Debian packages beside it.

    sbom.py [--path SITE_DIR ...] [--lock LOCK] [--pip-report REPORT] [--dpkg-admindir DIR]
            [--os-release FILE] [--name NAME] [--property NAME=VALUE ...] [-o OUT]
    sbom.py --list SBOM        # one line per component (kind, name, version, sha256): diff two builds

Dockerfile.runner runs it at build time (stored at /opt/ffswarm/sbom.cdx.json; the build script copies
it to build/sbom-runner.cdx.json and puts its sha256 in the image label io.ffswarm.sbom.sha256).

- Python components: every distribution importlib.metadata finds on ``--path`` (default: this
  interpreter's sys.path), with its version and licence. Its sha256 is the one of the file pip
  installed when ``--pip-report`` (``pip install --report``) names it, else the lock's when the lock
  allows exactly one file; otherwise the lock's allowed hashes go in the property ffswarm:lock-sha256.
- Debian components: what ``dpkg-query`` lists as installed (``--dpkg-admindir``, default dpkg's own),
  as pkg:deb purls of the distribution /etc/os-release names.

Stdlib only, so it runs inside the image with no tools installed. The output is deterministic: the
same packages give the same bytes (no timestamp unless SOURCE_DATE_EPOCH is set; the serial number is
derived from the components), so two builds can be compared by their SBOM digest.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import subprocess
import sys
import uuid
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any
from urllib.parse import quote

PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;\\]+)")
HASH = re.compile(r"--hash=sha256:([0-9a-f]{64})")
DPKG_FORMAT = "${Package}\t${Version}\t${Architecture}\t${db:Status-Abbrev}\t${source:Package}\n"


def canonical(name: str) -> str:
    """PEP 503 normalised name: how locks, pip and purls agree on one spelling."""
    return re.sub(r"[-_.]+", "-", name).lower()


def read_lock(path: Path) -> tuple[dict[str, tuple[str, list[str]]], str | None]:
    """name → (version, allowed sha256s) from a pip requirements lock, and its inputs fingerprint."""
    pins: dict[str, tuple[str, list[str]]] = {}
    current: str | None = None
    inputs = None
    for line in path.read_text().splitlines():
        if line.startswith("# inputs: "):
            inputs = line.split(": ", 1)[1].strip()
        m = PIN.match(line)
        if m:
            current = canonical(m.group(1))
            pins[current] = (m.group(2), [])
        if current is not None:
            pins[current][1].extend(HASH.findall(line))
    return pins, inputs


def read_pip_report(path: Path) -> dict[str, str]:
    """name → sha256 of the file pip installed (``pip install --report``)."""
    report = json.loads(path.read_text())
    out: dict[str, str] = {}
    for item in report.get("install", []):
        archive = item.get("download_info", {}).get("archive_info", {})
        digest = archive.get("hashes", {}).get("sha256") or archive.get("hash", "").partition("sha256=")[2]
        if digest:
            out[canonical(item["metadata"]["name"])] = digest
    return out


def licence(dist: metadata.Distribution) -> list[dict[str, Any]]:
    meta = dist.metadata
    expression = meta.get("License-Expression")
    if expression:
        return [{"expression": expression}]
    names = [c.split(" :: ")[-1] for c in meta.get_all("Classifier") or [] if c.startswith("License :: ")]
    text = (meta.get("License") or "").strip()
    if not names and text and "\n" not in text and len(text) <= 80:
        names = [text]
    return [{"license": {"name": n}} for n in sorted(set(names))]


def python_components(
    paths: list[str] | None, lock: dict[str, tuple[str, list[str]]], installed: dict[str, str]
) -> list[dict[str, Any]]:
    seen: dict[str, dict[str, Any]] = {}
    dists = metadata.distributions(path=paths) if paths else metadata.distributions()
    for dist in dists:
        name = canonical(dist.metadata["Name"])
        if name in seen:  # the same name twice on the path: the first one is what imports get
            continue
        version = dist.version
        purl = f"pkg:pypi/{name}@{quote(version, safe='')}"
        comp: dict[str, Any] = {"type": "library", "bom-ref": purl, "name": name, "version": version, "purl": purl}
        props = [{"name": "ffswarm:ecosystem", "value": "python"}]
        pinned = lock.get(name)
        if lock and pinned is None:
            props.append({"name": "ffswarm:locked", "value": "no"})
        elif pinned is not None and pinned[0] != version:
            raise SystemExit(f"sbom: {name} {version} is installed but the lock pins {pinned[0]}")
        allowed = pinned[1] if pinned else []
        digest = installed.get(name)
        if digest and allowed and digest not in allowed:
            raise SystemExit(f"sbom: {name}: the installed file's sha256 is not one the lock allows")
        if not digest and len(allowed) == 1:
            digest = allowed[0]
        if digest:
            comp["hashes"] = [{"alg": "SHA-256", "content": digest}]
        elif allowed:
            props.append({"name": "ffswarm:lock-sha256", "value": ",".join(sorted(allowed))})
        lic = licence(dist)
        if lic:
            comp["licenses"] = lic
        comp["properties"] = props
        seen[name] = comp
    return sorted(seen.values(), key=lambda c: c["name"])


def os_release(path: Path) -> dict[str, str]:
    out: dict[str, str] = {}
    try:
        for line in path.read_text().splitlines():
            key, sep, value = line.partition("=")
            if sep:
                out[key] = value.strip().strip('"')
    except OSError:
        pass
    return out


def debian_components(admindir: str | None, release: dict[str, str]) -> list[dict[str, Any]]:
    cmd = ["dpkg-query", "-W", "-f", DPKG_FORMAT]
    if admindir:
        cmd.insert(1, f"--admindir={admindir}")
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError) as e:
        raise SystemExit(f"sbom: dpkg-query failed: {e}") from None
    vendor = release.get("ID", "debian")
    distro = f"{vendor}-{release.get('VERSION_ID', '')}".rstrip("-")
    comps = []
    for line in out.splitlines():
        name, version, arch, status, source = (line.split("\t") + [""] * 5)[:5]
        if not status.startswith("ii"):
            continue  # removed, or only its configuration left
        purl = f"pkg:deb/{vendor}/{name}@{quote(version, safe='')}?arch={arch}&distro={distro}"
        comp: dict[str, Any] = {"type": "library", "bom-ref": purl, "name": name, "version": version, "purl": purl}
        props = [{"name": "ffswarm:ecosystem", "value": "deb"}]
        if source and source != name:
            props.append({"name": "ffswarm:source-package", "value": source})
        comp["properties"] = props
        comps.append(comp)
    return sorted(comps, key=lambda c: c["name"])


def bom(name: str, components: list[dict[str, Any]], properties: list[dict[str, str]]) -> dict[str, Any]:
    body = json.dumps(components, sort_keys=True).encode()
    meta: dict[str, Any] = {
        "tools": {"components": [{"type": "application", "name": "ffswarm scripts/sbom.py"}]},
        "component": {"type": "container", "bom-ref": name, "name": name},
        "properties": properties,
    }
    epoch = os.environ.get("SOURCE_DATE_EPOCH")
    if epoch:
        meta["timestamp"] = datetime.fromtimestamp(int(epoch), UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return {
        "bomFormat": "CycloneDX",
        "specVersion": "1.5",
        "serialNumber": f"urn:uuid:{uuid.uuid5(uuid.NAMESPACE_URL, hashlib.sha256(body).hexdigest())}",
        "version": 1,
        "metadata": meta,
        "components": components,
    }


def listing(path: Path) -> str:
    """One line per component, sorted: the part of two builds' SBOMs that must be identical."""
    lines = []
    for c in json.loads(path.read_text())["components"]:
        kind = next((p["value"] for p in c.get("properties", []) if p["name"] == "ffswarm:ecosystem"), "?")
        digest = next((h["content"] for h in c.get("hashes", [])), "-")
        lines.append(f"{kind} {c['name']} {c['version']} {digest}")
    return "\n".join(sorted(lines)) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--path", action="append", help="a folder of installed distributions (repeatable)")
    parser.add_argument("--lock", type=Path, help="the lock the environment was installed from")
    parser.add_argument("--pip-report", type=Path, help="pip install --report output: the installed files' sha256")
    parser.add_argument("--dpkg-admindir", help="dpkg's database folder (default dpkg's own)")
    parser.add_argument("--no-dpkg", action="store_true", help="Python packages only")
    parser.add_argument("--os-release", type=Path, default=Path("/etc/os-release"))
    parser.add_argument("--name", default="ffswarm-runner", help="the described image's name")
    parser.add_argument("--property", action="append", default=[], metavar="NAME=VALUE", help="a metadata property")
    parser.add_argument("-o", "--output", type=Path, help="write here (default stdout)")
    parser.add_argument("--list", type=Path, metavar="SBOM", help="print an SBOM's components, one per line")
    args = parser.parse_args(argv)
    if args.list:
        sys.stdout.write(listing(args.list))
        return 0
    lock, inputs = read_lock(args.lock) if args.lock else ({}, None)
    installed = read_pip_report(args.pip_report) if args.pip_report else {}
    comps = python_components(args.path, lock, installed)
    missing = sorted(set(lock) - {c["name"] for c in comps})
    if missing:
        raise SystemExit(f"sbom: locked but not installed: {', '.join(missing)}")
    if not args.no_dpkg:
        comps += debian_components(args.dpkg_admindir, os_release(args.os_release))
    props = []
    if args.lock:
        props.append({"name": "ffswarm:lock", "value": args.lock.name})
    if inputs:
        props.append({"name": "ffswarm:lock-inputs", "value": inputs})
    for item in args.property:
        key, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"sbom: --property wants NAME=VALUE, got {item!r}")
        props.append({"name": key, "value": value})
    text = json.dumps(bom(args.name, comps, props), indent=1, sort_keys=True) + "\n"
    if args.output:
        args.output.write_text(text)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
