"""An OpenAPI linter nobody here wrote (Redocly CLI, installed by scripts/openapi-lint.sh at the version
tools/openapi-lint/package-lock.json pins) finds no problem in the document a real `ffswarm api` serves on
loopback: no error and no warning of the recommended ruleset (tools/openapi-lint/redocly.yaml). A
problem is fixed in the generator (controller/api/openapi.py), never by editing the served document.

The install's lock names no registry: the machine's npm config decides where packages come from."""

from __future__ import annotations

import json
import re
import subprocess
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from controller.api.openapi import document
from tests.builders import Env, api_env

ROOT = Path(__file__).resolve().parents[2]
TOOL = ROOT / "tools" / "openapi-lint"
LINT = ROOT / "scripts" / "openapi-lint.sh"


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    yield from api_env(tmp_path_factory.mktemp("lint"))


@pytest.fixture(scope="module")
def served(env: Env, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The live /openapi.json, as the API sends it, in a file."""
    answer = httpx.get(f"{env.url}/openapi.json", timeout=10)
    assert answer.status_code == 200, answer.text
    doc = tmp_path_factory.mktemp("doc") / "openapi.json"
    doc.write_bytes(answer.content)
    return doc


def _lint(doc: Path) -> tuple[int, dict[str, Any]]:
    """The linter's exit status and its JSON report on ``doc``; the first call installs the linter
    when scripts/dev-swarm.sh has not (or waits for the install it started)."""
    run = subprocess.run([str(LINT), str(doc), "--format=json"], capture_output=True, text=True, timeout=600, cwd=ROOT)
    try:
        report: dict[str, Any] = json.loads(run.stdout)
    except json.JSONDecodeError:
        pytest.fail(f"the linter did not run (exit {run.returncode}):\n{run.stdout}\n{run.stderr}")
    return run.returncode, report


def _problems(report: dict[str, Any]) -> str:
    return "\n".join(
        f"{p['severity']} {p['ruleId']} at {', '.join(loc['pointer'] for loc in p['location'])}: {p['message']}"
        for p in report["problems"]
    )


def test_the_served_document_has_no_lint_problem(served: Path) -> None:
    status, report = _lint(served)
    assert status == 0 and report["totals"]["errors"] == 0, _problems(report)
    assert report["totals"]["warnings"] == 0, _problems(report)


def test_a_defect_in_a_document_is_reported_with_its_place(served: Path, tmp_path: Path) -> None:
    """The linter really looks: one response example that breaks its schema is a warning (which the
    linter's exit status ignores, hence the count above) naming the rule and the place."""
    doc = json.loads(served.read_text())
    media = doc["paths"]["/v1/jobs/{job}"]["get"]["responses"]["200"]["content"]["application/json"]
    media["example"] = {**media["example"], "phase": "exploded"}
    broken = tmp_path / "broken.json"
    broken.write_text(json.dumps(doc))
    status, report = _lint(broken)
    assert status == 0 and report["totals"] == {"errors": 0, "warnings": 1, "ignored": 0}, _problems(report)
    (problem,) = report["problems"]
    assert problem["ruleId"] == "no-invalid-media-type-examples", problem
    assert problem["location"][0]["pointer"] == (
        "#/paths/~1v1~1jobs~1{job}/get/responses/200/content/application~1json/example/phase"
    )
    assert "`phase` property must be equal to one of the allowed values" in problem["message"], problem


def test_the_document_names_the_projects_license() -> None:
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["license"]["text"]
    assert document()["info"]["license"]["identifier"] == declared


def test_the_linter_is_pinned_and_its_lock_names_no_registry() -> None:
    package = json.loads((TOOL / "package.json").read_text())
    for name, version in package["dependencies"].items():
        assert re.fullmatch(r"\d+\.\d+\.\d+", version), (
            f"tools/openapi-lint/package.json: {name} {version} is not exact"
        )
    lock = json.loads((TOOL / "package-lock.json").read_text())
    assert lock["packages"][""]["dependencies"] == package["dependencies"], "run npm install in tools/openapi-lint"
    resolved = [path for path, entry in lock["packages"].items() if "resolved" in entry]
    assert not resolved, f"tools/openapi-lint/package-lock.json names where {resolved[:3]} came from"
    assert all("integrity" in entry for path, entry in lock["packages"].items() if path), "a package without its hash"
