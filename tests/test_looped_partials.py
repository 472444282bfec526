"""Column partials in row-looped kernels (issue 13, long-row norm backward): beside rows
too long for the chip, a column reduction computed in a row kernel (a norm's weight
gradient, sum over rows of g * xhat) is taken in that kernel's last loop as one partial
row per program of several rows, then combined, instead of the product going to memory
and a column-sum kernel reading it back.  Interpreter tier (knobs make short rows loop)
and plan tier (full-size H100 plans, no kernel run)."""
import sys

import pytest
import torch
import torch.nn.functional as F

from stitchml import config
from stitchml.plan.devices import get_device
from stitchml.plan.mapping import partials_fit
from stitchml.plan.options import PlanOptions
from stitchml.testing import compare_against_float64, compare_with_eager

sys.path.insert(0, "tests")
from planning import plan_of  # noqa: E402

LOOPED = dict(persistent_max_cols=16, loop_block_cols=32)   # rows of 50 loop over 2 blocks


def layer_norm(x, w, b):
    return F.layer_norm(x, (x.shape[-1],), w, b, 1e-5)


def rms_norm(x, w):
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6)).to(x.dtype) * w


def _inputs(fn, dtype, rows=37, cols=50):
    x = (torch.randn(rows, cols) * 2 + 0.5).to(dtype).requires_grad_()
    w = (torch.randn(cols) * 0.1 + 1).to(dtype).requires_grad_()
    b = torch.randn(cols).to(dtype).requires_grad_()
    return [x, w, b] if fn is layer_norm else [x, w]


def _backward_kernels(c):
    (bwd,) = [r for r in c.backend.records if r.kind == "backward"]
    return bwd.plan.kernels


@pytest.mark.parametrize("fn, dtype", [(layer_norm, torch.float32), (rms_norm, torch.float32),
                                       (rms_norm, torch.bfloat16)], ids=["layer_norm-fp32", "rms_norm-fp32", "rms_norm-bf16"])
def test_norm_backward_takes_weight_gradient_partials_in_its_looped_kernel(fn, dtype):
    with config.override(**LOOPED):
        if dtype == torch.bfloat16:
            c, verdict = compare_against_float64(fn, _inputs(fn, dtype))
            verdict.assert_ok(fn.__name__)
        else:
            c = compare_with_eager(fn, _inputs(fn, dtype))
    ks = _backward_kernels(c)
    looped = [k for k in ks if k.mapping.form == "row_looped" and k.partials]
    assert len(looped) == 1 and looped[0].mapping.block_r > 1, [k.mapping.describe() for k in ks]
    k = looped[0]
    assert any(c.combine_of == k.name for c in ks)
    # the summed product never goes to memory: the input gradient is the kernel's one
    # [rows, cols] output
    g = [r for r in c.backend.records if r.kind == "backward"][0].plan.graph
    assert len([o for o in k.outputs if g[o].numel == 37 * 50]) == 1


def test_bf16_layer_norm_weight_gradient_reads_its_sources_instead():
    """bfloat16 layer norm: dy * xhat is a chain of two bfloat16 inputs (and the per-row
    mean and rstd) as wide as its float32 result, so the column kernel computes it from
    dy and x (`graph_view.recompute_cheap`) rather than the row kernel storing partials;
    the weight and bias gradients share that kernel (both read dy), and the row kernel
    writes dx alone."""
    with config.override(**LOOPED):
        c, verdict = compare_against_float64(layer_norm, _inputs(layer_norm, torch.bfloat16))
    verdict.assert_ok("layer_norm")
    ks = _backward_kernels(c)
    g = [r for r in c.backend.records if r.kind == "backward"][0].plan.graph
    assert not any(k.partials for k in ks)
    column = [k for k in ks if any(g[o].numel == 50 for o in k.outputs)]
    assert len(column) == 1 and len([o for o in column[0].outputs if g[o].numel == 50]) == 2
    assert [g[o].dtype for k in ks for o in k.outputs if g[o].numel == 37 * 50] == [torch.bfloat16]


