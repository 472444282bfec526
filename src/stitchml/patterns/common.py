"""What the pattern rewrites share: the record each one leaves, and a reading of
Dynamo's FX nodes (torch functions, operators and tensor methods) as one op name."""
from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.fx as fx
import torch.nn.functional as F
from torch.fx.experimental.symbolic_shapes import statically_known_true


@dataclass(frozen=True)
class PatternRecord:
    """One rewrite applied or refused, as plain data (shown by `explain`)."""

    pattern: str            # "linear_ce" | "attention"
    applied: bool
    anchor: str             # FX node the match started from (the loss, the second matmul)
    detail: str             # what the rewrite produced, or why it refused

    def line(self) -> str:
        verb = "rewritten" if self.applied else "refused"
        return f"{self.pattern} at {self.anchor}: {verb}: {self.detail}"


class Refused(Exception):
    """A match that does not fit; the message is the reason recorded."""


class NoMatch(Exception):
    """Not an instance of the pattern at all (nothing worth recording)."""


_FUNCTIONS: dict[Any, str] = {
    torch._C._nn.linear: "linear", F.linear: "linear",
    operator.matmul: "matmul", torch.matmul: "matmul", torch.bmm: "matmul",
    operator.truediv: "div", torch.div: "div", operator.mul: "mul", torch.mul: "mul",
    operator.add: "add", torch.add: "add",
    torch.tanh: "tanh", operator.getitem: "getitem", getattr: "getattr",
    F.cross_entropy: "cross_entropy", F.nll_loss: "nll_loss",
    F.log_softmax: "log_softmax", torch.log_softmax: "log_softmax",
    F.softmax: "softmax", torch.softmax: "softmax", F.dropout: "dropout", torch.dropout: "dropout",
    torch.tril: "tril", torch.ones: "ones", operator.invert: "invert", torch.logical_not: "invert",
    torch.masked_fill: "masked_fill", torch.where: "where", torch.transpose: "transpose",
    torch.reshape: "reshape", torch.flatten: "flatten", torch.t: "t", torch.permute: "permute",
    F.gelu: "gelu", F.silu: "silu", F.relu: "relu", torch.relu: "relu",
    torch.arange: "arange", torch.zeros: "zeros", operator.le: "le", torch.le: "le", operator.ge: "ge",
    torch.ge: "ge",
}
_METHODS = {"float": "float", "to": "to", "type_as": "to", "type": "to", "bfloat16": "to", "half": "to",
            "view": "view", "reshape": "view", "flatten": "flatten", "contiguous": "contiguous",
            "transpose": "transpose",
            "softmax": "softmax", "log_softmax": "log_softmax", "masked_fill": "masked_fill", "tanh": "tanh",
            "mul": "mul", "div": "div", "add": "add", "t": "t", "permute": "permute", "bool": "bool",
            "logical_not": "invert", "tril": "tril", "relu": "relu", "expand": "expand", "le": "le", "ge": "ge"}


# Leading parameter names of the functions and methods the matchers read by position
# (a method's self is args[0]): `positional` moves such keyword arguments into args.
_PARAMS: dict[str, tuple[str, ...]] = {
    "linear": ("input", "weight", "bias"), "matmul": ("input", "other"),
    "div": ("input", "other"), "mul": ("input", "other"), "add": ("input", "other"),
    "le": ("input", "other"), "ge": ("input", "other"), "tanh": ("input",), "invert": ("input",),
    "cross_entropy": ("input", "target", "weight"), "nll_loss": ("input", "target", "weight"),
    "log_softmax": ("input", "dim"), "softmax": ("input", "dim"), "dropout": ("input", "p"),
    "tril": ("input", "diagonal"), "masked_fill": ("input", "mask", "value"),
    "where": ("condition", "input", "other"), "transpose": ("input", "dim0", "dim1"),
    "reshape": ("input", "shape"), "flatten": ("input", "start_dim", "end_dim"), "t": ("input",),
    "permute": ("input", "dims"), "gelu": ("input",), "silu": ("input",), "relu": ("input",),
}
_TARGET_PARAMS: dict[Any, tuple[str, ...]] = {torch.bmm: ("input", "mat2")}
_METHOD_PARAMS: dict[str, tuple[str, ...]] = {
    "masked_fill": ("self", "mask", "value"), "softmax": ("self", "dim"), "log_softmax": ("self", "dim"),
    "mul": ("self", "other"), "div": ("self", "other"), "add": ("self", "other"), "le": ("self", "other"),
    "ge": ("self", "other"), "transpose": ("self", "dim0", "dim1"), "tril": ("self", "diagonal"),
    "type_as": ("self", "other"), "matmul": ("self", "other"), "permute": ("self", "dims"),
    "flatten": ("self", "start_dim", "end_dim"),
}


