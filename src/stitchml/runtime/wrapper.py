"""The runtime wrapper of one compiled graph: its steps built from the plan
(`runtime/steps.py` holds the step types), optimised as data, rendered to a
straight-line Python function and executed.  No plan is interpreted at call time.

- views: a chain of reshape / permute / expand / slice / select of a tensor whose
  layout is known at compile time (our buffers, graph inputs, checked eager results)
  becomes one `_view(base, size, stride, offset)` (a C++ reinterpret); where eager
  would copy (a reshape of a non-viewable layout) or the base's layout is unknown,
  the ops are replayed as they are;
- eager results are checked (dtype, shape, strides) against what the plan assumed
  where something other than an eager op reads them; a difference is absorbed (cast,
  or copy into the predicted layout) and logged once; checks that passed on the first
  call are dropped from the wrapper used afterwards;
- buffers: an output buffer takes the storage of a dead buffer of the same storage
  size and dtype (never a graph output's or anything it may alias); every name is
  deleted after its last use, so memory returns to the allocator early.
"""
from __future__ import annotations

import dataclasses
import functools
import logging
from typing import Any, Callable

import torch

from .. import config
from ..codegen.kernel_source import KernelSource
from ..ir import nodes as ir
from ..ir.nodes import Ref
from ..plan.data import EagerStep, KernelPlan, Plan
from ..plan.graph_view import is_free
from .kernel_cache import load_kernels
from .launcher import bind_launchers
from .pdl import launched_with_pdl, pdl_sources
from .cuda_graphs import SeedBuffer, device_seed_source, device_seeds_wanted
from .steps import (Alloc, Barrier, Check, CopyInto, DrawSeeds, EagerCall, Free, Item, Launch, Layout, Program,
                    Replay, Return, StateSeed, Sym, View, defines, state_seed, storage_elems, view_layout)

log = logging.getLogger("stitchml")

try:  # one C++ call per view (what Inductor's generated code uses too)
    from torch._C._dynamo.guards import _reinterpret_tensor as _view
except ImportError:  # pragma: no cover
    def _view(t: torch.Tensor, size, stride, offset: int) -> torch.Tensor:
        return t.as_strided(size, stride, t.storage_offset() + offset)


