"""FX (core ATen) → stitch IR.

Each FX node is matched against the rule registry by its ATen overload.  Anything
without a rule — or whose rule refuses these arguments — becomes an opaque node that
the runtime calls eagerly, with the reason recorded for `explain`.
"""
from __future__ import annotations

import dataclasses
import operator
from typing import Any

import torch
import torch.fx as fx

from ..fallback import no_rule_reason
from ..ir import nodes as ir
from ..ir.nodes import FLOAT8_DTYPES, Ref, non_overlapping
from ..patterns import gemm_op, linear_ce_op  # register stitchml:: fused ops (issue 15)
from . import rules_index, rules_pointwise, rules_random, rules_reduce, rules_views  # noqa: F401
from . import rules_intdiv, rules_scatter, rules_window  # noqa: F401  (issue 18; after rules_pointwise)
from . import rules_complex  # complex values as pairs of reals (issue 19)
from . import rules_special  # noqa: F401  (prims left by torch's decompositions; issue 19)
from . import rules_scan  # noqa: F401  (cumsum, cumprod, logcumsumexp; issue 18)
from . import rules_histogram  # noqa: F401  (histc, histogram, histogramdd; issue 19)
from .rules_bits import UNSIGNED_RESULT_OPS  # view(dtype), hash_tensor
from . import rules_rng_state  # random ops of checkpointed regions (AOTAutograd's rng functionalisation)
from .context import LowerCtx, static_shape
from .registry import RULES, Unsupported

aten = torch.ops.aten
prims = torch.ops.prims

# Vendor-library ops: never stitched, by design (DESIGN §1).
COMPUTE_INTENSIVE = {
    aten.mm.default, aten.bmm.default, aten.addmm.default, aten.baddbmm.default,
    aten.convolution.default, aten.convolution_backward.default, aten.matmul.default,
    # grouped products (an MoE's experts over tokens sorted by expert: transformers' bf16 path)
    *[getattr(aten, n).default for n in ("_grouped_mm", "_scaled_grouped_mm") if hasattr(aten, n)],
    # float8 products with their scales (FP8 training: the operands' scaling casts stitch)
    *[getattr(aten, n).default for n in ("_scaled_mm", "_scaled_mm_v2") if hasattr(aten, n)],
    aten._scaled_dot_product_efficient_attention.default, aten._scaled_dot_product_flash_attention.default,
    aten._scaled_dot_product_cudnn_attention.default,
    aten._scaled_dot_product_flash_attention_for_cpu.default,
    aten._scaled_dot_product_efficient_attention_backward.default,
    aten._scaled_dot_product_flash_attention_backward.default,
    aten._scaled_dot_product_flash_attention_for_cpu_backward.default,
    # the native attention block of nn.TransformerEncoderLayer's inference fast path (its
    # projections, masked softmax and output projection; capture/decomp_transformer.py)
    aten._native_multi_head_attention.default,
    *(op._opoverload for op in linear_ce_op.OPS),   # chunked mm + our own row kernel (patterns/)
    gemm_op.linear_epilogue._opoverload,            # our Triton GEMM with a stitched epilogue (patterns/)
}


def _tensor_meta(val):
    if isinstance(val, torch.Tensor):
        try:
            return static_shape(val), val.dtype, tuple(int(s) for s in val.stride())
        except Exception:
            return None, val.dtype, None
    return None, None, None


