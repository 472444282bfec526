"""Rewrite: cross-entropy on [rows, classes] logits → log-sum-exp form.

Matched on the Dynamo graph (before AOTAutograd), after `linear_ce` has had its
chance (a loss it fused is gone by then):

    loss = cross_entropy(x, t, ignore_index=, label_smoothing=, reduction=)
         | nll_loss(log_softmax(x, -1), t, ignore_index=, reduction=)

with x [R, V] floating and t [R] class indices, becomes `cross_entropy_rows(x, t, ...)`,
plain torch ops that AOTAutograd traces:

    lse  = logsumexp(x, -1)                                   # row max + sum(exp(x - max))
    nll  = nll_loss(x, t, reduction='none')  = -x[r, t[r]]    # 0 on ignored rows
    row  = where(t != ignore_index, lse - ε·mean(x, -1), 0) + (1 - ε)·nll
    loss = row | sum(row) | sum(row) / count(t != ignore_index)

Autograd of log_softmax saves its [R, V] output; here the backward needs only x
(alive anyway), lse [R] and t, and its gradient
(exp(x - lse) - (1-ε)·onehot(t) - ε/V)·scale is one point-wise kernel over x.  The
forward reads x once (`capture/decomp.py::logsumexp` is an online pair, the row mean
and the target's logit join the same pass): about 3 passes over [R, V] for forward +
backward instead of 6.  Unlike `linear_ce`, x may have other users.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.fx as fx
import torch.nn.functional as F

from .common import (PatternRecord, Refused, arg, is_loss, is_number, kind, rewrite_matches, same_shape, show,
                     sizes, value)

REDUCTIONS = ("mean", "sum", "none")


@dataclass
class Match:
    loss: fx.Node
    x: fx.Node
    target: fx.Node
    log_softmax: fx.Node | None       # the nll_loss form's log_softmax, erased with the loss
    ignore_index: int = -100
    label_smoothing: float = 0.0
    reduction: str = "mean"


def cross_entropy_rows(x: torch.Tensor, target: torch.Tensor, ignore_index: int = -100,
                       label_smoothing: float = 0.0, reduction: str = "mean") -> torch.Tensor:
    """F.cross_entropy(x, target, ...) for x [R, V] and class indices target [R], in
    ops whose autograd keeps no [R, V] value.  Row values are combined in float32
    (float64 for float64 x); the loss comes back in x's dtype, as eager's does."""
    cd = torch.float32 if x.dtype in (torch.float16, torch.bfloat16) else x.dtype
    eps = float(label_smoothing)
    valid = target != ignore_index
    shift = torch.logsumexp(x, -1).to(cd)
    if eps:
        shift = shift - eps * x.to(cd).mean(-1)
    # nll_loss of the logits themselves is -x[r, t[r]] (0 on ignored rows), not a gather:
    # its backward is a one-hot scatter, stitched point-wise, where gather's is a
    # scatter-add (atomics into a zeroed [R, V] buffer, float32 only).
    nll = F.nll_loss(x, target, ignore_index=ignore_index, reduction="none").to(cd)
    rows = torch.where(valid, shift, 0.0) + (1.0 - eps) * nll
    if reduction == "none":
        return rows.to(x.dtype)
    total = rows.sum()
    if reduction == "mean":
        total = total / valid.sum()   # 0 / 0 = NaN when every row is ignored, as eager
    return total.to(x.dtype)


def _log_softmax_dtype(node: fx.Node):
    # F.log_softmax(input, dim, _stacklevel, dtype); torch.log_softmax / Tensor.log_softmax(input, dim, dtype)
    return arg(node, 3 if node.target is F.log_softmax else 2, "dtype")


def match(loss: fx.Node) -> Match:
    k = kind(loss)
    if arg(loss, 2, "weight") is not None:
        raise Refused("class weights are not supported")
    if arg(loss, 3, "size_average") is not None or arg(loss, 5, "reduce") is not None:
        raise Refused("legacy size_average/reduce arguments")
    reduction = arg(loss, 6, "reduction", "mean")
    if reduction not in REDUCTIONS:
        raise Refused(f"reduction={reduction!r} is not one of {', '.join(REDUCTIONS)}")
    ignore = arg(loss, 4, "ignore_index", -100)
    smooth = arg(loss, 7, "label_smoothing", 0.0) if k == "cross_entropy" else 0.0
    if not isinstance(ignore, int) or isinstance(ignore, bool) or not is_number(smooth):
        raise Refused("ignore_index / label_smoothing are not constants")
    if not 0.0 <= smooth <= 1.0:
        raise Refused(f"label_smoothing={smooth} is outside [0, 1] (eager raises)")
    inp, target = arg(loss, 0, "input"), arg(loss, 1, "target")
    if not isinstance(inp, fx.Node) or not isinstance(target, fx.Node):
        raise Refused("loss input or target is not a graph value")
    log_softmax = None
    if k == "nll_loss":
        if kind(inp) != "log_softmax":
            raise Refused(f"nll_loss of {inp.name}, not of log_softmax(logits): nothing to fuse")
        if len(inp.users) != 1:
            raise Refused(f"the log-probabilities ({inp.name}) are also used elsewhere: they are materialised "
                          f"anyway")
        log_softmax, inp = inp, inp.args[0]
        if not isinstance(inp, fx.Node):
            raise Refused("log_softmax input is not a graph value")
    xv, tv = value(inp), value(target)
    if xv is None or tv is None:
        raise Refused("loss input or target has no recorded tensor value")
    shape, tshape = sizes(inp), sizes(target)   # (the row count is symbolic under dynamic shapes)
    if not xv.dtype.is_floating_point:
        raise Refused(f"logits dtype {xv.dtype} is not floating")
    if tv.dtype.is_floating_point:
        raise Refused("probability (soft) targets: only class indices are matched")
    if tv.dtype != torch.int64:
        raise Refused(f"target dtype {tv.dtype} is not int64 (eager raises)")
    if len(shape) != 2:
        raise Refused(f"logits of shape {show(shape)}: only [rows, classes] is matched (an N-D input has its "
                      f"class dim at 1)")
    if not same_shape(tshape, shape[:1]):
        raise Refused(f"target of shape {show(tshape)} is not one class index per row of {show(shape)}")
    if any(isinstance(s, int) and s == 0 for s in shape):   # (a symbolic size is never 0 or 1)
        raise Refused(f"empty logits {show(shape)}")
    if log_softmax is not None:
        dim = arg(log_softmax, 1, "dim")
        if dim not in (None, -1, 1):
            raise Refused(f"{log_softmax.name}: log_softmax over dim {dim}, not the class dim")
        dtype = _log_softmax_dtype(log_softmax)
        if dtype not in (None, xv.dtype):
            raise Refused(f"{log_softmax.name}: log_softmax in {dtype} of {xv.dtype} logits (a cast copy would be "
                          f"kept for backward)")
    return Match(loss, inp, target, log_softmax, ignore, float(smooth), reduction)


def apply(gm: fx.GraphModule, m: Match) -> str:
    g = gm.graph
    with g.inserting_before(m.loss):
        new = g.call_function(cross_entropy_rows, (m.x, m.target), dict(
            ignore_index=m.ignore_index, label_smoothing=m.label_smoothing, reduction=m.reduction))
    new.meta.update({k: v for k, v in m.loss.meta.items() if k in ("example_value", "val", "stack_trace",
                                                                     "nn_module_stack", "source_fn_stack")})
    m.loss.replace_all_uses_with(new)
    g.erase_node(m.loss)
    if m.log_softmax is not None and not m.log_softmax.users:
        g.erase_node(m.log_softmax)
    opts = [f"reduction={m.reduction}"]
    if m.ignore_index != -100:
        opts.append(f"ignore_index={m.ignore_index}")
    if m.label_smoothing:
        opts.append(f"label_smoothing={m.label_smoothing}")
    return (f"{m.x.name} {show(sizes(m.x))} -> log-sum-exp cross-entropy ({', '.join(opts)}): backward keeps "
            f"the logits and one float per row, no [rows, classes] log-probabilities")


def rewrite(gm: fx.GraphModule) -> list[PatternRecord]:
    return rewrite_matches(gm, "cross_entropy", is_loss, match, apply)
