"""Fidelity tier: our re-implementations checked against SGLang 0.5.23's own code.

These tests run only inside the fidelity virtual environment (SGLang on CPU
torch), built and run by ``.ci/fidelity-venv.sh``::

    python -m pytest tests/fidelity -p no:cacheprovider -o python_files='fidelity_*.py'

The test files are named ``fidelity_*.py`` so the main run (``python -m pytest
tests``, default ``python_files``) never collects them.  pytest still imports
this conftest while walking ``tests/``, so it must stay harmless without torch:
everything below is guarded, and the collection hook only touches items of this
folder.

With torch present it does three things before any test module is imported:

1. defines the ``torchvision::nms`` / ``torchvision::qnms`` op schemas that
   PyPI's CUDA torchvision registers fake kernels for (signatures as in
   ``torchvision/_meta_registrations.py``); CPU torch lacks them, and importing
   torchvision would otherwise fail with ``operator torchvision::nms does not
   exist``;
2. puts the repo root on ``sys.path`` so ``dspark_obs`` imports;
3. imports the SGLang modules under test once, silencing their CPU warnings.
"""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
REPO_ROOT = HERE.parents[1]

try:  # The main environment has no torch: this conftest must be a no-op there.
    import torch
except ImportError:  # pragma: no cover - exercised by the main test run
    torch = None

_TORCHVISION_STUB = None  # keep the Library alive: dropping it undefines the ops
_TORCHVISION_SCHEMAS = {
    "nms": "nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
    "qnms": "qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
}


def _torchvision_has_op(name: str) -> bool:
    try:
        getattr(torch.ops.torchvision, name)
    except (AttributeError, RuntimeError):
        return False
    return True


def _define_torchvision_stub_ops() -> None:
    global _TORCHVISION_STUB
    missing = [name for name in _TORCHVISION_SCHEMAS if not _torchvision_has_op(name)]
    if not missing:  # a real CPU torchvision build, or defined already
        return
    _TORCHVISION_STUB = torch.library.Library("torchvision", "DEF")
    for name in missing:
        _TORCHVISION_STUB.define(_TORCHVISION_SCHEMAS[name])


if torch is not None:
    _define_torchvision_stub_ops()
    if str(REPO_ROOT) not in sys.path:
        sys.path.insert(0, str(REPO_ROOT))
    with warnings.catch_warnings():
        # SGLang warns on CPU (AWQ, GGUF, Triton fallback); requests on chardet.
        warnings.simplefilter("ignore")
        import sglang.kernels.ops.speculative.dspark.dspark_schedule  # noqa: F401
        import sglang.srt.speculative.dspark_components.dspark_observability  # noqa: F401
        import sglang.srt.speculative.dspark_components.dspark_planner  # noqa: F401
        import sglang.srt.speculative.dspark_components.dspark_sps  # noqa: F401


def pytest_configure(config: pytest.Config) -> None:
    # pyproject.toml declares it too; this keeps --strict-markers happy when the
    # folder is run with another rootdir or inifile.
    config.addinivalue_line(
        "markers",
        "fidelity: checks against SGLang's own code; runs in the fidelity virtual environment",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # Conftest hooks see the whole session's items: mark only this folder's.
    for item in items:
        if HERE in Path(str(item.path)).resolve().parents:
            item.add_marker(pytest.mark.fidelity)
