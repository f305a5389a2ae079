"""One processor registry (contract/processors.py): every table of processor names derives from it,
and the runner has exactly one factory per registered name."""

from __future__ import annotations

from dataclasses import fields

from contract import manifest, pack, processors
from controller.job.spec import JobSpec
from runner_image.processors import FACTORIES


def test_every_registered_processor_has_a_factory_and_every_factory_a_registration() -> None:
    assert set(FACTORIES) == set(processors.REGISTRY)


def test_the_manifest_and_the_pack_rules_derive_from_the_registry() -> None:
    assert manifest.PROCESSORS == tuple(processors.REGISTRY) == ("face_swapper", "face_enhancer", "frame_enhancer")
    assert pack.ROLES == (
        "detector", "recognizer", "swapper", "enhancer", "frame_enhancer", "genderage", "occluder", "face_parser",
        "swapper_converter",
    )  # fmt: skip
    for name, info in processors.REGISTRY.items():
        assert info.name == name
        assert set(info.roles) <= set(pack.ROLES)


def test_roles_to_load_follow_the_listed_processors() -> None:
    assert processors.roles(["face_swapper"]) == ("detector", "recognizer", "swapper")
    assert processors.roles(["face_swapper", "face_enhancer"]) == ("detector", "recognizer", "swapper", "enhancer")
    assert processors.roles(["face_enhancer"]) == ("detector", "recognizer", "enhancer")
    assert processors.roles(["face_swapper", "frame_enhancer"])[-1] == "frame_enhancer"


def test_the_swapper_converter_is_loaded_only_for_a_swapper_model_that_takes_one() -> None:
    converted = ("detector", "recognizer", "swapper", "swapper_converter")
    assert processors.roles(["face_swapper"], swapper="simswap_256") == converted
    assert processors.roles(["face_swapper"], swapper="ghost_256") == converted
    for plain in ("inswapper_128", "inswapper_128_fp16", "hyperswap_1a_256", None):
        assert processors.roles(["face_swapper"], swapper=plain) == ("detector", "recognizer", "swapper")
    assert processors.roles(["face_enhancer"], swapper="simswap_256") == ("detector", "recognizer", "enhancer")
    simswap = processors.CONVERTER_NEEDS["crossface_simswap"]
    assert processors.users(simswap) == ["face_swapper.model simswap_256"]
    assert "crossface_simswap.onnx" in simswap.usual


def test_a_frame_step_must_come_after_every_face_step() -> None:
    assert processors.check_order(["face_swapper", "face_enhancer", "frame_enhancer"]) is None
    assert processors.check_order(["frame_enhancer"]) is None
    assert "list it last" in (processors.check_order(["face_swapper", "frame_enhancer", "face_enhancer"]) or "")
    assert "once" in (processors.check_order(["face_swapper", "face_swapper"]) or "")


def test_each_processors_job_keys_are_job_file_keys() -> None:
    keys = {f.name for f in fields(JobSpec)}
    for info in processors.REGISTRY.values():
        assert set(info.job_keys) <= keys, info.name


def test_a_missing_role_names_the_processors_that_need_it() -> None:
    enhancer = processors.REGISTRY["face_enhancer"].needs[0]
    assert processors.users(enhancer) == ["face_enhancer"]
    assert processors.users(processors.BASE_NEEDS[0]) == []
