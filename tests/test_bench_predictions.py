"""Checked predictions (issue 17.4): every stitchml bench row carries the cost model's
prediction of its measured median, and per kernel predicted vs profiler time, summed
up per kernel class in results.md.  Without a GPU: the --quick path runs end to end
(prediction present, per-kernel table "no GPU: not measured"); the matching and the
error math are checked on fake profiler measurements."""
from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch

from stitchml.bench import BenchOptions, run_bench
from stitchml.bench.contenders import Eager, Stitch, as_replayed, match_kernels, predict_call, triton_function_name
from stitchml.bench.harness import CaseResult
from stitchml.bench.report import _models_table, kernel_class_errors, prediction_lines
from stitchml.bench.timing import device_time_by_name, median_by_name
from stitchml.capture.backend import StitchBackend
from stitchml.runtime.kernel_cache import load_kernels


def test_quick_rows_carry_predicted_s(tmp_path):
    """A forward+backward row: predicted_s is the forward plus the backward plan's
    prediction; results.json holds it beside the timing, results.md shows it and the
    ratio (n/m on a CPU) and says the per-kernel table is not measured."""
    stitch = Stitch()
    run = run_bench(BenchOptions(quick=True, cases=("cross_entropy_fwdbwd",), out=tmp_path, progress=False,
                                 plots=False, reps=2), contenders=[Eager(), stitch])
    by = {r.contender: r for r in run.results}
    row = by["stitchml"]
    assert row.status == "ok", row.reason
    plans = [r.plan for r in stitch.backend.records]
    assert {r.kind for r in stitch.backend.records} == {"forward", "backward"}
    assert row.predicted_s == pytest.approx(sum(p.predicted_s for p in plans)) and row.predicted_s > 0
    assert {g["graph"] for g in row.prediction["graphs"]} == {"forward", "backward"}
    assert row.prediction["device"] == "cpu" and row.prediction["meaningful"] is False
    assert by["eager"].predicted_s is None and by["eager"].kernel_times is None

    data = json.loads((tmp_path / "results.json").read_text())
    saved = next(r for r in data["results"] if r["contender"] == "stitchml")
    assert saved["predicted_s"] == pytest.approx(row.predicted_s) and saved["timing"]["median_s"] > 0
    kt = saved["kernel_times"]
    assert kt["measured"] is False and kt["note"] == "no GPU: not measured"
    assert len(kt["rows"]) == sum(p.num_kernels for p in plans)
    launched = {(r.kind, n) for r in stitch.backend.records for n in r.plan.launched}
    assert {tuple(k["kernels"][0].split(":")) for k in kt["rows"]} == launched
    for k in kt["rows"]:
        assert k["measured_s"] is None and k["predicted_s"] > k["predicted_device_s"] >= 0
        assert k["profiler_name"].startswith("k_")

    md = (tmp_path / "results.md").read_text()
    assert "| median | IQR | predicted | meas./pred. |" in md
    line = next(ln for ln in md.splitlines() if ln.startswith("| cross_entropy_fwdbwd[V=2048] | fp32 | stitchml |"))
    assert "| n/m |" in line
    assert "## prediction check (cost model vs measured)" in md and "**no GPU: not measured**" in md


def test_profiler_names_are_the_names_kernels_run_under():
    """The name predicted kernels are matched by is the name of the function
    `load_kernels` gives the launcher (what the profiler shows)."""
    backend = StitchBackend()
    f = torch.compile(lambda x, y: torch.softmax(x * 2, -1) + y.sum(0), backend=backend)
    f(torch.randn(8, 32), torch.randn(8, 32))
    rec = backend.records[0]
    pred = predict_call(backend.records, [0])
    assert pred["predicted_s"] == pytest.approx(rec.plan.predicted_s)
    assert len(pred["kernels"]) == rec.plan.num_kernels
    for entry in pred["kernels"]:
        src = rec.kernels[entry["kernel"]].source
        fn = load_kernels({entry["kernel"]: src})[entry["kernel"]]
        assert fn.__name__ == triton_function_name(src) == entry["names"][0]
    assert predict_call(backend.records, [rec.calls])["predicted_s"] is None     # no graph ran since the snapshot


