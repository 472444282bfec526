"""A generated straight-line Python function that runs one compiled graph: allocate
outputs, launch kernels, call eager ops, return the graph's outputs.  No plan is
interpreted at call time."""
from __future__ import annotations

from typing import Any, Callable

import torch

from .. import config
from ..codegen.triton_kernel import KernelSource
from ..ir import nodes as ir
from ..ir.nodes import Ref
from ..plan.data import EagerStep, KernelPlan, Plan
from ..plan.graph_view import is_free
from .kernel_cache import load_module


class WrapperBuilder:
    def __init__(self, plan: Plan, sources: dict[str, KernelSource], device: torch.device):
        self.plan, self.g = plan, plan.graph
        self.sources = sources
        self.lines: list[str] = []
        self.names: dict[int, str] = {}
        self.consts: dict[str, Any] = {"torch": torch, "DEVICE": device, "_seed": _seed,
                                      "_in_layout": _in_layout}
        self.nconst = 0
        self.device = device
        self.partials: set[str] = set()
        self.kernel_inputs = {i for k in plan.kernels for i in k.inputs}

    def _const(self, value: Any) -> str:
        if isinstance(value, (bool, int, float)) and not isinstance(value, bool) and value == value \
                and abs(value) != float("inf"):
            return repr(value)
        if isinstance(value, (bool, type(None), str)):
            return repr(value)
        self.nconst += 1
        name = f"C{self.nconst}"
        self.consts[name] = value
        return name

    def _render(self, a: Any) -> str:
        if isinstance(a, Ref):
            return self.need(a.id)
        if isinstance(a, list):
            return "[" + ", ".join(self._render(x) for x in a) + "]"
        if isinstance(a, tuple):
            return "(" + "".join(self._render(x) + ", " for x in a) + ")"
        return self._const(a)

    def need(self, nid: int) -> str:
        """Python name of node `nid`'s tensor, replaying free nodes eagerly if needed."""
        if nid in self.names:
            return self.names[nid]
        n = self.g[nid]
        if not is_free(n):
            raise RuntimeError(f"node %{nid} ({n.kind}.{n.op}) used before it is computed (planner bug)")
        name = f"v{nid}"
        self.lines.append(f"{name} = {self._replay(n)}")
        self.names[nid] = name
        return name

    def _replay(self, n: ir.Node) -> str:
        if n.op == "full":
            return (f"torch.full({n.shape}, {self._const(n.attr('value'))}, dtype={self._const(n.dtype)}, "
                    f"device=DEVICE)")
        if n.op == "iota":
            d = n.attr("dim")
            view = [1] * len(n.shape)
            view[d] = n.shape[d]
            return f"torch.arange({n.shape[d]}, device=DEVICE).reshape({tuple(view)}).expand({n.shape}).contiguous()"
        src = self.need(n.refs[0])
        if n.op == "reshape":
            return f"{src}.reshape({n.shape})"
        if n.op == "permute":
            return f"{src}.permute({n.attr('dims')})"
        if n.op == "expand":
            return f"{src}.expand({n.shape})"
        if n.op == "slice":
            dim, start, step = n.attr("dim"), n.attr("start"), n.attr("step")
            end = start + (n.shape[dim] - 1) * step + 1 if n.shape[dim] else start
            return f"torch.ops.aten.slice.Tensor({src}, {dim}, {start}, {end}, {step})"
        if n.op == "select":
            return f"{src}.select({n.attr('dim')}, {n.attr('index')})"
        if n.op == "as_strided":
            return f"torch.as_strided({src}, {n.shape}, {n.attr('stride')}, {n.attr('offset')})"
        raise NotImplementedError(f"replay of {n.op}")

    def build(self) -> str:
        L = self.lines
        for i, nid in enumerate(self.g.inputs):
            self.names[nid] = f"a{i}"
        for nid, value in self.g.constants.items():
            self.names[nid] = self._const(value)
        for step in self.plan.steps:
            if isinstance(step, KernelPlan):
                self._kernel(step)
            else:
                self._eager(step)
        outs = [self._render(o) for o in self.g.outputs]
        L.append("return (" + "".join(o + ", " for o in outs) + ")")
        head = ["def call(args):"]
        if self.g.inputs:
            head.append("    " + "".join(f"a{i}, " for i in range(len(self.g.inputs))) + "= args")
        head.append("    args.clear()")
        return "\n".join(head + ["    " + line for line in L]) + "\n"

    def _kernel(self, k: KernelPlan) -> None:
        group = self.plan.group_of(k.name)
        if group is None:
            self._launch(self.sources[k.name], [k])
        elif group.members[0] == k.name:  # the whole group launches at its first member
            kernels = {kp.name: kp for kp in self.plan.kernels}
            self._launch(self.sources[group.name], [kernels[m] for m in group.members], group.kind)

    def _launch(self, ks: KernelSource, kernels: list[KernelPlan], kind: str = "") -> None:
        args = []
        for pkind, nid in ks.params:
            if pkind == "out":
                if nid not in self.names:
                    n = self.g[nid]
                    self.lines.append(f"v{nid} = {self._alloc(n)}")
                    self.names[nid] = f"v{nid}"
                args.append(self.names[nid])
            elif pkind == "seed":
                args.append("_seed()")
            elif pkind == "partial":
                pname = f"p{nid}"
                if pname not in self.partials:  # allocated by the producing kernel, read by its combine
                    n = self.g[nid]
                    producer = next(k for k in self.plan.kernels if nid in k.partials)
                    dtype = self._const(torch.float32 if n.dtype in (torch.float16, torch.bfloat16) else n.dtype)
                    self.lines.append(f"{pname} = torch.empty(({producer.mapping.grid}, {n.numel}), "
                                      f"dtype={dtype}, device=DEVICE)")
                    self.partials.add(pname)
                args.append(pname)
            elif pkind == "counter":
                self.consts.setdefault("BARRIER", _BarrierCounter(self.device))
                barriers = len(kernels) - 1
                self.lines.append(f"counter, base = BARRIER.take({barriers * ks.grid})")
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
        extra = ""
        if kind == "global" and self.device.type == "cuda":
            from ..plan.launches import MAXNREG
            extra = f", maxnreg={MAXNREG}"  # keeps the residency assumption of the barrier grid
        self.lines.append(f"{ks.name}[({ks.grid},)]({', '.join(args)}, num_warps={ks.num_warps}{extra})")

    def _alloc(self, n: ir.Node) -> str:
        dtype = self._const(n.dtype)
        if n.kind == ir.SCATTER_ADD:  # accumulated into with atomics
            return f"torch.zeros({n.shape}, dtype={dtype}, device=DEVICE)"
        alloc = f"torch.empty_strided({n.shape}, {n.stride}, dtype={dtype}, device=DEVICE)"
        if config.get("poison_outputs"):
            poison = "float('nan')" if n.dtype.is_floating_point else (
                "True" if n.dtype == torch.bool else str(torch.iinfo(n.dtype).max))
            return f"{alloc}.fill_({poison})"
        return alloc

    def _eager(self, step: EagerStep) -> None:
        n = self.g[step.node]
        name = f"v{n.id}"
        if n.kind == ir.ITEM:
            self.lines.append(f"{name} = {self.need(n.refs[0])}[{n.attr('index')}]")
        else:
            target, args, kwargs = self.g.eager_calls[n.id]
            t = self._const(target)
            rendered = [self._render(a) for a in args] + [f"{k}={self._render(v)}" for k, v in kwargs.items()]
            self.lines.append(f"{name} = {t}({', '.join(rendered)})")
        if n.shape is not None and n.stride is not None and self._read_by_kernel(n.id):
            # kernels address this value with the strides compilation predicted; an
            # eager op may return another layout (the fake tensor's strides are not
            # always eager's): then a copy in the predicted layout is read instead
            self.lines.append(f"{name} = _in_layout({name}, {n.shape}, {n.stride})")
        self.names[n.id] = name

    def _read_by_kernel(self, nid: int) -> bool:
        return nid in self.kernel_inputs


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