class ProgramBuilder:
    def __init__(self, plan: Plan, sources: dict[str, KernelSource], device: torch.device,
                 device_seeds: bool = False, generic: bool = False):
        self.plan, self.g = plan, plan.graph
        # generic (dynamic templates): no decision that holds only at these exact sizes
        # (a view that happens to equal its base, buffers that happen to match in size),
        # so the steps have the same structure at every size of a bucket
        self.generic = generic
        # CUDA-graph mode: seeds read from a device buffer, barrier counters zeroed per launch
        self.device_seeds = device_seeds
        self.nseeds = 0
        self.nhost = 0   # host-drawn seeds (not graph mode)
        self.sources = sources
        self.steps: list = []
        self.names: dict[int, str] = {}
        self.known: dict[str, Layout] = {}     # names whose layout is known at compile time
        self.checker = Checker()
        self.consts: dict[str, Any] = {"torch": torch, "DEVICE": device, "_seeds": _seeds, "_view": _view,
                                       "CHECK": self.checker, "EMPTY": empty_strided_on(device),
                                       "AS_STRIDED_OF": as_strided_of}
        self.nconst = 0
        self.device = device
        self.partials: set[str] = set()
        self.users = self.g.users()
        self.outputs = set(self.g.output_ids())
        # new values of graph inputs that their kernel writes into the input's buffer
        # (plan/in_place.py); the others are copied there after the call
        self.into = {new: pos for pos, new in self.g.written() if plan.copy_reason(new) is None}

    # -- names and constants
    def _const(self, value: Any) -> str:
        if isinstance(value, (int, float)) and not isinstance(value, bool) and value == value \
                and abs(value) != float("inf"):
            return repr(value)
        if isinstance(value, (bool, type(None), str)):
            return repr(value)
        if isinstance(value, torch.dtype):
            return str(value)
        self.nconst += 1
        name = f"C{self.nconst}"
        self.consts[name] = value
        return name

    def _tree(self, a: Any, uses: list[str]) -> Any:
        """An argument as a tree of lists, tuples, numbers and `Sym`s (value names,
        namespace names)."""
        if isinstance(a, Ref):
            name = self.need(a.id)
            uses.append(name)
            return Sym(name)
        if isinstance(a, list):
            return [self._tree(x, uses) for x in a]
        if isinstance(a, tuple):
            return tuple(self._tree(x, uses) for x in a)
        text = self._const(a)
        if isinstance(a, (int, float, bool, str, type(None))) and text == repr(a):
            return a
        return Sym(text)

    def need(self, nid: int) -> str:
        """Name of node `nid`'s tensor; a free node (view, constant) is materialised
        here, a view chain as one strided view where its base's layout is known."""
        if nid in self.names:
            return self.names[nid]
        n = self.g[nid]
        if n.kind == ir.INPUT and n.attr("storage_of") is not None:
            return self._storage_range(nid)
        if not is_free(n):
            raise RuntimeError(f"node %{nid} ({n.kind}.{n.op}) used before it is computed (planner bug)")
        name = f"v{nid}"
        if n.kind != ir.VIEW:  # full / iota: a fresh contiguous tensor
            self.steps.append(self._constant(name, n))
            self.known[name] = Layout(n.shape, ir.contiguous_strides(n.shape))
            self.names[nid] = name
            return name
        root = nid
        while self.g[root].kind == ir.VIEW and root not in self.names:
            root = self.g[root].refs[0]
        self.need(root)
        collapsed = self._collapse(nid)
        if collapsed is not None:
            base, lay, ops = collapsed
            if lay == self.known[base] and nid not in self.outputs and not self.generic:
                self.names[nid] = base  # the same tensor: no step at all
                return base
            self.steps.append(View(name, base, Layout(lay.shape, lay.stride, lay.offset), ops))
            self.known[name] = Layout(lay.shape, lay.stride)
        else:
            src = self.need(n.refs[0])
            self.steps.append(self._replay(name, n, src))
        self.names[nid] = name
        return name

    def _storage_range(self, nid: int) -> str:
        """The storage range an as_strided of graph input reads (`rules_views.storage_read`):
        a dense 1-d view of it, taken as eager's as_strided takes it (bounds checked)."""
        n = self.g[nid]
        name = self.names[nid] = f"v{nid}"
        src = self.names[self.g.inputs[n.attr("storage_of")]]
        start = n.attr("storage_offset")
        if start is None:   # (the input's own storage offset, whatever it is at run time)
            self.steps.append(Replay(name, "{0}.as_strided({1}, (1,))", (Sym(src), n.shape), src))
        else:
            self.steps.append(Replay(name, "{0}.as_strided({1}, (1,), {2})", (Sym(src), n.shape, start), src))
        self.known[name] = Layout(n.shape, (1,))
        return name

    def _collapse(self, nid: int) -> tuple[str, Layout, tuple[str, ...]] | None:
        """(base name, layout relative to it, ops) of a view chain, or None."""
        if nid in self.names:
            name = self.names[nid]
            lay = self.known.get(name)
            return None if lay is None else (name, lay, ())
        n = self.g[nid]
        if n.kind != ir.VIEW:
            return None
        src = self._collapse(n.refs[0])
        if src is None:
            return None
        base, lay, ops = src
        new = view_layout(n.op, lay, n.shape, dict(n.attrs))
        return None if new is None else (base, new, ops + (n.op,))

    def _constant(self, name: str, n: ir.Node) -> Replay:
        if n.op == "full":
            return Replay(name, "torch.full({0}, {1}, dtype={2}, device=DEVICE)",
                          (n.shape, self._tree(n.attr("value"), []), Sym(str(n.dtype))))
        d = n.attr("dim")  # iota
        view = [1] * len(n.shape)
        view[d] = n.shape[d]
        return Replay(name, "torch.arange({0}, device=DEVICE).reshape({1}).expand({2}).contiguous()",
                      (n.shape[d], tuple(view), n.shape))

    def _replay(self, name: str, n: ir.Node, src: str) -> Replay:
        s = Sym(src)
        if n.op == "reshape":
            return Replay(name, "{0}.reshape({1})", (s, n.shape), src)
        if n.op == "permute":
            return Replay(name, "{0}.permute({1})", (s, tuple(n.attr("dims"))), src)
        if n.op == "expand":
            return Replay(name, "{0}.expand({1})", (s, n.shape), src)
        if n.op == "slice":
            dim, start, step = n.attr("dim"), n.attr("start"), n.attr("step")
            end = start + (n.shape[dim] - 1) * step + 1 if n.shape[dim] else start
            return Replay(name, "torch.ops.aten.slice.Tensor({0}, {1}, {2}, {3}, {4})", (s, dim, start, end, step), src)
        if n.op == "select":
            return Replay(name, "{0}.select({1}, {2})", (s, n.attr("dim"), n.attr("index")), src)
        if n.op == "unfold":
            return Replay(name, "{0}.unfold({1}, {2}, {3})", (s, n.attr("dim"), n.shape[-1], n.attr("step")), src)
        if n.op == "as_strided":
            return Replay(name, "AS_STRIDED_OF({0}, {1}, {2}, {3})",
                          (s, n.shape, tuple(n.attr("stride")), n.attr("offset")), src)
        raise NotImplementedError(f"replay of {n.op}")

    # -- the steps
    def build(self) -> Program:
        for i, nid in enumerate(self.g.inputs):
            self.names[nid] = f"a{i}"
            n = self.g[nid]
            if n.shape is not None and n.stride is not None:
                self.known[f"a{i}"] = Layout(n.shape, n.stride)  # (kernels rely on it too: guarded by Dynamo)
        for nid, value in self.g.constants.items():
            self.names[nid] = name = self._const(value)
            self.known[name] = Layout(tuple(value.shape), tuple(value.stride()))
        for step in self.plan.steps:
            if isinstance(step, KernelPlan):
                self._kernel(step)
            else:
                self._eager(step)
        copies = [(f"a{pos}", self.need(new)) for pos, new in self.g.written() if new not in self.into]
        if copies:   # (the inputs' own tensors, written after every reader ran)
            self.steps.append(CopyInto(*(tuple(c) for c in zip(*copies))))
        outs = tuple(self._tree(o, []) for o in self.g.returned)
        self.steps.append(Return(outs))
        if self.nseeds:
            self.consts["SEEDS"] = SeedBuffer(self.nseeds, self.device)
            self.steps.insert(0, DrawSeeds(self.nseeds))
        if self.nhost:
            self.steps.insert(0, DrawSeeds(self.nhost, host=True))
        steps = reuse_buffers(self.steps) if config.get("reuse_buffers") and not self.generic else self.steps
        steps = insert_frees(steps, len(self.g.inputs))
        return Program(mark_checks(steps, self.generic), len(self.g.inputs), self.consts)

    def _kernel(self, k: KernelPlan) -> None:
        group = self.plan.group_of(k.name)
        if group is not None and group.kind == "global" and group.grid > 1 and self.device.type == "cpu":
            # the interpreter runs one program at a time: a barrier over a grid planned for
            # a GPU (the `device` knob) would spin forever; run the phase-split twin instead
            group = None
        if group is None:
            self._launch(self.sources[k.name], [k])
        elif group.members[0] == k.name:  # the whole group launches at its first member
            kernels = {kp.name: kp for kp in self.plan.kernels}
            self._launch(self.sources[group.name], [kernels[m] for m in group.members], group.kind)

    def _launch(self, ks: KernelSource, kernels: list[KernelPlan], kind: str = "") -> None:
        args, writes = [], []
        poison = bool(config.get("poison_outputs"))
        for pkind, nid in ks.params:
            if pkind == "out":
                if nid in self.into and nid not in self.names:
                    name = self.names[nid] = f"a{self.into[nid]}"   # the input's buffer, overwritten
                    self.known[name] = Layout(self.g[nid].shape, self.g[nid].stride)
                elif nid not in self.names and self.g[nid].attr("placed_in") is not None:
                    self._placed_part(nid, poison)
                elif nid not in self.names:
                    n = self.g[nid]
                    name = f"v{nid}"
                    atomic = n.kind == ir.SCATTER_ADD
                    self.steps.append(Alloc(name, n.shape, n.stride, n.dtype, zero=atomic,
                                            fill=n.attr("init", 0) if atomic else 0,
                                            poison=poison and not atomic))
                    self.names[nid] = name
                    self.known[name] = Layout(n.shape, n.stride)
                args.append(self.names[nid])
                writes.append(self.names[nid])
            elif pkind == "seed" and self.g[nid].refs:
                args.append(self._state_seed(nid))
            elif pkind == "seed" and self.device_seeds:
                args.append(f"s{self.nseeds}")
                self.nseeds += 1
            elif pkind == "seed":
                args.append(f"h{self.nhost}")
                self.nhost += 1
            elif pkind == "partial":
                pname = f"p{nid}"
                if pname not in self.partials:  # allocated by the producing kernel, read by its combine
                    n = self.g[nid]
                    producer = next(k for k in self.plan.kernels if nid in k.partials)
                    dtype = torch.float32 if n.dtype in (torch.float16, torch.bfloat16) else n.dtype
                    shape = (producer.mapping.grid, n.numel)
                    self.steps.append(Alloc(pname, shape, ir.contiguous_strides(shape), dtype))
                    self.partials.add(pname)
                args.append(pname)
                writes.append(pname)
            elif pkind == "counter":
                self.consts.setdefault("BARRIER", _BarrierCounter(self.device))
                self.steps.append(Barrier((len(kernels) - 1) * ks.grid, reset=self.device_seeds))
                args.append("counter")
            elif pkind == "base":
                args.append("base")
            else:
                args.append(self.need(nid))
        # outputs listed by the plan but never written by the kernel would be garbage: refuse
        written = {nid for pkind, nid in ks.params if pkind in ("out", "partial")}
        missing = {o for k in kernels for o in k.outputs} - written
        if missing:
            raise RuntimeError(f"kernel {ks.name} does not write outputs {sorted(missing)}")
        maxnreg = None
        if kind == "global" and self.device.type == "cuda":
            from ..plan.launches import MAXNREG
            maxnreg = MAXNREG  # keeps the residency assumption of the barrier grid
        self.steps.append(Launch(ks.name, ks.grid, tuple(args), ks.num_warps, maxnreg, tuple(writes),
                                 pdl=launched_with_pdl(ks)))

    def _placed_part(self, nid: int, poison: bool) -> None:
        """A part of a placed concatenation (`plan/placement.py`): a view of its slice of
        the concatenation's buffer, which the first part to be written allocates."""
        n = self.g[nid]
        cat, offset = n.attr("placed_in")
        c = self.g[cat]
        if cat not in self.names and c.attr("placed_in") is not None:   # a slice of an outer concatenation
            self._placed_part(cat, poison)
        elif cat not in self.names:
            self.names[cat] = f"v{cat}"
            self.steps.append(Alloc(f"v{cat}", c.shape, c.stride, c.dtype, poison=poison))
            self.known[f"v{cat}"] = Layout(c.shape, c.stride)
        name = self.names[nid] = f"v{nid}"
        self.steps.append(View(name, self.names[cat], Layout(n.shape, n.stride, offset), ("placed",)))
        self.known[name] = Layout(n.shape, n.stride)

    def _state_seed(self, nid: int) -> str:
        """The seed of a random node that replays a saved RNG state (its one argument;
        `lower/rules_rng_state.py`): derived from that state's bytes on every call, so a
        recomputation draws what its forward drew."""
        n = self.g[nid]
        self.consts.setdefault("_state_seed", state_seed)
        name = f"r{nid}"
        self.steps.append(StateSeed(name, self.need(n.refs[0]), n.attr("rng_stream", 0), self.device_seeds))
        return name

    def _eager(self, step: EagerStep) -> None:
        n = self.g[step.node]
        name = f"v{n.id}"
        if n.kind == ir.ITEM:
            self.steps.append(Item(name, self.need(n.refs[0]), n.attr("index")))
        else:
            target, args, kwargs = self.g.eager_calls[n.id]
            uses: list[str] = []
            trees = tuple(self._tree(a, uses) for a in args)
            kw = tuple((k, self._tree(v, uses)) for k, v in kwargs.items())
            self.steps.append(EagerCall(name, self._const(_direct_op(target)), trees, kw,
                                        tuple(dict.fromkeys(uses)), n.op, _may_alias(target)))
        self.names[n.id] = name
        if n.shape is not None and n.stride is not None and n.dtype is not None and self._metadata_matters(n.id):
            # kernels, views and later graphs (a saved tensor read by the backward's
            # kernels) address this value as the plan predicted it: checked, not trusted
            op = f"{self.g[n.refs[0]].op}[{n.attr('index')}]" if n.kind == ir.ITEM else n.op
            self.steps.append(Check(name, n.shape, n.stride, n.dtype, self.checker.register(op), op,
                                    none_ok=not self._read_by_ours(n.id)))
            self.known[name] = Layout(n.shape, n.stride)

    def _read_by_ours(self, nid: int) -> bool:
        """Whether a kernel or a view of ours reads the value (not only eager ops)."""
        return any(self.g[u].kind not in (ir.OPAQUE, ir.ITEM) for u in self.users[nid])

    def _metadata_matters(self, nid: int) -> bool:
        return nid in self.outputs or self._read_by_ours(nid)