class Lowerer:
    def __init__(self, gm: fx.GraphModule):
        self.gm = gm
        self.g = ir.Graph()
        self.ctx = LowerCtx(self.g)
        self.env: dict[fx.Node, object] = {}
        self.writes: list[tuple[int, Ref]] = []   # (input position, new value): `_write_input`

    def run(self) -> ir.Graph:
        for node in self.gm.graph.nodes:
            if node.op == "placeholder":
                self.env[node] = self._placeholder(node)
            elif node.op == "call_function":
                self.env[node] = self._call(node)
            elif node.op == "get_attr":
                self.env[node] = self._constant(node)
            elif node.op == "output":
                # complex outputs: in eager's layout, as complex tensors
                out = rules_complex.unpair_outputs(self, self._map(node.args[0]), node.args[0])
                self.g.outputs = list(out) if isinstance(out, (tuple, list)) else [out]
                self._check_output_layouts(node)
                self.g.outputs += [r for _, r in self.writes]   # kept alive, not returned
                self.g.input_writes = [pos for pos, _ in self.writes]
            else:
                raise Unsupported(f"FX op {node.op} is not supported")
        return self.g

    def _check_output_layouts(self, node) -> None:
        """Outputs carry eager's layout: a later graph (the backward reading a saved
        tensor) addresses them with the strides eager gave.  An output that is a view
        made by an op eager does not return a view from (`repeat`: broadcasts and
        reshapes here) is written by a kernel where the view would differ.  An output
        that eager returns in a layout with repeated elements (a stride-0 dim of an
        expanded value) and that a kernel would compute cannot be given that layout:
        such a graph runs eagerly."""
        fx_outs = node.args[0] if isinstance(node.args[0], (tuple, list)) else [node.args[0]]
        for i, (r, fxn) in enumerate(zip(self.g.outputs, fx_outs)):
            val = fxn.meta.get("val") if isinstance(fxn, fx.Node) else None
            if not isinstance(r, Ref) or not isinstance(val, torch.Tensor):
                continue
            n = self.g[r.id]
            if n.kind == ir.VIEW and not val.is_complex() and not self._view_as_eager(r, fxn) \
                    and self._view_differs(r, tuple(int(s) for s in val.stride())):
                # eager returns a new tensor (e.g. `repeat`, lowered as broadcasts and
                # reshapes of its input) and our view of another value would alias a graph
                # input or be laid out otherwise: a kernel writes it with eager's strides
                copy = self.ctx.pointwise("identity", (r,), n.shape, n.dtype)
                stride = tuple(int(s) for s in val.stride())
                if _dense(n.shape, stride):
                    self.g.nodes[copy.id] = dataclasses.replace(self.g[copy.id], stride=stride)
                self.g.outputs[i] = copy
                continue
            if n.kind in (ir.INPUT, ir.OPAQUE, ir.ITEM, ir.VIEW) or n.shape is None or n.numel <= 1:
                continue  # (an empty or one-element result has no repeated elements to lay out)
            stride = tuple(int(s) for s in val.stride())
            if stride != n.stride and not _dense(n.shape, stride):
                if not non_overlapping(n.shape, stride):
                    raise Unsupported(f"output {fxn.name} is expected with repeated elements (strides {stride}), "
                                      f"which a kernel cannot write")
                # gaps (diagonal_scatter of a strided slice keeps its input's layout): the
                # value's buffer written with eager's strides
                self.g.nodes[r.id] = dataclasses.replace(n, stride=stride)

    def _view_as_eager(self, r: Ref, fxn: fx.Node) -> bool:
        """Whether output `r` (a view node) is the view eager returns: eager's chain of
        view ops from the output down to its first non-view op ends at the value our
        view chain starts from.  Otherwise some op in between returns a new tensor in
        eager (a `repeat`, a `clone` of an expanded value) where our rule gave a view."""
        base, _ = self._view_chain(r)
        f = fxn
        while f.op == "call_function" and f.args and isinstance(f.args[0], fx.Node):
            if f.target is operator.getitem:   # an item of a view op's tuple (split, unbind) is a view
                if not (f.args[0].op == "call_function" and _is_view_op(f.args[0].target)):
                    break
            elif not (_is_view_op(f.target) or f.target is torch.ops.aten._unsafe_view.default):
                break
            f = f.args[0]
        mine = self.env.get(f)
        # (a value that is not one tensor, e.g. a complex pair, is left as it was)
        return not isinstance(mine, Ref) or mine.id == base.id

    def _view_differs(self, r: Ref, stride: tuple[int, ...]) -> bool:
        """Whether view node `r` would alias a graph input, or be laid out otherwise
        than `stride` (dims of size 1 aside), or in a layout only a replay would find."""
        from ..runtime.steps import Layout, view_layout
        base, chain = self._view_chain(r)
        if base.kind == ir.INPUT or base.stride is None:
            return True
        lay = Layout(base.shape, base.stride)
        for v in reversed(chain):
            lay = view_layout(v.op, lay, v.shape, dict(v.attrs))
            if lay is None:
                return True
        return any(a != b for size, a, b in zip(lay.shape, lay.stride, stride) if size > 1)

    def _view_chain(self, r: Ref) -> tuple[ir.Node, list[ir.Node]]:
        """The value a view node's chain starts from, and the chain (outermost first)."""
        chain, base = [], self.g[r.id]
        while base.kind == ir.VIEW:
            chain.append(base)
            base = self.g[base.refs[0]]
        return base, chain

    def _map(self, a):
        return fx.node.map_arg(a, lambda n: self.env[n]) if not isinstance(a, fx.Node) else self.env[a]

    def _placeholder(self, node):
        val = node.meta.get("val")
        shape, dtype, stride = _tensor_meta(val)
        if isinstance(val, torch.SymInt) or (dtype is not None and shape is None):
            raise Unsupported(f"dynamic shapes are not supported yet (input {node.name} is symbolic: "
                              f"{val if dtype is None else tuple(val.shape)}); the graph runs eagerly")
        if dtype is None:
            raise Unsupported(f"non-tensor graph input {node.name} ({type(val).__name__})")
        nid = self.g.add(ir.INPUT, node.name, (), shape, dtype, stride, (("index", len(self.g.inputs)),))
        self.g.inputs.append(nid)
        return Ref(nid)

    def _constant(self, node):
        """A tensor held by the graph module (a lifted constant such as torch.tensor(0.2)):
        read like a graph input; the wrapper passes the tensor itself."""
        value = getattr(self.gm, node.target)
        if not isinstance(value, torch.Tensor):
            raise Unsupported(f"non-tensor attribute {node.target}")
        shape = tuple(int(s) for s in value.shape)
        nid = self.g.add(ir.INPUT, node.target, (), shape, value.dtype, tuple(int(s) for s in value.stride()),
                         (("constant", True),))
        self.g.constants[nid] = value
        return Ref(nid)

    def _call(self, node):
        if node.target is operator.getitem:
            base = self.env[node.args[0]]
            return base[node.args[1]] if isinstance(base, (tuple, list)) else self._item(node, base)
        args = self._map(node.args)
        kwargs = self._map(node.kwargs)
        if node.target is aten.copy_.default:
            write = self._write_input(node, args)
            if write is not None:
                return write
        if node.target in rules_rng_state.HOPS:  # a random op of a recomputed (checkpointed) region
            return rules_rng_state.lower(self, node, args, kwargs)
        if rules_complex.involves_complex(node):  # complex values are lowered as pairs of reals
            return rules_complex.lower(self, node, args, kwargs)
        try:
            return self.apply_rule(node, args, kwargs)
        except Unsupported as e:
            return self._opaque(node, args, kwargs, str(e))

    def _write_input(self, node: fx.Node, args: tuple) -> Ref | None:
        """`copy_(input, value)`: AOTAutograd's write of a mutated graph input's new value
        (kept in the graph: `keep_inference_input_mutations`), e.g. an optimizer
        step's parameters and moments.  The new value becomes a copy node with the
        input's layout, kept alive like an output (`Graph.input_writes`); the plan then
        lets its kernel write it into the input's own buffer where that is safe
        (`plan/in_place.py`), else the wrapper copies it there after the call.  None
        (the copy runs eagerly) for anything but a whole graph input of the same shape
        and dtype whose elements do not share memory, or an input written twice.
        (AOTAutograd keeps these in training forward graphs too: a batch norm's running
        statistics.)"""
        dst, src = (args + (None, None))[:2]
        if not isinstance(dst, Ref) or not isinstance(src, Ref) or len(node.args) > 2:
            return None
        d, v = self.g[dst.id], self.g[src.id]
        if d.kind != ir.INPUT or d.attr("constant") or d.shape != v.shape or d.dtype != v.dtype \
                or d.stride is None or not non_overlapping(d.shape, d.stride):
            return None
        pos = d.attr("index")   # (its position among the graph inputs)
        if any(p == pos for p, _ in self.writes):
            return None
        new = self.ctx.pointwise("identity", (src,), d.shape, d.dtype)
        # (the attribute keeps `dce.fold_copies` from folding the copy into its source)
        self.g.nodes[new.id] = dataclasses.replace(self.g[new.id], stride=d.stride,
                                                   attrs=(("into_input", pos),))
        self.writes.append((pos, new))
        return new

    def apply_rule(self, node: fx.Node, args: tuple, kwargs: dict) -> Any:
        """IR of `node` by its rule (`args`/`kwargs`: its arguments with tensors as Refs),
        or `Unsupported` with the reason it runs eagerly (no node of it is left)."""
        if any(isinstance(a, Ref) and self.g[a.id].kind == ir.OPAQUE and self.g[a.id].shape is None
               for a in ir._iter_refs(list(args) + list(kwargs.values()))):
            raise Unsupported("consumes a multi-output eager op")
        if node.target in COMPUTE_INTENSIVE:   # (first: a float8 product's reason is the library's)
            raise Unsupported("compute-intensive: vendor library")
        bad = _unsupported_dtype(node)
        if bad is not None:
            raise Unsupported(f"dtype {bad} is not supported in kernels")
        layout = _sparse_layout(node)
        if layout is not None:
            raise Unsupported(f"a sparse tensor ({layout}) is not a stitched form: a kernel addresses strided memory")
        rule = RULES.get(node.target)
        if rule is None:  # (raises under STITCHML_STRICT; library ops get their own reason)
            raise Unsupported(no_rule_reason(node.target))
        if getattr(node.target, "_schema", None) is not None and node.target._schema.is_mutable:
            raise Unsupported("mutates its input")
        mark = len(self.g.nodes)
        val = node.meta.get("val")
        if isinstance(val, torch.Tensor) and _known_empty(val) and not _is_view_op(node.target):
            # an empty result needs no rule (whose index arithmetic could divide by a zero extent)
            return self.ctx.empty(tuple(val.shape), val.dtype)
        try:
            result = self._fresh(node, rule(self.ctx, node, *args, **kwargs), mark)
            self._adopt_strides(node, result, mark)
            _empty_to_constants(self.g, mark)
            return result
        except Unsupported:
            del self.g.nodes[mark:]  # drop half-built nodes of the refused rule
            raise

    def _fresh(self, node, result, mark: int):
        """A rule may answer with an existing value (`roll` by a multiple of the size,
        padding by zero).  Where eager returns a new tensor of another layout, take an
        element-wise copy instead, so that the value carries eager's strides (a later
        graph, e.g. the backward, reads it with those)."""
        val = node.meta.get("val")
        if not isinstance(result, Ref) or result.id >= mark or not isinstance(val, torch.Tensor):
            return result
        schema = getattr(node.target, "_schema", None)
        if schema is None or any(r.alias_info is not None for r in schema.returns):
            return result  # a view op: its result is meant to share the input's layout
        n = self.g[result.id]
        # a view node's `stride` is not its real layout (replayed views get eager's): copy
        if n.kind != ir.VIEW and (n.stride is None or n.stride == tuple(int(s) for s in val.stride())):
            return result
        if n.numel <= 1:
            return result
        return self.ctx.pointwise("identity", (result,), n.shape, n.dtype)

    def _adopt_strides(self, node, result, mark: int) -> None:
        """Buffers a rule created take the strides eager gives its result (e.g. an
        element-wise op on a transposed input keeps the transposed layout)."""
        vals = node.meta.get("val")
        results = result if isinstance(result, tuple) else (result,)
        vals = vals if isinstance(vals, (tuple, list)) else (vals,)
        for r, v in zip(results, vals):
            if not isinstance(r, Ref) or r.id < mark or not isinstance(v, torch.Tensor):
                continue
            n = self.g[r.id]
            if n.kind == ir.VIEW or n.shape != tuple(v.shape):
                continue
            stride = tuple(int(s) for s in v.stride())
            if _dense(n.shape, stride) and stride != n.stride:
                self.g.nodes[r.id] = dataclasses.replace(n, stride=stride)

    def _opaque(self, node, args, kwargs, reason: str, val=None):
        """`node` run eagerly; `val`: its result's metadata where the FX node has none."""
        self.g.fallbacks.append(ir.Fallback(str(node.target), reason))
        val = node.meta.get("val") if val is None else val
        shape, dtype, stride = _tensor_meta(val)
        multi = isinstance(val, (tuple, list))
        nid = self.g.add(ir.OPAQUE, str(node.target),
                         tuple(Ref(r) for r in ir._iter_refs(list(args) + list(kwargs.values()))),
                         None if multi else shape, dtype, stride,
                         (("reason", reason), ("multi", multi), ("fx_name", node.name)))
        self.g.eager_calls[nid] = (node.target, args, kwargs)
        if multi:
            return _MultiOut(nid)
        if not isinstance(val, torch.Tensor):
            return _MultiOut(nid)  # non-tensor result; consumers go eager too
        return Ref(nid)

    def _item(self, node, base):
        if not isinstance(base, _MultiOut):
            raise Unsupported("getitem of a non-tuple value")
        val = node.meta.get("val")
        shape, dtype, stride = _tensor_meta(val)
        nid = self.g.add(ir.ITEM, "getitem", (Ref(base.id),), shape, dtype, stride, (("index", node.args[1]),))
        # an item that is itself a tuple (an eager run_and_save_rng_state's `(state, (out, mask))`)
        return _MultiOut(nid) if isinstance(val, (tuple, list)) else Ref(nid)


