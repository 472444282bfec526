"""The `stitchml` command line: demo, explain, config (in-process), the demo's
verdict on a deliberately wrong compiled result, and the console-script path
where triton is imported before TRITON_INTERPRET is set."""
import os
import re
import subprocess
import sys

import pytest
import torch

from stitchml import compiler, pipeline
from stitchml.cli import main
from stitchml.tools.examples import TransformerBlock, example_inputs, make_block


def _kernel_lines(out: str, scheme: str) -> list[str]:
    return re.findall(rf"^\s+kernel k\d+: +{scheme}\b.*$", out, flags=re.M)


def test_demo_passes(capsys):
    rc = main(["demo"])
    out = capsys.readouterr().out
    assert rc == 0, out
    for header in ("== inference graph ==", "== forward graph ==", "== backward graph =="):
        assert header in out
    assert _kernel_lines(out, "regional") and _kernel_lines(out, "local")
    # thread mapping and modelled traffic
    assert re.search(r"packed_rows BLOCK_R=\d+ BLOCK_C=\d+", out)
    assert re.search(r"modelled memory traffic: [\d.]+ MB in stitched kernels vs [\d.]+ MB unfused", out)
    # the fallback section names the matrix products as compute-intensive
    section = out.split("eager ops (fallbacks) and why:")
    assert len(section) == 3  # one per plan (inference, training)
    train_fallbacks = section[2].split("compile time")[0]
    assert re.search(r"backward +\d+ x aten\.mm\.default +compute-intensive", train_fallbacks)
    assert re.search(r"(forward|backward) +\d+ x aten\.(bmm|_scaled_dot_product_\w+)\.default +compute-intensive", train_fallbacks)
    assert re.search(r"inference +\d+ x aten\.(bmm|_scaled_dot_product_\w+)\.default +compute-intensive", section[1])
    # every parameter gradient is checked
    for name, _ in TransformerBlock().named_parameters():
        assert re.search(rf"grad {re.escape(name)} +\S+ +ok", out), name
    assert re.search(r"inference output +\S+ +ok", out) and re.search(r"training output +\S+ +ok", out)
    assert re.search(r"^PASS: max relative error \S+", out, flags=re.M)
    assert "FAIL" not in out and "problem:" not in out
    if not torch.cuda.is_available():
        assert "timings under the interpreter mean nothing" in out


def test_demo_reports_fail_on_wrong_compiled_result(capsys, monkeypatch):
    """Scale every floating-point output of every compiled graph by 1.001: the kernels'
    results are then wrong by a relative 1e-3 and the demo must say FAIL, exit 1."""
    real = pipeline.build_callable

    def wrong_build_callable(*args, **kwargs):
        call = real(*args, **kwargs)

        def wrong(*a):
            outs = call(*a)
            return type(outs)(o * 1.001 if isinstance(o, torch.Tensor) and o.is_floating_point() else o
                              for o in outs)

        return wrong

    monkeypatch.setattr(pipeline, "build_callable", wrong_build_callable)
    rc = main(["demo"])
    out = capsys.readouterr().out
    assert rc == 1, out
    assert re.search(r"^FAIL: max relative error \S+", out, flags=re.M)
    assert not re.search(r"^PASS", out, flags=re.M)
    assert re.search(r"inference output +\S+ +FAIL", out)
    err = float(re.search(r"inference output +(\S+)", out).group(1))
    assert 5e-4 < err < 2e-3   # the injected 1e-3 error, measured


def test_explain_inference(capsys):
    rc = main(["explain"])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "== inference graph ==" in out and "backward graph" not in out
    assert _kernel_lines(out, "regional") and _kernel_lines(out, "local")
    assert re.search(r"eager +aten\.(bmm|_scaled_dot_product_\w+)\.default: compute-intensive", out)
    assert re.search(r"^total: \d+ kernels, \d+ eager ops", out, flags=re.M)
    assert "WARNING" not in out


def test_explain_backward_with_dropout(capsys):
    rc = main(["explain", "--backward", "--dropout", "0.1"])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "== forward graph ==" in out and "== backward graph ==" in out
    assert re.search(r"eager +aten\.mm\.default: compute-intensive", out)
    assert "uniform" in out          # dropout's random numbers are generated inside kernels
    assert "WARNING" not in out


