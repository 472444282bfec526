"""Batch norm over a channels-last tensor (issue 18's ResNet-50 row): its statistics reduce
(N, H, W), the dims outermost in memory, and keep C, the innermost.  They are column
reductions of a [N*H*W, C] matrix whose rows are contiguous (knob `layout_columns`):
programs of whole channel rows walk row blocks and write partials, a combine sums them
and computes the per-channel epilogue (mean, rstd, running statistics: knob
`combine_epilogues`).  Before, each channel was a row reduction of its own whose programs
read one element of every 32-byte sector, C programs in all, and the cost model did not
see the sectors (`KernelPlan.sector_waste`).  Interpreter tier (fp32 against eager, bf16
against float64, outputs poisoned) and plan tier."""
import sys

import pytest
import torch
import torch.nn.functional as F

from stitchml import config
from stitchml.ir import nodes as ir
from stitchml.plan.grouping import outer_in_memory
from stitchml.testing import compare_against_float64, compare_with_eager

sys.path.insert(0, "tests")
from planning import plan_of  # noqa: E402


def bn_relu(x, w, b, rm, rv):
    # running statistics updated in place: the combine's epilogue writes them
    return F.relu(F.batch_norm(x, rm, rv, w, b, training=True, momentum=0.1, eps=1e-5))


def _inputs(dtype, shape=(5, 24, 7, 9), channels_last=True):
    n, c, h, w = shape
    x = torch.randn(shape) * 2 + 0.5
    if channels_last:
        x = x.to(memory_format=torch.channels_last)
    x = x.to(dtype).requires_grad_()
    weight = (torch.randn(c) * 0.1 + 1).to(dtype).requires_grad_()
    bias = torch.randn(c).to(dtype).requires_grad_()
    return [x, weight, bias, torch.randn(c).to(dtype), (torch.rand(c) + 0.5).to(dtype)]


def _bn_relu_checked(dtype, inputs, what, **knobs):
    """`bn_relu` compiled under `knobs`: against eager in float32, against float64 otherwise."""
    with config.override(**knobs):
        if dtype == torch.float32:
            return compare_with_eager(bn_relu, inputs)
        c, verdict = compare_against_float64(bn_relu, inputs)
        verdict.assert_ok(what)
        return c


def _records(c, kind):
    return [r for r in c.backend.records if r.kind == kind]


def _statistics_kernels(plan, channels):
    """Kernels that reduce over the channels-last input (domain of the input's shape)."""
    g = plan.graph
    return [k for k in plan.kernels if not k.combine_of and any(g[m].kind == ir.REDUCE for m in k.members)
            and len(k.domain.shape) == 4 and k.domain.shape[1] == channels]


def _node(shape, stride, dims):
    src = ir.Node(0, ir.INPUT, "x", (), tuple(shape), torch.float32, tuple(stride))
    return dims, src


