"""Reasons a user reads name files as the job file does: relative to the data root, never the
container's ``/data/...`` nor the controller host's data root (issue 13, part 5). The runner's own
log lines may keep container paths."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from contract.paths import user_path, user_text
from contract.results import ItemResult, ItemStatus
from controller.config import Config, parse_config
from controller.errors import MissingInputError
from controller.job.paths import relative_text
from controller.job.plan import TargetRef, make_plan
from controller.run import usecase
from controller.run.chunks import ChunkRun
from controller.run.failures import ChunkState, last_words
from controller.run.metrics import Metrics
from controller.run.report import build_report
from controller.run.rundir import Control, RunDir
from controller.serve import daemon as serve
from controller.serve import jobs as serve_jobs


def test_user_path_is_relative_to_the_data_root() -> None:
    assert user_path("/data/hidden/in/fake.jpg") == "hidden/in/fake.jpg"
    assert user_path("/data") == "."
    assert user_path("/database/x.jpg") == "/database/x.jpg"  # not under /data: unchanged
    assert user_path("hidden/in/fake.jpg") == "hidden/in/fake.jpg"


def test_user_text_rewrites_container_and_host_paths_only() -> None:
    text = "FileNotFoundError: [Errno 2] No such file: '/data/hidden/a.jpg'; /data/b.jpg: bad"
    assert user_text(text) == "FileNotFoundError: [Errno 2] No such file: 'hidden/a.jpg'; b.jpg: bad"
    assert user_text("/srv/data/x.jpg and hidden/data/y.jpg") == "/srv/data/x.jpg and hidden/data/y.jpg"
    assert user_text("/srv/ffswarm/in/a.jpg: gone", "/srv/ffswarm") == "in/a.jpg: gone"
    assert user_text("/srv/ffswarm2/in/a.jpg", "/srv/ffswarm") == "/srv/ffswarm2/in/a.jpg"


def test_relative_text_knows_the_hosts_root_by_either_name(tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "link").symlink_to(real)
    text = f"{tmp_path}/link/in/a.jpg, {real}/in/b.jpg, /data/in/c.jpg"
    assert relative_text(text, tmp_path / "link") == "in/a.jpg, in/b.jpg, in/c.jpg"


def test_a_runners_last_words_name_files_relative_to_the_data_root() -> None:
    log = json.dumps({"event": "runner failed", "error": "source photo /data/faces/star.jpg: no face detected"})
    assert last_words(log) == "source photo faces/star.jpg: no face detected"
    assert last_words("Traceback …\nOSError: [Errno 5] '/data/runs/j/results/c0000.jsonl'") == (
        "OSError: [Errno 5] 'runs/j/results/c0000.jsonl'"
    )


def _job_with_results(root: Path) -> tuple[Any, RunDir]:
    """Three images in two chunks: one failed by the runner (a result line in an older runner's wording,
    with the container path), one ok, and one whose chunk failed with the runner's last words."""
    refs = [
        TargetRef("hidden/in/fake.jpg", "hidden/out/fake.png", "image"),
        TargetRef("hidden/in/ok.jpg", "hidden/out/ok.png", "image"),
        TargetRef("hidden/in/late.jpg", "hidden/out/late.png", "image"),
    ]
    plan = make_plan("j", refs, 2)
    rundir = RunDir(root, "j")
    rundir.create(b"", plan, {}, Control(2), "img")
    lines = [
        ItemResult("i000000", ItemStatus.ERROR, 1, "/data/hidden/in/fake.jpg", None, "/data/hidden/in/fake.jpg: bad"),
        ItemResult("i000001", ItemStatus.OK, 1, "/data/hidden/in/ok.jpg", "/data/hidden/out/ok.png", faces=1),
    ]
    (rundir.path / "results" / "c0000.jsonl").write_text("".join(r.to_line() for r in lines))
    return plan, rundir


def test_the_report_names_inputs_outputs_and_reasons_relative_to_the_data_root(tmp_path: Path) -> None:
    plan, rundir = _job_with_results(tmp_path)
    words = last_words('{"error": "model pack /data/models/x: bad"}')
    failed = ChunkRun("c0001", state=ChunkState.FAILED, reason=words)
    report = build_report(plan, rundir, {"c0001": failed}, "img", 0.0).to_dict()
    assert report["failures"] == [
        {"item": "i000000", "input": "hidden/in/fake.jpg", "reason": "hidden/in/fake.jpg: bad", "chunk": "c0000"},
        {
            "item": "i000002",
            "input": "hidden/in/late.jpg",
            "reason": "chunk c0001 failed: model pack models/x: bad",
            "chunk": "c0001",
        },
    ]
    assert report["items"]["i000001"]["input"] == "hidden/in/ok.jpg"
    assert report["items"]["i000001"]["output"] == "hidden/out/ok.png"
    assert "/data/" not in json.dumps(report) and str(tmp_path) not in json.dumps(report)


def _config(tmp_path: Path) -> Config:
    root = tmp_path / "srv"
    (root / "inbox" / "running").mkdir(parents=True)
    return parse_config(tmp_path / "ffswarm.yaml", {"data_root": str(root)})


def test_a_serve_reason_file_names_paths_relative_to_the_data_root(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = _config(tmp_path)
    root = config.data_root
    claimed = root / "inbox" / "running" / "a.yaml"
    plan, rundir = _job_with_results(root)
    report = build_report(plan, rundir, {}, "img", 0.0)

    class Backend:
        def __init__(self, host: str | None) -> None: ...

        def check_manager(self) -> None: ...

        def resolve_image(self, ref: str) -> str:
            return ref

    job = SimpleNamespace(job_id="j-new", spec=SimpleNamespace(image="img", resources=SimpleNamespace(gpus=0)))
    monkeypatch.setattr(serve_jobs, "DockerSwarm", Backend)
    monkeypatch.setattr(usecase, "one_job", lambda config, path, *_, **__: job)
    monkeypatch.setattr(usecase, "run", lambda *args, **kwargs: report)
    outcome = serve.run_job_file(config, claimed, Metrics())
    assert not outcome.ok and outcome.reason is not None
    assert outcome.reason.splitlines() == [
        "job j: 1 ok, 0 without a face, 2 failed of 3 items; report: runs/j/report.json",
        "failed: hidden/in/fake.jpg: hidden/in/fake.jpg: bad",
        "failed: hidden/in/late.jpg: no result recorded by chunk c0001",
    ]

    def refuse(config: Config, path: Path, *_: object, **__: object) -> Any:
        raise MissingInputError(f"{path}: source: {root}/faces/star.jpg: source photo /data/faces/star.jpg: gone")

    monkeypatch.setattr(usecase, "one_job", refuse)
    outcome = serve.run_job_file(config, claimed, Metrics())
    assert outcome.reason == (
        "MissingInputError (exit 66): inbox/running/a.yaml: source: faces/star.jpg: source photo faces/star.jpg: gone"
    )
