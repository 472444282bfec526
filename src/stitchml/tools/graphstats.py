"""Plan-only statistics for a model's training graph: planning time, stitched kernel
count against the memory-intensive ATen kernels eager launches, modelled bytes.

No kernel is generated or run: the graphs go through lower + plan only, and the
model itself runs eagerly.  `python -m stitchml.tools.graphstats` prints the figures
for a 12-layer BERT-base training step.
"""
from __future__ import annotations

import argparse
import time
from dataclasses import dataclass, field

import torch
from torch._dynamo.backends.common import aot_autograd

from ..capture.decomp import decomposition_table
from ..lower.lower import COMPUTE_INTENSIVE, lower
from ..plan.data import EagerStep
from ..plan.planner import build_plan

_VIEWS = {"view", "_unsafe_view", "reshape", "expand", "permute", "transpose", "t", "squeeze", "unsqueeze",
          "slice", "select", "alias", "detach", "split", "split_with_sizes", "unbind", "as_strided",
          "getitem", "lift_fresh_copy", "_to_copy_noop"}


@dataclass
class GraphStats:
    kind: str
    nodes: int = 0
    kernels: int = 0
    eager_ops: int = 0
    lower_s: float = 0.0
    plan_s: float = 0.0
    cpu_s: float = 0.0      # process CPU time of lower + plan (robust to other load on the machine)
    modelled_bytes: int = 0
    unfused_bytes: int = 0


@dataclass
class ModelStats:
    graphs: list[GraphStats] = field(default_factory=list)
    eager_memory_kernels: int = 0   # memory-intensive ATen ops in the undecomposed graphs

    def line(self) -> str:
        k = sum(g.kernels for g in self.graphs)
        t = sum(g.lower_s + g.plan_s for g in self.graphs)
        cpu = sum(g.cpu_s for g in self.graphs)
        mb = sum(g.modelled_bytes for g in self.graphs) / 1e6
        ub = sum(g.unfused_bytes for g in self.graphs) / 1e6
        return (f"stitched kernels {k} vs eager memory-intensive kernels {self.eager_memory_kernels}; "
                f"lower+plan {t:.2f} s wall, {cpu:.2f} s CPU; modelled {mb:.1f} MB vs unfused {ub:.1f} MB")


def _count_eager_kernels(gm: torch.fx.GraphModule) -> int:
    n = 0
    for node in gm.graph.nodes:
        if node.op != "call_function" or node.target in COMPUTE_INTENSIVE:
            continue
        name = getattr(node.target, "__name__", str(node.target)).split(".")[0]
        if name not in _VIEWS:
            n += 1
    return n


def measure(model: torch.nn.Module, *inputs, **kwargs) -> ModelStats:
    stats = ModelStats()

    def stitched(kind):
        def compiler(gm, example_inputs):
            gs = GraphStats(kind, nodes=len(gm.graph.nodes))
            c0, t0 = time.process_time(), time.perf_counter()
            g = lower(gm)
            t1 = time.perf_counter()
            plan = build_plan(g)
            gs.lower_s, gs.plan_s = t1 - t0, time.perf_counter() - t1
            gs.cpu_s = time.process_time() - c0
            gs.kernels = plan.num_kernels
            gs.eager_ops = sum(1 for st in plan.steps if isinstance(st, EagerStep))
            gs.modelled_bytes = sum(k.bytes_read + k.bytes_written for k in plan.kernels)
            gs.unfused_bytes = plan.unfused_bytes
            stats.graphs.append(gs)
            return gm.forward
        return compiler

    def undecomposed(gm, example_inputs):
        stats.eager_memory_kernels += _count_eager_kernels(gm)
        return gm.forward

    ours = aot_autograd(fw_compiler=stitched("forward"), bw_compiler=stitched("backward"),
                        decompositions=decomposition_table(), keep_inference_input_mutations=True)
    theirs = aot_autograd(fw_compiler=undecomposed, bw_compiler=undecomposed)
    for backend in (ours, theirs):
        torch._dynamo.reset()
        out = torch.compile(model, backend=backend)(*inputs, **kwargs)
        loss = out[0] if isinstance(out, (tuple, list)) else getattr(out, "last_hidden_state", out)
        loss.float().sum().backward()
    return stats


def bert_base(batch: int = 2, seq: int = 128, layers: int = 12) -> tuple[torch.nn.Module, torch.Tensor]:
    from transformers import BertConfig, BertModel
    cfg = BertConfig(num_hidden_layers=layers, hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1,
                     attn_implementation="eager")
    model = BertModel(cfg).train()
    ids = torch.randint(0, cfg.vocab_size, (batch, seq))
    return model, ids


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--seq", type=int, default=128)
    args = ap.parse_args(argv)
    model, ids = bert_base(args.batch, args.seq, args.layers)
    stats = measure(model, ids)
    for g in stats.graphs:
        print(f"{g.kind:9} fx nodes {g.nodes:5}  kernels {g.kernels:4}  eager ops {g.eager_ops:4}  "
              f"lower {g.lower_s:.2f}s plan {g.plan_s:.2f}s")
    print(stats.line())


if __name__ == "__main__":
    main()
