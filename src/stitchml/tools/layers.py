"""Kernels per layer (issue 15.4): what stitchml makes of each layer of a model.

Each layer (by default every child of every `nn.ModuleList`: the transformer blocks)
is captured with the arguments it receives in one eager forward of the whole model,
then planned on its own through the same path as `torch.compile(backend="stitch")`
(pattern rewrites → AOTAutograd → lower → plan), without generating or running
kernels.  A row per layer: kernels (launches), library calls, modelled bytes against
unfused eager, predicted time on the cost model's device, and the pattern rewrites
applied or refused.  Planning a layer alone ignores fusion across its boundary
(a residual add that could join the next layer's first kernel), which the whole-model
plan may do.

Inductor's kernel count for the same layer (`inductor=True`) compiles the layer with
Inductor for the device at hand (forward, and backward when training): on a CPU that is
C++ (one `cpp_fused_*` function per fused loop nest), which is not the GPU count and
costs seconds of C++ compilation per layer; the summary says which it is
(`LayerSummary.inductor_note`); the GPU comparison needs a GPU.

`stitchml explain --layers [example|bert|gpt2|llama]` prints the summary.
"""
from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch
import torch.nn as nn

from .. import patterns
from ..compiler import CompiledGraph
from ..patterns.common import PatternRecord
from ..plan.devices import current_device


@dataclass(frozen=True)
class GraphRow:
    kind: str                 # inference | forward | backward
    kernels: int              # launches (a global or horizontal launch counts once)
    library_calls: int        # ops run by ATen / vendor libraries (matmuls, attention, ...)
    modelled_bytes: int
    unfused_bytes: int
    predicted_us: float


@dataclass(frozen=True)
class LayerRow:
    name: str
    type: str
    graphs: tuple[GraphRow, ...]
    patterns: tuple[str, ...] = ()        # PatternRecord lines for this layer
    inductor_kernels: int | None = None   # None: not measured
    plan_seconds: float = 0.0

    @property
    def kernels(self) -> int:
        return sum(g.kernels for g in self.graphs)

    @property
    def modelled_bytes(self) -> int:
        return sum(g.modelled_bytes for g in self.graphs)

    @property
    def unfused_bytes(self) -> int:
        return sum(g.unfused_bytes for g in self.graphs)

    @property
    def predicted_us(self) -> float:
        return sum(g.predicted_us for g in self.graphs)


@dataclass
class LayerSummary:
    model: str
    device: str
    backward: bool
    rows: list[LayerRow] = field(default_factory=list)
    inductor_device: str | None = None    # device type Inductor compiled for; None: not counted

    @property
    def inductor_note(self) -> str:
        """What the Inductor column counts."""
        if self.inductor_device is None:
            return "Inductor not run (--inductor counts its kernels for the same layer graphs)"
        if self.inductor_device == "cpu":
            return ("Inductor column: C++ functions (cpp_fused_*) Inductor generated for the CPU: NOT GPU kernel "
                    "counts, not comparable with stitchml's kernels (GPU launches); run on a GPU for that")
        return f"Inductor column: Triton kernels Inductor generated for {self.inductor_device}"

    def to_text(self) -> str:
        head = (f"kernels per layer: {self.model} ({'training: forward + backward' if self.backward else 'inference'},"
                f" predicted on {self.device}; each layer planned alone)")
        ind_head = "ind. C++" if self.inductor_device == "cpu" else "inductor"
        lines = [head, f"  {'layer':28} {'type':22} {'kernels':>7} {'library':>7} {'modelled MB':>11} "
                       f"{'unfused MB':>10} {'pred. us':>9} {ind_head:>8}"]
        for r in self.rows:
            ind = "-" if r.inductor_kernels is None else str(r.inductor_kernels)
            lib = sum(g.library_calls for g in r.graphs)
            lines.append(f"  {r.name[:28]:28} {r.type[:22]:22} {r.kernels:7d} {lib:7d} {r.modelled_bytes / 1e6:11.3f} "
                         f"{r.unfused_bytes / 1e6:10.3f} {r.predicted_us:9.1f} {ind:>8}")
            per = ", ".join(f"{g.kind} {g.kernels}" for g in r.graphs)
            lines.append(f"  {'':28} kernels by graph: {per}")
            lines.extend(f"  {'':28} pattern {p}" for p in r.patterns)
        if self.rows:
            lines.append(f"  total: {sum(r.kernels for r in self.rows)} kernels, "
                         f"{sum(r.modelled_bytes for r in self.rows) / 1e6:.3f} MB modelled, "
                         f"{sum(r.predicted_us for r in self.rows):.1f} us predicted")
        else:
            lines.append("  (no layer was called: no nn.ModuleList child ran in this forward)")
        lines.append(f"  {self.inductor_note}")
        return "\n".join(lines)


