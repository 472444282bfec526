"""Rewrite: language-model head + cross-entropy → the chunked fused op.

Matched on the Dynamo graph (before AOTAutograd), from the loss back to the matrix
product:

    logits = linear(h, W, b) | h @ Wᵀ (+ b)
             [softcap: tanh(logits / c) * c]
             [row-preserving views and flattens, token slices (logits[..., :-1, :]), .contiguous(), casts]
    loss   = cross_entropy(logits, target, ignore_index=, label_smoothing=, reduction=mean|sum)
           | nll_loss(log_softmax(logits, -1), target, ...)

becomes `fused_linear_cross_entropy(h', W, b, target, ...)`, where h' is h with the
same token slices and views replayed on it (they never touch the vocabulary dim, so
they select the same tokens from h as from the logits).  Every intermediate must
have exactly one user: logits that are also returned or used elsewhere would have to
exist in full anyway, and the rewrite is refused with that reason.
"""
from __future__ import annotations

import operator
from dataclasses import dataclass, field

import torch
import torch.fx as fx

from .. import config
from .common import (NoMatch, PatternRecord, Refused, arg, is_loss, is_number, kind, only_user, rewrite_matches,
                     same, same_shape, show, sizes, value)
from .linear_ce_op import fused_linear_cross_entropy

_TOKEN_OPS = ("view", "reshape", "flatten", "contiguous", "getitem", "to", "float")
_REGROUPS = ("view", "reshape", "flatten")   # token views, replayed on h as a reshape
_FULL = slice(None, None, None)


@dataclass
class Match:
    loss: fx.Node
    h: fx.Node
    weight: fx.Node                  # [V, D], or [D, V] when weight_transposed
    weight_transposed: bool
    bias: fx.Node | None
    target: fx.Node
    replay: list[fx.Node]            # token views/slices, from the matmul outwards
    dead: list[fx.Node] = field(default_factory=list)  # the chain, loss first
    ignore_index: int = -100
    label_smoothing: float = 0.0
    softcap: float = 0.0
    reduction: str = "mean"


def _loss_args(node: fx.Node, k: str) -> dict:
    # F.cross_entropy(input, target, weight, size_average, ignore_index, reduce, reduction, label_smoothing)
    # F.nll_loss     (input, target, weight, size_average, ignore_index, reduce, reduction)
    if arg(node, 2, "weight") is not None:
        raise Refused("class weights are not supported")
    if arg(node, 3, "size_average") is not None or arg(node, 5, "reduce") is not None:
        raise Refused("legacy size_average/reduce arguments")
    reduction = arg(node, 6, "reduction", "mean")
    if reduction not in ("mean", "sum"):
        raise Refused(f"reduction={reduction!r}: the fused op needs the gradient's scale in the forward pass "
                      f"(mean or sum)")
    ignore = arg(node, 4, "ignore_index", -100)
    smooth = arg(node, 7, "label_smoothing", 0.0) if k == "cross_entropy" else 0.0
    if not isinstance(ignore, int) or not is_number(smooth):
        raise Refused("ignore_index / label_smoothing are not constants")
    return dict(ignore_index=ignore, label_smoothing=float(smooth), reduction=reduction)


def _keeps_last_dim(index, ndim: int) -> bool:
    """Whether a getitem index leaves the last dim whole (only basic indexing)."""
    idx = index if isinstance(index, tuple) else (index,)
    for e in idx:
        if e is Ellipsis or isinstance(e, int):
            continue
        if not isinstance(e, slice) or not all(b is None or isinstance(b, int) for b in (e.start, e.stop, e.step)):
            return False  # None (new axis), tensors, symbolic bounds
    if Ellipsis in idx:
        after = idx[idx.index(Ellipsis) + 1:]
        return not after or after[-1] == _FULL
    return len(idx) < ndim or idx[ndim - 1] == _FULL


def _softcap(mul: fx.Node) -> tuple[float, fx.Node, list[fx.Node]] | None:
    """mul(tanh(x / c), c) (either operand order, or x * (1/c) inside) → (c, x, nodes)."""
    a, b = mul.args[0], mul.args[1] if len(mul.args) > 1 else None
    tanh_node, c = (a, b) if kind(a) == "tanh" else (b, a) if kind(b) == "tanh" else (None, None)
    if tanh_node is None or not is_number(c) or c <= 0:
        return None
    inner = tanh_node.args[0]
    k = kind(inner)
    if k not in ("div", "mul") or not isinstance(inner.args[0], fx.Node) or not is_number(inner.args[1]):
        return None
    scale = 1.0 / inner.args[1] if k == "div" else inner.args[1]
    if abs(scale * c - 1.0) > 1e-6:
        return None
    return float(c), inner.args[0], [tanh_node, inner]


