"""Software prefetch in walks over row blocks (`codegen/prefetch.py`, knob `prefetch_rows`):
the rewrite of a walk's body as plain data, the plans that ask for it, the cost model's
walk latency, and the kernels against float64 under the interpreter with the knob on and
off (outputs poisoned: tests/conftest.py)."""
import ast
import sys

import pytest
import torch
import torch.nn.functional as F

from stitchml import config
from stitchml.codegen.prefetch import prefetched_walk

sys.path.insert(0, "tests")
from planning import plan_on  # noqa: E402

BODY = [
    "rflat = rblk * 2 + tl.arange(0, 2)[:, None]",
    "rmask = rflat < 600",
    "cflat = tl.arange(0, 1024)[None, :]",
    "cmask = cflat < 768",
    "t1 = _from_bf16(tl.load(in0 + cflat + rflat * 768, mask=rmask & cmask, other=0))",
    "t2 = tl.load(in1 + cflat, mask=cmask, other=0)",        # the same every block: not hoisted
    "t3 = tl.load(in2 + t1.to(tl.int32), mask=rmask & cmask, other=0)",   # address from a load: not hoisted
    "pacc = _add(pacc, tl.where(rmask & cmask, t1 * t2 + t3, 0.0))",
    "tl.store(out0 + cflat + rflat * 768, t1 * t2, mask=rmask & cmask)",
]


def test_the_next_blocks_loads_are_issued_before_this_blocks_arithmetic():
    lines = prefetched_walk(BODY, "rblk", "tl.program_id(0)", 300, 264)
    assert lines is not None
    ast.parse("\n".join(lines))   # valid Python
    loop = lines.index("for rblk in range(tl.program_id(0), 300, 264):")
    prologue, inner = lines[:loop], [x.strip() for x in lines[loop + 1:]]
    # one hoisted load: the row-indexed read of in0, for the first block before the loop
    assert prologue[0] == "rblk_pf = tl.minimum(tl.program_id(0), 299)"
    assert [x for x in prologue if "tl.load" in x] == [
        "pf0 = tl.load(in0 + cflat_pf + rflat_pf * 768, mask=rmask_pf & cmask_pf, other=0)"]
    # in the walk: this block's value taken first, the next block's load (clamped to the
    # last block) issued before any arithmetic, the body reading the taken value
    assert inner[0] == "pc0 = pf0"
    assert inner[1] == "rblk_pf = tl.minimum(rblk + 264, 299)"
    first_use = next(i for i, x in enumerate(inner) if x.startswith("t1 ="))
    next_load = next(i for i, x in enumerate(inner) if x.startswith("pf0 = tl.load"))
    assert next_load < first_use and inner[first_use] == "t1 = _from_bf16(pc0)"
    # the loop-invariant load and the indirect one stay where they were
    assert "t2 = tl.load(in1 + cflat, mask=cmask, other=0)" in inner
    assert any(x.startswith("t3 = tl.load(in2 + t1.to(tl.int32)") for x in inner)
    assert sum("tl.load" in x for x in inner) == 3


def test_bodies_it_cannot_rewrite_keep_the_plain_walk():
    nested = BODY[:4] + ["for j in range(4):", "    tl.store(out0 + j, 1.0)"]
    assert prefetched_walk(nested, "rblk", "tl.program_id(0)", 300, 264) is None
    invariant = ["cflat = tl.arange(0, 1024)[None, :]", "t = tl.load(in1 + cflat)", "tl.store(out0 + cflat, t)"]
    assert prefetched_walk(invariant, "rblk", "tl.program_id(0)", 300, 264) is None
    # a name the rewrite would add already in use
    assert prefetched_walk(["pf0 = rblk * 2", "t = tl.load(in0 + pf0)", "tl.store(out0 + pf0, t)"],
                           "rblk", "tl.program_id(0)", 300, 264) is None


def _ln_backward(x, w, b, g):
    x, w, b = (t.detach().requires_grad_() for t in (x, w, b))
    return torch.autograd.grad(F.layer_norm(x, (x.shape[-1],), w, b), (x, w, b), g)


