"""Row kernels mapped for live lanes (`plan/mapping.py`): rows of up to 32 elements a lane
run one row a program on one warp (`WARP_ROW_ELEMS`, knob `warp_rows`), and one-row
programs over rows that are not a power of two take the warps that leave the fewest
masked lanes live (`live_lane_warps`, knob `trim_row_warps`).  The plans as plain data,
then the kernels against eager on fresh random inputs, outputs poisoned
(tests/conftest.py); the sm_90 instruction counts are in tests/test_aot_gpu.py."""
import sys

import pytest
import torch
import torch.nn.functional as F

from stitchml import config
from stitchml.plan import mapping
from stitchml.plan.data import Domain
from stitchml.plan.options import PlanOptions
from stitchml.testing import compare_with_eager

sys.path.insert(0, "tests")
from planning import plan_on  # noqa: E402


def _plan(fn, dtype, *shapes, **knobs):
    return plan_on("H200", fn, *shapes, dtype=dtype, **knobs)


def _ln(x, w, b):
    return F.layer_norm(x, (x.shape[-1],), w, b)


@pytest.mark.parametrize("dtype,cols,warp_row", [
    (torch.bfloat16, 768, True),     # BERT's, GPT-2's hidden size: 24 of 32 elements a lane live
    (torch.bfloat16, 1024, True),
    (torch.bfloat16, 256, False),    # one warp's 16-byte vectors: a warp holds the row already
    (torch.bfloat16, 2048, False),   # 64 elements a lane: too many registers
    (torch.float32, 130, True),      # wider than 32 lanes x 4 float32 values
    (torch.float32, 128, False),
])
def test_rows_of_up_to_32_elements_a_lane_are_a_warp_each(dtype, cols, warp_row):
    (k,) = _plan(_ln, dtype, (4096, cols), (cols,), (cols,)).kernels
    m = k.mapping
    if warp_row:
        assert (m.form, m.block_r, m.num_warps, m.grid) == ("row_persistent", 1, 1, 4096), m
    else:
        assert m.num_warps > 1 or m.block_r > 1, m
    # the knob off: the tiles of several rows over several warps
    (k,) = _plan(_ln, dtype, (4096, cols), (cols,), (cols,), warp_rows=False).kernels
    assert k.mapping.num_warps > 1, k.mapping


def test_warp_rows_leave_column_partials_and_dynamic_templates_alone():
    opts = PlanOptions.from_config("H200")
    dom = Domain((4096, 768), (1,))
    assert mapping.choose(dom, opts, itemsize=2).num_warps == 1
    # column partials (a norm's weight gradient beside the row work): tiles of rows
    assert mapping.choose(dom, opts, partials=True, itemsize=2).num_warps > 1
    # dynamic templates (fixed row blocks): the mapping follows the size bucket only
    fixed = PlanOptions.from_config("H200", fixed_row_blocks=True)
    assert mapping.choose(dom, fixed, itemsize=2).block_r > 1