def _known_empty(val: torch.Tensor) -> bool:
    """A result with a zero extent among its static sizes (a symbolic size is never
    asked: that would guard on it)."""
    return any(isinstance(d, int) and d == 0 for d in val.shape)


def _is_view_op(target) -> bool:
    """Ops whose result aliases an input (eager returns a view, and so must we)."""
    schema = getattr(target, "_schema", None)
    return schema is not None and any(r.alias_info is not None for r in schema.returns)


def _empty_to_constants(g: ir.Graph, mark: int) -> None:
    """A value with no elements needs no kernel: every node a rule built (from `mark`)
    that would be computed in one but has a zero-size shape becomes an empty constant
    (a free node the wrapper allocates), so no kernel has an empty domain and no index
    map ever divides by a zero extent.  Views stay views (eager returns views)."""
    for n in g.nodes[mark:]:
        if (n.shape is not None and 0 in n.shape and n.kind in ir.STITCHABLE | {ir.SCATTER_ADD}
                and n.kind != ir.VIEW and not (n.kind == ir.POINTWISE and n.op == "full")):
            g.nodes[n.id] = dataclasses.replace(n, kind=ir.POINTWISE, op="full", args=(),
                                                attrs=(("value", 0),))


def _dense(shape, stride) -> bool:
    """Non-overlapping and dense: some permutation of the dims is contiguous."""
    dims = sorted((st, sz) for st, sz in zip(stride, shape) if sz != 1)
    expect = 1
    for st, sz in dims:
        if st != expect:
            return False
        expect *= sz
    return True




