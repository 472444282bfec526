"""Rewrite: a linear layer and the element-wise work after it → one GEMM with a
stitched epilogue (`gemm_op.fused_linear`).

Matched on the Dynamo graph from each `linear(x, W, b)` / `x @ Wᵀ` forward, through
values with exactly one user, in this order (each step optional, at least one):

    + b            a bias of the output dim (when the product has none)
    act            F.gelu (exact or tanh), F.silu, relu
    * m            only after silu: SwiGLU's silu(x W1ᵀ) * (x W3ᵀ); m any same-shaped value
    + r            residual, same shape
    .to(dtype)     a float cast of the result

Whether a match is rewritten is the knob `gemm_epilogue`'s: `on` rewrites every match,
`off` none, and `auto` (the default) prices both ways of running it on the device the
plan is made for (`choose`):

- separate: cuBLAS's product (with the bias in its epilogue when the layer has one) writes
  z, then a stitched element-wise kernel reads z (and the residual / gate) and writes y;
- fused: our Triton GEMM writes y (and z as well when autograd needs it), at the
  device's `triton_gemm_efficiency` of cuBLAS's speed.

The fused form saves a pass over z and a launch, and pays whatever our untuned template
loses to cuBLAS on the product. That loss is only known where `stitchml calibrate`
measured the template on the device (`Device.triton_gemm_source`); on a table value
`auto` keeps every product with cuBLAS, and says so. The separate price is an upper
bound: the planner may fuse the element-wise pass into a neighbour's kernel.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.fx as fx

from .. import config
from ..ir.nodes import prod
from .common import PatternRecord, Refused, arg, concrete_shape, kind, static_shape, value
from .gemm_op import fused_linear
from .linear_ce import _plain_transpose

if TYPE_CHECKING:
    from ..plan.devices import Device

_STAGES = ("bias", "act", "mul", "residual", "cast")
# the ops `_step` can take as an epilogue step, by kind
_ACT_OPS = ("gelu", "silu", "relu")
_BINARY = ("add", "mul")
_CASTS = ("to", "float")
_STEP_KINDS = _ACT_OPS + _BINARY + _CASTS


def _sole_user(node: fx.Node) -> fx.Node | None:
    users = list(node.users)
    return users[0] if len(users) == 1 else None


def _other(node: fx.Node, cur: fx.Node):
    a, b = node.args[0], node.args[1] if len(node.args) > 1 else None
    return b if a is cur else a


def _step(nxt: fx.Node, cur: fx.Node, out_shape, dtype, act: str | None):
    """(stage, payload) when nxt is an epilogue step over cur, else None."""
    k = kind(nxt)
    if k in _ACT_OPS and nxt.args[0] is cur:
        if k == "gelu":
            approx = arg(nxt, 1, "approximate", "none")
            return ("act", "gelu" if approx == "none" else "gelu_tanh" if approx == "tanh" else None)
        if arg(nxt, 1, "inplace", False):
            return None
        return ("act", k)
    if k in _BINARY and len(nxt.args) == 2 and not nxt.kwargs:
        other = _other(nxt, cur)
        ov = value(other)
        if ov is None or ov.dtype != dtype:
            return None
        shape = concrete_shape(ov)   # (a SymInt compared with == would add a guard)
        if shape is None:
            return None
        if k == "add" and shape == (out_shape[-1],):
            return ("bias", other)
        if shape != tuple(out_shape):
            return None
        if k == "mul":
            return ("mul", other) if act == "silu" else None
        return ("residual", other)
    if k in _CASTS:
        v = value(nxt)
        if v is not None and v.dtype.is_floating_point and v.dtype != torch.float64 and v.device == value(cur).device:
            return ("cast", v.dtype)
    return None


def match(node: fx.Node) -> tuple[fx.Node, fx.Node, bool, fx.Node | None, dict[str, object], list[fx.Node]] | None:
    """(x, weight, transposed, bias, steps, chain) for a product with an epilogue, or None."""
    k = kind(node)
    # (operands may come by keyword: I-BERT calls `F.linear(x, weight=..., bias=...)`)
    if k == "linear":
        x, weight, bias, transposed = arg(node, 0, "input"), arg(node, 1, "weight"), arg(node, 2, "bias"), False
    else:
        x, weight, bias, transposed = arg(node, 0, "input"), arg(node, 1, "other"), None, True
    if not isinstance(x, fx.Node) or not isinstance(weight, fx.Node) or value(weight) is None \
            or value(weight).dim() != 2 or value(x) is None or value(x).dim() < 2:
        return None  # not a linear layer (batched matmul, vector product)
    first = _sole_user(node)
    if first is None or kind(first) not in _STEP_KINDS:
        return None   # no epilogue to fuse (a product in a dynamic graph is not refused for its sizes)
    out_shape = static_shape(node)
    dtype = value(node).dtype
    steps: dict[str, object] = {}
    chain: list[fx.Node] = []
    cur, last_stage = node, -1
    while (nxt := _sole_user(cur)) is not None:
        st = _step(nxt, cur, out_shape, dtype, steps.get("act"))
        if st is None or st[1] is None or _STAGES.index(st[0]) <= last_stage:
            break
        if st[0] == "bias" and bias is not None:
            break
        if st[0] == "bias":
            bias = st[1]
        steps[st[0]] = st[1]
        last_stage = _STAGES.index(st[0])
        chain.append(nxt)
        cur = nxt
        if st[0] == "cast":
            break
    if cur is node:
        return None
    if value(x).dtype != value(weight).dtype or dtype not in (torch.float32, torch.bfloat16, torch.float16):
        raise Refused(f"dtypes {value(x).dtype} x {value(weight).dtype}: only float32, bfloat16, float16")
    if transposed and _plain_transpose(weight):
        weight, transposed = weight.args[0], False
    return x, weight, transposed, bias, steps, chain


@dataclass(frozen=True)
class Choice:
    """The cost model's verdict on one match (plain data: tests read it)."""

    fused: bool
    fused_s: float        # Triton GEMM with the epilogue (0 where not priced)
    separate_s: float     # cuBLAS + the element-wise pass
    reason: str


