"""Chunk service specs as data: what every runner service is, before any Docker call."""

from __future__ import annotations

import pytest

from controller.swarm.servicespec import RunnerSettings, ServiceSpec, VolumeSpec, chunk_service, service_name


def settings(volume: VolumeSpec | None = None, gpus: int = 1) -> RunnerSettings:
    return RunnerSettings(
        job="holiday",
        image="sha256:1234",
        constraints=("node.labels.ffswarm.gpu==true",),
        gpu_kind="GPU",
        gpus=gpus,
        memory_bytes=6 << 30,
        volume=volume or VolumeSpec.bind("/srv/ffswarm"),
        user="10001:10001",
    )


def test_chunk_service_golden() -> None:
    spec = chunk_service(settings(), "c0007", 2)
    vol = VolumeSpec.bind("/srv/ffswarm")
    assert spec.as_dict() == {
        "name": "ffswarm-holiday-c0007-a2",
        "image": "sha256:1234",
        "command": ["/opt/ffswarm/bin/python", "-m", "runner_image"],
        "env": {"FFSWARM_MANIFEST": "/data/runs/holiday/chunks/c0007.json", "FFSWARM_ATTEMPT": "2"},
        "labels": {
            "io.ffswarm.job": "holiday",
            "io.ffswarm.chunk": "c0007",
            "io.ffswarm.attempt": "2",
            "io.ffswarm.role": "runner",
        },
        "constraints": ["node.labels.ffswarm.gpu==true"],
        "generic_resources": {"GPU": 1},
        "memory_bytes": 6 << 30,
        "volume": {
            "name": vol.name,
            "driver": "local",
            "target": "/data",
            "options": {"type": "none", "o": "bind", "device": "/srv/ffswarm"},
        },
        "user": "10001:10001",
        "read_only": True,
        "cap_drop": ["ALL"],
        "tmpfs": {"/tmp": 512 * 1024 * 1024},
        "restart_condition": "none",
        "log_options": {"max-size": "20m", "max-file": "3"},
        "memory_reservation_bytes": 6 << 30,  # reserved as well as limited: placed only where it fits
        "pids_limit": 1024,
        "nano_cpus": 2 * 10**9,  # policy.limits.cpus
        "networks": ["ffswarm-runners"],  # internal overlay: no egress (controller/swarm/network.py)
    }


def test_nfs_volume_options_rendered_as_data() -> None:
    vol = VolumeSpec.nfs("nfs.example.internal", "/srv/ffswarm", "nfsvers=4.1,hard")
    assert dict(vol.driver_options) == {
        "type": "nfs",
        "o": "addr=nfs.example.internal,nfsvers=4.1,hard",
        "device": ":/srv/ffswarm",
    }
    assert vol.name.startswith("ffswarm-data-")
    # The local driver reuses a volume by name: different options must give a different name.
    assert vol.name != VolumeSpec.bind("/srv/ffswarm").name
    assert VolumeSpec.bind("/a").name != VolumeSpec.bind("/b").name


def test_no_gpu_reservation_when_gpus_zero() -> None:
    assert dict(chunk_service(settings(gpus=0), "c0000", 1).generic_resources) == {}


def test_extra_constraints_appended() -> None:
    spec = chunk_service(settings(), "c0001", 3, ("node.id!=abc",))
    assert spec.constraints == ("node.labels.ffswarm.gpu==true", "node.id!=abc")
    assert service_name("holiday", "c0001", 3) == spec.name


@pytest.mark.parametrize("user", ["0:0", "root:root", "10001"])
def test_root_or_malformed_user_refused(user: str) -> None:
    base = chunk_service(settings(), "c0000", 1)
    with pytest.raises(ValueError):
        ServiceSpec(**{**base.__dict__, "user": user})


def test_restart_policy_can_never_loop() -> None:
    base = chunk_service(settings(), "c0000", 1)
    with pytest.raises(ValueError, match="never restart"):
        ServiceSpec(**{**base.__dict__, "restart_condition": "on-failure"})


def test_bad_volume_inputs() -> None:
    with pytest.raises(ValueError):
        VolumeSpec.bind("relative/path")
    with pytest.raises(ValueError):
        VolumeSpec.nfs("", "/x")
