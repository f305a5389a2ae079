"""Jobs with s3:// paths, on the controller's side (issue 19, docs/storage.md): submit lists the
globs in the store (Ceph RGW on loopback: the ``s3`` fixture, tests/fixtures/rgw_server.py),
plans the objects' URLs, and writes manifests that name the store and the secret's file, never the
secret; the runner services get the secret by reference and the operator's network."""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import pytest

from contract.manifest import Manifest
from controller.config import Config, parse_config
from controller.errors import FfswarmError, JobFileError
from controller.job.plan import chunk_manifests
from controller.run.jobs import manifest_settings, output_links, prepare, runner_settings
from controller.swarm.docker import secret_references
from controller.swarm.servicespec import RUNNER_NETWORK, chunk_service
from tests import builders
from tests.fixtures.rgw_server import Seeded

RUNNER = "10001:10001"
IMAGE = "sha256:" + "1" * 64


def config(tmp_path: Path, m: Seeded | None, **extra: Any) -> Config:
    root = builders.data_root(tmp_path, photos=("faces/star.jpg",))
    for p in (root, *root.rglob("*")):
        os.chown(p, 10001, 10001)
    data: dict[str, Any] = {"data_root": str(root), "runner_user": RUNNER, **extra}
    if m is not None:
        data["storage"] = {"s3": {"endpoint_url": m.endpoint, "credentials_secret": "ffswarm-s3",
                                  "credentials_file": str(m.cred_file), "link_ttl": "1h",
                                  "network": "s3-egress"}}  # fmt: skip
    return parse_config(tmp_path / "ffswarm.yaml", data)


def job(
    tmp_path: Path, targets: str = "s3://media/crowd/*.jpg", output: str = "s3://media/out/{job}/{stem}.png"
) -> Path:
    f = tmp_path / "job.yaml"
    f.write_text(
        f"name: j\nsource: faces/star.jpg\ntargets: ['{targets}', 'faces/*.jpg']\noutput: '{output}'\n"
        "resources: {gpus: 0}\n"
    )
    return f


def test_a_job_with_an_s3_glob_and_s3_outputs_plans_urls_and_manifests_name_the_store(
    tmp_path: Path, s3: Seeded
) -> None:
    cfg = config(tmp_path, s3)
    (prepared,) = prepare(cfg, [job(tmp_path)], new=False)
    assert [(i.input, i.output) for i in prepared.plan.items] == [
        ("s3://media/crowd/a.jpg", "s3://media/out/j/a.png"),
        ("s3://media/crowd/b.jpg", "s3://media/out/j/b.png"),
        ("faces/star.jpg", "s3://media/out/j/star.png"),
    ]
    assert prepared.folders == ()  # objects: no folder to make
    manifests = chunk_manifests(prepared.plan, manifest_settings(cfg, prepared))
    for m in manifests.values():
        text = m.to_json()
        back = Manifest.from_json(text)
        assert back.storage is not None and back.storage.credentials_file == "/run/secrets/ffswarm-s3"
        assert back.storage.endpoint_url == s3.endpoint
        assert s3.creds.secret_access_key not in text and s3.creds.access_key_id not in text
        assert [i.input for i in back.items][0].startswith(("s3://media/crowd/", "/data/faces/"))
        assert back.source == ("/data/faces/star.jpg",)


def test_a_job_of_files_only_has_no_storage_in_its_manifests(tmp_path: Path, s3: Seeded) -> None:
    cfg = config(tmp_path, s3)
    (tmp_path / "root" / "faces" / "t.jpg").write_bytes(b"x")
    (prepared,) = prepare(cfg, [job(tmp_path, targets="faces/t.jpg", output="out/{stem}.png")], new=False)
    assert all(m.storage is None for m in chunk_manifests(prepared.plan, manifest_settings(cfg, prepared)).values())
    assert "secrets" not in chunk_service(runner_settings(cfg, prepared, IMAGE), "c0000", 1).as_dict()


def test_a_missing_bucket_is_exit_66_naming_it(tmp_path: Path, s3: Seeded) -> None:
    with pytest.raises(FfswarmError) as e:
        prepare(config(tmp_path, s3), [job(tmp_path, targets="s3://no-such-bucket/crowd/*.jpg")], new=False)
    assert e.value.exit_code == 66
    assert "bucket 'no-such-bucket' does not exist" in str(e.value)


def test_a_missing_object_is_named_like_a_missing_file(tmp_path: Path, s3: Seeded) -> None:
    with pytest.raises(FfswarmError) as e:
        prepare(config(tmp_path, s3), [job(tmp_path, targets="s3://media/crowd/zz.jpg")], new=False)
    assert e.value.exit_code == 66
    assert "targets[0]: 's3://media/crowd/zz.jpg' does not exist" in str(e.value)


def test_a_glob_over_the_targets_limit_is_a_job_file_error(tmp_path: Path, s3: Seeded) -> None:
    cfg = config(tmp_path, s3, policy={"limits": {"targets": 50}})
    with pytest.raises(JobFileError) as e:
        prepare(cfg, [job(tmp_path, targets="s3://bulk/many/*.jpg")], new=False)
    assert e.value.field == "targets[0]" and "matches more than 50 objects" in str(e.value)


