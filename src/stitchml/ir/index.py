"""Symbolic index expressions: integer linear combinations of atoms.

Views are index maps, so every value a kernel reads is addressed by an expression of
the kernel's axis variables.  The simplifier knows just enough to cancel the
flatten/unravel pairs that reshapes produce (`(a*C + b) // C == a` when `0 <= b < C`),
using value bounds; anything it cannot prove stays a floor-division or modulo atom.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from math import gcd


class IndexMismatch(Exception):
    """A value was requested at an index its kernel's domain cannot provide (a row
    value at a column-dependent position).  The planner's dry run catches exactly this
    to keep such ops in separate kernels; any other exception is a bug, not a verdict."""


@dataclass(frozen=True)
class Var:
    """An axis variable of a kernel's iteration domain, lo <= value < size (lo > 0
    only for the variable as seen inside a branch of a cat: `restrict`)."""

    name: str
    size: int
    axis: str  # "row" or "col": which program axis the variable is derived from
    lo: int = 0


@dataclass(frozen=True)
class Loaded:
    """An index read from memory (gather); `deps` are the axes its own index uses."""

    name: str
    bound: int
    deps: frozenset[str]


@dataclass(frozen=True)
class Div:
    expr: "Expr"
    d: int


@dataclass(frozen=True)
class Mod:
    expr: "Expr"
    m: int


Atom = Var | Loaded | Div | Mod


@dataclass(frozen=True)
class Expr:
    terms: tuple[tuple[Atom, int], ...]
    const: int = 0

    def __add__(self, other: "Expr | int") -> "Expr":
        other = other if isinstance(other, Expr) else const(other)
        return _make(list(self.terms) + list(other.terms), self.const + other.const)

    def __sub__(self, other: "Expr | int") -> "Expr":
        other = other if isinstance(other, Expr) else const(other)
        return self + other * -1

    def __mul__(self, k: int) -> "Expr":
        if k == 0:
            return const(0)
        return _make([(a, c * k) for a, c in self.terms], self.const * k)

    @property
    def is_const(self) -> bool:
        return not self.terms


def _make(terms: list[tuple[Atom, int]], c: int) -> Expr:
    acc: dict[Atom, int] = {}
    for a, k in terms:
        acc[a] = acc.get(a, 0) + k
    # (e // m) * m + e % m == e, with floor and with truncating division alike: a
    # reshape of an unravelled index flattens back to the index itself (a scan read
    # through a reshape is then read at its own column)
    folded = True
    while folded:   # a fold can make another one possible (nested unravels)
        folded = False
        for md in [a for a, k in acc.items() if k and isinstance(a, Mod)]:
            k, dv = acc[md], _div_partner(md)
            if acc.get(dv, 0) != k * md.m:
                dv = _simplified_partner(md, dv)
            if k and acc.get(md) == k and acc.get(dv, 0) == k * md.m:
                acc[md] = acc[dv] = 0
                for a, k2 in md.expr.terms:
                    acc[a] = acc.get(a, 0) + k * k2
                c += k * md.expr.const
                folded = True
    items = sorted(((a, k) for a, k in acc.items() if k != 0), key=lambda t: repr(t[0]))
    return Expr(tuple(items), c)


def _div_partner(md: Mod) -> Div:
    """The division that completes `md` to its dividend: e // m for e % m; for
    (x // a) % m it is x // (a*m), the form `floordiv` gives (x // a) // m."""
    e = md.expr
    if len(e.terms) == 1 and e.const == 0 and e.terms[0][1] == 1 and isinstance(e.terms[0][0], Div):
        inner = e.terms[0][0]
        return Div(inner.expr, inner.d * md.m)
    return Div(e, md.m)


@lru_cache(maxsize=8192)   # (asked again at every arithmetic step of an index that holds the modulo)
def _simplified_partner(md: Mod, dv: Div) -> Atom:
    """`dv` (the division that completes `md`) as `floordiv` simplifies it, where that is
    one atom: a channels-last image batch [N, H, W, C] viewed as chunks of rows [K, CH,
    C] (`capture/decomp.py::_chunk_stats`) reads row f = c + 98 k at n = f // 3136,
    which `floordiv` writes k // 32 (c < 98), so the syntactic partner of h = (f // 56)
    % 56 was missing and the address stayed two divisions and two modulos an element
    where it is f * C + c."""
    q = floordiv(dv.expr, dv.d)
    if len(q.terms) == 1 and q.const == 0 and q.terms[0][1] == 1 and q.terms[0][0] != dv:
        return q.terms[0][0]
    return dv


def const(c: int) -> Expr:
    return Expr((), int(c))


def var(name: str, size: int, axis: str) -> Expr:
    if size == 1:
        return const(0)
    return Expr(((Var(name, size, axis), 1),), 0)


def loaded(name: str, bound: int, deps: frozenset[str]) -> Expr:
    return Expr(((Loaded(name, bound, deps), 1),), 0)


def _atom_bounds(a: Atom) -> tuple[int, int]:
    if isinstance(a, Var):
        return a.lo, a.size - 1
    if isinstance(a, Loaded):
        return 0, max(a.bound - 1, 0)
    if isinstance(a, Div):
        lo, hi = bounds(a.expr)
        return lo // a.d, hi // a.d
    lo, hi = bounds(a.expr)
    if lo >= 0:
        return 0, min(hi, a.m - 1)
    return -(a.m - 1), a.m - 1


def bounds(e: Expr) -> tuple[int, int]:
    lo = hi = e.const
    for a, k in e.terms:
        alo, ahi = _atom_bounds(a)
        if k > 0:
            lo, hi = lo + k * alo, hi + k * ahi
        else:
            lo, hi = lo + k * ahi, hi + k * alo
    return lo, hi


def evaluate(e: Expr, values: dict[str, int]) -> int | None:
    """The value of `e` with its variables set by name (absent ones 0); None if it
    reads a loaded index.  Floor division and modulo as Python's (the planner uses this
    to probe strides at non-negative points, where they agree with the kernel's)."""
    total = e.const
    for a, k in e.terms:
        if isinstance(a, Var):
            v = values.get(a.name, 0)
        elif isinstance(a, Loaded):
            return None
        else:
            inner = evaluate(a.expr, values)
            if inner is None:
                return None
            v = inner // a.d if isinstance(a, Div) else inner % a.m
        total += k * v
    return total


def floordiv(e: Expr, d: int) -> Expr:
    if d == 1:
        return e
    if d == 0:  # a zero extent: the domain is empty, no element is ever addressed
        return const(0)
    lo, hi = bounds(e)
    if lo >= 0 and lo // d == hi // d:   # (one quotient over the whole range)
        return const(lo // d)
    if lo >= 0:
        q = [(a, k // d) for a, k in e.terms if k % d == 0]
        r = [(a, k) for a, k in e.terms if k % d != 0]
        rem = _make(r, e.const % d)
        rlo, rhi = bounds(rem)
        if rlo >= 0 and rlo // d == rhi // d:
            return _make(q, e.const // d + rlo // d)
        if rlo >= 0 and (q or e.const // d):
            # (q*d + rem) // d == q + rem // d for rem >= 0: the multiples of d leave the
            # division (so an unravelled index flattens back: see `_make`)
            return _make(q, e.const // d) + floordiv(rem, d)
        if len(e.terms) == 1 and e.const == 0 and e.terms[0][1] == 1 and isinstance(e.terms[0][0], Div):
            inner = e.terms[0][0]
            return floordiv(inner.expr, inner.d * d)
        # divide in two steps through a coefficient that divides d: (j*C + i) // (T*C) -> j // T
        for c in sorted({abs(k) for _, k in e.terms}, reverse=True):
            if 1 < c < d and d % c == 0:
                inner = floordiv(e, c)
                if not _is_atom_of(inner, Div, e):
                    return floordiv(inner, d // c)
    return Expr(((Div(e, d), 1),), 0)


def mod(e: Expr, m: int) -> Expr:
    if m <= 1:  # (m == 0: a zero extent, the domain is empty; nothing is ever addressed)
        return const(0)
    lo, hi = bounds(e)
    if lo >= 0 and lo // m == hi // m:   # (one quotient over the whole range)
        return e - (lo // m) * m
    if lo >= 0:
        kept = _make([(a, k) for a, k in e.terms if k % m != 0], e.const % m)
        klo, khi = bounds(kept)
        if klo < 0:
            # negative coefficients (a reversed dim: 49 - i) can make the reduced
            # expression negative, where Triton's `%` (the sign of the dividend) would
            # differ from the floor modulo: shift it by a multiple of m to stay >= 0
            shift = m * (-(klo // m))
            kept, klo, khi = kept + shift, klo + shift, khi + shift
        if klo >= 0 and klo // m == khi // m:
            return kept - (klo // m) * m
        return Expr(((Mod(kept, m), 1),), 0)
    return Expr(((Mod(e, m), 1),), 0)


def restrict(e: Expr, v: Var, lo: int, hi: int) -> Expr:
    """`e` with variable `v` known to lie in [lo, hi) (inside a cat's branch, whose
    loads are masked to those positions): the same value wherever the variable is in
    that range, simplified with the tighter bounds.  A rotary embedding's rotate-half
    reads `x[..., 32:]` in the branch `r3 < 32` as `(r3 + 32) // 64`, which is 0 there:
    without the range every such quotient stayed a division in the kernel, and Triton
    issued the read element by element (LLaMA's q/k kernels, bench/NOTES.md)."""
    narrow = Var(v.name, min(hi, v.size), v.axis, max(lo, v.lo))

    def sub(x: Expr) -> Expr:
        out = const(x.const)
        for a, k in x.terms:
            if a == v:
                out = out + Expr(((narrow, 1),), 0) * k
            elif isinstance(a, Div):
                out = out + floordiv(sub(a.expr), a.d) * k
            elif isinstance(a, Mod):
                out = out + mod(sub(a.expr), a.m) * k
            else:
                out = out + Expr(((a, 1),), 0) * k
        return out
    return sub(e)


def _is_atom_of(e: Expr, kind: type, inner: Expr) -> bool:
    return (len(e.terms) == 1 and e.const == 0 and isinstance(e.terms[0][0], kind)
            and e.terms[0][0].expr == inner)


def axes(e: Expr) -> frozenset[str]:
    """Which program axes ("row", "col") the expression depends on."""
    out: set[str] = set()
    for a, _ in e.terms:
        if isinstance(a, Var):
            out.add(a.axis)
        elif isinstance(a, Loaded):
            out |= a.deps
        else:
            out |= axes(a.expr)
    return frozenset(out)


def render(e: Expr, atom: Callable[[Atom], str] | None = None) -> str:
    """e as Python/Triton text; `atom` renders each atom (default `render_atom`: a
    division or modulo inline, its operand rendered the same way)."""
    atom = atom or render_atom
    parts = []
    for a, k in e.terms:
        s = atom(a)
        parts.append(s if k == 1 else f"{s} * {k}")
    if e.const or not parts:
        parts.append(str(e.const))
    return " + ".join(parts).replace("+ -", "- ")


def render_atom(a: Atom, inner: Callable[[Expr], str] | None = None) -> str:
    """One atom as text; a division's or modulo's operand rendered by `inner`."""
    if isinstance(a, (Var, Loaded)):
        return a.name
    inner = inner or render
    if isinstance(a, Div):
        return f"(({inner(a.expr)}) // {a.d})"
    return f"(({inner(a.expr)}) % {a.m})"


def flatten(index: tuple[Expr, ...], shape: tuple[int, ...]) -> Expr:
    """Row-major linear position of `index` in `shape`."""
    flat, stride = const(0), 1
    for e, s in zip(reversed(index), reversed(shape)):
        flat = flat + e * stride
        stride *= s
    return flat


def unravel(flat: Expr, shape: tuple[int, ...]) -> tuple[Expr, ...]:
    if 0 in shape:  # an empty shape: no position exists, and every stride below would be 0
        return tuple(const(0) for _ in shape)
    out, stride = [], 1
    for s in reversed(shape):
        out.append(const(0) if s == 1 else mod(floordiv(flat, stride), s))
        stride *= s
    return tuple(reversed(out))


def offset(index: tuple[Expr, ...], strides: tuple[int, ...], base: int = 0) -> Expr:
    off = const(base)
    for e, st in zip(index, strides):
        off = off + e * st
    return off


__all__ = ["Expr", "Var", "Loaded", "Div", "Mod", "const", "var", "loaded", "bounds", "evaluate", "floordiv",
           "mod", "axes", "render", "flatten", "unravel", "offset", "restrict", "gcd"]
