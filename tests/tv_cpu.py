"""torchvision (and timm, which imports it) on the CPU build of torch.

The package index's torchvision wheel is built against the CUDA build of torch: with
the CPU build its compiled library (`torchvision._C`: nms, roi_align, deformable
convolution…) does not load, and `import torchvision` then fails because its Python
side registers fake kernels for `torchvision::nms` and `torchvision::qnms`, ops that
only the library defines.  The models need none of those ops, so defining the two
schemas first (no kernel: calling them would still raise) lets torchvision import and
its models run on the CPU build.  Nothing else is patched."""
from __future__ import annotations

import warnings

import torch

_SCHEMAS = ("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
            "qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
_LIB = None


def import_torchvision():
    """torchvision, importable whether or not its compiled library loads."""
    global _LIB
    try:
        import torchvision
        return torchvision
    except RuntimeError as e:  # "operator torchvision::nms does not exist"
        if "torchvision::nms" not in str(e):
            raise
    _LIB = torch.library.Library("torchvision", "FRAGMENT")
    for schema in _SCHEMAS:
        if not hasattr(torch.ops.torchvision, schema.split("(")[0]):
            _LIB.define(schema)
    import sys
    for name in [m for m in sys.modules if m == "torchvision" or m.startswith("torchvision.")]:
        del sys.modules[name]  # the failed, half-done import
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "Failed to load image Python extension" / "_C"
        import torchvision
    return torchvision
