"""Job-file ``pairs`` / ``pairs_file`` (issue 18): parsing, validation, resolving on a real data
root (containment, output fence, tenant areas), planning and the version 2 manifests."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from contract.manifest import FaceSelection, Manifest, NoFacePolicy
from controller.errors import JobFileError, MissingInputError
from controller.job.files import JobFileErrors, parse_job_text
from controller.job.plan import ManifestSettings, Plan, TargetRef, chunk_manifests, make_plan
from controller.job.resolve import ResolvedJob, resolve_job


def job(body: str) -> str:
    return "name: p\n" + body


def errors_of(text: str) -> list[str]:
    with pytest.raises(JobFileError) as e:
        parse_job_text(text, "p.yaml")
    found = e.value.errors if isinstance(e.value, JobFileErrors) else (e.value,)
    assert all(isinstance(x, JobFileError) and x.exit_code == 65 for x in found)
    return [str(x) for x in found]


# -- parsing ---------------------------------------------------------------------------------------
def test_pairs_parse_with_a_list_source_and_per_pair_outputs() -> None:
    spec = parse_job_text(
        job("""
output: out/{stem}.png
pairs:
  - {source: u/1.jpg, target: s/a.jpg}
  - {source: [u/2.jpg, u/2b.jpg], target: s/b.mp4, output: "clips/{stem}.mp4"}
"""),
        "p.yaml",
    )
    assert spec.uses_pairs and spec.source == () and spec.targets == ()
    assert [(p.source, p.target, p.output) for p in spec.pairs] == [
        (("u/1.jpg",), "s/a.jpg", None),
        (("u/2.jpg", "u/2b.jpg"), "s/b.mp4", "clips/{stem}.mp4"),
    ]


def test_every_bad_pair_is_reported_at_once_naming_the_pair() -> None:
    found = errors_of(
        job("""
pairs:
  - {source: u/1.jpg, target: s/a.jpg}
  - {source: u/1.jpg, target: "s/*.jpg", output: o/x.jpg}
  - {source: u/1.txt, target: s/a.jpg, output: o/y.jpg}
  - {target: s/a.jpg, output: o/z.jpg}
  - {source: u/1.jpg, target: ../etc/a.jpg, output: o/w.jpg}
retries: -1
""")
    )
    assert "p.yaml: pairs[0].output: is required: the job has no output template" in found
    assert any(x.startswith("p.yaml: pairs[1].target: 's/*.jpg' is a glob") for x in found)
    assert any(x.startswith("p.yaml: pairs[2].source: 'u/1.txt' is not an image") for x in found)
    assert "p.yaml: pairs[3].source: required key is missing" in found
    assert any(x.startswith("p.yaml: pairs[4].target:") and "leads out of the data root" in x for x in found)
    assert any(x.startswith("p.yaml: retries:") for x in found)


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (
            "source: a.jpg\noutput: o/{name}\npairs: [{source: b.jpg, target: c.jpg}]\n",
            "source: cannot be given with pairs",
        ),
        ("targets: ['*.jpg']\noutput: o/{name}\npairs_file: p.csv\n", "targets: cannot be given with pairs_file"),
        (
            "output: o/{name}\npairs_file: p.csv\npairs: [{source: b.jpg, target: c.jpg}]\n",
            "pairs_file: cannot be given with pairs",
        ),
        ("output: o/{name}\npairs_file: p.txt\n", "pairs_file: 'p.txt' must be a .csv or .jsonl file"),
        ("output: o/{name}\npairs: []\n", "pairs: must be a non-empty list of pairs"),
    ],
)
def test_pairs_instead_of_source_and_targets(body: str, expected: str) -> None:
    assert any(expected in x for x in errors_of(job(body)))


def test_a_job_without_pairs_still_needs_source_targets_and_output() -> None:
    found = errors_of(job("retries: 1\n"))
    assert [x.split(" (line")[0] for x in found[-3:]] == [
        "p.yaml: source: required key is missing",
        "p.yaml: targets: required key is missing",
        "p.yaml: output: required key is missing",
    ]


# -- resolving on a data root ----------------------------------------------------------------------
def _root(tmp_path: Path) -> Path:
    root = tmp_path / "data"
    for rel in ("u/1.jpg", "u/2.jpg", "u/2b.jpg", "s/a.jpg", "s/b.jpg", "s/c.jpg", "tenants/acme/u/me.jpg"):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(b"jpeg " + rel.encode())
    (root / "tenants/acme/s").mkdir(parents=True)
    (root / "tenants/acme/s/t.jpg").write_bytes(b"jpeg t")
    return root


def resolve(tmp_path: Path, body: str, **kw: object) -> ResolvedJob:
    root = tmp_path / "data" if (tmp_path / "data").exists() else _root(tmp_path)
    return resolve_job(parse_job_text(job(body), "p.yaml"), root, "p.yaml", **kw)  # type: ignore[arg-type]


def test_each_distinct_source_is_one_person_and_each_pair_names_its_output(tmp_path: Path) -> None:
    r = resolve(
        tmp_path,
        """
