"""Which reference a chunk service runs for a configured image: the digest its own repository knows it
by, else the image ID — never a digest of a registry the image was once pushed to."""

from __future__ import annotations

from controller.swarm.imageref import pinned_image, repository

ID = "sha256:" + "1" * 64
DIGEST = "sha256:" + "2" * 64


def test_a_local_build_is_pinned_by_its_id() -> None:
    assert pinned_image("ffswarm/runner:dev", ID, []) == ID


def test_a_digest_from_another_registry_is_not_used() -> None:
    # The image was pushed to a throwaway registry once (scripts/cluster.sh): its digest there names
    # a registry that the single-node swarm's tasks would have to pull from.
    assert pinned_image("ffswarm/runner:dev", ID, [f"127.0.0.1:5000/ffswarm/runner@{DIGEST}"]) == ID


def test_the_repository_s_own_digest_is_used() -> None:
    digests = [f"127.0.0.1:5000/ffswarm/runner@{'sha256:' + '3' * 64}", f"registry.example:5000/team/runner@{DIGEST}"]
    assert (
        pinned_image("registry.example:5000/team/runner:v3", ID, digests)
        == f"registry.example:5000/team/runner@{DIGEST}"
    )


def test_docker_hub_names_match_in_their_familiar_form() -> None:
    assert pinned_image("docker.io/library/debian:12", ID, [f"debian@{DIGEST}"]) == f"debian@{DIGEST}"
    assert pinned_image("docker.io/ffswarm/runner:1.0", ID, [f"ffswarm/runner@{DIGEST}"]) == f"ffswarm/runner@{DIGEST}"
    assert pinned_image("ffswarm/runner", ID, [f"other/runner@{DIGEST}"]) == ID


def test_a_registry_port_is_not_a_tag() -> None:
    assert repository("127.0.0.1:5000/ffswarm/runner:dev") == "127.0.0.1:5000/ffswarm/runner"
    assert repository("127.0.0.1:5000/ffswarm/runner") == "127.0.0.1:5000/ffswarm/runner"
    assert repository(f"127.0.0.1:5000/ffswarm/runner@{DIGEST}") == "127.0.0.1:5000/ffswarm/runner"