# ------------------------------------------------------------------------ passes

def _direct_op(target: Any) -> Any:
    """What the wrapper calls for an eager op: an ATen overload's C++ entry itself
    (`OpOverload.__call__` is a Python frame that only calls it: ~0.4 µs an eager op
    on the CPU machine, ~300 eager ops a BERT training step), anything else as is."""
    if type(target) is torch._ops.OpOverload and callable(getattr(target, "_op", None)):
        return target._op
    return target


def _may_alias(target: Any) -> bool:
    """Whether an eager op's result may share storage with its arguments: a view op
    or one that mutates (its schema says so); unknown callables are assumed to."""
    schema = getattr(target, "_schema", None)
    if schema is None:
        return True
    return schema.is_mutable or any(r.alias_info is not None for r in schema.returns)


def _aliases(steps: list) -> dict[str, set[str]]:
    """For each value name, the allocated buffers (Alloc names) it may share storage
    with.  An eager result may alias any of its tensor arguments (conservative)."""
    out: dict[str, set[str]] = {}
    for s in steps:
        if isinstance(s, Alloc):
            out[s.name] = {s.name}
        elif isinstance(s, (View, Replay, Item, EagerCall, Check)):
            roots: set[str] = set()
            for r in (s.reads() if not isinstance(s, EagerCall) or s.may_alias else ()):
                roots |= out.get(r, set())
            out[s.name] = out.get(s.name, set()) | roots
    return out


