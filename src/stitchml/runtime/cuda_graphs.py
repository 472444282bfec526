"""CUDA graphs by default where safe (issue 12.3).

A compiled graph (inference, training forward or backward) is captured once and then
replayed, which removes the host cost of its launches and eager calls:

- **what is copied**: only inputs whose address changes between calls (the user's
  batch).  Parameters and buffers, any input found at the same address in the
  warm-up call and the capture call, and any input that is a static output of
  another captured graph (a saved activation the forward graph's replay wrote, which
  the backward's warm-up saw at its plain-call address), are read in place: never
  copied.  Every replay checks that those addresses
  still hold; if one moved, that call runs without the graph, and after
  `MAX_RECAPTURES` such misses the graph is captured again.  An input copied because
  its producer graph ran plain when this one was captured (the producer was between two
  captures) is read in place once the producer's new static outputs exist: the runner
  captures again.  An input that is not dense (a table broadcast over the batch, q sliced
  out of a fused qkv projection) is copied by the storage range it reads.
- **outputs**: returned as aliases of the graph's static outputs (one C++ call each,
  no copy), and the alias handed out by the last replay is handed out again when
  nobody kept it: its Python reference count is the runner's alone, its TensorImpl's
  use count 1 (no autograd node saved it, no `.grad` took it) and its version counter
  unchanged (no in-place op wrote it or changed its shape), so a BERT-base step makes
  ~430 fewer tensors (knob `reuse_outputs`).  Before a replay overwrites them, their
  storage's use count must be back to what it was after capture (nobody holds last
  call's outputs, or a view of them, any more: the backward consumed the saved
  activations).  An output still held (the user's loss or logits kept across steps)
  makes that call run without the graph and is cloned on return from then on.
- **RNG**: a graph-mode kernel reads its seed from a device buffer
  (`device_seed_source`) that the wrapper refreshes with `random_` at the start of
  every call; captured, that `random_` draws from CUDA's graph-safe generator, whose
  offset advances per replay, so dropout masks differ between replays and repeat
  under `torch.manual_seed`.
- **refusals**, each kept in `CompiledGraph.cuda_graph_note` (shown by `explain`):
  knob off, no CUDA device, dynamic sizes, eager ops that read values back to the
  host or have data-dependent shapes, an eager op that mutates an input that is
  copied per replay (the mutation would land in the copy), an input copied per replay
  whose storage an as_strided reads by position (the copy holds elements only), inputs on the CPU, a
  capture that fails, a random op of an activation-checkpointed region (its RNG state
  is captured, or its seed derived from a saved one, on the host per call).

The decision functions and the bookkeeping (`GraphRunner`, with a stand-in for the
CUDA graph in tests) run on the CPU; capture itself needs CUDA.
"""
from __future__ import annotations

import os
import sys
import warnings
import weakref
from dataclasses import dataclass
from typing import Any, Callable

import torch

from .. import config
from ..codegen.kernel_source import KernelSource
from ..ir import nodes as ir
from ..plan.data import EagerStep, Plan
from .steps import CaptureRngState

MAX_RECAPTURES = 3

# Storage addresses of the static outputs of every captured graph (runner id -> addresses).
# A training step's backward reads the forward's saved activations: at the backward's
# warm-up they were the forward's plain-call results, at its capture they are aliases of
# the forward graph's static outputs, so their address "moved" once and they used to be
# copied on every replay (H200, 2026-11-25: 144 copies and 0.9 ms per LLaMA-style step,
# 261 and 0.7 ms per BERT step).  An input found in another graph's static outputs is read
# in place like a parameter; every replay still checks its address.
_STATIC_OUTPUTS: dict[int, frozenset[int]] = {}
# bumped whenever the registry changes: a runner that copies inputs looks again whether
# some became another graph's static outputs only when this moved (no per-replay scan)
_VERSION = [0]


