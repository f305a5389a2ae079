"""The job file's JSON Schema (`ffswarm schema job`) and the reader agree: every job file in the docs and
the tests' fixtures passes both, the invalid fixtures fail both, and docs/job-file.md's key table and
docs/job.schema.json are what the definition makes today."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from dataclasses import fields
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner
from jsonschema import Draft202012Validator

from contract.masks import Masks
from contract.photo import PhotoTuning
from contract.selector import Selector
from contract.swapper import SwapperTuning
from controller.cli.main import cli
from controller.errors import JobFileError
from controller.job.files import parse_job, parse_job_text
from controller.job.keys import Pack, about_of, packed, section
from controller.job.plan import ManifestSettings
from controller.job.schema import job_schema, key_table
from controller.job.spec import JobSpec
from controller.run.jobs import job_file_settings

ROOT = Path(__file__).resolve().parents[2]
JOBS = ROOT / "tests" / "fixtures" / "jobs"
_FENCE = re.compile(r"^```yaml\n(.*?)^```", re.MULTILINE | re.DOTALL)
_INPUTS = {"source", "targets", "pairs", "pairs_file"}


def _is_job(data: object) -> bool:
    """A YAML document is a job file when it is a mapping with a name and inputs (pack.yaml has a name
    but no inputs; the config's sections have neither)."""
    return isinstance(data, dict) and "name" in data and bool(_INPUTS & set(data))


def doc_jobs() -> list[tuple[str, str]]:
    """Every ```yaml block of docs/*.md and README.md that is a job file, as (where, text)."""
    found = []
    for md in sorted([*(ROOT / "docs").glob("*.md"), ROOT / "README.md"]):
        text = md.read_text(encoding="utf-8")
        for m in _FENCE.finditer(text):
            if _is_job(yaml.safe_load(m.group(1))):
                line = text[: m.start()].count("\n") + 1
                found.append((f"{md.relative_to(ROOT)}:{line}", m.group(1)))
    return found


def fixture_jobs() -> list[Path]:
    """Every job file under tests/ (outside an ``invalid`` folder)."""
    files = sorted(p for ext in ("*.yaml", "*.yml") for p in (ROOT / "tests").rglob(ext))
    return [p for p in files if "invalid" not in p.parts and _is_job(yaml.safe_load(p.read_text()))]


def check_jsonschema(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "check_jsonschema", *args], capture_output=True, text=True, timeout=120, check=False
    )


@pytest.fixture(scope="module")
def schema_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """What `ffswarm schema job` prints, saved as an editor would save it."""
    result = CliRunner().invoke(cli, ["schema", "job"])
    assert result.exit_code == 0, result.output
    path = tmp_path_factory.mktemp("schema") / "job.schema.json"
    path.write_text(result.output)
    return path


def test_the_printed_schema_is_valid_draft_2020_12(schema_file: Path) -> None:
    schema = json.loads(schema_file.read_text())
    Draft202012Validator.check_schema(schema)
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema" and schema["$id"]
    assert check_jsonschema("--check-metaschema", str(schema_file)).returncode == 0


def test_every_job_file_in_the_docs_and_the_tests_passes_the_schema_and_the_reader(
    schema_file: Path, tmp_path: Path
) -> None:
    docs = doc_jobs()
    files = fixture_jobs()
    assert len(docs) >= 3 and len(files) >= 5  # the reference block, Pairs, the README; the fixtures
    for i, (where, text) in enumerate(docs):
        parse_job_text(text, where)  # the reader accepts it: raises naming the block otherwise
        (tmp_path / f"doc-{i}.yaml").write_text(text)
    for f in files:
        parse_job_text(f.read_text(), str(f))
    paths = [str(p) for p in sorted(tmp_path.glob("doc-*.yaml"))] + [str(f) for f in files]
    result = check_jsonschema("--schemafile", str(schema_file), *paths)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_invalid_fixtures_are_refused_by_the_schema_and_the_reader(schema_file: Path) -> None:
    invalid = sorted((JOBS / "invalid").glob("*.yaml"))
    assert len(invalid) >= 5
    result = check_jsonschema("--schemafile", str(schema_file), *map(str, invalid))
    assert result.returncode == 1
    for f in invalid:
        assert f"{f.name}::" in result.stdout, f"the schema accepts {f.name}"
        with pytest.raises(JobFileError):
            parse_job_text(f.read_text(), f.name)


