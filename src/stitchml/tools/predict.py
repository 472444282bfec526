"""Plan-only predictions of the micro suite at full size, for a device of the table.

No kernel runs and no GPU is needed: each case's graphs (forward, and backward where
the case times it) are traced on meta tensors, lowered and planned for the device,
and the cost model's figures are printed beside the case's byte floor.  Whole models
(the models suite), and a case that cannot be traced on meta, are traced on CPU tensors
instead, with their compiled graphs returning empty results of the traced sizes:
nothing of the step is computed, so a full-size model plans in seconds.  On meta,
`scaled_dot_product_attention` has no fused kernel and decomposes into math attention
(a plan no GPU runs), a few ATen ops lose their autograd formula, `.to("meta")` unties
tied weights and Hugging Face's KV cache makes real meta tensors that Dynamo refuses.

This is the "prediction" column of bench/NOTES.md, to be checked against `stitchml
bench` on the device (whose rows carry the same `predicted_s`).

    python -m stitchml.tools.predict --device H100 [--dtype fp32 bf16] [--case softmax]
    python -m stitchml.tools.predict --device H200 --suite models --dtype bf16 --case 'bert_train|gpt2_train'
"""
from __future__ import annotations

import argparse
import re
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch
from functorch.compile import make_boxed_func
from torch import fx
from torch._dynamo.backends.common import aot_autograd

from ..bench import micro, models
from ..bench.contenders import make_cotangents
from ..bench.workload import DTYPES, CaseSpec, floor_bytes
from .. import patterns
from ..capture.partition import partitioner
from ..capture.logging_breaks import ignore_once_logging
from ..capture.decomp import decomposition_table
from ..lower.lower import lower
from ..plan.devices import get_device
from ..plan.options import PlanOptions
from ..plan.planner import build_plan

META = torch.device("meta")


@dataclass
class Prediction:
    case: str
    dtype: str
    floor_bytes: int
    modelled_bytes: int
    predicted_s: float
    launches: int
    forms: str

    def row(self, bandwidth: float) -> str:
        return (f"| {self.case} | {self.dtype} | {self.floor_bytes / 1e6:.1f} | {self.floor_bytes / bandwidth * 1e6:.1f} "
                f"| {self.modelled_bytes / 1e6:.1f} | {self.predicted_s * 1e6:.1f} | {self.launches} | {self.forms} |")


def predict_case(spec: CaseSpec, dtype: str, opts: PlanOptions) -> Prediction:
    return case_plans(spec, dtype, opts)[0]


def case_plans(spec: CaseSpec, dtype: str, opts: PlanOptions) -> tuple[Prediction, list]:
    """The prediction of one micro case and every plan made for it (forward, then
    backward graphs), e.g. for `aot_check --micro` or a test that inspects the plans."""
    cpu = torch.device("cpu")
    if spec.suite == "models":   # attention must stay a fused op, as on a GPU (module doc)
        return _predict(spec, dtype, opts, cpu)
    try:
        return _predict(spec, dtype, opts, META)
    except RuntimeError:
        # on meta, aten's where.self, nll_loss and prelu have a meta kernel but no autograd
        # kernel (the gradient is cut there), `.to("meta")` unties tied weights (BERT's
        # decoder bias) and Hugging Face's KV cache builds real meta tensors that Dynamo
        # refuses: CPU tensors, graphs not run
        return _predict(spec, dtype, opts, cpu)


def shape_only(gm: fx.GraphModule, device: torch.device) -> Callable[[list], list]:
    """A boxed stand-in for a compiled AOT graph that computes nothing: it returns
    empty tensors of the sizes, strides and dtypes the graph's outputs were traced with
    (non-tensor outputs as traced), so planning a full-size step never runs it."""
    outs = next(n for n in reversed(gm.graph.nodes) if n.op == "output").args[0]
    vals = [o.meta.get("val") if isinstance(o, fx.Node) else o for o in outs]
    missing = [o.name for o, v in zip(outs, vals) if isinstance(o, fx.Node) and v is None]
    if missing:
        raise RuntimeError(f"shape-only graph: outputs without a traced value: {missing}")

    def run(args: list) -> list:
        args.clear()   # the boxed convention: the callee owns (and frees) its inputs
        return [torch.empty_strided(v.shape, v.stride(), dtype=v.dtype, device=device)
                if isinstance(v, torch.Tensor) else v for v in vals]
    run._boxed_call = True   # type: ignore[attr-defined]
    return run