def default_layers(model: nn.Module) -> list[str]:
    """Qualified names of every child of every nn.ModuleList (the repeated blocks)."""
    names = []
    for name, mod in model.named_modules():
        if isinstance(mod, nn.ModuleList):
            names += [f"{name}.{child}" if name else child for child, _ in mod.named_children()]
    return names


def capture_layer_inputs(model: nn.Module, inputs: Sequence[Any], kwargs: dict | None,
                         names: Sequence[str]) -> dict[str, tuple[tuple, dict]]:
    """The (args, kwargs) each named layer receives in one eager forward (no grad)."""
    seen: dict[str, tuple[tuple, dict]] = {}
    hooks = []
    modules = dict(model.named_modules())
    for name in names:
        def hook(mod, args, kw, name=name):
            seen.setdefault(name, (_detach(args), _detach(kw)))
        hooks.append(modules[name].register_forward_pre_hook(hook, with_kwargs=True))
    try:
        with torch.no_grad():
            model(*inputs, **(kwargs or {}))
    finally:
        for h in hooks:
            h.remove()
    return seen


def _detach(x):
    if isinstance(x, torch.Tensor):
        return x.detach().clone()
    if isinstance(x, (tuple, list)):
        return type(x)(_detach(v) for v in x)
    if isinstance(x, dict):
        return {k: _detach(v) for k, v in x.items()}
    return x


def _planning_backend(records: list[CompiledGraph], rewrites: list[PatternRecord]) -> Callable:
    """Our capture path (pattern rewrites, AOTAutograd with our decompositions),
    planning each graph without generating kernels; the graph itself runs eagerly.
    The rewrites' records go to `rewrites` (patterns.LOG is process-wide)."""
    from functorch.compile import make_boxed_func
    from torch._dynamo.backends.common import aot_autograd

    from ..capture.decomp import decomposition_table
    from ..lower.lower import lower
    from ..plan.planner import build_plan

    def planned(kind: str):
        def compiler(gm, example_inputs):
            t0 = time.perf_counter()
            plan = build_plan(lower(gm))
            records.append(CompiledGraph(kind, graph=plan.graph, plan=plan, compile_seconds=time.perf_counter() - t0))
            return make_boxed_func(gm.forward)
        return compiler

    def backend(gm, example_inputs):
        rewrites.extend(patterns.rewrite(gm, example_inputs))
        fw = planned("forward")
        return aot_autograd(fw_compiler=fw, bw_compiler=planned("backward"), inference_compiler=planned("inference"),
                            decompositions=decomposition_table(),
                            keep_inference_input_mutations=True)(gm, example_inputs)
    return backend


def _first_tensor(out):
    if isinstance(out, torch.Tensor):
        return out
    if isinstance(out, (tuple, list)) and out:
        return _first_tensor(out[0])
    return getattr(out, "last_hidden_state", None)


def _graph_row(rec: CompiledGraph) -> GraphRow:
    plan = rec.plan
    kernels = plan.num_kernels
    from ..plan.data import EagerStep
    return GraphRow(rec.kind, kernels, sum(isinstance(s, EagerStep) for s in plan.steps),
                    sum(k.bytes_read + k.bytes_written for k in plan.kernels), plan.unfused_bytes,
                    plan.predicted_s * 1e6)


def inductor_kernel_count(fn: Callable, *args: Any, backward: bool = False) -> int:
    """Kernels Inductor generates for fn on this device (GPU: Triton kernels; CPU: C++
    fused loop nests, a different count), forward and, with `backward`, the backward
    graph too (compiled when the backward runs).  Compiles for real: seconds per graph
    on a CPU."""
    from torch._inductor.utils import run_and_get_code
    torch._dynamo.reset()
    compiled = torch.compile(fn)

    def step(*a: Any) -> Any:
        with torch.set_grad_enabled(backward):
            out = compiled(*a)
            first = _first_tensor(out) if backward else None
            if first is not None and first.requires_grad:
                first.float().sum().backward()
        return out
    _, codes = run_and_get_code(step, *args)
    src = "\n".join(codes)
    names = set(re.findall(r"\b(cpp_fused_\w+|triton_\w+_fused_\w+|triton_(?:poi|red|per|tem)_\w+)\s*=", src))
    return len(names)


