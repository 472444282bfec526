"""Normalisation statistics kept in float32 between a training graph's forward and backward.

On the CPU, eager batch, layer and group norm return their saved mean and inverse std in
the input's dtype, so torch's decompositions (and ours, `decomp._stats_in_eager_dtype`)
round those float32 statistics to bfloat16/float16 when the op's outputs are made.  A graph
that returns them must give eager's dtypes, but in a training graph they are only saved
for the backward, whose decomposition converts them back to float32 and computes
x̂ = (x - mean) * rstd again.  With the mean rounded to 8 bits, that x̂ is not the forward's
wherever the values sit far from zero relative to their spread (few values per channel,
an offset): the backward then differentiates another function than the forward computed.
LeViT in bfloat16 (batch norms over a few tokens) had patch-embedding weight gradients
5.9x their norm off float64 that way, against eager's 0.74x (docs/MODELS-BF16.md).

`keep_precise` rewires, in the joint graph, each backward use of such a rounded statistic
to the float32 value it was rounded from, when that use would have computed in float32
anyway (an explicit conversion back, or arithmetic whose result is float32), through
the views between them.  The rounded value stays for any other use (a graph output:
eager's dtype).  On CUDA eager keeps float32 statistics and nothing here matches.
"""
from __future__ import annotations

import contextlib
from typing import Any

import torch
from torch.fx import GraphModule, Node
from torch.fx.node import map_aggregate

aten = torch.ops.aten
prims = torch.ops.prims

# the ops whose decompositions round their statistics (outermost op: `original_aten`)
_FORWARD = frozenset({
    "native_batch_norm", "_native_batch_norm_legit", "_native_batch_norm_legit_functional",
    "_native_batch_norm_legit_no_training", "_batch_norm_with_update", "_batch_norm_with_update_functional",
    "native_layer_norm", "native_group_norm",
})
_BACKWARD = frozenset({
    "native_batch_norm_backward", "batch_norm_backward", "native_layer_norm_backward", "native_group_norm_backward",
})
_CASTS = frozenset({aten._to_copy.default, prims.convert_element_type.default})
# shape-only ops a statistic passes through on its way to the backward's arithmetic
_VIEWS = frozenset({
    aten.view.default, aten.reshape.default, aten._unsafe_view.default, aten.squeeze.default,
    aten.squeeze.dim, aten.squeeze.dims, aten.unsqueeze.default, aten.expand.default,
    aten.permute.default, aten.t.default, aten.alias.default, aten.detach.default, prims.squeeze.default,
    prims.broadcast_in_dim.default,
})
_HALF = (torch.float16, torch.bfloat16)


def _opname(op: object) -> str | None:
    return getattr(op, "_opname", None)


def _dtype(node: object) -> torch.dtype | None:
    val = node.meta.get("val") if isinstance(node, Node) else None
    return val.dtype if isinstance(val, torch.Tensor) else None


def _rounded_stat(node: Node) -> Node | None:
    """The float32 value `node` rounds to a half type inside a norm's forward decomposition,
    or None."""
    if node.op != "call_function" or node.target not in _CASTS or _dtype(node) not in _HALF:
        return None
    if _opname(node.meta.get("original_aten")) not in _FORWARD:
        return None
    src = node.args[0]
    if not isinstance(src, Node) or _dtype(src) not in (torch.float32, torch.float64):
        return None
    return src


def _takes_precise(user: Node, wide: torch.dtype) -> bool:
    """Whether `user`, inside a norm backward's decomposition, computes in `wide` whatever
    the rounded operand: its result is `wide` (a conversion back, promoted arithmetic)."""
    return (user.op == "call_function" and _opname(user.meta.get("original_aten")) in _BACKWARD
            and user.target not in _VIEWS and _dtype(user) == wide)


def _values(args: Any) -> Any:
    """fx arguments as the values they stand for: nodes as their `meta["val"]` (a fake
    tensor; a SymInt for a symbolic size), what the op is called with for the metadata."""
    return map_aggregate(args, lambda a: a.meta["val"] if isinstance(a, Node) else a)


def keep_precise(joint: GraphModule) -> int:
    """Rewire the backward's float32 uses of rounded norm statistics to the unrounded values
    (module docstring).  Returns how many uses were rewired."""
    graph = joint.graph
    rewired = 0
    for cast in list(graph.nodes):
        src = _rounded_stat(cast)
        if src is None:
            continue
        wide = _dtype(src)
        precise: dict[Node, Node] = {cast: src}

        def widened(node: Node) -> Node:
            # the same view of the unrounded value, with its metadata (dtype `wide`)
            if node not in precise:
                base = widened(node.args[0])
                # (before the view it copies: its base and any symbolic size it reads come first)
                with graph.inserting_before(node):
                    new = graph.call_function(node.target, (base,) + tuple(node.args[1:]), dict(node.kwargs))
                new.meta = dict(node.meta)
                val = node.meta.get("val")
                if isinstance(val, torch.Tensor):
                    fake = getattr(base.meta.get("val"), "fake_mode", None)
                    args, kwargs = _values((base,) + tuple(node.args[1:])), _values(dict(node.kwargs))
                    with fake if fake is not None else contextlib.nullcontext():
                        new.meta["val"] = node.target(*args, **kwargs)
                precise[node] = new
            return precise[node]

        stack = [cast]
        while stack:
            node = stack.pop()
            for user in list(node.users):
                if user.op == "call_function" and user.target in _VIEWS and user.args[0] is node:
                    stack.append(user)
                elif _takes_precise(user, wide):
                    user.replace_input_with(node, widened(node))
                    rewired += 1
        # the rounded chain's nodes no one reads any more (`precise` lists a view after
        # its base: reversed, a view goes before the node it views)
        for node in reversed(list(precise)):
            if not node.users:
                graph.erase_node(node)
    if rewired:
        graph.lint()
        joint.recompile()
    return rewired


__all__ = ["keep_precise"]
