"""Random ops of a recomputed region: activation checkpointing inside a compiled model.

AOTAutograd's partitioner (`functionalize_rng_ops`) wraps each random op that the
backward recomputes: the forward graph calls `run_and_save_rng_state(op, *args)`, which
returns `(state, op's result)`, and the backward `run_with_rng_state(state, op, *args)`,
which returns the op's result drawn again from the saved state.  Both are lowered here,
so that the random op is stitched in both graphs, or in neither:

- forward: `state` is an eager step (`runtime.steps.CaptureRngState`: the generator's
  state, marked, then the generator advanced by one draw); the op is lowered by its own
  rule and each of its random nodes takes `state` as its argument: its kernel seed is a
  hash of the state's bytes (`runtime.steps.state_seed`), computed when the kernel
  launches;
- backward: the op lowered by the same rule, its random nodes taking the saved state:
  the same seeds, hence the same numbers; the generator is left alone (eager restores it).
- an op its rule refuses runs eagerly as the wrapped op (the higher-order op itself),
  in both graphs: whether the rule refuses depends only on the op, its scalar arguments
  and its arguments' shapes and dtypes, which the two graphs share.  A whole graph that
  runs eagerly cannot pair an eager mask with a stitched one either: the stitched state
  carries `RNG_STATE_MARK`, which eager's `run_with_rng_state` refuses (wrong size) and
  without which `state_seed` refuses to seed a kernel.
"""
from __future__ import annotations

import dataclasses
import operator
from typing import Any

import torch
import torch.fx as fx
from torch._prims.rng_prims import run_and_save_rng_state, run_with_rng_state

from ..ir import nodes as ir
from ..ir.nodes import Ref
from ..runtime.steps import CaptureRngState
from .context import static_shape
from .registry import Unsupported

HOPS = frozenset({run_and_save_rng_state, run_with_rng_state})
# (what `explain` says of the eager step; not a fallback: the random op itself is stitched)
SAVE_REASON = "saves the generator's state, from which a checkpointed random op and its recomputation are seeded"


class _Wrapped:
    """The wrapped op as rules see an FX node: target, FX arguments, metadata."""

    def __init__(self, hop_node: fx.Node, op: Any, args: tuple, kwargs: dict, val: Any):
        self.target, self.args, self.kwargs = op, tuple(args), dict(kwargs)
        self.meta = {"val": val}
        self.name = f"{hop_node.name}_op"

    @property
    def all_input_nodes(self) -> list[fx.Node]:
        found: list[fx.Node] = []
        fx.node.map_arg((self.args, self.kwargs), found.append)
        return list(dict.fromkeys(found))


def _op_value(op: Any, args: tuple, kwargs: dict) -> Any:
    """The wrapped op's result as fake tensors, propagated from its arguments' metadata
    (the backward's node carries none; the forward's is computed the same way so that
    both graphs decide from the same data)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    def meta(n: fx.Node) -> Any:
        if "val" not in n.meta:
            raise Unsupported(f"argument {n.name} of the wrapped random op has no metadata")
        return n.meta["val"]

    vals = fx.node.map_arg((args, kwargs), meta)
    try:
        with FakeTensorMode():
            def fake(v: Any) -> Any:
                if isinstance(v, torch.Tensor):
                    return torch.empty_strided(static_shape(v), tuple(int(s) for s in v.stride()),
                                               dtype=v.dtype, device=v.device)
                return v
            fargs, fkwargs = torch.utils._pytree.tree_map(fake, vals)
            return op(*fargs, **fkwargs)
    except Unsupported:
        raise
    except Exception as e:
        raise Unsupported(f"the wrapped op's result could not be inferred ({type(e).__name__}: {e})") from e


def _device(val: Any) -> torch.device:
    for t in torch.utils._pytree.tree_leaves(val):
        if isinstance(t, torch.Tensor):
            if t.device.type != "cpu" and not hasattr(getattr(torch, t.device.type, None), "get_rng_state"):
                raise Unsupported(f"no RNG state to save on device {t.device}")
            return t.device
    raise Unsupported("the wrapped op returns no tensor")


def lower(lw: Any, node: fx.Node, args: tuple, kwargs: dict) -> Any:
    """IR of `run_and_save_rng_state` (a tuple: the state, the op's result) or
    `run_with_rng_state` (the op's result); `lw` is the `Lowerer`."""
    g = lw.g
    save = node.target is run_and_save_rng_state
    skip = 1 if save else 2
    op, op_args, fx_args = args[skip - 1], args[skip:], node.args[skip:]
    state = None if save else args[0]
    mark = len(g.nodes)
    val = None
    try:
        if save:
            # AOTAutograd gives the saved state a symbolic size, which the backward's input
            # of it shares; it is a fixed number of bytes: fixed here (a guard), so the
            # backward's sizes do not depend on it
            for user in node.users:
                if user.target is operator.getitem and user.args[1] == 0 and "val" in user.meta:
                    static_shape(user.meta["val"])
        elif not isinstance(state, Ref):
            raise Unsupported(f"the saved RNG state is a {type(state).__name__}, not a tensor of the graph")
        if not isinstance(op, torch._ops.OpOverload):
            raise Unsupported(f"the wrapped op {op} is not an ATen operator")
        val = _op_value(op, fx_args, node.kwargs)
        device = _device(val)
        if save:
            capture = CaptureRngState(device)
            state = Ref(g.add(ir.OPAQUE, repr(capture), (), (capture.size(),), torch.uint8, (1,),
                              (("reason", SAVE_REASON), ("multi", False), ("fx_name", f"{node.name}_state"))))
            g.eager_calls[state.id] = (capture, (), {})
        first = len(g.nodes)
        result = lw.apply_rule(_Wrapped(node, op, fx_args, node.kwargs, val), op_args, kwargs)
    except Unsupported as e:
        del g.nodes[mark:]
        for nid in [n for n in g.eager_calls if n >= mark]:
            del g.eager_calls[nid]
        return lw._opaque(node, args, kwargs, f"random op {op} of a recomputed region runs eagerly: {e}",
                          val=(None, val) if save else val)
    rands = [n for n in g.nodes[first:] if n.kind == ir.RAND]
    for k, n in enumerate(rands):  # (the k-th random node of the op: the same in both graphs)
        g.nodes[n.id] = dataclasses.replace(n, args=(state,), attrs=n.attrs + (("rng_stream", k),))
    if save and not rands:  # nothing drawn (dropout in eval mode): eager's state, the generator untouched
        capture = CaptureRngState(device, replay=False)
        g.nodes[state.id] = dataclasses.replace(g[state.id], op=repr(capture), shape=(capture.size(),))
        g.eager_calls[state.id] = (capture, (), {})
    return (state, result) if save else result