def test_walks_over_row_blocks_ask_for_prefetch_and_are_priced_with_its_latency():
    """A layer norm's backward over 2048 tokens (column partials: 264 programs walking
    row blocks) asks for prefetch; the knob off, each block of the walk costs a memory
    latency more; kernels that walk no blocks never ask."""
    from stitchml.plan.cost import walk_latency
    from stitchml.plan.devices import get_device
    dev = get_device("H200")
    shapes = ((2048, 768), (768,), (768,), (2048, 768))
    on = plan_on("H200", _ln_backward, *shapes, dtype=torch.bfloat16)
    off = plan_on("H200", _ln_backward, *shapes, dtype=torch.bfloat16, prefetch_rows=False)
    walks = [k for k in on.kernels if k.partials and k.mapping.row_blocks > 1]
    assert walks and all(k.prefetch for k in walks)
    assert not any(k.prefetch for k in on.kernels if not k.partials or k.mapping.row_blocks == 1)
    assert not any(k.prefetch for k in off.kernels)
    assert [k.mapping for k in on.kernels] == [k.mapping for k in off.kernels]
    for k_on, k_off in zip(walks, [k for k in off.kernels if k.partials and k.mapping.row_blocks > 1]):
        lat = k_on.mapping.row_blocks * dev.mem_latency_s
        mem = 1e-6   # (any bytes' time)
        assert walk_latency(k_off, mem, dev) == pytest.approx(mem + lat)
        assert walk_latency(k_on, mem, dev) == pytest.approx(max(mem, lat))
        assert k_off.predicted_s > k_on.predicted_s
    assert off.predicted_s > on.predicted_s


@pytest.mark.parametrize("dtype,rows", [(torch.bfloat16, 55), (torch.float32, 49), (torch.bfloat16, 12)])
def test_prefetched_walks_match_float64(dtype, rows, h200_cut):
    """Planned for the H200 cut to 12 SMs (24 programs: 55 rows walk 3 blocks, 49 rows a
    ragged last block, 12 rows leave programs with no block: the clamped prefetch stays in
    bounds), a layer norm forward and backward run under the interpreter against float64
    with the knob on (and, over 55 rows, off), and a GELU backward beside its bias gradient; the
    kernels generated carry the hoisted loads where programs walk blocks, and without the
    knob do not (the kernel cache keys on it)."""
    from stitchml.testing import compare_against_float64

    def walk_sources(cmp):
        return [ks.source for r in cmp.backend.records if r.plan for ks in r.kernels.values()
                if "pf0 = tl.load" in ks.source]

    programs = h200_cut
    for prefetch in ((True, False) if rows == 55 else (True,)):
        with config.override(device="H200", prefetch_rows=prefetch):
            torch._dynamo.reset()
            x = torch.randn(rows, 768).to(dtype).requires_grad_()
            w = (torch.rand(768) + 0.5).to(dtype).requires_grad_()
            b = torch.randn(768).to(dtype).requires_grad_()
            cmp, judgement = compare_against_float64(lambda x, w, b: F.layer_norm(x, (768,), w, b), [x, w, b])
            judgement.assert_ok(f"layer norm forward and backward, prefetch {prefetch}")
            assert bool(walk_sources(cmp)) == (prefetch and rows > programs), rows
            if rows > programs:   # explain says how each walk waits for its loads
                from stitchml.tools.explain import Report
                text = Report(cmp.backend.records).to_text()
                assert ("(prefetch)" in text) == prefetch and ("prefetch_rows off" in text) == (not prefetch)
    with config.override(device="H200"):
        torch._dynamo.reset()
        xs, gs = torch.randn(rows, 3072).to(dtype), torch.randn(rows, 3072).to(dtype)
        cmp, judgement = compare_against_float64(
            lambda x, g: ((g.float() * 0.5 * (1 + torch.erf(x.float() * 0.7071067811865476))).to(x.dtype),
                          (g.float() * x.float()).sum(0)), [xs, gs], backward=False)
        judgement.assert_ok("GELU-like backward and a bias gradient")
        assert bool(walk_sources(cmp)) == (rows > programs), rows


def test_the_walk_latency_is_calibrated_and_read_back(tmp_path):
    """`stitchml calibrate` derives the latency a walked block pays from two runs that
    differ in their walks (`calibrate.walk_latency_from`); the calibration file carries
    it and the cost model reads it (`Device.mem_latency_s`); the table value otherwise."""
    from dataclasses import replace

    from stitchml.plan.devices import DEVICES, get_device, save_calibration
    from stitchml.tools.calibrate import walk_latency_from
    # 4 and 32 blocks walked: 75.6 us against 14.1, of which 54.6 us more bytes
    assert walk_latency_from((14.1e-6, 89.7e-6), (11.0e-6, 65.6e-6), (4, 32)) == pytest.approx(0.75e-6, rel=0.01)
    assert walk_latency_from((10e-6, 20e-6), (5e-6, 16e-6), (4, 32)) == 0.0    # never negative
    with pytest.raises(ValueError):
        walk_latency_from((1e-6, 2e-6), (0.0, 0.0), (8, 8))
    with config.override(cache_dir=str(tmp_path)):
        assert get_device("H200").mem_latency_s == DEVICES["H200"].mem_latency_s
        save_calibration(replace(DEVICES["H200"], mem_latency_s=1.1e-6), {})
        dev = get_device("H200")
        assert dev.source == "calibrated" and dev.mem_latency_s == 1.1e-6
        on = plan_on("H200", _ln_backward, (2048, 768), (768,), (768,), (2048, 768), dtype=torch.bfloat16,
                     prefetch_rows=False)
        walk = next(k for k in on.kernels if k.partials and k.mapping.row_blocks > 1)
        from stitchml.plan.cost import walk_latency
        assert walk_latency(walk, 1e-6, dev) == pytest.approx(1e-6 + walk.mapping.row_blocks * 1.1e-6)


