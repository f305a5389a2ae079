"""The contract's new shapes (issue 16): the manifest's ``overwrite`` and segments' ``demuxer``,
results per attempt, and a result line's commit record (size, sha256) and note."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from contract.errors import ManifestError
from contract.layout import RESERVED, DataRootLayout, RunLayout
from contract.manifest import Item, Manifest, Segment
from contract.results import ItemResult, ItemStatus
from tests.builders import manifest


def test_overwrite_defaults_to_false_round_trips_and_is_left_out_at_its_default() -> None:
    assert manifest().overwrite is False and "overwrite" not in json.loads(manifest().to_json())
    text = manifest(overwrite=True).to_json()
    assert json.loads(text)["overwrite"] is True and Manifest.from_json(text).overwrite is True
    older = json.loads(manifest().to_json())  # written before the field existed
    assert Manifest.from_dict(older).overwrite is False
    for bad in ("yes", 1, None):
        with pytest.raises(ManifestError, match="overwrite must be true or false"):
            Manifest.from_dict({**older, "overwrite": bad})


def test_a_segments_demuxer_is_one_of_the_allowed_and_omitted_when_unknown() -> None:
    seg = Segment(0, 10, "25/1", 64, 48, 12800, demuxer="matroska")
    item = Item("i0-s0000", "/data/v.mkv", "/data/runs/j/segments/i0-s0000.mp4", kind="video", segment=seg)
    data = json.loads(manifest(items=(item,)).to_json())
    assert data["items"][0]["segment"]["demuxer"] == "matroska"
    assert Manifest.from_dict(data).items[0].segment == seg
    plain = Item("i0-s0000", "/data/v.mkv", "/data/o.mp4", kind="video", segment=Segment(0, 10, "25/1", 64, 48, 1))
    assert "demuxer" not in json.loads(manifest(items=(plain,)).to_json())["items"][0]["segment"]
    with pytest.raises(ManifestError, match="demuxer must be one of mov, matroska, avi"):
        Segment(0, 10, "25/1", 64, 48, 12800, demuxer="hls")


def test_results_are_named_per_attempt() -> None:
    layout = RunLayout.container("j")
    assert str(layout.results("c0003", 2)) == "/data/runs/j/results/c0003.a2.jsonl"
    assert str(layout.legacy_results("c0003")) == "/data/runs/j/results/c0003.jsonl"
    assert manifest().results_path(4) == "/data/runs/j/results/c0001.a4.jsonl"


def test_the_data_roots_own_folders_are_named_once() -> None:
    top = DataRootLayout.host(Path("/srv/ffswarm"))
    assert (top.runs, top.models, top.inbox, top.tenants) == tuple(Path("/srv/ffswarm", name) for name in RESERVED)
    assert top.records == Path("/srv/ffswarm/tenants/.jobs")
    assert top.pack("default") == Path("/srv/ffswarm/models/default")
    assert top.run("j") == RunLayout.host(Path("/srv/ffswarm"), "j")
    assert str(DataRootLayout.container().pack("default")) == manifest().pack_dir == "/data/models/default"
    assert RESERVED == ("runs", "models", "inbox", "tenants")  # what a job's outputs may never be under


def test_a_result_line_carries_its_commit_record_and_older_lines_still_parse() -> None:
    r = ItemResult("i1", ItemStatus.OK, 2, "/data/a.jpg", "/data/o.jpg", size=12, sha256="a" * 64, note="n")
    assert ItemResult.from_line(r.to_line()) == r
    bare = ItemResult("i1", ItemStatus.ERROR, 1, "/data/a.jpg", None, reason="bad")
    assert not {"size", "sha256", "note"} & set(json.loads(bare.to_line()))  # as older readers know lines
    assert ItemResult.from_line(bare.to_line()) == bare
