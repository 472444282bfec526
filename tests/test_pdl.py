"""Programmatic dependent launch (runtime/pdl.py, knob `pdl`): kernels that wait on the
grid before them, launched with `launch_pdl`; grid-barrier kernels left alone.  On CPU
the interpreter runs the kernels (the waits are no-ops there) and Triton compiles them
for sm_90; `-m gpu` runs them on a GPU."""
import json
import re
import textwrap

import pytest
import torch

import stitchml
from stitchml import config
from stitchml.capture.backend import StitchBackend
from stitchml.runtime.pdl import launched_with_pdl, pdl_source, pdl_wanted
from stitchml.testing import compare_with_eager

from blocks import norm_softmax_gelu
from test_aot_gpu import _run_outside_interpreter


def _inputs():
    return [torch.randn(37, 300, requires_grad=True), torch.randn(300, requires_grad=True),
            torch.randn(300, requires_grad=True)]


def _launch_lines(source: str) -> list[str]:
    return re.findall(r"^_L\d+ = .*$", source, re.M)


def test_the_knob_decides_per_device():
    cpu = torch.device("cpu")
    with config.override(pdl="off"):
        assert not pdl_wanted(cpu)
    with config.override(pdl="auto"):
        assert not pdl_wanted(cpu)            # no CUDA device of compute capability 9.0
    with config.override(pdl="on"):
        assert pdl_wanted(cpu)
    with config.override(pdl="sometimes"), pytest.raises(ValueError, match="STITCHML_PDL"):
        pdl_wanted(cpu)


def test_pdl_kernels_wait_first_launch_with_pdl_and_match_eager():
    """Every launched kernel but the grid-barrier ones starts with the grid-dependency
    wait (before any memory access) and its launch line passes launch_pdl; forward and
    backward match eager with poisoned outputs."""
    with config.override(pdl="on", poison_outputs=True):
        cmp = compare_with_eager(norm_softmax_gelu, _inputs(), backward=True)
    assert cmp.num_kernels >= 2
    pdl_lines = barrier_lines = 0
    for rec in cmp.backend.records:
        assert rec.plan is not None, rec.eager_reason
        barrier = {g.name for g in rec.plan.groups if g.kind == "global"}
        for line in _launch_lines(rec.wrapper_source):
            name = line.split(" = ")[1].split(".site")[0]
            assert ("launch_pdl=True" in line) == (name not in barrier), line
            pdl_lines += "launch_pdl=True" in line
            barrier_lines += name in barrier
    assert pdl_lines >= 1 and barrier_lines >= 1    # (the backward here is one grid-barrier launch)
    report = stitchml.Report(cmp.backend.records).to_text()
    assert f"programmatic dependent launch: {pdl_lines} launch line" in report


def test_pdl_source_puts_the_wait_first_and_leaves_barrier_kernels_alone():
    from stitchml.codegen.kernel_source import KernelSource
    ks = KernelSource("k0", [("in", 0), ("out", 1)], ["x", "y"], ["x0 = tl.load(x)", "tl.store(y, x0)"], 4, 4, {})
    p = pdl_source(ks)
    assert p.body[:2] == ["_gdc_wait()", "_gdc_launch_dependents()"] and p.body[2:] == ks.body
    assert launched_with_pdl(p) and launched_with_pdl(p.source) and not launched_with_pdl(ks.source)
    assert pdl_source(p) == p
    barrier = KernelSource("g0", [("in", 0), ("counter", -1), ("base", -1)], ["x", "c", "b"], ["pass"], 4, 4, {})
    assert pdl_source(barrier) is barrier
    # under CUDA graphs a kernel reads its seed from device memory: after the wait (the
    # captured draw that writes it runs before the kernel)
    from stitchml.runtime.cuda_graphs import device_seed_source
    seeded = KernelSource("k1", [("seed", 0), ("out", 1)], ["seed0", "y"], ["tl.store(y, seed0)"], 1, 1, {})
    both = device_seed_source(pdl_source(seeded))
    assert both.body[:3] == ["_gdc_wait()", "_gdc_launch_dependents()", "seed0 = tl.load(seed0_ptr)"]
    assert launched_with_pdl(both.source)


def test_dynamic_templates_launch_with_pdl():
    """A graph with symbolic sizes: its templates' kernels carry the wait and their
    launches the option (the size arguments after the kernel's own)."""
    torch._dynamo.reset()
    backend = StitchBackend()
    with config.override(pdl="on"):
        f = torch.compile(lambda x: torch.softmax(x * 3.0, -1) - x.sum(-1, keepdim=True), backend=backend,
                          dynamic=True)
        for rows in (5, 9):
            x = torch.randn(rows, 64)
            torch.testing.assert_close(f(x), torch.softmax(x * 3.0, -1) - x.sum(-1, keepdim=True))
    rec = next(r for r in backend.records if r.dynamic is not None)
    assert "launch_pdl=True" in rec.wrapper_source


