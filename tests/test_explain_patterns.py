"""`explain` shows the Dynamo-level pattern rewrites (issue 15): each rewrite applied
or refused with its reason, in the text report and the HTML page, and only the
rewrites of the model the report is about (patterns.LOG is process-wide; the
backend keeps its own)."""
import math

import torch
import torch.nn.functional as F

import stitchml
from stitchml import patterns
from stitchml.tools.explain import plan_report

B, H, L, E = 2, 2, 5, 8


def two_attentions(q, k, v, add_mask, bool_mask):
    """The first attention has an additive mask (rewritten to SDPA); the second fills
    masked scores with -5, which is not -inf or a huge negative number (refused)."""
    a = F.softmax(q @ k.transpose(-1, -2) / math.sqrt(E) + add_mask, dim=-1) @ v
    b = F.softmax((q @ k.transpose(-1, -2) * 0.3).masked_fill(bool_mask, -5.0), dim=-1) @ v
    return a + b


def other_model(q, k, v):
    return F.softmax(q @ k.transpose(-1, -2), dim=-1) @ v


def _inputs():
    torch.manual_seed(0)
    q, k, v = (torch.randn(B, H, L, E) for _ in range(3))
    add_mask = torch.randn(B, 1, 1, L)
    bool_mask = torch.rand(B, 1, L, L) > 0.6
    bool_mask[..., 0] = False
    return q, k, v, add_mask, bool_mask


def test_explain_text_and_html_show_applied_and_refused_rewrites(tmp_path):
    q, k, v, add_mask, bool_mask = _inputs()
    stitchml.explain(other_model, q, k, v)            # another model's rewrite goes to patterns.LOG too
    seen = len(patterns.LOG)
    report = stitchml.explain(two_attentions, q, k, v, add_mask, bool_mask)
    assert patterns.LOG[seen:] == report.patterns                     # its own records, and only those
    assert [(r.pattern, r.applied) for r in report.patterns] == [("attention", True), ("attention", False)]
    applied, refused = report.patterns

    text = report.to_text()
    assert "pattern rewrites (Dynamo graph, before AOTAutograd): 1 applied, 1 refused" in text
    assert f"rewritten attention at {applied.anchor}: " in text and "scaled_dot_product_attention" in text
    assert f"refused   attention at {refused.anchor}: " in text
    assert "fill value -5.0 is not -inf or a huge negative constant" in text
    assert text.count("attention at ") == 2                           # not the other model's
    # the rewrite reached the plan: the kept attention is one library call, the refused one stays math
    ops = [st.op for rec in report.graphs for st in rec.plan.steps if not hasattr(st, "members")]
    assert any("scaled_dot_product" in op for op in ops) and any("bmm" in op for op in ops)

    page = open(report.to_html(str(tmp_path / "r.html"), what_if={"error": "skipped"}), encoding="utf-8").read()
    section = page[page.index("<div id='patterns'>"):]
    section = section[:section.index("</div>")]
    assert "Pattern rewrites (Dynamo graph, before AOTAutograd)" in page
    assert "<b>rewritten</b>" in section and "refused" in section and applied.anchor in section
    assert "fill value -5.0 is not -inf or a huge negative constant" in section
    assert "1 applied, 1 refused" in page                              # the summary card


def test_no_rewrite_is_said_so(tmp_path):
    report = stitchml.explain(lambda x: torch.softmax(x * 2, -1), torch.randn(4, 16))
    assert report.patterns == []
    assert "0 applied, 0 refused\n  (none: no pattern matched" in report.to_text()
    page = open(report.to_html(str(tmp_path / "n.html"), what_if={"error": "skipped"}), encoding="utf-8").read()
    assert "no pattern rewrite applied or refused" in page
    # a report from planning only never ran the rewrites: it says so rather than "none matched"
    planned = plan_report(lambda x: torch.softmax(x * 2, -1), torch.randn(4, 16), backward=False)
    assert "(not recorded: this report was built without the stitch backend's pattern rewrites)" in planned.to_text()
    page = open(planned.to_html(str(tmp_path / "p.html"), what_if={"error": "skipped"}), encoding="utf-8").read()
    assert "not recorded: this report was built without" in page