@pytest.mark.parametrize("fn", [layer_norm, rms_norm], ids=["layer_norm", "rms_norm"])
def test_the_knob_off_gives_the_separate_column_kernels(fn):
    with config.override(**LOOPED, looped_partials=False):
        c_off = compare_with_eager(fn, _inputs(fn, torch.float32))
    with config.override(**LOOPED):
        c_on = compare_with_eager(fn, _inputs(fn, torch.float32))
    off, on = _backward_kernels(c_off), _backward_kernels(c_on)
    assert not any(k.partials for k in off)
    # the weight-gradient column kernel is gone (a combine of partials in its place)
    assert sum(1 for k in on if not k.combine_of) < sum(1 for k in off if not k.combine_of)


@pytest.mark.parametrize("barriers", [True, False], ids=["global", "separate"])
def test_sum_and_max_partials_beside_row_outputs_in_one_last_loop(barriers):
    """Column sum and max of a row-computed value, and the value itself, all written by the
    looped kernel's last loop: outputs poisoned, forward only; the kernel and its combine
    as phases of one launch (grid barrier, the looped phase walking virtual program ids)
    or as two launches."""
    def fn(x, w):
        y = (x - x.mean(-1, keepdim=True)) * w
        return y.sum(0), y.amax(0), y * 2
    x, w = torch.randn(41, 70), torch.randn(70)
    with config.override(**LOOPED, global_barriers=barriers):
        c = compare_with_eager(fn, [x, w], backward=False)
    plan = c.backend.records[0].plan
    k, comb = plan.kernels
    assert k.mapping.form == "row_looped" and len(k.partials) == 2 and k.mapping.block_r > 1
    assert comb.combine_of == k.name
    assert c.num_kernels == (1 if barriers else 2) and [g.kind for g in plan.groups] == (["global"] if barriers else [])


def test_a_lone_column_sum_of_long_rows_stays_a_reduction_of_its_own():
    """Nothing row-wise beside it: partials would only add bytes."""
    with config.override(**LOOPED):
        plan = plan_of(lambda x: (x * 2).sum(0), torch.randn(37, 50))
        c = compare_with_eager(lambda x: (x * 2).sum(0), [torch.randn(37, 50)], backward=False)
    assert not any(k.partials for k in plan.kernels)
    assert c.num_kernels == 1


def test_partials_need_rows_for_the_machine_and_static_shapes():
    opts = PlanOptions.from_config(get_device("H100"))
    assert partials_fit(1024, 4096, opts)                     # on chip: always
    assert partials_fit(1024, 32768, opts)                    # 1024 rows >= 4 x 132
    assert not partials_fit(128, 262144, opts)                # too few rows: the split form's case
    assert not partials_fit(1024, 32768, PlanOptions.from_config(get_device("H100"), fixed_row_blocks=True))
    assert not partials_fit(1024, 32768, PlanOptions.from_config(get_device("H100"), looped_partials=False))


def _plans_for(case: str, dtype: str, **changes):
    """The backward plans of a micro case at full size for the H100 (meta tensors)."""
    from stitchml.bench.micro import cases
    from stitchml.tools import predict
    (spec,) = [s for s in cases(quick=False) if s.name == case]
    with config.override(**changes):
        pred, plans = predict.case_plans(spec, dtype, PlanOptions.from_config(get_device("H100")))
    return pred, plans[-1]


def test_full_size_rms_norm_backward_moves_a_third_fewer_bytes():
    """[1024, 32768] bfloat16 on the H100, rows not walked (`walk_looped_partials` off): four
    rows per program (256 programs, two per SM at most), and the modelled bytes drop from ~431 to ~364 MB: without partials a
    column kernel reads dy and x again for the weight gradient (and before cheap chains
    were recomputed, 565 MB: the float32 product written and read back).  Both with a
    program a row (`persistent_rows` off): with a persistent grid the model has the
    separate kernels' re-reads hit L2 (336 MB), which the partials plan does not try."""
    on, plan = _plans_for("rms_norm_bwd[N=32768]", "bf16", persistent_rows=False, walk_looped_partials="off")
    off, _ = _plans_for("rms_norm_bwd[N=32768]", "bf16", looped_partials=False, persistent_rows=False)
    (k,) = [k for k in plan.kernels if k.partials]
    assert (k.mapping.form, k.mapping.block_r, k.mapping.grid) == ("row_looped", 4, 256)
    assert on.modelled_bytes < 0.86 * off.modelled_bytes and on.predicted_s < off.predicted_s


