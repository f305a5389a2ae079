"""Pairs in the runner (issue 18): a version 2 manifest's items each swap in their own person.

In-process, with the real identity subcommand, real insightface and onnxruntime on the stand-in
pack: each pair's output is compared with the output of a version 1 (one source) manifest of the
same source and target, and a person whose photo has no face fails only its own items.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from contract.identity import IdentityRequest, IdentityResult
from contract.identity_table import Identity
from contract.manifest import SCHEMA_IDENTITIES, Item, Manifest
from contract.results import ItemStatus
from runner_image.__main__ import main
from tests.unit.test_runner_chunk import JOB, RUN, by_input, pixels, results, run

PEOPLE = {
    "s000000": ("/data/in/face_01.jpg",),
    "s000001": ("/data/in/face_02.jpg",),
    "s000002": ("/data/in/no_face.jpg",),
}
# (target, person): two targets with different people, one target twice, one with the faceless person
PAIRS = [("astronaut.jpg", "s000000"), ("face_03.jpg", "s000001"), ("t1.jpg", "s000001"), ("face_00.jpg", "s000002")]


def pairs_manifest(root: Path, *, identity: str | None = None, chunk: str = "c0001") -> str:
    items = tuple(
        Item(f"i{n:06d}", f"/data/in/{t}", f"/data/out/pairs/{Path(t).stem}.png", identity=p)
        for n, (t, p) in enumerate(PAIRS)
    )
    used = {p for _, p in PAIRS}
    manifest = Manifest(
        job=JOB,
        chunk=chunk,
        run_dir=RUN,
        pack_dir="/data/models/default",
        source=(),
        items=items,
        providers=("cpu",),
        schema=SCHEMA_IDENTITIES,
        identities={k: Identity(v) for k, v in PEOPLE.items() if k in used},
        identity=identity,
    )
    (root / "runs" / JOB / "chunks" / f"{chunk}.json").write_text(manifest.to_json())
    return f"{RUN}/chunks/{chunk}.json"


def single(root: Path, source: str, target: str, chunk: str) -> np.ndarray:
    """The output of a version 1 manifest: ``source`` swapped into ``target``."""
    item = Item("i000000", f"/data/in/{target}", f"/data/out/{chunk}/{Path(target).stem}.png")
    manifest = Manifest(
        job=JOB,
        chunk=chunk,
        run_dir=RUN,
        pack_dir="/data/models/default",
        source=(source,),
        items=(item,),
        providers=("cpu",),
    )
    (root / "runs" / JOB / "chunks" / f"{chunk}.json").write_text(manifest.to_json())
    assert run(root, f"{RUN}/chunks/{chunk}.json") == 0
    return pixels(root / "out" / chunk / f"{Path(target).stem}.png")


def answer_people(root: Path) -> IdentityResult:
    """The identity step (the real subcommand) on a version 2 request: one answer per person."""
    req = IdentityRequest(
        job=JOB,
        pack_dir="/data/models/default",
        sources=(),
        output=f"{RUN}/identity.json",
        providers=("cpu",),
        schema=SCHEMA_IDENTITIES,
        identities={k: Identity(v) for k, v in PEOPLE.items()},
    )
    (root / "runs" / JOB / "identity-request.json").write_text(req.to_json())
    code = main(["identity", "--request", f"{RUN}/identity-request.json", "--data-root", str(root)], env={})
    assert code == 0  # a faceless person fails its pairs, not the job
    return IdentityResult.from_json((root / "runs" / JOB / "identity.json").read_text())


def check_pairs(root: Path) -> None:
    lines = by_input(results(root))
    assert lines["face_00.jpg"].status is ItemStatus.ERROR
    assert lines["face_00.jpg"].reason == "in/face_00.jpg: source photo in/no_face.jpg: no face detected"
    assert not (root / "out/pairs/face_00.png").exists()
    for n, (target, person) in enumerate(PAIRS[:3]):
        assert lines[target].status is ItemStatus.OK, lines[target]
        alone = single(root, PEOPLE[person][0], target, f"c080{n}")
        paired = pixels(root / "out/pairs" / f"{Path(target).stem}.png")
        assert alone.shape == paired.shape
        assert np.abs(alone - paired).max() <= 2, target  # the same person swapped in (batching rounds)
    other = single(root, PEOPLE["s000000"][0], "face_03.jpg", "c0900")
    assert np.abs(other - pixels(root / "out/pairs/face_03.png")).max() > 40  # …and not another one


def test_each_pair_swaps_its_own_person_and_a_faceless_source_fails_only_its_pairs(data: Path) -> None:
    answer = answer_people(data)
    assert answer.answered and answer.error is None
    assert answer.identities["s000002"].error == "source photo in/no_face.jpg: no face detected"
    assert answer.identities["s000000"].embedding and answer.identities["s000001"].embedding
    manifest = pairs_manifest(data, identity=f"{RUN}/identity.json")
    assert json.loads((data / manifest.replace("/data/", "", 1)).read_text())["schema"] == 2
    assert run(data, manifest) == 3  # one item failed on its own
    check_pairs(data)


def test_a_version_2_manifest_without_the_identity_step_embeds_its_people_itself(data: Path) -> None:
    assert run(data, pairs_manifest(data)) == 3
    check_pairs(data)