# Storage addresses of the clones each runner handed out at its latest call (runner id ->
# addresses).  An output the caller holds across calls is returned as a clone, a fresh
# allocation every call: a graph that reads it (a training backward reading the key/value
# tensors Hugging Face also returns as its KV cache) must copy it, even where the allocator
# happened to give the clone the same address at its warm-up and its capture (it trusted
# such an input, saw it move at the next step and captured again: LLaMA's backward took
# three captures of the three allowed on CPU stand-ins, 2026-11-30).
_CLONED: dict[int, frozenset[int]] = {}


def _register(key: int, ptrs: frozenset[int]) -> None:
    _STATIC_OUTPUTS[key] = ptrs
    _VERSION[0] += 1


def _unregister(key: int) -> None:
    if _STATIC_OUTPUTS.pop(key, None) is not None:
        _VERSION[0] += 1


def _forget(key: int) -> None:
    """A collected runner: neither its static outputs nor its clones are known any more."""
    _unregister(key)
    _CLONED.pop(key, None)


def _cloned_elsewhere(x: torch.Tensor) -> bool:
    ptr = x.untyped_storage().data_ptr()
    return any(ptr in ptrs for ptrs in _CLONED.values())


def _graph_output_storage(x: torch.Tensor) -> bool:
    ptr = x.untyped_storage().data_ptr()
    return any(ptr in ptrs for ptrs in _STATIC_OUTPUTS.values())


def _span(x: torch.Tensor) -> torch.Tensor:
    """The storage range `x` reads, as one contiguous 1-d view: what a copy of an input
    that is not dense must move (a batch-broadcast table saved for the backward, one of
    q/k/v sliced out of a fused projection).  Such a tensor cannot be the destination of
    a `copy_` (broadcast elements alias), but its range can."""
    n = 1 + sum((size - 1) * st for size, st in zip(x.shape, x.stride())) if x.numel() else 0
    return x.as_strided((n,), (1,), x.storage_offset())

# eager ops whose result is read on the host or whose output shape depends on values:
# they synchronise with the CPU, which a captured graph cannot do
SYNC_OPS = frozenset({
    "aten._local_scalar_dense.default", "aten.item.default", "aten.nonzero.default", "aten.nonzero_static.default",
    "aten.masked_select.default", "aten.unique_consecutive.default", "aten._unique2.default",
    "aten.unique_dim.default", "aten.equal.default", "aten.is_nonzero.default",
    "aten._assert_async.msg", "aten._assert_async.default", "aten.repeat_interleave.Tensor",
    "aten.bincount.default", "aten.histc.default",
})


@dataclass(frozen=True)
class Decision:
    capture: bool
    reason: str = ""     # why not (empty when the graph is captured)


def asked_explicitly() -> bool:
    """Whether the user set the knob (environment or `config.override`) rather than
    relying on its default: only then is a refusal worth a warning."""
    return os.environ.get(config.KNOBS["cuda_graphs"].env) is not None or any(
        "cuda_graphs" in layer for layer in config._overrides)


def mode(kind: str, device: torch.device, *, dynamic: bool = False) -> Decision:
    """Before planning: whether this graph is meant for capture (planning differs: no
    grid-barrier launches, whose host-side base a replay would repeat)."""
    if not config.get("cuda_graphs"):
        return Decision(False, "")
    if dynamic:
        return Decision(False, "CUDA graphs are not applied to graphs with dynamic sizes")
    if device.type != "cuda":
        return Decision(False, f"CUDA graphs need a CUDA device; {kind} graph on {device.type} runs without them")
    return Decision(True)


# eager steps that read or set a generator's state on the host: random ops of a
# recomputed (activation-checkpointed) region, stitched (`CaptureRngState`) or not
RNG_STATE_OPS = frozenset({"run_and_save_rng_state", "run_with_rng_state"})


def plan_refusal(plan: Plan) -> str | None:
    """After planning: a reason the plan cannot be captured, or None."""
    for step in plan.steps:
        if isinstance(step, EagerStep) and step.op in SYNC_OPS:
            return f"CUDA graphs refused: eager op {step.op} synchronises with the CPU"
        if isinstance(step, EagerStep) and (step.op in RNG_STATE_OPS or step.op.startswith(CaptureRngState.NAME)):
            return (f"CUDA graphs refused: eager op {step.op} reads or sets the RNG state on the host (a random "
                    f"op of an activation-checkpointed region); a replay would repeat it")
    for k in plan.kernels:
        if any(plan.graph[nid].refs for nid in k.seeds):
            return ("CUDA graphs refused: a random op of an activation-checkpointed region takes its seed from a "
                    "saved RNG state, on the host, per call; a replay would repeat the seed")
    return None