def _planned_run(truth):
    """A stand-in for `calibrate._run_stitched` without a GPU: the function planned for
    `truth`'s device with the knobs asked for, its "measured" time what the cost model
    prices on `truth` (whose figures the calibration should then recover)."""
    from stitchml.plan.cost import plan_seconds

    def run(fn, inputs, reps=20, **knobs):
        plan = plan_on(truth.name, fn, *[tuple(x.shape) for x in inputs], dtype=inputs[0].dtype, **knobs)
        return plan_seconds(plan, truth), [plan]
    return run


@pytest.mark.parametrize("device", ["H100", "H200"])
def test_the_looped_block_wait_is_calibrated_beyond_the_bytes_and_read_back(device, tmp_path, monkeypatch):
    """`stitchml calibrate` times an RMS norm over 65536 bfloat16 columns at two row
    counts (`calibrate.measure_loop_wait`): on H100 and H200 both run one row-looped
    kernel on the same capped grid, loading different numbers of column blocks a program;
    from what the cost model would take on a device whose wait is 0.4 us the measurement
    recovers 0.4 us; the calibration file carries it and the model reads it back."""
    from dataclasses import replace

    from stitchml.plan.devices import DEVICES, get_device, save_calibration
    from stitchml.tools import calibrate as cal
    truth = replace(DEVICES[device], loop_wait_s=0.4e-6)
    monkeypatch.setattr(cal, "_run_stitched", _planned_run(truth))
    res = cal.measure_loop_wait(DEVICES[device], device="meta")
    assert res["grid"] <= 2 * truth.sms and res["waits"][0] < res["waits"][1], res
    assert res["loop_wait_s"] == pytest.approx(0.4e-6, rel=1e-6)
    with config.override(cache_dir=str(tmp_path)):
        assert get_device(device).loop_wait_s == DEVICES[device].loop_wait_s
        save_calibration(replace(DEVICES[device], loop_wait_s=res["loop_wait_s"]), {})
        assert get_device(device).loop_wait_s == pytest.approx(0.4e-6)


def test_form_efficiencies_are_calibrated_net_of_the_latencies_the_model_charges(monkeypatch):
    """Each form's efficiency is what makes the cost model's time equal the measured one
    once the walk, combine and looped-block latencies it charges besides are taken off:
    from the model's own times on a device with known efficiencies (and a looped block's
    wait of 0.3 us), `calibrate.measure_forms` gives those efficiencies back.  (Counted
    into the efficiency, the row-looped form's waits would be charged twice.)"""
    from dataclasses import replace

    from stitchml.plan.devices import DEVICES
    from stitchml.tools import calibrate as cal
    eff = {"pointwise": 0.9, "row_persistent": 0.85, "packed_rows": 0.8, "row_looped": 0.7, "combine": 0.75}
    truth = replace(DEVICES["H200"], loop_wait_s=0.3e-6, form_efficiency=tuple(sorted(eff.items())))
    monkeypatch.setattr(cal, "_run_stitched", _planned_run(truth))
    got = cal.measure_forms(replace(truth, form_efficiency=()), device="meta")
    assert set(got) == set(eff)
    for form, e in eff.items():
        assert got[form]["efficiency"] == pytest.approx(e, rel=1e-6), (form, got[form])


