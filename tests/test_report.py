"""The HTML explain report: self-contained, opened in a real headless Chromium (no
script errors in its console, a screenshot with the graph and the tables on it).

Planning only (no kernel runs): a 2-layer BERT with BERT-base's shapes (hidden 768,
12 heads), training step.  `make test` installs chromium and graphviz where they are
missing, so these tests run in CI; set STITCHML_SKIP_BROWSER_TESTS=1 to skip the
browser test on a machine without them.
"""
import json
import os
import re
import shutil
import subprocess

import pytest
import torch

from stitchml import config
from stitchml.tools import report_html
from stitchml.tools.explain import plan_report

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser") or "/usr/bin/chromium"
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--enable-logging=stderr", "--v=0", "--hide-scrollbars"]
WIDTH, HEIGHT = 1400, 4600


def _need_browser():
    if os.path.exists(CHROMIUM) and shutil.which("dot"):
        return
    if os.environ.get("STITCHML_SKIP_BROWSER_TESTS") == "1":
        pytest.skip("chromium/graphviz missing and STITCHML_SKIP_BROWSER_TESTS=1")
    pytest.fail("chromium and graphviz are needed (`make test` installs them with apt-get)")


@pytest.fixture(scope="module")
def bert_report():
    transformers = pytest.importorskip("transformers")
    cfg = transformers.BertConfig(num_hidden_layers=2, hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1,
                                  attn_implementation="eager")
    torch.manual_seed(0)
    model = transformers.BertModel(cfg).train()
    ids = torch.randint(0, cfg.vocab_size, (2, 32))
    with config.override(device="H100"):
        report = plan_report(model, ids)
        yield report


def _open(url: str, tmp_path, name: str) -> tuple[str, str]:
    """Open `url` in headless Chromium; return (screenshot path, its log)."""
    shot = str(tmp_path / f"{name}.png")
    cmd = [CHROMIUM, *FLAGS, f"--user-data-dir={tmp_path / ('profile-' + name)}", f"--screenshot={shot}",
           f"--window-size={WIDTH},{HEIGHT}", url]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
    assert os.path.exists(shot), res.stderr[-3000:]
    return shot, res.stderr


def console_messages(log: str) -> list[str]:
    return [m.group(1) for m in re.finditer(r':CONSOLE[^\]]*\] "(.*)", source:', log)]


def script_errors(log: str) -> list[str]:
    return [m for m in console_messages(log) if "Uncaught" in m or "Error" in m] + \
        [line for line in log.splitlines() if ":ERROR:CONSOLE" in line]


def test_report_is_one_self_contained_page(bert_report, tmp_path):
    path = bert_report.to_html(str(tmp_path / "r.html"), measured_us={"forward:k0": 12.5})
    page = open(path, encoding="utf-8").read()
    assert page.startswith("<!DOCTYPE html>") and page.rstrip().endswith("</html>")
    # nothing fetched: no external scripts, styles, images or fonts
    assert not re.search(r"""(src|href)\s*=\s*["'](https?:)?//""", page)
    assert "<link" not in page and "@import" not in page and "url(http" not in page
    # the parts: graph (inline SVG, one per graph), kernel table, roofline, refusals, eager ops, what-if
    assert page.count("<svg") >= 2 and 'class="cluster"' in page
    for needle in ('id="kernels"', "Roofline", "Refused fusions",
                   "Eager ops", "What if", "no-global", "unfused", "12.5", "not measured", "H100",
                   "library ops of the chosen plan", "the step (ilp + library ops)"):
        assert needle in page, needle
    # every kernel of both graphs has a row, with its bytes
    n = sum(len(r.plan.kernels) for r in bert_report.graphs)
    assert n > 20 and page.count("<span class='sw'") >= n