def mutated_inputs(g: ir.Graph) -> set[int]:
    """Positions of the graph inputs an eager op writes into (through views too), and
    those the graph writes new values into (`Graph.input_writes`)."""
    root: dict[int, int] = {nid: i for i, nid in enumerate(g.inputs)}
    for n in g.nodes:
        if n.kind == ir.VIEW and n.refs and n.refs[0] in root:
            root[n.id] = root[n.refs[0]]
    out = set(g.input_writes)
    for nid, (target, _args, _kw) in g.eager_calls.items():
        schema = getattr(target, "_schema", None)
        if schema is None:
            continue
        node = g[nid]
        for arg, ref in zip(schema.arguments, node.args):
            if arg.alias_info is not None and arg.alias_info.is_write and isinstance(ref, ir.Ref) \
                    and ref.id in root:
                out.add(root[ref.id])
    return out


def device_seeds_wanted(device: torch.device) -> bool:
    """Kernels read their seeds from a device buffer when the graph may be captured."""
    return device.type == "cuda" and bool(config.get("cuda_graphs"))


# ----------------------------------------------------------------------------- seeds

def device_seed_source(ks: KernelSource) -> KernelSource:
    """The kernel with each seed argument read from memory: parameter `seedX_ptr`, and
    `seedX = tl.load(seedX_ptr)` first in the body (a captured launch keeps its
    arguments; the memory behind a pointer can change per replay)."""
    names = list(ks.param_names)
    first = []
    for i, (kind, _nid) in enumerate(ks.params):
        if kind == "seed":
            first.append(f"{names[i]} = tl.load({names[i]}_ptr)")
            names[i] = f"{names[i]}_ptr"
    if not first:
        return ks
    # (after a programmatic dependent launch's wait, runtime/pdl.py: the seed buffer is
    # written by the captured draw before this kernel)
    from .pdl import after_wait
    return KernelSource(ks.name, list(ks.params), names, after_wait(ks.body, first), ks.grid, ks.num_warps,
                        ks.levels)


class SeedBuffer:
    """The seeds of a graph's kernels in device memory, redrawn every call.  The draw
    is a torch RNG op: inside a CUDA graph it is captured and, CUDA's generator being
    graph-safe, advances per replay; under `torch.manual_seed` the sequence repeats."""

    def __init__(self, count: int, device: torch.device):
        self.count, self.device = count, device
        self.buf: torch.Tensor | None = None
        self.views: tuple = ()

    def draw(self) -> tuple:
        if self.buf is None:  # (created on first use: compilation runs under fake tensors)
            self.buf = torch.empty(self.count, dtype=torch.int64, device=self.device)
            self.views = tuple(self.buf[i] for i in range(self.count))
        self.buf.random_(0, 2**31 - 1)
        return self.views


# ----------------------------------------------------------------------------- capture and replay

class CudaBackend:
    """Capture and replay on a real CUDA device."""

    def capture(self, call: Callable[[list], Any], inputs: list) -> tuple[Any, Any]:
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = call(list(inputs))
        return graph, out

    def replay(self, graph: Any, inputs: list) -> None:
        graph.replay()  # (the graph reads the inputs' memory: `inputs` are at the captured addresses)

    def on_device(self, t: torch.Tensor) -> bool:
        return t.is_cuda


def _use_count(t: torch.Tensor) -> int:
    return torch._C._storage_Use_Count(t.untyped_storage()._cdata)