def test_the_global_scheme_is_calibrated_on_a_plan_that_has_a_global_group(monkeypatch):
    """`calibrate.measure_global` reads the global scheme's efficiency from the model's
    time of the plan it timed (barriers, launches and latencies not slowed by it) and
    gives back the efficiency of a device whose global scheme runs at 0.6; a plan with
    no global group measures nothing and says so (it used to report the separate
    launches' speed as the scheme's)."""
    from dataclasses import replace

    from stitchml.plan.devices import DEVICES
    from stitchml.tools import calibrate as cal
    forms = (("combine", 0.9), ("packed_rows", 0.8), ("pointwise", 0.95), ("row_looped", 0.7))
    truth = replace(DEVICES["H200"], barrier_s=1.0e-6, form_efficiency=forms + (("global", 0.6),))
    gelu_colsum = {"gelu_colsum": cal._global_cases("meta")["gelu_colsum"]}
    monkeypatch.setattr(cal, "_global_cases", lambda device: gelu_colsum)
    monkeypatch.setattr(cal, "_run_stitched", _planned_run(truth))
    got = cal.measure_global(replace(truth, form_efficiency=forms), device="meta")["gelu_colsum"]
    assert got["kernels"] == 2 and got["efficiency"] == pytest.approx(0.6, rel=1e-6), got
    run = _planned_run(truth)   # a planner that declines the scheme (as a calibrated one may)
    monkeypatch.setattr(cal, "_run_stitched", lambda fn, inputs, **knobs: run(fn, inputs,
                                                                             **{**knobs, "global_barriers": False}))
    got = cal.measure_global(replace(truth, form_efficiency=forms), device="meta")["gelu_colsum"]
    assert "efficiency" not in got and "no global group" in got["error"], got