def test_predictions_of_calls_timed_as_graph_replays_price_launches_at_the_replay_gap():
    """A micro row is timed as a CUDA-graph replay of the whole call while its plan
    priced each launch at the host launch path (H200, 2026-11-30: the AdamW step's 27
    launches at 9.1 us, 713.6 us predicted against 431.3 measured): `as_replayed` takes
    each stitched launch's term down to the replay's gap, in the total, per graph and per
    kernel, and leaves the library calls alone."""
    from stitchml import config
    from stitchml.plan.devices import current_device
    with config.override(device="H200", cuda_graphs=False):
        torch._dynamo.reset()
        backend = StitchBackend()
        f = torch.compile(lambda x, y: ((torch.softmax(x * 2, -1) + y.sum(0)) @ y.t()).relu() * 3, backend=backend)
        f(torch.randn(8, 32), torch.randn(8, 32))
        rec = backend.records[0]
        pred = predict_call(backend.records, [0])
        kernels = pred.pop("kernels")
        gap, launch = current_device().graph_launch_s, pred["graphs"][0]["launch_s"]
    assert launch > gap and rec.plan.num_kernels >= 2
    before = {k["kernel"]: k["predicted_s"] for k in kernels}
    total = pred["predicted_s"]
    as_replayed(pred, kernels)
    assert pred["replayed"] and pred["launch_s"] == gap
    assert pred["predicted_s"] == pytest.approx(total - rec.plan.num_kernels * (launch - gap))
    assert pred["graphs"][0]["stitched_s"] == pytest.approx(rec.plan.predicted_s - rec.plan.num_kernels * (launch - gap))
    for k in kernels:
        if "library" in k:
            assert k["predicted_s"] == before[k["kernel"]] > 0
        else:
            assert k["predicted_s"] == pytest.approx(before[k["kernel"]] - (launch - gap))
    assert any("library" in k for k in kernels)


def _entry(graph, kernel, cls, pred, names, launches=1, note=""):
    return {"graph": graph, "kernel": kernel, "class": cls, "launches": launches, "predicted_s": pred,
            "predicted_device_s": max(pred - 5e-6, 0.0), "names": names, "note": note}


A, B, G = "k_" + "a" * 24, "k_" + "b" * 24, "k_" + "c" * 24


def _fake_kernels():
    return [_entry("forward", "k0", "pointwise", 12e-6, [A]),
            _entry("backward", "k3", "pointwise", 12e-6, [A]),            # same body: one profiler name
            _entry("forward", "k1", "row_looped", 30e-6, [B, "k_" + "d" * 24]),   # plain / seeded variants
            _entry("backward", "g0", "global", 45e-6, [G]),
            _entry("backward", "k5", "packed_rows", 8e-6, ["k_" + "e" * 24])]     # not in the trace


def test_match_kernels_and_the_error_math():
    measured = {A: (20e-6, 2), B: (40e-6, 1), G: (50e-6, 1), "k_" + "f" * 24: (3e-6, 1),
                "sm90_xmma_gemm_f32": (100e-6, 3), "Memset (Device)": (1e-6, 1)}
    got = match_kernels(_fake_kernels(), measured)
    assert got["measured"] is True
    rows = {r["profiler_name"]: r for r in got["rows"]}
    a = rows[A]
    assert a["kernels"] == ["forward:k0", "backward:k3"] and a["launches"] == 2 and a["measured_launches"] == 2
    assert a["predicted_s"] == pytest.approx(24e-6) and a["error_pct"] == pytest.approx(20.0)   # (24-20)/20
    assert a["device_error_pct"] == pytest.approx(-30.0)                                         # (14-20)/20
    assert rows[B]["error_pct"] == pytest.approx(-25.0) and rows[G]["error_pct"] == pytest.approx(-10.0)
    missing = rows[None]
    assert missing["class"] == "packed_rows" and missing["measured_s"] is None and "cannot match" in missing["note"]
    assert [u["profiler_name"] for u in got["unmatched"]] == ["k_" + "f" * 24]
    assert got["other"]["launches"] == 4 and got["other"]["seconds"] == pytest.approx(101e-6)
    # a launch count that differs from the plans' is said
    differ = match_kernels(_fake_kernels(), {**measured, A: (20e-6, 3)})
    assert "profiler saw 3 launch(es) per step, the plans 2" in next(
        r for r in differ["rows"] if r["profiler_name"] == A)["note"]
    # the per-class table: mean absolute % error over the measured entries of each class
    extra = dict(a, predicted_s=15e-6, predicted_device_s=10e-6, measured_s=20e-6)   # a second pointwise: -25%
    table = {c["class"]: c for c in kernel_class_errors(got["rows"] + [extra])}
    assert list(table) == ["pointwise", "packed_rows", "row_looped", "global"]         # KERNEL_CLASSES order
    pw = table["pointwise"]
    assert pw["n"] == 2 and pw["launches"] == 4 and pw["unmatched"] == 0
    assert pw["mape_pct"] == pytest.approx((20.0 + 25.0) / 2)
    assert pw["device_mape_pct"] == pytest.approx((30.0 + 50.0) / 2)
    assert pw["median_signed_pct"] == pytest.approx((20.0 - 25.0) / 2)
    assert table["packed_rows"]["n"] == 0 and table["packed_rows"]["unmatched"] == 1
    assert table["packed_rows"]["mape_pct"] is None
    assert table["global"]["mape_pct"] == pytest.approx(10.0)
    # without a GPU every entry is kept, marked not measured
    cpu = match_kernels(_fake_kernels(), None)
    assert cpu["measured"] is False and all(r["note"] == "no GPU: not measured" for r in cpu["rows"])
    assert kernel_class_errors(cpu["rows"])[0]["n"] == 0