def test_report_opens_in_headless_chromium(bert_report, tmp_path):
    _need_browser()
    from PIL import Image
    import numpy as np
    path = bert_report.to_html(str(tmp_path / "bert.html"), title="BERT-base-shaped training step (2 layers)")
    shot, log = _open("file://" + path, tmp_path, "bert")
    assert not script_errors(log), script_errors(log)
    ready = [m for m in console_messages(log) if m.startswith("stitchml-report-ready")]
    assert ready, "the page's script did not run (or its console was not captured):\n" + log[-2000:]
    layout = json.loads(ready[0].split(" ", 1)[1].replace('\\"', '"'))
    img = np.asarray(Image.open(shot).convert("RGB")).astype(np.int32)
    assert img.shape[:2] == (HEIGHT, WIDTH)
    nonwhite = (img.min(axis=2) < 235)
    assert nonwhite.mean() > 0.03 and img.std() > 20, "screenshot is blank"
    for elem in ("graph-0", "whatif", "kernels"):
        x, y, w, h = layout[elem]
        assert y + 40 < HEIGHT, f"{elem} is below the screenshot"
        region = img[max(y, 0):min(y + h, HEIGHT), max(x, 0):min(x + w, WIDTH)]
        ink = (region.min(axis=2) < 200).mean()
        assert ink > 0.01 and region.std() > 15, (elem, ink, region.std())
    # the graph shows kernel colours (light saturated fills), not only black-on-white text
    x, y, w, h = layout["graph-0"]
    g = img[y:min(y + h, HEIGHT), x:x + w]
    saturated = (g.max(axis=2) - g.min(axis=2)) > 40
    assert saturated.mean() > 0.005, saturated.mean()


def test_console_error_detection_is_real(tmp_path):
    """The check above can fail: a page with a script error is caught."""
    _need_browser()
    bad = tmp_path / "bad.html"
    bad.write_text("<!DOCTYPE html><html><body><p>x</p><script>console.log('before');"
                   "notAFunction();</script></body></html>")
    _, log = _open("file://" + str(bad), tmp_path, "bad")
    assert "before" in " ".join(console_messages(log))
    assert script_errors(log), log[-2000:]


def test_without_graphviz_the_report_lists_ops_instead(bert_report, tmp_path, monkeypatch):
    monkeypatch.setattr(report_html.shutil, "which", lambda name: None)
    page = open(bert_report.to_html(str(tmp_path / "nodot.html"), what_if={"error": "skipped"}),
                encoding="utf-8").read()
    assert "Graphviz is not installed" in page and "<svg" not in page
    assert "what-if not available" in page
    k0 = bert_report.graphs[0].plan.kernels[0]
    assert k0.name in page


def test_unwritable_path_is_a_clear_error(bert_report, tmp_path):
    with pytest.raises(report_html.ReportError, match="does not exist"):
        bert_report.to_html(str(tmp_path / "no" / "such" / "dir" / "r.html"), what_if={"error": "x"})
    with pytest.raises(report_html.ReportError, match="is a directory"):
        bert_report.to_html(str(tmp_path), what_if={"error": "x"})
    with pytest.raises(report_html.ReportError, match="cannot write"):
        bert_report.to_html("/proc/stitchml-report.html", what_if={"error": "x"})


def test_report_of_a_compiled_training_step(tmp_path):
    """Records from a real compile (kernels run under the interpreter), with eager
    ops that have several outputs (no single shape): the page is written."""
    import stitchml
    from stitchml.tools.examples import example_inputs, make_block
    torch.manual_seed(0)
    block = make_block(32, 2, dropout=0.0, seed=0).train()
    x, mask = example_inputs(2, 8, 32, 2, device=torch.device("cpu"))
    report = stitchml.explain(block, x.requires_grad_(), mask, backward=True)
    assert report.num_kernels > 0
    page = open(report.to_html(str(tmp_path / "block.html")), encoding="utf-8").read()
    assert page.count("<svg") >= 2 and "backward graph" in page and "Kernels" in page