@pytest.mark.parametrize("cols,waits", [(768, 1), (3072, 9)])
def test_combines_read_every_partial_in_the_same_unrolled_steps(cols, waits):
    """A combine reads all its reductions' partial rows in one walk of steps, unrolled
    (`tl.static_range`: every load in flight at once) where steps x reductions is at
    most `COMBINE_UNROLL_LOADS` — a layer norm's weight and bias gradients over 768
    columns: 3 steps of 128 partial rows; over 3072 columns, 9 steps of 32 each, two
    reductions: 18 loads, rolled — and the cost model charges one memory latency or one a
    step; the results against float64 under the interpreter."""
    from stitchml.codegen.triton_kernel import COMBINE_UNROLL_LOADS, combine_waits, generate
    from stitchml.plan.cost import walk_latency
    from stitchml.plan.devices import get_device
    from stitchml.testing import compare_against_float64
    dev = get_device("H200")
    plan = plan_on("H200", _ln_backward, (2048, cols), (cols,), (cols,), (2048, cols), dtype=torch.bfloat16)
    (comb,) = [k for k in plan.kernels if k.mapping.form == "combine"]
    steps = -(-comb.domain.shape[0] // comb.mapping.block_r)
    assert len(comb.dominant) == 2 and combine_waits(comb) == waits
    assert (steps * 2 <= COMBINE_UNROLL_LOADS) == (waits == 1)
    src = generate(plan.graph, comb).source
    loops = [x for x in src.splitlines() if x.strip().startswith("for ")]
    assert len(loops) == 1 and ("tl.static_range" in loops[0]) == (waits == 1), src
    assert walk_latency(comb, 1e-6, dev) == pytest.approx(1e-6 + waits * dev.mem_latency_s)
    with config.override(device="H200"):
        torch._dynamo.reset()
        x = torch.randn(300, cols).requires_grad_()
        w = (torch.rand(cols) + 0.5).requires_grad_()
        b = torch.randn(cols).requires_grad_()
        cmp, judgement = compare_against_float64(lambda x, w, b: F.layer_norm(x, (cols,), w, b), [x, w, b])
        judgement.assert_ok(f"layer norm over {cols} columns, forward and backward")
        assert any(k.mapping.form == "combine" for r in cmp.backend.records if r.plan for k in r.plan.kernels)


def test_prefetch_only_where_the_registers_it_holds_leave_the_walk_its_programs():
    """Prefetch keeps a block's row loads live a step longer.  Walks of 16-warp programs
    (two an SM: 64 registers a thread) went from 62-64 to 82-93 registers on sm_90, so
    only one program an SM fit and the grid ran in two rounds; 8-warp walks over 8192
    float32 columns from 106-128 to 156-184: neither is prefetched.  BERT-shaped walks (4
    warps) and their float32 twins (8 warps, 2048-element tiles) are, and 4-warp walks may hold twice the bytes."""
    from stitchml.plan.planner import PREFETCH_MAX_BYTES, PREFETCH_MAX_WARPS_PER_SM

    def walk(rows, cols, dtype):
        plan = plan_on("H200", _ln_backward, (rows, cols), (cols,), (cols,), (rows, cols), dtype=dtype)
        (k,) = [k for k in plan.kernels if k.partials and k.mapping.row_blocks > 1]
        return k

    with config.override(narrow_walks=False):   # (the planned tiles as they come: below, narrowed)
        wide = walk(32768, 1024, torch.bfloat16)   # layer_norm_bwd N=1024: 16-warp tiles
    assert wide.mapping.num_warps * 2 > PREFETCH_MAX_WARPS_PER_SM and not wide.prefetch
    assert "no prefetch" in wide.walk_note and "warps an SM" in wide.walk_note
    long_fp32 = walk(6710, 5000, torch.float32)   # layer_norm_bwd N=5000: 8192-column tiles
    held = 2 * 4 * long_fp32.mapping.block_r * long_fp32.mapping.block_c / (long_fp32.mapping.num_warps * 32)
    assert long_fp32.mapping.num_warps == 8 and held > PREFETCH_MAX_BYTES and not long_fp32.prefetch
    assert walk(6710, 5000, torch.bfloat16).prefetch   # (4 warps: twice the bytes, 255 registers)
    for dtype in (torch.bfloat16, torch.float32):
        k = walk(2048, 768, dtype)
        assert k.prefetch and k.mapping.num_warps * 2 <= PREFETCH_MAX_WARPS_PER_SM


def test_walks_too_wide_to_prefetch_are_planned_narrower_where_the_model_prices_it_lower():
    """Knob `narrow_walks`: a walk of 16-warp tiles two an SM cannot hold the next block's
    loads (64 registers a thread), so the planner prices the same walk at half the warps and
    half the rows a tile (`mapping.narrower_walk`: each thread keeps its elements), or, for
    one-row tiles, at one program an SM (`mapping.fewer_walkers`), prefetched, and takes it
    where the model says it is faster; explain's note says so.  sm_90 (Triton 3.6): the
    narrowed [2, 1024] walks of layer/RMS norm backward 64-95 registers, the one-program
    [1, 4096] walks 63-100: every program resident (bench/NOTES.md, forty-ninth session)."""
    from stitchml.plan.planner import PREFETCH_MAX_WARPS_PER_SM

    def walk(rows, cols, dtype, **knobs):
        plan = plan_on("H200", _ln_backward, (rows, cols), (cols,), (cols,), (rows, cols), dtype=dtype, **knobs)
        (k,) = [k for k in plan.kernels if k.partials and k.mapping.row_blocks > 1]
        return k, plan

    for dtype in (torch.bfloat16, torch.float32):
        (old, old_plan), (new, new_plan) = (walk(32768, 1024, dtype, narrow_walks=False),
                                            walk(32768, 1024, dtype))
        assert (old.mapping.num_warps, old.mapping.block_r, old.mapping.grid) == (16, 4, 264) and not old.prefetch
        m = new.mapping
        assert (m.num_warps, m.block_r, m.block_c, m.grid) == (8, 2, 1024, 264) and new.prefetch, m
        assert m.row_blocks == -(-32768 // 2 // 264)   # twice the blocks a program
        assert m.num_warps * -(-m.grid // 132) <= PREFETCH_MAX_WARPS_PER_SM
        assert new.predicted_s < old.predicted_s and new_plan.predicted_s < old_plan.predicted_s
        assert "planned at 8 warps, [2, 1024] tiles" in new.walk_note and "narrow_walks" in new.walk_note
        (one_old, _), (one, _) = walk(8192, 4096, dtype, narrow_walks=False), walk(8192, 4096, dtype)
        assert one_old.mapping.block_r == 1 and one_old.mapping.grid == 264 and not one_old.prefetch
        assert (one.mapping.num_warps, one.mapping.block_r, one.mapping.grid) == (16, 1, 132) and one.prefetch
        assert one.mapping.row_blocks == 8192 // 132 + 1 and "at 132 programs" in one.walk_note
        # without prefetch nothing is narrowed (the narrower walk is only worth its prefetch)
        plain, _ = walk(32768, 1024, dtype, prefetch_rows=False)
        assert plain.mapping == old.mapping and not plain.prefetch
    # walks that prefetch as they are keep their tiles (BERT's 2048 tokens: 4-warp column lanes)
    bert, _ = walk(2048, 768, torch.bfloat16)
    assert bert.prefetch and not bert.walk_note


@pytest.mark.parametrize("rows,cols,dtype", [(141, 1024, torch.bfloat16), (37, 4096, torch.float32)])
def test_narrowed_walks_match_float64(rows, cols, dtype, h200_cut):
    """Planned for the H200 cut to 12 SMs (141 rows of 1024: [2, 1024] tiles at 8 warps, 24
    programs walking 3 blocks, the last ragged, column lanes off: so few rows walk at most 4
    blocks of the 16-warp tile, which takes column lanes by default; 37 rows of 4096: one-row
    tiles, 12 programs walking 4 blocks), a layer norm forward and backward and an RMS norm's
    backward run under the interpreter against float64, outputs poisoned; the walks carry
    the hoisted loads."""
    from stitchml.testing import compare_against_float64
    with config.override(device="H200", partial_column_warps=False):
        for name, fn, args in (
                ("layer norm", lambda x, w, b: F.layer_norm(x, (cols,), w, b),
                 lambda: [torch.randn(rows, cols).to(dtype).requires_grad_(),
                          (torch.rand(cols) + 0.5).to(dtype).requires_grad_(),
                          torch.randn(cols).to(dtype).requires_grad_()]),
                ("RMS norm", lambda x, w: F.rms_norm(x, (cols,), w, 1e-6),
                 lambda: [torch.randn(rows, cols).to(dtype).requires_grad_(),
                          (torch.rand(cols) + 0.5).to(dtype).requires_grad_()])):
            torch._dynamo.reset()
            cmp, judgement = compare_against_float64(fn, args())
            judgement.assert_ok(f"{name} over [{rows} x {cols}] {dtype}, narrowed walk")
            walks = [(k, r.kernels[k.name].source) for r in cmp.backend.records if r.plan
                     for k in r.plan.kernels if k.walks_rows]
            assert walks and all(k.prefetch and "pf0 = tl.load" in src for k, src in walks), walks
            want = (8, 2, h200_cut) if cols == 1024 else (16, 1, h200_cut // 2)
            assert {(k.mapping.num_warps, k.mapping.block_r, k.mapping.grid) for k, _ in walks} == {want}
            from stitchml.tools.explain import Report   # explain says why the walk has these tiles
            text = Report(cmp.backend.records).to_text()
            want_note = ("planned at 8 warps, [2, 1024] tiles" if cols == 1024
                         else f"planned at {h200_cut // 2} programs")
            assert want_note in text


AOT_NARROW = '''
import json, sys, torch
sys.path.insert(0, "tests")
from stitchml import config
from stitchml.tools.aot_check import check_plan
from test_prefetch import _ln_backward
out = {}
for name, rows, cols, dtype in (("ln1024_bf16", 32768, 1024, torch.bfloat16),
                                ("ln1024_fp32", 32768, 1024, torch.float32),
                                ("ln4096_fp32", 8192, 4096, torch.float32)):
    args = [torch.empty(rows, cols, dtype=dtype), torch.empty(cols, dtype=dtype), torch.empty(cols, dtype=dtype),
            torch.empty(rows, cols, dtype=dtype)]
    with config.override(device="H200"):
        from stitchml.plan.planner import build_plan
        from stitchml.lower.lower import lower
        from stitchml.capture.decomp import decomposition_table
        from torch.fx.experimental.proxy_tensor import make_fx
        plan = build_plan(lower(make_fx(_ln_backward, decomposition_table=decomposition_table(),
                                        tracing_mode="fake")(*args)))
    walks = {k.name: k for k in plan.kernels if k.walks_rows}
    out[name] = [dict(r.__dict__, prefetch=walks[r.kernel].prefetch) for r in check_plan(plan) if r.kernel in walks]
print(json.dumps(out))
'''


def test_narrowed_walks_compile_for_sm90_with_every_program_resident():
    """sm_90 (no GPU needed): the narrowed, prefetched walks of a layer norm's backward
    ([2, 1024] tiles at 8 warps, two programs an SM; one-row [1, 4096] tiles at 16 warps,
    one an SM) compile without spilling, and their registers leave every program of the
    grid resident at once (the reason `_prefetch_misfit` refuses the 16-warp walks: Triton
    3.6 gave them 82-93 registers prefetched, one program an SM where the grid needs two)."""
    from test_aot_gpu import _run_outside_interpreter
    res = _run_outside_interpreter(AOT_NARROW)
    for name, rs in res.items():
        assert rs, name
        for r in rs:
            assert r["ok"] and r["prefetch"] and r["spills"] == 0, (name, r)
            need = -(-r["grid"] // 132)
            assert r["registers"] * r["warps"] * 32 * need <= 65536, (name, r["registers"], r["warps"], need)


def _small_l2(monkeypatch, kib: int = 256):
    """The H200 with a small L2, so that rows of 20000 float32 values re-read by every pass
    would miss it and the planner walks them on a persistent grid (`mapping.persistent_looped`)
    at test sizes."""
    from dataclasses import replace

    from stitchml.plan import devices
    monkeypatch.setitem(devices.DEVICES, "H200", replace(devices.DEVICES["H200"], l2_bytes=kib * 1024))


def test_persistent_looped_walks_issue_each_column_blocks_loads_a_block_ahead(monkeypatch):
    """Knob `prefetch_columns`: a row-looped kernel on a persistent grid (one program an SM
    walking rows, each pass over a row a loop of column blocks) prefetches in every loop:
    the next block's loads issued first, clamped to the last block; column-partial kernels
    and two 16-warp programs an SM do not (their registers: `planner.COLUMN_PREFETCH_MAX_ELEMS`);
    the knob off, no kernel does.  The cost model prices the loops' waits either way
    (`cost.loop_latency`)."""
    from stitchml.codegen import generate_all
    from stitchml.plan.cost import memory_seconds
    from stitchml.plan.devices import get_device
    _small_l2(monkeypatch)
    on = plan_on("H200", lambda x: torch.softmax(x, -1), (300, 20000), dtype=torch.float32)
    off = plan_on("H200", lambda x: torch.softmax(x, -1), (300, 20000), dtype=torch.float32, prefetch_columns=False)
    (k,) = [k for k in on.kernels if k.mapping.form == "row_looped"]
    assert k.mapping.row_blocks > 1 and k.mapping.grid == 132 and k.prefetch, k.mapping
    src = generate_all(on.graph, on)[k.name].source
    # the max-and-sum pass and the output pass: each a loop over the two whole blocks
    # (prefetched, clamped to the last whole one) and one over the partial block (`column_tail`)
    assert src.count("cbase_pf = tl.full([], 0, tl.int32)") == 2
    assert src.count("cbase_pf = tl.minimum(cbase + 8192, 8192)") == 2
    assert src.count("for cbase in range(16384, 20000, 8192):") == 2
    assert not any(k.prefetch for k in off.kernels)
    assert "cbase_pf" not in generate_all(off.graph, off)[off.kernels[0].name].source
    assert [k.mapping for k in on.kernels] == [k.mapping for k in off.kernels]
    # 300 rows over 132 programs (3 rows each), two passes of three column blocks a row
    (k_off,) = [k for k in off.kernels if k.mapping.form == "row_looped"]
    assert k.loop_waits == k_off.loop_waits == 3 * 2 * 3
    dev = get_device("H200")
    mem = memory_seconds(k, dev)
    assert k.predicted_s == pytest.approx(dev.launch_s + max(mem, 18 * dev.mem_latency_s))
    assert k_off.predicted_s == pytest.approx(dev.launch_s + mem + 18 * dev.loop_wait_s)
    # a looped kernel with column partials (an RMS norm's backward over long rows) keeps its loops
    def rms_backward(x, w, g):
        x, w = (t.detach().requires_grad_() for t in (x, w))
        return torch.autograd.grad(F.rms_norm(x, (20000,), w, 1e-6), (x, w), g)
    rms = plan_on("H200", rms_backward, (3000, 20000), (20000,), (3000, 20000), dtype=torch.float32)
    assert any(k.mapping.form == "row_looped" and k.partials for k in rms.kernels)
    assert not any(k.prefetch for k in rms.kernels if k.mapping.form == "row_looped" and k.partials)


@pytest.mark.parametrize("name", ["softmax", "layer_norm"])
def test_prefetched_column_loops_match_float64(monkeypatch, name, h200_cut):
    """The persistent looped kernels with prefetched column loops (a softmax, a layer norm:
    forward and backward) under the interpreter against float64, outputs poisoned, on the
    H200 cut to 12 SMs: 28 rows over 12 programs (2-3 each, as 300 over 132), rows of
    20000 walk two whole 8192-column blocks (the second's prefetch clamped to it) and a
    partial one."""
    from stitchml.testing import compare_against_float64
    _small_l2(monkeypatch)
    with config.override(device="H200"):
        torch._dynamo.reset()
        x = torch.randn(28, 20000, requires_grad=True)
        if name == "softmax":
            cmp, judgement = compare_against_float64(lambda x: torch.softmax(x, -1), [x])
        else:
            w, b = (torch.rand(20000) + 0.5).requires_grad_(), torch.randn(20000).requires_grad_()
            cmp, judgement = compare_against_float64(lambda x, w, b: F.layer_norm(x, (20000,), w, b), [x, w, b])
        judgement.assert_ok(f"{name} over rows of 20000, prefetched column loops")
        looped = [(k, r.kernels[k.name].source) for r in cmp.backend.records if r.plan for k in r.plan.kernels
                  if k.mapping.form == "row_looped" and k.prefetch]
        assert looped and all("cbase_pf" in src for _, src in looped), looped
        from stitchml.tools.explain import Report
        assert "each loop over a row's column blocks issues the next block's loads" in Report(
            cmp.backend.records).to_text()


AOT_COLUMNS = '''
import json, torch
from stitchml.tools.aot_check import check
out = {}
for name, fn in (("softmax", lambda x: torch.softmax(x, -1)),
                 ("layer_norm", lambda x: torch.nn.functional.layer_norm(x, (32768,)))):
    res = check(fn, torch.empty(1024, 32768), device="H200")
    out[name] = [r.__dict__ for r in res]
print(json.dumps(out))
'''


def test_prefetched_column_loops_compile_for_sm90():
    """sm_90 (no GPU needed): the persistent looped kernels of rows of 32768 float32 values
    (132 programs of 16 warps, one an SM), their column loops prefetched, compile without
    spilling and within the 128 registers a thread one program an SM leaves (Triton 3.6:
    104-128); the interpreter checks neither types nor registers."""
    from test_aot_gpu import _run_outside_interpreter
    res = _run_outside_interpreter(AOT_COLUMNS)
    for name, rs in res.items():
        assert rs and all(r["ok"] and r["spills"] == 0 and r["registers"] <= 128 for r in rs), (name, rs)


def test_aot_check_reports_programs_resident_against_programs_needed():
    """`aot_check`'s `programs an SM` column: a 264-program walk of 16-warp programs at 93
    registers (prefetched, as the forty-eighth session found) fits one an SM where its grid
    needs two: flagged; at 64 registers it fits; a grid of thousands of programs runs in
    waves by design: never flagged."""
    from stitchml.tools.aot_check import AotResult, residency
    walk = AotResult("k0", True, registers=93, warps=16, grid=264)
    assert residency(walk, 132) == "1/2 !"
    assert residency(AotResult("k0", True, registers=64, warps=16, grid=264), 132) == "2/2"
    assert residency(AotResult("k1", True, registers=95, warps=8, grid=264), 132) == "2/2"
    assert residency(AotResult("k2", True, registers=98, warps=16, grid=1024), 132) == "1/8"
    assert residency(AotResult("k3", False, error="x"), 132) == ""


def _layer_norm(x, w, b):
    return F.layer_norm(x, (x.shape[-1],), w, b)


def test_looped_rows_on_a_capped_grid_are_priced_a_wait_per_column_block():
    """A layer norm over rows of 32768 bfloat16 values (H200: a persistent grid of 264
    programs, each walking 4 rows in three passes of 4 column blocks) waits 48 times a
    program; its price is the bytes' time plus 48 waits, and prefetched (float32: one
    program an SM, 8 rows) the longer of its bytes and 96 full latencies.  More programs
    than one round of two an SM (the same rows planned without the persistent grid) are
    not priced a wait."""
    from stitchml.plan.cost import loop_latency, memory_seconds
    from stitchml.plan.devices import get_device
    dev = get_device("H200")
    plan = plan_on("H200", _layer_norm, (1024, 32768), (32768,), (32768,), dtype=torch.bfloat16)
    (k,) = plan.kernels
    m = k.mapping
    assert (m.form, m.block_c, m.row_blocks, m.grid, k.prefetch) == ("row_looped", 8192, 4, 264, False)
    assert k.loop_waits == 4 * 3 * 4
    mem = memory_seconds(k, dev)
    assert k.predicted_s == pytest.approx(dev.launch_s + mem + 48 * dev.loop_wait_s)
    fp32 = plan_on("H200", _layer_norm, (1056, 32768), (32768,), (32768,), dtype=torch.float32)
    (k32,) = fp32.kernels
    assert (k32.mapping.grid, k32.mapping.row_blocks, k32.prefetch, k32.loop_waits) == (132, 8, True, 96)
    mem32 = memory_seconds(k32, dev)
    assert loop_latency(k32, mem32, dev) == pytest.approx(max(mem32, 96 * dev.mem_latency_s))
    many = plan_on("H200", _layer_norm, (1024, 32768), (32768,), (32768,), dtype=torch.bfloat16,
                   persistent_rows=False)
    (kn,) = many.kernels
    assert kn.mapping.grid == 1024 and kn.loop_waits == 3 * 32768 // kn.mapping.block_c
    assert kn.predicted_s == pytest.approx(dev.launch_s + memory_seconds(kn, dev))