GOOD: dict[str, Any] = {"name": "h", "source": "a.jpg", "targets": ["in/*.jpg"], "output": "out/{stem}{ext}"}


@pytest.mark.parametrize(
    ("change", "where"),
    [
        ({"chunksize": 10}, "$"),
        ({"source": 3}, "$.source"),
        ({"targets": []}, "$.targets"),
        ({"processors": ["face_swapper", "face_swapper"]}, "$.processors"),
        ({"processors": ["deepfake"]}, "$.processors[0]"),
        ({"faces": "all"}, "$.faces"),
        ({"chunk_size": 0}, "$.chunk_size"),
        ({"chunk_size": "big"}, "$.chunk_size"),
        ({"timeout": "30 minutes"}, "$.timeout"),
        ({"timeout": True}, "$.timeout"),
        ({"resources": {"memory": "6 GB"}}, "$.resources.memory"),
        ({"resources": {"gpu_kind": "nvidia-gpu"}}, "$.resources.gpu_kind"),
        ({"resources": {"gpu": 1}}, "$.resources"),
        ({"retries": -1}, "$.retries"),
        ({"skip_audio": "no"}, "$.skip_audio"),
        ({"detector": {"size": 650}}, "$.detector.size"),
        ({"mask": {"types": ["oval"]}}, "$.mask.types[0]"),
        ({"selector": {"age": [10]}}, "$.selector.age"),
        ({"face_swapper": {"pixel_boost": 300}}, "$.face_swapper.pixel_boost"),
        ({"photo": {"quality": 0}}, "$.photo.quality"),
        ({"on_complete": {"webhook": "ftp://x"}}, "$.on_complete.webhook"),
        ({"licence": "gpl"}, "$.licence"),
        ({"models": "../up"}, "$.models"),
        ({"pairs": [{"source": "a.jpg"}]}, "$.pairs[0]"),
        ({"pairs": [{"source": "a.jpg", "target": "b.jpg", "out": "x"}]}, "$.pairs[0]"),
    ],
)
def test_a_value_the_reader_refuses_the_schema_refuses_too(change: dict[str, Any], where: str) -> None:
    data = {**GOOD, **change}
    if "pairs" in change:
        del data["source"], data["targets"]
    with pytest.raises(JobFileError):
        parse_job(data, "job.yaml")
    errors = list(Draft202012Validator(job_schema()).iter_errors(data))
    assert errors, f"the schema accepts {change}"
    assert where in {e.json_path for e in errors}, [(e.json_path, e.message) for e in errors]


def test_the_file_forms_of_durations_sizes_and_lists_are_the_schemas() -> None:
    """The schema names the file's keys and what the file may write, not the attributes' Python types."""
    data = {**GOOD, "source": "a.jpg", "timeout": "1h30m", "resources": {"memory": "512m"}, "chunk_size": "auto"}
    assert parse_job(data, "job.yaml").timeout == 5400
    assert not list(Draft202012Validator(job_schema()).iter_errors(data))
    props = job_schema()["properties"]
    assert set(props) == {f.name for f in fields(JobSpec)}
    assert props["timeout"]["default"] == "30m" and props["faces"]["enum"] == ["many", "one", "reference"]


def test_the_api_request_schema_lets_name_and_output_be_left_out() -> None:
    body = {"source": "a.jpg", "targets": ["in/*.jpg"]}
    assert not list(Draft202012Validator(job_schema(request=True)).iter_errors(body))
    assert list(Draft202012Validator(job_schema()).iter_errors(body))  # a job file names both
    assert list(Draft202012Validator(job_schema(request=True)).iter_errors({**body, "name": "x" * 32}))
    moved = job_schema(request=True, ref_template="#/components/schemas/{name}")
    assert moved["properties"]["video"]["$ref"] == "#/components/schemas/VideoSettings"
    Draft202012Validator.check_schema(job_schema(request=True))