def positional(gm: fx.GraphModule) -> bool:
    """Move keyword arguments that name leading parameters into the positional args of
    the nodes the matchers read (`F.linear(x, weight=w, bias=b)` as I-BERT writes it,
    `torch.matmul(input=a, other=b)`): the matchers index `node.args`, and the call is
    the same.  Only a run of leading parameters is moved, so args stay in order.
    Whether any node changed."""
    changed = False
    for node in gm.graph.nodes:
        if not node.kwargs:
            continue
        if node.op == "call_function":
            k = kind(node)
            try:
                names = _TARGET_PARAMS.get(node.target) or _PARAMS.get(k or "", ())
            except TypeError:   # unhashable target
                continue
        elif node.op == "call_method":
            names = _METHOD_PARAMS.get(node.target, ())
        else:
            continue
        args, kwargs = list(node.args), dict(node.kwargs)
        for name in names[len(args):]:
            if name not in kwargs:
                break
            args.append(kwargs.pop(name))
        if len(args) != len(node.args):
            node.args, node.kwargs = tuple(args), kwargs
            changed = True
    return changed


def kind(node: Any) -> str | None:
    """The op a Dynamo node performs, by one name; None for anything else."""
    if not isinstance(node, fx.Node):
        return None
    if node.op == "call_function":
        try:
            return _FUNCTIONS.get(node.target)
        except TypeError:  # unhashable target
            return None
    if node.op == "call_method":
        return _METHODS.get(node.target)
    return None


def value(node: Any) -> torch.Tensor | None:
    """The example (fake) tensor Dynamo recorded for a node, if any."""
    if not isinstance(node, fx.Node):
        return None
    v = node.meta.get("example_value", node.meta.get("val"))
    return v if isinstance(v, torch.Tensor) else None


def concrete_shape(v: torch.Tensor) -> tuple[int, ...] | None:
    """v's sizes as ints, or None when one is symbolic.  Never int() a SymInt here: that
    adds a guard to Dynamo's shape environment and specialises the size, so the graph
    recompiles at every new size (a KV cache growing by one token: a compile a token)."""
    out = []
    for s in v.shape:
        if isinstance(s, torch.SymInt):
            s = s.node.maybe_as_int()
            if s is None:
                return None
        out.append(int(s))
    return tuple(out)


def sizes(node: Any) -> tuple:
    """node's sizes as ints or SymInts: for matchers that compare sizes with `same`
    (under dynamic shapes a token count is symbolic, and the pattern still applies)."""
    v = value(node)
    if v is None:
        raise Refused(f"{getattr(node, 'name', node)} has no recorded tensor value")
    return tuple(v.shape)


def same(a: Any, b: Any) -> bool:
    """a == b for sizes, never by specialising a symbolic size to its value (int() of a
    SymInt, or comparing it with a number, guards on this size: a recompile at every new
    length).  Two symbolic sizes not known equal (a mask given as an input beside the
    frames a convolution computes) are compared with a guard on their relation, which
    eager checks too (it raises when they differ)."""
    if isinstance(a, int) and isinstance(b, int):
        return a == b
    if statically_known_true(a == b):
        return True
    if isinstance(a, torch.SymInt) and isinstance(b, torch.SymInt):
        return bool(a == b)
    return False


def required_equal(a: Any, b: Any) -> bool:
    """a == b for two sizes eager requires equal (it raises where they differ: a mask
    beside the dims it indexes), with a guard on their relation whatever their kinds:
    a symbolic size beside a number is specialised to it, which costs no recompile,
    since at every other size eager raises too.  (`same` leaves that pair unequal: a
    mask given as an input of symbolic length, indexing a tensor reshaped to literal
    sizes, kept `x[mask] = v` eager and its backward's `grad[mask]`, a data-dependent
    size, sent the whole backward graph to eager; fuzz seed 34038.)"""
    if isinstance(a, int) and isinstance(b, int):
        return a == b
    return bool(a == b)


