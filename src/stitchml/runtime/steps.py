"""The runtime wrapper as data: a list of typed steps, then rendered to Python.

A compiled graph runs as a straight-line sequence of steps (allocate, view, launch,
eager call, check, free, return).  The steps are built from the plan
(`wrapper.build_program`), optimised as data (view chains collapsed to one strided
view, dead buffers reused, names freed after their last use) and only then rendered
to the Python source that runs (and that `explain` / the debug directory show).

Value names: `a<i>` graph inputs, `v<node>` IR node values, `p<node>` column
partials; `C<k>` objects of the namespace (eager ops, constants).
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Union

import torch

from ..ir.nodes import contiguous_strides, prod
from .launcher import launch_options


# ----------------------------------------------------------------------------- leaves

class Sym:
    """Text rendered as it is: a value name, a namespace name, a dtype."""

    __slots__ = ("text",)

    def __init__(self, text: str):
        self.text = text

    def __repr__(self) -> str:
        return self.text

    __str__ = __repr__

    def __format__(self, spec: str) -> str:
        return self.text

    def __eq__(self, other: object) -> bool:
        return type(other) is Sym and other.text == self.text

    def __hash__(self) -> int:
        return hash(("sym", self.text))


class Expr(Sym):
    """A number of a dynamic template: an expression of the sizes `ks0, ks1, ...`."""

    __slots__ = ()

    def __repr__(self) -> str:
        return f"({self.text})"

    __str__ = __repr__

    def __format__(self, spec: str) -> str:
        return repr(self)

    def __eq__(self, other: object) -> bool:
        return type(other) is Expr and other.text == self.text

    def __hash__(self) -> int:
        return hash(("expr", self.text))


def fmt(a: object) -> str:
    """Python source of an argument tree (lists, tuples, numbers, `Sym`s)."""
    if isinstance(a, list):
        return "[" + ", ".join(fmt(x) for x in a) + "]"
    if isinstance(a, tuple):
        return "(" + "".join(fmt(x) + ", " for x in a) + ")"
    if isinstance(a, (Sym, torch.dtype)):
        return str(a)
    return repr(a)


# ----------------------------------------------------------------------------- layouts

@dataclass(frozen=True)
class Layout:
    """A strided view of a base tensor: `offset` counts elements from the base's
    first element (a `_reinterpret_tensor` increment, not an absolute storage offset)."""

    shape: tuple[int, ...]
    stride: tuple[int, ...]
    offset: int = 0


def storage_elems(shape: tuple[int, ...], stride: tuple[int, ...]) -> int:
    """Elements of storage a tensor of this layout spans from its first element."""
    if any(s == 0 for s in shape):
        return 0
    return 1 + sum((s - 1) * st for s, st in zip(shape, stride))


def reshape_layout(src: Layout, shape: tuple[int, ...]) -> Layout | None:
    """The layout `reshape` gives without copying, or None where eager would copy.
    Groups of source dims that are contiguous with each other can be split and merged
    freely; a target dim may not straddle two groups."""
    shape = tuple(shape)
    if prod(shape) != prod(src.shape):
        return None
    if prod(shape) == 0 or not src.shape:
        return Layout(shape, contiguous_strides(shape), src.offset)
    # merge the source into maximal contiguous chunks, innermost first: (numel, stride of its last dim)
    chunks: list[tuple[int, int]] = []
    for size, st in zip(reversed(src.shape), reversed(src.stride)):
        if size == 1:
            continue
        if chunks and st == chunks[-1][0] * chunks[-1][1]:
            chunks[-1] = (chunks[-1][0] * size, chunks[-1][1])
        else:
            chunks.append((size, st))
    out: list[int] = [0] * len(shape)
    d = len(shape) - 1
    for numel, base in chunks:
        acc = 1
        while d >= 0 and acc < numel:
            out[d] = acc * base
            acc *= shape[d]
            d -= 1
        if acc != numel:
            return None
        while d >= 0 and shape[d] == 1:  # size-1 dims between chunks: any stride works
            out[d] = acc * base
            d -= 1
    while d >= 0:  # leading size-1 dims
        out[d] = out[d + 1] * shape[d + 1] if d + 1 < len(shape) else 1
        d -= 1
    return Layout(shape, tuple(out), src.offset)


def view_layout(op: str, src: Layout, shape: tuple[int, ...], attrs: dict) -> Layout | None:
    """Layout of a view op applied to `src`, None where it is not a plain re-stride."""
    if op == "reshape":
        return reshape_layout(src, shape)
    if op == "permute":
        dims = attrs["dims"]
        return Layout(tuple(src.shape[d] for d in dims), tuple(src.stride[d] for d in dims), src.offset)
    if op == "expand":
        lead = len(shape) - len(src.shape)
        stride = [0] * lead + [0 if (s == 1 and t != 1) else st
                               for s, st, t in zip(src.shape, src.stride, shape[lead:])]
        return Layout(tuple(shape), tuple(stride), src.offset)
    if op == "slice":
        dim, start, step = attrs["dim"], attrs["start"], attrs["step"]
        stride = list(src.stride)
        off = src.offset + start * src.stride[dim] if shape[dim] else src.offset
        stride[dim] *= step
        return Layout(tuple(shape), tuple(stride), off)
    if op == "select":
        dim, index = attrs["dim"], attrs["index"]
        index = index + src.shape[dim] if index < 0 else index
        return Layout(tuple(shape), src.stride[:dim] + src.stride[dim + 1:], src.offset + index * src.stride[dim])
    if op == "unfold":   # window i starts step elements of dim after window i - 1
        dim, step = attrs["dim"], attrs["step"]
        stride = list(src.stride)
        stride[dim] *= step
        return Layout(tuple(shape), tuple(stride) + (src.stride[dim],), src.offset)
    if op == "as_strided":
        # its strides and offset count the operand's elements in their contiguous order
        # (`rules_views.element_view`): memory strides only where the operand is contiguous
        # (a step slice's is not: the wrapper replays it on a contiguous copy, `as_strided_of`)
        if any(st != c for n, st, c in zip(src.shape, src.stride, contiguous_strides(tuple(src.shape))) if n > 1):
            return None
        return Layout(tuple(shape), tuple(attrs["stride"]), src.offset + attrs["offset"])
    return None


# ------------------------------------------------------------------------------- steps

@dataclass(frozen=True)
class Alloc:
    """A fresh output buffer, or the storage of a dead buffer (`reuse`) of the same
    storage size and dtype."""

    name: str
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    dtype: torch.dtype
    zero: bool = False          # accumulated into with atomics: initialised to `fill`
    fill: int = 0               # (1 for an atomic product, the least int64 for a 64-bit max)
    poison: bool = False        # testing: filled with NaN / max int
    reuse: str | None = None
    reuse_same: bool = False    # the reused buffer has exactly this shape and strides

    def reads(self) -> tuple[str, ...]:
        return (self.reuse,) if self.reuse else ()

    def render(self) -> str:
        if self.reuse:
            text = self.reuse if self.reuse_same else f"_view({self.reuse}, {self.shape}, {self.stride}, 0)"
        elif self.zero and self.fill:
            return f"{self.name} = torch.full({self.shape}, {self.fill}, dtype={self.dtype}, device=DEVICE)"
        elif self.zero:
            return f"{self.name} = torch.zeros({self.shape}, dtype={self.dtype}, device=DEVICE)"
        else:
            text = f"EMPTY({self.shape}, {self.stride}, {self.dtype})"
        if self.poison:
            value = "float('nan')" if self.dtype.is_floating_point else (
                "True" if self.dtype == torch.bool else str(torch.iinfo(self.dtype).max))
            text = f"{text}.fill_({value})"
        return f"{self.name} = {text}"


@dataclass(frozen=True)
class View:
    """One strided view of `base` (a tensor whose layout is known): a whole chain of
    reshape / permute / expand / slice / select collapsed at compile time."""

    name: str
    base: str
    layout: Layout
    ops: tuple[str, ...] = ()   # the view ops it replaces (for reading the source)

    def reads(self) -> tuple[str, ...]:
        return (self.base,)

    def render(self) -> str:
        lay = self.layout
        note = f"  # {'.'.join(self.ops)}" if self.ops else ""
        return f"{self.name} = _view({self.base}, {lay.shape}, {lay.stride}, {lay.offset}){note}"


@dataclass(frozen=True)
class Replay:
    """A view op replayed eagerly, where the layout of its source is not known at
    compile time (or eager would copy: a reshape of a non-viewable layout); also the
    free constants (`full`, `iota`).  `template.format(*values)` is the expression."""

    name: str
    template: str
    values: tuple = ()
    src: str | None = None

    @property
    def expr(self) -> str:
        return self.template.format(*(fmt(v) for v in self.values))

    def reads(self) -> tuple[str, ...]:
        return (self.src,) if self.src else ()

    def render(self) -> str:
        return f"{self.name} = {self.expr}"


@dataclass(frozen=True)
class Launch:
    """`kernel[(grid,)](*args, num_warps=N)`: the call shape of Triton's JIT functions
    and of the direct launcher alike."""

    kernel: str
    grid: int
    args: tuple[str, ...]        # value names, or `counter` / `base`
    num_warps: int
    maxnreg: int | None = None
    writes: tuple[str, ...] = ()
    size_args: tuple[str, ...] = ()   # dynamic templates: the kernel's size arguments `sz0, ...`
    # per argument, "." where it is the wrapper's own buffer (same dtype and alignment at
    # every call: its specialisation is not checked again), "c" where it is checked
    checks: str = ""
    pdl: bool = False   # launched with programmatic dependent launch (runtime/pdl.py)

    def reads(self) -> tuple[str, ...]:
        return tuple(a for a in self.args if _is_value(a))

    def _options(self) -> str:
        return ", ".join(f"{k}={v}" for k, v in launch_options(self.num_warps, self.maxnreg, self.pdl).items())

    def render(self) -> str:
        args = ", ".join(self.args + self.size_args)
        return f"{self.kernel}[({self.grid},)]({args}, {self._options()})"

    @property
    def fixed_grid(self) -> bool:
        """Whether the grid is a number (a dynamic template's may be a size expression)."""
        return isinstance(self.grid, int) and not isinstance(self.grid, bool)

    def render_site(self, name: str) -> tuple[str, str]:
        """(the module-level line that binds the launch line `name`, the line in `call`)
        — `runtime/launcher.py`'s `Site`."""
        define = f"{name} = {self.kernel}.site(globals(), {name!r}, ({self.grid},), {self.checks!r}, {self._options()})"
        return define, f"{name}({', '.join(self.args + self.size_args)})"


@dataclass(frozen=True)
class Barrier:
    """A fresh base on the graph's grid-barrier counter for one global launch."""

    arrivals: int
    reset: bool = False     # graph mode: the counter zeroed before the launch (a replay repeats host ints)

    def reads(self) -> tuple[str, ...]:
        return ()

    def render(self) -> str:
        return "counter, base = BARRIER.reset()" if self.reset else f"counter, base = BARRIER.take({self.arrivals})"


@dataclass(frozen=True)
class DrawSeeds:
    """The kernels' seeds of one call, drawn at its start from torch's default
    generator: in graph mode redrawn into a device buffer (`s0, s1, ...`: 0-d views of
    it, passed as pointers), else as Python ints (`h0, h1, ...`) in one draw (a draw a
    launch cost a tensor and an `.item()` each: 37 a BERT training forward)."""

    count: int
    host: bool = False

    def reads(self) -> tuple[str, ...]:
        return ()

    def render(self) -> str:
        if self.host:
            return "".join(f"h{j}, " for j in range(self.count)) + f"= _seeds({self.count})"
        return "".join(f"s{j}, " for j in range(self.count)) + "= SEEDS.draw()"


@dataclass(frozen=True)
class StateSeed:
    """A kernel seed derived from a saved RNG state (a random op in a recomputed
    region: `lower/rules_rng_state.py`), `stream` telling the op's random nodes apart.
    `device`: graph mode, the seed as a 0-d device tensor (what such kernels read)."""

    name: str
    state: str
    stream: int
    device: bool = False

    def reads(self) -> tuple[str, ...]:
        return (self.state,)

    def render(self) -> str:
        where = ", DEVICE" if self.device else ""
        return f"{self.name} = _state_seed({self.state}, {self.stream}{where})"


@dataclass(frozen=True)
class EagerCall:
    name: str
    target: str                  # namespace name of the ATen op
    args: tuple                  # argument trees (lists, tuples, numbers, `Sym`s)
    kwargs: tuple                # (keyword, tree) pairs
    uses: tuple[str, ...]        # value names among them
    op: str = ""
    may_alias: bool = True       # the result may share storage with an argument (schema says so, or unknown)

    def reads(self) -> tuple[str, ...]:
        return self.uses

    def render(self) -> str:
        args = [fmt(a) for a in self.args] + [f"{k}={fmt(v)}" for k, v in self.kwargs]
        return f"{self.name} = {self.target}({', '.join(args)})"


@dataclass(frozen=True)
class Item:
    name: str
    src: str
    index: int

    def reads(self) -> tuple[str, ...]:
        return (self.src,)

    def render(self) -> str:
        return f"{self.name} = {self.src}[{self.index}]"


@dataclass(frozen=True)
class Check:
    """An eager result checked against the metadata the plan assumed (dtype, shape,
    strides); a difference is absorbed (cast or copy) and logged once.  After the
    first call, checks that passed are dropped from the wrapper."""

    name: str
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    dtype: torch.dtype
    index: int                   # the check's number in the graph's checker
    op: str = ""
    # read by no kernel or view, only returned (a saved tensor the backward passes to an
    # eager op): None, an undefined tensor eager returns where the metadata says a tensor
    # (oneDNN's LSTM workspace outside training), is passed on as eager passes it
    none_ok: bool = False

    def reads(self) -> tuple[str, ...]:
        return (self.name,)

    def render(self) -> str:
        tail = ", True" if self.none_ok else ""
        return f"{self.name} = CHECK({self.name}, {self.shape}, {self.stride}, {self.dtype}, {self.index}{tail})"


@dataclass(frozen=True)
class CopyInto:
    """Graph inputs' new values copied into the inputs' own tensors after the call's
    kernels ran (in-place writes their kernels could not make: `plan/in_place.py`), all
    in one multi-tensor copy (an optimizer's 0-d step counters: one launch, not one each)."""

    dsts: tuple[str, ...]
    srcs: tuple[str, ...]

    def reads(self) -> tuple[str, ...]:
        return self.dsts + self.srcs

    def render(self) -> str:
        if len(self.dsts) == 1:
            return f"{self.dsts[0]}.copy_({self.srcs[0]})"
        return f"torch._foreach_copy_([{', '.join(self.dsts)}], [{', '.join(self.srcs)}])"


@dataclass(frozen=True)
class Free:
    names: tuple[str, ...]

    def reads(self) -> tuple[str, ...]:
        return ()

    def render(self) -> str:
        return f"del {', '.join(self.names)}"


@dataclass(frozen=True)
class Return:
    values: tuple                # trees: `Sym` value names, numbers, None

    def reads(self) -> tuple[str, ...]:
        return tuple(str(v) for v in self.values if isinstance(v, Sym) and _is_value(str(v)))

    def render(self) -> str:
        return "return " + fmt(tuple(self.values))


Step = Union[Alloc, View, Replay, Launch, Barrier, DrawSeeds, StateSeed, EagerCall, Item, Check, CopyInto, Free, Return]


def _is_value(text: str) -> bool:
    return len(text) > 1 and text[0] in "avp" and text[1:].isdigit()


def defines(step: Step) -> str | None:
    return getattr(step, "name", None) if not isinstance(step, (Free, Return, DrawSeeds, CopyInto)) else None


@dataclass
class Program:
    """A graph's wrapper as steps, and the objects its source names."""

    steps: list = field(default_factory=list)
    num_inputs: int = 0
    consts: dict = field(default_factory=dict)

    def render(self, drop_checks: frozenset | set = frozenset(), sizes: tuple[str, ...] | None = None) -> str:
        """Python source of `call(args)`, then the module-level lines that bind its
        fixed-grid launch lines (`_L0 = k3.site(...)`: `runtime/launcher.py::Site`);
        `drop_checks`: numbers of checks already passed (the lean wrapper after the
        first call); `sizes`: a dynamic template's `call(args, sizes)`, the sizes
        unpacked into these names."""
        head = ["def call(args):"] if sizes is None else ["def call(args, sizes):"]
        if sizes:
            head.append("    " + "".join(f"{n}, " for n in sizes) + "= sizes")
        if self.num_inputs:
            head.append("    " + "".join(f"a{i}, " for i in range(self.num_inputs)) + "= args")
        head.append("    args.clear()")
        body, sites = [], []
        for s in self.steps:
            if isinstance(s, Check) and s.index in drop_checks:
                continue
            if isinstance(s, Launch) and s.fixed_grid:
                define, line = s.render_site(f"_L{len(sites)}")
                sites.append(define)
                body.append("    " + line)
            else:
                body.append("    " + s.render())
        return "\n".join(head + body + sites) + "\n"

    def of_type(self, *types) -> list:
        return [s for s in self.steps if isinstance(s, types)]


# ----------------------------------------------------------------------------- saved RNG states

# Appended to the generator state that a stitched `run_and_save_rng_state` returns.  It
# keeps the two ways of replaying a random op apart, in both directions: eager's
# `run_with_rng_state` refuses a state of this size (`set_rng_state` checks the size),
# and `state_seed` refuses a state without it, so an eager mask is never paired with a
# Philox one, whichever graph ran eagerly.
RNG_STATE_MARK = b"stitchml.philox\0"


class CaptureRngState:
    """The eager step of a stitched `run_and_save_rng_state`: the state of `device`'s
    default generator (what eager's op returns: `torch.get_rng_state()`, or
    `torch.cuda.get_rng_state()` for a CUDA tensor), then that generator advanced by one
    draw, so the next random op (and the next call) saves another state.  With `replay`
    (the op draws its numbers in a kernel) the state carries `RNG_STATE_MARK`; without
    (nothing drawn: dropout in eval mode), it is eager's own and the generator is left
    alone, as eager's op leaves it."""

    NAME = "stitchml.capture_rng_state"

    def __init__(self, device: torch.device, replay: bool = True):
        self.device, self.replay = torch.device(device), replay

    def _state(self) -> torch.Tensor:
        if self.device.type == "cpu":
            return torch.get_rng_state()
        return getattr(torch, self.device.type).get_rng_state(self.device)

    def size(self) -> int:
        """Bytes of the state it returns."""
        return self._state().numel() + (len(RNG_STATE_MARK) if self.replay else 0)

    def __call__(self) -> torch.Tensor:
        state = self._state()
        if not self.replay:
            return state
        torch.empty((), dtype=torch.int64, device=self.device).random_()
        return torch.cat([state, torch.frombuffer(bytearray(RNG_STATE_MARK), dtype=torch.uint8)])

    def __repr__(self) -> str:
        return f"{self.NAME}[{self.device}{'' if self.replay else ', eager'}]"

    def __eq__(self, other: object) -> bool:
        return type(other) is CaptureRngState and (other.device, other.replay) == (self.device, self.replay)

    def __hash__(self) -> int:
        return hash((CaptureRngState, self.device, self.replay))


def state_seed(state: torch.Tensor, stream: int, device: torch.device | None = None) -> int | torch.Tensor:
    """The Philox seed of random stream `stream` of a saved RNG state: a hash of its
    bytes, so the forward and its recomputation (same state) draw the same numbers and
    different states draw different ones.  Raises for a state stitchml did not save (the
    forward ran the random op eagerly: no kernel can replay eager's numbers)."""
    data = state.detach().cpu().contiguous().numpy().tobytes() if isinstance(state, torch.Tensor) else b""
    if not (isinstance(state, torch.Tensor) and state.dtype == torch.uint8 and data.endswith(RNG_STATE_MARK)):
        raise RuntimeError("stitchml: a stitched random op in a recomputed (checkpointed) region was given an RNG "
                           "state its forward did not save as stitchml's (the forward ran the op eagerly?); a "
                           "kernel cannot replay eager's random numbers")
    digest = hashlib.blake2b(data, digest_size=8, salt=stream.to_bytes(16, "little")).digest()
    seed = int.from_bytes(digest, "little") % (2**31 - 1)
    return seed if device is None else torch.tensor(seed, dtype=torch.int64, device=device)
