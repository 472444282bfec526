"""Column partials beside rows held on chip, over few rows (`plan/mapping.py::
column_lane_partials`, knob `partial_column_warps`): programs whose warps lie along the
columns only, the row block shrunk alike, the combine tiled for as few warps.  The plans
as plain data for the H200, then the kernels against eager on fresh random inputs,
outputs poisoned (tests/conftest.py)."""
import sys

import pytest
import torch
import torch.nn.functional as F

from stitchml import config

sys.path.insert(0, "tests")
from planning import graph_of, plan_on  # noqa: E402


def _ln_backward(x, w, b, g):
    x, w, b = (t.detach().requires_grad_() for t in (x, w, b))
    return torch.autograd.grad(F.layer_norm(x, (x.shape[-1],), w, b), (x, w, b), g)


def _ln_backward_plan(rows, cols, dtype, **knobs):
    from stitchml.plan.planner import build_plan
    with config.override(device="H200", **knobs):
        e = [torch.empty(rows, cols, dtype=dtype), torch.empty(cols, dtype=dtype), torch.empty(cols, dtype=dtype),
             torch.empty(rows, cols, dtype=dtype)]
        return build_plan(graph_of(_ln_backward, *e))


def _partial_and_combine(plan):
    (comb,) = [k for k in plan.kernels if k.mapping.form == "combine"]
    (part,) = [k for k in plan.kernels if k.name == comb.combine_of]
    return part.mapping, comb.mapping


@pytest.mark.parametrize("dtype,warps,vec", [(torch.bfloat16, 4, 8), (torch.float32, 8, 4)])
def test_bert_shaped_column_partials_lay_their_warps_along_the_columns(dtype, warps, vec):
    """[2048 tokens x 768] (BERT-base's bias and norm-weight gradients): the warps a
    1024-column tile's 16-byte vectors fill, no more (none across the rows), the combine
    at as many warps."""
    colsum = plan_on("H200", lambda x: x.sum(0), (2048, 768), dtype=dtype)
    for plan in (colsum, _ln_backward_plan(2048, 768, dtype)):
        part, comb = _partial_and_combine(plan)
        assert part.column_lanes and part.num_warps == warps and part.block_c == 32 * vec * warps, part
        assert part.row_blocks <= 8 and part.grid == 264, part
        assert comb.num_warps <= warps and comb.block_r >= 8, comb
        assert "column lanes" in part.describe()
    # the column sum (nothing full-size written) takes taller row blocks; the norm
    # backward (dx written) keeps a thread's values: the 16-warp tile's 4 rows scaled down
    assert _partial_and_combine(colsum)[0].block_r > 1
    assert _partial_and_combine(_ln_backward_plan(2048, 768, dtype))[0].block_r == 4 * warps // 16


def test_column_lanes_are_priced_at_the_sixteen_warp_tiles_occupancy():
    """The cost model counts occupancy in programs x warps, which calls 4-warp programs
    2-3x slower; the H200 ran them 2.4-2.8x faster: they (and their combine) are priced
    at the occupancy of the tiles they replace, so the plan's launch grouping does not
    move with the knob, and its predicted time only by the memory latency of the longer
    walk over row blocks (`cost.walk_latency`: column lanes take shorter row blocks, so
    each program walks more of them; the 16-warp tiles' own measured slowness, 2.4x at
    2048 x 768, is not in the model)."""
    from stitchml.plan.devices import get_device
    lat = get_device("H200").mem_latency_s

    def walked(plan):
        return sum(k.mapping.row_blocks for k in plan.kernels if k.partials and k.mapping.row_blocks > 1)

    for dtype in (torch.bfloat16, torch.float32):
        on = plan_on("H200", lambda x: x.sum(0), (2048, 768), dtype=dtype)
        off = plan_on("H200", lambda x: x.sum(0), (2048, 768), dtype=dtype, partial_column_warps=False)
        assert all(k.mapping.column_lanes for k in on.kernels), [k.mapping for k in on.kernels]
        assert on.predicted_s <= off.predicted_s * 1.01 + (walked(on) - walked(off)) * lat, \
            (on.predicted_s, off.predicted_s)
        on, off = _ln_backward_plan(2048, 768, dtype), _ln_backward_plan(2048, 768, dtype, partial_column_warps=False)
        assert on.num_kernels == off.num_kernels and walked(on) > walked(off)
        assert on.predicted_s <= off.predicted_s * 1.01 + (walked(on) - walked(off)) * lat


