"""The gradient scaler's two ops (`torch.amp.GradScaler`), for a compiled training step
that unscales and updates the scale inside the graph.  Both ran eagerly with "no lowering
rule".  AOTAutograd hands us their functional forms:

- `_amp_foreach_non_finite_check_and_unscale(grads, found_inf, inv_scale)`: every
  gradient times `inv_scale` (eager skips the product when it is 1, which leaves the
  same values), and `found_inf` set to 1 when any gradient holds a non-finite value,
  left as it was otherwise (eager never clears it);
- `_amp_update_scale(scale, growth_tracker, found_inf, growth, backoff, interval)`: after
  an overflow the scale times `backoff` and the tracker 0; else the tracker counts up and
  at `interval` the scale grows by `growth` (kept only if finite) and the tracker restarts.
  Eager multiplies the float32 scale by the double factor and rounds once: so here."""
from __future__ import annotations

from typing import Sequence

import torch

aten = torch.ops.aten


def non_finite_check_and_unscale(grads: Sequence[torch.Tensor], found_inf: torch.Tensor,
                                 inv_scale: torch.Tensor) -> tuple[list[torch.Tensor], torch.Tensor]:
    # (a half gradient is scaled in float32 and rounded once: eager's opmath)
    out = [(g.float() * inv_scale).to(g.dtype) if g.dtype in (torch.float16, torch.bfloat16) else g * inv_scale
           for g in grads]
    bad = [(~torch.isfinite(g)).any() for g in grads]
    if not bad:
        return out, found_inf.clone()
    any_bad = torch.stack(bad).any()
    return out, torch.where(any_bad, torch.ones_like(found_inf), found_inf)


def update_scale(scale: torch.Tensor, growth_tracker: torch.Tensor, found_inf: torch.Tensor, growth: float,
                 backoff: float, interval: int) -> tuple[torch.Tensor, torch.Tensor]:
    overflow = found_inf != 0
    grown = (scale.double() * growth).to(scale.dtype)
    count = growth_tracker + 1
    due = count == interval
    new_scale = torch.where(overflow, (scale.double() * backoff).to(scale.dtype),
                            torch.where(due & torch.isfinite(grown), grown, scale))
    new_tracker = torch.where(overflow | due, torch.zeros_like(growth_tracker), count)
    return new_scale, new_tracker


def table() -> dict:
    return {aten._amp_foreach_non_finite_check_and_unscale.default: non_finite_check_and_unscale,
            aten._amp_update_scale.default: update_scale}