# ops that only convert or move float8 values (kernels hold them as bits: `ir.nodes.
# FLOAT8_DTYPES`); any other op on one runs eagerly (eager itself computes little in them)
FLOAT8_OPS = frozenset({
    aten._to_copy.default, prims.convert_element_type.default, aten.clone.default,
    aten.contiguous.default, aten.lift_fresh_copy.default, prims.copy_strided.default,
    aten.alias.default, aten.detach.default, aten.copy.default, aten.cat.default, aten.stack.default})


def _unsupported_dtype(node: fx.Node):
    """A dtype of the node's results or operands that kernels do not hold, or None.
    Unsigned types wider than a byte are held only where no arithmetic touches them:
    bit-cast results (view(dtype) also reads them), and views of them; float8 values
    only where they are converted, copied or viewed (`FLOAT8_OPS`)."""
    from .context import BITCAST_RESULT_DTYPES, SUPPORTED_DTYPES
    moves = node.target is aten.view.dtype or _is_view_op(node.target)
    f8 = FLOAT8_DTYPES if moves or node.target in FLOAT8_OPS else ()
    wide = SUPPORTED_DTYPES + BITCAST_RESULT_DTYPES + f8
    out_ok = wide if moves or node.target in UNSIGNED_RESULT_OPS else SUPPORTED_DTYPES + f8
    in_ok = wide if moves else SUPPORTED_DTYPES + f8
    for t, is_result in _tensor_vals(node):
        if t.dtype not in (out_ok if is_result else in_ok):
            return t.dtype
    return None


def _tensor_vals(node: fx.Node):
    """(tensor, whether it is a result) for the node's results and its operands' values."""
    for v, is_result in [(node.meta.get("val"), True)] + [(a.meta.get("val"), False) for a in node.all_input_nodes]:
        for t in (v if isinstance(v, (tuple, list)) else (v,)):
            if isinstance(t, torch.Tensor):
                yield t, is_result


def _sparse_layout(node: fx.Node):
    """The layout of a result or operand that is not strided memory (a sparse gradient
    of `embedding_bag(sparse=True)`), or None: a rule would read its values as dense."""
    return next((t.layout for t, _ in _tensor_vals(node) if t.layout != torch.strided), None)


class _MultiOut:
    """The tuple result of an opaque op; `getitem` turns it into ITEM nodes."""

    def __init__(self, nid: int):
        self.id = nid

    def __getitem__(self, i):
        raise TypeError


def lower(gm: fx.GraphModule) -> ir.Graph:
    return Lowerer(gm).run()
