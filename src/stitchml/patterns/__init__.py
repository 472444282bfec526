"""Pattern rewrites on the Dynamo graph, before AOTAutograd (issue 15).

Each rewrite is a module with one job; `rewrite` runs the enabled ones in order and
returns what each did or why it refused (`PatternRecord`, plain data).  The records
of every call are also appended to `LOG` (bounded) so `explain` can show them.

- `linear_ce` (knob `linear_ce`): LM head matmul + cross-entropy → the chunked fused
  op of `linear_ce_op`;
- `cross_entropy` (knob `cross_entropy`): a cross-entropy that `linear_ce` left (no LM
  head in sight, or logits used elsewhere) → log-sum-exp form (`cross_entropy_rows`):
  backward keeps the logits and one float per row, not the [R, V] log-probabilities;
- `attention` (knob `attention_sdpa`): math attention (q·kᵀ, scale, mask, softmax,
  dropout, ·v) → `scaled_dot_product_attention`;
- `gemm_epilogue` (knob `gemm_epilogue`, `auto` by default): linear + bias / activation /
  silu·mul / residual / cast → one Triton GEMM with the epilogue (`gemm_op`) where the
  cost model prices that below cuBLAS + a stitched element-wise kernel;
- `masked_setitem` (knob `masked_setitem`): `y[mask] = v` with values that do not vary
  along the mask → `y.copy_(where(mask, v, y))`, so autograd of v traces (issue 18).
"""
from __future__ import annotations

import warnings
from typing import Any, Sequence

import torch.fx as fx

from .. import config
from .common import PatternRecord

LOG: list[PatternRecord] = []
_LOG_MAX = 1000


def rewrite(gm: fx.GraphModule, example_inputs: Sequence[Any] | None = None) -> list[PatternRecord]:
    """Apply the enabled rewrites to gm in place; return their records."""
    from . import attention, cross_entropy, gemm_epilogue, linear_ce, masked_setitem
    from .common import positional
    records: list[PatternRecord] = []
    moved = positional(gm)   # (the matchers read operands by position)
    # cross_entropy after linear_ce: a loss the fused LM head took is no longer there
    for knob, module in (("linear_ce", linear_ce), ("cross_entropy", cross_entropy), ("attention_sdpa", attention),
                         ("gemm_epilogue", gemm_epilogue), ("masked_setitem", masked_setitem)):
        if config.get(knob) in (False, None, "off"):   # (gemm_epilogue is off / auto / on)
            continue
        try:
            records += module.rewrite(gm)
        except Exception as e:  # a bug in a rewrite must not cost the user the compile
            if not config.get("fallback_on_error"):
                raise
            warnings.warn(f"stitchml: pattern {knob} failed: {type(e).__name__}: {e}", stacklevel=2)
            records.append(PatternRecord(knob, False, "<graph>", f"internal error: {type(e).__name__}: {e}"))
    if moved or any(r.applied for r in records):
        gm.graph.lint()
        gm.recompile()
    LOG.extend(records)
    del LOG[:-_LOG_MAX]
    return records


__all__ = ["rewrite", "LOG", "PatternRecord"]
