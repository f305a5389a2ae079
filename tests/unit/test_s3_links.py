"""The links a user is handed to a job's objects, made by the product's own code and checked by Ceph
RGW, a real S3 server (the ``rgw`` fixture): report.json's ``output_url`` (build_report with the
job's signer), the API's ``output_urls`` and report ``output_url``, and the webhook's ``results_url``
(a results.zip streamed from the store). Each downloads the object's exact bytes; one changed
signature character is refused; a presigned link past its expiry is refused by the server.

Expiry without waiting: botocore takes the signing time from its own clock, which the product does not
let a caller set, so the tests set that clock back while a link is signed (``signing_clock_back``),
and the server, with its real clock, judges the link. A link signed as long ago, but still within its
lifetime, downloads: the refusal is the expiry's, not the signing date's.
"""

from __future__ import annotations

import hashlib
import io
import time
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest
import yaml

from contract.results import ItemResult, ItemStatus
from contract.s3 import META_ATTEMPT, META_ITEM, META_JOB, META_SHA256
from controller.api.area import Area
from controller.config import Config, parse_config
from controller.job.plan import Chunk, Plan, PlannedItem
from controller.run.hooks import results_link
from controller.run.jobs import output_links
from controller.run.report import build_report
from controller.run.rundir import Control, RunDir
from controller.serve.jobs import record_owner
from tests.builders import Env, beat, make_config, serve_api
from tests.fixtures.rgw_server import Rgw, signing_clock_back

JOB = "party-abcdefgh"
HOUR = 3600


@dataclass
class LinkEnv(Env):
    rgw: Rgw
    bucket: str

    def output(self, n: int) -> str:
        return f"s3://{self.bucket}/acme/out/{JOB}/{n}.jpg"


@pytest.fixture
def env(tmp_path: Path, rgw: Rgw) -> Iterator[LinkEnv]:
    """The API with tenant acme's area ``s3://<a bucket of its own>/acme/`` (link_ttl 1h), and acme's
    finished job: two items whose objects a runner committed."""
    bucket = rgw.new_bucket()
    try:
        _, signing = make_config(tmp_path)
        data = yaml.safe_load((tmp_path / "ffswarm.yaml").read_text())
        data["tenants"]["acme"]["s3"] = f"s3://{bucket}/acme/"
        data["storage"] = {"s3": {"endpoint_url": rgw.endpoint, "credentials_secret": "ffswarm-s3",
                                  "credentials_file": str(rgw.cred_file(tmp_path)), "link_ttl": "1h"}}  # fmt: skip
        config = parse_config(tmp_path / "ffswarm.yaml", data)
        beat(config)
        for url in serve_api(config):
            env = LinkEnv(config, config.data_root, url, signing, rgw, bucket)
            finished_run(env)
            yield env
    finally:
        rgw.remove_bucket(bucket)


def body(n: int) -> bytes:
    return f"swapped photo {n} ".encode() * 300


def finished_run(env: LinkEnv) -> None:
    """acme's job as it ends: both items committed (objects with the job's metadata, result lines)
    and its report written."""
    area = Area(env.root, "acme")
    area.ensure(None)
    area.write_record(JOB, uploads=False)
    items = tuple(PlannedItem(f"i{n:06d}", f"s3://{env.bucket}/acme/in/{n}.jpg", env.output(n), "image")
                  for n in range(2))  # fmt: skip
    plan = Plan(JOB, items, (Chunk("c0000", tuple(i.id for i in items)),))
    rd = RunDir(env.root, JOB)
    rd.create(b"name: x\n", plan, {}, Control(2), "sha256:x")
    record_owner("acme")(rd, None)  # type: ignore[arg-type]  # as serve records it; the job is not looked at
    lines, now, s3 = [], time.time(), env.rgw.client()
    for n, item in enumerate(items):
        digest = hashlib.sha256(body(n)).hexdigest()
        meta = {META_JOB: JOB, META_ITEM: item.id, META_ATTEMPT: "1", META_SHA256: digest}
        s3.put_object(Bucket=env.bucket, Key=f"acme/out/{JOB}/{n}.jpg", Body=body(n), Metadata=meta)
        lines.append(ItemResult(item.id, ItemStatus.OK, 1, item.input, item.output, started=now, finished=now,
                                size=len(body(n)), sha256=digest).to_line())  # fmt: skip
    (rd.path / "results" / "c0000.jsonl").write_text("".join(lines))
    rd.write_report(job_report(env.config))


