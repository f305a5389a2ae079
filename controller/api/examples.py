"""An example of each answer and body of the API, by the name of its model (controller/api/schemas.py):
shown in the generated OpenAPI document, and held to its model by the contract tests."""

from __future__ import annotations

from typing import Any

EXAMPLES: dict[str, Any] = {
    "JobFile": {"name": "party", "source": "faces/me.jpg", "targets": ["crowd/*.jpg"]},
    "Accepted": {
        "id": "party-abcdefgh",
        "status_url": "/v1/jobs/party-abcdefgh",
        "events_url": "/v1/jobs/party-abcdefgh/events",
    },
    "Cancelled": {"job": "party-abcdefgh", "cancelled": True},
    "Delivery": {
        "id": "msg_3f1c0a9e5b7d4c2a8e6f1b0d9c7a5e3f",
        "type": "job.finished",
        "created_at": "2026-12-02T07:41:03Z",
        "state": "pending",
        "next_attempt_at": "2026-12-02T07:43:38Z",
        "attempts": [
            {"at": "2026-12-02T07:41:03Z", "error": "ConnectionRefusedError"},
            {"at": "2026-12-02T07:41:38Z", "status": 503},
        ],
    },
    "Error": {"error": {"code": "not_found", "message": "no job 'party-abcdefgh'"}},
    "EventsLink": {
        "url": "/v1/jobs/party-abcdefgh/events?expires=1796197563&kid=0a1b2c3d&gen=0&sig=9f86d0",
        "expires": 1796197563,
    },
    "Health": {"ok": True},
    "ItemPage": {
        "items": [
            {
                "id": "i000002",
                "kind": "image",
                "input": "in/2.jpg",
                "output": "out/party-abcdefgh/2.jpg",
                "status": "error",
                "reason": "no face found in in/2.jpg",
                "has_output": False,
            }
        ],
        "next_cursor": None,
    },
    "JobPage": {
        "jobs": [
            {
                "job": "party-abcdefgh",
                "phase": "queued",
                "outcome": None,
                "owner": "acme",
                "created": 1796197263.0,
                "created_at": "2026-12-02T07:41:03Z",
                "started_at": None,
                "finished_at": None,
            }
        ],
        "next_cursor": None,
    },
    "JobStatus": {
        "job": "party-abcdefgh",
        "phase": "finished",
        "outcome": "partial",
        "owner": "acme",
        "created": 1796197263.0,
        "created_at": "2026-12-02T07:41:03Z",
        "started_at": "2026-12-02T07:41:05Z",
        "finished_at": "2026-12-02T07:42:10Z",
        "items": {"total": 4, "ok": 3, "no_face": 0, "failed": 1, "cancelled": 0, "pending": 0},
    },
    "Readiness": {
        "ready": False,
        "reasons": ["no controller is serving the inbox (no live `ffswarm serve` heartbeat)"],
    },
    "Report": {
        "job": "party-abcdefgh",
        "image": "ffswarm-runner:1",
        "started": 1796197265.0,
        "finished": 1796197330.0,
        "started_at": "2026-12-02T07:41:05Z",
        "finished_at": "2026-12-02T07:42:10Z",
        "counts": {
            "items": 2,
            "ok": 1,
            "no_face": 0,
            "failed": 1,
            "chunks": 1,
            "chunks_done": 1,
            "chunks_failed": 0,
            "chunks_cancelled": 0,
            "cancelled": 0,
            "segments": 0,
        },
        "failures": [{"item": "i000001", "input": "in/1.jpg", "reason": "no face found in in/1.jpg", "chunk": "c0000"}],
        "items": {
            "i000000": {
                "input": "in/0.jpg",
                "output": "out/party-abcdefgh/0.jpg",
                "status": "ok",
                "reason": None,
                "chunk": "c0000",
            },
            "i000001": {
                "input": "in/1.jpg",
                "output": None,
                "status": "error",
                "reason": "no face found in in/1.jpg",
                "chunk": "c0000",
            },
        },
        "chunks": {
            "c0000": {
                "state": "done",
                "failure": None,
                "reason": None,
                "avoid_nodes": [],
                "attempts": [
                    {
                        "attempt": 1,
                        "service": "ffswarm-party-abcdefgh-c0000-a1",
                        "node": "gpu-1",
                        "exit_code": 0,
                        "outcome": "done",
                        "reason": None,
                    }
                ],
            }
        },
    },
    "Retried": {
        "id": "party-abcdefgh",
        "status_url": "/v1/jobs/party-abcdefgh",
        "events_url": "/v1/jobs/party-abcdefgh/events",
        "items": 1,
    },
    "Revoked": {"id": "party-abcdefgh", "links_revoked": True},
    "Scale": {"max_concurrent": 4},
    "Scaled": {"job": "party-abcdefgh", "max_concurrent": 4},
    "UsagePage": {
        "tenant": "acme",
        "from": 0.0,
        "to": 1796197263.0,
        "from_at": "1970-01-01T00:00:00Z",
        "to_at": "2026-12-02T07:41:03Z",
        "jobs": 1,
        "jobs_without_usage": 0,
        "usage": {
            "gpu_seconds": 12.5,
            "runner_seconds": 12.5,
            "attempts": 1,
            "attempts_untimed": 0,
            "bytes_in": 40960,
            "bytes_out": 38912,
            "items": {"ok": 3, "no_face": 0, "failed": 1, "cancelled": 0},
        },
        "job_usage": [
            {
                "job": "party-abcdefgh",
                "finished": 1796197330.0,
                "finished_at": "2026-12-02T07:42:10Z",
                "usage": {
                    "gpu_seconds": 12.5,
                    "runner_seconds": 12.5,
                    "attempts": 1,
                    "attempts_untimed": 0,
                    "bytes_in": 40960,
                    "bytes_out": 38912,
                    "items": {"ok": 3, "no_face": 0, "failed": 1, "cancelled": 0},
                },
            }
        ],
        "next_cursor": None,
    },
}
EXAMPLES["DeliveryPage"] = {"job": "party-abcdefgh", "deliveries": [EXAMPLES["Delivery"]]}

__all__ = ["EXAMPLES"]