output: out/{index}-{stem}.jpg
pairs:
  - {source: u/1.jpg, target: s/a.jpg}
  - {source: [u/2.jpg, u/2b.jpg], target: s/b.jpg, output: special/b.jpg}
  - {source: u/1.jpg, target: s/c.jpg}
  - {source: u/2.jpg, target: s/a.jpg}
""",
    )
    rel = [p.relative_to(tmp_path / "data").as_posix() for p in r.sources]
    assert rel == ["u/1.jpg", "u/2.jpg", "u/2b.jpg"]
    assert [[p.name for p in person] for person in r.identities] == [["1.jpg"], ["2.jpg", "2b.jpg"], ["2.jpg"]]
    assert [(t.rel, t.output_rel, t.identity) for t in r.targets] == [
        ("s/a.jpg", "out/0-a.jpg", 0),
        ("s/b.jpg", "special/b.jpg", 1),
        ("s/c.jpg", "out/2-c.jpg", 0),
        ("s/a.jpg", "out/3-a.jpg", 2),  # the same target with another person is another item
    ]


def test_missing_inputs_of_every_pair_are_reported_at_once(tmp_path: Path) -> None:
    with pytest.raises(JobFileErrors) as e:  # exit 66: every one a missing input
        resolve(
            tmp_path,
            """
output: out/{index}.jpg
pairs:
  - {source: u/nobody.jpg, target: s/a.jpg}
  - {source: u/1.jpg, target: s/gone.jpg}