def ln_backward_by_hand(x, w, dy):
    """A layer norm's backward written out (forward graph: plans like a backward one)."""
    xf = x.float()
    mean = xf.mean(-1, keepdim=True)
    rstd = torch.rsqrt(xf.var(-1, unbiased=False, keepdim=True) + 1e-5)
    xhat = (xf - mean) * rstd
    g = dy.float() * w.float()
    dx = rstd * (g - g.mean(-1, keepdim=True) - xhat * (g * xhat).mean(-1, keepdim=True))
    return dx.to(x.dtype), (dy.float() * xhat).sum(0).to(x.dtype), dy.float().sum(0).to(x.dtype)


AOT_SCRIPT = '''
import json, torch
from stitchml.tools.aot_check import check
import sys
sys.path.insert(0, "tests")
from test_looped_partials import ln_backward_by_hand
bf = torch.bfloat16
r = check(ln_backward_by_hand, torch.randn(1024, 32768, dtype=bf), torch.randn(32768, dtype=bf),
          torch.randn(1024, 32768, dtype=bf))
print(json.dumps([x.__dict__ for x in r]))
'''


def test_looped_partial_kernels_compile_for_sm90():
    """At full size for the H100 the hand-written backward plans a looped kernel with
    column partials walking its rows (and the global phases around it); every kernel
    compiles for sm_90 without spilling past the register file."""
    from test_aot_gpu import _run_outside_interpreter
    meta = [torch.empty(1024, 32768, dtype=torch.bfloat16, device="meta"),
            torch.empty(32768, dtype=torch.bfloat16, device="meta"),
            torch.empty(1024, 32768, dtype=torch.bfloat16, device="meta")]
    with config.override(device="H100"):
        plan = plan_of(ln_backward_by_hand, *meta)
    assert any(k.partials and k.mapping.form == "row_looped" and k.mapping.row_blocks > 1 for k in plan.kernels)
    results = _run_outside_interpreter(AOT_SCRIPT)
    assert len(results) >= 2
    failed = [(r["kernel"], r["error"]) for r in results if not r["ok"]]
    assert not failed, failed
    assert all(r["registers"] is None or r["registers"] <= 255 for r in results), results


def test_layer_norm_bias_gradient_joins_the_looped_kernel_in_float32():
    """The bias gradient (sum over rows of dy, dy a graph input) is one more partial of the
    looped kernel that reads dy for dx and the weight gradient: dy is read once, and the
    backward is that kernel and its combine (float32: 8 bytes of partials a column per R
    rows against 4 bytes of dy re-read a row)."""
    with config.override(**LOOPED):
        c = compare_with_eager(layer_norm, _inputs(layer_norm, torch.float32))
    ks = _backward_kernels(c)
    (k,) = [k for k in ks if k.partials]
    assert len(k.partials) == 2 and k.mapping.form == "row_looped"
    assert [x.name for x in ks if not x.combine_of] == [k.name], [x.mapping.describe() for x in ks]


def test_full_size_bias_gradient_partial_where_it_saves_bytes():
    """[1024, 32768] float32 on the H100 (R = 4): the bias gradient joins the looped
    kernel (-67 MB, one launch fewer).  (bfloat16 has no partials at all: both column
    sums read dy and x in a kernel of their own, `test_bf16_layer_norm_weight_gradient_*`.)"""
    fp32, plan32 = _plans_for("layer_norm_bwd[N=32768]", "fp32")
    bf16, plan16 = _plans_for("layer_norm_bwd[N=32768]", "bf16")
    assert [len(k.partials) for k in plan32.kernels if k.partials] == [2]
    assert len([k for k in plan32.kernels if not k.combine_of]) == 1
    assert not any(k.partials for k in plan16.kernels)
    assert fp32.modelled_bytes < 780e6 and bf16.modelled_bytes < 435e6


def _transposed_bias_grad(x, s):
    # x is [cols, rows] in memory: read as [rows, cols] it is transposed (unit stride
    # along the rows), like a key-gradient merged back to [tokens, hidden]
    y = x.t() * s
    return y * 2, y.sum(0)