def job_report(config: Config) -> dict[str, Any]:
    """report.json as acme's job writes it when it ends, its links signed now."""
    rd = RunDir(config.data_root, JOB)
    return build_report(rd.plan(), rd, {}, "sha256:x", time.time(), output_links(config, "acme")).to_dict()


def report_links(config: Config) -> dict[str, str]:
    """item → output_url in report.json."""
    links = {k: v.get("output_url") for k, v in job_report(config)["items"].items()}
    assert all(isinstance(v, str) for v in links.values()), links
    return {k: str(v) for k, v in links.items()}


def api_links(env: LinkEnv) -> list[tuple[str, str]]:
    """(item, link) from ``GET /v1/jobs/{id}`` (output_urls) and from ``GET …/report`` (output_url)."""
    with env.client() as c:
        status, report = c.get(f"/v1/jobs/{JOB}"), c.get(f"/v1/jobs/{JOB}/report")
    assert status.status_code == 200 and report.status_code == 200, (status.text, report.text)
    from_status = sorted(status.json()["output_urls"].items())
    from_report = sorted((k, v["output_url"]) for k, v in report.json()["items"].items())
    assert [k for k, _ in from_status] == [k for k, _ in from_report] == ["i000000", "i000001"]
    return from_status + from_report


def tampered(link: str, name: str) -> str:
    """``link`` with the last character of its query parameter ``name`` changed to another."""
    value = parse_qs(urlsplit(link).query)[name][0]
    last = "0" if value[-1] != "0" else "1"
    changed = link.replace(f"{name}={value}", f"{name}={value[:-1]}{last}")
    assert changed != link
    return changed


def get(link: str) -> httpx.Response:
    return httpx.get(link, timeout=10)


def test_report_links_download_the_objects_and_a_tampered_or_expired_one_is_refused(env: LinkEnv) -> None:
    links = report_links(env.config)
    for n, item in enumerate(sorted(links)):
        got = get(links[item])
        assert got.status_code == 200 and got.content == body(n)
        assert links[item].startswith(f"{env.rgw.endpoint}/{env.bucket}/acme/out/{JOB}/{n}.jpg?")
        refused = get(tampered(links[item], "X-Amz-Signature"))
        assert refused.status_code == 403 and b"SignatureDoesNotMatch" in refused.content
    with signing_clock_back(HOUR + 60):  # link_ttl 1h, signed an hour and a minute ago
        old = report_links(env.config)
    expired = get(old["i000000"])
    assert expired.status_code == 403 and b"AccessDenied" in expired.content
    with signing_clock_back(HOUR - 60):  # as long ago, still within its hour
        assert get(report_links(env.config)["i000000"]).content == body(0)


def test_the_apis_links_download_the_objects_and_a_tampered_or_expired_one_is_refused(env: LinkEnv) -> None:
    for item, link in api_links(env):
        got = get(link)
        assert got.status_code == 200 and got.content == body(int(item[1:]))
        assert get(tampered(link, "X-Amz-Signature")).status_code == 403
    with signing_clock_back(HOUR + 60):  # the API signs each answer's links at that answer
        old = api_links(env)
    for _, link in old:
        expired = get(link)
        assert expired.status_code == 403 and b"AccessDenied" in expired.content
    assert all(get(link).status_code == 200 for _, link in api_links(env))  # signed now: good again


def test_the_webhooks_results_link_streams_the_objects_and_a_tampered_one_is_refused(env: LinkEnv) -> None:
    """The webhook carries no presigned link of its own (its data is the status object): its
    ``results_url`` is the API's, a ZIP streamed from the store. Its expiry: test_api_results.py."""
    link = results_link(env.root, JOB, env.config.tenants, env.config.api)["results_url"]
    with env.client(tenant=None) as anon:
        got = anon.get(link)
        refused = anon.get(tampered(link, "sig"))
    assert got.status_code == 200, got.text
    with zipfile.ZipFile(io.BytesIO(got.content)) as zf:
        assert zf.read(f"out/{JOB}/0.jpg") == body(0) and zf.read(f"out/{JOB}/1.jpg") == body(1)
    assert refused.status_code == 403 and refused.json()["error"]["code"] == "bad_signature"
