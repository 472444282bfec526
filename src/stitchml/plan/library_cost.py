"""What the ops a plan leaves to libraries cost: matrix products, convolutions, fused
attention, our chunked linear cross-entropy, and every other eager op.

The stitched kernels are priced by `cost.py`; without this module a step's prediction
left out its largest part (on an H200 the matrix products and attention of a BERT,
GPT-2 or LLaMA-style training step were 60–80 % of its GPU time), so "the model's
prediction of the measured median" could not be checked against a measurement.

The model, per op (Daydream's way: each op priced from its shapes and a few device
figures, nothing run):
- a matrix product: the best of a few output-tile sizes over whole waves of tiles,
  each tile walking K in steps as long as their flops at the device's tensor-core (or,
  for float32 with TF32 off, CUDA-core) rate times a sustained efficiency, or a step's
  latency where that is longer (small products); split-K with its reduction kernel
  where the tiles leave SMs idle; at least its bytes at the copy bandwidth.  Operands
  whose leading dimension is not a multiple of 16 bytes get cuBLAS's align-1/align-2
  kernels: a much lower efficiency (`capture/pad_gemm.py` pads them on CUDA; a plan
  made elsewhere is priced as it is);
- fused attention: waves of 128-query tiles, each a fixed cost plus its flops (a
  causal call's tile sees half the keys on average; a causal mask passed as a tensor
  computes them all) at the attention rate; the backward
  has 2.5x the forward's flops and its own fixed cost (it launches two helper kernels);
- a convolution: its flops like a matrix product's (the backward: one product for
  each gradient its mask asks for);
- `stitchml::linear_*` (patterns/linear_ce_op.py): the chunked products it runs plus
  its row kernel's passes over the chunk's logits;
- anything else: its inputs and outputs at the copy bandwidth.
Each op also pays one kernel gap (`Device.graph_launch_s`); a host that launches
slower than the GPU runs is not modelled here (the plan's launch term covers stitched
kernels; see `bench/contenders.predict_call`).

The device figures (`Device.matmul_flops`, `gemm_efficiency`, `attention_flops`, ...) were
fitted to the H200's profiler tables of the models suite (bench/NOTES.md, twentieth
session; attention refitted in the twenty-ninth); other devices scale them by their
datasheet tensor-core rates.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from ..ir import nodes as ir
from ..ir.nodes import Ref, prod

if TYPE_CHECKING:
    from .data import Plan
    from .devices import Device

_MM = {"aten.mm.default", "aten.addmm.default", "aten.bmm.default", "aten.baddbmm.default",
       "aten.matmul.default"}
_GROUPED_MM = {"aten._grouped_mm.default", "aten._scaled_grouped_mm.default"}
_CONV = {"aten.convolution.default", "aten.convolution_backward.default"}
_LINEAR_CE = {"stitchml.linear_cross_entropy.default", "stitchml.linear_ce_loss.default",
              "stitchml.linear_ce_grads.default"}
_EPILOGUE = "stitchml.linear_epilogue.default"


@dataclass(frozen=True)
class LibraryPrice:
    """One eager op's predicted device time."""

    node: int
    op: str
    kind: str         # gemm | attention | conv | linear_ce | memory | view | unpriced
    seconds: float
    flops: float = 0.0
    bytes: int = 0
    note: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {"node": self.node, "op": self.op, "kind": self.kind, "predicted_s": self.seconds,
                "flops": self.flops, "bytes": self.bytes, "note": self.note}


def _named(target: Any, args: tuple, kwargs: dict) -> dict[str, Any]:
    """The call's arguments by schema name (positional ones bound in order)."""
    schema = getattr(target, "_schema", None)
    names = [a.name for a in schema.arguments] if schema is not None else []
    out = {names[i] if i < len(names) else f"arg{i}": a for i, a in enumerate(args)}
    out.update(kwargs)
    return out


def _node(g: ir.Graph, a: Any) -> ir.Node | None:
    return g[a.id] if isinstance(a, Ref) else None


def _shape(g: ir.Graph, a: Any) -> tuple[int, ...] | None:
    n = _node(g, a)
    return tuple(n.shape) if n is not None and n.shape is not None else None


def _bytes(n: ir.Node | None) -> int:
    if n is None or n.shape is None or n.dtype is None:
        return 0
    return n.numel * n.dtype.itemsize


def _items(g: ir.Graph) -> dict[int, list[ir.Node]]:
    """The items (results) of each multi-result op of `g`."""
    out: dict[int, list[ir.Node]] = {}
    for m in g.nodes:
        if m.kind == ir.ITEM and m.refs and m.shape is not None:
            out.setdefault(m.refs[0], []).append(m)
    return out


