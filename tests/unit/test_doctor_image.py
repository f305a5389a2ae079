"""`ffswarm doctor`'s image line: what every node will run (ID), pull (size) and carry (SBOM digest)."""

from __future__ import annotations

from controller.doctor import SBOM_LABEL, describe_image
from controller.swarm.backend import ImageInfo


def test_the_image_line_names_id_size_and_sbom_digest() -> None:
    info = ImageInfo("sha256:" + "ab" * 32, 776_412_345, {SBOM_LABEL: "cd" * 32, "other": "x"})
    assert describe_image("ffswarm/runner:dev", info) == (
        "ffswarm/runner:dev present: sha256:abababababab, 776 MB, SBOM sha256 cdcdcdcdcdcdcdcd…"
    )


def test_an_image_without_the_label_says_so() -> None:
    info = ImageInfo("sha256:" + "ab" * 32, 1_467_361_998, {})
    assert describe_image("old:1", info).endswith("1467 MB, no SBOM label (an image built before the labels)")