def test_without_storage_configured_an_s3_path_names_the_field(tmp_path: Path) -> None:
    with pytest.raises(JobFileError) as e:
        prepare(config(tmp_path, None), [job(tmp_path)], new=False)
    assert e.value.field == "targets[0]" and "storage.s3 is not configured" in str(e.value)


def test_an_s3_output_template_without_storage_names_output(tmp_path: Path) -> None:
    cfg = config(tmp_path, None)
    with pytest.raises(JobFileError) as e:
        prepare(cfg, [job(tmp_path, targets="faces/star.jpg")], new=False)
    assert e.value.field == "output" and "storage.s3 is not configured" in str(e.value)


def test_a_tenant_job_with_s3_is_refused(tmp_path: Path, s3: Seeded) -> None:
    with pytest.raises(JobFileError) as e:
        prepare(config(tmp_path, s3), [job(tmp_path)], new=False, tenant="acme")
    assert "not accepted in API jobs" in str(e.value)


def test_colliding_s3_outputs_are_refused(tmp_path: Path, s3: Seeded) -> None:
    with pytest.raises(JobFileError) as e:
        prepare(config(tmp_path, s3), [job(tmp_path, output="s3://media/out/same.png")], new=False)
    assert e.value.field == "output"


def _clip(tmp_path: Path) -> bytes:
    out = tmp_path / "clip.mp4"
    subprocess.run(["ffmpeg", "-v", "error", "-nostdin", "-y", "-f", "lavfi", "-i", "testsrc=size=64x64:rate=10",
                    "-t", "2", "-pix_fmt", "yuv420p", str(out)], check=True)  # fmt: skip
    return out.read_bytes()


def test_a_video_in_the_store_is_probed_and_cut_into_segments(tmp_path: Path, s3: Seeded) -> None:
    store = s3.store()
    store._client.put_object(Bucket="media", Key="clips/a.mp4", Body=_clip(tmp_path))
    cfg = config(tmp_path, s3)
    text = "segment_seconds: 1\nname: v\nsource: faces/star.jpg\ntargets: ['s3://media/clips/*.mp4']\n"
    (tmp_path / "v.yaml").write_text(text + "output: 's3://media/out/{stem}{ext}'\nresources: {gpus: 0}\n")
    [prepared] = prepare(cfg, [tmp_path / "v.yaml"], new=False)
    [video] = prepared.plan.videos
    assert (video.input, video.output) == ("s3://media/clips/a.mp4", "s3://media/out/a.mp4")
    assert len(video.segments) == 2 and video.info["frames"] == 20 and video.info["etag"]
    assert not list(Path(tempfile.gettempdir()).glob("ffswarm-object-*"))  # the probe's copy is gone


def test_a_video_in_the_store_over_the_video_bytes_limit_is_refused_naming_it(tmp_path: Path, s3: Seeded) -> None:
    store = s3.store()
    store._client.put_object(Bucket="media", Key="clips/b.mp4", Body=_clip(tmp_path))
    cfg = config(tmp_path, s3, policy={"limits": {"video_bytes": "1KiB"}})
    with pytest.raises(JobFileError) as e:
        prepare(cfg, [job(tmp_path, targets="s3://media/clips/b.mp4", output="s3://media/out/{stem}{ext}")], new=False)
    assert e.value.field == "targets" and "s3://media/clips/b.mp4" in str(e.value)
    assert "policy.limits.video_bytes" in str(e.value)


def test_runner_services_get_the_secret_by_reference_and_the_operators_network(tmp_path: Path, s3: Seeded) -> None:
    cfg = config(tmp_path, s3)
    (prepared,) = prepare(cfg, [job(tmp_path)], new=False)
    spec = chunk_service(runner_settings(cfg, prepared, IMAGE), "c0000", 1)
    data = spec.as_dict()
    assert data["networks"] == [RUNNER_NETWORK] and data["storage_networks"] == ["s3-egress"]
    assert data["secrets"] == [
        {"name": "ffswarm-s3", "file": "/run/secrets/ffswarm-s3", "uid": "10001", "gid": "10001", "mode": "0o400"}
    ]
    (ref,) = secret_references(spec, {"ffswarm-s3": "sec123"})
    assert ref == {
        "SecretID": "sec123",
        "SecretName": "ffswarm-s3",
        "File": {"Name": "ffswarm-s3", "UID": "10001", "GID": "10001", "Mode": 0o400},
    }
    assert s3.creds.secret_access_key not in json.dumps(data) + json.dumps(ref)


def test_report_links_are_presigned_for_s3_outputs(tmp_path: Path, s3: Seeded) -> None:
    links = output_links(config(tmp_path, s3))
    assert links is not None
    url = links("s3://media/out/j/a.png")
    assert url is not None and url.startswith(f"{s3.endpoint}/media/out/j/a.png?")
    assert "X-Amz-Expires=3600" in url and s3.creds.secret_access_key not in url
