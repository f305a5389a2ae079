"""The cluster's policy bounds what a job file may ask for (issue 15 a): images, placement, maxima.

Each refusal is exit 65 naming the file, the field, the value asked for and the limit, and nothing
is created (no run folder, no output folder).
"""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest
import yaml

from controller.config import Config, parse_config
from controller.errors import ConfigError, JobFileError
from controller.job.files import load_job_file
from controller.job.video import VideoInfo, check_limits
from controller.policy import Hook, Limits, Policy, check_counts, check_job, parse_policy
from controller.run import jobs as jobs_mod
from controller.settings.fields import FieldError
from tests import builders
from tests.builders import job_spec

EXAMPLE = """
images: [registry.example.internal/ffswarm/runner@sha256:0123]
placement: [node.labels.ffswarm.gpu==true]
limits: {gpus: 2, max_concurrent: 8, memory: 8g, retries: 3, timeout: 1h, targets: 1000, segments: 500,
         job_file: 64KiB, video_pixels: 2073600, video_frames: 90000}
hooks:
  notify-crm: {command: [/usr/local/bin/notify-crm, --job], user: "65534:65534", timeout: 60s}
webhooks:
  allow_hosts: [hooks.example.internal]
  allow_private: false
  secret_file: /run/secrets/ffswarm-webhook
"""


def setup(tmp_path: Path, policy: str | None = None) -> tuple[Config, Path]:
    pack = {r: {"role": r2, "sha256": "0" * 64} for r, r2 in (("d.onnx", "detector"), ("r.onnx", "recognizer"))}
    pack["s.onnx"] = {"role": "swapper", "sha256": "0" * 64}
    root = builders.data_root(tmp_path, pack, ("faces/star.jpg", *(f"crowd/{n}.jpg" for n in range(3))))
    data: dict[str, Any] = {"data_root": str(root)}
    if policy is not None:
        data["policy"] = yaml.safe_load(policy)
    return parse_config(tmp_path / "ffswarm.yaml", data), root


def job_file(tmp_path: Path, extra: str = "") -> Path:
    f = tmp_path / "job.yaml"
    f.write_text("name: j\nsource: faces/star.jpg\ntargets: [crowd/*.jpg]\noutput: out/{stem}{ext}\n" + extra)
    return f


def refused(config: Config, f: Path) -> JobFileError:
    with pytest.raises(JobFileError) as e:
        jobs_mod.prepare(config, [f], new=False)
    assert e.value.exit_code == 65
    assert not (config.data_root / "runs").exists()  # nothing else happened
    assert not (config.data_root / "out").exists()
    return e.value


# -- the config ------------------------------------------------------------------------------------------
def test_no_policy_section_is_the_safe_default(tmp_path: Path) -> None:
    config, _ = setup(tmp_path)
    assert config.policy == Policy()
    assert config.policy.limits == Limits(
        gpus=1, max_concurrent=64, memory=16 * 1024**3, retries=5, timeout=6 * 3600, targets=200_000,
        segments=20_000, job_file=1024**2, video_pixels=8_847_360, video_frames=1_000_000, cpus=2,
    )  # fmt: skip
    assert (config.policy.images, config.policy.placement, dict(config.policy.hooks)) == ((), (), {})
    assert config.policy.webhooks.allow_hosts == ()


def test_the_worked_example_parses(tmp_path: Path) -> None:
    config, _ = setup(tmp_path, EXAMPLE)
    p = config.policy
    assert p.images == ("registry.example.internal/ffswarm/runner@sha256:0123",)
    assert p.placement == ("node.labels.ffswarm.gpu==true",)
    assert p.limits == Limits(2, 8, 8 * 1024**3, 3, 3600, 1000, 500, 64 * 1024, 2073600, 90000)
    assert dict(p.hooks) == {"notify-crm": Hook(("/usr/local/bin/notify-crm", "--job"), 65534, 65534, 60)}
    assert p.webhooks.allow_hosts == ("hooks.example.internal",) and p.webhooks.allow_private is False
    assert str(p.webhooks.secret_file) == "/run/secrets/ffswarm-webhook"
    assert p.configured and p.describe()[0] == "policy: from the config"


