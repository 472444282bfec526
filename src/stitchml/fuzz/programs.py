"""Seeded random programs: the generator half of the fuzzer (profiles, knobs, the
program builder)."""
from __future__ import annotations

import math
import os
import random
import re
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from ..capture.decomp_window import _out_size   # (torch's pooled length: the emitted shape)

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16, "fp64": torch.float64}
_EPS = {torch.float32: 2.0 ** -23, torch.float16: 2.0 ** -10, torch.bfloat16: 2.0 ** -7, torch.float64: 2.0 ** -52}
ATOL_EPS = 16          # tolerance floor: this many ulps of the output's dtype, times its scale
FP32_DIRECT = (1e-4, 1e-5)  # fp32 alternative: rtol, atol (relative to the scale) against eager
# fp64 likewise: a summation order of its own moves a double result by tens of ulps where eager's
# error against itself is 0, and a value that went through float32 is off by ~1e-7
FP64_DIRECT = (1e-10, 1e-11)
# CPU tensors under the Triton interpreter; CUDA tensors on a GPU without it
DEVICE = torch.device("cuda" if torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET", "0") in ("", "0")
                      else "cpu")
DIM_POOL = [1, 1, 2, 3, 4, 5, 6, 7, 8, 9, 11, 12, 13, 16, 17, 24, 31, 32, 33, 48, 63, 64, 100, 127, 128, 257]


@dataclass(frozen=True)
class Profile:
    name: str
    max_numel: int      # largest tensor a program may create
    max_input: int      # largest input
    min_ops: int = 2
    max_ops: int = 30
    short_bias: bool = True  # favour short programs (the least of 3 draws; CI speed); else uniform
    min_block: int = 128     # smallest pointwise_block / block_elems drawn (tiny blocks: many programs,
                             # which the interpreter runs one by one)


PROFILES = {"ci": Profile("ci", 1024, 384), "long": Profile("long", 3072, 1024, short_bias=False, min_block=32)}

KNOB_CHOICES = {
    "pointwise_block": [64, 128, 256, 1024],
    "persistent_max_cols": [8, 16, 32, 64, 8192],
    "loop_block_cols": [4, 8, 16, 32],
    "block_elems": [32, 128, 512, 4096],
    "horizontal_fusion": [True, False],
    "global_barriers": [True, False],
    "ilp": [True, False],
}
# few long rows split into chunks (plan/split.py) at the interpreter's tiny sizes: drawn
# from a stream of its own, so the programs (and the rest of their knobs) stay those of
# the seeds before this knob existed
SPLIT_MIN_COLS = 16
SPLIT_SHARE = 0.25
# programs that also concatenate parts other kernels write (`_Builder.placed_cat`), from
# seed PLACED_CAT_FROM on: the programs of earlier seeds, pinned in tests and docs/FUZZ.md,
# stay what they were (an appended op moves which values are returned)
PLACED_CAT_SHARE = 0.25
PLACED_CAT_FROM = 19800
# forward programs that end by writing computed values into some of their inputs
# (`a0.copy_(v7)`: what an optimizer step does; `_Builder.write_inputs`), from seed
# IN_PLACE_FROM on; the written inputs are compared after the call like outputs
IN_PLACE_SHARE = 0.3
IN_PLACE_FROM = 26000
# looped column partials walked on a persistent grid wherever they apply
# (`walk_looped_partials=on`; under `auto` the interpreter's tiny sizes never price them
# lower), from seed WALKED_PARTIALS_FROM on, from a stream of its own
WALKED_PARTIALS_SHARE = 0.3
WALKED_PARTIALS_FROM = 31600
# programs compiled with symbolic sizes (`torch.compile(dynamic=True)`: the dynamic stage,
# its probes at other sizes of each mapping bucket and its templates; `dynamic/runner.py`),
# from seed DYNAMIC_FROM on, from a stream of their own.  The program's literal shapes
# (reshapes, pools) become guards that may leave a bucket one size: then an exact template
# runs, which is still the dynamic stage's code path
DYNAMIC_SHARE = 0.25
DYNAMIC_FROM = 33600
# float64 programs: a share of the float32 ones from seed FP64_FROM on (a stream of their own;
# the rest of a program's draws are a float32 program's), judged against eager float64 with
# FP64_DIRECT as the alternative; no cast islands and no Bessel/Airy functions (eager's own
# float64 Bessel J/Y are off by up to 4e-7 against mpmath, ours by 1e-16: it cannot judge them)
FP64_SHARE = 0.25
FP64_FROM = 35200
HALF = ("fp16", "bf16")
# complex arithmetic on pairs of reals (`lower/rules_complex.py`: rotary embeddings written
# with complex numbers, as the original LLaMA code), float32 and float64 programs (eager's
# complex32 has few CPU kernels), from seed COMPLEX_FROM on, from a stream of its own
COMPLEX_SHARE = 0.25
COMPLEX_FROM = 37200
# integer islands (`_Builder.integer_ops`): integers made exactly from an input, through
# integer and bool ops (gcd/lcm, floor division, bit ops, shifts, pools, accumulates into
# bools), back into the float chain, from seed INTEGER_FROM on, from a stream of its own
INTEGER_SHARE = 0.25
INTEGER_FROM = 40400
# strided views and writes through views (`_Builder.strided_ops`: unfold, as_strided of a
# contiguous copy, diagonals, the scatters of views, in-place ops on views of a clone,
# roll/tril/repeat, channels-last), from seed STRIDED_FROM on, from a stream of its own
STRIDED_SHARE = 0.3
STRIDED_FROM = 41600
CONSUMED_VIEWS_FROM = 45600   # (overlapping views followed by `* 1.25`: `_Builder.consumed`)
# model-level ops of torch.nn.functional (`_Builder.layer_ops`: group/instance/RMS norms,
# losses with literal targets, activations with parameters, padding, interpolation, pools,
# embedding_bag), from seed LAYERS_FROM on, from a stream of its own
LAYERS_SHARE = 0.3
LAYERS_FROM = 44000
# float8 islands (`_Builder.float8_ops`): an input scaled by a power of two (exact), cast to
# float8_e4m3fn or float8_e5m2 and back or read as its bits, a factor of a value of the
# chain, from seed FLOAT8_FROM on, from a stream of its own
FLOAT8_SHARE = 0.2
FLOAT8_FROM = 52200


@dataclass(frozen=True)
class InputSpec:
    name: str
    shape: tuple[int, ...]
    layout: str          # contiguous | perm:1,0,2 | step:D | offset:D | expand:D
    grad: bool
    scale: float = 2.0   # values uniform in [-scale, scale]


@dataclass
class Program:
    seed: int
    profile: str
    dtype: str
    backward: bool
    knobs: dict[str, Any]
    inputs: list[InputSpec]
    lines: list[str]
    outputs: list[str]
    written: list[int] = field(default_factory=list)   # inputs the program writes (compared after the call)
    dynamic: bool = False   # compiled with symbolic sizes (`torch.compile(dynamic=True)`)

    def source(self) -> str:
        args = ", ".join(i.name for i in self.inputs)
        body = [f"    {line}" for line in self.lines] + [f"    return ({''.join(o + ', ' for o in self.outputs)})"]
        return f"def program({args}):\n" + "\n".join(body) + "\n"

    def describe(self) -> str:
        ins = ", ".join(f"{i.name}{list(i.shape)}{'' if i.layout == 'contiguous' else ':' + i.layout}"
                        f"{'' if i.grad else ':nograd'}" for i in self.inputs)
        knobs = ",".join(f"{k}={v}" for k, v in self.knobs.items()) or "defaults"
        return (f"seed={self.seed} profile={self.profile} {self.dtype} {'fwd+bwd' if self.backward else 'fwd'}"
                f"{' dynamic' if self.dynamic else ''} "
                f"knobs[{knobs}] inputs[{ins}] | {'; '.join(self.lines)} | return {', '.join(self.outputs)}")

    @property
    def num_ops(self) -> int:
        return len(self.lines)


@dataclass
class _Value:
    name: str
    shape: tuple[int, ...]
    bound: float        # rough bound of |value|, keeps exp/pow/sums in range
    hi: bool = False    # computed in the HI dtype (float32) inside a low-precision program
    is_input: bool = False


def _promoted_hi(*vals: _Value) -> bool:
    """Whether torch's type promotion gives the HI dtype: a 0-d operand's dtype counts
    only when every operand is 0-d (a float32 scalar tensor beside a bfloat16 matrix
    gives bfloat16)."""
    dimmed = [v for v in vals if v.shape]
    return any(v.hi for v in (dimmed or vals))


def _numel(shape) -> int:
    return math.prod(shape)


def _fmt(shape) -> str:
    return "(" + "".join(f"{s}, " for s in shape).rstrip(" ") + ")" if len(shape) != 1 else f"({shape[0]},)"


