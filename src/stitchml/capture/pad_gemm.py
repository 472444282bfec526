"""Aligned matrix products: pad the operands of `mm` / `addmm` / `bmm` whose leading
dimensions cuBLAS cannot use at full speed.

Why.  cuBLAS picks its fast Hopper kernels only when every matrix's leading dimension
(and base address) is a multiple of 16 bytes.  An odd vocabulary breaks that for the
language-model head: on an H200 (bench/NOTES.md, 2026-11-25) GPT-2's three head
products with V = 50257 ran in align-1 CUTLASS kernels for 7.8 ms per training step,
where the same products on padded operands take about 1.2 ms.  Inductor pads such
products too (its `pad_mm` pass); this is our own version, at the ATen-graph level so
that the pads are ordinary graph ops the planner stitches like any other.

What.  For a product C = A·B of logical sizes [M, K]·[K, N] (a leading batch dim for
`bmm`), each operand is either row-major (its leading dim is its row stride) or the
transpose of a row-major tensor (a `permute`/`t` of it; its leading dim is that
tensor's row stride).  A misaligned operand is copied once, zero-padded in its own
last dim, which pads exactly one of M, N, K:

- A row-major [M, K] pads K; A = Yᵀ with Y [K, M] pads M (extra result rows, sliced
  off: a row slice, contiguous for `mm`; a batched product's slice keeps the padded
  batch stride and is copied back like a padded N);
- B row-major [K, N] pads N; B = Yᵀ with Y [N, K] pads K;
- the result [M, N] is written with row stride N: an odd N pads N.

A padded K gets zeros in both operands (they add nothing to the sums).  A padded N
gives a result with padded rows; it is copied back to the contiguous [M, N] layout the
graph was traced with (`clone`), so every later op and graph sees the layout it
expects; the planner usually fuses that copy into the result's consumers.  Pads of the
same tensor by the same amount are made once (the backward's two products of the
logits' gradient share one padded copy).

When.  Only where the product outweighs the copies (2·M·N·K ≥ MIN_FLOPS_PER_BYTE × bytes
copied) and the sizes are static; knob `pad_gemm` ("auto": on CUDA tensors of 2-byte
and 4-byte float types).  Each decision is recorded for `explain`.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.fx as fx

aten = torch.ops.aten

ALIGN_BYTES = 16
# Products padded: those with at least this many flops per byte the copies move.  An H200
# does ~800 TFLOP/s of bf16 products and ~4 TB/s of copies (200 flops per byte is break-even
# if the product ran at full speed either way); a misaligned product runs 3-10x slower, so
# padding pays from far lower ratios.  64 keeps small products (copy launches) out.
MIN_FLOPS_PER_BYTE = 64
PRODUCTS = (aten.mm.default, aten.addmm.default, aten.bmm.default)


def _fake(node) -> torch.Tensor | None:
    val = node.meta.get("val") if isinstance(node, fx.Node) else None
    return val if isinstance(val, torch.Tensor) else None


def _static(t: torch.Tensor) -> bool:
    return all(type(s) is int for s in (*t.shape, *t.stride(), t.storage_offset()))


def _align(dtype: torch.dtype) -> int:
    return ALIGN_BYTES // dtype.itemsize


def _up(n: int, a: int) -> int:
    return -(-n // a) * a


def _is_row_major(t: torch.Tensor) -> bool:
    return t.stride(-1) == 1 or t.shape[-1] == 1


def _aligned_row_major(t: torch.Tensor) -> bool:
    a = _align(t.dtype)
    return _is_row_major(t) and (t.stride(-2) % a == 0 or t.shape[-2] == 1) and t.storage_offset() % a == 0


def _swap_last_two(d: int) -> list[int]:
    return list(range(d - 2)) + [d - 1, d - 2]


def _transpose_source(node: fx.Node) -> fx.Node | None:
    """The graph node of which `node` is the last-two-dims transpose (`t`, `permute`,
    `transpose`), else None."""
    if node.op != "call_function" or not node.args or not isinstance(node.args[0], fx.Node):
        return None
    v = _fake(node)
    if v is None or v.dim() < 2:
        return None
    if node.target is aten.t.default:
        return node.args[0]
    if node.target is aten.permute.default and [x % v.dim() for x in node.args[1]] == _swap_last_two(v.dim()):
        return node.args[0]
    if node.target is aten.transpose.int and sorted(x % v.dim() for x in node.args[1:3]) == [v.dim() - 2, v.dim() - 1]:
        return node.args[0]
    return None


@dataclass
class _Operand:
    """A product operand as the row-major tensor `mem` it reads (itself, or the source
    of a transpose), and which logical dims are `mem`'s rows and last dim."""

    node: fx.Node
    mem: fx.Node
    transposed: bool
    row_dim: str
    last_dim: str

    @property
    def aligned(self) -> bool:
        return _aligned_row_major(_fake(self.mem))


