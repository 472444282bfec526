"""Helpers shared by the Hugging Face model tests (test_models.py, test_zoo.py)."""
import torch

import stitchml


def rel_err(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """||actual - expected|| / ||expected|| in float64 (0 when both are zero)."""
    a, e = actual.detach().double(), expected.detach().double()
    num, den = (a - e).norm().item(), e.norm().item()
    if den == 0.0:
        return 0.0 if num == 0.0 else float("inf")
    return num / den


def _report(name: str, backend: stitchml.StitchBackend) -> dict[str, int]:
    """Print per-graph kernel counts and eager fallbacks; return kernels per kind."""
    per_kind: dict[str, int] = {}
    print(f"\n[{name}] {len(backend.records)} compiled graph(s)")
    for i, rec in enumerate(backend.records):
        if rec.plan is None:
            print(f"  graph {i} ({rec.kind}): WHOLE GRAPH EAGER: {rec.eager_reason}")
            continue
        per_kind[rec.kind] = per_kind.get(rec.kind, 0) + rec.plan.num_kernels
        fallbacks = rec.graph.fallbacks if rec.graph is not None else []
        print(f"  graph {i} ({rec.kind}): {rec.plan.num_kernels} kernels, {len(fallbacks)} eager ops, "
              f"compiled in {rec.compile_seconds:.1f}s")
        counts: dict[tuple[str, str], int] = {}
        for fb in fallbacks:
            counts[(fb.op, fb.reason)] = counts.get((fb.op, fb.reason), 0) + 1
        for (op, reason), n in counts.items():
            print(f"    eager: {op} x{n}: {reason}")
    return per_kind