def summarise_layers(model: nn.Module, *inputs: Any, layers: Sequence[str] | None = None,
                     backward: bool = True, inductor: bool = False, kwargs: dict | None = None,
                     title: str | None = None) -> LayerSummary:
    """Plan each layer of `model` alone on the inputs it gets from `inputs` and
    summarise it.  `backward`: training (forward + backward graphs), else inference."""
    names = list(layers) if layers is not None else default_layers(model)
    captured = capture_layer_inputs(model, inputs, kwargs, names)
    modules = dict(model.named_modules())
    out = LayerSummary(title or type(model).__name__, current_device().name, backward)
    for name in names:
        if name not in captured:
            continue  # not called in this forward
        layer, (args, kw) = modules[name], captured[name]
        args = tuple(a.detach().requires_grad_(backward) if isinstance(a, torch.Tensor) and a.is_floating_point()
                     else a for a in args)

        def run(*a, layer=layer, kw=kw):
            return layer(*a, **kw)
        records: list[CompiledGraph] = []
        rewrites: list[PatternRecord] = []
        t0 = time.perf_counter()
        torch._dynamo.reset()
        with torch.set_grad_enabled(backward):
            res = torch.compile(run, backend=_planning_backend(records, rewrites))(*args)
            if backward:
                first = _first_tensor(res)
                if first is not None and first.requires_grad:
                    first.float().sum().backward()
        seconds = time.perf_counter() - t0
        pats = tuple(r.line() for r in rewrites)
        ind = None
        if inductor:
            fresh = tuple(a.detach().requires_grad_(a.requires_grad) if isinstance(a, torch.Tensor) else a
                          for a in args)
            ind = inductor_kernel_count(run, *fresh, backward=backward)
            out.inductor_device = _device_type(args)
        out.rows.append(LayerRow(name, type(layer).__name__, tuple(_graph_row(r) for r in records if r.plan),
                                 pats, ind, seconds))
    return out


def _device_type(args: Sequence[Any]) -> str:
    for a in args:
        if isinstance(a, torch.Tensor):
            return a.device.type
    return "cpu"


class ExampleStack(nn.Module):
    """`n` of the example transformer blocks (`tools/examples.py`) in an nn.ModuleList:
    the model `stitchml explain --layers` summarises by default."""

    def __init__(self, n: int = 2, hidden: int = 64, heads: int = 4, dropout: float = 0.0, seed: int = 0):
        super().__init__()
        from .examples import make_block
        self.layers = nn.ModuleList(make_block(hidden, heads, dropout=dropout, seed=seed + i) for i in range(n))

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x, mask)
        return x


def reference_blocks(batch: int = 2, seq: int = 16, hidden: int = 64, heads: int = 4, layers: int = 2,
                     vocab: int = 128) -> dict[str, tuple[nn.Module, tuple]]:
    """Small BERT, GPT-2 and LLaMA-style models (Hugging Face `transformers`, eager
    attention so the attention rewrite has something to match, dropout off) with
    token inputs: {name: (model, inputs)}.  Real sizes: pass hidden=768 etc."""
    import transformers as tr
    torch.manual_seed(0)
    ids = torch.randint(0, vocab, (batch, seq))
    common = dict(attn_implementation="eager", use_cache=False)
    bert = tr.BertModel(tr.BertConfig(vocab_size=vocab, hidden_size=hidden, num_hidden_layers=layers,
                                      num_attention_heads=heads, intermediate_size=4 * hidden,
                                      hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, **common))
    gpt2 = tr.GPT2Model(tr.GPT2Config(vocab_size=vocab, n_embd=hidden, n_layer=layers, n_head=heads,
                                      n_positions=max(seq, 32), resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                                      **common))
    llama = tr.LlamaModel(tr.LlamaConfig(vocab_size=vocab, hidden_size=hidden, num_hidden_layers=layers,
                                         num_attention_heads=heads, num_key_value_heads=heads,
                                         intermediate_size=int(8 / 3 * hidden) // 8 * 8,
                                         max_position_embeddings=max(seq, 32), **common))
    return {"BERT": (bert.train(), (ids,)), "GPT-2": (gpt2.train(), (ids,)), "LLaMA": (llama.train(), (ids,))}


def main() -> None:  # python -m stitchml.tools.layers
    for name, (model, inputs) in reference_blocks().items():
        print(summarise_layers(model, *inputs, title=name).to_text())
        print()


if __name__ == "__main__":
    main()
