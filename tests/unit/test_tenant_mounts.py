"""What a tenant's runner sees of the data root (docs/operations.md#isolation), as data: its area
read-only, its output folders and run folder writable, its model pack read-only — never the data
root, never another tenant's area or another job's run folder. The engine-side proof (a live
service's mounts, a runner refused writes) is tests/integration/test_isolation.py."""

from __future__ import annotations

import dataclasses
from types import MappingProxyType

import pytest

from controller.errors import JobFileError
from controller.job.fence import MAX_OUTPUT_MOUNTS
from controller.swarm.servicespec import (
    WHOLE_ROOT,
    DataMount,
    RunnerSettings,
    VolumeSpec,
    chunk_service,
    tenant_mounts,
)

AREA, RUN, MODELS = "tenants/acme", "runs/sel-abcdefgh", "models/default"


def visible(mounts: tuple[DataMount, ...]) -> dict[str, bool]:
    return {m.rel: m.writable for m in mounts}


def test_a_tenants_runner_sees_its_area_read_only_and_writes_only_outputs_and_its_run_folder() -> None:
    mounts = tenant_mounts(AREA, RUN, MODELS, ["tenants/acme/out/sel-abcdefgh", "tenants/acme/out/sel-abcdefgh"])
    assert visible(mounts) == {
        AREA: False,
        "tenants/acme/out/sel-abcdefgh": True,
        RUN: True,
        MODELS: False,
    }
    assert all(m.rel for m in mounts), "never the data root"


def test_nested_output_folders_are_one_mount_and_many_merge_into_their_common_folder() -> None:
    nested = tenant_mounts(AREA, RUN, MODELS, ["tenants/acme/out", "tenants/acme/out/a", "tenants/acme/out/a/b"])
    assert [m.rel for m in nested if m.writable and m.rel != RUN] == ["tenants/acme/out"]
    many = [f"tenants/acme/out/{k:02d}" for k in range(MAX_OUTPUT_MOUNTS + 1)]
    merged = tenant_mounts(AREA, RUN, MODELS, many)
    assert visible(merged) == {AREA: False, "tenants/acme/out": True, RUN: True, MODELS: False}


def test_too_many_output_folders_merge_at_the_deepest_level_that_fits_never_into_the_area() -> None:
    spread = [f"tenants/acme/{top}/{k:02d}" for top in ("out", "best") for k in range(MAX_OUTPUT_MOUNTS)]
    merged = tenant_mounts(AREA, RUN, MODELS, spread)
    outputs = {"tenants/acme/best": True, "tenants/acme/out": True}
    assert visible(merged) == {AREA: False, **outputs, RUN: True, MODELS: False}
    deep = [f"tenants/acme/out/{g}/{k:02d}/x" for g in ("a", "b", "c") for k in range(MAX_OUTPUT_MOUNTS)]
    deep.append("tenants/acme/kept")  # shallower than the level chosen: kept as it is
    mounts = tenant_mounts(AREA, RUN, MODELS, deep)
    writable = sorted(m.rel for m in mounts if m.writable and m.rel != RUN)
    assert writable == ["tenants/acme/kept", "tenants/acme/out/a", "tenants/acme/out/b", "tenants/acme/out/c"]


def test_more_top_folders_of_the_area_than_one_runner_may_write_are_refused_not_merged_into_the_area() -> None:
    tops = [f"tenants/acme/d{k:02d}" for k in range(MAX_OUTPUT_MOUNTS + 1)]
    with pytest.raises(JobFileError, match=f"{MAX_OUTPUT_MOUNTS + 1} folders at the top"):
        tenant_mounts(AREA, RUN, MODELS, [f"{t}/out" for t in tops])
    assert len(tenant_mounts(AREA, RUN, MODELS, tops[:MAX_OUTPUT_MOUNTS])) == MAX_OUTPUT_MOUNTS + 3


def test_outputs_into_the_area_itself_make_the_area_writable_but_nothing_more() -> None:
    mounts = tenant_mounts(AREA, RUN, MODELS, [AREA])
    assert visible(mounts) == {AREA: True, RUN: True, MODELS: False}


def test_video_segments_in_the_run_folder_add_no_mount() -> None:
    mounts = tenant_mounts(AREA, RUN, MODELS, [f"{RUN}/segments", "tenants/acme/out/x"])
    assert visible(mounts) == {AREA: False, "tenants/acme/out/x": True, RUN: True, MODELS: False}


def test_an_output_folder_outside_the_area_is_refused() -> None:
    with pytest.raises(ValueError, match="outside its area"):
        tenant_mounts(AREA, RUN, MODELS, ["tenants/acme2/out"])
    with pytest.raises(ValueError, match="outside its area"):
        tenant_mounts(AREA, RUN, MODELS, ["out"])


def test_a_lane_writes_only_its_tenants_out_folder_and_sees_its_tenants_runs_in_place_of_one_run_folder() -> None:
    mounts = tenant_mounts(AREA, f"runs/x/{RUN}", MODELS, ["tenants/acme/out/x", "tenants/acme/out"], runs="runs/x")
    assert visible(mounts) == {AREA: False, "tenants/acme/out": True, "runs/x": True, MODELS: False}


@pytest.mark.parametrize("rel", ["/etc", "a/../b", "a//b", ".", "a/./b"])
def test_a_data_mount_is_a_normalised_folder(rel: str) -> None:
    with pytest.raises(ValueError, match="normalised"):
        DataMount(rel)


def test_nfs_volumes_narrow_to_the_exports_sub_path_and_binds_to_the_sub_folder() -> None:
    nfs = VolumeSpec.nfs("nfs.example.internal", "/srv/ffswarm")
    sub = nfs.sub(AREA)
    assert sub.driver_options["device"] == ":/srv/ffswarm/tenants/acme"
    assert sub.driver_options["o"] == nfs.driver_options["o"] and sub.name != nfs.name
    assert not nfs.is_bind
    bind = VolumeSpec.bind("/srv/ffswarm/")
    assert bind.is_bind and bind.device_of(AREA) == "/srv/ffswarm/tenants/acme" and bind.device_of("") == "/srv/ffswarm"
    assert dict(bind.sub(RUN).driver_options) == dict(
        MappingProxyType({"type": "none", "o": "bind", "device": "/srv/ffswarm/runs/sel-abcdefgh"})
    )


def test_the_service_spec_says_what_it_mounts_and_a_cli_job_keeps_the_whole_root() -> None:
    base = RunnerSettings(
        job="sel-abcdefgh", image="sha256:1", constraints=(), gpu_kind="GPU", gpus=1, memory_bytes=1 << 30,
        volume=VolumeSpec.bind("/srv/ffswarm"), user="10001:10001",
    )  # fmt: skip
    cli = chunk_service(base, "c0000", 1)
    assert cli.data_mounts == WHOLE_ROOT and "data_mounts" not in cli.as_dict()
    tenant = chunk_service(dataclasses.replace(base, data_mounts=tenant_mounts(AREA, RUN, MODELS, [])), "c0000", 1)
    assert tenant.as_dict()["data_mounts"] == [
        {"path": AREA, "writable": False},
        {"path": RUN, "writable": True},
        {"path": MODELS, "writable": False},
    ]