def _held_by_runner_only() -> tuple[int, int]:
    """What `sys.getrefcount` reads for an object only a list refers to, in the two forms
    the runner uses: `lst[k]` inside a comprehension (the replay's held check) and a local
    bound to `lst[k]` (`_outputs`).  Taken from this interpreter in those very forms: a
    different Python counts its temporaries differently, and a wrong baseline would call
    every output held."""
    lst = [object()]
    in_comprehension = [sys.getrefcount(lst[k]) for k in range(1)][0]
    t = lst[0]
    return in_comprehension, sys.getrefcount(t)


_ONLY_RUNNER, _ONLY_RUNNER_LOCAL = _held_by_runner_only()


def _ptrs_equal_py(tensors: list, ptrs: list, indices: list[int]) -> bool:
    """The same test as torch's C++ `_tensors_data_ptrs_at_indices_equal`: `ptrs` is indexed
    by INPUT POSITION (one entry per input, None where not compared), not by rank in `indices`."""
    return all(tensors[i].data_ptr() == ptrs[i] for i in indices)


# (CUDA builds of torch: one C++ call compares many inputs' addresses; the CPU build has none
# and uses the Python twin, so that the CPU tests pass the arguments in the very layout the
# C++ call reads: H200 2026-11-30, a compact list of addresses raised IndexError in every
# training backward, whose static inputs are not a prefix of its inputs)
_PTRS_EQUAL = getattr(torch._C, "_tensors_data_ptrs_at_indices_equal", None) or _ptrs_equal_py


try:
    from torch._C._dynamo.guards import _reinterpret_tensor as _alias
except ImportError:  # pragma: no cover
    def _alias(t, size, stride, offset):
        return t.as_strided(size, stride, t.storage_offset() + offset)