def reuse_buffers(steps: list) -> list:
    """Give an Alloc the storage of a dead buffer of equal storage size and dtype.
    A buffer is dead after the last step reading any name that may alias it; buffers
    a graph output may alias are never reused, nor zero-initialised ones."""
    aliases = _aliases(steps)
    last: dict[str, int] = {}
    pinned: set[str] = set()
    for i, s in enumerate(steps):
        names = list(s.reads()) + ([defines(s)] if defines(s) else [])
        for name in names:
            for root in aliases.get(name, ()):
                last[root] = i
        if isinstance(s, Return):
            for v in s.reads():
                pinned |= aliases.get(v, set())
    dies: dict[int, list[str]] = {}
    for root, i in last.items():
        dies.setdefault(i, []).append(root)
    allocs = {s.name: s for s in steps if isinstance(s, Alloc)}
    pool: dict[tuple, list[str]] = {}
    out = []
    for i, s in enumerate(steps):
        if isinstance(s, Alloc) and not s.zero and s.name not in pinned:
            key = (storage_elems(s.shape, s.stride), s.dtype)
            if key[0] and pool.get(key):
                donor = allocs[pool[key].pop()]
                same = donor.shape == s.shape and donor.stride == s.stride
                s = Alloc(s.name, s.shape, s.stride, s.dtype, poison=s.poison, reuse=donor.name, reuse_same=same)
        out.append(s)
        for root in dies.get(i, ()):
            a = allocs.get(root)
            if a is not None and not a.zero and root not in pinned:
                pool.setdefault((storage_elems(a.shape, a.stride), a.dtype), []).append(root)
    return out