def same_shape(a: tuple, b: tuple) -> bool:
    return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))


def show(shape: tuple) -> str:
    """A shape for a message: symbolic sizes by their expression."""
    return "[" + ", ".join(str(s) for s in shape) + "]"


def static_shape(node: Any) -> tuple[int, ...]:
    v = value(node)
    if v is None:
        raise Refused(f"{getattr(node, 'name', node)} has no recorded tensor value")
    shape = concrete_shape(v)
    if shape is None:
        raise Refused(f"{node.name} has symbolic sizes (dynamic shapes are not matched yet)")
    return shape


def arg(node: fx.Node, i: int, name: str, default: Any = None) -> Any:
    """Positional argument i or keyword `name` (the function and method forms agree:
    a method's self is args[0])."""
    if len(node.args) > i:
        return node.args[i]
    return node.kwargs.get(name, default)


def only_user(node: fx.Node, what: str) -> fx.Node:
    """The single consumer of node; refuse when the value escapes to another use."""
    users = list(node.users)
    if len(users) != 1:
        names = ", ".join(u.name for u in users) or "nothing"
        raise Refused(f"{what} ({node.name}) is also used elsewhere ({names}): it would have to be materialised")
    return users[0]


def is_number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


_INPLACE_OPERATORS = frozenset({operator.iadd, operator.isub, operator.imul, operator.itruediv,
                                operator.ifloordiv, operator.imod, operator.ipow, operator.iand, operator.ior,
                                operator.ixor, operator.ilshift, operator.irshift, operator.setitem})
_NOT_WRITES = frozenset({"requires_grad_"})   # in-place by name, but no data written


def inplace_by_name(node: fx.Node) -> bool:
    """Whether a Dynamo node is an in-place tensor function or method by its name
    (`add_`, `masked_fill_`, `index_put_`; not `requires_grad_`)."""
    if node.op not in ("call_method", "call_function"):
        return False
    name = node.target if node.op == "call_method" else getattr(node.target, "__name__", "")
    return isinstance(name, str) and name.endswith("_") and not name.startswith("_") and name not in _NOT_WRITES


_VIEWS = frozenset({"view", "reshape", "transpose", "permute", "t", "flatten", "contiguous", "expand", "getitem"})
_VIEW_METHODS = frozenset({"unsqueeze", "squeeze", "narrow", "select"})   # views `kind` does not name


def written_in_place(node: fx.Node) -> fx.Node | None:
    """The first node that writes in place into node's value or a view of it (`y += z`,
    `y[i] = v`, `y.mul_(c)`), or None."""
    seen, todo = set(), [node]
    while todo:
        cur = todo.pop()
        for u in cur.users:
            if u in seen:
                continue
            seen.add(u)
            first = u.args[0] if u.args else None
            if first is not cur:
                continue
            if u.op == "call_function" and u.target in _INPLACE_OPERATORS or inplace_by_name(u):
                return u
            if kind(u) in _VIEWS or (u.op == "call_method" and u.target in _VIEW_METHODS):
                todo.append(u)
    return None


def rewrite_matches(gm: fx.GraphModule, name: str, wanted: Callable[[fx.Node], bool],
                    match: Callable[[fx.Node], Any], apply: Callable[[fx.GraphModule, Any], str]) -> list[PatternRecord]:
    """Run one rewrite over gm's nodes that `wanted` picks (skipping nodes an earlier
    application erased): `match` raises NoMatch (not this rewrite's business: no
    record) or Refused (recorded with its reason); a match is applied, its description
    recorded."""
    records = []
    for node in list(gm.graph.nodes):
        if node.graph is not gm.graph or not wanted(node):
            continue
        try:
            m = match(node)
        except NoMatch:
            continue
        except Refused as e:
            records.append(PatternRecord(name, False, node.name, str(e)))
            continue
        anchor = node.name
        records.append(PatternRecord(name, True, anchor, apply(gm, m)))
    return records


def is_loss(node: fx.Node) -> bool:
    return kind(node) in ("cross_entropy", "nll_loss")
