"""The contract's shapes for pairs (issue 18): manifest schema version 2 with an identity table,
items naming their identity, version 1 manifests still read, and the identity step's request and
answer per person. Hostile tables are refused as bad manifests (exit 65)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from contract.errors import ManifestError
from contract.identity import IdentityRequest, IdentityResult
from contract.identity_table import Identity
from contract.manifest import Manifest

V1 = {
    "schema": 1,
    "job": "j",
    "chunk": "c0001",
    "run_dir": "/data/runs/j",
    "pack_dir": "/data/models/default",
    "source": ["/data/s.jpg"],
    "items": [{"id": "i000000", "input": "/data/a.jpg", "output": "/data/out/a.png"}],
}


def v2(**kw: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        **V1,
        "schema": 2,
        "source": [],
        "identity": "/data/runs/j/identity/identity.json",
        "identities": {
            "s000000": {"sources": ["/data/u/1.jpg", "/data/u/1b.jpg"]},
            "s000001": {"sources": ["/data/u/2.jpg"], "embedding": [0.5, -0.25]},
        },
        "items": [
            {"id": "i000000", "input": "/data/a.jpg", "output": "/data/out/a.png", "identity": "s000000"},
            {"id": "i000001", "input": "/data/b.jpg", "output": "/data/out/b.png", "identity": "s000001"},
        ],
    }
    data.update(kw)
    return data


def test_a_version_2_manifest_round_trips_with_its_identity_table() -> None:
    m = Manifest.from_dict(v2())
    assert m.schema == 2 and m.source == ()
    assert m.identities["s000000"] == Identity(("/data/u/1.jpg", "/data/u/1b.jpg"))
    assert m.identities["s000001"].embedding == (0.5, -0.25)
    assert [i.identity for i in m.items] == ["s000000", "s000001"]
    again = json.loads(m.to_json())
    assert again["identities"] == v2()["identities"] and again["items"][0]["identity"] == "s000000"
    assert Manifest.from_json(m.to_json()) == m


def test_a_version_1_manifest_still_reads_and_is_written_as_before() -> None:
    m = Manifest.from_dict(dict(V1))
    assert m.schema == 1 and m.identities == {} and m.items[0].identity is None
    data = json.loads(m.to_json())
    assert "identities" not in data and "identity" not in data["items"][0] and data["schema"] == 1


@pytest.mark.parametrize(
    ("data", "match"),
    [
        (v2(schema=1), "identities need manifest schema version 2"),
        ({**V1, "items": [{**V1["items"][0], "identity": "s000000"}]}, "identities need manifest schema version 2"),
        (v2(identities={}), "needs an identity table"),
        (v2(source=["/data/s.jpg"]), "not in source"),
        (v2(items=[{**V1["items"][0], "identity": "s000009"}]), "not in the manifest's identity table"),
        (v2(items=[{"id": "i1", "input": "/data/a.jpg", "output": "/data/o.png"}]), "identity None is not in"),
        (v2(identities={"../x": {"sources": ["/data/u/1.jpg"]}}), "is not s followed by"),
        (v2(identities={"s000000": {"sources": ["/etc/passwd"]}}), "not a path under /data"),
        (v2(identities={"s000000": {"sources": []}}), "1 to 64 source photos"),
        (v2(identities={"s000000": {"sources": ["/data/u.jpg"], "embedding": ["NaN"]}}), "finite numbers"),
        (v2(identities={"s000000": {"sources": ["/data/u.jpg"], "cmd": "x"}}), "is not {sources"),
        (v2(identities=[1]), "identities must be an object"),
        (v2(schema=True), "unknown manifest schema version True"),
    ],
)  # fmt: skip
def test_hostile_identity_tables_are_bad_manifests(data: dict[str, Any], match: str) -> None:
    with pytest.raises(ManifestError, match=match):
        Manifest.from_dict(data)


def test_the_identity_steps_request_and_answer_per_person_round_trip() -> None:
    people = {"s000000": Identity(("/data/u/1.jpg",)), "s000001": Identity(("/data/u/2.jpg", "/data/u/2b.jpg"))}
    req = IdentityRequest(
        job="j",
        pack_dir="/data/models/default",
        sources=(),
        output="/data/runs/j/identity.json",
        schema=2,
        identities=people,
    )
    assert IdentityRequest.from_json(req.to_json()) == req
    with pytest.raises(ManifestError, match="version 2 an identity table"):
        IdentityRequest(
            job="j", pack_dir="/data/m", sources=("/data/s.jpg",), output="/data/o.json", schema=2, identities=people
        )
    with pytest.raises(ManifestError, match="version 2 an identity table"):
        IdentityRequest(job="j", pack_dir="/data/m", sources=(), output="/data/o.json")
    answer = IdentityResult(
        identities={
            "s000000": Identity(("/data/u/1.jpg",), embedding=(0.6, 0.8)),
            "s000001": Identity(("/data/u/2.jpg",), error="source photo u/2.jpg: no face detected"),
        }
    )
    assert answer.answered and IdentityResult.from_json(answer.to_json()) == answer
    assert not IdentityResult(pending=True).answered
    with pytest.raises(ManifestError):
        IdentityResult.from_json(json.dumps({"identities": {"s000000": {"sources": ["/etc/x"]}}}))