class _Builder:
    """Grows one random program; every op method returns False if it does not apply."""

    def __init__(self, rng: random.Random, prof: Profile, dtype: str, backward: bool):
        self.rng, self.prof, self.dtype, self.backward = rng, prof, dtype, backward
        self.inputs: list[InputSpec] = []
        self.values: list[_Value] = []
        self.lines: list[str] = []
        self.used: set[str] = set()
        # appended to a view that may overlap (`strided_ops`), from seed CONSUMED_VIEWS_FROM on:
        # a program output that is an overlapping view of an intermediate gets a wrong gradient
        # from AOTAutograd itself (aot_eager too), which leaves such cases without a verdict
        self.consumed = ""

    # -- helpers
    def shape(self, budget: int | None = None, rank: int | None = None) -> tuple[int, ...]:
        budget = budget or self.prof.max_input
        rank = rank if rank is not None else self.rng.choice([1, 2, 2, 3, 3, 4])
        dims: list[int] = []
        for _ in range(rank):
            left = budget // max(_numel(dims), 1)
            fits = [d for d in DIM_POOL if d <= left] or [1]
            dims.append(self.rng.choice(fits))
        return tuple(dims)

    def new_input(self, shape: tuple[int, ...], grad: bool | None = None, layout: str | None = None) -> _Value:
        rng = self.rng
        if layout is None:
            kinds = ["contiguous"] * 3 + ["perm", "step", "offset", "expand"]
            kind = rng.choice(kinds)
            layout = "contiguous"
            if kind == "perm" and len(shape) >= 2:
                p = list(range(len(shape)))
                while p == sorted(p):
                    rng.shuffle(p)
                layout = "perm:" + ",".join(map(str, p))
            elif kind in ("step", "offset") and shape:
                layout = f"{kind}:{rng.randrange(len(shape))}"
            elif kind == "expand" and any(s > 1 for s in shape):
                layout = f"expand:{rng.choice([d for d, s in enumerate(shape) if s > 1])}"
        grad = self.backward if grad is None else grad and self.backward
        spec = InputSpec(f"a{len(self.inputs)}", tuple(shape), layout, grad, rng.choice([0.5, 1.0, 2.0, 2.0]))
        self.inputs.append(spec)
        v = _Value(spec.name, spec.shape, spec.scale, False, True)
        self.values.append(v)
        return v

    def emit(self, expr: str, shape, bound: float, hi: bool = False) -> _Value:
        v = _Value(f"v{len(self.lines)}", tuple(shape), bound, hi and self.dtype in HALF)
        self.lines.append(f"{v.name} = {expr}")
        self.used.update(re.findall(r"\b[av]\d+\b", expr))
        self.values.append(v)
        return v

    def pick(self) -> _Value:
        """Mostly the newest value (chains), sometimes an older one (a DAG)."""
        computed = [v for v in self.values if not v.is_input]
        if computed and self.rng.random() < 0.6:
            return computed[-1]
        return self.rng.choice(self.values)

    def tame(self, x: _Value, limit: float) -> _Value:
        if x.bound <= limit:
            return x
        if self.rng.random() < 0.5:
            return self.emit(f"torch.tanh({x.name})", x.shape, 1.0, x.hi)
        s = float(f"{limit / x.bound:.3g}")
        return self.emit(f"{x.name} * {s}", x.shape, x.bound * s, x.hi)

    def dim(self, x: _Value) -> int:
        d = self.rng.randrange(len(x.shape))
        return d - len(x.shape) if self.rng.random() < 0.3 else d

    def broadcast_partner(self, x: _Value) -> tuple[_Value, tuple[int, ...]]:
        """A second operand for a binary op, and the result shape."""
        rng = self.rng
        others = []
        for v in self.values:
            try:
                out = torch.broadcast_shapes(x.shape, v.shape)
            except RuntimeError:
                continue
            if _numel(out) <= self.prof.max_numel and len(out) <= 4 and (out == x.shape or rng.random() < 0.3):
                others.append((v, tuple(out)))
        if others and rng.random() < 0.45:
            return rng.choice(others)
        shape = list(x.shape[rng.randrange(len(x.shape) + 1):] if x.shape and rng.random() < 0.3 else x.shape)
        for d in range(len(shape)):
            if rng.random() < 0.3:
                shape[d] = 1
        if rng.random() < 0.15 and len(shape) == len(x.shape) < 4 and _numel(x.shape) * 3 <= self.prof.max_numel:
            shape = [3] + shape  # the partner is larger: the result grows a leading dim
            return self.new_input(tuple(shape)), tuple(torch.broadcast_shapes(x.shape, tuple(shape)))
        return self.new_input(tuple(shape)), x.shape

    # -- op families
    def unary(self) -> bool:
        rng, x = self.rng, self.pick()
        table: list[tuple[str, Callable[[float], float], float]] = [  # expr, bound, max input bound
            ("-{x}", lambda b: b, 1e9), ("{x}.abs()", lambda b: b, 1e9), ("torch.relu({x})", lambda b: b, 1e9),
            ("torch.sigmoid({x})", lambda b: 1, 1e9), ("torch.tanh({x})", lambda b: 1, 1e9),
            ("torch.sin({x})", lambda b: 1, 1e9), ("torch.cos({x})", lambda b: 1, 1e9),
            ("torch.erf({x})", lambda b: 1, 1e9), ("torch.exp({x})", math.exp, 4),
            ("torch.expm1({x})", math.exp, 4), ("torch.exp2({x})", lambda b: 2 ** b, 5),
            ("torch.log({x}.abs() + 0.1)", lambda b: max(2.31, math.log(b + 0.1)), 1e9),
            ("torch.log1p({x}.abs())", math.log1p, 1e9),
            ("torch.log2({x}.abs() + 0.1)", lambda b: max(3.33, math.log2(b + 0.1)), 1e9),
            ("torch.sqrt({x}.abs() + 0.1)", lambda b: math.sqrt(b + 0.1), 1e9),
            ("torch.rsqrt({x}.abs() + 0.1)", lambda b: 3.2, 1e9),
            ("torch.reciprocal({x}.abs() + 0.5)", lambda b: 2, 1e9),
            ("{x} * {x}", lambda b: b * b, 30), ("torch.pow({x}, 2)", lambda b: b * b, 30),
            ("{x} ** 3", lambda b: b ** 3, 8), ("torch.pow({x}.abs() + 0.1, 1.5)", lambda b: (b + 0.1) ** 1.5, 50),
            ("torch.square({x})", lambda b: b * b, 30),
            ("F.silu({x})", lambda b: b, 1e9), ("F.gelu({x})", lambda b: b, 1e9),
            ("F.gelu({x}, approximate='tanh')", lambda b: b, 1e9), ("F.softplus({x})", lambda b: b + 1, 1e9),
            ("F.leaky_relu({x}, 0.1)", lambda b: b, 1e9), ("F.elu({x})", lambda b: b, 1e9),
            ("F.hardtanh({x}, -0.5, 0.75)", lambda b: 0.75, 1e9),
            ("{x}.clamp(-0.6, 0.4)", lambda b: 0.6, 1e9), ("{x}.clamp(min=-0.3)", lambda b: b, 1e9),
            ("torch.clamp_max({x}, 0.2)", lambda b: b, 1e9),
            # inverse and hyperbolic functions, arguments kept inside their domains and away
            # from the edges where the derivative blows up (issues 18/19)
            ("torch.atan({x})", lambda b: 1.58, 1e9), ("torch.asinh({x})", math.asinh, 1e9),
            ("torch.sinh({x})", math.sinh, 4), ("torch.cosh({x})", math.cosh, 4),
            ("torch.asin(torch.tanh({x}) * 0.9)", lambda b: 1.12, 1e9),
            ("torch.acos(torch.tanh({x}) * 0.9)", lambda b: 2.7, 1e9),
            ("torch.atanh(torch.tanh({x}) * 0.9)", lambda b: 1.48, 1e9),
            ("torch.acosh({x}.abs() + 1.1)", lambda b: math.acosh(b + 1.1), 1e9),
            ("torch.tan(torch.tanh({x}))", lambda b: 1.56, 1e9),
            ("torch.log10({x}.abs() + 0.1)", lambda b: max(1.0, math.log10(b + 0.1)), 1e9),
        ]
        if x.is_input:  # discontinuous ops only on exact inputs: low and high precision agree there
            table += [("torch.floor({x})", lambda b: b + 1, 1e9), ("torch.ceil({x})", lambda b: b + 1, 1e9),
                      ("torch.round({x})", lambda b: b + 1, 1e9), ("torch.trunc({x})", lambda b: b, 1e9),
                      ("torch.sign({x})", lambda b: 1, 1e9), ("{x} * ({x} > 0.25)", lambda b: b, 1e9)]
        expr, bound, limit = rng.choice(table)
        if x.bound > limit:
            x = self.tame(x, limit)
        self.emit(expr.format(x=x.name), x.shape, bound(x.bound), x.hi)
        return True

    def binary(self) -> bool:
        rng = self.rng
        x = self.tame(self.pick(), 100)
        if rng.random() < 0.25:  # with a Python scalar
            c = rng.choice([0.5, -0.75, 1.5, 2.0, 3.0, -2.5])
            ops = [(f"{x.name} + {c}", x.bound + abs(c)), (f"{x.name} * {c}", x.bound * abs(c)),
                   (f"{c} - {x.name}", x.bound + abs(c)), (f"{x.name} / {c}", x.bound / abs(c)),
                   (f"{c} / ({x.name}.abs() + 0.5)", abs(c) * 2)]
            if x.is_input:  # discontinuous: only on exact inputs (fmod is exact, so every dtype agrees)
                ops.append((f"torch.fmod({x.name}, {c})", abs(c)))
            expr, b = rng.choice(ops)
            self.emit(expr, x.shape, b, x.hi)
            return True
        y, out = self.broadcast_partner(x)
        y = self.tame(y, 100)
        hi = _promoted_hi(x, y)
        a, b = x.name, y.name
        ops = [(f"{a} + {b}", x.bound + y.bound), (f"{a} - {b}", x.bound + y.bound),
               (f"{a} * {b}", x.bound * y.bound), (f"{a} / ({b}.abs() + 0.5)", 2 * x.bound),
               (f"{a} / (1 + {b} * {b})", x.bound), (f"torch.maximum({a}, {b})", max(x.bound, y.bound)),
               (f"torch.minimum({a}, {b})", max(x.bound, y.bound)),
               (f"torch.pow({a}.abs() + 0.5, torch.tanh({b}))", max(2.0, x.bound + 0.5)),
               (f"torch.atan2({a}, {b}.abs() + 0.5)", 1.58),
               # (eager has no gradient with respect to a: detached)
               (f"torch.igamma({a}.detach().abs() + 0.5, {b}.abs() + 0.1)", 1.0)]
        if x.hi == y.hi:  # lerp does not promote
            ops.append((f"torch.lerp({a}, {b}, 0.25)", max(x.bound, y.bound)))
        if y.is_input:
            ops.append((f"torch.where({b} > 0, {a}, {a} * 0.5)", x.bound))
            ops.append((f"{a} * ({b} < 0.3)", x.bound))
        expr, bound = rng.choice(ops)
        self.emit(expr, out, bound, hi)
        return True

    def where3(self) -> bool:
        x = self.pick()
        cond = self.new_input(x.shape[self.rng.randrange(len(x.shape) + 1):], grad=False)
        y, out = self.broadcast_partner(x)
        if out != x.shape:
            return False
        self.emit(f"torch.where({cond.name} > 0.5, {x.name}, {y.name})", x.shape, max(x.bound, y.bound),
                  _promoted_hi(x, y))
        return True

    def reduce(self) -> bool:
        rng, x = self.rng, self.pick()
        if not x.shape:
            return False
        x = self.tame(x, 100)
        r = len(x.shape)
        dims = sorted(rng.sample(range(r), rng.randint(1, r)))
        dims = [d - r if rng.random() < 0.3 else d for d in dims]
        keep = rng.random() < 0.5
        n = _numel([x.shape[d] for d in dims])
        out = tuple(1 if (d in dims or d - r in dims) else s for d, s in enumerate(x.shape)) if keep else \
            tuple(s for d, s in enumerate(x.shape) if d not in dims and d - r not in dims)
        ds = f"({', '.join(map(str, dims))},)" if len(dims) > 1 or rng.random() < 0.3 else str(dims[0])
        one = len(dims) == 1
        k = f", keepdim={keep}"
        ops = [(f"{x.name}.sum({ds}{k})", x.bound * n), (f"{x.name}.mean({ds}{k})", x.bound),
               (f"{x.name}.amax({ds}{k})", x.bound), (f"{x.name}.amin({ds}{k})", x.bound),
               (f"torch.logsumexp({x.name}, {ds}{k})", x.bound + math.log(n))]
        if n >= 2:
            ops.append((f"{x.name}.var({ds}, correction={rng.choice([0, 1])}{k})", x.bound ** 2))
            if not self.backward:  # std's gradient at a constant row (std = 0) is a convention
                ops.append((f"{x.name}.std({ds}{k})", x.bound))
        if one:
            d = dims[0]
            ops += [(f"{x.name}.max({d}{k}).values", x.bound), (f"{x.name}.min({d}{k})[0]", x.bound),
                    (f"torch.max({x.name}, {d}{k})[0]", x.bound)]
            if n <= 6 and x.bound <= 1.5:
                ops.append((f"{x.name}.prod({d}{k})", 1.5 ** n))
        if len(dims) == r and not keep and rng.random() < 0.3:
            out = ()
            ops = [(f"{x.name}.sum()", x.bound * n), (f"{x.name}.mean()", x.bound),
                   (f"{x.name}.amax()", x.bound), (f"{x.name}.max()", x.bound)]
        expr, bound = rng.choice(ops)
        self.emit(expr, out, bound, x.hi)
        return True

    def normalize(self) -> bool:
        rng, x = self.rng, self.pick()
        if not x.shape:
            return False
        x = self.tame(x, 50)
        d = self.dim(x)
        choice = rng.randrange(6)
        if choice == 0:
            self.emit(f"torch.softmax({x.name}, {d})", x.shape, 1.0, x.hi)
        elif choice == 1:
            self.emit(f"F.log_softmax({x.name}, dim={d})", x.shape, x.bound * 2 + math.log(x.shape[d]) + 1, x.hi)
        elif choice in (2, 3):  # layer norm over the trailing k dims, optional affine
            k = rng.randint(1, len(x.shape))
            ns = x.shape[len(x.shape) - k:]
            args = ""
            if rng.random() < 0.6 and not x.hi:  # eager wants affine params in the input's dtype
                w = self.new_input(ns, layout="contiguous")
                b = self.new_input(ns, layout="contiguous") if rng.random() < 0.7 else None
                args = f", {w.name}, {b.name if b else 'None'}"
            self.emit(f"F.layer_norm({x.name}, {_fmt(ns)}{args})", x.shape, 4.0 * 2 * 2 + 2, x.hi)
        elif choice == 4:  # layer norm over a non-trailing dim, by moving it last and back
            n = x.shape[d]
            self.emit(f"F.layer_norm({x.name}.movedim({d}, -1), ({n},)).movedim(-1, {d})", x.shape, 4.0 * 2, x.hi)
        else:
            if len(x.shape) < 2 or _numel(x.shape) // x.shape[1] < 2:
                return False
            if rng.random() < 0.5:
                self.emit(f"F.batch_norm({x.name}, None, None, training=True)", x.shape, 16.0, x.hi)
            else:   # with running statistics (updated in copies): the functional decomposition
                rm, rv = (self.new_input((x.shape[1],), grad=False, layout="contiguous") for _ in range(2))
                # (in x's dtype: eager on the CPU takes one dtype, or half x with float32 statistics)
                self.emit(f"F.batch_norm({x.name}, {rm.name}.to({x.name}.dtype).clone(), "
                          f"{rv.name}.abs().to({x.name}.dtype).clone(), "
                          f"training=True, "
                          f"momentum={rng.choice([0.1, 0.5])})", x.shape, 16.0, x.hi)
        return True

    def view(self) -> bool:
        rng, x = self.rng, self.pick()
        r = len(x.shape)
        choice = rng.randrange(9)
        if choice == 0 and r >= 2:
            i, j = rng.sample(range(r), 2)
            self.emit(f"{x.name}.transpose({i}, {j})", _swap(x.shape, i, j), x.bound, x.hi)
        elif choice == 1 and r >= 2:
            p = list(range(r))
            rng.shuffle(p)
            self.emit(f"{x.name}.permute({', '.join(map(str, p))})", tuple(x.shape[i] for i in p), x.bound, x.hi)
        elif choice == 2 and r == 2:
            self.emit(f"{x.name}.t()", x.shape[::-1], x.bound, x.hi)
        elif choice in (3, 4):
            shape = _factor(_numel(x.shape), rng)
            self.emit(f"{x.name}.reshape({_fmt(shape)})", shape, x.bound, x.hi)
        elif choice == 5 and r >= 2:
            s = rng.randrange(r - 1)
            e = rng.randrange(s + 1, r)
            shape = x.shape[:s] + (_numel(x.shape[s:e + 1]),) + x.shape[e + 1:]
            self.emit(f"{x.name}.flatten({s}, {e})", shape, x.bound, x.hi)
        elif choice == 6 and r < 4:
            d = rng.randrange(r + 1)
            shape = x.shape[:d] + (1,) + x.shape[d:]
            v = self.emit(f"{x.name}.unsqueeze({d})", shape, x.bound, x.hi)
            if rng.random() < 0.5 and _numel(shape) * 3 <= self.prof.max_numel:
                big = shape[:d] + (3,) + shape[d + 1:]
                self.emit(f"{v.name}.expand({_fmt(big)})", big, x.bound, x.hi)
        elif choice == 7 and 1 in x.shape:
            d = rng.choice([d for d, s in enumerate(x.shape) if s == 1])
            self.emit(f"{x.name}.squeeze({d})", x.shape[:d] + x.shape[d + 1:], x.bound, x.hi)
        elif choice == 8 and self.dtype in HALF:  # cast island
            if x.hi:
                self.emit(f"{x.name}.to(DT)", x.shape, x.bound)
            else:
                self.emit(f"{x.name}.to(HI)", x.shape, x.bound, True)
        else:
            return False
        return True

    def slice_cat(self) -> bool:
        rng, x = self.rng, self.pick()
        if not x.shape:
            return False
        r = len(x.shape)
        d = rng.randrange(r)
        n = x.shape[d]
        choice = rng.randrange(6)
        pre = ":, " * d
        if choice == 0 and n >= 2:  # basic or strided slice
            start = rng.randrange(n - 1)
            stop = rng.randrange(start + 1, n + 1)
            step = rng.choice([1, 1, 2, 3])
            m = len(range(start, stop, step))
            self.emit(f"{x.name}[{pre}{start}:{stop}{':' + str(step) if step > 1 else ''}]",
                      x.shape[:d] + (m,) + x.shape[d + 1:], x.bound, x.hi)
        elif choice == 1 and r >= 2:
            i = rng.randrange(n)
            self.emit(f"{x.name}.select({d}, {i - n if rng.random() < 0.3 else i})", x.shape[:d] + x.shape[d + 1:],
                      x.bound, x.hi)
        elif choice == 2 and n >= 2:  # rotate by cat of two narrows
            k = rng.randrange(1, n)
            self.emit(f"torch.cat([{x.name}.narrow({d}, {k}, {n - k}), {x.name}.narrow({d}, 0, {k})], {d})",
                      x.shape, x.bound, x.hi)
        elif choice == 3:  # cat with another tensor
            extra = rng.choice([1, 2, 3, 5])
            if _numel(x.shape) // n * (n + extra) > self.prof.max_numel:
                return False
            match = [v for v in self.values if len(v.shape) == r and v is not x and v.hi == x.hi
                     and all(a == b for i, (a, b) in enumerate(zip(v.shape, x.shape)) if i != d)]
            y = rng.choice(match) if match and rng.random() < 0.5 else \
                self.new_input(x.shape[:d] + (extra,) + x.shape[d + 1:])
            y = self.tame(y, 100)
            parts = [x.name, y.name] if rng.random() < 0.5 else [y.name, x.name]
            shape = x.shape[:d] + (n + y.shape[d],) + x.shape[d + 1:]
            self.emit(f"torch.cat([{', '.join(parts)}], {d - r if rng.random() < 0.3 else d})", shape,
                      max(x.bound, y.bound), x.hi)
        elif choice == 4 and r < 4 and _numel(x.shape) * 2 <= self.prof.max_numel:
            y, out = self.broadcast_partner(x)
            if out != x.shape or y.shape != x.shape or y.hi != x.hi:
                return False
            s = rng.randrange(r + 1)
            self.emit(f"torch.stack([{x.name}, {y.name}], {s})", x.shape[:s] + (2,) + x.shape[s:],
                      max(x.bound, y.bound), x.hi)
        elif choice == 5 and n >= 2:
            k = rng.randrange(1, n)
            parts = -(-n // k)
            i = rng.randrange(parts)
            m = len(range(i * k, min(n, (i + 1) * k)))
            self.emit(f"{x.name}.split({k}, {d})[{i}]", x.shape[:d] + (m,) + x.shape[d + 1:], x.bound, x.hi)
        else:
            return False
        return True

    # torch.special's Bessel and Airy functions (issue 19): no gradient and no half-precision
    # kernels in eager, so float32 programs only, on a detached copy of a value added back
    # to it (the gradient flows through the value); expr on t, bound of |result|
    SPECIALS = [("torch.special.bessel_j0({t})", 1.0), ("torch.special.bessel_j1({t})", 0.6),
                ("torch.special.bessel_y0({t}.abs() + 0.5)", 0.53), ("torch.special.bessel_y1({t}.abs() + 0.5)", 1.5),
                ("torch.special.modified_bessel_k0({t}.abs() + 0.5)", 0.93),
                ("torch.special.modified_bessel_k1({t}.abs() + 0.5)", 1.7),
                ("torch.special.scaled_modified_bessel_k0({t}.abs() + 0.5)", 1.53),
                ("torch.special.scaled_modified_bessel_k1({t}.abs() + 0.5)", 2.8),
                ("torch.special.airy_ai({t})", 0.54)]

    def special(self, rng: random.Random) -> bool:
        if self.dtype != "fp32":
            return False
        x = rng.choice(self.values)
        expr, bound = rng.choice(self.SPECIALS)
        self.emit(f"{x.name} + {expr.format(t=x.name + '.detach()')}", x.shape, x.bound + bound, x.hi)
        return True

    def indexed(self, rng: random.Random) -> bool:
        """Index, scatter and scan ops (issue 18), with their index tensors written into
        the program as literals.  Draws from its own `rng`, so programs without them
        are what they were before this family existed."""
        xs = [v for v in self.values if v.shape and all(s > 0 for s in v.shape)]
        if not xs:
            return False
        x = rng.choice(xs)
        r = len(x.shape)
        d = rng.randrange(r)
        n = x.shape[d]
        gen = torch.Generator().manual_seed(rng.randrange(2**31))

        def index(shape, unique: bool) -> str:
            """A literal long tensor of `shape` with values in [0, n): along dim d
            distinct (a write per destination) or drawn freely (duplicates)."""
            if unique:
                full = tuple(n if i == d else s for i, s in enumerate(shape))
                t = torch.rand(full, generator=gen).argsort(d).narrow(d, 0, shape[d])
            else:
                t = torch.randint(0, n, shape, generator=gen)
            return f"{x.name}.new_tensor({t.tolist()}, dtype=torch.long)"

        def with_d(k: int) -> tuple[int, ...]:
            return x.shape[:d] + (k,) + x.shape[d + 1:]

        choice = rng.randrange(9)
        k = rng.randint(1, n)
        if choice == 0:
            m = rng.randint(1, n + 2)
            if _numel(with_d(m)) > self.prof.max_numel:
                return False
            self.emit(f"{x.name}.gather({d}, {index(with_d(m), False)})", with_d(m), x.bound, x.hi)
        elif choice == 1:
            m = rng.randint(1, n + 2)
            if _numel(with_d(m)) > self.prof.max_numel:
                return False
            self.emit(f"{x.name}.index_select({d}, {index((m,), False)})", with_d(m), x.bound, x.hi)
        elif choice in (2, 3, 4):  # scatter, scatter_add (duplicates), scatter of a value
            src = self.tame(self.new_input(with_d(k)), 100) if choice != 4 else None
            if src is not None and src.hi != x.hi:
                return False
            if choice == 2:
                self.emit(f"{x.name}.scatter({d}, {index(with_d(k), True)}, {src.name})", x.shape,
                          max(x.bound, src.bound), x.hi)
            elif choice == 3:
                self.emit(f"{x.name}.scatter_add({d}, {index(with_d(k), False)}, {src.name})", x.shape,
                          x.bound + k * src.bound, x.hi)
            else:
                self.emit(f"{x.name}.scatter({d}, {index(with_d(k), True)}, -1.5)", x.shape, max(x.bound, 1.5),
                          x.hi)
        elif choice in (5, 6):  # index_put on dim 0: a write of distinct rows, or an accumulate
            d, n = 0, x.shape[0]
            k = rng.randint(1, n)
            v = self.tame(self.new_input((k,) + x.shape[1:]), 100)
            if v.hi != x.hi:
                return False
            acc = choice == 6
            self.emit(f"{x.name}.index_put(({index((k,), not acc)},), {v.name}, accumulate={acc})", x.shape,
                      x.bound + (k * v.bound if acc else v.bound), x.hi)
        elif choice == 7:
            # which scan: drawn from `gen`, so `rng` (and every later draw of the program)
            # is what it was when only cumsum existed
            variant = int(torch.randint(0, 4, (1,), generator=gen))
            if variant == 2:
                self.emit(f"torch.logcumsumexp({x.name}, {d})", x.shape, x.bound + math.log(n) + 1, x.hi)
            elif variant == 3 and n <= 24:  # factors in [0.5, 1.5]: at most 1.5^24 ≈ 1.7e4
                self.emit(f"torch.cumprod(torch.tanh({x.name}) * 0.5 + 1, {d})", x.shape, 1.5 ** n, x.hi)
            else:
                self.emit(f"torch.cumsum({x.name}, {d})", x.shape, x.bound * n, x.hi)
        else:
            return self._window(x, d, gen)
        return True

    def embedding(self, rng: random.Random) -> bool:
        """An embedding lookup into a table made of a value (its first dim the rows, the
        rest flattened): a few-row table read by many tokens (whose gradient is summed as
        masked columns), or any table with duplicate ids; sometimes a padding row.  Draws
        from its own `rng` (programs without it are what they were)."""
        tables = [v for v in self.values if len(v.shape) >= 2 and 0 < v.shape[0] and _numel(v.shape) > 0]
        if not tables:
            return False
        few = [v for v in tables if 2 <= v.shape[0] <= 4] or [v for v in tables if v.shape[0] == 1]
        x = rng.choice(few if few and rng.random() < 0.6 else tables)
        rows, width = x.shape[0], _numel(x.shape) // x.shape[0]
        k = rng.randint(8 * rows, 8 * rows + 24) if rows <= 4 else rng.randint(1, 2 * rows + 4)
        ids_shape = (k,) if rng.random() < 0.5 or k % 2 else (2, k // 2)
        if _numel(ids_shape) * width > self.prof.max_numel:
            return False
        gen = torch.Generator().manual_seed(rng.randrange(2**31))
        ids = torch.randint(0, rows, ids_shape, generator=gen).tolist()
        pad = f", padding_idx={rng.randrange(rows)}" if rows > 1 and rng.random() < 0.3 else ""
        self.emit(f"torch.nn.functional.embedding({x.name}.new_tensor({ids}, dtype=torch.long), "
                  f"{x.name}.reshape({rows}, {width}){pad})", ids_shape + (width,), x.bound, x.hi)
        return True

    def write_inputs(self, rng: random.Random) -> list[int]:
        """End the program by writing computed values of an input's shape into one or two
        inputs (never an expanded one: eager refuses writes into shared elements)."""
        written: list[int] = []
        for _ in range(rng.choice([1, 1, 2])):
            pairs = [(i, v) for i, spec in enumerate(self.inputs) if not spec.layout.startswith("expand")
                     and i not in written
                     for v in self.values if not v.is_input and v.shape == spec.shape]
            if not pairs:
                break
            i, v = rng.choice(pairs)
            # (cloned: the value may be a view of the input itself, which eager refuses to
            # copy in place; a clone of a computed value is folded into it anyway)
            self.lines.append(f"{self.inputs[i].name}.copy_({v.name}.clone())")
            written.append(i)
        return written

    def complex_ops(self, rng: random.Random) -> bool:
        """A value whose last dim is even, viewed as complex numbers (`view_as_complex` of
        its pairs) and multiplied by unit rotations from a new input of angles (rotary
        embeddings), by the conjugate of another such value, or added to it; the result
        back as reals (`view_as_real`), or its modulus, or its real and imaginary parts
        combined.  Never `angle` of a computed value: its branch cut flips by 2 pi on an
        ulp.  Draws from its own `rng` (programs without it are what they were)."""
        if self.dtype not in ("fp32", "fp64"):
            return False
        cands = [v for v in self.values if v.shape and v.shape[-1] % 2 == 0 and _numel(v.shape) > 0]
        if not cands:
            return False
        x = self.tame(rng.choice(cands), 4.0)
        lead, half = x.shape[:-1], x.shape[-1] // 2

        def as_complex(v: _Value) -> str:
            # (a dense copy: view_as_complex refuses an odd storage offset, which `.contiguous()`
            # keeps where the view is already dense: fuzz seed 38368)
            return (f"torch.view_as_complex({v.name}.reshape({_fmt(lead + (half, 2))})"
                    f".clone(memory_format=torch.contiguous_format))")
        z = as_complex(x)
        variant = rng.randrange(3)
        if variant == 0:   # rotary: unit rotations by angles of the last dims (broadcast over the leading ones)
            k = rng.randrange(len(lead) + 1)
            a = self.new_input(lead[k:] + (half,), grad=rng.random() < 0.5)
            w, bound = f"torch.polar(torch.ones_like({a.name}), {a.name})", x.bound
        else:
            partners = [v for v in self.values if v.shape == x.shape and v is not x] or [self.new_input(x.shape)]
            y = self.tame(rng.choice(partners), 4.0)
            w, bound = (f"{as_complex(y)}.conj()", 2 * x.bound * y.bound) if variant == 1 else \
                       (as_complex(y), x.bound + y.bound)
        zw = f"({z} * {w})" if variant < 2 else f"({z} + {w})"
        out = rng.randrange(3)
        if out == 0:
            self.emit(f"torch.view_as_real({zw}).reshape({_fmt(x.shape)})", x.shape, bound)
        elif out == 1:   # (a kink at 0 only, where random values do not land)
            self.emit(f"{zw}.abs()", lead + (half,), bound * 1.5)
        else:
            self.emit(f"{zw}.real * 2.0 - {zw}.imag", lead + (half,), bound * 3)
        return True

    def float8_ops(self, rng: random.Random) -> bool:
        """A float8 cast of an exact value: an input times a power of two (in range: no
        saturation), to float8 and back, or its bits (`view(torch.uint8)`, 0..255) as a
        number; a factor of a value of the chain with the input's shape.  The cast of an
        exact value is one rounding, the same in eager and its float64 judge, so any
        difference is a bug.  Written inline.  Draws from its own `rng`."""
        ins = [v for v in self.values if v.is_input and v.shape and _numel(v.shape) > 0]
        if not ins:
            return False
        a = rng.choice(ins)
        f8 = rng.choice(["torch.float8_e4m3fn", "torch.float8_e5m2"])
        p = rng.choice([0.25, 1.0, 8.0])
        q = f"({a.name}.detach() * {p}).to({f8})"
        if rng.random() < 0.7:
            expr, bound = f"{q}.to({a.name}.dtype)", max(a.bound * p * 1.07, 1.0)
        else:   # (the bits: 8-bit integers, exact in every float type)
            expr, bound = f"{q}.view(torch.uint8).to({a.name}.dtype)", 255.0
        xs = [v for v in self.values if v.shape == a.shape and not v.is_input] or [a]
        x = self.tame(rng.choice(xs), 4.0)
        s = float(f"{1 / bound:.3g}")
        self.emit(f"{x.name} * {expr} * {s}", x.shape, x.bound * bound * s, x.hi)
        return True

    def integer_ops(self, rng: random.Random) -> bool:
        """Integers from an exact input (`floor(a * 4)`, identical in every float type:
        |k| <= 4 * scale), through one integer op, and back as floats: a factor of a
        value of the chain (so gradients flow through the product), or a value of its own
        (pools, reductions, a bool accumulate).  Every integer result is exact and small
        (|r| <= 256, exact in bfloat16), so any difference from eager is a bug.  Written
        inline (no integer value joins the float chain).  Draws from its own `rng`."""
        ins = [v for v in self.values if v.is_input and v.shape and _numel(v.shape) > 0]
        if not ins:
            return False
        a = rng.choice(ins)
        it = rng.choice(["torch.int64", "torch.int32", "torch.int16"])
        k = f"({a.name}.detach() * 4).floor().to({it})"
        kb = int(4 * a.bound) + 1
        others = [v for v in ins if v.shape == a.shape and v is not a]
        m = f"({rng.choice(others).name}.detach() * 2).floor().to({it})" if others and rng.random() < 0.6 else \
            f"({a.name}.detach() * 2).ceil().to({it}).flip(-1)"   # (powers of 2: exact in half types)
        mb = int(2 * max(v.bound for v in ins)) + 1
        ops = [(f"torch.gcd({k}, {m})", max(kb, mb)), (f"torch.lcm({k}, {m})", kb * mb),
               (f"torch.div({k}, {m}.abs() + 1, rounding_mode='floor')", kb), (f"{k} // -3", kb),
               (f"torch.remainder({k}, {m}.abs() + 1)", mb), (f"torch.fmod({k}, -3)", 3),
               (f"({k} & {m})", 2 * max(kb, mb)), (f"({k} | {m})", 2 * max(kb, mb)), (f"({k} ^ {m})", 2 * max(kb, mb)),
               (f"(~{k})", kb + 1), (f"({k} << ({m}.abs() % 3))", 4 * kb), (f"({k} >> 1)", kb),
               (f"({k} ** 2)", kb * kb), (f"torch.pow({k}, {m}.abs() % 3)", kb * kb),
               (f"{k}.clamp(-3, 5)", 5), (f"torch.where({m} > 0, {k}, -{k})", kb)]
        expr, bound = rng.choice(ops)
        if bound > 256:   # (exact in bfloat16, and no int16 wrap-around)
            expr, bound = f"({expr}).clamp(-256, 256)", 256
        variant = rng.randrange(4)
        if variant < 2:   # a factor of a value of the chain with the input's shape
            xs = [v for v in self.values if v.shape == a.shape and not v.is_input] or [a]
            x = self.tame(rng.choice(xs), 4.0)
            s = float(f"{1 / bound:.3g}")
            self.emit(f"{x.name} * ({expr}).to({x.name}.dtype) * {s}", x.shape, x.bound * bound * s, x.hi)
            return True
        if variant == 2 and len(a.shape) >= 3 and min(a.shape[-2:]) >= 2:   # an integer max pool
            oh, ow = a.shape[-2] - 1, a.shape[-1] - 1
            shape = a.shape[:-2] + (oh, ow)
            if rng.random() < 0.5:
                self.emit(f"F.max_pool2d({expr}, 2, 1).to({a.name}.dtype) * {1 / bound:.3g}", shape, 1.0)
            else:   # (eager's average pools take int64 alone: truncating quotients)
                self.emit(f"F.avg_pool2d(({expr}).to(torch.int64), 2, 1).to({a.name}.dtype) * {1 / bound:.3g}",
                          shape, 1.0)
            return True
        if variant == 3 and rng.random() < 0.5:   # a bool accumulate with duplicate destinations
            n = rng.choice([3, 5, 8])
            self.emit(f"torch.zeros({n}, dtype=torch.bool, device={a.name}.device).index_put("
                      f"(({expr}).flatten().remainder({n}).long(),), ({expr}).flatten() > 0, accumulate=True)"
                      f".to({a.name}.dtype)", (n,), 1.0)
            return True
        d = rng.randrange(len(a.shape))   # an integer reduction
        red = rng.choice(["sum", "amax", "amin"])
        shape = a.shape[:d] + a.shape[d + 1:]
        tot = bound * (a.shape[d] if red == "sum" else 1)
        self.emit(f"({expr}).{red}({d}).to({a.name}.dtype) * {1 / max(tot, 1):.3g}", shape, 1.0)
        return True

    def strided_ops(self, rng: random.Random) -> bool:
        """Views that address elements by strides, and writes through views: `unfold`
        (overlapping windows when the step is below the size), `as_strided` of a fresh
        contiguous copy (overlapping, zero strides, an offset), `diagonal`, `diag_embed`,
        the scatters of views (`diagonal_scatter`, `slice_scatter`, `select_scatter`,
        `as_strided_scatter`), an in-place op through a view of a clone (functionalized
        into those scatters), `roll`, `tril`/`triu`, `repeat`, a channels-last round trip.
        Never `as_strided` of a value as it is: what it addresses depends on the value's
        memory layout, which eager's float64 judge does not keep (it runs on contiguous
        operands).  Draws from its own `rng` (programs without it are what they were)."""
        cands = [v for v in self.values if v.shape and _numel(v.shape) > 0]
        if not cands:
            return False
        x = rng.choice(cands)
        shape, r, n = x.shape, len(x.shape), _numel(x.shape)
        room = self.prof.max_numel
        grow = 1.25 if self.consumed else 1.0   # (the bound of a view `* 1.25` consumes)
        kind = rng.randrange(10)
        if kind == 0:   # windows of `size` every `step` along d
            d = rng.randrange(r)
            size = rng.randint(1, min(shape[d], 5))
            step = rng.randint(1, 3)
            out = shape[:d] + ((shape[d] - size) // step + 1,) + shape[d + 1:] + (size,)
            if _numel(out) > room:
                return False
            self.emit(f"{x.name}.unfold({d}, {size}, {step}){self.consumed}", out, x.bound * grow, x.hi)
            return True
        if kind == 1:   # as_strided of a contiguous copy: overlapping or zero strides, an offset
            for _ in range(10):
                sizes = tuple(rng.choice([1, 2, 3, 4, 5, 7, 8]) for _ in range(rng.randint(1, 3)))
                strides = tuple(rng.choice([0, 1, 1, 2, 3, rng.randint(1, n)]) for _ in sizes)
                reach = sum((s - 1) * t for s, t in zip(sizes, strides))
                if reach < n and _numel(sizes) <= room:
                    break
            else:
                return False
            off = rng.randint(0, n - 1 - reach)
            self.emit(f"{x.name}.clone(memory_format=torch.contiguous_format).as_strided({_fmt(sizes)}, "
                      f"{_fmt(strides)}, {off}){self.consumed}", sizes, x.bound * grow, x.hi)
            return True
        if kind in (2, 4) and r >= 2:   # a diagonal; or a value written over it
            d1, d2 = rng.sample(range(r), 2)
            off = rng.randint(-2, 2)
            m = max(0, min(shape[d1] + min(off, 0), shape[d2] - max(off, 0)))
            if m == 0:
                return False
            dshape = tuple(s for i, s in enumerate(shape) if i not in (d1, d2)) + (m,)
            if kind == 2:
                self.emit(f"torch.diagonal({x.name}, {off}, {d1}, {d2})", dshape, x.bound, x.hi)
                return True
            src = self.new_input(dshape)
            self.emit(f"{x.name}.diagonal_scatter({src.name}.to({x.name}.dtype), {off}, {d1}, {d2})", shape,
                      max(x.bound, src.bound), x.hi)
            return True
        if kind == 3:   # a diagonal matrix of the last dim (shifted by an offset)
            off = rng.randint(-2, 2)
            m = shape[-1] + abs(off)
            out = shape[:-1] + (m, m)
            if _numel(out) > room or len(out) > 4:
                return False
            self.emit(f"torch.diag_embed({x.name}, {off})", out, x.bound, x.hi)
            return True
        if kind == 5:   # a slice or a select of x replaced by a new value
            d = rng.randrange(r)
            if rng.random() < 0.5 and shape[d] >= 2:
                start = rng.randrange(shape[d])
                step = rng.choice([1, 2, 3])
                stop = rng.randint(start + 1, shape[d])
                m = len(range(start, stop, step))
                src = self.new_input(shape[:d] + (m,) + shape[d + 1:])
                self.emit(f"{x.name}.slice_scatter({src.name}.to({x.name}.dtype), {d}, {start}, {stop}, {step})",
                          shape, max(x.bound, src.bound), x.hi)
            else:
                i = rng.randrange(shape[d])
                src = self.new_input(shape[:d] + shape[d + 1:])
                self.emit(f"{x.name}.select_scatter({src.name}.to({x.name}.dtype), {d}, {i})", shape,
                          max(x.bound, src.bound), x.hi)
            return True
        if kind == 6:   # as_strided_scatter into a contiguous copy, the view without overlap
            t = rng.choice([v for v in range(1, 5) if v <= n])
            m = rng.randint(1, max(1, min(8, (n - 1) // t + 1)))
            inner = rng.choice([1, 2])
            if inner > 1 and m * t > n - 1:
                inner = 1
            sizes, strides = ((m, inner), (t * inner, 1)) if inner > 1 and t == 1 else ((m,), (t,))
            reach = sum((s - 1) * st for s, st in zip(sizes, strides))
            if reach >= n:
                return False
            off = rng.randint(0, n - 1 - reach)
            src = self.new_input(sizes)
            self.emit(f"{x.name}.clone(memory_format=torch.contiguous_format).as_strided_scatter("
                      f"{src.name}.to({x.name}.dtype), {_fmt(sizes)}, {_fmt(strides)}, {off})", shape,
                      max(x.bound, src.bound), x.hi)
            return True
        if kind == 7:   # an in-place op through a view of a clone (functionalized into a scatter)
            views = [f"[{':, ' * (d := rng.randrange(r))}{rng.randrange(shape[d])}]"]
            if r >= 2:
                a, b = rng.sample(range(r), 2)
                first = _swap(shape, a, b)[0]
                views.append(f".transpose({a}, {b})[{rng.randrange(first)}]")
                views.append(f".diagonal(0, {a}, {b})")
            d = rng.randrange(r)
            if shape[d] >= 2:
                views.append(f"[{':, ' * d}{rng.randrange(shape[d] - 1)}::2]")
            view = rng.choice(views)
            y = self.emit(f"{x.name}.clone()", shape, x.bound * 1.5 + 1, x.hi)
            op = rng.choice(["mul_(1.5)", "add_(1.0)", "neg_()", "clamp_(-0.5, 0.5)"])
            self.lines.append(f"{y.name}{view}.{op}")
            return True
        if kind == 8:
            d = rng.randrange(r)
            variant = rng.randrange(3)
            if variant == 0:
                k = rng.randint(-shape[d], shape[d])
                self.emit(f"torch.roll({x.name}, {k}, {d})", shape, x.bound, x.hi)
            elif variant == 1 and r >= 2:
                self.emit(f"torch.{rng.choice(['tril', 'triu'])}({x.name}, {rng.randint(-2, 2)})", shape, x.bound,
                          x.hi)
            else:
                reps = tuple(rng.choice([1, 1, 2, 3]) for _ in range(r))
                out = tuple(s * k for s, k in zip(shape, reps))
                if _numel(out) > room:
                    return False
                self.emit(f"{x.name}.repeat({_fmt(reps)})", out, x.bound, x.hi)
            return True
        if kind == 9 and r == 4:   # channels-last round trip, with an op in between
            y = self.emit(f"{x.name}.contiguous(memory_format=torch.channels_last) * 1.25", shape, x.bound * 1.25,
                          x.hi)
            self.emit(f"{y.name}.permute(0, 2, 3, 1).reshape({_fmt((shape[0], -1))})",
                      (shape[0], n // shape[0]), y.bound, y.hi)
            return True
        return False

    def layer_ops(self, rng: random.Random) -> bool:
        """Model-level ops from `torch.nn.functional`, one per call, on a value of the chain:
        group/instance/RMS norms and `normalize`, losses (cross-entropy with label smoothing
        and ignored targets, NLL, MSE/L1/Huber/smooth-L1, KL divergence), cosine similarity
        and pairwise distance, activations with parameters (`prelu`, `glu`, `softmin`,
        `hardswish`, `mish`, `selu`, `celu`, `logsigmoid`, `softsign`), reflect and circular
        padding, nearest/linear interpolation, pixel shuffle, 1-d pools, `embedding_bag`.
        Targets and offsets are literals from `rng`.  Draws from its own `rng` (programs
        without it are what they were)."""
        cands = [v for v in self.values if v.shape and _numel(v.shape) > 0]
        if not cands:
            return False
        x = self.tame(rng.choice(cands), 8.0)
        shape, r, n = x.shape, len(x.shape), _numel(x.shape)
        room = self.prof.max_numel
        kind = rng.randrange(12)
        if kind == 0 and r >= 2:   # group norm over (N, C, *): groups dividing C, affine or not
            c = shape[1]
            g = rng.choice([d for d in range(1, c + 1) if c % d == 0])
            args = ""
            if rng.random() < 0.6 and not x.hi:
                w, b = self.new_input((c,), layout="contiguous"), self.new_input((c,), layout="contiguous")
                args = f", {w.name}, {b.name}"
            if n // (shape[0] * g) < 2:
                return False
            self.emit(f"F.group_norm({x.name}, {g}{args})", shape, 4.0 * 2 * 2 + 2, x.hi)
        elif kind == 1 and r >= 3 and n // (shape[0] * shape[1]) > 1:
            self.emit(f"F.instance_norm({x.name})", shape, 8.0, x.hi)
        elif kind == 2:   # RMS norm over the last dim (a weight or not); normalize along a dim
            if rng.random() < 0.5:
                w = ""
                if not x.hi and rng.random() < 0.6:
                    w = f", {self.new_input(shape[-1:], layout='contiguous').name}"
                self.emit(f"F.rms_norm({x.name}, ({shape[-1]},){w})", shape, 8.0 * 2, x.hi)
            else:
                self.emit(f"F.normalize({x.name}, dim={self.dim(x)})", shape, 1.0, x.hi)
        elif kind == 3 and r >= 2 and shape[1] >= 2:   # cross-entropy / NLL over the class dim 1
            c = shape[1]
            tshape = shape[:1] + shape[2:]
            ignore = rng.random() < 0.4
            tgt = [-100 if ignore and rng.random() < 0.2 else rng.randrange(c) for _ in range(_numel(tshape))]
            if all(t == -100 for t in tgt):
                tgt[0] = 0
            t = f"torch.tensor({tgt}, device={x.name}.device).reshape({_fmt(tshape)})"
            red = rng.choice(["mean", "sum", "none"])
            out = tshape if red == "none" else ()
            if rng.random() < 0.6:
                ls = rng.choice([0.0, 0.1])
                self.emit(f"F.cross_entropy({x.name}, {t}, reduction='{red}', label_smoothing={ls})", out,
                          x.bound * 2 + math.log(c) + 1, x.hi)
            else:
                self.emit(f"F.nll_loss(F.log_softmax({x.name}, 1), {t}, reduction='{red}')", out,
                          x.bound * 2 + math.log(c) + 1, x.hi)
        elif kind == 4:   # element-wise losses against a partner of x's shape
            y = self.new_input(shape)
            red = rng.choice(["mean", "sum", "none"])
            out = shape if red == "none" else ()
            loss = rng.choice(["mse_loss", "l1_loss", "huber_loss", "smooth_l1_loss"])
            extra = {"huber_loss": ", delta=0.5", "smooth_l1_loss": ", beta=0.5"}.get(loss, "")
            b = (x.bound + y.bound) ** 2 * (n if red == "sum" else 1)
            self.emit(f"F.{loss}({x.name}, {y.name}.to({x.name}.dtype), reduction='{red}'{extra})", out, b, x.hi)
        elif kind == 5 and r >= 2:   # KL divergence between two softmaxes; cosine similarity
            y = self.new_input(shape)
            if rng.random() < 0.5:
                self.emit(f"F.kl_div(F.log_softmax({x.name}, -1), F.softmax({y.name}.to({x.name}.dtype), -1), "
                          f"reduction='batchmean')", (), 2 * x.bound + 2 * y.bound + 1, x.hi)
            else:
                d = self.dim(x)
                out = tuple(s for i, s in enumerate(shape) if i != d % r)
                self.emit(f"F.cosine_similarity({x.name}, {y.name}.to({x.name}.dtype), dim={d})", out, 1.0, x.hi)
        elif kind == 6:   # activations with parameters or of their own
            variant = rng.randrange(4)
            if variant == 0 and r >= 2:
                w = self.new_input((rng.choice([1, shape[1]]),), layout="contiguous")
                if x.hi:
                    return False
                self.emit(f"F.prelu({x.name}, {w.name})", shape, x.bound * max(1.0, w.bound), x.hi)
            elif variant == 1 and shape[-1] % 2 == 0:
                self.emit(f"F.glu({x.name}, -1)", shape[:-1] + (shape[-1] // 2,), x.bound, x.hi)
            elif variant == 2:
                self.emit(f"F.softmin({x.name}, {self.dim(x)})", shape, 1.0, x.hi)
            else:
                act = rng.choice(["hardswish", "mish", "selu", "celu", "logsigmoid", "softsign", "tanhshrink"])
                self.emit(f"F.{act}({x.name})", shape, x.bound * 1.1 + 2, x.hi)
        elif kind == 7 and r == 3 and shape[-1] >= 2:   # reflect / circular padding of the last dim
            mode = rng.choice(["reflect", "circular"])
            a, b = rng.randint(0, shape[-1] - 1), rng.randint(0, shape[-1] - 1)
            out = shape[:-1] + (shape[-1] + a + b,)
            if _numel(out) > room:
                return False
            self.emit(f"F.pad({x.name}, ({a}, {b}), mode='{mode}')", out, x.bound, x.hi)
        elif kind == 8 and r in (3, 4):   # nearest or (bi)linear interpolation, scale 2
            out = shape[:2] + tuple(2 * s for s in shape[2:])
            if _numel(out) > room:
                return False
            mode = rng.choice(["nearest", "linear" if r == 3 else "bilinear"])
            ac = "" if mode == "nearest" else f", align_corners={rng.choice([True, False])}"
            self.emit(f"F.interpolate({x.name}, scale_factor=2, mode='{mode}'{ac})", out, x.bound, x.hi)
        elif kind == 9 and r == 4 and shape[1] % 4 == 0:
            self.emit(f"F.pixel_shuffle({x.name}, 2)", (shape[0], shape[1] // 4, shape[2] * 2, shape[3] * 2),
                      x.bound, x.hi)
        elif kind == 10 and r == 3 and shape[-1] >= 2:   # 1-d pools
            k = rng.randint(2, min(4, shape[-1]))
            s = rng.randint(1, k)
            p = rng.randint(0, k // 2)
            pool = rng.choice(["avg_pool1d", "max_pool1d", "lp_pool1d"])
            if pool == "lp_pool1d":
                out = shape[:2] + (_out_size(shape[-1], k, s, 0, 1, False),)
                self.emit(f"F.lp_pool1d({x.name}.abs() + 0.1, 2, {k}, {s})", out, (x.bound + 0.1) * k, x.hi)
            else:
                out = shape[:2] + (_out_size(shape[-1], k, s, p, 1, False),)
                self.emit(f"F.{pool}({x.name}, {k}, {s}, {p})", out, x.bound, x.hi)
        elif kind == 11 and r == 2:   # embedding_bag of x's rows (the table) with literal offsets
            rows = shape[0]
            ids = [rng.randrange(rows) for _ in range(rng.randint(1, 12))]
            cuts = sorted({0} | {rng.randrange(len(ids)) for _ in range(rng.randint(0, 3))})
            mode = rng.choice(["sum", "mean", "max"])
            self.emit(f"F.embedding_bag(torch.tensor({ids}, device={x.name}.device), {x.name}, "
                      f"torch.tensor({cuts}, device={x.name}.device), mode='{mode}')", (len(cuts), shape[1]),
                      x.bound * (len(ids) if mode == "sum" else 1), x.hi)
        else:
            return False
        return True

    def placed_cat(self, rng: random.Random) -> bool:
        """Parts that kernels of their own write anyway (a kernel reads them for a sum),
        concatenated, and the concatenation read by sums over two dims and not returned:
        buffer placement's case (`plan/placement.py`: each part written straight
        into its slice, no kernel copying them).  Draws from its own `rng` (programs
        without it are what they were)."""
        cands = [v for v in self.values if len(v.shape) >= 2 and v.shape[-1] >= 2
                 and _numel(v.shape) * 3 <= self.prof.max_numel]
        if not cands:
            return False
        x = rng.choice(cands)
        if x.bound > 4:
            x = self.emit(f"torch.tanh({x.name})", x.shape, 1.0, x.hi)
        r, n = len(x.shape), x.shape[-1]
        parts = [self.emit(f"torch.sigmoid({x.name}) * 1.5", x.shape, 1.5, x.hi) if rng.random() < 0.3 else
                 self.emit(f"torch.sigmoid({x.name}) * {x.name}.amax(-1, keepdim=True)", x.shape, x.bound, x.hi),
                 self.emit(f"{x.name} * torch.tanh({x.name}.sum(-1, keepdim=True) * {1 / n:.4g})", x.shape,
                           x.bound, x.hi)]
        if rng.random() < 0.4:   # a third part, from a reduction over a leading dim
            k = rng.randrange(r - 1)
            parts.append(self.emit(f"torch.cos({x.name}) - {x.name}.amax({k}, keepdim=True)", x.shape,
                                   1 + x.bound, x.hi))
        rng.shuffle(parts)
        bound = max(p.bound for p in parts)
        self.emit(f"({' * '.join(p.name for p in parts)}).sum(-1)", x.shape[:-1],
                  n * math.prod(p.bound for p in parts), x.hi)
        d = rng.randrange(r)
        shape = x.shape[:d] + (x.shape[d] * len(parts),) + x.shape[d + 1:]
        z = self.emit(f"torch.cat([{', '.join(p.name for p in parts)}], {d - r if rng.random() < 0.3 else d})",
                      shape, bound, x.hi)
        # read over two different dims: two kernels read it, so it is written
        for e in rng.sample(range(r), 2):
            self.emit(f"{z.name}.sum({e})", shape[:e] + shape[e + 1:], bound * shape[e], x.hi)
        return True

    def _pool2d(self, x: _Value, gen: torch.Generator) -> bool:
        """Max or average pooling (k 2-3, stride 1-2, padding up to k // 2, ceil mode or
        not) over the last two dims viewed as (1, C, H, W).  A max-pool's arg-max is
        discontinuous in its values, so it pools a new graph input (exact in both runs,
        ties broken alike); x flows on through an average pool."""
        h, w = x.shape[-2], x.shape[-1]
        k = int(torch.randint(2, 4, (1,), generator=gen))
        s = int(torch.randint(1, 3, (1,), generator=gen))
        p = int(torch.randint(0, k // 2 + 1, (1,), generator=gen))
        ceil = bool(torch.randint(0, 2, (1,), generator=gen))
        use_max = bool(torch.randint(0, 3, (1,), generator=gen))
        if h + 2 * p < k or w + 2 * p < k:
            return False
        oh, ow = _out_size(h, k, s, p, 1, ceil), _out_size(w, k, s, p, 1, ceil)
        c = _numel(x.shape) // (h * w)
        args = f"{k}, {s}, {p}, ceil_mode={ceil}"
        avg = f"F.avg_pool2d({x.name}.reshape(1, {c}, {h}, {w}), {args})"
        if not use_max:
            self.emit(avg, (1, c, oh, ow), x.bound, x.hi)
            return True
        a = self.new_input(x.shape)
        self.emit(f"F.max_pool2d({a.name}.reshape(1, {c}, {h}, {w}), {args}) + {avg} * 0.5", (1, c, oh, ow),
                  a.bound + x.bound, x.hi)
        return True

    def _window(self, x: _Value, d: int, gen: torch.Generator) -> bool:
        """flip, masked_scatter, adaptive average pooling over windows that do not tile
        the last dim evenly, replication padding of the last dim, histc of a new input,
        a boolean-mask write of one row (which one: from `gen`)."""
        variant = int(torch.randint(0, 6, (1,), generator=gen))
        n = x.shape[-1]
        lead = x.shape[:-1]
        if variant == 0:
            self.emit(f"{x.name}.flip({d})", x.shape, x.bound, x.hi)
        elif variant == 1:  # masked_scatter: the mask's running count picks the source element (a scan)
            self.emit(f"{x.name}.masked_scatter({x.name} > 0.3, {x.name}.flip({d}) * 0.5)", x.shape, x.bound, x.hi)
        elif variant == 2:
            m = int(torch.randint(1, n + 3, (1,), generator=gen))
            # (drawn after m: a program that keeps the adaptive pooling is what it was)
            if lead and int(torch.randint(0, 3, (1,), generator=gen)) == 0:
                return self._pool2d(x, gen)
            self.emit(f"F.adaptive_avg_pool1d({x.name}.reshape(1, -1, {n}), {m}).reshape({_fmt(lead + (m,))})",
                      lead + (m,), x.bound, x.hi)
        elif variant == 4:
            # of a graph input, detached and in float32: a count is discontinuous in its
            # values, so an ulp of difference upstream would move a value across a bin edge
            h = self.new_input(x.shape, grad=False)
            bins = int(torch.randint(1, 12, (1,), generator=gen))
            self.emit(f"torch.histc({h.name}.detach().float(), {bins}, -2.0, 2.0).to({h.name}.dtype)", (bins,),
                      float(_numel(x.shape)), h.hi)
        elif variant == 5:
            if not lead:
                return False
            # x[mask] = row over the leading dims (patterns/masked_setitem.py): the mask
            # from a new input (one from x could flip on an ulp of difference upstream)
            m = self.new_input(lead, grad=False)
            self.emit(f"{x.name}.index_put(({m.name}.detach() > 0,), {x.name}.reshape(-1, {n})[0] * 0.5)",
                      x.shape, x.bound, x.hi)
        else:
            a, b = (int(v) for v in torch.randint(0, 4, (2,), generator=gen))
            if _numel(lead + (n + a + b,)) > self.prof.max_numel:
                return False
            self.emit(f"F.pad({x.name}.reshape(1, -1, {n}), ({a}, {b}), mode='replicate')"
                      f".reshape({_fmt(lead + (n + a + b,))})", lead + (n + a + b,), x.bound, x.hi)
        return True


def _swap(shape, i, j):
    s = list(shape)
    s[i], s[j] = s[j], s[i]
    return tuple(s)


def _factor(n: int, rng: random.Random) -> tuple[int, ...]:
    """A random shape of rank ≤ 4 with `n` elements (size-1 dims included)."""
    primes, m, p = [], n, 2
    while m > 1:
        while m % p == 0:
            primes.append(p)
            m //= p
        p += 1
    rank = rng.randint(1, 4)
    dims = [1] * rank
    for q in primes:
        dims[rng.randrange(rank)] *= q
    return tuple(dims)


def generate(seed: int, profile: str = "ci") -> Program:
    """The program of one seed (deterministic)."""
    prof = PROFILES[profile]
    rng = random.Random(seed)
    dtype = rng.choice(["fp32", "fp32", "fp16", "bf16"])
    if dtype == "fp32" and seed >= FP64_FROM and random.Random(f"fp64-{seed}").random() < FP64_SHARE:
        dtype = "fp64"
    backward = rng.random() < 0.5
    knobs = {}
    if rng.random() < 0.6:
        for k, choices in KNOB_CHOICES.items():
            if k in ("pointwise_block", "block_elems"):
                choices = [c for c in choices if c >= prof.min_block]
            if rng.random() < 0.5:
                knobs[k] = rng.choice(choices)
        if knobs.get("persistent_max_cols", 8192) < 8192:  # looped rows: keep the loop block below the
            knobs["loop_block_cols"] = min(knobs.get("loop_block_cols", 2048), knobs["persistent_max_cols"])
    if random.Random(f"split-{seed}").random() < SPLIT_SHARE:
        knobs["split_min_cols"] = SPLIT_MIN_COLS
    if seed >= WALKED_PARTIALS_FROM and random.Random(f"walked-{seed}").random() < WALKED_PARTIALS_SHARE:
        knobs["walk_looped_partials"] = "on"
    lo, hi = prof.min_ops, prof.max_ops
    draws = [rng.randint(lo, hi) for _ in range(3 if prof.short_bias else 1)]
    target = min(draws)
    b = _Builder(rng, prof, dtype, backward)
    for _ in range(rng.choice([1, 1, 2, 3])):
        b.new_input(b.shape())
    families = [(b.unary, 4), (b.binary, 4), (b.reduce, 2), (b.normalize, 2), (b.view, 3), (b.slice_cat, 2),
                (b.where3, 1)]
    fns, weights = zip(*families)
    tries = 0
    while len(b.lines) < target and tries < 20 * hi:
        tries += 1
        fn = rng.choices(fns, weights)[0]
        fn()
    # index, scatter and scan ops on some programs, from a stream of their own (the
    # draws above are unchanged by them: seeds found before keep their programs)
    irng = random.Random(seed * 7919 + 17)
    if irng.random() < 0.3:
        for _ in range(irng.choice([1, 1, 2])):
            b.indexed(irng)
    # embedding lookups likewise (their gradient: scatter, compact or masked-column sums)
    erng = random.Random(seed * 15485863 + 11)
    if erng.random() < 0.12:
        b.embedding(erng)
    # Bessel/Airy functions likewise from a stream of their own (float32 programs)
    srng = random.Random(seed * 104729 + 5)
    if srng.random() < 0.15:
        b.special(srng)
    # concatenations of parts other kernels write (buffer placement) likewise
    crng = random.Random(seed * 2654435761 + 3)
    if seed >= PLACED_CAT_FROM and crng.random() < PLACED_CAT_SHARE:
        b.placed_cat(crng)
    # complex arithmetic likewise
    zrng = random.Random(f"complex-{seed}")
    if seed >= COMPLEX_FROM and zrng.random() < COMPLEX_SHARE:
        b.complex_ops(zrng)
    # integer islands likewise
    nrng = random.Random(f"integer-{seed}")
    if seed >= INTEGER_FROM and nrng.random() < INTEGER_SHARE:
        for _ in range(nrng.choice([1, 1, 2])):
            b.integer_ops(nrng)
    # strided views likewise
    vrng = random.Random(f"strided-{seed}")
    b.consumed = " * 1.25" if seed >= CONSUMED_VIEWS_FROM else ""
    if seed >= STRIDED_FROM and vrng.random() < STRIDED_SHARE:
        for _ in range(vrng.choice([1, 1, 2, 3])):
            b.strided_ops(vrng)
    # nn.functional layers likewise
    lrng = random.Random(f"layers-{seed}")
    if seed >= LAYERS_FROM and lrng.random() < LAYERS_SHARE:
        for _ in range(lrng.choice([1, 1, 2, 3])):
            b.layer_ops(lrng)
    # float8 islands likewise
    frng = random.Random(f"float8-{seed}")
    if seed >= FLOAT8_FROM and frng.random() < FLOAT8_SHARE:
        b.float8_ops(frng)
    # outputs: the values nothing else reads (the newest few), sometimes an intermediate too
    computed = [v for v in b.values if not v.is_input]
    outs = [v for v in computed if v.name not in b.used][-4:]
    if rng.random() < 0.3:
        extra = rng.choice(computed)
        if extra not in outs:
            outs.append(extra)
    # in-place writes of inputs likewise, after the outputs are chosen (forward programs)
    written: list[int] = []
    wrng = random.Random(seed * 6700417 + 29)
    if seed >= IN_PLACE_FROM and not backward and wrng.random() < IN_PLACE_SHARE:
        written = b.write_inputs(wrng)
    dynamic = seed >= DYNAMIC_FROM and random.Random(f"dynamic-{seed}").random() < DYNAMIC_SHARE
    return Program(seed, profile, dtype, backward, knobs, b.inputs, b.lines, [v.name for v in outs], written,
                   dynamic)
