"""Plan-only predictions (`stitchml.tools.predict`, which `aot_check --models` and the
bench's prediction checks plan through): a case that meta tensors cannot trace is traced
on CPU tensors with its compiled graphs never run, and plans exactly as a run would."""
from __future__ import annotations

import pytest
import torch
from functorch.compile import make_boxed_func

from stitchml.bench import models
from stitchml.plan.devices import get_device
from stitchml.plan.options import PlanOptions
from stitchml.tools import predict


def _spec(name: str):
    return next(s for s in models.cases(quick=True) if s.name.startswith(name))


def _summary(plans) -> list[tuple]:
    return [(p.num_kernels, sum(k.bytes_read + k.bytes_written for k in p.kernels), round(p.predicted_s, 12),
             tuple(k.mapping.form for k in p.kernels)) for p in plans]


@pytest.mark.parametrize("name", ["llama8_train", "bert_train"])
def test_training_steps_meta_cannot_trace_plan_without_running_a_graph(name, monkeypatch):
    """LLaMA-style training loses its gradient on meta (nll_loss has a meta kernel and no
    autograd one there), BERT's tied decoder bias is untied by `.to("meta")`: both went to
    CPU tensors and ran every graph (a full-size LLaMA step ran for over 30 minutes on this
    machine).  Now no graph runs, and the plans equal those of a real CPU run."""
    if name == "bert_train":
        pytest.importorskip("transformers")
    opts = PlanOptions.from_config(get_device("H200"))
    spec = _spec(name)
    with pytest.raises(RuntimeError):            # the premise: meta cannot trace this step
        predict._predict(spec, "bf16", opts, predict.META)

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