def test_outer_in_memory_reads_the_layout_not_the_dim_order():
    nchw = (5, 24, 7, 9)
    cl = torch.empty(nchw).to(memory_format=torch.channels_last).stride()
    assert outer_in_memory(*_node(nchw, cl, (0, 2, 3)))                        # channels last: C innermost
    assert not outer_in_memory(*_node(nchw, torch.empty(nchw).stride(), (0, 2, 3)))   # NCHW: H, W inside C
    assert not outer_in_memory(*_node(nchw, cl, (0, 1)))                       # keeps H, W: not the inner block
    # kept dims in memory order but reduced ones out of order: not a plain [rows, cols] walk
    assert not outer_in_memory(*_node((4, 6, 8), (8, 32, 1), (0, 1)))
    assert not outer_in_memory(*_node((4, 6, 8), (48, 8, 1), (1,)))   # keeps dim 0, outside the reduced one


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_channels_last_batch_norm_statistics_are_column_partials(dtype):
    """Forward and backward of batch norm → ReLU on an odd-sized channels-last input, with
    running statistics, the forward's statistics as shifted sums (knob `bn_chunk_stats`
    off; the backward's are column sums either way): every statistics kernel walks
    contiguous channel rows (columns = C), none reduces a channel as its own row; the
    forward is 5 kernels (sum, combine, centred squares, combine + epilogue, normalise)
    and the backward 3 (two sums, their combine, the input gradient)."""
    inputs = _inputs(dtype)
    c = _bn_relu_checked(dtype, inputs, "batch norm", bn_chunk_stats=False)
    (fwd,), (bwd,) = _records(c, "forward"), _records(c, "backward")
    for rec in (fwd, bwd):
        stats = _statistics_kernels(rec.plan, 24)
        assert stats and all(k.domain.col_dims == (1,) and k.partials for k in stats), \
            [(k.domain.col_dims, k.mapping.describe()) for k in rec.plan.kernels]
        assert not any(k.sector_waste for k in rec.plan.kernels)
    # x - mean (float32, full size) is recomputed by the normalising kernel from x and the
    # written mean, not written by the variance's partial kernel (`_cheaper_recomputed`)
    g = fwd.plan.graph
    assert not any(g[o].numel == inputs[0].numel() for k in fwd.plan.kernels if k.partials
                   for o in k.outputs if o not in k.partials), [k.outputs for k in fwd.plan.kernels]
    # and in the backward, the ReLU's select of the gradient and its float32 cast are
    # recomputed by the dx kernel from the saved output and the gradient (3 bytes an
    # element in bf16) rather than written in float32 and read back (8)
    g = bwd.plan.graph
    assert dtype == torch.float32 or not any(g[o].numel == inputs[0].numel() and g[o].dtype == torch.float32
                                             for k in bwd.plan.kernels for o in k.outputs), bwd.plan.kernels
    assert len(fwd.plan.kernels) == 5, [k.mapping.describe() for k in fwd.plan.kernels]
    assert len(bwd.plan.kernels) == 3, [k.mapping.describe() for k in bwd.plan.kernels]
    # the per-channel work (rstd, running statistics) is the second combine's epilogue
    assert [bool(k.epilogue) for k in fwd.plan.kernels if k.combine_of] == [False, True]


def test_nchw_batch_norm_keeps_row_reductions():
    """An NCHW input's statistics are row reductions (H, W contiguous within a channel):
    no column partials there, and nothing changes for it."""
    c = compare_with_eager(bn_relu, _inputs(torch.float32, channels_last=False))
    (fwd,) = _records(c, "forward")
    stats = _statistics_kernels(fwd.plan, 24)
    assert stats and all(k.domain.col_dims == (0, 2, 3) and not k.partials for k in stats)


def test_knob_off_prices_the_sectors_of_a_channel_per_row():
    """`layout_columns` off: each channel is a row of the reduction, read with a stride of
    C elements; the plan prices the 32-byte sectors those reads move beyond their bytes
    (`sector_waste`), so its predicted time says what the layout costs (H200 plan of a
    ResNet stem's batch norm, no kernel run)."""
    shape = (32, 64, 112, 112)
    x = torch.empty(shape, dtype=torch.bfloat16).to(memory_format=torch.channels_last)
    w = torch.empty(64, dtype=torch.bfloat16)

    def fn(x, w, b):
        return F.relu(F.batch_norm(x, None, None, w, b, training=True, eps=1e-5))

    with config.override(device="H200", layout_columns=False):
        rows = plan_of(fn, x, w, w)
    with config.override(device="H200"):
        cols = plan_of(fn, x, w, w)
    (k_rows,) = _statistics_kernels(rows, 64)
    assert k_rows.domain.col_dims == (0, 2, 3) and k_rows.mapping.grid == 64
    assert k_rows.sector_waste >= 15 * x.numel() * 2      # 2 bytes used of each 32-byte sector
    stats = _statistics_kernels(cols, 64)
    assert stats and all(k.partials and k.mapping.grid >= 132 and not k.sector_waste for k in stats)
    assert cols.predicted_s < rows.predicted_s / 3, (cols.predicted_s, rows.predicted_s)


