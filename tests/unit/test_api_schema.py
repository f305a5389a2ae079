"""Schemathesis, a tester nobody here wrote, against the live /openapi.json of a real `ffswarm api` on
loopback with a tenant's token: no answer is a 5xx, and every answer's status code, content type,
headers and body match what the document says. Bounded (a few examples per operation) so that it
runs in well under a minute on two cores."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from controller.api.area import Area
from controller.api.openapi import document
from controller.job.plan import Chunk, Plan, PlannedItem
from controller.run.report import build_report
from controller.run.rundir import Control, RunDir
from tests.builders import KEYS, beat, make_config, serve_api

JOB = "party-abcdefgh"
MAX_EXAMPLES = 25
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
]


def finished_job(root: Path) -> None:
    """One finished job of acme's with a committed photo, so that the job routes have something to
    answer besides 404."""
    from contract.results import ItemResult, ItemStatus

    area = Area(root, "acme")
    area.ensure(None)
    area.write_record(JOB, uploads=False)
    item = PlannedItem("i000000", "tenants/acme/in/0.jpg", f"tenants/acme/out/{JOB}/0.jpg", "image")
    rd = RunDir(root, JOB)
    rd.create(b"name: x\n", Plan(JOB, (item,), (Chunk("c0000", (item.id,)),)), {}, Control(1), "sha256:x")
    for rel in (item.input, item.output):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(b"\xff\xd8\xff\xe0\x00\x10JFIF\x00" + b"\x11" * 200)
    line = ItemResult(item.id, ItemStatus.OK, 1, f"/data/{item.input}", f"/data/{item.output}", started=1, finished=2)
    (rd.path / "results" / "c0000.jsonl").write_text(line.to_line())
    plan = rd.plan()
    rd.write_report(build_report(plan, rd, {}, "ffswarm-runner:test", 1.0).to_dict())  # as a job's end writes it


@pytest.fixture(scope="module")
def base_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    config, _ = make_config(tmp_path_factory.mktemp("schema"), quota={"jobs_queued": 5})
    beat(config)
    finished_job(config.data_root)
    yield from serve_api(config)


def operations() -> list[tuple[GenerationMode, str, str]]:
    """(mode, method, path) of every operation the document names (read here only to name the
    tests): valid requests for each, invalid ones for each that takes any input."""
    doc = document()  # as the live /openapi.json
    out = []
    for path, ops in doc["paths"].items():
        for method, op in ops.items():
            out.append((GenerationMode.POSITIVE, method.upper(), path))
            if op.get("parameters") or op.get("requestBody"):
                out.append((GenerationMode.NEGATIVE, method.upper(), path))
    return out


@pytest.mark.parametrize(("mode", "method", "path"), operations(), ids=lambda v: getattr(v, "value", str(v)))
def test_every_answer_matches_the_openapi_document(mode: GenerationMode, method: str, path: str, base_url: str) -> None:
    live = schemathesis.openapi.from_url(f"{base_url}/openapi.json")  # the document the API serves
    operation = live[path][method]
    token = {"Authorization": f"Bearer {KEYS['acme']}"}

    @given(case=operation.as_strategy(generation_mode=mode))
    @settings(max_examples=MAX_EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
    def check(case: schemathesis.Case) -> None:
        params = case.path_parameters or {}
        # Half the generated ids are swapped for the one real job (and its item), so that the
        # routes are exercised past their 404 too.
        if "job" in params and len(str(params["job"])) % 2 == 0:
            params["job"] = JOB
            if "item" in params:
                params["item"] = "i000000"
        case.call_and_validate(base_url=base_url, headers=token, checks=CHECKS, timeout=10)

    check()