@pytest.mark.parametrize("dtype, rows_per_tile", [(torch.float32, 8), (torch.bfloat16, 16)], ids=["fp32", "bf16"])
def test_a_transposed_read_beside_column_partials_gets_taller_tiles(dtype, rows_per_tile):
    """The access probe (plan/access.py) sees the transposed read; the kernel takes tiles
    of 32 bytes' worth of rows (8 float32, 16 bfloat16) instead of 4 whole rows; its 70
    columns fit one block, so each program walks row blocks, as whole-row partial tiles do
    (not a program a tile: `test_transposed_tiles_of_few_columns_walk_row_blocks`);
    results equal eager's (outputs poisoned), and explain says why."""
    x, s = torch.randn(70, 30).to(dtype), torch.tensor(0.5).to(dtype)   # 30 rows: 4 programs on the CPU entry
    c = compare_with_eager(_transposed_bias_grad, [x, s], backward=False,
                           rtol=1e-2 if dtype == torch.bfloat16 else None,
                           atol=1e-2 if dtype == torch.bfloat16 else None)
    plan = c.backend.records[0].plan
    (k,) = [k for k in plan.kernels if k.partials]
    assert k.mapping.form == "packed_rows" and k.mapping.block_r == rows_per_tile, k.mapping.describe()
    assert k.mapping.grid * k.mapping.row_blocks * rows_per_tile >= 30 and k.mapping.block_c >= 70
    assert k.transposed and all(plan.graph[r].numel == 70 * 30 for r in k.transposed)
    assert any(cb.combine_of == k.name for cb in plan.kernels)
    from stitchml.tools.explain import Report
    assert "transposed: " in Report(c.backend.records).to_text()


def test_transposed_tiles_knob_off_and_row_major_reads_keep_whole_rows():
    x, s = torch.randn(70, 45), torch.tensor(0.5)
    with config.override(transposed_tiles=False):
        plan = plan_of(_transposed_bias_grad, x, s)
    (k,) = [k for k in plan.kernels if k.partials]
    assert k.mapping.form == "packed_rows" and not k.transposed
    plan = plan_of(lambda x, s: ((x * s) * 2, (x * s).sum(0)), x.t().contiguous(), s)   # row-major: no change
    (k,) = [k for k in plan.kernels if k.partials]
    assert k.mapping.form == "packed_rows" and not k.transposed


def test_transposed_tiles_grow_where_rows_would_give_too_many_programs():
    """32768 rows read transposed: 8-row tiles would make 4096 programs, each writing a
    partial row (16 MB of partials for 1024 float32 columns); the tile grows to the
    looped form's 32 rows instead (plan for the H100, no kernel run)."""
    x, w = torch.randn(1024, 32768), torch.randn(1024)
    with config.override(device="H100"):
        plan = plan_of(lambda x, w: ((x.t() * w) * 2, (x.t() * w).sum(0)), x, w)
    (k,) = [k for k in plan.kernels if k.partials]
    assert k.transposed and k.mapping.form == "row_looped" and k.mapping.block_r == 32, k.mapping.describe()
    assert k.mapping.grid == 32768 // 32