def planning_backend(opts: PlanOptions, device: torch.device,
                     plans: dict[str, list]) -> Callable[[fx.GraphModule, Sequence[Any]], Callable]:
    """A Dynamo backend that does what `StitchBackend` does up to the plan, with planning
    in place of compiling: each graph's plan is appended to `plans["forward"]` or
    `plans["backward"]`, and the graph computes nothing (sizes only: `shape_only`, or the
    graph itself on meta tensors)."""
    def planner(kind: str):
        def compile_graph(gm, example_inputs):
            plans[kind].append(build_plan(lower(gm), opts))
            if device.type == "meta":
                return make_boxed_func(gm.forward)   # runs on meta: sizes only
            return shape_only(gm, device)
        return compile_graph

    def backend(gm, example_inputs):
        patterns.rewrite(gm, example_inputs)
        return aot_autograd(fw_compiler=planner("forward"), bw_compiler=planner("backward"),
                            inference_compiler=planner("forward"), decompositions=decomposition_table(),
                            keep_inference_input_mutations=True,
                            partition_fn=partitioner())(gm, example_inputs)
    return backend


def _predict(spec, dtype: str, opts: PlanOptions, device: torch.device) -> tuple[Prediction, list]:
    w = spec.build(dtype, device)
    ignore_once_logging()   # as the bench does once the case is built
    plans: dict[str, list] = {"forward": [], "backward": []}
    backend = planning_backend(opts, device, plans)
    torch._dynamo.reset()
    outs = torch.compile(w.fn, backend=backend)(*w.inputs)
    outs = list(outs) if isinstance(outs, (tuple, list)) else [outs]
    grads: list[torch.Tensor] = []
    if w.mode != "fwd":
        w.cotangents = make_cotangents(w, outs)   # one per differentiable output, in order
        diff = [o for o in outs if isinstance(o, torch.Tensor) and o.requires_grad]
        grads = list(torch.autograd.grad(diff, w.grad_targets, w.cotangents))
    timed = {"fwd": ["forward"], "bwd": ["backward"], "fwdbwd": ["forward", "backward"]}[w.mode]
    ps = [p for kind in timed for p in plans[kind]]
    pred = Prediction(spec.name, dtype, floor_bytes(w, outs, grads),
                      sum(k.bytes_read + k.bytes_written for p in ps for k in p.kernels),
                      sum(p.predicted_s for p in ps), sum(p.num_kernels for p in ps),
                      ", ".join(sorted({k.mapping.form for p in ps for k in p.kernels})))
    return pred, plans["forward"] + plans["backward"]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="H100", help="a device of the cost model's table")
    ap.add_argument("--dtype", nargs="+", default=["fp32", "bf16"], choices=sorted(DTYPES))
    ap.add_argument("--case", default="", help="regular expression on case names")
    ap.add_argument("--suite", default="micro", choices=("micro", "models"),
                    help="the bench suite whose cases are planned (models: full-size steps traced on CPU tensors)")
    args = ap.parse_args(argv)
    # planned as `stitchml bench` compiles them on the GPU: for capture in a CUDA graph
    # (knob `cuda_graphs`), so launches are priced at the replay's gap
    from .. import config
    replay = bool(config.get("cuda_graphs"))
    opts = PlanOptions.from_config(get_device(args.device), graph_replay=replay)
    dev = opts.device
    print(f"device {dev.name} ({dev.source}): copy {dev.bandwidth / 1e12:.2f} TB/s, launch {dev.launch_s * 1e6:.1f} us"
          f"{' (a CUDA-graph replay)' if replay else ''}")
    print("| case | dtype | floor MB | floor us | modelled MB | predicted us | launches | forms |")
    print("|---|---|---|---|---|---|---|---|")
    suite = micro if args.suite == "micro" else models
    for spec in suite.cases(quick=False):
        if args.case and not re.search(args.case, spec.name):
            continue
        for dtype in args.dtype:
            print(predict_case(spec, dtype, opts).row(dev.bandwidth), flush=True)


if __name__ == "__main__":
    main()