@pytest.mark.parametrize(
    ("policy", "message"),
    [
        ("imagez: []", "policy.imagez: unknown key (did you mean 'images'?)"),
        ("placement: ['node.role = = manager']", "policy.placement[0]: must be a constraint like"),
        ("limits: {gpus: -1}", "policy.limits.gpus: must be an integer ≥ 0, got -1"),
        ("limits: {memori: 1g}", "policy.limits.memori: unknown key (did you mean 'memory'?)"),
        ("hooks: {x: {command: [/bin/true], user: '0:0'}}", "policy.hooks.x.user: hooks never run as root"),
        ("hooks: {x: {command: [/bin/true], user: '1000:0'}}", "policy.hooks.x.user: hooks never run as root"),
        ("hooks: {x: {command: [/bin/true], user: nobody}}", "policy.hooks.x.user: must be a numeric UID:GID"),
        ("hooks: {x: {command: 'sh -c x', user: '1:1'}}", "policy.hooks.x.command: must be a list"),
        ("hooks: {x: {command: [bin/true], user: '1:1'}}", "policy.hooks.x.command: must start with an absolute"),
        ("webhooks: {secret_file: rel}", "policy.webhooks.secret_file: must be an absolute path"),
    ],
)
def test_a_bad_policy_is_a_config_error(tmp_path: Path, policy: str, message: str) -> None:
    with pytest.raises(ConfigError) as e:
        setup(tmp_path, policy)
    assert message in str(e.value)


@pytest.mark.parametrize("user", ["0:10001", "10001:0", "00:5", "root", "10001"])
def test_runner_user_is_two_integers_neither_zero(tmp_path: Path, user: str) -> None:
    with pytest.raises(ConfigError, match=r"runner_user must be a non-root UID:GID \(neither 0\)"):
        parse_config(tmp_path / "c.yaml", {"data_root": str(tmp_path), "runner_user": user})


def test_runner_user_is_read_as_integers(tmp_path: Path) -> None:
    config = parse_config(tmp_path / "c.yaml", {"data_root": str(tmp_path), "runner_user": "010001:010002"})
    assert config.runner_user == "10001:10002"


# -- images ------------------------------------------------------------------------------------------------
def test_without_a_policy_a_job_may_not_name_an_image(tmp_path: Path) -> None:
    config, _ = setup(tmp_path)
    err = refused(config, job_file(tmp_path, "image: attacker/image:latest\n"))
    assert (err.field, err.reason) == (
        "image",
        "'attacker/image:latest' is not allowed: the cluster's policy lists no images a job may name "
        "(leave image: out to use the cluster's image)",
    )


def test_a_job_may_name_a_listed_image_only(tmp_path: Path) -> None:
    config, _ = setup(tmp_path, EXAMPLE)
    err = refused(config, job_file(tmp_path, "image: attacker/image@sha256:0123\n"))
    assert str(err) == (
        f"{tmp_path}/job.yaml: image: 'attacker/image@sha256:0123' is not in the cluster's policy.images "
        "(registry.example.internal/ffswarm/runner@sha256:0123)"
    )
    ok = jobs_mod.prepare(config, [job_file(tmp_path, f"image: {config.policy.images[0]}\n")], new=False)
    assert ok[0].spec.image == config.policy.images[0]


# -- placement ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "constraint", ["node.role==manager", "node.id!=abc", "node.hostname==mgr1", "engine.labels.x==1"]
)
def test_a_job_may_add_node_labels_constraints_only(tmp_path: Path, constraint: str) -> None:
    config, _ = setup(tmp_path)
    err = refused(config, job_file(tmp_path, f"placement: [node.labels.ffswarm.gpu==true, '{constraint}']\n"))
    assert (err.field, err.reason) == (
        "placement[1]",
        f"{constraint!r} is not allowed: a job may add node.labels.* constraints only",
    )


def test_the_policys_placement_is_on_every_chunk(tmp_path: Path) -> None:
    config, _ = setup(tmp_path, "placement: [node.labels.zone==a, node.role==worker]")
    job = jobs_mod.prepare(config, [job_file(tmp_path, "placement: [node.labels.big==true]\n")], new=False)[0]
    settings = jobs_mod.runner_settings(config, job, "sha256:1")
    assert settings.constraints == ("node.labels.zone==a", "node.role==worker", "node.labels.big==true")


