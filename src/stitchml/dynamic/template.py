"""Kernel and wrapper sources with sizes as run-time arguments, built from sources the
static pipeline generated at several sizes of one bucket.

The static pipeline is trusted at every size it compiles; this module only finds
which numbers in its output move with the sizes, and as which expression of them:
- the sources of all probes must be the same token for token, except numbers;
- a number that differs between probes must equal, at every probe, one expression
  from the graph's own symbolic sizes (a shape, a stride, a product of adjacent dims,
  a number input), or a ceiling division of one by a power of two (a grid), or such a
  value capped by a constant (a grid bounded by the device), or an expression plus a
  constant (an index clamped to size - 1; the offset of a last row, `logits[:, -1]`);
- in a kernel such a number becomes an argument (`sz0`, `sz1`, … computed by the
  wrapper), never where Triton needs a compile-time constant (block shapes).
Otherwise there is no template and the reason says why.  A template is then checked
against what the static pipeline generates at every new size before it is used there
(`Template.matches`), so a guess that happened to fit the probes is never trusted.

Kernels are compared as Triton source tokens; the wrapper is compared as data: the
steps of `runtime/steps.py`, field by field (`StepUnit`), its moving numbers replaced
by `Expr`s and its launches given the kernels' size arguments before it is rendered.
"""
from __future__ import annotations

import dataclasses
import io
import re
import tokenize
from dataclasses import dataclass, field
from typing import Any, Callable

import sympy
import torch

from ..runtime.cuda_graphs import SeedBuffer
from ..runtime.steps import Expr, Launch, Program, Sym
from ..runtime.wrapper import Checker, _BarrierCounter
from .shapes import Signature

Number = int | float
# what every refusal for probes whose code differs beyond numbers says (`differs_in_structure`)
_STRUCTURE = "between sizes of the bucket"


@dataclass(frozen=True)
class Slot:
    text: str                 # Python expression of the sizes ks0, ks1, ...
    is_float: bool
    fn: Callable[..., Number] = field(compare=False, hash=False)


@dataclass
class Unit:
    """One source text (a kernel or the wrapper) as fixed tokens and slots."""

    tokens: list[str]
    spans: list[tuple[int, int]]
    text: str
    slots: dict[int, Slot]    # token index -> slot


_VALUE_NAME = re.compile(r"[vp]\d+$")


def _tokens(text: str) -> tuple[list[tuple[int, str]], list[tuple[int, int]]]:
    """Tokens and their character spans.  The wrapper's value names (`v12`, `p30`: IR
    node ids) are renamed in order of appearance, so a graph that lost a no-op node
    at some size (a slice of a whole buffer) still compares equal where it computes
    the same."""
    starts = [0]
    for line in text.splitlines(keepends=True):
        starts.append(starts[-1] + len(line))
    toks, spans = [], []
    names: dict[str, str] = {}
    for t in tokenize.generate_tokens(io.StringIO(text).readline):
        if t.type in (tokenize.NL, tokenize.NEWLINE, tokenize.COMMENT, tokenize.ENDMARKER):
            continue
        s = t.string
        if t.type == tokenize.NAME and _VALUE_NAME.match(s):
            s = names.setdefault(s, f"{s[0]}#{len(names)}")
        toks.append((t.type, s))
        spans.append((starts[t.start[0] - 1] + t.start[1], starts[t.end[0] - 1] + t.end[1]))
    return toks, spans


def _number(s: str) -> Number:
    return float(s) if any(c in s for c in ".eE") and not s.startswith("0x") else int(s, 0)