def _operand(node: fx.Node, role: str, b: "_Builder") -> _Operand | None:
    t = _fake(node)
    names = ("M", "K") if role == "A" else ("K", "N")
    if _is_row_major(t):
        return _Operand(node, node, False, names[0], names[1])
    if t.stride(-2) != 1:
        return None
    src = _transpose_source(node)
    if src is None or _fake(src) is None or not _is_row_major(_fake(src)):
        # column-major behind views (a transpose, then expand/reshape to 3-d): read it
        # through a transpose view of our own, which is row-major
        src = b.view_t(node)
    return _Operand(node, src, True, names[1], names[0])


class _Builder:
    """New nodes before one product, with their fake values; pads shared per graph."""

    def __init__(self, gm: fx.GraphModule):
        self.g = gm.graph
        self.made: dict[tuple, fx.Node] = {}

    def call(self, target, args: tuple, before: fx.Node, **kwargs) -> fx.Node:
        vals = fx.node.map_arg(args, lambda n: n.meta["val"])
        mode = _fake(before).fake_mode
        with self.g.inserting_before(before):
            node = self.g.call_function(target, args, kwargs or None)
        with mode:
            node.meta["val"] = target(*vals, **kwargs)
        return node

    def view_t(self, node: fx.Node) -> fx.Node:
        """`node` transposed in its last two dims (a view; made once per node)."""
        key = (node, "t")
        if key not in self.made:
            d = _fake(node).dim()
            with self.g.inserting_after(node):
                v = self.g.call_function(aten.permute.default, (node, _swap_last_two(d)))
            with _fake(node).fake_mode:
                v.meta["val"] = aten.permute.default(_fake(node), _swap_last_two(d))
            self.made[key] = v
        return self.made[key]

    def padded(self, src: fx.Node, pad: list[int], before: fx.Node) -> fx.Node:
        """`src` copied, zero-padded at the end of its dims (`constant_pad_nd` order:
        last dim first), contiguous.  Made once per (tensor, padding) in the graph."""
        key = (src, tuple(pad))
        if key not in self.made:
            self.made[key] = self.call(aten.constant_pad_nd.default, (src, list(pad), 0.0), before)
        return self.made[key]


def _copy_back(pads: dict[str, int], dim: int) -> bool:
    """Whether the sliced result must be copied to the traced layout: padded result rows
    (N), or extra rows (M) of a batched product, whose batch stride keeps them."""
    return bool(pads.get("N")) or (bool(pads.get("M")) and dim > 2)


def _decide(ops: list[_Operand], sizes: dict[str, int], al: int) -> tuple[dict[str, int], list[_Operand]]:
    """Pads per logical dim and the operands copied.  A copied operand gets its last
    dim padded to alignment (else the copy's leading dim would be as bad); a padded
    dim copies every operand holding it (K: both; a fixed point in ≤ 3 rounds)."""
    pads = {"N": _up(sizes["N"], al) - sizes["N"]} if sizes["N"] % al else {}
    copied: dict[int, _Operand] = {}
    for _ in range(4):
        changed = False
        for i, op in enumerate(ops):
            holds = pads.get(op.row_dim, 0) or pads.get(op.last_dim, 0)
            if i not in copied and (not op.aligned or holds):
                copied[i] = op
                changed = True
            if i in copied and op.last_dim not in pads and sizes[op.last_dim] % al:
                pads[op.last_dim] = _up(sizes[op.last_dim], al) - sizes[op.last_dim]
                changed = True
        if not changed:
            break
    return pads, list(copied.values())