def _row(contender, kernel_times, predicted_s=40e-6, median_s=80e-6, case="c[1]"):
    r = CaseResult("micro", case, "fp32", contender, status="ok")
    r.timing = {"median_s": median_s, "meaningful": True}
    r.predicted_s = predicted_s
    r.prediction = {"predicted_s": predicted_s, "device": "H100", "figures": "calibrated (x.json)"}
    r.kernel_times = kernel_times
    return r


def test_results_md_prediction_section_from_fake_measurements():
    measured = {A: (20e-6, 2), B: (40e-6, 1), G: (50e-6, 1)}
    kt = match_kernels(_fake_kernels(), measured)
    rows = [_row("stitchml", kt), _row("stitchml-nograph", kt)]      # same kernels: counted once
    md = "\n".join(prediction_lines(rows))
    assert "on H100 (calibrated (x.json))" in md
    assert "- micro: measured/predicted median 2.00 over 2 rows" in md
    assert "| pointwise | 1 | 2 | 20.0% | 30.0% | 20.0% | 0 |" in md
    assert "| row_looped | 1 | 1 | 25.0% | 37.5% | -25.0% | 0 |" in md
    assert "| global | 1 | 1 | 10.0% | 20.0% | -10.0% | 0 |" in md
    assert "| packed_rows | 0 | 0 | — | — | — | 1 |" in md
    assert "1 kernel(s) could not be matched" in md and "backward:k5" in md
    cpu = "\n".join(prediction_lines([_row("stitchml", match_kernels(_fake_kernels(), None))]))
    assert "**no GPU: not measured**" in cpu and "| class |" not in cpu


def test_profiler_events_by_name():
    cuda, cpu = torch.autograd.DeviceType.CUDA, torch.autograd.DeviceType.CPU

    def ev(name, dev, us):
        return SimpleNamespace(name=name, device_type=dev, time_range=SimpleNamespace(elapsed_us=lambda: us))
    step = device_time_by_name([ev(A, cuda, 10.0), ev(A, cuda, 12.0), ev("aten::mm", cpu, 99.0), ev(B, cuda, 5.0)])
    assert step == {A: (pytest.approx(22e-6), 2), B: (pytest.approx(5e-6), 1)}
    med = median_by_name([step, {A: (30e-6, 2)}, {A: (20e-6, 2), B: (7e-6, 1)}])
    assert med[A] == (pytest.approx(22e-6), 2) and med[B] == (pytest.approx(5e-6), 1)


def test_models_table_shows_plan_cache_and_plan_codegen():
    r = CaseResult("models", "bert_infer[b1,s8]", "fp32", "stitchml", status="ok")
    r.timing = {"median_s": 0.5, "meaningful": False}
    r.compile = {"cold_s": 3.0, "stitch": {"plan_cache_s": 0.012, "plan_codegen_s": 0.75, "compile_s": 1.0,
                                           "graphs": 1, "kernels": 4, "lower_s": 0.1}}
    lines = _models_table([r])
    assert "| stitch plan cache | stitch lower+plan+codegen |" in lines[0]
    cells = [c.strip() for c in lines[2].split("|")]
    head = [c.strip() for c in lines[0].split("|")]
    assert cells[head.index("stitch plan cache")] == "12.00 ms"
    assert cells[head.index("stitch lower+plan+codegen")] == "750.00 ms"