def mark_checks(steps: list, generic: bool = False) -> list:
    """Each launch's `checks`: "." for an argument that is the wrapper's own buffer —
    allocated in the call (the allocator aligns every block), or a view of one at a
    fixed offset — whose dtype and 16-byte alignment are the same at every call, so
    its launch line need not check them again; "c" for the rest (inputs, eager
    results, replayed views, integers).  `generic` (a dynamic template): views are
    checked too, their offsets may move with the sizes."""
    own: set[str] = set()
    out = []
    for s in steps:
        if isinstance(s, Alloc):
            own.add(s.name)
        elif isinstance(s, View) and not generic and s.base in own and type(s.layout.offset) is int:
            own.add(s.name)
        elif isinstance(s, Launch):
            s = dataclasses.replace(s, checks="".join("." if a in own else "c" for a in s.args))
        out.append(s)
    return out


def insert_frees(steps: list, num_inputs: int) -> list:
    """`del` each value name after the step that reads it last (inputs included: the
    boxed calling convention hands them over), except names returned."""
    last: dict[str, int] = {f"a{i}": -1 for i in range(num_inputs)}
    returned: set[str] = set()
    for i, s in enumerate(steps):
        d = defines(s)
        if d:
            last.setdefault(d, i)
        for r in s.reads():
            last[r] = i
        if isinstance(s, Return):
            returned |= set(s.reads())
    frees: dict[int, list[str]] = {}
    for name, i in last.items():
        if name not in returned and name[:1] in "avp":
            frees.setdefault(i, []).append(name)
    out = [Free(tuple(frees[-1]))] if frees.get(-1) else []
    for i, s in enumerate(steps):
        out.append(s)
        if frees.get(i) and not isinstance(s, Return):
            out.append(Free(tuple(frees[i])))
    return out