def pad_gemms(gm: fx.GraphModule, *, device: torch.device) -> list[str]:
    """Pad the misaligned products of `gm` in place (see the module doc).  Returns one
    line per product padded or left misaligned (for `explain`)."""
    from .. import config
    mode = config.get("pad_gemm")
    if mode not in ("auto", "on", "off"):
        raise ValueError(f"STITCHML_PAD_GEMM={mode!r}: expected auto, on or off")
    if mode == "off" or (mode == "auto" and device.type != "cuda"):
        return []
    notes: list[str] = []
    b = _Builder(gm)
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target not in PRODUCTS:
            continue
        addmm = node.target is aten.addmm.default
        a_node, b_node = node.args[1:3] if addmm else node.args[0:2]
        out, ta, tb = _fake(node), _fake(a_node), _fake(b_node)
        if out is None or ta is None or tb is None or getattr(out, "fake_mode", None) is None \
                or not all(_static(t) for t in (out, ta, tb)) \
                or out.dtype not in (torch.float16, torch.bfloat16, torch.float32):
            continue
        sizes = {"M": int(ta.shape[-2]), "K": int(ta.shape[-1]), "N": int(tb.shape[-1])}
        al = _align(out.dtype)
        desc = (f"{node.name} {node.target.__name__.split('.')[0]} {tuple(out.shape)} {out.dtype} "
                f"(M={sizes['M']}, N={sizes['N']}, K={sizes['K']})")
        oa, ob = _operand(a_node, "A", b), _operand(b_node, "B", b)
        if oa is None or ob is None:
            if ta.numel() and tb.numel():
                notes.append(f"{desc}: left: an operand is neither row- nor column-major in memory")
            continue
        if oa.aligned and ob.aligned and not sizes["N"] % al:
            continue
        pads, copied = _decide([oa, ob], sizes, al)
        moved = sum(_fake(o.mem).numel() for o in copied) * out.dtype.itemsize
        if _copy_back(pads, out.dim()):
            moved += 2 * out.numel() * out.dtype.itemsize       # the result copied back
        flops = 2 * out.numel() * sizes["K"]
        if flops < MIN_FLOPS_PER_BYTE * max(moved, 1):
            notes.append(f"{desc}: misaligned, left: {flops / max(moved, 1):.0f} flops per byte copied "
                         f"< {MIN_FLOPS_PER_BYTE}")
            continue
        def placed(op: _Operand) -> fx.Node:
            """The operand as the product reads it: itself, or its padded copy."""
            if op not in copied:
                return op.node
            m = b.padded(op.mem, [0, pads.get(op.last_dim, 0), 0, pads.get(op.row_dim, 0)], node)
            return b.call(aten.permute.default, (m, _swap_last_two(_fake(m).dim())), node) if op.transposed else m
        args: tuple = (placed(oa), placed(ob))
        if addmm:
            bias, tb_ = node.args[0], _fake(node.args[0])
            bpad = [0, pads.get("N", 0) if tb_.dim() >= 1 and tb_.shape[-1] == sizes["N"] > 1 else 0]
            if tb_.dim() == 2:
                bpad += [0, pads.get("M", 0) if tb_.shape[0] == sizes["M"] > 1 else 0]
            if any(bpad):
                bias = b.padded(bias, bpad, node)
            args = (bias, *args)
        res = prod = b.call(node.target, args, node, **dict(node.kwargs))   # (addmm's beta, alpha)
        d = out.dim()
        if pads.get("M"):    # extra result rows: a row slice (contiguous for a 2-d mm only)
            res = b.call(aten.slice.Tensor, (res, d - 2, 0, sizes["M"]), node)
        if pads.get("N"):
            res = b.call(aten.slice.Tensor, (res, d - 1, 0, sizes["N"]), node)
        if _copy_back(pads, d):   # back to the traced contiguous layout
            res = b.call(aten.clone.default, (res,), node, memory_format=torch.contiguous_format)
        for k in ("stack_trace", "nn_module_stack", "seq_nr"):
            if k in node.meta:
                prod.meta[k] = node.meta[k]
        node.replace_all_uses_with(res)
        gm.graph.erase_node(node)
        what = ", ".join(f"{k}+{v}" for k, v in sorted(pads.items()) if v) or "copied to aligned layout"
        notes.append(f"{desc}: padded ({what}; {moved / 2**20:.1f} MiB moved by the copies) "
                     "so that cuBLAS gets 16-byte-aligned operands")
    for key, n in b.made.items():      # a transpose view made for a product then left
        if key[1] == "t" and not n.users:
            gm.graph.erase_node(n)
    if notes:
        gm.graph.lint()
        gm.recompile()
    return notes


__all__ = ["pad_gemms", "ALIGN_BYTES", "MIN_FLOPS_PER_BYTE", "PRODUCTS"]
