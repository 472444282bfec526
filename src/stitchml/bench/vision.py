"""torchvision (and timm, which imports it) on the CPU build of torch.

The package index's torchvision wheel is built against the CUDA build of torch: with
the CPU build its compiled library (`torchvision._C`: nms, roi_align, deformable
convolution…) does not load, and `import torchvision` then fails because its Python
side registers fake kernels for `torchvision::nms` and `torchvision::qnms`, ops that
only the library defines.  Worse, transformers imports torchvision whenever it is
installed, so the venv itself must not hold it: `make venv` installs torchvision and
timm into `.venv/vision`, off the path (`STITCHML_VISION_PATH` names another folder).
`import_torchvision` puts that folder on the path and, when the compiled library does
not load, defines the two schemas first (no kernels: calling nms would still raise), so
torchvision's and timm's models import and run unchanged.  A torchvision that imports
by itself (a CUDA machine) is used as is."""
from __future__ import annotations

import os
import sys
import warnings
from pathlib import Path
from types import ModuleType

import torch

_SCHEMAS = ("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
            "qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
_LIB = None  # keeps the schema library alive
# (the repository's .venv/vision for an editable install: src/stitchml/bench -> the root)
FOLDER = Path(os.environ.get("STITCHML_VISION_PATH", Path(__file__).resolve().parents[3] / ".venv" / "vision"))


def import_torchvision() -> ModuleType | None:
    """torchvision, importable whether or not its compiled library loads; None when it
    is not installed (neither in the environment nor in FOLDER)."""
    global _LIB
    if FOLDER.is_dir() and str(FOLDER) not in sys.path:
        sys.path.append(str(FOLDER))  # after the venv: its torch, numpy… come first
    try:
        import torchvision
        return torchvision
    except ImportError:
        return None
    except RuntimeError as e:  # "operator torchvision::nms does not exist"
        if "torchvision::nms" not in str(e):
            raise
    for name in [m for m in sys.modules if m == "torchvision" or m.startswith("torchvision.")]:
        del sys.modules[name]  # the half-done import
    _LIB = torch.library.Library("torchvision", "FRAGMENT")
    for schema in _SCHEMAS:
        if not hasattr(torch.ops.torchvision, schema.split("(")[0]):
            _LIB.define(schema)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "Failed to load image Python extension" / "_C"
        import torchvision
    return torchvision