""",
        )
    text = str(e.value)
    assert (
        "pairs[0].source: 'u/nobody.jpg' does not exist" in text
        and "pairs[1].target: 's/gone.jpg' does not exist" in text
    )
    assert e.value.exit_code == 66


@pytest.mark.parametrize(
    ("pairs", "expected"),
    [
        ("[{source: u/1.jpg, target: s/a.jpg, output: runs/x/a.jpg}]", "under runs/"),
        ("[{source: u/1.jpg, target: s/a.jpg, output: u/1.jpg}]", "an input of this job"),
        ("[{source: u/1.jpg, target: s/a.jpg, output: o/x.jpg}, {source: u/2.jpg, target: s/b.jpg, output: o/x.jpg}]",
         "would both write o/x.jpg"),
    ],
)  # fmt: skip
def test_the_output_fence_applies_to_every_pair(tmp_path: Path, pairs: str, expected: str) -> None:
    with pytest.raises(JobFileError) as e:
        resolve(tmp_path, f"pairs: {pairs}\n")
    assert e.value.field == "output" and expected in e.value.reason


def test_a_tenants_pairs_stay_in_its_area(tmp_path: Path) -> None:
    ok = "[{source: tenants/acme/u/me.jpg, target: tenants/acme/s/t.jpg, output: tenants/acme/out/t.jpg}]"
    assert len(resolve(tmp_path, f"pairs: {ok}\n", tenant="acme").targets) == 1
    other = "[{source: u/1.jpg, target: tenants/acme/s/t.jpg, output: tenants/acme/out/t.jpg}]"
    with pytest.raises(JobFileError) as e:
        resolve(tmp_path, f"pairs: {other}\n", tenant="acme")
    assert e.value.field == "pairs[0].source" and "outside the tenant's area tenants/acme/" in e.value.reason


# -- pairs_file ------------------------------------------------------------------------------------
def test_a_csv_pairs_file_with_a_header_and_a_jsonl_one(tmp_path: Path) -> None:
    root = _root(tmp_path)
    (root / "lists").mkdir()
    (root / "lists/p.csv").write_text("source,target,output\nu/1.jpg,s/a.jpg,\nu/2.jpg, s/b.jpg ,o/b.jpg\n\n")
    r = resolve(tmp_path, "output: out/{stem}.jpg\npairs_file: lists/p.csv\n")
    assert [(t.rel, t.output_rel, t.identity) for t in r.targets] == [
        ("s/a.jpg", "out/a.jpg", 0),
        ("s/b.jpg", "o/b.jpg", 1),
    ]
    rows = [
        {"source": ["u/2.jpg", "u/2b.jpg"], "target": "s/c.jpg", "output": "o/c.jpg"},
        {"source": "u/1.jpg", "target": "s/a.jpg"},
    ]
    (root / "lists/p.jsonl").write_text("\n".join(json.dumps(x) for x in rows) + "\n")
    r = resolve(tmp_path, "output: out/{stem}.jpg\npairs_file: lists/p.jsonl\n")
    assert [len(p) for p in r.identities] == [2, 1] and [t.output_rel for t in r.targets] == ["o/c.jpg", "out/a.jpg"]


def test_every_bad_row_of_a_pairs_file_is_named_by_its_line_never_its_content(tmp_path: Path) -> None:
    root = _root(tmp_path)
    (root / "p.jsonl").write_text(
        '{"source": "u/1.jpg", "target": "s/a.jpg"}\n'
        "SECRET-NOT-JSON\n"
        '{"source": "u/1.jpg", "target": "s/*.jpg"}\n'
        '{"source": "u/1.jpg", "target": "s/a.jpg", "colour": "red"}\n'
        "[1, 2]\n"
    )
    with pytest.raises(JobFileErrors) as e:
        resolve(tmp_path, "output: out/{index}.jpg\npairs_file: p.jsonl\n")
    lines = [str(x) for x in e.value.errors]
    assert lines == [
        "p.yaml: pairs_file: p.jsonl line 2: not a JSON object",
        "p.yaml: pairs_file: p.jsonl line 3: target: 's/*.jpg' is a glob; a pair names one file"
        " (use targets: for globs)",
        "p.yaml: pairs_file: p.jsonl line 4: colour: unknown key",
        "p.yaml: pairs_file: p.jsonl line 5: must be a JSON object, got a list",
    ]
    (root / "p.csv").write_text("u/1.jpg\nu/1.jpg,s/nope.jpg\n")
    with pytest.raises(JobFileError) as one:
        resolve(tmp_path, "output: out/{index}.jpg\npairs_file: p.csv\n")
    assert str(one.value) == "p.yaml: pairs_file: p.csv line 1: 1 columns; a row is source,target[,output]"


def test_a_pairs_file_is_bounded_and_never_read_through_a_link(tmp_path: Path) -> None:
    root = _root(tmp_path)
    (root / "p.csv").write_text("".join(f"u/1.jpg,s/a.jpg,o/{n}.jpg\n" for n in range(5)))
    with pytest.raises(JobFileError) as e:
        resolve(tmp_path, "pairs_file: p.csv\n", max_pairs=4)
    assert "p.csv holds 5 pairs, over the limit of 4 (the cluster's policy.limits.targets)" in str(e.value)
    assert len(resolve(tmp_path, "pairs_file: p.csv\n", max_pairs=5).targets) == 5
    (tmp_path / "elsewhere.csv").write_text("u/1.jpg,s/a.jpg,o/x.jpg\n")
    (root / "link.csv").symlink_to(tmp_path / "elsewhere.csv")
    (root / "inner.csv").symlink_to(root / "p.csv")
    os.mkfifo(root / "fifo.csv")
    for name in ("link.csv", "inner.csv", "fifo.csv"):
        with pytest.raises(JobFileError) as e:
            resolve(tmp_path, f"pairs_file: {name}\n")
        assert e.value.field == "pairs_file" and str(tmp_path) not in str(e.value), name
    with pytest.raises(MissingInputError):
        resolve(tmp_path, "output: o/{index}.jpg\npairs_file: none.csv\n")


# -- planning and manifests -------------------------------------------------------------------------
def test_manifests_of_a_pairs_job_are_version_2_with_only_their_chunks_people() -> None:
    refs = [TargetRef(f"s/{n}.jpg", f"o/{n}.jpg", "image", identity=f"s00000{n % 3}") for n in range(6)]
    plan = make_plan("p", refs, 2)
    assert Plan.from_json(plan.to_json()) == plan and plan.items[4].identity == "s000001"
    settings = ManifestSettings(
        pack="default",
        sources=(),
        processors=("face_swapper",),
        providers=("cpu",),
        faces=FaceSelection.MANY,
        no_face=NoFacePolicy.COPY,
        identity_timeout=60.0,
        identities={"s000000": ("u/0.jpg",), "s000001": ("u/1.jpg", "u/1b.jpg"), "s000002": ("u/2.jpg",)},
    )
    manifests = chunk_manifests(plan, settings)
    first = manifests["c0000"]
    assert first.schema == 2 and first.source == () and first.identity == "/data/runs/p/identity/identity.json"
    assert {k: v.sources for k, v in first.identities.items()} == {
        "s000000": ("/data/u/0.jpg",),
        "s000001": ("/data/u/1.jpg", "/data/u/1b.jpg"),
    }
    assert [i.identity for i in first.items] == ["s000000", "s000001"]
    for m in manifests.values():
        assert Manifest.from_json(m.to_json()) == m
    with pytest.raises(ValueError, match="identity is not an identity id"):
        Plan.from_json(plan.to_json().replace('"s000001"', '"../x"', 1))


# -- prepare and start_run: the run folder of a pairs job --------------------------------------------
def test_a_pairs_job_asks_the_identity_step_for_each_person_and_writes_version_2_manifests(tmp_path: Path) -> None:
    from contract.identity import IdentityRequest
    from controller.run import jobs as jobs_mod
    from tests.unit.test_policy import setup

    config, root = setup(tmp_path, "limits: {targets: 3}")
    (root / "faces" / "other.jpg").write_bytes(b"x")
    f = tmp_path / "pairs.yaml"
    f.write_text(
        "name: j\noutput: out/{index}{ext}\nchunk_size: 2\npairs:\n"
        "  - {source: faces/star.jpg, target: crowd/0.jpg}\n"
        "  - {source: faces/other.jpg, target: crowd/1.jpg}\n"
        "  - {source: faces/star.jpg, target: crowd/2.jpg}\n"
    )
    job = jobs_mod.prepare(config, [f], new=False)[0]
    assert [i.identity for i in job.plan.items] == ["s000000", "s000001", "s000000"]
    rundir = jobs_mod.start_run(config, job, "sha256:1")
    req = IdentityRequest.from_json(rundir.layout.identity_request.read_text())
    assert req.schema == 2 and req.sources == ()
    assert {k: v.sources for k, v in req.identities.items()} == {
        "s000000": ("/data/faces/star.jpg",),
        "s000001": ("/data/faces/other.jpg",),
    }
    second = Manifest.from_json(rundir.layout.manifest("c0001").read_text())
    assert second.schema == 2 and list(second.identities) == ["s000000"] and second.items[0].output == "/data/out/2.jpg"
    more = tmp_path / "more.yaml"
    more.write_text(
        f.read_text().replace("name: j", "name: k").replace("out/", "other/")
        + "  - {source: faces/star.jpg, target: crowd/0.jpg, output: x.jpg}\n"
    )
    with pytest.raises(JobFileError) as e:
        jobs_mod.prepare(config, [more], new=False)
    assert e.value.field == "targets" and "4 files" in e.value.reason  # the policy's targets maximum
