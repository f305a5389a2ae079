"""insightface's model classes and face alignment, imported without the package's ``__init__``.

insightface 2.1's ``__init__`` imports every subpackage — app and its addons (which pull in scipy),
thirdparty — although the runner uses only ``model_zoo`` (the model classes) and
``utils.face_align``. Measured in the runner image with ``python -X importtime``: the runner's
imports take 1.5 s with the package imported whole and 0.83 s this way, and every chunk service
pays them before its first item (its cold start). So the package is registered bare — its module
object with ``__path__`` but without running ``__init__`` — and only the two submodules are imported.
What ``__init__`` itself does for them (turning off onnxruntime's telemetry before it loads) is
done here. When insightface is already imported (tests, notebooks) this changes nothing.

``face_align`` imports scikit-image at module level for one class; the runner image has no
scikit-image, so where it is missing an equivalent ``skimage.transform`` is registered first
(similarity.py says why and what).
"""

from __future__ import annotations

import importlib.util
import os
import sys
import types


def _register_bare(name: str) -> None:
    if name in sys.modules:
        return
    spec = importlib.util.find_spec(name)
    if spec is None or spec.submodule_search_locations is None:
        return  # not installed as a package: the imports below fail with Python's own message
    os.environ.setdefault("ORT_DISABLE_TELEMETRY", "1")
    sys.modules[name] = importlib.util.module_from_spec(spec)  # __path__ set, __init__ not run


def _provide_similarity_transform() -> None:
    if importlib.util.find_spec("skimage") is not None:
        return  # the real scikit-image (the dev venv)
    from . import similarity

    package = types.ModuleType("skimage", "ffswarm's stand-in: only transform.SimilarityTransform")
    package.__path__ = []  # a package, so that `from skimage import transform` finds the submodule
    setattr(package, "transform", similarity)  # noqa: B010 (a module attribute mypy cannot see)
    sys.modules["skimage"] = package
    sys.modules["skimage.transform"] = similarity


_register_bare("insightface")
_provide_similarity_transform()

from insightface.model_zoo import model_zoo  # noqa: E402
from insightface.utils import face_align  # noqa: E402

__all__ = ["face_align", "model_zoo"]