# -- limits ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("extra", "field", "asked", "limit"),
    [
        ("resources: {gpus: 2}", "resources.gpus", "2", "1"),
        ("resources: {memory: 32g}", "resources.memory", "32g", "16g"),
        ("max_concurrent: 65", "max_concurrent", "65", "64"),
        ("retries: 6", "retries", "6", "5"),
        ("timeout: 7h", "timeout", "25200s", "21600s"),
    ],
)
def test_asking_for_more_than_a_limit_is_refused(
    tmp_path: Path, extra: str, field: str, asked: str, limit: str
) -> None:
    config, _ = setup(tmp_path)
    err = refused(config, job_file(tmp_path, extra + "\n"))
    assert str(err) == (
        f"{tmp_path}/job.yaml: {field}: asks for {asked}, the limit is {limit} (the cluster's policy.limits)"
    )


def test_gpus_zero_still_has_a_concurrency_limit(tmp_path: Path) -> None:
    config, _ = setup(tmp_path)
    err = refused(config, job_file(tmp_path, "resources: {gpus: 0}\nmax_concurrent: 100000\n"))
    assert (err.field, err.reason) == (
        "max_concurrent",
        "asks for 100000, the limit is 64 (the cluster's policy.limits)",
    )


def test_at_the_limits_is_accepted(tmp_path: Path) -> None:
    config, _ = setup(tmp_path)
    extra = "resources: {gpus: 1, memory: 16g}\nmax_concurrent: 64\nretries: 5\ntimeout: 6h\n"
    assert len(jobs_mod.prepare(config, [job_file(tmp_path, extra)], new=False)) == 1


def test_job_file_size_is_checked_before_parsing(tmp_path: Path) -> None:
    config, _ = setup(tmp_path, "limits: {job_file: 1KiB}")
    f = job_file(tmp_path, "# " + "x" * 2000 + "\n: : not yaml [\n")  # parsing would fail differently
    err = refused(config, f)
    assert str(err) == (
        f"{f}: the file is {f.stat().st_size} bytes, the limit is 1024 (the cluster's policy.limits.job_file)"
    )
    assert err.field is None
    with pytest.raises(JobFileError, match="the limit is 1048576"):
        load_job_file(job_file(tmp_path, "#" * (1024**2)), Limits().job_file)


def test_targets_are_counted_at_plan_time(tmp_path: Path) -> None:
    config, _ = setup(tmp_path, "limits: {targets: 2}")
    err = refused(config, job_file(tmp_path))
    assert (err.field, err.reason) == ("targets", "asks for 3 files, the limit is 2 (the cluster's policy.limits)")


def test_segments_per_job_use_the_same_wording() -> None:
    with pytest.raises(JobFileError) as e:
        check_counts(Policy(limits=Limits(segments=10)), "jobs/j.yaml", 2, 11)
    assert str(e.value) == (
        "jobs/j.yaml: segment_seconds: asks for 11 video segments, the limit is 10 (the cluster's policy.limits)"
    )


def _video(frames: int = 300, width: int = 1920, height: int = 1080) -> VideoInfo:
    one = Fraction(1, 30)
    return VideoInfo(frames, Fraction(30), False, frames / 30, one, width, height, 0, Fraction(1), "h264", ())


@pytest.mark.parametrize(
    ("info", "seconds", "field", "reason"),
    [
        (
            _video(width=7680, height=4320),
            30.0,
            "targets",
            "v.mp4 asks for 33177600 pixels a frame, the limit is 8847360",
        ),
        (_video(frames=1_000_001), 30.0, "targets", "v.mp4 asks for 1000001 frames, the limit is 1000000"),
        (_video(frames=300_000), 0.001, "segment_seconds", "v.mp4 asks for 300000 segments, the limit is 20000"),
    ],
)
def test_a_video_over_the_limits_is_refused_before_it_is_cut(
    info: VideoInfo, seconds: float, field: str, reason: str
) -> None:
    with pytest.raises(FieldError) as e:
        check_limits(info, "v.mp4", job_spec(segment_seconds=seconds), Limits())
    assert (e.value.field, e.value.reason) == (field, reason + " (the cluster's policy.limits)")
    check_limits(_video(), "v.mp4", job_spec(), Limits())  # a 1080p 10 s video is fine


