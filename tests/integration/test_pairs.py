"""Pairs on the real single-node swarm (issue 18): one job swaps each target with its own source.

Five different sources over fifteen targets, plus a pair whose source photo has no face. Each pair's
output is compared with what a one-source job (`source`/`targets`, schema 1 manifests) makes of the
same source and target: the stand-in pack is deterministic, so they agree to within rounding. The
faceless pair fails alone, its result naming the photo; every other pair is committed.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import cv2
import numpy as np
import pytest

from contract.results import ItemStatus
from tests.fixtures import photos
from tests.integration.conftest import Workspace, chown_tree, results_of

pytestmark = pytest.mark.integration
PEOPLE = 5  # each with three targets

COMMON = """providers: [cpu]
resources: {gpus: 1, gpu_kind: GPU, memory: 2g}
placement: [node.labels.ffswarm.gpu==true]
retries: 0
timeout: 10m
"""


def pixels(path: Path) -> np.ndarray:
    image = cv2.imread(str(path), cv2.IMREAD_COLOR)
    assert image is not None, path
    return np.asarray(image, dtype=np.int16)


def test_each_pair_swaps_its_own_source_and_a_faceless_source_fails_alone(workspace: Workspace) -> None:
    ws = workspace
    sources = photos.face_photos(ws.dir / "src", PEOPLE)  # face_00 … face_04: five people
    blank = photos.no_face_photo(ws.dir / "src")
    made = photos.face_photos(ws.dir / "all", PEOPLE * 4)[PEOPLE:]  # face_05 … face_19: fifteen targets
    groups: list[list[Path]] = [[] for _ in range(PEOPLE)]
    for n, path in enumerate(made):  # targets of source k in t/k/, for the one-source jobs' globs
        dest = ws.dir / "t" / str(n % PEOPLE) / path.name
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(path, dest)
        groups[n % PEOPLE].append(dest)
    shutil.rmtree(ws.dir / "all")
    chown_tree(ws.dir, ws.config.runner_uid_gid())

    pairs = [(sources[k], t) for k in range(PEOPLE) for t in groups[k]]
    lines = [f"  - {{source: {ws.rel(s)}, target: {ws.rel(t)}}}" for s, t in pairs]
    lines.append(
        f"  - {{source: {ws.rel(blank)}, target: {ws.rel(groups[0][0])}, output: {ws.rel(ws.dir)}/out/blank.jpg}}"
    )
    out = ws.rel(ws.dir / "out")
    files = [
        ws.write_job(
            f"name: {ws.job}\noutput: {out}/pairs/{{index}}-{{stem}}.png\n{COMMON}pairs:\n" + "\n".join(lines) + "\n"
        )
    ]
    for k in range(PEOPLE):
        f = ws.dir / "jobs" / f"one-{k}.yaml"
        f.write_text(
            f"name: {ws.job}-{k}\nsource: {ws.rel(sources[k])}\ntargets: [{ws.rel(ws.dir / 't' / str(k))}/*.jpg]\n"
            f"output: {out}/one/{{stem}}.png\n{COMMON}"
        )
        files.append(f)
    try:
        proc = ws.ffswarm("submit", *map(str, files))
    finally:
        for k in range(PEOPLE):
            shutil.rmtree(ws.root / "runs" / f"{ws.job}-{k}", ignore_errors=True)
    assert proc.returncode == 1, proc.stderr[-3000:]  # the faceless pair failed: exit 1, the rest ran

    manifests = [json.loads(f.read_text()) for f in (ws.root / "runs" / ws.job / "chunks").glob("*.json")]
    assert {m["schema"] for m in manifests} == {2}
    assert len({k for m in manifests for k in m["identities"]}) == PEOPLE + 1  # and the faceless one

    by_input: dict[str, list] = {}  # type: ignore[type-arg]
    for r in results_of(ws):
        by_input.setdefault(r.input.removeprefix("/data/"), []).append(r)
    for index, (source, target) in enumerate(pairs):
        # PNG outputs: compared without a lossy codec between them (JPEG's quantisation turns a one-level
        # difference of rounding in the swap into three)
        mine = pixels(ws.dir / "out" / "pairs" / f"{index}-{target.stem}.png")
        alone = pixels(ws.dir / "out" / "one" / f"{target.stem}.png")  # the one-source job of `source`
        assert mine.shape == alone.shape
        assert np.abs(mine - alone).max() <= 2, (source.name, target.name)  # the same person swapped in
        assert np.abs(mine - pixels(target)).max() > 20  # …and a swap happened at all

    failed = [r for rs in by_input.values() for r in rs if r.status is ItemStatus.ERROR]
    assert len(failed) == 1 and failed[0].input == f"/data/{ws.rel(groups[0][0])}"
    assert failed[0].reason == f"{ws.rel(groups[0][0])}: source photo {ws.rel(blank)}: no face detected"
    assert not (ws.dir / "out" / "blank.jpg").exists()
    assert len(list((ws.dir / "out" / "pairs").iterdir())) == PEOPLE * 3