def test_config(capsys):
    rc = main(["config"])
    out = capsys.readouterr().out
    assert rc == 0
    assert out.splitlines()[0].split() == ["variable", "default", "help"]
    for env in ("STITCHML_POINTWISE_BLOCK", "STITCHML_FALLBACK_ON_ERROR", "STITCHML_CACHE_DIR"):
        assert env in out


def test_every_on_off_knob_reads_0_from_its_variable_as_off(monkeypatch):
    """`bool("0")` is True: an on/off knob must parse its variable with `config._bool`, or
    STITCHML_X=0 would leave it on (two knobs did)."""
    from stitchml import config
    flags = [k for k in config.KNOBS.values() if isinstance(k.default, bool)]
    assert len(flags) > 20
    for k in flags:
        monkeypatch.setenv(k.env, "0")
        assert config.get(k.name) is False, k.env
        monkeypatch.setenv(k.env, "1")
        assert config.get(k.name) is True, k.env


def test_no_command_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as e:
        main([])
    assert e.value.code == 2


def test_example_inputs_are_random_and_fit_the_block():
    x, mask = example_inputs(batch=3, seq=8, hidden=32, heads=2)
    assert x.shape == (3, 8, 32) and mask.shape == (3, 1, 8, 8)
    assert x.abs().min() > 0 and x.std() > 0.5
    above = torch.ones(8, 8, dtype=torch.bool).triu(1).expand_as(mask)
    assert (mask[above] < -1e3).all() and (mask[~above].abs() < 1).all()
    block = make_block(hidden=32, heads=2).eval()
    with torch.no_grad():
        assert block(x, mask).shape == x.shape
    # deterministic weights for a given seed
    assert torch.equal(make_block(seed=1).fc1.weight, make_block(seed=1).fc1.weight)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the interpreter path is for CPU-only machines")
def test_cli_process_without_triton_interpret_set():
    """As a console script, `import stitchml` imports triton before cli.py can set
    TRITON_INTERPRET; the command must still run its kernels (in a fresh process)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run([sys.executable, "-m", "stitchml.cli", "explain"], env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "== inference graph ==" in proc.stdout and re.search(r"^total: \d+ kernels", proc.stdout, re.M)


def test_explain_layers_per_layer_summary(capsys, monkeypatch):
    """`explain --layers`: each block of a 2-block stack planned alone, one row per
    layer (kernels, bytes moved, predicted time, its pattern rewrites); `--inductor`
    adds Inductor's count, labelled as C++ on a CPU (stubbed here: the real C++
    compile takes about a minute per block on 2 cores)."""
    from stitchml.tools import layers
    counted = []

    def fake_count(fn, *args, backward=False):
        counted.append(backward)
        return 7
    if not torch.cuda.is_available():
        monkeypatch.setattr(layers, "inductor_kernel_count", fake_count)
    rc = main(["explain", "--layers", "--inductor", "--hidden", "32", "--heads", "2", "--seq", "8"])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "kernels per layer: 2 example transformer blocks (hidden=32, heads=2) (inference" in out
    rows = re.findall(r"^  (layers\.\d) +TransformerBlock +(\d+) +(\d+) +([\d.]+) +([\d.]+) +([\d.]+) +(\S+)$", out,
                      flags=re.M)
    assert [r[0] for r in rows] == ["layers.0", "layers.1"], out
    for _, kernels, library, modelled, unfused, pred_us, ind in rows:
        assert int(kernels) >= 1 and int(library) >= 1 and 0 < float(modelled) < float(unfused)
        assert float(pred_us) > 0
    assert re.search(r"pattern attention at \w+: rewritten: .*scaled_dot_product_attention", out)
    assert re.search(r"^  total: \d+ kernels, [\d.]+ MB modelled, [\d.]+ us predicted$", out, flags=re.M)
    if not torch.cuda.is_available():
        assert counted == [False, False] and [r[6] for r in rows] == ["7", "7"]
        assert "ind. C++" in out and "NOT GPU kernel counts" in out and "Inductor emits C++" in out
    assert "WARNING" not in out


def test_explain_layers_bad_combinations_are_clear_errors(capsys):
    assert main(["explain", "--inductor"]) == 2
    assert "--inductor counts Inductor's kernels per layer: it needs --layers" in capsys.readouterr().err
    assert main(["explain", "--layers", "--what-if"]) == 2
    assert "cannot be combined with --what-if" in capsys.readouterr().err
    assert main(["explain", "--layers", "--num-layers", "0"]) == 2
    assert "--num-layers must be at least 1" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        main(["explain", "--layers", "resnet"])
    assert e.value.code == 2