def match(loss: fx.Node) -> Match:
    if not _product_above(loss.args[0], 10):
        raise NoMatch()  # no LM head in sight: nothing to record
    k = kind(loss)
    opts = _loss_args(loss, k)
    logits_in, target = loss.args[0], arg(loss, 1, "target")
    n_v = sizes(logits_in)   # (the token count is symbolic under dynamic shapes)
    if len(n_v) != 2:
        raise Refused(f"loss input has shape {show(n_v)}: only [tokens, classes] (class dim last) is matched")
    if len(sizes(target)) != 1:
        raise Refused("target is not one class index per token")
    vocab = n_v[1]
    chain: list[fx.Node] = []
    replay: list[fx.Node] = []
    softcap, seen_log_softmax = 0.0, False
    cur, consumer = logits_in, loss
    while True:
        if not isinstance(cur, fx.Node):
            raise Refused("loss input is not a graph value")
        only_user(cur, "the logits")
        ck = kind(cur)
        shape = sizes(cur)
        if ck in ("linear", "matmul") or (ck == "add" and kind(cur.args[0]) == "matmul"):
            break
        if not same(shape[-1], vocab):
            raise Refused(f"{cur.name} changes the class dim ({show(shape)})")
        if ck in _TOKEN_OPS:
            src = cur.args[0]
            if ck in ("to", "float"):
                v, s = value(cur), value(src)
                if v is None or s is None or not v.dtype.is_floating_point or v.device != s.device:
                    raise Refused(f"{cur.name}: a cast to {getattr(v, 'dtype', '?')} is not a float upcast/downcast")
            elif ck == "getitem" and not _keeps_last_dim(cur.args[1], len(sizes(src))):
                raise Refused(f"{cur.name} indexes the class dim or uses advanced indexing")
            elif ck in _REGROUPS and not same(sizes(src)[-1], vocab):
                raise Refused(f"{cur.name} regroups the class dim")
            elif ck in _REGROUPS and not _replayable(shape):
                raise Refused(f"{cur.name} regroups symbolic token dims ({show(shape)}): only a flattening to "
                              f"[tokens, classes] is replayed on h")
            if ck in _REGROUPS + ("getitem",):
                replay.append(cur)
            chain.append(cur)
            cur = src
        elif ck == "log_softmax" and k == "nll_loss" and not seen_log_softmax:
            dim = arg(cur, 1, "dim")
            if dim not in (-1, len(shape) - 1) or arg(cur, 2, "dtype") not in (None, torch.float32):
                raise Refused(f"{cur.name}: log_softmax is not over the class dim")
            seen_log_softmax = True
            chain.append(cur)
            cur = cur.args[0]
        elif ck == "mul" and softcap == 0.0 and (sc := _softcap(cur)) is not None:
            softcap, x, nodes = sc
            chain.append(cur)
            for m in nodes:
                only_user(m, "the soft-capped logits")
                chain.append(m)
            cur = x
        else:
            if not _product_above(cur, 4):
                raise NoMatch()  # a loss on logits that no matrix product in sight computed
            raise Refused(f"{cur.name} ({ck or cur.target}) between the matrix product and the loss is not part of "
                          f"the pattern")
    if k == "nll_loss" and not seen_log_softmax:
        raise Refused("nll_loss without log_softmax of the logits")
    bias = None
    ck = kind(cur)
    if ck == "add":  # h @ Wᵀ + b
        mm, bias = cur.args[0], cur.args[1]
        if not isinstance(bias, fx.Node) or not same_shape(sizes(bias), (vocab,)):
            raise Refused(f"{cur.name} adds something other than a bias of the class dim")
        chain.append(cur)
        only_user(mm, "the logits")
        cur = mm
        ck = "matmul"
    chain.append(cur)
    h = cur.args[0]
    if not isinstance(h, fx.Node) or len(sizes(h)) < 2:
        raise Refused("the matrix product's left operand is not a batch of token vectors")
    dim = sizes(h)[-1]
    if not isinstance(dim, int):
        raise Refused(f"the hidden size {dim} is symbolic")
    if ck == "linear":
        weight, transposed = cur.args[1], False
        lin_bias = arg(cur, 2, "bias")
        if lin_bias is not None:
            if bias is not None:
                raise Refused("two biases")
            bias = lin_bias
    else:
        weight, transposed = cur.args[1], True
    w_shape = sizes(weight)
    if not same_shape(w_shape, (dim, vocab) if transposed else (vocab, dim)):
        raise Refused(f"weight shape {show(w_shape)} is not a [{vocab}, {dim}] matrix")
    hv, wv = value(h), value(weight)
    if hv.dtype != wv.dtype or not hv.dtype.is_floating_point or hv.dtype == torch.float64:
        raise Refused(f"dtypes {hv.dtype} x {wv.dtype}: only one of float32, bfloat16, float16")
    if transposed and kind(weight) in ("t", "getattr", "transpose") and _plain_transpose(weight):
        weight, transposed = weight.args[0], False  # h @ W.T: use W itself
    replay.reverse()
    return Match(loss, h, weight, transposed, bias, target, replay, [loss] + chain, softcap=softcap, **opts)