class GraphRunner:
    """The graph's callable under CUDA graphs (see the module docstring)."""

    def __init__(self, call: Callable, rec: Any, mutated: set[int], backend: Any = None, warmup: int = 1,
                 by_position: set[int] = frozenset()):
        self.call, self.rec, self.mutated = call, rec, mutated
        # inputs whose storage an as_strided reads by position (`Graph.read_by_position`): captured
        # only where read in place, since a copy (by elements, or by their range) moves what lies between
        self.by_position = set(by_position)
        self.backend = backend or CudaBackend()
        self.warmup = warmup
        self.dead = False                # refused at run time: plain calls from now on
        self.graph = None
        self.seen = 0                    # plain calls since the last (re)capture started
        self.ptrs: dict[int, int] = {}   # input position -> address at warm-up / capture
        self.static: list[int] = []      # inputs read in place
        self.copies: dict[int, torch.Tensor] = {}   # input position -> its buffer in the graph
        self.out: tuple = ()
        self.policy: list = []           # per output: alias | view (of a parameter) | clone | (input, j) | value
        # per replay, the host work is per input and output (BERT's backward: 330 inputs,
        # ~215 outputs), so what can be is worked out once at capture: the static inputs'
        # addresses as a list, the aliased outputs' storages (`_cdata`: stable while
        # `self.out` holds them) with their use counts after capture, each output's rebuild
        self.static_ptrs: list = []      # per input position: its address if read in place, else None
        self.held_check: list[tuple[int, int, int]] = []   # (output, storage _cdata, use count)
        self.rebuild: list[tuple] = []   # per output: (kind, tensor or input position, shape, stride)
        # per output: the alias the last replay handed out and its version then (None: none
        # to reuse); the held check expects one more use of the storage for each
        self.handed: list = []
        self.handed_version: list[int] = []
        # per aliased output: the outputs on its storage (several outputs may share one),
        # and how many of them have a handed-out alias alive (each one more storage use)
        self.share: list = []
        self.extra: list[int] = []
        self.reuse = bool(config.get("reuse_outputs"))
        self.clone: set[int] = set()    # outputs returned as copies (found held across calls)
        self.moving: set[int] = set()   # inputs that moved once: always copied
        self.by_range: dict[int, tuple] = {}   # inputs copied by storage range -> their strides
        self.version = -1                # the static-output registry's version last looked at
        self.replays = 0
        self.captured = ""               # what the capture found (the note holds refusals only)
        self.misses = 0
        self.recaptures = 0
        self.last_miss = ""              # why the last call ran without the graph
        # a runner that is collected leaves no stale addresses in the registry
        weakref.finalize(self, _forget, id(self))

    def __call__(self, args: list) -> Any:
        inputs = list(args)
        args.clear()
        if self.dead:
            return self.call(inputs)
        if self.graph is None:
            if self.seen < self.warmup:
                self.seen += 1
                self.ptrs = {i: x.data_ptr() for i, x in enumerate(inputs) if isinstance(x, torch.Tensor)}
                return self.call(list(inputs))
            return self._capture(inputs)
        return self._replay(inputs)

    # -- capture
    def _refuse(self, reason: str, inputs: list) -> Any:
        self.dead = True
        self.rec.cuda_graph_note = f"CUDA graphs refused: {reason}"
        if asked_explicitly():
            warnings.warn(f"stitchml: {self.rec.kind} graph: {self.rec.cuda_graph_note}", stacklevel=3)
        return self.call(inputs)

    def _capture(self, inputs: list) -> Any:
        tensors = {i: x for i, x in enumerate(inputs) if isinstance(x, torch.Tensor)}
        off = [i for i, x in tensors.items() if not self.backend.on_device(x)]
        if off:
            return self._refuse(f"input {off[0]} is not on the GPU", inputs)
        # another graph's static output is read in place even if it moved before: it
        # moves when that graph is captured again (its held outputs then cloned), once
        # (H200: the forward recaptured at the third step, and 230 activations a BERT
        # step were copied ever after because the backward had marked them moving)
        # (a clone another graph handed out is a fresh allocation every call: copied)
        self.moving |= {i for i, x in tensors.items() if _cloned_elsewhere(x)}
        self.static = [i for i, x in tensors.items() if isinstance(x, torch.nn.Parameter) or
                       _graph_output_storage(x) or (i not in self.moving and self.ptrs.get(i) == x.data_ptr())]
        copied = sorted(set(tensors) - set(self.static))
        written = sorted(self.mutated & set(copied))
        if written:
            return self._refuse(f"input {written[0]} is written in place (by an eager op or a new value), and would "
                                f"be copied per replay", inputs)
        positional = sorted(self.by_position & set(copied))
        if positional:
            return self._refuse(f"input {positional[0]} is read by storage position (an as_strided between or past "
                                f"its elements), which a copy of it would not keep", inputs)
        for i in copied:
            x = tensors[i]
            if _dense(x):
                self.copies[i] = torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, device=x.device).copy_(x)
            else:   # the range it reads, viewed with its own strides
                buf = _span(x).clone()
                self.copies[i] = buf.as_strided(x.shape, x.stride(), 0)
                self.by_range[i] = x.stride()
        self.ptrs = {i: tensors[i].data_ptr() for i in self.static}
        graph_inputs = [self.copies.get(i, x) for i, x in enumerate(inputs)]
        try:
            self.graph, out = self.backend.capture(self.call, graph_inputs)
        except Exception as e:  # (e.g. an op that is not capturable)
            self.graph = None
            return self._refuse(f"capture failed: {type(e).__name__}: {str(e)[:200]}", inputs)
        self.out = tuple(out)
        by_id = {id(x): j for j, x in enumerate(graph_inputs)}
        # memory of inputs read in place (parameters): a view of it is never overwritten
        # by a replay, so whoever holds one does not stop the next replay
        in_place = {tensors[i].untyped_storage().data_ptr() for i in self.static}
        self.policy = []
        for o in self.out:
            if not isinstance(o, torch.Tensor):
                self.policy.append(("value",))
            elif id(o) in by_id:
                self.policy.append(("input", by_id[id(o)]))
            elif len(self.policy) in self.clone:
                self.policy.append(("clone",))
            elif o.untyped_storage().data_ptr() in in_place:
                self.policy.append(("view",))
            else:
                self.policy.append(("alias",))
        self.static_ptrs = [self.ptrs.get(i) for i in range(len(inputs))]
        self.held_check = [(k, o.untyped_storage()._cdata, _use_count(o)) for k, o in enumerate(self.out)
                           if self.policy[k][0] == "alias"]
        self.handed = [None] * len(self.out)
        self.handed_version = [0] * len(self.out)
        self.share, self.extra = [None] * len(self.out), [0] * len(self.out)
        self.rebuild = [(p[0], p[1] if p[0] == "input" else o,
                         tuple(o.shape) if isinstance(o, torch.Tensor) else None,
                         o.stride() if isinstance(o, torch.Tensor) else None)
                        for o, p in zip(self.out, self.policy)]
        on_storage: dict[int, list[int]] = {}
        for k, c, _ in self.held_check:
            on_storage.setdefault(c, []).append(k)
        for ks in on_storage.values():
            for k in ks:
                self.share[k] = ks
        _register(id(self), frozenset(self.out[k].untyped_storage().data_ptr() for k, _, _ in self.held_check))
        self.version = _VERSION[0]
        self.captured = (f"captured: {len(self.static)} inputs read in place (parameters, buffers, stable "
                         f"addresses), {len(copied)} copied per replay")
        self.backend.replay(self.graph, graph_inputs)  # (capture records, it does not compute)
        self.replays += 1
        return self._outputs(inputs)

    # -- replay
    def _replay(self, inputs: list) -> Any:
        if not _PTRS_EQUAL(inputs, self.static_ptrs, self.static):
            moved = [i for i in self.static if inputs[i].data_ptr() != self.static_ptrs[i]]
            if moved:  # warm up and capture again: these inputs are copied then
                self.moving |= set(moved)
                return self._again(inputs, f"inputs read in place moved (input {moved[0]})", warm=True)
        use_count = torch._C._storage_Use_Count
        handed, extra, refcount = self.handed, self.extra, sys.getrefcount
        # (each handed-out alias alive raises its storage's count by one; whoever still
        # holds one raises its Python reference count (`_ONLY_RUNNER` when only the list
        # refers to it) or, from C++ (an autograd node's saved tensor, a `.grad`), its
        # TensorImpl's use count)
        only = _ONLY_RUNNER
        held = [k for k, c, n in self.held_check if use_count(c) != n + extra[k]
                or handed[k] is not None and (refcount(handed[k]) != only or handed[k]._use_count() != 1)]
        if held:
            # last call's outputs are still in use: their memory stays theirs (the graph
            # is captured again, with fresh outputs) and such outputs are copied from now on
            self.clone |= set(held)
            return self._again(inputs, f"outputs held across calls (output {held[0]})", warm=False)
        if self.copies and self.version != _VERSION[0]:
            # a graph captured after this one: inputs copied so far may now be its static
            # outputs (the backward captured while the forward ran plain, between two of its
            # captures: H200, 2026-11-27, 233 copies and 0.73 ms a BERT step, 143 and 0.80 ms
            # LLaMA).  Capture again, reading them in place
            self.version = _VERSION[0]
            adopt = [i for i in self.copies if _graph_output_storage(inputs[i])]
            if adopt:
                return self._again(inputs, f"copied inputs became another graph's static outputs "
                                           f"(input {adopt[0]})", warm=False)
        for i, buf in self.copies.items():
            if i in self.by_range:
                if inputs[i].stride() != self.by_range[i]:   # another layout: another range
                    self.moving.add(i)
                    return self._again(inputs, f"input {i} (copied by its storage range) changed its strides",
                                       warm=True)
                _span(buf).copy_(_span(inputs[i]))
            else:
                buf.copy_(inputs[i])
        self.backend.replay(self.graph, [self.copies.get(i, x) for i, x in enumerate(inputs)])
        self.replays += 1
        return self._outputs(inputs)

    def _again(self, inputs: list, why: str, warm: bool) -> Any:
        """This call runs without the graph; the next one captures again."""
        self.misses += 1
        self.last_miss = why
        self.graph, self.copies, self.out, self.by_range = None, {}, (), {}
        self.static_ptrs, self.held_check, self.rebuild = [], [], []
        self.handed, self.handed_version, self.share, self.extra = [], [], [], []
        _unregister(id(self))
        if self.recaptures >= MAX_RECAPTURES:
            self.dead = True
            _CLONED.pop(id(self), None)   # (plain calls from now on: nothing is cloned)
            self.rec.cuda_graph_note = f"CUDA graphs given up after {self.misses} misses: {why}"
            return self.call(inputs)
        self.recaptures += 1
        self.seen = 0 if warm else self.warmup
        self.ptrs = {i: x.data_ptr() for i, x in enumerate(inputs) if isinstance(x, torch.Tensor)}
        return self.call(list(inputs))

    def summary(self) -> str:
        """One line for `explain`: what the capture reads in place and copies, how often
        the graph replayed, and why calls ran without it."""
        state = ("given up: plain calls" if self.dead else
                 self.captured or "not captured yet (warm-up calls)")
        line = f"{state}; {self.replays} replays"
        if self.misses:
            line += f", {self.misses} calls without the graph (last: {self.last_miss})"
        if self.copies:
            line += f"; {sum(_span(c).numel() * c.element_size() for c in self.copies.values())} bytes copied a replay"
        return line

    def _outputs(self, inputs: list) -> tuple:
        res, cloned = [], []
        handed, versions, reuse, refcount = self.handed, self.handed_version, self.reuse, sys.getrefcount
        for k, (kind, o, shape, stride) in enumerate(self.rebuild):
            if kind == "alias" or kind == "view":
                # a tensor on the static output's memory: whoever holds it is seen by the
                # next replay's held check.  Last replay's again (nobody holds it: checked
                # before this replay), unless something wrote it or changed its metadata in
                # place since (its version: `t_()`, `resize_`, an in-place op); else a fresh one
                t = handed[k]
                if t is None or t._version != versions[k] or kind == "view" and (
                        refcount(t) != _ONLY_RUNNER_LOCAL or t._use_count() != 1):   # (held: the replay's
                    # check covers aliases only)
                    t = _alias(o, shape, stride, 0)
                    if reuse:
                        if handed[k] is None and self.share[k]:   # one more alias alive on the storage
                            for j in self.share[k]:
                                self.extra[j] += 1
                        handed[k] = t
                        versions[k] = t._version
                res.append(t)
            elif kind == "value":
                res.append(o)
            elif kind == "input":
                res.append(inputs[o])
            else:  # clone
                res.append(o.clone())
                cloned.append(res[-1].untyped_storage().data_ptr())
        if cloned or _CLONED.get(id(self)):
            _CLONED[id(self)] = frozenset(cloned)
        return tuple(res)