# --------------------------------------------------------------------- run time

class Checker:
    """Checks of one graph's eager results against the plan's metadata.  `passed`:
    checks that saw what was predicted; `fixed`: check → what was absorbed."""

    def __init__(self) -> None:
        self.ops: list[str] = []
        self.passed: set[int] = set()
        self.fixed: dict[int, str] = {}

    def register(self, op: str) -> int:
        self.ops.append(op)
        return len(self.ops) - 1

    def __call__(self, t: Any, shape: tuple, stride: tuple, dtype: torch.dtype, index: int,
                 none_ok: bool = False) -> torch.Tensor | None:
        if t is None and none_ok:   # (`steps.Check.none_ok`: returned only, as eager returns it)
            self.passed.add(index)
            return None
        if not isinstance(t, torch.Tensor):
            raise RuntimeError(f"eager op {self.ops[index]} returned {type(t).__name__}, the plan assumed a tensor")
        if tuple(t.shape) != shape:
            raise RuntimeError(f"eager op {self.ops[index]} returned shape {tuple(t.shape)}, the plan assumed {shape}")
        same_layout = t.numel() <= 1 or all(a == b for n, a, b in zip(shape, t.stride(), stride) if n > 1)
        if t.dtype == dtype and same_layout:
            self.passed.add(index)
            return t
        what = []
        if t.dtype != dtype:
            what.append(f"dtype {t.dtype} (plan: {dtype})")
        if not same_layout:
            what.append(f"strides {t.stride()} (plan: {stride})")
        out = torch.empty_strided(shape, stride, dtype=dtype, device=t.device).copy_(t)
        if index not in self.fixed:
            self.fixed[index] = ", ".join(what)
            log.warning("stitchml: eager op %s returned %s; converted to what the plan assumed",
                        self.ops[index], self.fixed[index])
        return out


class _BarrierCounter:
    """The grid-barrier counter of a compiled graph: a device int64 that only grows.
    Each launch gets a fresh base, so barriers never need a reset (no extra memset
    launch).  Created on first use, outside compilation's fake-tensor mode."""

    def __init__(self, device: torch.device):
        self.device = device
        self.counter = None
        self.base = 0

    def take(self, arrivals: int):
        if self.counter is None:
            self.counter = torch.zeros(1, dtype=torch.int64, device=self.device)
        base = self.base
        self.base += arrivals
        return self.counter, base

    def reset(self):
        """CUDA-graph mode: the counter zeroed on the stream before the launch (captured
        as a memset, so every replay starts from 0) and a base of 0."""
        if self.counter is None:
            self.counter = torch.zeros(1, dtype=torch.int64, device=self.device)
        else:
            self.counter.zero_()
        return self.counter, 0


def as_strided_of(t: torch.Tensor, size: tuple, stride: tuple, offset: int) -> torch.Tensor:
    """The IR's as_strided view: `stride` and `offset` count `t`'s elements in their
    contiguous order (`rules_views.element_view`), so it is torch's as_strided of `t`
    laid out contiguously (a copy where it is not: a step slice), from `t`'s first
    element."""
    c = t if t.is_contiguous() else t.contiguous()
    return torch.as_strided(c, size, stride, c.storage_offset() + offset)