def _static(shape: tuple) -> bool:
    return all(isinstance(d, int) for d in shape)


def _replayable(shape: tuple) -> bool:
    """A token view the rewrite can replay on h: static sizes, or a flattening to
    [tokens, classes] (reshaped with -1: a SymInt cannot be written into the graph)."""
    return _static(shape[:-1]) or len(shape) == 2


def _product_above(node, depth: int) -> bool:
    """Whether a linear / matmul feeds node within depth ops."""
    if not isinstance(node, fx.Node):
        return False
    if kind(node) in ("linear", "matmul"):
        return True
    return depth > 0 and any(_product_above(a, depth - 1) for a in node.all_input_nodes)


def _plain_transpose(node: fx.Node) -> bool:
    """Whether `node` is the transpose of a matrix (`t`, `.T` / `.mT`, `transpose(0, 1)`);
    False for anything else, a graph input among them."""
    k = kind(node)
    if k not in ("t", "getattr", "transpose") or not node.args or not isinstance(node.args[0], fx.Node) \
            or len(sizes(node.args[0])) != 2:
        return False
    if k == "t":
        return True
    if k == "getattr":
        return node.args[1] in ("T", "mT")
    return k == "transpose" and sorted(a % 2 for a in node.args[1:3]) == [0, 1]


def apply(gm: fx.GraphModule, m: Match) -> str:
    g = gm.graph
    dim = sizes(m.h)[-1]
    out_dtype = value(m.loss).dtype
    chunk = int(config.get("linear_ce_chunk"))
    with g.inserting_before(m.loss):
        weight = g.call_function(torch.t, (m.weight,)) if m.weight_transposed else m.weight
        h = m.h
        for op in m.replay:  # the same tokens, taken from h instead of the logits
            if kind(op) == "getitem":
                h = g.call_function(operator.getitem, (h, op.args[1]))
            else:
                lead = sizes(op)[:-1]   # (symbolic: a flattening to [tokens, classes], `_replayable`)
                h = g.call_function(torch.reshape, (h, (lead if _static(lead) else (-1,)) + (dim,)))
        fused = g.call_function(fused_linear_cross_entropy, (h, weight, m.bias, m.target), dict(
            ignore_index=m.ignore_index, label_smoothing=m.label_smoothing, softcap=m.softcap,
            reduction=m.reduction, chunk=chunk, out_dtype=out_dtype,
            fp32_grad_w=bool(config.get("linear_ce_fp32_grad_w")),
            grads_in_forward=bool(config.get("linear_ce_grads_in_forward"))))
    fused.meta.update({k: v for k, v in m.loss.meta.items() if k in ("example_value", "val", "stack_trace",
                                                                       "nn_module_stack", "source_fn_stack")})
    m.loss.replace_all_uses_with(fused)
    for node in m.dead:
        if not node.users:
            g.erase_node(node)
    opts = [f"reduction={m.reduction}"]
    if m.ignore_index != -100:
        opts.append(f"ignore_index={m.ignore_index}")
    if m.label_smoothing:
        opts.append(f"label_smoothing={m.label_smoothing}")
    if m.softcap:
        opts.append(f"softcap={m.softcap}")
    if m.bias is not None:
        opts.append("bias")
    return (f"{m.h.name} x {m.weight.name} -> chunked cross-entropy ({', '.join(opts)}; "
            f"chunk={'auto' if chunk <= 0 else chunk} tokens): the [tokens, vocab] logits are never materialised")


def rewrite(gm: fx.GraphModule) -> list[PatternRecord]:
    return rewrite_matches(gm, "linear_ce", is_loss, match, apply)