def test_long_walks_and_the_knob_off_keep_sixteen_warp_tiles():
    """32768 rows (each program walking 31 row blocks): no column lanes, until measured
    (knob `narrow_walks` off: its walk at half the warps, to prefetch, is
    tests/test_prefetch.py's); the knob off: the tiles of rows over 16 warps, 4 of them
    across the rows."""
    for plan in (plan_on("H200", lambda x: x.sum(0), (32768, 1024), dtype=torch.bfloat16, narrow_walks=False),
                 plan_on("H200", lambda x: x.sum(0), (2048, 768), dtype=torch.bfloat16, partial_column_warps=False,
                         partial_segments=False),
                 _ln_backward_plan(2048, 768, torch.bfloat16, partial_column_warps=False)):
        part, comb = _partial_and_combine(plan)
        assert not part.column_lanes and part.num_warps == 16 and part.block_r >= 4, part
        assert comb.num_warps == 16, comb
    # (with row segments, `mapping.segmented_partials`, a 768-wide row is three unmasked 256-wide
    # segments instead of a 1024 tile; a layer-norm backward, which also reduces its rows, keeps its tile)
    plan = plan_on("H200", lambda x: x.sum(0), (2048, 768), dtype=torch.bfloat16, partial_column_warps=False)
    part, _ = _partial_and_combine(plan)
    assert (part.segments, part.block_c) == (3, 256), part


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_column_lane_kernels_match_float64(dtype):
    """Planned for the H200 (600 rows: column lanes, each program walking a few rows),
    run under the interpreter: a bias-gradient-like column sum beside a point-wise
    output, and a layer norm's forward and backward (dx, the weight and bias gradients
    from the partials and their combine), judged against float64 with eager's error as
    the yardstick (eager bf16 rounds the weight gradient's products: 7x stitch's error)."""
    from stitchml.testing import compare_against_float64

    def lanes(cmp):
        return [k.mapping for r in cmp.backend.records if r.plan for k in r.plan.kernels if k.mapping.column_lanes]

    with config.override(device="H200"):
        torch._dynamo.reset()
        x = torch.randn(600, 768).to(dtype).requires_grad_()
        cmp, judgement = compare_against_float64(lambda x: (torch.relu(x) * 2, (x * x).sum(0)), [x])
        judgement.assert_ok("column sum beside a point-wise output")
        assert lanes(cmp)
        torch._dynamo.reset()
        x = torch.randn(600, 768).to(dtype).requires_grad_()
        w = (torch.rand(768) + 0.5).to(dtype).requires_grad_()
        b = torch.randn(768).to(dtype).requires_grad_()
        cmp, judgement = compare_against_float64(lambda x, w, b: F.layer_norm(x, (768,), w, b), [x, w, b])
        judgement.assert_ok("layer norm forward and backward")
        assert lanes(cmp) and all(m.num_warps == (4 if dtype == torch.bfloat16 else 8) for m in lanes(cmp))


def _gelu_backward(x, g):
    """BERT's GELU backward beside its bias gradient (erf form, in float32 as eager's
    decomposition computes it): dx full-size, and dx summed over the tokens."""
    xf = x.float()
    cdf = 0.5 * (1 + torch.erf(xf * 0.7071067811865476))
    pdf = torch.exp(-0.5 * xf * xf) * 0.3989422804014327
    dx = (g.float() * (cdf + xf * pdf)).to(x.dtype)
    return dx, dx.sum(0)


