"""Plan-only predictions (`stitchml.tools.predict`, which `aot_check --models` and the
bench's prediction checks plan through): a case that meta tensors cannot trace is traced
on CPU tensors with its compiled graphs never run, and plans exactly as a run would."""
from __future__ import annotations

import pytest
import torch
from functorch.compile import make_boxed_func

from stitchml.bench import models
from stitchml.plan.data import EagerStep
from stitchml.plan.devices import get_device
from stitchml.plan.options import PlanOptions
from stitchml.tools import predict


def _spec(name: str):
    return next(s for s in models.cases(quick=True) if s.name.startswith(name))


def _summary(plans) -> list[tuple]:
    return [(p.num_kernels, sum(k.bytes_read + k.bytes_written for k in p.kernels), round(p.predicted_s, 12),
             tuple(k.mapping.form for k in p.kernels)) for p in plans]


@pytest.mark.parametrize("name", ["llama8_train", "bert_train"])
def test_models_plan_on_cpu_tensors_without_running_a_graph(name, monkeypatch):
    """Whole models are traced on CPU tensors with no graph run (a full-size LLaMA-style
    step ran for over 30 minutes on this machine when a failed meta trace sent it to a
    real CPU run), and plan exactly as a real run of their graphs does.  On meta they
    could not: LLaMA's loss gradient is cut (nll_loss has a meta kernel and no autograd
    one there), BERT's tied decoder bias is untied by `.to("meta")`."""
    if name == "bert_train":
        pytest.importorskip("transformers")
    opts = PlanOptions.from_config(get_device("H200"))
    spec = _spec(name)

    def no_run(fn):
        raise AssertionError("a compiled graph was run")
    with monkeypatch.context() as m:
        m.setattr(predict, "make_boxed_func", no_run)
        pred, plans = predict.case_plans(spec, "bf16", opts)
    assert len(plans) == 2 and all(p.num_kernels > 0 for p in plans)   # forward, backward
    assert pred.predicted_s > 0 and pred.launches == sum(p.num_kernels for p in plans)

    with monkeypatch.context() as m:             # the same step with its graphs really run
        m.setattr(predict, "shape_only", lambda gm, device: make_boxed_func(gm.forward))
        _, ran = predict._predict(spec, "bf16", opts, torch.device("cpu"))
    assert _summary(plans) == _summary(ran)


def test_models_keep_attention_fused_as_a_gpu_does():
    """On meta, scaled_dot_product_attention has no fused kernel and decomposes into math
    attention: a plan would hold softmax kernels over [batch, heads, seq, seq] scores that
    no GPU run has.  The models suite's plans keep the fused op, forward and backward."""
    spec = _spec("llama_block_train")
    opts = PlanOptions.from_config(get_device("H200"))

    def eager_ops(plan) -> list[str]:
        return [s.op for s in plan.steps if isinstance(s, EagerStep)]
    _, plans = predict.case_plans(spec, "bf16", opts)
    for p in plans:
        assert any("scaled_dot_product" in op for op in eager_ops(p)), eager_ops(p)
        assert not any("bmm" in op for op in eager_ops(p)), eager_ops(p)
    _, on_meta = predict._predict(spec, "bf16", opts, predict.META)   # the premise
    assert all(any("bmm" in op for op in eager_ops(p)) for p in on_meta)
    assert not any("scaled_dot_product" in op for p in on_meta for op in eager_ops(p))


def test_shape_only_returns_empty_tensors_of_the_traced_layout():
    """The stand-in returns each output as traced: size, stride and dtype (a transposed
    result keeps its strides), non-tensor outputs as they are, and frees its inputs."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.proxy_tensor import make_fx

    def f(x, y):
        return (x @ y).t(), (x.sum(0) > 0).to(torch.bfloat16)

    with FakeTensorMode() as mode:
        gm = make_fx(f)(mode.from_tensor(torch.randn(3, 5)), mode.from_tensor(torch.randn(5, 4)))
    run = predict.shape_only(gm, torch.device("cpu"))
    args = [torch.randn(3, 5), torch.randn(5, 4)]
    outs = run(args)
    assert args == []
    want = f(torch.randn(3, 5), torch.randn(5, 4))
    assert [(o.shape, o.stride(), o.dtype) for o in outs] == [(w.shape, w.stride(), w.dtype) for w in want]