def test_transposed_tiles_of_few_columns_walk_row_blocks():
    """A transposed read over many rows and few columns (ResNet-50's stem gradient, read
    [N, C, H, W]-contiguous inside a channels-last batch-norm backward: 401408 rows x 64
    channels): the tile of 16 bfloat16 rows holds every column, and its programs walk row
    blocks (at most 2 an SM) instead of one program a tile, which made 12544 programs, a
    6.4 MB partial buffer and a 26 µs combine (plan for the H200, no kernel run)."""
    x, w = torch.randn(64, 401408 // 64 * 2), torch.randn(64)
    x = x[:, : 401408 // 64 * 2].contiguous()
    with config.override(device="H200"):
        plan = plan_of(lambda x, w: ((x.t() * w) * 2, (x.t() * w).sum(0)), x.to(torch.bfloat16), w.to(torch.bfloat16))
    (k,) = [k for k in plan.kernels if k.partials]
    assert k.transposed and k.mapping.form == "packed_rows" and k.mapping.block_c == 64, k.mapping.describe()
    assert k.mapping.grid <= 2 * 132 and k.mapping.grid * k.mapping.row_blocks * k.mapping.block_r >= x.shape[1]
    (comb,) = [c for c in plan.kernels if c.combine_of == k.name]
    assert comb.domain.rows == k.mapping.grid


@pytest.mark.parametrize("dtype, cols", [("bf16", 2048), ("fp32", 1024)])
def test_looped_partial_tiles_keep_each_rows_columns_in_one_thread(dtype, cols):
    """[1024, 32768] on the H100: the partial kernel's 4 rows of a column block sit in each
    thread, its 8 warps side by side along 32 x 8 x (16 / itemsize) columns (one 16-byte
    vector a lane and row), so each block's partial row is summed in registers; the knob
    off keeps `looped_partial_elems` a tile ([4, 512], which Triton spread over warps
    along the rows)."""
    _, plan = _plans_for("rms_norm_bwd[N=32768]", dtype, walk_looped_partials="off")
    (k,) = [k for k in plan.kernels if k.partials and k.mapping.form == "row_looped"]
    m = k.mapping
    assert (m.block_r, m.block_c, m.num_warps) == (4, cols, 8)
    assert m.block_c == 32 * m.num_warps * 16 // {"bf16": 2, "fp32": 4}[dtype]
    _, off = _plans_for("rms_norm_bwd[N=32768]", dtype, partial_lanes=False, walk_looped_partials="off")
    (k,) = [k for k in off.kernels if k.partials and k.mapping.form == "row_looped"]
    assert (k.mapping.block_r, k.mapping.block_c) == (4, 512)


def test_partial_lanes_leave_tall_tiles_alone():
    """Many rows (32 a program): 32 rows of a 16-byte vector would be 256 values a thread
    per input, so the tile keeps its shape."""
    from stitchml.plan.mapping import Mapping, partial_lanes
    tall = Mapping("row_looped", 32, 64, 8, 256)
    assert partial_lanes(tall, 32768, 2) == tall
    short = Mapping("row_looped", 4, 512, 8, 256)
    assert partial_lanes(short, 32768, 2) == Mapping("row_looped", 4, 2048, 8, 256)
    assert partial_lanes(short, 300, 4) == Mapping("row_looped", 4, 512, 4, 256)   # 512 columns: 4 warps of 4-vectors


@pytest.mark.parametrize("fn, dtype", [(layer_norm, torch.float32), (rms_norm, torch.float32),
                                       (rms_norm, torch.bfloat16)], ids=["layer_norm-fp32", "rms_norm-fp32", "rms_norm-bf16"])
def test_norm_backward_with_rows_in_each_thread_matches_eager(fn, dtype):
    """16 rows of 50 on the cpu device: 4 rows a program (`looped_rows`), so the tile takes
    the lanes layout (a 64-column block here); gradients against eager (bfloat16 against a
    float64 run)."""
    inputs = _inputs(fn, dtype, rows=16)
    with config.override(**LOOPED):
        if dtype == torch.bfloat16:
            c, verdict = compare_against_float64(fn, inputs)
            verdict.assert_ok(fn.__name__)
        else:
            c = compare_with_eager(fn, inputs)
    (k,) = [k for k in _backward_kernels(c) if k.mapping.form == "row_looped" and k.partials]
    assert (k.mapping.block_r, k.mapping.block_c) == (4, 64), k.mapping.describe()
    assert any(c.combine_of == k.name for c in _backward_kernels(c))


@pytest.mark.parametrize("fn, dtype", [(layer_norm, torch.float32), (rms_norm, torch.float32),
                                       (rms_norm, torch.bfloat16)], ids=["layer_norm-fp32", "rms_norm-fp32", "rms_norm-bf16"])
def test_walked_rows_add_each_row_into_their_partial_row(fn, dtype):
    """Column partials of a looped kernel on a persistent grid (`mapping.walking_looped_partials`):
    each of the cpu device's 4 programs walks 9-10 of the 37 rows one at a time and adds
    each row's column block into its partial row (its first row stores: the partial
    buffer is not zeroed); the combine sums 4 partial rows.  Taken wherever it applies
    (`walk_looped_partials=on`): at these sizes the model prices it higher, as it does not
    at full size (`test_full_size_norm_backward_walks_its_rows`).  Gradients against eager
    (bfloat16 against a float64 run)."""
    inputs = _inputs(fn, dtype)
    with config.override(**LOOPED, walk_looped_partials="on"):
        if dtype == torch.bfloat16:
            c, verdict = compare_against_float64(fn, inputs)
            verdict.assert_ok(fn.__name__)
        else:
            c = compare_with_eager(fn, inputs)
    ks = _backward_kernels(c)
    (k,) = [k for k in ks if k.mapping.form == "row_looped" and k.partials]
    assert (k.mapping.block_r, k.mapping.grid, k.mapping.row_blocks) == (1, 4, 10), k.mapping.describe()
    (comb,) = [x for x in ks if x.combine_of == k.name]
    assert comb.domain.rows == 4
    assert len(ks) == 2   # the backward: the walked kernel and its combine


@pytest.mark.parametrize("barriers", [True, False], ids=["global", "separate"])
def test_walked_sum_and_max_partials_as_phases_or_launches(barriers):
    """A column sum and a column max walked and accumulated (the max through the same
    load, combine, store: its first row must not be maxed with the poisoned buffer), the
    row value written in the same last loop; as phases of one launch (the walk over
    virtual program ids) or two launches; outputs poisoned, forward only."""
    def fn(x, w):
        y = (x - x.mean(-1, keepdim=True)) * w
        return y.sum(0), y.amax(0), y * 2
    x, w = torch.randn(41, 70) - 3.0, torch.randn(70)   # (every column's max negative: a 0 start would win)
    with config.override(**LOOPED, global_barriers=barriers, walk_looped_partials="on"):
        c = compare_with_eager(fn, [x, w], backward=False)
    plan = c.backend.records[0].plan
    k, comb = plan.kernels
    assert k.mapping.form == "row_looped" and len(k.partials) == 2 and k.mapping.row_blocks > 1
    assert k.mapping.block_r == 1 and comb.combine_of == k.name and comb.domain.rows == k.mapping.grid
    assert c.num_kernels == (1 if barriers else 2) and [g.kind for g in plan.groups] == (["global"] if barriers else [])


@pytest.mark.parametrize("device", ["H100", "H200"])
@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
def test_full_size_norm_backward_walks_its_rows(device, dtype):
    """[1024, 32768] RMS norm backward at full size: 1024 rows in flight at once (a program
    every 4 rows) re-read x and dy from DRAM (2 x 128 MB against 50-60 MB of L2); one
    program an SM walking rows one at a time keeps them in L2 and writes 132 partial rows
    instead of 256.  The model prices the kernel and its combine lower (knob `auto`, the
    default), and the plan says why (`walk_note`); the knob off keeps a program every 4
    rows; at the interpreter's sizes `auto` keeps it too."""
    from stitchml.bench.micro import cases
    from stitchml.tools import predict
    (spec,) = [s for s in cases(quick=False) if s.name == "rms_norm_bwd[N=32768]"]
    opts = PlanOptions.from_config(get_device(device))
    on, plans = predict.case_plans(spec, dtype, opts)
    with config.override(walk_looped_partials="off"):
        off, plans_off = predict.case_plans(spec, dtype, PlanOptions.from_config(get_device(device)))
    (k,) = [k for k in plans[-1].kernels if k.partials]
    (k_off,) = [k for k in plans_off[-1].kernels if k.partials]
    assert (k.mapping.form, k.mapping.block_r, k.mapping.grid) == ("row_looped", 1, 132)
    assert k.mapping.row_blocks == 8 and "walk_looped_partials" in k.walk_note
    assert (k_off.mapping.block_r, k_off.mapping.grid, k_off.mapping.row_blocks) == (4, 256, 1)
    assert k.bytes_read < 0.75 * k_off.bytes_read and on.predicted_s < 0.8 * off.predicted_s
    with config.override(**LOOPED, device=device):
        small = plan_of(rms_norm_bwd_by_hand, torch.randn(600, 70), torch.randn(70), torch.randn(600, 70))
    (k,) = [k for k in small.kernels if k.partials]
    assert k.mapping.row_blocks == 1 and k.mapping.block_r > 1


def rms_norm_bwd_by_hand(x, w, dy):
    """An RMS norm's input and weight gradients written out (a forward graph)."""
    xf = x.float()
    rstd = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6)
    g = dy.float() * w.float()
    dx = rstd * (g - xf * rstd * rstd * (g * xf).mean(-1, keepdim=True))
    return dx.to(x.dtype), (dy.float() * xf * rstd).sum(0).to(x.dtype)