def _dense(t: torch.Tensor) -> bool:
    from .steps import storage_elems
    return storage_elems(tuple(t.shape), t.stride()) == t.numel() or t.numel() <= 1


# ----------------------------------------------------------------------------- the compiler's entry points

def enabled(kind: str, device: torch.device, rec: Any, *, dynamic: bool = False) -> bool:
    """Whether to plan this graph for capture; a refusal is recorded (and warned about
    when the user asked for CUDA graphs explicitly)."""
    d = mode(kind, device, dynamic=dynamic)
    asked = asked_explicitly()
    # (on a CPU, by default, there is nothing to refuse: CUDA graphs simply do not apply)
    if not d.capture and d.reason and (asked or device.type == "cuda"):
        rec.cuda_graph_note = d.reason
        if asked:
            warnings.warn(f"stitchml: {d.reason}", stacklevel=3)
    return d.capture


def wrap(call: Callable, rec: Any) -> Callable:
    """The graph's callable, replayed in a CUDA graph unless its plan refuses."""
    reason = plan_refusal(rec.plan)
    if reason:
        rec.cuda_graph_note = reason
        if asked_explicitly():
            warnings.warn(f"stitchml: {reason}", stacklevel=3)
        return call
    # a backward graph warms up twice: its saved activations come from the forward's
    # static outputs only once the forward replays, and read in place they cost nothing
    return GraphRunner(call, rec, mutated_inputs(rec.graph), warmup=2 if rec.kind == "backward" else 1,
                       by_position=rec.graph.read_by_position())
