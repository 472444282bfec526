"""Correctness against eager, checked before any timing.

The error of one tensor is ||actual - expected|| / max(||expected||, floor) in float64,
with floor = 1e-3 x the largest ||expected|| among the case's tensors: a gradient that
is zero in exact arithmetic (BERT's attention key bias) holds only rounding noise, and
a relative error against noise means nothing.  A case fails if any tensor's error
is above the tolerance of its suite and dtype.
"""
from __future__ import annotations

import math

import torch

from .workload import CheckOutcome

# relative error allowed, by (suite, dtype).  bf16 keeps 8 mantissa bits: one rounding
# is ~4e-3, and a different summation order compounds a few of them
TOLERANCES: dict[tuple[str, str], float] = {
    ("micro", "fp32"): 1e-4, ("micro", "bf16"): 2e-2,
    ("models", "fp32"): 1e-3, ("models", "bf16"): 5e-2,
    ("simulator", "fp32"): 1e-4,
    ("time_to_target", "fp32"): 1e-3,
}
FLOOR_FRACTION = 1e-3


def tolerance(suite: str, dtype: str) -> float:
    return TOLERANCES.get((suite, dtype), 1e-4 if dtype == "fp32" else 5e-2)


def _norm(t: torch.Tensor) -> float:
    return torch.linalg.vector_norm(t.double()).item() if t.numel() else 0.0


def tensor_error(actual: torch.Tensor, expected: torch.Tensor, floor: float) -> tuple[float, str]:
    """(error, why-if-infinite) of one tensor against its reference."""
    if tuple(actual.shape) != tuple(expected.shape):
        return math.inf, f"shape {tuple(actual.shape)} != {tuple(expected.shape)}"
    if actual.dtype != expected.dtype:
        return math.inf, f"dtype {actual.dtype} != {expected.dtype}"
    a, e = actual.detach().cpu(), expected.detach().cpu()
    if not e.dtype.is_floating_point:
        wrong = (a != e).sum().item()
        return (0.0, "") if wrong == 0 else (math.inf, f"{wrong} of {e.numel()} elements differ")
    a, e = a.double(), e.double()
    fa, fe = torch.isfinite(a), torch.isfinite(e)
    if not torch.equal(fa, fe):
        return math.inf, f"non-finite values where eager has finite ones ({(fa != fe).sum().item()} elements)"
    if not torch.equal(a[~fe].nan_to_num(), e[~fe].nan_to_num()):
        return math.inf, "non-finite values differ from eager's"
    diff = _norm(a[fe] - e[fe])
    den = max(_norm(e[fe]), floor)
    return (diff / den if den > 0 else (0.0 if diff == 0 else math.inf)), ""


def compare(actual: list[torch.Tensor], expected: list[torch.Tensor], tol: float,
            names: list[str] | None = None) -> CheckOutcome:
    """Check every tensor of `actual` against `expected` (flat lists, same order)."""
    if len(actual) != len(expected):
        return CheckOutcome(False, math.inf, f"{len(actual)} result tensors, eager gives {len(expected)}")
    names = names or [f"result {i}" for i in range(len(expected))]
    scale = max((_norm(e.detach()) for e in expected if e.dtype.is_floating_point), default=0.0)
    floor = FLOOR_FRACTION * scale
    worst, worst_name, why = 0.0, "all tensors", ""
    for name, a, e in zip(names, actual, expected):
        err, reason = tensor_error(a, e, floor)
        if err > worst or (math.isnan(err) and not math.isnan(worst)):
            worst, worst_name, why = err, name, reason
    ok = worst <= tol
    detail = f"max rel err {worst:.2e} ({worst_name}{': ' + why if why else ''}), tolerance {tol:g}"
    return CheckOutcome(ok, worst, detail)