@pytest.mark.parametrize("cols,warps,vec,expected", [
    (5000, 16, 8, 4),    # 8192 lanes at 16 warps, 5120 at 4 (1024 a repeat)
    (5000, 16, 4, 8),    # float32: 1024 lanes a repeat at 8 warps
    (4096, 16, 8, 16),   # a power of two: no lane masked at any count, keep the warps
    (8000, 16, 8, 16),   # 8192 at every count: keep
    (3000, 8, 8, 4),     # 4096 at 8 warps (2048 a repeat), 3072 at 4; 2 warps: 48 a lane, span 3072: no better
])
def test_one_row_programs_take_the_warps_with_the_fewest_live_masked_lanes(cols, warps, vec, expected):
    assert mapping.live_lane_warps(cols, warps, vec) == expected
    got = mapping.live_lane_warps(cols, warps, vec)
    lanes = got * 32 * vec
    assert -(-cols // lanes) * lanes // (got * 32) <= mapping.ROW_THREAD_ELEMS


@pytest.mark.parametrize("values,expected", [
    (1, 4),     # a softmax: 56 elements a thread at 4 warps (7168 lanes for 6272)
    (3, 4),     # 168 values a thread
    (11, 8),    # 616 at 4 warps: too many; 16 warps would leave 128 registers for 176: 8
])
def test_one_row_programs_trim_warps_no_further_than_the_inputs_they_hold_fit(values, expected):
    """A row of 6272 bfloat16 (a channel's 2 x 56 x 56 in a batch-norm backward) in an
    8192 tile: fewer warps leave fewer lanes masked, but each thread then holds more of
    every input that varies along the row (bench/NOTES.md, forty-third session)."""
    assert mapping.live_lane_warps(6272, 16, 8, values=values) == expected


def _many(*xs):
    """A per-channel normalisation of a sum of products: len(xs) inputs varying along each
    channel's row of N x H x W elements (a batch-norm backward fused with what feeds it)."""
    t = sum(a.float() * b.float() for a, b in zip(xs[1::2], xs[2::2]))
    m = t.mean(dim=(0, 2, 3), keepdim=True)
    v = (t - m).pow(2).mean(dim=(0, 2, 3), keepdim=True)
    return ((xs[0].float() - m) * torch.rsqrt(v + 1e-5)).to(xs[0].dtype)


def test_row_kernels_reading_many_inputs_keep_warps_for_their_registers():
    (k,) = _plan(_many, torch.bfloat16, *[(2, 64, 56, 56)] * 11).kernels
    assert (k.mapping.form, k.mapping.block_c, k.mapping.num_warps, len(k.inputs)) == ("row_persistent", 8192, 8, 11)
    (k,) = _plan(_many, torch.bfloat16, *[(2, 64, 56, 56)] * 3).kernels
    assert (k.mapping.form, k.mapping.num_warps) == ("row_persistent", 4)


def test_a_softmax_over_5000_wide_bf16_rows_runs_at_four_warps():
    (k,) = _plan(lambda x: torch.softmax(x, -1), torch.bfloat16, (6710, 5000)).kernels
    assert (k.mapping.form, k.mapping.block_c, k.mapping.num_warps) == ("row_persistent", 8192, 4)
    (k,) = _plan(lambda x: torch.softmax(x, -1), torch.bfloat16, (6710, 5000), trim_row_warps=False).kernels
    assert k.mapping.num_warps == 16


def _kernels(c):
    return [k for r in c.backend.records for k in r.plan.kernels]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_warp_row_kernels_match_eager_forward_and_backward(dtype):
    """Layer norm (three row statistics), softmax and a dropout + residual + layer norm
    over rows of 300 and 768 (masked lanes past the row's end), forward and backward."""
    # (bf16: eager rounds every backward intermediate, kernels do not: tests/test_ops.py's bounds)
    tol = {} if dtype == torch.float32 else dict(rtol=2e-2, atol=2e-2, grad_rtol=5e-2, grad_atol=2e-1)
    for cols in (300, 768):
        torch._dynamo.reset()   # (a second size would make Dynamo trace the sizes dynamic)
        x = torch.randn(24, cols).to(dtype).requires_grad_()
        w = torch.randn(cols).to(dtype).requires_grad_()
        b = torch.randn(cols).to(dtype).requires_grad_()
        c = compare_with_eager(_ln, [x, w, b], **tol)
        warp = [k for k in _kernels(c) if k.mapping.form == "row_persistent" and k.mapping.num_warps == 1]
        assert warp, [k.mapping for k in _kernels(c)]
        s = torch.randn(24, cols).to(dtype).requires_grad_()
        c = compare_with_eager(lambda s: torch.softmax(s * 3, -1), [s], **tol)
        assert any(k.mapping.num_warps == 1 for k in _kernels(c))


def test_dropout_over_a_warp_row_draws_a_fair_mask_and_sums_what_it_kept():
    """Dropout's uniforms drawn over a warp-row tile (one `randint4x` a quarter tile,
    `emit_core._uniform_tile`): each element kept or not, kept ones scaled by 2, about
    half kept, and the row sum in the same kernel sums exactly the kept values."""
    from stitchml.codegen import generate_all
    from stitchml import StitchBackend
    x = torch.randn(16, 768) + 3.0   # (no zero inputs: a zero output means dropped)
    backend = StitchBackend()
    y, s = torch.compile(lambda x: (lambda y: (y, y.sum(-1)))(F.dropout(x, 0.5, training=True)),
                         backend=backend)(x)
    kept = y != 0
    assert torch.equal(y[kept], 2 * x[kept])
    assert 0.45 < kept.float().mean().item() < 0.55
    torch.testing.assert_close(s, y.sum(-1), rtol=1e-5, atol=1e-4)
    (rec,) = backend.records
    (k,) = [k for k in rec.plan.kernels if k.mapping.form == "row_persistent"]
    assert k.mapping.num_warps == 1
    assert "tl.randint4x" in generate_all(rec.plan.graph, rec.plan)[k.name].source


def test_trimmed_warps_match_eager_on_rows_that_are_not_a_power_of_two():
    x = torch.randn(8, 5000, dtype=torch.bfloat16, requires_grad=True)
    w = torch.randn(5000, dtype=torch.bfloat16, requires_grad=True)
    b = torch.randn(5000, dtype=torch.bfloat16, requires_grad=True)
    c = compare_with_eager(_ln, [x, w, b], rtol=2e-2, atol=2e-2, grad_rtol=5e-2, grad_atol=2e-1)
    assert any(k.mapping.form == "row_persistent" and k.mapping.num_warps == 4 for k in _kernels(c)), \
        [k.mapping for k in _kernels(c)]


# -- programs of several warps, a row a warp, the row as segments (knob warp_row_warps)

@pytest.mark.parametrize("dtype,cols,width,segments", [
    (torch.bfloat16, 768, 256, 3),    # 32 lanes x 8 bf16 values a segment: BERT's rows in three
    (torch.float32, 1000, 128, 8),    # 32 x 4 float32 values; the last segment's tail masked
])
def test_several_warp_rows_a_program_hold_each_row_as_segments(dtype, cols, width, segments):
    (k,) = _plan(_ln, dtype, (4096, cols), (cols,), (cols,), warp_row_warps=4).kernels
    m = k.mapping
    assert (m.form, m.block_r, m.block_c, m.segments, m.num_warps, m.grid) == (
        "packed_rows", 4, width, segments, 4, 1024), m
    assert "x%d segments" % segments in m.describe()


def test_scans_and_arg_reductions_keep_one_warp_programs_under_segments():
    for fn in (lambda x: torch.cumsum(x, -1) * 2, lambda x: x.argmax(-1) + 1):
        (k,) = _plan(fn, torch.float32, (512, 700), warp_row_warps=4).kernels
        assert (k.mapping.segments, k.mapping.num_warps, k.mapping.block_r) == (1, 1, 1), k.mapping


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_row_segments_match_eager_forward_and_backward(dtype):
    """Layer norm, softmax, RMS norm with a row-level output and an embedding-style
    scatter over rows of 300 (the last segment masked) and 768 (whole segments),
    forward and backward, each row held as segments in programs of 4 warps."""
    from stitchml.codegen import generate_all
    tol = {} if dtype == torch.float32 else dict(rtol=2e-2, atol=2e-2, grad_rtol=5e-2, grad_atol=2e-1)
    with config.override(warp_row_warps=4):
        for cols in (300, 768):
            torch._dynamo.reset()
            x = torch.randn(24, cols).to(dtype).requires_grad_()
            w = torch.randn(cols).to(dtype).requires_grad_()
            b = torch.randn(cols).to(dtype).requires_grad_()
            c = compare_with_eager(_ln, [x, w, b], **tol)
            seg = [(r, k) for r in c.backend.records for k in r.plan.kernels if k.mapping.segments > 1]
            assert seg, [k.mapping for k in _kernels(c)]
            r, k = seg[0]
            src = generate_all(r.plan.graph, r.plan)[k.name].source
            assert "cflat_s%d = " % (k.mapping.segments - 1) in src and "cflat = " not in src, src
            torch._dynamo.reset()
            s = torch.randn(24, cols).to(dtype).requires_grad_()
            c = compare_with_eager(lambda s: (torch.softmax(s * 3, -1), torch.logsumexp(s, -1)), [s], **tol)
            assert any(k.mapping.segments > 1 for k in _kernels(c))
            torch._dynamo.reset()
            c = compare_with_eager(lambda s: s * torch.rsqrt(s.float().pow(2).mean(-1, keepdim=True) + 1e-6).to(
                s.dtype), [s], **tol)
            assert any(k.mapping.segments > 1 for k in _kernels(c))


def test_dropout_over_row_segments_draws_each_segment_its_own_words():
    """Each segment's uniforms are the words of its own columns: the same mask as the
    one-warp form draws (both give element i word i & 3 of Philox block i >> 2)."""
    from stitchml import StitchBackend
    x = torch.randn(16, 768) + 3.0
    outs = {}
    for warps in (1, 4):
        torch._dynamo.reset()
        torch.manual_seed(7)
        with config.override(warp_row_warps=warps):
            backend = StitchBackend()
            y, s = torch.compile(lambda x: (lambda y: (y, y.sum(-1)))(F.dropout(x, 0.5, training=True)),
                                 backend=backend)(x)
        (k,) = [k for r in backend.records for k in r.plan.kernels if k.mapping.form != "pointwise"]
        assert k.mapping.segments == (6 if warps == 4 else 1), k.mapping   # (float32: 128 columns a segment)
        torch.testing.assert_close(s, y.sum(-1), rtol=1e-5, atol=1e-4)
        outs[warps] = y
    assert torch.equal(outs[1], outs[4])
    kept = outs[4] != 0
    assert 0.45 < kept.float().mean().item() < 0.55