def test_combine_epilogues_knob_off_keeps_the_one_program_kernels():
    with config.override(combine_epilogues=False, bn_chunk_stats=False):
        c = compare_with_eager(bn_relu, _inputs(torch.float32))
    (fwd,) = _records(c, "forward")
    assert not any(k.epilogue for k in fwd.plan.kernels)
    assert len(fwd.plan.kernels) == 6


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_channels_last_batch_norm_from_chunk_statistics(dtype):
    """Knobs `bn_chunk_stats` and `chained_columns` on: the forward in three kernels — the chunks'
    statistics (x read once, channels along the rows of its tiles), their merge, the
    normalising kernel with the ReLU — none with column partials or wasted sectors; the
    backward's three as before; results as eager's (fp32) or float64's (bf16)."""
    inputs = _inputs(dtype, shape=(6, 24, 7, 8))
    c = _bn_relu_checked(dtype, inputs, "batch norm, chunk statistics", bn_chunk_stats=True, chained_columns=True)
    (fwd,), (bwd,) = _records(c, "forward"), _records(c, "backward")
    assert len(fwd.plan.kernels) == 3, [k.mapping.describe() for k in fwd.plan.kernels]
    assert not any(k.partials or k.combine_of or k.sector_waste for k in fwd.plan.kernels)
    assert len(bwd.plan.kernels) == 3, [k.mapping.describe() for k in bwd.plan.kernels]


def test_a_weight_gradient_scaled_after_its_column_sum_is_the_combines_epilogue():
    """A column sum over a channels-last gradient, then per-channel arithmetic on it alone
    (scaled, cast, added to a per-channel input): one partial kernel and its combine, the
    arithmetic in the combine; the reduction itself, read by the epilogue only, is not
    stored."""
    def fn(g, s, t):
        col = (g * s).sum((0, 2, 3))
        return (col * 0.5 + t).to(torch.bfloat16), col.sqrt() * t

    g = torch.randn(3, 40, 5, 6).to(memory_format=torch.channels_last)
    s, t = torch.randn(3, 40, 5, 6).to(memory_format=torch.channels_last), torch.rand(40) + 0.1
    c = compare_with_eager(lambda g, s, t: fn(g, s.abs(), t), [g, s, t], backward=False)
    plan = c.backend.records[0].plan
    assert len(plan.kernels) == 2, [k.mapping.describe() for k in plan.kernels]
    (comb,) = [k for k in plan.kernels if k.combine_of]
    assert comb.epilogue and not set(comb.dominant) & set(comb.outputs)


def test_an_epilogue_that_reads_a_reduction_off_its_lane_stays_a_kernel():
    """Per-column work that reads the reduction transposed (column j needs element
    5 * (j % 8) + j // 8) cannot run in the combine's lane j: the emitter's lane check
    raises IndexMismatch, the planner keeps the kernel after the combine, and the result is
    eager's."""
    def fn(g):
        col = g.sum((0, 2, 3))
        return col.reshape(5, 8).t().reshape(40) * 2 + 1

    g = torch.randn(3, 40, 5, 6).to(memory_format=torch.channels_last)
    c = compare_with_eager(fn, [g], backward=False)
    plan = c.backend.records[0].plan
    (comb,) = [k for k in plan.kernels if k.combine_of]
    assert not comb.epilogue and len(plan.kernels) == 3, [k.mapping.describe() for k in plan.kernels]


def test_explain_names_the_layout_column_reduction_and_the_epilogue():
    from stitchml.tools.explain import Report
    c = compare_with_eager(bn_relu, _inputs(torch.float32))
    text = Report(c.backend.records).to_text()
    assert "column reduction over the dims outermost in memory (rows: dims (0, 2, 3), columns: dims (1,)" in text
    assert "epilogue after its reductions, per column (" in text and "rsqrt" in text
    # knob off, rows looped one channel a program (short rows made to loop; the H200's
    # table: 64 channels are too few programs for taller tiles)
    with config.override(layout_columns=False, device="H200", persistent_max_cols=16, loop_block_cols=32):
        c = compare_with_eager(bn_relu, _inputs(torch.float32, shape=(2, 64, 6, 6)))
    assert "strided reads: 1-row tiles use part of each 32-byte sector" in Report(c.backend.records).to_text()