class Candidates:
    """Expressions a size-dependent number may be, evaluated at the probes."""

    def __init__(self, sig: Signature, probes: list[dict]):
        self.names = {s: sympy.Symbol(f"ks{i}") for i, s in enumerate(sig.symbols)}
        self.args = ", ".join(str(self.names[s]) for s in sig.symbols)
        self.probes = [tuple(p[s] for s in sig.symbols) for p in probes]
        # an expression over a symbol no input binds (e.g. the size of a saved RNG state)
        # cannot be evaluated from a call's sizes: it is not a candidate
        bound = set(sig.symbols)
        exprs = {sympy.expand(e) for e in sig.exprs
                 if sympy.sympify(e).free_symbols and sympy.sympify(e).free_symbols <= bound}
        exprs |= {sympy.expand(a * b) for a in list(exprs) for b in sig.symbols}  # one more size factor
        self.exact: dict[tuple, str] = {}
        for e in sorted(exprs, key=lambda e: (sympy.count_ops(e), str(e))):
            text = str(e.xreplace(self.names))
            vals = self._eval(text)
            if vals is not None:
                self.exact.setdefault(vals, text)
        self._derived: dict[tuple, str] | None = None
        self._by_step: dict[tuple, list[tuple[int, str]]] | None = None

    def _eval(self, text: str) -> tuple | None:
        """The expression's values at the probes; None if it is not plain arithmetic of
        the sizes (sympy prints Mod, floor, FloorDiv… by name: Swin's padded windows) or
        fails at some probe: then it is not a candidate."""
        fn = eval(f"lambda {self.args}: {text}", {"__builtins__": {}})  # noqa: S307 (our own expression text)
        try:
            return tuple(int(fn(*p)) for p in self.probes)
        except (ZeroDivisionError, TypeError, ValueError, NameError):
            return None

    def _grids(self) -> dict[tuple, str]:
        if self._derived is None:
            self._derived = {}
            for vals, text in self.exact.items():
                for k in range(1, 25):
                    c = 1 << k
                    if max(vals) <= c // 2:
                        break
                    self._derived.setdefault(tuple(-(-v // c) for v in vals), f"(-(-({text}) // {c}))")
        return self._derived

    def _offset(self, vals: tuple[int, ...]) -> str | None:
        """An exact expression plus a constant that gives `vals` (the nearest constant):
        an index clamped to size - 1, the offset (size - 1) * stride of a last row
        (`logits[:, -1]`), which no size or stride of the graph equals.  Candidates are
        keyed by their steps between probes, so each lookup is one dict access."""
        if self._by_step is None:
            self._by_step = {}
            for cvals, text in self.exact.items():
                key = tuple(v - cvals[0] for v in cvals)
                if any(key):
                    self._by_step.setdefault(key, []).append((cvals[0], text))
        hits = self._by_step.get(tuple(v - vals[0] for v in vals))
        if not hits:
            return None
        first, text = min(hits, key=lambda h: abs(vals[0] - h[0]))
        c = vals[0] - first
        return f"({text}) {'+' if c >= 0 else '-'} {abs(c)}"

    def find(self, vals: tuple[Number, ...]) -> Slot | None:
        is_float = any(isinstance(v, float) for v in vals)
        if is_float:
            if not all(float(v).is_integer() for v in vals):
                return None  # (1/size and the like: a float argument would round differently)
            vals = tuple(int(v) for v in vals)
        text = self.exact.get(vals) or self._grids().get(vals)
        if text is None:  # a grid capped by a device constant: some probes at the cap
            cap = max(vals)
            if vals.count(cap) < len(vals):
                for table in (self.exact, self._grids()):
                    hit = next((t for v, t in table.items()
                                if all(min(a, cap) == b for a, b in zip(v, vals))), None)
                    if hit:
                        text = f"min({hit}, {cap})"
                        break
        if text is None:
            text = self._offset(vals)
        if text is None:
            return None
        if is_float:
            text = f"float({text})"
        return Slot(text, is_float, eval(f"lambda {self.args}: {text}"))  # noqa: S307


def _unit(texts: list[str], cands: Candidates, kernel: bool) -> Unit | str:
    parsed = [_tokens(t) for t in texts]
    toks0, spans0 = parsed[0]
    for toks, _ in parsed[1:]:
        if len(toks) != len(toks0):
            return f"the sources differ in structure {_STRUCTURE}"
    slots: dict[int, Slot] = {}
    depth = 0
    for i, (typ, s) in enumerate(toks0):
        depth += (s == "[") - (s == "]")
        others = [p[0][i] for p in parsed[1:]]
        if any(o[0] != typ or (typ != tokenize.NUMBER and o[1] != s) for o in others):
            return f"the sources differ in structure {_STRUCTURE} (near {s!r})"
        if typ != tokenize.NUMBER or all(o[1] == s for o in others):
            continue
        vals = tuple(_number(x) for x in [s] + [o[1] for o in others])
        if kernel and (depth > 0 or toks0[i - 4][1] == "arange"):
            return f"a size-dependent number ({s}) is a block shape, which Triton needs at compile time"
        slot = cands.find(vals)
        if slot is None:
            return f"no size expression gives the numbers {list(vals)} of the probes"
        slots[i] = slot
    return Unit([t[1] for t in toks0], spans0, texts[0], slots)


# ----------------------------------------------------------------------------- the wrapper, as steps

def _walk(obj: Any, visit: Callable[[Any], Any]) -> Any:
    """`obj` rebuilt with every leaf (number, string, name, dtype, ...) replaced by
    `visit(leaf)`, in a fixed order (steps, then dataclass fields, then items)."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        visit(("node", type(obj).__name__))
        return dataclasses.replace(obj, **{f.name: _walk(getattr(obj, f.name), visit)
                                           for f in dataclasses.fields(obj) if f.init})
    if isinstance(obj, (tuple, list)):
        visit(("seq", type(obj).__name__, len(obj)))
        items = [_walk(x, visit) for x in obj]
        return tuple(items) if isinstance(obj, tuple) else items
    return visit(obj)


def _is_num(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _leaves(steps: list) -> list:
    """The steps' leaves in order; value names (`v12`, `p30`: IR node ids) renamed in
    order of appearance, so a graph that lost a no-op node at some size (a slice of a
    whole buffer) still compares equal where it computes the same."""
    out: list = []
    names: dict[str, str] = {}

    def visit(x: Any) -> Any:
        if isinstance(x, (str, Sym)) and not isinstance(x, Expr) and _VALUE_NAME.match(str(x)):
            x = ("name", names.setdefault(str(x), f"#{len(names)}"))
        elif _is_num(x):
            x = ("num", x)
        out.append(x)
        return x

    _walk(list(steps), visit)
    return out


@dataclass
class StepUnit:
    """The wrapper of one bucket: probe 0's steps and leaves, and the slots (leaf
    index -> size expression) of the numbers that move."""

    steps: list
    leaves: list
    slots: dict[int, Slot]

    def matches(self, steps: list, args: tuple) -> bool:
        leaves = _leaves(steps)
        if len(leaves) != len(self.leaves):
            return False
        for i, (got, fixed) in enumerate(zip(leaves, self.leaves)):
            slot = self.slots.get(i)
            if slot is None:
                if got != fixed:
                    return False
            elif not (isinstance(got, tuple) and got[0] == "num" and got[1] == slot.fn(*args)
                      and isinstance(got[1], float) == slot.is_float):
                return False
        return True

    def with_exprs(self) -> list:
        """Probe 0's steps, each moving number replaced by its `Expr`."""
        pos = iter(range(len(self.leaves)))

        def visit(x: Any) -> Any:
            i = next(pos)
            return Expr(self.slots[i].text) if i in self.slots else x

        return _walk(list(self.steps), visit)


def _step_unit(programs: list[Program], cands: Candidates) -> StepUnit | str:
    parsed = [_leaves(p.steps) for p in programs]
    first = parsed[0]
    if any(len(p) != len(first) or q.num_inputs != programs[0].num_inputs for p, q in zip(parsed[1:], programs[1:])):
        return f"the wrapper's steps differ {_STRUCTURE}"
    slots: dict[int, Slot] = {}
    for i, leaf in enumerate(first):
        others = [p[i] for p in parsed[1:]]
        if all(o == leaf for o in others):
            continue
        nums = [leaf] + others
        if not all(isinstance(x, tuple) and x[0] == "num" for x in nums):
            return f"the wrapper's steps differ {_STRUCTURE} (near {leaf!r})"
        slot = cands.find(tuple(x[1] for x in nums))
        if slot is None:
            return f"no size expression gives the numbers {[x[1] for x in nums]} of the probes"
        slots[i] = slot
    return StepUnit(list(programs[0].steps), first, slots)


@dataclass
class Template:
    """Sources of one bucket with sizes as arguments, and the checks that reuse it."""

    sizes: dict                    # the sizes it was built from (probe 0)
    kernels: dict[str, Unit]
    wrapper: StepUnit
    consts: dict
    kernel_texts: dict[str, str]   # generated Triton source with size arguments
    wrapper_text: str              # generated `call(args, sizes)`
    symbols: tuple
    size_arg_types: dict[str, list[str]] = field(default_factory=dict)  # kernel -> Triton types of sz0, sz1, …
    call: Callable | None = None

    @property
    def launched(self) -> dict[str, str]:
        """The kernels the wrapper launches (members of a global group are only
        phases of its kernel), name -> text."""
        heads = {st.kernel for st in self.wrapper.steps if isinstance(st, Launch)}
        return {n: t for n, t in self.kernel_texts.items() if n in heads}

    @property
    def generic(self) -> bool:
        return any(u.slots for u in list(self.kernels.values()) + [self.wrapper])

    def matches(self, kernel_texts: dict[str, str], program: Program, consts: dict, values: dict) -> bool:
        """Whether the template, at `values`, is what the static pipeline generated at
        those sizes: kernels token for token, the wrapper step for step."""
        if set(kernel_texts) != set(self.kernels) or not _same_consts(consts, self.consts):
            return False
        args = tuple(values[s] for s in self.symbols)
        for name, unit in self.kernels.items():
            toks, _ = _tokens(kernel_texts[name])
            if len(toks) != len(unit.tokens):
                return False
            for i, ((_, s), fixed) in enumerate(zip(toks, unit.tokens)):
                slot = unit.slots.get(i)
                if slot is None:
                    if s != fixed:
                        return False
                elif _number(s) != slot.fn(*args) or isinstance(_number(s), float) != slot.is_float:
                    return False
        return self.wrapper.matches(program.steps, args)


def _same_consts(a: dict, b: dict) -> bool:
    if set(a) != set(b):
        return False
    for k in a:
        x, y = a[k], b[k]
        if isinstance(x, torch.Tensor) or isinstance(y, torch.Tensor):
            if not (isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor) and x.shape == y.shape
                    and x.dtype == y.dtype and torch.equal(x.cpu(), y.cpu())):
                return False
        elif type(x) is not type(y):
            return False
        elif isinstance(x, (_BarrierCounter, Checker, SeedBuffer)):
            continue  # per-wrapper state (the grid-barrier counter, eager-result checks), not a value
        elif x != y:
            return False
    return True


def differs_in_structure(reason: str) -> bool:
    """Whether `build` refused because the probes' sources are not the same code up to
    numbers (other kernels, other steps: a plan choice that flips inside the bucket),
    rather than because a number is no size expression."""
    return _STRUCTURE in reason


def build(sig: Signature, probes: list[dict], builds: list[tuple[dict[str, str], Program, dict]]) -> Template | str:
    """A template from the sources generated at each probe (probe 0 first), or the
    reason there is none."""
    k0, w0, c0 = builds[0]
    for kt, _, consts in builds[1:]:
        if list(kt) != list(k0):
            return f"the kernels differ {_STRUCTURE}"
        if not _same_consts(consts, c0):
            return f"the wrapper's constants differ {_STRUCTURE}"
    cands = Candidates(sig, probes)
    kernels: dict[str, Unit] = {}
    for name in k0:
        u = _unit([b[0][name] for b in builds], cands, kernel=True)
        if isinstance(u, str):
            return f"kernel {name}: {u}"
        kernels[name] = u
    wrapper = _step_unit([b[1] for b in builds], cands)
    if isinstance(wrapper, str):
        return f"wrapper: {wrapper}"
    kernel_texts, kernel_args, arg_types = {}, {}, {}
    for name, u in kernels.items():
        exprs = list(dict.fromkeys(u.slots[i].text for i in sorted(u.slots)))  # one argument per expression
        arg_of = {e: f"sz{j}" for j, e in enumerate(exprs)}
        text = _substitute(u, lambda i: arg_of[u.slots[i].text])
        if exprs:
            head, sep, rest = text.partition("):\n")
            text = head + "".join(f", {arg_of[e]}" for e in exprs) + sep + rest
        kernel_texts[name] = text
        kernel_args[name] = exprs
        floats = {u.slots[i].text: u.slots[i].is_float for i in u.slots}
        arg_types[name] = ["fp32" if floats[e] else "i32" for e in exprs]
    steps = [dataclasses.replace(st, size_args=tuple(f"({e})" for e in kernel_args[st.kernel]))
             if isinstance(st, Launch) and kernel_args.get(st.kernel) else st for st in wrapper.with_exprs()]
    program = Program(steps, builds[0][1].num_inputs, c0)
    wtext = program.render(sizes=tuple(f"ks{i}" for i in range(len(sig.symbols))))
    return Template(dict(probes[0]), kernels, wrapper, c0, kernel_texts, wtext, tuple(sig.symbols), arg_types)


def _substitute(u: Unit, name_of: Callable[[int], str]) -> str:
    out, pos = [], 0
    for i in sorted(u.slots):
        a, b = u.spans[i]
        out.append(u.text[pos:a])
        out.append(name_of(i))
        pos = b
    out.append(u.text[pos:])
    return "".join(out)