def test_every_key_is_described_and_every_top_level_key_says_what_a_pack_does_with_it() -> None:
    for f in fields(JobSpec):
        assert about_of(f).doc and about_of(f).pack in set(Pack), f.name
        inner = section(f)
        for g in fields(inner) if inner is not None else ():
            assert about_of(g).doc, f"{f.name}.{g.name}"


def test_the_key_table_in_docs_is_the_definitions() -> None:
    text = (ROOT / "docs" / "job-file.md").read_text(encoding="utf-8")
    m = re.search(r"<!-- keys: begin[^\n]*-->\n(.*?)<!-- keys: end -->", text, re.DOTALL)
    assert m is not None, "docs/job-file.md has no generated key table"
    assert m.group(1) == key_table(), "docs/job-file.md#keys is stale: paste `ffswarm schema job --table` there"
    assert "--table" in CliRunner().invoke(cli, ["schema", "job", "--help"]).output


def test_the_schema_in_docs_is_the_printed_one(schema_file: Path) -> None:
    """docs/job.schema.json is what editors point at (`$schema=` a path or the file's URL)."""
    stale = "docs/job.schema.json is stale: write `ffswarm schema job > docs/job.schema.json`"
    assert (ROOT / "docs" / "job.schema.json").read_text() == schema_file.read_text(), stale


def test_the_reference_block_in_docs_lists_every_top_level_key() -> None:
    text = (ROOT / "docs" / "job-file.md").read_text(encoding="utf-8")
    block = _FENCE.search(text)
    assert block is not None
    written = {line.lstrip("# ").split(":")[0] for line in block.group(1).splitlines() if ":" in line}
    assert {f.name for f in fields(JobSpec)} <= written


def test_every_tuning_key_of_a_job_file_reaches_the_manifest_settings() -> None:
    """ManifestSettings are filled key by key from the definition (``manifest=``): a tuned job's values
    arrive as they were written, sections as the contract's value objects."""
    spec = parse_job_text((JOBS / "tuned.yaml").read_text(), "tuned.yaml")
    s = ManifestSettings(sources=("a.jpg",), **job_file_settings(spec))
    assert (s.pack, s.processors, s.providers) == (
        "pack_2.1",
        ("face_swapper", "face_enhancer", "frame_enhancer"),
        ("cpu",),
    )
    assert (s.faces, s.no_face, s.reference_distance, s.overwrite) == ("reference", "skip", 0.8, True)
    assert (s.detector_threshold, s.detector_size, s.mask_feather, s.mask_padding) == (0.35, 1024, 0.0, 0.5)
    assert (s.enhancer_model, s.enhancer_blend, s.enhancer_weight, s.frame_enhancer_blend) == (
        "codeformer",
        1.0,
        0.0,
        0.5,
    )
    assert s.masks == Masks(("box", "occlusion", "region"), ("skin", "mouth"))
    assert s.selector == Selector("left-right", "female", (18, 40))
    assert s.swapper == SwapperTuning("simswap_256", 512, 0.7) and s.photo == PhotoTuning(90, 0.5)
    reaching = {f.name for f in fields(JobSpec) if about_of(f).manifest or _section_reaches(f)}
    # what reaches a manifest is what the members of a pack agree on (packs take no reference jobs)
    assert reaching - {"reference_distance"} <= set(packed(JobSpec, Pack.SHARED))


def _section_reaches(f: Any) -> bool:
    inner = section(f)
    return inner is not None and any(about_of(g).manifest for g in fields(inner))


def test_the_job_bodies_in_the_api_docs_pass_the_request_schema() -> None:
    """Every `curl -d '{…}' …/v1/jobs` of docs/api.md is a body the API's request schema accepts."""
    text = (ROOT / "docs" / "api.md").read_text(encoding="utf-8")
    bodies = re.findall(r"-d '(\{[^']*\})'[\s\\]*\S*/v1/jobs(?=[\s'\"]|$)", text, re.MULTILINE)
    assert len(bodies) >= 2
    validator = Draft202012Validator(job_schema(request=True))
    for body in bodies:
        assert not list(validator.iter_errors(json.loads(body))), body
