"""Stack files as data: the rendered compose file says what ServiceSpec.as_dict() says, field by field."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from controller.cli.ops import _api_service
from controller.config import Config, parse_config
from controller.errors import UsageError
from controller.swarm.render import (
    ApiService,
    ControllerStack,
    api_secrets,
    render_controller_stack,
    render_runner_stack,
)
from controller.swarm.servicespec import RunnerSettings, ServiceSpec, VolumeSpec, chunk_service

IMAGE = "registry.example.internal/ffswarm/runner@sha256:" + "ab" * 32


def settings(volume: VolumeSpec, job: str = "holiday", gpus: int = 1) -> RunnerSettings:
    return RunnerSettings(
        job=job,
        image=IMAGE,
        constraints=("node.labels.ffswarm.gpu==true", "node.platform.arch==x86_64"),
        gpu_kind="GPU",
        gpus=gpus,
        memory_bytes=6 << 30,
        volume=volume,
        user="10001:10001",
    )


NFS = VolumeSpec.nfs("nfs.example.internal", "/srv/ffswarm", "nfsvers=4.1,hard")
BIND = VolumeSpec.bind("/srv/ffswarm")


def render(specs: list[ServiceSpec]) -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load(render_runner_stack(specs))
    return data


@pytest.mark.parametrize("volume", [NFS, BIND], ids=["nfs", "bind"])
def test_every_spec_field_lands_where_stack_deploy_reads_it(volume: VolumeSpec) -> None:
    specs = [chunk_service(settings(volume), c, 2) for c in ("c0000", "c0001", "c0002")]
    doc = render(specs)
    assert doc["version"] == "3.9"
    assert list(doc["services"]) == [s.name for s in specs]
    for spec in specs:
        d = spec.as_dict()
        svc = doc["services"][spec.name]
        assert svc["image"] == d["image"] == IMAGE
        assert svc["entrypoint"] == d["command"]  # ContainerSpec.Command, as the SDK sets it
        assert "command" not in svc  # compose `command` would become Args
        assert svc["environment"] == d["env"]
        assert svc["labels"] == d["labels"] == svc["deploy"]["labels"]  # container AND service labels
        assert svc["user"] == d["user"] and svc["read_only"] is True and svc["cap_drop"] == ["ALL"]
        vol, tmp = svc["volumes"]
        assert vol == {"type": "volume", "source": "data", "target": "/data"}
        assert tmp == {"type": "tmpfs", "target": "/tmp", "tmpfs": {"size": d["tmpfs"]["/tmp"]}}  # type: ignore[index]
        assert svc["logging"] == {"driver": "json-file", "options": d["log_options"]}
        deploy = svc["deploy"]
        assert deploy["mode"] == "replicated" and deploy["replicas"] == 1
        assert deploy["placement"] == {"constraints": d["constraints"]}
        assert deploy["restart_policy"] == {"condition": "none", "max_attempts": 0, "delay": "0s", "window": "0s"}
        assert deploy["resources"]["limits"] == {"memory": str(6 << 30), "cpus": "2.0", "pids": 1024}
        assert deploy["resources"]["reservations"]["memory"] == str(6 << 30)
        assert deploy["resources"]["reservations"]["generic_resources"] == [
            {"discrete_resource_spec": {"kind": "GPU", "value": 1}}
        ]
        assert svc["networks"] == ["net_ffswarm_runners"]
    # the SDK's runners' network, made (with its anchor) by ffswarm before the stack is deployed
    assert doc["networks"] == {"net_ffswarm_runners": {"external": True, "name": "ffswarm-runners"}}
    assert doc["volumes"] == {
        "data": {
            "name": volume.name,
            "external": False,
            "driver": "local",
            "driver_opts": dict(volume.driver_options),
        }
    }


def test_nfs_driver_options_are_rendered_as_data() -> None:
    opts = render([chunk_service(settings(NFS), "c0000", 1)])["volumes"]["data"]["driver_opts"]
    assert opts == {"type": "nfs", "o": "addr=nfs.example.internal,nfsvers=4.1,hard", "device": ":/srv/ffswarm"}


def test_no_gpu_means_no_reservation() -> None:
    svc = render([chunk_service(settings(BIND, gpus=0), "c0000", 1)])["services"]["ffswarm-holiday-c0000-a1"]
    assert svc["deploy"]["resources"]["reservations"] == {"memory": str(6 << 30)}  # memory only, no GPU


def test_values_cannot_change_the_files_structure() -> None:
    evil = 'x"\n    privileged: true\n#'
    base = chunk_service(settings(BIND), "c0000", 1)
    spec = ServiceSpec(**{**base.__dict__, "labels": {**base.labels, "note": evil}, "constraints": (evil,)})
    svc = render([spec])["services"][spec.name]
    assert svc["labels"]["note"] == evil and svc["deploy"]["placement"]["constraints"] == [evil]
    assert "privileged" not in svc


def test_service_keys_are_quoted_and_ids_read_back_are_checked() -> None:
    """A chunk id from a run folder with a newline once rendered `cap_add: [ALL]` (issue 15)."""
    base = chunk_service(settings(BIND), "c0000", 1)
    evil = ServiceSpec(**{**base.__dict__, "name": "ffswarm-holiday-c0000-a1:\n    cap_add: [ALL]\n  x"})
    with pytest.raises(ValueError, match=r"refusing to render a service named .*a-z, 0-9 and - only"):
        render_runner_stack([evil])
    assert f'  "{base.name}":\n' in render_runner_stack([base])


def test_one_job_one_volume_per_stack() -> None:
    with pytest.raises(ValueError, match="one job"):
        render_runner_stack([chunk_service(settings(BIND), "c0000", 1), chunk_service(settings(NFS), "c0001", 1)])
    with pytest.raises(ValueError, match="no pending chunks"):
        render_runner_stack([])


def test_stack_and_service_names_fit_swarms_63_characters() -> None:
    spec = chunk_service(settings(BIND, job="j" * 40), "c0000", 1)  # the longest job name
    assert len(spec.name) == 57
    render_runner_stack([spec])  # the default stack name fits every legal job name
    with pytest.raises(ValueError, match="at most 5 characters"):
        render_runner_stack([spec], stack="ffswarm")


def test_golden_nfs_stack() -> None:
    text = render_runner_stack([chunk_service(settings(NFS), c, 1) for c in ("c0000", "c0001")])
    golden = Path(__file__).parent / "golden" / "runner-stack-nfs.yml"
    assert text == golden.read_text(), f"differs from {golden}"


def test_controller_stack() -> None:
    stack = ControllerStack(
        image=IMAGE,
        config_file=Path("/etc/ffswarm/ffswarm.yaml"),
        config_text="data_root: /srv/ffswarm\n",
        data_root="/srv/ffswarm",
        volume=NFS,
        concurrent_jobs=2,
        metrics_port=9200,
    )
    doc = yaml.safe_load(render_controller_stack(stack))
    svc = doc["services"]["controller"]
    assert svc["image"] == IMAGE and svc["user"] == "0:0"
    assert svc["entrypoint"][:4] == ["/opt/ffswarm/bin/ffswarm", "--json-logs", "--config", "/etc/ffswarm/config.yaml"]
    assert svc["entrypoint"][4:] == ["serve", "--concurrent-jobs", "2", "--metrics-port", "9200"]
    sock, data, _tmp = svc["volumes"]
    assert sock == {
        "type": "bind",
        "source": "/var/run/docker.sock",
        "target": "/var/run/docker.sock",
        "read_only": True,
    }
    assert data == {"type": "volume", "source": "data", "target": "/srv/ffswarm"}
    assert doc["volumes"]["data"]["driver_opts"] == dict(NFS.driver_options)
    deploy = svc["deploy"]
    assert deploy["restart_policy"]["condition"] == "on-failure"
    assert deploy["placement"]["constraints"] == ["node.role == manager"]
    assert deploy["labels"]["prometheus.io/scrape"] == "true" and deploy["labels"]["prometheus.io/port"] == "9200"
    assert doc["configs"]["ffswarm_config"] == {"name": stack.config_name, "file": "/etc/ffswarm/ffswarm.yaml"}
    assert stack.config_name != ControllerStack(**{**stack.__dict__, "config_text": "other"}).config_name
    assert set(doc["services"]) == {"controller"} and "secrets" not in doc  # no tenants: no api service


def controller_stack(api: ApiService | None) -> ControllerStack:
    return ControllerStack(
        image=IMAGE,
        config_file=Path("/etc/ffswarm/ffswarm.yaml"),
        config_text="data_root: /srv/ffswarm\n",
        data_root="/srv/ffswarm",
        volume=NFS,
        api=api,
    )


def test_controller_stack_with_tenants_runs_the_api_beside_serve_hardened_and_published() -> None:
    api = ApiService((10000, 999), publish_port=8443, replicas=3, secrets=("ffswarm-api", "ffswarm-jwt"))
    doc = yaml.safe_load(render_controller_stack(controller_stack(api)))
    assert set(doc["services"]) == {"controller", "api"}
    svc = doc["services"]["api"]
    assert svc["image"] == IMAGE and svc["user"] == "10000:999"
    assert svc["entrypoint"] == ["/opt/ffswarm/bin/ffswarm", "--json-logs", "--config", "/etc/ffswarm/config.yaml",
                                 "api", "--listen", "0.0.0.0:8080"]  # fmt: skip
    assert svc["read_only"] is True and svc["cap_drop"] == ["ALL"]
    assert "/var/run/docker.sock" not in str(svc["volumes"])  # the API never gets the socket
    data, tmp = svc["volumes"]
    assert data == {"type": "volume", "source": "data", "target": "/srv/ffswarm"}  # the controller's own volume
    assert tmp["target"] == "/tmp" and tmp["type"] == "tmpfs"
    assert svc["configs"] == [{"source": "ffswarm_config", "target": "/etc/ffswarm/config.yaml", "mode": 0o444}]
    assert svc["ports"] == [{"target": 8080, "published": 8443, "protocol": "tcp", "mode": "ingress"}]
    assert svc["healthcheck"]["test"][:2] == ["CMD", "/opt/ffswarm/bin/python"]
    assert "http://127.0.0.1:8080/healthz" in svc["healthcheck"]["test"][3]
    assert "networks" not in svc  # the stack's own overlay (the routing mesh), not the controller's host network
    deploy = svc["deploy"]
    assert deploy["replicas"] == 3 and deploy["restart_policy"]["condition"] == "any"
    assert deploy["resources"]["limits"] == {"memory": "512M", "pids": 256}
    assert deploy["update_config"]["order"] == "start-first"
    assert svc["secrets"] == [
        {"source": "secret_ffswarm_api", "target": "ffswarm-api", "uid": "10000", "gid": "999", "mode": 0o400},
        {"source": "secret_ffswarm_jwt", "target": "ffswarm-jwt", "uid": "10000", "gid": "999", "mode": 0o400},
    ]
    assert doc["secrets"] == {
        "secret_ffswarm_api": {"external": True, "name": "ffswarm-api"},
        "secret_ffswarm_jwt": {"external": True, "name": "ffswarm-jwt"},
    }
    no_keys = yaml.safe_load(render_controller_stack(controller_stack(ApiService((10000, 999)))))
    assert (
        no_keys["services"]["api"]["ports"][0]["published"] == 8080
        and no_keys["services"]["api"]["deploy"]["replicas"] == 2
    )
    assert "secrets" not in no_keys and "secrets" not in no_keys["services"]["api"]


def test_the_api_service_is_never_root_and_its_key_files_must_be_swarm_secrets() -> None:
    with pytest.raises(ValueError, match="never runs as root"):
        ApiService((0, 999))
    with pytest.raises(ValueError, match="replicas"):
        ApiService((10000, 999), replicas=0)
    assert api_secrets([Path("/run/secrets/ffswarm-api"), Path("/run/secrets/ffswarm-api")]) == ("ffswarm-api",)
    with pytest.raises(ValueError, match="docker secret create NAME FILE"):
        api_secrets([Path("/etc/ffswarm/api.key")])


def _config(tmp_path: Path, **extra: Any) -> Config:
    data = {"data_root": str(tmp_path), "volume": {"type": "bind"}, **extra}
    return parse_config(tmp_path / "ffswarm.yaml", data)


def test_render_adds_the_api_only_for_tenants_as_controller_user_with_the_configs_key_secrets(tmp_path: Path) -> None:
    assert _api_service(_config(tmp_path), 8080, 2, None) is None  # no tenants: no api service
    tenants = {"acme": {"api_keys_sha256": ["0" * 64]}}
    with pytest.raises(UsageError, match="controller_user"):
        _api_service(_config(tmp_path, tenants=tenants), 8080, 2, None)
    jwt = {"algorithms": ["HS256"], "secret_file": "/run/secrets/ffswarm-jwt", "audience": "ffswarm"}
    api = {"signing_key_file": "/run/secrets/ffswarm-api", "jwt": jwt}
    got = _api_service(_config(tmp_path, tenants=tenants, controller_user="10000:999", api=api), 9000, 4, None)
    assert got == ApiService((10000, 999), 9000, 4, ("ffswarm-api", "ffswarm-jwt"))
    rotating = {**api, "previous_signing_key_files": ["/run/secrets/ffswarm-api-old"]}  # both keys travel
    got = _api_service(_config(tmp_path, tenants=tenants, controller_user="10000:999", api=rotating), 9000, 4, None)
    assert got == ApiService((10000, 999), 9000, 4, ("ffswarm-api", "ffswarm-api-old", "ffswarm-jwt"))
    assert _api_service(_config(tmp_path, tenants=tenants), 8080, 2, "10002:10002") == ApiService((10002, 10002))
    with pytest.raises(UsageError, match="non-root"):
        _api_service(_config(tmp_path, tenants=tenants), 8080, 2, "0:0")
    elsewhere = {"signing_key_file": "/etc/ffswarm/api.key"}
    with pytest.raises(UsageError, match="/run/secrets/NAME"):
        _api_service(_config(tmp_path, tenants=tenants, controller_user="10000:999", api=elsewhere), 8080, 2, None)


def test_serve_gets_the_key_files_it_signs_webhooks_and_links_with_as_root_only_secrets(tmp_path: Path) -> None:
    """A tenant's webhook is signed with its own key and carries a results link signed with the API's:
    in the controller stack `serve` reads both from Swarm secrets, as the api service does its own."""
    from controller.cli.ops import _serve_secrets

    tenants = {"acme": {"api_keys_sha256": ["0" * 64],
                        "webhooks": {"allow_hosts": ["hooks.acme.example"], "secret_file": "/run/secrets/acme-hooks"}}}
    api = {"signing_key_file": "/run/secrets/ffswarm-api"}
    policy = {"webhooks": {"allow_hosts": ["ci.example"], "secret_file": "/run/secrets/cluster-hooks"}}
    config = _config(tmp_path, tenants=tenants, controller_user="10000:999", api=api, policy=policy)
    names = _serve_secrets(config)
    assert set(names) == {"cluster-hooks", "ffswarm-api", "acme-hooks"}
    stack = ControllerStack(**{**controller_stack(ApiService((10000, 999), secrets=("ffswarm-api",))).__dict__,
                               "secrets": names})  # fmt: skip
    doc = yaml.safe_load(render_controller_stack(stack))
    mounted = {s["target"]: s for s in doc["services"]["controller"]["secrets"]}
    assert set(mounted) == set(names) and all(s["uid"] == "0" and s["mode"] == 0o400 for s in mounted.values())
    assert {v["name"] for v in doc["secrets"].values()} == set(names)  # each declared once, shared with the api
    elsewhere = {"webhooks": {"allow_hosts": ["ci.example"], "secret_file": "/etc/ffswarm/hooks.key"}}
    with pytest.raises(UsageError, match="/run/secrets/NAME"):
        _serve_secrets(_config(tmp_path, policy=elsewhere))


def test_the_api_gets_the_object_stores_keys_it_checks_s3_jobs_and_signs_links_with(tmp_path: Path) -> None:
    """A tenant's s3:// job is checked against the store at submit, by the API: in the controller
    stack the API reads the store's credentials files from Swarm secrets, as serve does."""
    from controller.cli.ops import _serve_secrets

    storage = {"s3": {"endpoint_url": "http://10.9.0.1:7480", "credentials_secret": "ffswarm-s3"}}
    tenants = {
        "acme": {"api_keys_sha256": ["0" * 64], "s3": "s3://media/acme/"},
        "globex": {"api_keys_sha256": ["1" * 64],
                   "s3": {"area": "s3://media/globex/", "credentials_secret": "globex-s3"}},
    }  # fmt: skip
    api = {"signing_key_file": "/run/secrets/ffswarm-api"}
    config = _config(tmp_path, tenants=tenants, controller_user="10000:999", api=api, storage=storage)
    got = _api_service(config, 8080, 2, None)
    assert got is not None and got.secrets == ("ffswarm-api", "ffswarm-s3", "globex-s3")
    assert {"ffswarm-s3", "globex-s3"} <= set(_serve_secrets(config))
    stack = ControllerStack(**{**controller_stack(got).__dict__, "secrets": _serve_secrets(config)})
    doc = yaml.safe_load(render_controller_stack(stack))
    mounted = {s["target"]: s for s in doc["services"]["api"]["secrets"]}
    assert mounted["ffswarm-s3"]["uid"] == "10000" and mounted["globex-s3"]["mode"] == 0o400
    no_store = _api_service(_config(tmp_path, tenants={"acme": {"api_keys_sha256": ["0" * 64]}},
                                    controller_user="10000:999", api=api), 8080, 2, None)  # fmt: skip
    assert no_store is not None and no_store.secrets == ("ffswarm-api",)