def _results(g: ir.Graph, nid: int, items: dict[int, list[ir.Node]] | None = None) -> list[ir.Node]:
    """The op's tensor results: itself, or its items when it returns several."""
    n = g[nid]
    if n.shape is not None:
        return [n]
    return (items if items is not None else _items(g)).get(nid, [])


def _io_bytes(g: ir.Graph, args: Any, results: list[ir.Node]) -> int:
    """Bytes of an op's tensor arguments (`args`: any iterable holding Refs) and results."""
    return sum(_bytes(_node(g, r)) for r in args if isinstance(r, Ref)) + sum(_bytes(r) for r in results)


def _aligned(n: ir.Node | None) -> bool:
    """Every stride but the unit one a multiple of 16 bytes (what cuBLAS's fast kernels
    need of a leading dimension)."""
    if n is None or n.stride is None or n.dtype is None:
        return True
    return all(s * n.dtype.itemsize % 16 == 0 for s, d in zip(n.stride, n.shape) if s != 1 and d > 1)


# output tiles a cuBLAS product may take (rows x columns of the result per SM): large
# ones reuse operands best, small ones fill the SMs when the result is small
_TILES = ((128, 256), (128, 128), (64, 128), (64, 64), (64, 32))


def gemm_seconds(batch: int, m: int, n: int, k: int, dtype: torch.dtype | None, dev: Device, aligned: bool = True,
                 nbytes: int = 0) -> float:
    """One (batched) matrix product on `dev`, without its launch gap: the best tile size
    over whole waves of tiles, a tile walking K in steps of 64, each step as long as its
    flops at the sustained per-SM rate or the step's latency (`Device.gemm_step_s`, what
    a small product waits on), plus a tile's prologue and epilogue (`gemm_tile_s`); at
    least its bytes at the copy bandwidth."""
    if batch * m * n * k == 0:
        return 0.0
    rate = dev.matmul_rate(dtype) * (dev.gemm_efficiency if aligned else dev.misaligned_gemm_efficiency)
    per_sm = rate / dev.sms
    steps = -(-k // 64)
    best = float("inf")
    for tm, tn in _TILES:
        step = max(dev.gemm_step_s, 2.0 * tm * tn * 64 / per_sm)
        for split in (1, 2, 4):     # split-K: slices of K on more SMs, then a reduction kernel
            if split > 1 and (steps < 4 * split or batch * -(-m // tm) * -(-n // tn) * split > 2 * dev.sms):
                break
            tiles = batch * -(-m // tm) * -(-n // tn) * split
            # whole waves when there are few (the last runs as long as a full one); many
            # average out (the tile scheduler evens the tail)
            waves = -(-tiles // dev.sms) if tiles <= 4 * dev.sms else tiles / dev.sms
            t = waves * (-(-steps // split) * step + dev.gemm_tile_s)
            if split > 1:
                # the reduction: one more kernel (its gap and a short run) over the float32 slices
                t += 2 * dev.graph_launch_s + batch * m * n * 4 * (split + 1) / dev.bandwidth
            best = min(best, t)
    return max(best, nbytes / dev.bandwidth)


def attention_seconds(b: int, h: int, sq: int, sk: int, d: int, causal: bool, backward: bool, dev: Device) -> float:
    """A fused attention call (flash / memory-efficient / cuDNN), without its launch gap."""
    if b * h * sq * sk * d == 0:
        return 0.0
    tiles = b * h * -(-sq // 128)
    keys = (sk / 2 + 64) if causal else sk          # a causal tile's keys on average
    flops = 4.0 * 128 * keys * d * (2.5 if backward else 1.0)
    per_sm = dev.attention_flops / dev.sms
    fixed = dev.attention_bwd_tile_s if backward else dev.attention_tile_s
    return max(tiles / dev.sms, 1.0) * (fixed + flops / per_sm)


def _price_mm(g: ir.Graph, nid: int, op: str, a: dict, dev) -> LibraryPrice:
    if op == "aten.addmm.default":
        x, y = a.get("mat1"), a.get("mat2")
    elif op == "aten.baddbmm.default":
        x, y = a.get("batch1"), a.get("batch2")
    else:
        x, y = a.get("self"), a.get("mat2") if "mat2" in a else a.get("other")
    xs, ys = _shape(g, x), _shape(g, y)
    out = g[nid]
    if xs is None or ys is None or len(xs) < 2 or len(ys) < 2:
        return LibraryPrice(nid, op, "unpriced", 0.0, note="operand shapes unknown")
    m, k, n = xs[-2], xs[-1], ys[-1]
    batch = prod(xs[:-2]) if len(xs) > 2 else 1
    nbytes = _bytes(_node(g, x)) + _bytes(_node(g, y)) + _bytes(out)
    aligned = _aligned(_node(g, x)) and _aligned(_node(g, y)) and _aligned(out)
    s = gemm_seconds(batch, m, n, k, _node(g, x).dtype, dev, aligned, nbytes)
    return LibraryPrice(nid, op, "gemm", s + dev.graph_launch_s, 2.0 * batch * m * n * k, nbytes,
                        "" if aligned else "a leading dimension not a multiple of 16 bytes: align-1/2 kernels")


def _price_grouped_mm(g: ir.Graph, nid: int, op: str, a: dict, dev) -> LibraryPrice:
    """A grouped product (`_grouped_mm`: an MoE's experts, each over its slice of the
    tokens): priced as one product of all its rows, m = the rows of `self` (every group's
    together), k its last extent, n the last extent of `mat2`; the flops are the sum over
    the groups whatever their sizes (per-group tile rounding is not modelled)."""
    xs, ys = _shape(g, a.get("self")), _shape(g, a.get("mat2"))
    out = g[nid]
    if xs is None or ys is None or len(xs) < 2 or len(ys) < 2:
        return LibraryPrice(nid, op, "unpriced", 0.0, note="operand shapes unknown")
    m, k, n = prod(xs[:-1]), xs[-1], ys[-1]
    nbytes = _bytes(_node(g, a.get("self"))) + _bytes(_node(g, a.get("mat2"))) + _bytes(out)
    s = gemm_seconds(1, m, n, k, _node(g, a.get("self")).dtype, dev, True, nbytes)
    return LibraryPrice(nid, op, "gemm", s + dev.graph_launch_s, 2.0 * m * n * k, nbytes, "grouped product")


def _price_attention(g: ir.Graph, nid: int, op: str, a: dict, dev) -> LibraryPrice:
    q, k = _shape(g, a.get("query")), _shape(g, a.get("key"))
    if q is None or k is None or len(q) != 4 or len(k) != 4:
        return LibraryPrice(nid, op, "unpriced", 0.0, note="query/key shapes unknown")
    b, h, sq, d = q
    sk = k[2]
    causal = bool(a.get("is_causal", False))
    backward = "backward" in op
    s = attention_seconds(b, h, sq, sk, d, causal, backward, dev)
    flops = 4.0 * b * h * sq * sk * d * (0.5 if causal else 1.0) * (2.5 if backward else 1.0)
    return LibraryPrice(nid, op, "attention", s + dev.graph_launch_s, flops,
                        _io_bytes(g, a.values(), []), "causal" if causal else "")


def _price_conv(g: ir.Graph, nid: int, op: str, a: dict, dev, items) -> LibraryPrice:
    w = _shape(g, a.get("weight"))
    groups = int(a.get("groups", 1) or 1)
    if op == "aten.convolution.default":
        out = g[nid].shape
        passes = 1
    else:
        out = _shape(g, a.get("grad_output"))
        mask = a.get("output_mask") or (True, True, True)
        passes = int(bool(mask[0])) + int(bool(mask[1]))
    if w is None or out is None or len(out) < 3:
        return LibraryPrice(nid, op, "unpriced", 0.0, note="convolution shapes unknown")
    transposed = bool(a.get("transposed", False))
    cin_per_group = (w[0] // groups) if transposed else w[1]
    # as a product: M = batch x output positions, N = output channels, K = Cin/groups x window
    m = out[0] * prod(out[2:])
    n = out[1]
    k = cin_per_group * prod(w[2:])
    dtype = _node(g, a.get("weight")).dtype
    nbytes = _io_bytes(g, a.values(), _results(g, nid, items))
    s = passes * gemm_seconds(1, m, n, k, dtype, dev, True) / max(dev.conv_efficiency, 0.05)
    s = max(s, nbytes / dev.bandwidth)
    return LibraryPrice(nid, op, "conv", s + passes * dev.graph_launch_s, 2.0 * passes * m * n * k, nbytes)


def _price_linear_ce(g: ir.Graph, nid: int, op: str, a: dict, dev) -> LibraryPrice:
    from ..patterns.linear_ce_op import auto_chunk, padded_ld
    hs, ws = _shape(g, a.get("h")), _shape(g, a.get("w"))
    if hs is None or ws is None:
        return LibraryPrice(nid, op, "unpriced", 0.0, note="operand shapes unknown")
    t, d = prod(hs[:-1]), hs[-1]
    v = ws[0]
    dtype = _node(g, a.get("h")).dtype
    item = dtype.itemsize if dtype is not None else 4
    chunk = int(a.get("chunk", 0) or 0) or auto_chunk(t, v, item)
    chunks = -(-t // max(chunk, 1))
    products = 1 if op.startswith("stitchml.linear_ce_loss") else 1 + int(bool(a.get("need_grad_h", True))) + int(
        bool(a.get("need_grad_w", True)))
    # (linear_ce_grads recomputes the chunk's logits, the 1 above, before its two products)
    vp = padded_ld(v)
    per_chunk = gemm_seconds(1, min(chunk, t), vp, d, dtype, dev, True) * products
    # the row kernel reads the chunk's logits for their statistics; where gradients are
    # made it reads them again and writes the gradient over them
    row_bytes = (1 if products == 1 else 3) * t * vp * item
    s = chunks * per_chunk + row_bytes / dev.bandwidth + chunks * (products + 1) * dev.graph_launch_s
    return LibraryPrice(nid, op, "linear_ce", s, 2.0 * products * t * vp * d, row_bytes + _bytes(_node(g, a.get("w"))),
                        f"{chunks} chunk(s) of {chunk} tokens, {products} product(s) each")


def _price_epilogue(g: ir.Graph, nid: int, op: str, a: dict, dev, items) -> LibraryPrice:
    xs, ws = _shape(g, a.get("x")), _shape(g, a.get("w"))
    if xs is None or ws is None:
        return LibraryPrice(nid, op, "unpriced", 0.0, note="operand shapes unknown")
    m, k, n = xs[0], xs[1], ws[0]
    nbytes = _io_bytes(g, a.values(), _results(g, nid, items))
    s = gemm_seconds(1, m, n, k, _node(g, a.get("x")).dtype, dev, True, nbytes) / max(dev.triton_gemm_efficiency, 0.05)
    return LibraryPrice(nid, op, "gemm", s + dev.graph_launch_s, 2.0 * m * n * k, nbytes,
                        "Triton GEMM with a stitched epilogue")


def price(g: ir.Graph, nid: int, dev: Device, items: dict[int, list[ir.Node]] | None = None) -> LibraryPrice:
    """The predicted device time of eager node `nid` of `g` on `dev` (`items`: `_items(g)`,
    when pricing many ops of one graph)."""
    n = g[nid]
    items = items if items is not None else _items(g)
    call = g.eager_calls.get(nid)
    op = n.op
    if call is None:
        return LibraryPrice(nid, op, "unpriced", 0.0, note="no eager call recorded")
    target, args, kwargs = call
    schema = getattr(target, "_schema", None)
    if schema is not None and schema.returns and all(r.alias_info is not None and not r.alias_info.is_write
                                                     for r in schema.returns):
        return LibraryPrice(nid, op, "view", 0.0, note="a view: no kernel")
    a = _named(target, tuple(args), dict(kwargs))
    try:
        if op in _MM:
            return _price_mm(g, nid, op, a, dev)
        if op in _GROUPED_MM:
            return _price_grouped_mm(g, nid, op, a, dev)
        if "scaled_dot_product" in op:
            return _price_attention(g, nid, op, a, dev)
        if op in _CONV:
            return _price_conv(g, nid, op, a, dev, items)
        if op in _LINEAR_CE:
            return _price_linear_ce(g, nid, op, a, dev)
        if op == _EPILOGUE:
            return _price_epilogue(g, nid, op, a, dev, items)
    except (TypeError, ValueError, ZeroDivisionError, IndexError, AttributeError) as e:
        return LibraryPrice(nid, op, "unpriced", 0.0, note=f"{type(e).__name__}: {e}")
    results = _results(g, nid, items)
    if any(r.shape is None for r in results) or not results and n.shape is None:
        return LibraryPrice(nid, op, "unpriced", 0.0, note="result shapes unknown")
    nbytes = _io_bytes(g, n.args, results)
    return LibraryPrice(nid, op, "memory", nbytes / dev.bandwidth + dev.graph_launch_s, 0.0, nbytes,
                        "priced by its bytes at the copy bandwidth")


def plan_library(plan: Plan, dev: Device) -> list[LibraryPrice]:
    """A price for every eager step of `plan` (in launch order) on `dev`, each op's gap
    that of a CUDA-graph replay where the plan was made for capture (as its kernels are
    priced)."""
    from .data import EagerStep
    if getattr(plan, "graph_replay", False) and not dev.replay:
        dev = dev.replayed()
    items = _items(plan.graph)
    return [price(plan.graph, s.node, dev, items) for s in plan.steps if isinstance(s, EagerStep)]