def _in_layout(t: torch.Tensor, shape: tuple, stride: tuple) -> torch.Tensor:
    if t.stride() == stride or t.numel() <= 1:
        return t
    return torch.empty_strided(shape, stride, dtype=t.dtype, device=t.device).copy_(t)


def _seed() -> int:
    # drawn from torch's default generator: reproducible under torch.manual_seed
    return int(torch.randint(0, 2**31 - 1, (1,)).item())


def build_wrapper(plan: Plan, sources: dict[str, KernelSource], device: torch.device) -> tuple[str, dict]:
    """The wrapper's Python source and the objects it names (dtypes, eager ops, constants)."""
    builder = WrapperBuilder(plan, sources, device)
    return builder.build(), builder.consts


def load_callable(code: str, consts: dict, sources: dict[str, KernelSource] | dict[str, str]) -> Callable:
    """Load the kernels (one module, cached by content) and exec the wrapper."""
    namespace = dict(consts)
    if sources:
        texts = [s if isinstance(s, str) else s.source for s in sources.values()]
        module = load_module(texts)
        for name in sources:
            namespace[name] = getattr(module, name)
    debug = config.get("debug_dir")
    if debug:
        import hashlib
        from pathlib import Path
        Path(debug).mkdir(parents=True, exist_ok=True)
        (Path(debug) / f"wrapper_{hashlib.sha256(code.encode()).hexdigest()[:12]}.py").write_text(code)
    exec(compile(code, "<stitchml-wrapper>", "exec"), namespace)
    return namespace["call"]


def build_callable(plan: Plan, sources: dict[str, KernelSource], device: torch.device) -> tuple[Callable, str]:
    code, consts = build_wrapper(plan, sources, device)
    return load_callable(code, consts, sources), code