@pytest.mark.parametrize("cols,warps", [(3072, 4), (2304, 4), (4096, 16)])
def test_one_row_tiles_take_the_warps_that_leave_fewest_lanes_masked(cols, warps):
    """Rows of 4096 columns or more (a tile of one row: BERT's and GPT-2's 3072-wide FFN
    gradients, GPT-2's 2304-wide QKV bias gradient) in bfloat16: the warps whose
    1024-lane repeats cover the row with the fewest masked lanes, never below 4 (2304
    would take 2 warps by masked lanes alone), the walk unchanged, the combine tiled for
    as few; 4096 columns fill 16 warps exactly and keep them.  The knob off, or
    `trim_row_warps` off: 16 warps."""
    # (knob `narrow_walks` off: the 16-warp one-row walk of 4096 columns at one program an
    # SM, to prefetch, is tests/test_prefetch.py's)
    on = plan_on("H200", _gelu_backward, (2048, cols), (2048, cols), dtype=torch.bfloat16, narrow_walks=False)
    part, comb = _partial_and_combine(on)
    assert part.block_r == 1 and part.num_warps == warps and part.column_lanes == (warps < 16), part
    assert part.grid == 264 and part.row_blocks == 8, part
    assert comb.num_warps <= warps and comb.column_lanes == (warps < 16), comb
    for knobs in ({"partial_column_warps": False}, {"trim_row_warps": False}):
        off = plan_on("H200", _gelu_backward, (2048, cols), (2048, cols), dtype=torch.bfloat16,
                      narrow_walks=False, **knobs)
        p_off, c_off = _partial_and_combine(off)
        assert p_off.num_warps == 16 and not p_off.column_lanes and (p_off.grid, p_off.row_blocks) == (264, 8)
        assert c_off.num_warps == 16
        # priced at the 16-warp tile's occupancy: the same prediction, the same launches (both
        # without prefetch, which the 16-warp tiles do not take: `planner._prefetch_misfit`)
        assert on.num_kernels == off.num_kernels
        plain = plan_on("H200", _gelu_backward, (2048, cols), (2048, cols), dtype=torch.bfloat16, prefetch_rows=False)
        assert plain.predicted_s == pytest.approx(off.predicted_s, rel=0.01)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_one_row_column_lane_kernels_match_float64(dtype):
    """Planned for the H200 (300 rows of 3072: a tile of one row at fewer warps, each
    program walking two rows), run under the interpreter against float64."""
    from stitchml.testing import compare_against_float64
    with config.override(device="H200"):
        torch._dynamo.reset()
        x = torch.randn(300, 3072).to(dtype)
        g = torch.randn(300, 3072).to(dtype)
        cmp, judgement = compare_against_float64(_gelu_backward, [x, g], backward=False)
        judgement.assert_ok("GELU backward and its bias gradient")
        lanes = [k.mapping for r in cmp.backend.records if r.plan for k in r.plan.kernels
                 if k.mapping.column_lanes and k.mapping.form != "combine"]
        assert lanes and all(m.block_r == 1 and m.num_warps < 16 for m in lanes), lanes


@pytest.mark.parametrize("cols,programs", [(768, 96), (1024, 128), (3072, 96)])
def test_combines_take_programs_for_half_the_sms(cols, programs):
    """Knob `combine_spread`: a combine's column tiles narrow (to 8 float32 columns at
    least) until there are programs for half the H200's 132 SMs, the partial rows then
    taken in few tall steps; off: 32-column tiles (768 columns: 24 programs)."""
    from stitchml.plan.mapping import COMBINE_MIN_COLS
    on = plan_on("H200", lambda x: x.sum(0), (2048, cols), dtype=torch.bfloat16)
    part, comb = _partial_and_combine(on)
    assert comb.grid == programs and comb.grid >= 66 and comb.block_c >= COMBINE_MIN_COLS, comb
    assert comb.block_c * comb.grid >= cols and comb.block_r >= 32, comb
    off = plan_on("H200", lambda x: x.sum(0), (2048, cols), dtype=torch.bfloat16, combine_spread=False)
    assert _partial_and_combine(off)[1].block_c == 32 and _partial_and_combine(off)[1].grid == -(-cols // 32)
    # the cpu device (2 cores) keeps the 32-column tiles, and so do dynamic shapes (a
    # template's grids are a few size expressions: the grid must not vary within a bucket)
    assert _partial_and_combine(plan_on("cpu", lambda x: x.sum(0), (2048, cols)))[1].block_c >= 32
    from stitchml.plan.mapping import combine_mapping
    from stitchml.plan.options import PlanOptions
    dynamic = PlanOptions.from_config("H200", fixed_row_blocks=True)
    assert combine_mapping(264, cols, dynamic).block_c == 32


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_narrow_combines_match_float64(dtype):
    """Planned for the H200 (column sums and a layer norm's weight and bias gradients
    over 600 x 768: 8-column combine tiles, a masked tail of partial rows), run under the
    interpreter against float64."""
    from stitchml.testing import compare_against_float64
    with config.override(device="H200"):
        torch._dynamo.reset()
        x = torch.randn(600, 768).to(dtype).requires_grad_()
        w = (torch.rand(768) + 0.5).to(dtype).requires_grad_()
        b = torch.randn(768).to(dtype).requires_grad_()
        cmp, judgement = compare_against_float64(lambda x, w, b: (F.layer_norm(x, (768,), w, b), (x * w).sum(0)),
                                                 [x, w, b])
        judgement.assert_ok("layer norm and a column sum, forward and backward")
        combines = [k.mapping for r in cmp.backend.records if r.plan for k in r.plan.kernels
                    if k.mapping.form == "combine"]
        assert combines and all(m.block_c == 8 for m in combines), combines