def choose(x: fx.Node, weight: fx.Node, transposed: bool, steps: dict, need_grad: bool,
           dev: Device | None = None) -> Choice:
    """Price a match both ways on `dev` (default: the device plans are made for);
    `need_grad`: autograd will need the pre-activation z (the fused form writes it too)."""
    from ..plan.devices import current_device
    from ..plan.library_cost import gemm_seconds
    dev = dev or current_device()
    xs, ws = concrete_shape(value(x)), concrete_shape(value(weight))
    if xs is None or ws is None:
        return Choice(False, 0.0, 0.0, "sizes are symbolic: kept with cuBLAS (priced only at static sizes)")
    m, k = prod(xs[:-1]), xs[-1]
    n = ws[1] if transposed else ws[0]
    dtype = value(x).dtype
    item = dtype.itemsize
    out_item = steps["cast"].itemsize if "cast" in steps else item
    gap = dev.graph_launch_s if dev.replay else dev.launch_s
    mn = m * n
    operands = (m * k + n * k) * item
    extra = mn * item * (("residual" in steps) + ("mul" in steps)) + (n * item if "bias" in steps else 0)
    cublas = gemm_seconds(1, m, n, k, dtype, dev, True, operands + mn * item) + gap
    # the element-wise kernel: z in, the residual / gate / bias in, y out
    separate = cublas + (mn * item + extra + mn * out_item) / dev.bandwidth + gap
    # the epilogue's own traffic (the residual / gate in, z out for autograd) added to the
    # product's time: our template does not overlap its stores with other tiles' work
    fused = (gemm_seconds(1, m, n, k, dtype, dev, True, operands + mn * out_item) / max(dev.triton_gemm_efficiency, 0.05)
             + (extra + (mn * item if need_grad else 0)) / dev.bandwidth + gap)
    figures = (f"[{m}x{k}]·[{k}x{n}] on {dev.name}: Triton GEMM + epilogue {fused * 1e6:.1f} µs, "
               f"cuBLAS + element-wise kernel {separate * 1e6:.1f} µs")
    if dev.triton_gemm_source != "calibrated":
        return Choice(False, fused, separate,
                      f"kept with cuBLAS: our GEMM template's speed on {dev.name} is a table guess "
                      f"({dev.triton_gemm_efficiency:.2f} of cuBLAS), not measured (`stitchml calibrate`); {figures}")
    if fused < separate:
        return Choice(True, fused, separate, f"cost model: {figures}")
    return Choice(False, fused, separate, f"kept with cuBLAS, cost model: {figures}")


def rewrite(gm: fx.GraphModule) -> list[PatternRecord]:
    g = gm.graph
    records = []
    mode = config.off_auto_on(config.get("gemm_epilogue"))
    for node in list(g.nodes):
        if node.graph is not g or kind(node) not in ("linear", "matmul"):
            continue
        try:
            m = match(node)
        except Refused as e:
            records.append(PatternRecord("gemm_epilogue", False, node.name, str(e)))
            continue
        if m is None:
            continue
        x, weight, transposed, bias, steps, chain = m
        why = "knob gemm_epilogue=on"
        if mode == "auto":
            # (under no_grad the product's traced value does not require grad, whatever its weight does)
            c = choose(x, weight, transposed, steps, bool(value(node).requires_grad))
            if not c.fused:
                records.append(PatternRecord("gemm_epilogue", False, node.name, c.reason))
                continue
            why = c.reason
        last = chain[-1]
        with g.inserting_before(last):
            w = g.call_function(torch.t, (weight,)) if transposed else weight
            fused = g.call_function(fused_linear, (x, w, bias), dict(
                act=steps.get("act", "none"), residual=steps.get("residual"), mul=steps.get("mul"),
                out_dtype=steps.get("cast")))
        fused.meta.update({k: v for k, v in last.meta.items() if k in ("example_value", "val", "stack_trace",
                                                                         "nn_module_stack")})
        last.replace_all_uses_with(fused)
        for n in chain[::-1] + [node]:
            if not n.users:
                g.erase_node(n)
        desc = " -> ".join(f"{s}={v}" if s in ("act", "cast") else s for s, v in steps.items())
        records.append(PatternRecord("gemm_epilogue", True, node.name,
                                     f"{node.name} -> {desc}: one Triton GEMM with the epilogue in registers ({why})"))
    return records

