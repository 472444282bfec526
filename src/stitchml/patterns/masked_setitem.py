"""Rewrite: a boolean-mask write of values that do not vary along the mask → a where.

Matched on the Dynamo graph (before AOTAutograd):

    y[mask] = v      y[:, mask] = v      y[:, mask, :] = v       (operator.setitem)
    y.index_put_((mask,), v, accumulate)     y.index_put((mask,), v, accumulate)
    torch.index_put(_)(y, (mask,), v, accumulate)

with one boolean mask over some of y's dims (after full slices) and v a number or a
tensor that broadcasts over the selected positions (one value, or one row for every
selected position: wav2vec2's `hidden[mask_time_indices] = masked_spec_embed`, a mask
token).  It becomes `masked_write(y, mask, v, pos, accumulate, inplace)`:

    w = where(mask viewed over y's dims, v, y)      (accumulate: y + where(mask, v, 0))
    y.copy_(w)  for the in-place forms,  w  for the functional one

An in-place write stays a write (y's other users and aliases see it); the value is one
point-wise kernel.  Left alone, the forward would be stitched the same way
(`capture/decomp.py::index_put_masked`), but autograd records `index_put`'s own
backward, whose gradient for v is `grad[mask]`: a data-dependent shape (`nonzero`)
that AOTAutograd cannot trace, so the graph broke there whenever v required grad.
Values given per selected element (v of shape [count, ...]) depend on how many the
mask selects at run time: refused, and left to eager (which checks the count).
"""
from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx as fx

from .common import (NoMatch, PatternRecord, Refused, arg, is_number, required_equal, rewrite_matches, same, show,
                     value)

@dataclass
class Match:
    node: fx.Node
    y: fx.Node
    mask: fx.Node
    values: Any
    pos: int            # how many full slices come before the mask
    accumulate: bool
    inplace: bool


def masked_write(y: torch.Tensor, mask: torch.Tensor, values: Any, pos: int, accumulate: bool = False,
                 inplace: bool = True) -> torch.Tensor:
    """`y[(slice(None),) * pos + (mask,)] = values` (`+=` with `accumulate`) for values
    that do not vary along the mask's dims, as a where; written back into y when
    `inplace`."""
    rest = y.dim() - pos - mask.dim()
    m = mask.reshape((1,) * pos + tuple(mask.shape) + (1,) * rest)
    if isinstance(values, torch.Tensor):
        rank = pos + 1 + rest   # the indexed result: y's dims with the mask's replaced by one
        v = values.reshape((1,) * (rank - values.dim()) + tuple(values.shape))
        values = v.reshape(tuple(v.shape[:pos]) + (1,) * mask.dim() + tuple(v.shape[pos + 1:])).to(y.dtype)
    if accumulate:   # (y + where(m, v, 0) would turn the untouched -0.0s into +0.0)
        w = torch.where(m, y + values, y)
    else:
        w = torch.where(m, values, y)
    return y.copy_(w) if inplace else w


def refusal(y: torch.Tensor, mask: torch.Tensor, pos: int, values: torch.Tensor | None,
            accumulate: bool) -> str | None:
    """Why `y[(slice(None),) * pos + (mask,)] = values` is not a where, or None; `values`
    None for a number.  Sizes may be SymInts (compared by `same`, never specialised):
    this rewrite and the decomposition of the ATen op (`capture/decomp.py`) share it."""
    yshape, mshape = tuple(y.shape), tuple(mask.shape)
    if not mshape:
        return "a 0-d mask"
    if len(yshape) < pos + len(mshape) or not all(required_equal(a, b) for a, b in zip(yshape[pos:], mshape)):
        return f"mask of shape {show(mshape)} does not cover dims {pos}.. of {show(yshape)}"
    if accumulate and y.dtype == torch.bool:
        return "accumulate into a bool tensor"
    if values is None:
        return None
    vshape = tuple(values.shape)
    rank = len(yshape) - len(mshape) + 1   # the indexed result: y's dims with the mask's replaced by one
    if len(vshape) > rank:
        return f"values of shape {show(vshape)} have more dims than the indexed result"
    if vshape and values.dtype != y.dtype:   # (eager casts 0-d values only)
        return f"values of dtype {values.dtype} into {y.dtype}: eager raises"
    full = (1,) * (rank - len(vshape)) + vshape
    if not same(full[pos], 1):
        return (f"values of shape {show(vshape)} give one value per selected element: how many the mask "
                f"selects is known only at run time (eager checks it)")
    written = full[:pos] + (1,) * len(mshape) + full[pos + 1:]
    if not all(same(w, 1) or same(w, d) for w, d in zip(written, yshape)):
        return f"values of shape {show(vshape)} do not broadcast to the indexed result"
    return None