# -- hooks and webhooks at submit ---------------------------------------------------------------------
def test_a_hook_the_policy_does_not_define_is_refused(tmp_path: Path) -> None:
    config, _ = setup(tmp_path)
    err = refused(config, job_file(tmp_path, "on_complete: {hook: notify-crm}\n"))
    assert (err.field, err.reason) == (
        "on_complete.hook",
        "'notify-crm' is not a hook in the cluster's policy (none: hooks are off)",
    )
    config, _ = setup(tmp_path / "2", EXAMPLE)
    with pytest.raises(JobFileError, match=r"'other' is not a hook in the cluster's policy \(notify-crm\)"):
        check_job(config.policy, job_spec(on_complete=_on_complete(hook="other")), "j.yaml")
    check_job(config.policy, job_spec(on_complete=_on_complete(hook="notify-crm")), "j.yaml")


def test_webhooks_are_off_without_allowed_hosts(tmp_path: Path) -> None:
    config, _ = setup(tmp_path)
    err = refused(config, job_file(tmp_path, "on_complete: {webhook: 'http://169.254.169.254/latest'}\n"))
    assert (err.field, err.reason) == ("on_complete.webhook", "webhooks are off: the cluster's policy allows no hosts")


def test_a_webhook_host_must_be_allowed(tmp_path: Path) -> None:
    policy = parse_policy(yaml.safe_load(EXAMPLE))
    with pytest.raises(JobFileError) as e:
        check_job(policy, job_spec(on_complete=_on_complete(webhook="https://evil.example/x")), "j.yaml")
    assert str(e.value) == (
        "j.yaml: on_complete.webhook: host 'evil.example' is not in the cluster's policy.webhooks.allow_hosts "
        "(hooks.example.internal)"
    )
    check_job(policy, job_spec(on_complete=_on_complete(webhook="https://HOOKS.example.internal/done")), "j.yaml")


def _on_complete(**fields: Any) -> Any:
    from controller.job.spec import OnComplete

    return OnComplete(**fields)


def test_doctor_reports_the_policy_in_force(tmp_path: Path) -> None:
    from controller.doctor import check_policy

    config, _ = setup(tmp_path)
    assert check_policy(config).line() == (
        "[ok] policy: none in the config: safe defaults\n"
        "       images a job may name: none (jobs use the config image)\n"
        "       placement on every chunk: none; jobs may add node.labels.* only\n"
        "       limits: gpus 1, max_concurrent 64, memory 16g, retries 5, timeout 21600s, targets 200000, "
        "segments 20000, job_file 1m, video_pixels 8847360, video_frames 1000000, cpus 2 per runner\n"
        "       hooks: off\n"
        "       webhooks: off"
    )
    config, _ = setup(tmp_path / "2", EXAMPLE)
    lines = check_policy(config).line().split("\n")
    assert lines[0] == "[ok] policy: from the config"
    assert lines[-2:] == ["       hooks: notify-crm", "       webhooks: to hooks.example.internal"]


def test_overwrite_true_is_refused_at_admission_unless_the_policy_allows_it(tmp_path: Path) -> None:
    config, _ = setup(tmp_path)
    err = refused(config, job_file(tmp_path, "overwrite: true\n"))
    assert err.field == "overwrite" and "policy.allow_overwrite" in err.reason
    assert str(err).startswith(f"{tmp_path / 'job.yaml'}: overwrite: true is not allowed")
    allowed = parse_policy({"allow_overwrite": True})
    assert allowed.allow_overwrite and not parse_policy({}).allow_overwrite
    check_job(allowed, job_spec(overwrite=True), "j.yaml")
    check_job(parse_policy({}), job_spec(overwrite=False), "j.yaml")  # asking for the default is fine
    with pytest.raises(ConfigError, match=r"policy\.allow_overwrite"):
        setup(tmp_path / "again", "allow_overwrite: maybe\n")