def test_pdl_kernels_compile_for_sm90_with_the_wait_and_a_kernel_without_it_is_refused(tmp_path):
    """Recorded with the knob on, every launch is compiled for sm_90 with launch_pdl and
    its PTX waits on the grid (aot_check.compile_function refuses a PDL launch whose code
    does not); the same launch record of a kernel without the wait is refused."""
    with config.override(pdl="on", record_launches=str(tmp_path / "pdl")):
        compare_with_eager(norm_softmax_gelu, _inputs(), backward=True)
    with config.override(record_launches=str(tmp_path / "plain")):
        compare_with_eager(norm_softmax_gelu, _inputs())
    from stitchml.tools.aot_replay import read_records
    recs = read_records(str(tmp_path / "pdl"))
    assert recs and any(r["options"].get("launch_pdl") for r in recs)
    plain = read_records(str(tmp_path / "plain"))
    assert plain and not any(r["options"].get("launch_pdl") for r in plain)
    racy = tmp_path / "racy"
    racy.mkdir()
    # a kernel without the wait, and one that loads before it
    late = tmp_path / "late_wait.py"
    late.write_text(textwrap.dedent("""
        import triton
        import triton.language as tl
        from triton.language.extra.cuda import gdc_wait

        @triton.jit
        def late(x, y):
            v = tl.load(x + tl.arange(0, 128))
            gdc_wait()
            tl.store(y + tl.arange(0, 128), v * 2.0)
    """))
    (racy / "launches-0.jsonl").write_text(
        json.dumps({**plain[0], "options": {**plain[0]["options"], "launch_pdl": True}}) + "\n"
        + json.dumps({"path": str(late), "name": "late", "sig": {"x": "*fp32", "y": "*fp32"}, "consts": {},
                      "aligned": ["x", "y"], "options": {"num_warps": 4, "launch_pdl": True}}) + "\n")
    out = _run_outside_interpreter(textwrap.dedent(f"""
        import json
        from stitchml.tools.aot_replay import replay
        print(json.dumps({{k: [[r["name"], v["ok"], v.get("error", "")[-300:]] for r, v in replay(d, jobs=2)]
                          for k, d in (("pdl", {str(tmp_path / "pdl")!r}), ("racy", {str(racy)!r}))}}))
    """))
    assert out["pdl"] and all(ok for _, ok, _ in out["pdl"]), out["pdl"]
    assert sorted((name == "late", ok, "griddepcontrol.wait" in err) for name, ok, err in out["racy"]) == \
        [(False, False, True), (True, False, True)], out["racy"]


@pytest.mark.gpu
def test_pdl_training_step_matches_eager_on_a_gpu_with_and_without_cuda_graphs():
    """Three steps (with CUDA graphs: captured at the second, replayed at the third), each
    on fresh inputs, forward and gradients against eager."""
    for graphs in (False, True):
        torch._dynamo.reset()
        backend = StitchBackend()
        with config.override(pdl="on", cuda_graphs=graphs, poison_outputs=True):
            f = torch.compile(norm_softmax_gelu, backend=backend)
            for _ in range(3):
                inputs = [t.detach().cuda().requires_grad_() for t in _inputs()]
                ref_in = [t.detach().clone().requires_grad_() for t in inputs]
                out, ref = f(*inputs), norm_softmax_gelu(*ref_in)
                torch.testing.assert_close(out, ref)
                cot = torch.randn_like(ref)
                out.backward(cot)
                ref.backward(cot)
                for a, e in zip(inputs, ref_in):
                    torch.testing.assert_close(a.grad, e.grad, rtol=1e-4, atol=1e-4)
        assert any("launch_pdl=True" in r.wrapper_source for r in backend.records)


def test_the_pdl_contender_runs_only_when_named_and_only_on_hopper():
    """`stitchml-pdl` (bench): the A/B of the knob in one run; left out of a default run
    (it would add a contender to every suite), skipped without a GPU of compute capability
    9.0; the CLI offers every contender the bench knows."""
    from stitchml import cli
    from stitchml.bench.contenders import CONTENDER_NAMES, RunContext
    from stitchml.bench.harness import pick_contenders
    assert "stitchml-pdl" not in [c.name for c in pick_contenders(())]
    (pdl,) = pick_contenders(["stitchml-pdl"])
    assert pdl.knobs == {"pdl": "auto"}
    ctx = RunContext.__new__(RunContext)
    ctx.device = torch.device("cpu")
    assert pdl.skip_reason(None, ctx)[0] == "skipped"
    action = next(a for a in cli.build_parser()._subparsers._group_actions[0].choices["bench"]._actions
                  if "--contender" in a.option_strings)
    assert list(action.choices) == list(CONTENDER_NAMES)


@pytest.mark.gpu
def test_calibrate_measures_the_replay_gap_with_and_without_pdl_on_a_gpu():
    """`stitchml calibrate` stores the replayed-graph gap a kernel, plain and with PDL
    (`graph_launch_pdl_s`): the two numbers the knob's default waits for."""
    from stitchml.tools.calibrate import measure_graph_launch
    plain, pdl = measure_graph_launch(50, 3), measure_graph_launch(50, 3, pdl=True)
    assert 0 < plain < 1e-4 and 0 < pdl < 1e-4, (plain, pdl)