def _full_slice(s: Any) -> bool:
    return isinstance(s, slice) and s.start is None and s.stop is None and s.step is None


_INDEX_PUT = {"index_put_": True, "index_put": False, torch.index_put_: True, torch.index_put: False}


def _wanted(n: fx.Node) -> bool:
    if n.op == "call_function":
        return n.target is operator.setitem or n.target in (torch.index_put_, torch.index_put)
    return n.op == "call_method" and n.target in ("index_put_", "index_put")


def match(node: fx.Node) -> Match:
    if node.target is operator.setitem:
        y, idx, v = node.args
        accumulate, inplace = False, True
        parts = list(idx) if isinstance(idx, tuple) else [idx]
    else:
        y, idx, v = arg(node, 0, "input"), arg(node, 1, "indices"), arg(node, 2, "values")
        accumulate, inplace = arg(node, 3, "accumulate", False), _INDEX_PUT[node.target]
        if not isinstance(idx, (tuple, list)) or not isinstance(accumulate, bool):
            raise NoMatch
        parts = list(idx)
    tensors = [i for i, p in enumerate(parts) if isinstance(p, fx.Node)]
    if len(tensors) != 1:
        raise NoMatch
    pos = tensors[0]
    mask = parts[pos]
    mv = value(mask)
    if mv is None or mv.dtype != torch.bool:
        raise NoMatch   # integer indices: index_put's own rule
    if node.target is not operator.setitem and len(parts) != 1:
        raise NoMatch
    if not all(_full_slice(p) for i, p in enumerate(parts) if i != pos):
        raise Refused("other indices beside the mask are not full slices")
    if isinstance(v, fx.Node) and value(v) is None or value(y) is None:
        raise Refused("the target or the values have no recorded tensor value")
    if not isinstance(v, fx.Node) and not (is_number(v) or isinstance(v, bool)):
        raise Refused(f"values of type {type(v).__name__}")
    why = refusal(value(y), mv, pos, value(v) if isinstance(v, fx.Node) else None, accumulate)
    if why is not None:
        raise Refused(why)
    return Match(node, y, mask, v, pos, accumulate, inplace)


def apply(gm: fx.GraphModule, m: Match) -> str:
    g = gm.graph
    with g.inserting_before(m.node):
        new = g.call_function(masked_write, (m.y, m.mask, m.values, m.pos, m.accumulate, m.inplace))
    new.meta.update({k: v for k, v in m.node.meta.items() if k in ("example_value", "val", "stack_trace",
                                                                     "nn_module_stack", "source_fn_stack")})
    # (setitem's result is None and unused; index_put(_) returns the written tensor)
    m.node.replace_all_uses_with(new if m.node.target is not operator.setitem else m.y)
    g.erase_node(m.node)
    what = "+=" if m.accumulate else "="
    return f"y[{'..., ' if m.pos else ''}mask] {what} v written as a where (autograd-traceable)"


def rewrite(gm: fx.GraphModule) -> list[PatternRecord]:
    return rewrite_matches(gm, "masked_setitem", _wanted, match, apply)
