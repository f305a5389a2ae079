"""A tenant's pairs job through the API (issue 18): its pairs' paths are the tenant's, in its area."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from controller.job.files import parse_job_text
from tests.builders import JPEG, Env, api_env


@pytest.fixture
def env(tmp_path: Path) -> Iterator[Env]:
    yield from api_env(tmp_path, quota={"upload": "64k", "jobs_queued": 3})  # as the submit tests' API


def test_a_tenants_pairs_are_read_in_its_area_and_handed_over_from_the_data_root(env: Env) -> None:
    area = env.area()
    with env.client() as c:
        c.get("/v1/jobs")  # the area is made on first use
        for rel in ("u/1.jpg", "u/2.jpg", "s/a.jpg", "s/b.jpg"):
            (area / rel).parent.mkdir(exist_ok=True)
            (area / rel).write_bytes(JPEG)
        pairs = [
            {"source": "u/1.jpg", "target": "s/a.jpg"},
            {"source": ["u/2.jpg"], "target": "s/b.jpg", "output": "o/b.jpg"},
        ]
        r = c.post("/v1/jobs", json={"name": "duo", "pairs": pairs, "resources": {"gpus": 0}})
        assert r.status_code == 202, r.text
        spec = parse_job_text(env.inbox_file(r.json()["id"]).read_text(), "inbox")
        assert [(p.source, p.target, p.output) for p in spec.pairs] == [
            (("tenants/acme/u/1.jpg",), "tenants/acme/s/a.jpg", None),
            (("tenants/acme/u/2.jpg",), "tenants/acme/s/b.jpg", "tenants/acme/o/b.jpg"),
        ]
        outside = [{"source": "../../u/1.jpg", "target": "s/a.jpg"}]
        refused = c.post("/v1/jobs", json={"name": "out", "pairs": outside, "resources": {"gpus": 0}})
    assert refused.status_code == 422 and refused.json()["error"]["field"] == "pairs[0].source"
