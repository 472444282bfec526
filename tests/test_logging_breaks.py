"""Hugging Face's once-only log messages do not break the graph (knob
`ignore_once_logging`): GPT-2's training step is one graph, so its LM head and loss meet
in the chunked linear + cross-entropy rewrite."""
import pytest
import torch

from stitchml import config, patterns
from stitchml.capture.backend import StitchBackend

transformers = pytest.importorskip("transformers")


def _graphs(knob: bool) -> tuple[int, torch.Tensor]:
    logger = transformers.utils.logging.get_logger("stitchml.test")

    def fn(x):
        y = torch.sin(x) * 2
        logger.warning_once("a once-only message inside forward")
        return torch.cos(y) + 1

    x = torch.randn(7, 5)
    torch._dynamo.reset()
    with torch._dynamo.config.patch(ignore_logging_functions=set()), config.override(ignore_once_logging=knob):
        backend = StitchBackend()
        out = torch.compile(fn, backend=backend)(x)
    torch.testing.assert_close(out, torch.cos(torch.sin(x) * 2) + 1)
    return len(backend.records), out


def test_once_only_warning_is_traced_through():
    assert _graphs(True)[0] == 1
    assert _graphs(False)[0] == 2      # Dynamo's own behaviour: a break at the logger call


def test_gpt2_training_step_is_one_graph_with_the_fused_loss():
    from stitchml.bench import models
    from stitchml.plan.devices import get_device
    from stitchml.plan.options import PlanOptions
    from stitchml.tools import predict
    spec = next(s for s in models.cases(quick=True) if s.name.startswith("gpt2_train"))
    seen = len(patterns.LOG)
    _, plans = predict.case_plans(spec, "bf16", PlanOptions.from_config(get_device("H200")))
    assert len(plans) == 2   # one forward graph, one backward graph
    assert [(r.pattern, r.applied) for r in patterns.LOG[seen:] if r.pattern != "attention"] == [("linear_ce", True)]


def test_explain_shows_dynamo_graph_breaks(tmp_path):
    """A break (here a plain Logger call, which stays a break) ends a graph: explain says
    so, with Dynamo's reason and hint, in text and in the HTML report."""
    import logging

    import stitchml
    log = logging.getLogger("stitchml.test.breaks")
    log.addHandler(logging.NullHandler())
    log.propagate = False

    def broken(x):
        y = torch.sin(x) * 2
        log.warning("not a once-only message")
        return torch.cos(y) + 1

    def whole(x):
        return torch.cos(torch.sin(x) * 2) + 1

    x = torch.randn(6, 5)
    torch._dynamo.reset()
    report = stitchml.explain(broken, x)
    assert len(report.graphs) == 2
    (reason, n), = report.graph_breaks
    assert n == 1 and reason.startswith("logging.Logger method not supported") and "ignore_logging_functions" in reason
    text = report.to_text()
    assert "Dynamo graph breaks: 1" in text and reason in text
    page = tmp_path / "r.html"
    report.to_html(str(page))
    assert "Dynamo graph breaks" in page.read_text()

    torch._dynamo.reset()
    clean = stitchml.explain(whole, x)
    assert clean.graph_breaks == [] and "Dynamo graph breaks" not in clean.to_text()