@functools.lru_cache(maxsize=None)   # one object per device: wrappers compare their constants
def empty_strided_on(device: torch.device) -> Callable[[tuple, tuple, torch.dtype], torch.Tensor]:
    """`EMPTY(size, stride, dtype)` of the wrappers: an uninitialised buffer on `device`.
    torch's C++ allocation entry points (what Inductor's wrappers call) skip the Python
    argument parser of `torch.empty_strided`: 1.1 against 4.2 µs an allocation on the
    2-core CPU, for ~300 buffers a BERT-base training step.  The CUDA one allocates on
    the *current* device, so it is taken only while that is `device`."""
    try:
        from torch._C._dynamo.guards import _empty_strided_cpu, _empty_strided_cuda
    except ImportError:  # pragma: no cover (older torch)
        _empty_strided_cpu = _empty_strided_cuda = None

    def portable(size, stride, dtype):
        return torch.empty_strided(size, stride, dtype=dtype, device=device)

    if device.type == "cpu" and _empty_strided_cpu is not None:
        return _empty_strided_cpu
    if device.type != "cuda" or _empty_strided_cuda is None or torch.cuda.device_count() == 0:
        return portable   # (no CUDA here: a wrapper built for a GPU is only rendered)
    if device.index is None or torch.cuda.device_count() == 1:
        return _empty_strided_cuda   # "cuda" is the current device; or the only one
    index, current = device.index, torch.cuda.current_device

    def on_device(size, stride, dtype):
        return _empty_strided_cuda(size, stride, dtype) if current() == index else portable(size, stride, dtype)
    return on_device


def _seeds(n: int) -> list[int]:
    # drawn from torch's default generator: reproducible under torch.manual_seed
    return torch.randint(0, 2**31 - 1, (n,)).tolist()


def build_program(plan: Plan, sources: dict[str, KernelSource], device: torch.device,
                  device_seeds: bool = False, generic: bool = False) -> Program:
    """The wrapper of a plan as steps (inspect `.steps`; `.render()` is its source).
    `device_seeds`: kernels read their seeds from a device buffer redrawn per call
    (what a captured CUDA graph needs; the kernels must be `device_seed_source`'s).
    `generic`: steps whose structure does not depend on size coincidences (the
    dynamic runner's templates): no view elided for equalling its base, no buffer reuse."""
    return ProgramBuilder(plan, sources, device, device_seeds, generic).build()


def build_wrapper(plan: Plan, sources: dict[str, KernelSource], device: torch.device) -> tuple[str, dict]:
    """The wrapper's Python source and the objects it names (eager ops, constants)."""
    program = build_program(plan, sources, device)
    return program.render(), program.consts


def _exec(code: str, namespace: dict) -> Callable:
    exec(compile(code, "<stitchml-wrapper>", "exec"), namespace)
    return namespace["call"]


def load_callable(code: str, consts: dict, sources: dict[str, KernelSource] | dict[str, str],
                  program: Program | None = None) -> Callable:
    """Load the kernels (one module, cached by content) and exec the wrapper.  With
    the `program`, the wrapper used after the first call drops the checks that passed."""
    namespace = dict(consts)
    if sources:
        # kernels equal up to their name share one Triton function; each name gets a
        # launcher bound at load time (runtime/launcher.py), same call shape as the JIT
        functions = load_kernels({n: s if isinstance(s, str) else s.source for n, s in sources.items()})
        namespace.update(bind_launchers(functions))
    debug = config.get("debug_dir")
    if debug:
        import hashlib
        from pathlib import Path
        Path(debug).mkdir(parents=True, exist_ok=True)
        (Path(debug) / f"wrapper_{hashlib.sha256(code.encode()).hexdigest()[:12]}.py").write_text(code)
    first = _exec(code, namespace)
    checker = consts.get("CHECK")
    if program is None or not program.of_type(Check):
        return first
    state = {"fn": first}

    def call(args):
        fn = state["fn"]
        out = fn(args)
        if fn is first:  # checks ran once: keep only those that had something to absorb
            call.source = program.render(drop_checks=checker.passed - set(checker.fixed))
            state["fn"] = _exec(call.source, namespace)
        return out

    call.source = code  # (the source that runs now)
    return call


def build_callable(plan: Plan, sources: dict[str, KernelSource], device: torch.device,
                   device_seeds: bool | None = None) -> tuple[Callable, str]:
    """The graph's callable and its wrapper's source.  Where the graph may be captured
    in a CUDA graph, kernels read their seeds from device memory."""
    if device_seeds is None:
        device_seeds = device_seeds_wanted(device)
    sources = pdl_sources(sources, device)
    program = build_program(plan, sources, device, device_seeds)
    if device_seeds:
        sources = {n: device_seed_source(ks) for n, ks in sources.items()}
    code = program.render()
    return load_callable(code, program.consts, sources, program), code
