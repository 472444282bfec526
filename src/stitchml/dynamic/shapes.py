"""Symbolic sizes of a graph Dynamo compiled with dynamic shapes: which symbols there
are, how to read their values from a call's arguments, which mapping bucket a value
falls in, which probe sizes represent a bucket, and the same graph re-traced with
every size fixed (so the static pipeline can compile it)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import sympy
import torch
import torch.fx as fx


def _placeholders(gm: fx.GraphModule) -> list[fx.Node]:
    return [n for n in gm.graph.nodes if n.op == "placeholder"]


def _is_sym(x: Any) -> bool:
    return isinstance(x, (torch.SymInt, torch.SymFloat, torch.SymBool))


def is_symbolic(gm: fx.GraphModule) -> bool:
    """Whether any input has a size (or is a number) only known at run time."""
    for n in _placeholders(gm):
        v = n.meta.get("val")
        if _is_sym(v) and not isinstance(v, torch.SymInt):
            return True
        if isinstance(v, torch.SymInt) or (isinstance(v, torch.Tensor) and (
                any(isinstance(s, torch.SymInt) for s in tuple(v.shape) + tuple(v.stride()))
                or isinstance(v.storage_offset(), torch.SymInt))):
            return True
    return False


def data_dependent_size(gm: fx.GraphModule) -> str | None:
    """The first node whose size depends on tensor *values* (an unbacked symbol: a
    boolean-mask index or `nonzero` traced with Dynamo's
    `capture_dynamic_output_shape_ops`), or None.  Kernels are planned from sizes the
    inputs give, so such a graph runs eagerly with this reason."""
    from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols
    for n in gm.graph.nodes:
        v = n.meta.get("val")
        if v is None or (isinstance(v, torch.Tensor) and all(type(s) is int for s in v.shape)):
            continue   # (the common case, checked cheaply: 15 -> 7 ms a BERT-base training graph on the 2-core CPU)
        try:
            found = free_unbacked_symbols(v)
        except Exception:   # (a value the helper does not walk: no symbols of ours either)
            found = ()
        if found:
            return f"{n.name} ({n.target})"
    return None


def _expr(x: Any, shape_env) -> sympy.Expr:
    if isinstance(x, torch.SymInt):
        return shape_env.simplify(x.node.expr) if shape_env is not None else x.node.expr
    return sympy.Integer(int(x))


@dataclass
class Signature:
    """The graph's inputs with their sizes as expressions of the free symbols.

    `inputs[i]` is ("int", expr) or ("float", expr) for a number input, ("unused", expr) for a
    number input nothing reads, ("tensor", shape, stride, dtype, device) for a tensor;
    `sources[sym]` is where a call's arguments give the symbol's value: (input index, dim) or
    (input index, None) for a number input; `solved[sym]` gives a symbol that appears only
    inside an expression of one input size (a split's last chunk, s - 25): (input index,
    dim, the symbol as an expression of that size `_SIZE` and of symbols bound before)."""

    inputs: list[tuple]
    symbols: tuple[sympy.Symbol, ...]
    sources: dict[sympy.Symbol, tuple[int, int | None]]
    shape_env: Any
    exprs: list[sympy.Expr]        # every size, stride and number the symbolic graph holds
    solved: dict[sympy.Symbol, tuple[int, int | None, sympy.Expr]] = field(default_factory=dict)

    def bind(self, args: Sequence[Any]) -> dict[sympy.Symbol, int]:
        out = {}
        for sym, (i, d) in self.sources.items():
            a = args[i]
            out[sym] = int(a) if d is None else int(a.shape[d])
        for sym, (i, d, f) in self.solved.items():   # (in the order they were solved)
            a = args[i]
            v = f.xreplace({_SIZE: sympy.Integer(int(a) if d is None else int(a.shape[d])),
                            **{k: sympy.Integer(x) for k, x in out.items()}})
            if not v.is_integer:   # (sympy evaluates a whole quotient to an Integer)
                raise ValueError(f"size {sym} = {v} is not an integer")
            out[sym] = int(v)
        return out

    def holds(self, values: dict[sympy.Symbol, int]) -> bool:
        """Whether sizes satisfy Dynamo's guards on this graph (probe sizes must: the
        graph is only valid where they hold) and every input size is positive."""
        env = self.shape_env
        if env is not None:
            for sym, v in values.items():
                rng = env.var_to_range.get(sym)
                if rng is not None and not (rng.lower <= v <= rng.upper):
                    return False
            for guard in env.guards:
                try:
                    if not bool(guard.expr.xreplace({s: sympy.Integer(v) for s, v in values.items()})):
                        return False
                except TypeError:  # refers to a symbol of another graph: not ours to check
                    continue
        return True


def signature(gm: fx.GraphModule) -> Signature:
    """Read the symbolic inputs; `ValueError` if a symbol cannot be read off the
    arguments directly (it only appears inside a product or sum)."""
    env = None
    for n in _placeholders(gm):
        v = n.meta.get("val")
        if isinstance(v, torch.SymInt):
            env = v.node.shape_env
        elif isinstance(v, torch.Tensor) and getattr(v, "fake_mode", None) is not None:
            env = env or v.fake_mode.shape_env
    inputs, sources = [], {}
    for i, n in enumerate(_placeholders(gm)):
        v = n.meta.get("val")
        if isinstance(v, torch.SymInt) or isinstance(v, int):
            e = _expr(v, env)
            inputs.append(("int", e))
            if isinstance(e, sympy.Symbol):
                sources.setdefault(e, (i, None))
        elif isinstance(v, torch.SymFloat):
            # a float computed from sizes (grid_sample's (size - 1) / 2 scale in a
            # backward graph): folded in at each size like any size arithmetic; a float
            # that is not a function of sizes has no source and is refused below
            inputs.append(("float", v.node.expr))
        elif isinstance(v, torch.Tensor):
            shape = tuple(_expr(s, env) for s in v.shape)
            stride = tuple(_expr(s, env) for s in v.stride())
            # (a storage offset is no obstacle: kernels address an input from its data
            # pointer, which includes the offset, so the offset never enters the code)
            inputs.append(("tensor", shape, stride, v.dtype, v.device))
            for d, e in enumerate(shape):
                if isinstance(e, sympy.Symbol):
                    sources.setdefault(e, (i, d))
        else:
            raise ValueError(f"input {n.name} is a {type(v).__name__}")
    # a number input read by nothing whose symbol no other input holds: a jagged nested
    # tensor's ragged size, which AOTAutograd passes to the dense graph for the wrapper that
    # rebuilds the nested output (at run time a nested int, no number): no source, no size
    held = set()
    for inp in inputs:
        if inp[0] == "tensor":
            held |= set().union(*(sympy.sympify(e).free_symbols for e in inp[1] + inp[2]))
    for i, n in enumerate(_placeholders(gm)):
        if inputs[i][0] == "int" and not n.users and isinstance(n.meta.get("val"), torch.SymInt) and \
                not (sympy.sympify(inputs[i][1]).free_symbols & held):
            inputs[i] = ("unused", inputs[i][1])
            sources = {sym: src for sym, src in sources.items() if src != (i, None)}
    free = set()
    for inp in inputs:
        if inp[0] == "unused":
            continue
        for e in (inp[1:2] if inp[0] in ("int", "float") else inp[1] + inp[2]):
            free |= sympy.sympify(e).free_symbols
    missing = free - set(sources)
    solved = _solve_missing(inputs, missing, set(sources))
    missing -= set(solved)
    if missing:
        raise ValueError(f"sizes {sorted(map(str, missing))} appear only inside expressions of the inputs' "
                         "sizes, so a call's arguments do not give them")
    symbols = tuple(sorted(free, key=str))
    exprs = []
    unused = {n for i, n in enumerate(_placeholders(gm)) if inputs[i][0] == "unused"}
    for node in gm.graph.nodes:
        if node not in unused:
            exprs.extend(_node_exprs(node.meta.get("val"), env))
    return Signature(inputs, symbols, sources, env, exprs, solved)


_SIZE = sympy.Symbol("_size", integer=True)


def _solve_missing(inputs: list[tuple], missing: set, known: set) -> dict:
    """Symbols that appear only inside expressions of input sizes, each solved from one size
    that is linear in it and holds no other unknown symbol (a split's last chunk, s - 25:
    s = size + 25), in an order where each uses only symbols bound before it."""
    solved: dict = {}
    known = set(known)
    progress = True
    while progress and missing - set(solved):
        progress = False
        for i, inp in enumerate(inputs):
            if inp[0] == "tensor":
                places = list(enumerate(inp[1]))
            elif inp[0] == "int":
                places = [(None, inp[1])]
            else:
                continue
            for d, e in places:
                e = sympy.sympify(e)
                unknown = e.free_symbols - known
                if len(unknown) != 1:
                    continue
                (sym,) = unknown
                # (linear only: floor divisions, Mod, Max are not polynomials, and sympy.degree
                # raises on them)
                if sym not in missing or sym in solved or not e.is_polynomial(sym) \
                        or sympy.Poly(e, sym).degree() != 1:
                    continue
                roots = sympy.solve(sympy.Eq(e, _SIZE), sym)
                if len(roots) == 1:
                    solved[sym] = (i, d, roots[0])
                    known.add(sym)
                    progress = True
    return solved


def _node_exprs(v: Any, env) -> list[sympy.Expr]:
    if isinstance(v, (list, tuple)):
        return [e for x in v for e in _node_exprs(x, env)]
    if isinstance(v, torch.SymInt):
        return [_expr(v, env)]
    if not isinstance(v, torch.Tensor):
        return []
    shape = [_expr(s, env) for s in v.shape]
    out = list(shape) + [_expr(s, env) for s in v.stride()]
    for i in range(len(shape)):  # products of adjacent dims: what flattening views produce
        acc = sympy.Integer(1)
        for j in range(i, len(shape)):
            acc = acc * shape[j]
            out.append(acc)
    return out


# ---------------------------------------------------------------------------- buckets

def bucket_of(v: int) -> tuple[int, int]:
    """The mapping bucket of one size: (lo, hi], powers of two, because the block
    shapes `plan/mapping.py` chooses are powers of two of the extents (next_pow2):
    sizes in one bucket get the same blocks and warps.  0 and 1 are their own
    buckets (Dynamo specialises them anyway)."""
    if v <= 1:
        return (v - 1, v)
    hi = 1 << (v - 1).bit_length()
    return (hi // 2, hi)


def probes(sig: Signature, values: dict[sympy.Symbol, int], count: int = 3) -> list[dict[sympy.Symbol, int]]:
    """`values` first, then up to `count - 1` other sizes of the same buckets that
    satisfy the graph's guards.  Odd sizes near both ends of the bucket are preferred:
    they share no divisibility with the blocks, and the ends bound every monotone
    quantity (a grid, a loop count) over the bucket."""
    out = [dict(values)]
    pools = {}
    for sym, v in values.items():
        lo, hi = bucket_of(v)
        pool = [x for x in (hi - 1, lo + 1, (lo + hi) // 2 | 1, hi, lo + 2) if lo < x <= hi and x != v]
        pools[sym] = list(dict.fromkeys(pool))
    for j in range(len(max(pools.values(), key=len, default=[]))):
        if len(out) == count:
            break
        # rotate per symbol so two symbols of one bucket never take the same value
        p = {sym: (pool[(j + k) % len(pool)] if pool else values[sym])
             for k, (sym, pool) in enumerate(sorted(pools.items(), key=lambda t: str(t[0])))}
        if p not in out and sig.holds(p):
            out.append(p)
    return out


def nearby(sig: Signature, values: dict[sympy.Symbol, int], avoid: list[dict], count: int) -> list[dict]:
    """Up to `count` sizes of the same buckets as `values`, nearest first (each symbol
    moved by the same step), that satisfy the guards and are not in `avoid`: probes on
    the same side as `values` of a plan choice that flips inside the bucket."""
    bounds = {sym: bucket_of(v) for sym, v in values.items()}
    width = max((hi - lo for lo, hi in bounds.values()), default=0)
    out: list[dict] = []
    for d in (k * sign for k in range(1, width) for sign in (1, -1)):
        if len(out) == count:
            break
        p = {sym: v + d for sym, v in values.items()}
        if all(lo < p[sym] <= hi for sym, (lo, hi) in bounds.items()) and p not in avoid and p not in out \
                and sig.holds(p):
            out.append(p)
    return out


# ---------------------------------------------------------------------------- re-trace

def concrete_graph(gm: fx.GraphModule, sig: Signature, values: dict[sympy.Symbol, int]) -> fx.GraphModule | _Concrete:
    """The same ATen graph with every size fixed to `values`; number inputs and size
    arithmetic are folded in, so the graph's placeholders are its tensor inputs only.
    Copies the graph and evaluates its metadata (fast: no dispatch); a graph whose
    metadata it cannot evaluate is traced again instead (`retraced_graph`)."""
    try:
        return _copied_graph(gm, sig, values)
    except _NotConcrete:
        return retraced_graph(gm, sig, values)


class _NotConcrete(Exception):
    pass


class _Sized(torch.Tensor):
    """A tensor of metadata only (shape, strides, offset, dtype, device): what lowering
    reads from a node's `val`.  Creating one costs microseconds where a fake tensor
    costs a dispatch; computing with one raises."""

    @staticmethod
    def __new__(cls, shape, stride, offset, dtype, device):
        return torch.Tensor._make_wrapper_subclass(cls, shape, strides=stride, storage_offset=offset,
                                                   dtype=dtype, device=device)

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        raise RuntimeError(f"a metadata-only tensor was computed with ({func})")


def _copied_graph(gm: fx.GraphModule, sig: Signature, values: dict[sympy.Symbol, int]) -> _Concrete:
    sub = {s: sympy.Integer(v) for s, v in values.items()}
    env_ = sig.shape_env

    def number(x):
        e = sympy.sympify(_expr(x, env_) if isinstance(x, torch.SymInt) else x.node.expr).xreplace(sub)
        if e.free_symbols:
            raise _NotConcrete(f"{x} has symbols without a value")
        return bool(e) if isinstance(x, torch.SymBool) else (float(e) if isinstance(x, torch.SymFloat) else int(e))

    def concrete(v, placeholder: bool = False):
        if _is_sym(v):
            return number(v)
        if isinstance(v, (list, tuple)):
            return type(v)(concrete(x) for x in v)
        if isinstance(v, torch.Tensor):
            shape = [concrete(x) for x in v.shape]
            stride = [concrete(x) for x in v.stride()]
            try:
                offset = concrete(v.storage_offset())
            except _NotConcrete:
                if not placeholder:
                    raise
                # an input's offset (a KV-cache slice at a symbolic position) is read by
                # nothing: kernels take the input's data pointer, offset included
                offset = 0
            return _Sized(shape, stride, offset, v.dtype, v.device)
        if v is None or isinstance(v, (int, float, bool, torch.dtype, torch.device, str)):
            return v
        raise _NotConcrete(f"metadata of type {type(v).__name__}")

    graph = fx.Graph()
    env: dict[fx.Node, object] = {}
    for i, node in enumerate(gm.graph.nodes):
        val = node.meta.get("val")
        if node.op == "placeholder":
            if _is_sym(val) or isinstance(val, int):
                try:
                    env[node] = concrete(val)
                except _NotConcrete:
                    if node.users:
                        raise
                    env[node] = 0   # (`Signature`'s "unused" input: read by nothing)
                continue
            new = graph.placeholder(node.name)
            new.meta["val"] = concrete(val, placeholder=True)
            env[node] = new
            continue
        elif node.op == "call_function":
            if _is_sym(val) or isinstance(val, (int, float, bool)):  # size arithmetic: a number now
                env[node] = concrete(val)
                continue
            args = fx.node.map_arg(node.args, lambda n: env[n])
            kwargs = fx.node.map_arg(node.kwargs, lambda n: env[n])
            new = graph.call_function(node.target, args, kwargs)
        elif node.op == "get_attr":
            new = graph.get_attr(node.target)
        elif node.op == "output":
            graph.output(fx.node.map_arg(node.args[0], lambda n: env[n]))
            continue
        else:
            raise _NotConcrete(f"FX op {node.op}")
        new.meta["val"] = concrete(val)
        env[node] = new
    return _Concrete(graph, gm)


class _Concrete:
    """What lowering reads of a graph module: the concrete graph, and the symbolic
    module's attributes (`get_attr` targets).  A `fx.GraphModule` would generate and
    compile the graph's Python code, which nothing runs: ~8 % of a new size's time in a
    decoding loop (bench/NOTES.md, sixty-second session)."""

    def __init__(self, graph: fx.Graph, root: fx.GraphModule) -> None:
        self.graph = graph
        self._root = root

    def __getattr__(self, name: str) -> Any:
        if name == "_root":   # (not set yet: a copy being made)
            raise AttributeError(name)
        return getattr(self._root, name)


def retraced_graph(gm: fx.GraphModule, sig: Signature, values: dict[sympy.Symbol, int]) -> fx.GraphModule:
    """`concrete_graph` by tracing the graph again with fake tensors of the sizes
    (correct for any graph, but ~3x slower than copying for BERT-base)."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.proxy_tensor import make_fx

    sub = {s: sympy.Integer(v) for s, v in values.items()}

    def ev(e, kind: str = "int"):
        v = sympy.sympify(e).xreplace(sub)
        return float(v) if kind == "float" else int(v)

    mode = FakeTensorMode()
    numbers, fakes = {}, []
    for i, inp in enumerate(sig.inputs):
        if inp[0] == "unused":
            numbers[i] = 0
        elif inp[0] in ("int", "float"):
            numbers[i] = ev(inp[1], inp[0])
        else:
            _, shape, stride, dtype, device = inp
            with mode:
                fakes.append(torch.empty_strided([ev(s) for s in shape], [ev(s) for s in stride],
                                                 dtype=dtype, device=device))

    def run(*tensors):
        it = iter(tensors)
        return gm(*[numbers[i] if i in numbers else next(it) for i in range(len(sig.inputs))])

    with mode:
        return make_fx(run)(*fakes)


def tensor_args(sig: Signature, args: Sequence[Any]) -> list:
    return [a for inp, a in zip(sig.inputs, args) if inp[0] == "tensor"]
