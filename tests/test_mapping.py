"""Adaptive thread mapping (issue 4): the chosen mapping for irregular shapes, as plain
data (no kernels), and the same shapes scaled down under the interpreter."""
import pytest
import torch
import torch.nn.functional as F

from stitchml import config
from stitchml.plan.devices import DEVICES
from stitchml.plan.launches import wave_capacity
from stitchml.testing import compare_with_eager
from planning import plan_of, plan_on

H100 = DEVICES["H100"]


def h100_plan(fn, *shapes, **knobs):
    return plan_on("H100", fn, *shapes, **knobs)


def assert_barriers_fit_one_wave(plan):
    by_name = {k.name: k for k in plan.kernels}
    for grp in plan.groups:
        if grp.kind == "global":
            warps = max(by_name[m].mapping.num_warps for m in grp.members)
            assert grp.grid <= wave_capacity(H100, warps) <= H100.sms * 2


def test_many_short_rows_are_packed():          # <750000, 32> row sum (DIEN)
    plan = h100_plan(lambda x: x.sum(-1), (750000, 32))
    (k,) = plan.kernels
    assert k.mapping.form == "packed_rows" and (k.mapping.block_r, k.mapping.block_c) == (128, 32)
    assert k.mapping.grid == -(-750000 // 128) and not plan.groups


@pytest.mark.parametrize("rows,cols,chunks", [(64, 30000, 5), (8, 262144, 64)])
def test_few_long_rows_are_split(rows, cols, chunks):
    plan = h100_plan(lambda x: torch.softmax(x, -1), (rows, cols))
    g = plan.graph
    parts = [m for k in plan.kernels for m in k.members if g[m].attr("split_of") is not None]
    assert len(parts) == 2  # max and sum, each reduced per chunk
    assert all(g[p].shape == (rows, chunks) for p in parts)
    assert all(k.mapping.grid >= 2 * H100.sms for k in plan.kernels if set(k.members) & set(parts))
    assert plan.num_kernels == 1  # phases of one persistent launch
    assert_barriers_fit_one_wave(plan)


def test_few_long_rows_without_a_wave_of_chunks_take_the_most_chunks_that_divide():
    """No divisor of 62720 (PoolFormer's group norm over 320 x 14 x 14 a sample) lies
    between the 132 chunks a wave of an H100 wants for 2 rows and the 61 of 1024 elements:
    the row is still split, into the most chunks that divide it (56 of 1120), not left
    as two programs for the whole GPU."""
    plan = h100_plan(lambda x: torch.softmax(x, -1), (2, 62720))
    g = plan.graph
    parts = [m for k in plan.kernels for m in k.members if g[m].attr("split_of") is not None]
    assert len(parts) == 2 and all(g[p].shape == (2, 56) for p in parts)
    assert max(k.mapping.grid for k in plan.kernels if set(k.members) & set(parts)) >= 56   # (was 2)


def test_few_long_rows_split_below_a_wave_match_eager():
    x = torch.randn(2, 256 * 61, requires_grad=True)   # 61 chunks of 256: fewer than a wave wants
    with config.override(device="H100", split_min_cols=256):
        cmp = compare_with_eager(lambda x: torch.softmax(x, -1) * 3, [x])
    (fwd,) = [r.plan for r in cmp.backend.records if r.kind == "forward"]
    assert any(fwd.graph[m].attr("split_of") is not None and fwd.graph[m].shape == (2, 61)
               for k in fwd.kernels for m in k.members)


def test_layer_norm_of_few_long_rows_reads_its_input_twice():
    """LayerNorm over (128, 262144) on an H100: the mean and variance from one pass of
    persistent chunk statistics (sum and M2 per chunk of 8192), then the output pass:
    2 reads + 1 write of the row data (it was 3 reads + 1 write: a second statistics
    pass for the variance)."""
    plan = h100_plan(lambda x, w, b: F.layer_norm(x, (262144,), w, b), (128, 262144), (262144,), (262144,))
    g = plan.graph
    chunk_pass = [k for k in plan.kernels if any(g[m].attr("split_of") is not None for m in k.members)]
    assert len(chunk_pass) == 1 and chunk_pass[0].mapping.form == "row_persistent"
    row_bytes = 128 * 262144 * 4
    total = sum(k.bytes_read + k.bytes_written for k in plan.kernels)
    assert total <= 3.05 * row_bytes, total / row_bytes


def test_layer_norm_4096x1000():
    plan = h100_plan(lambda x, w, b: F.layer_norm(x, (1000,), w, b), (4096, 1000), (1000,), (1000,))
    (k,) = plan.kernels
    # a warp a row (`mapping.WARP_ROW_ELEMS`): 1000 float32 values, 32 a lane at most
    assert k.mapping.form == "row_persistent" and (k.mapping.block_r, k.mapping.block_c) == (1, 1024)
    assert (k.mapping.num_warps, k.mapping.grid) == (1, 4096)
    # without it, tiles of 4 rows over 16 warps
    plan = h100_plan(lambda x, w, b: F.layer_norm(x, (1000,), w, b), (4096, 1000), (1000,), (1000,),
                     warp_rows=False)
    (k,) = plan.kernels
    assert k.mapping.form == "packed_rows" and (k.mapping.block_r, k.mapping.block_c) == (4, 1024)
    assert (k.mapping.num_warps, k.mapping.grid) == (16, 1024)


def test_column_sum_is_partials_plus_combine_within_one_wave():
    plan = h100_plan(lambda x: x.sum(0), (32768, 1024))
    main, comb = plan.kernels
    assert main.partials and main.mapping.grid <= 2 * H100.sms and main.mapping.row_blocks > 1
    assert comb.combine_of == main.name
    assert plan.num_kernels == 1
    assert_barriers_fit_one_wave(plan)


def test_full_sum_of_16m_is_split_into_a_wave_of_chunks():
    plan = h100_plan(lambda x: x.sum(), (1, 1 << 24))
    chunk, final = plan.kernels
    assert chunk.mapping.form == "row_looped" and chunk.mapping.grid == 512
    assert final.domain.cols == 512
    assert_barriers_fit_one_wave(plan)


def test_odd_tiny_shape():
    plan = h100_plan(lambda x: torch.softmax(x, -1) * 2, (3, 5, 7))
    (k,) = plan.kernels
    assert k.mapping.form == "packed_rows" and k.mapping.block_c == 8 and k.mapping.block_r == 16
    assert k.mapping.grid == 1


@pytest.mark.parametrize("name", ["rows_750000x32", "softmax_64x30000", "softmax_8x262144", "ln_4096x1000",
                                  "colsum_32768x1024", "sum_1x16M", "odd_3x5x7"])
def test_scaled_down_shapes_match_eager(name):
    cases = {
        "rows_750000x32": (lambda x: x.sum(-1), [(750, 32)]),
        "softmax_64x30000": (lambda x: torch.softmax(x, -1), [(3, 3000)]),
        "softmax_8x262144": (lambda x: torch.softmax(x, -1), [(2, 8192)]),
        "ln_4096x1000": (lambda x, w, b: F.layer_norm(x, (1000,), w, b), [(40, 1000), (1000,), (1000,)]),
        "colsum_32768x1024": (lambda x: x.sum(0), [(512, 96)]),
        "sum_1x16M": (lambda x: x.sum(), [(1, 16384)]),
        "odd_3x5x7": (lambda x: torch.softmax(x, -1) * 2, [(3, 5, 7)]),
    }
    fn, shapes = cases[name]
    inputs = [torch.randn(*s, requires_grad=True) for s in shapes]
    with config.override(split_min_cols=256):
        cmp = compare_with_eager(fn, inputs)
    assert all(r.plan is not None for r in cmp.backend.records)


def _h200_plan(fn, dtype, *shapes, **knobs):
    return plan_on("H200", fn, *shapes, dtype=dtype, **knobs)


@pytest.mark.parametrize("dtype,rows", [(torch.bfloat16, 16), (torch.float32, 8)])
def test_column_partials_load_several_vectors_a_thread_an_iteration(dtype, rows):
    """A pure column sum's partial kernel takes row blocks tall enough that a thread loads
    64 bytes an iteration (four 16-byte loads in flight, not one); knob 0 keeps the
    `block_elems` tile.  (Knob `narrow_walks` on, the default, the walk is then planned at
    half the warps and half the rows, so that it prefetches: each thread loads the same.)"""
    main = _h200_plan(lambda x: x.sum(0), dtype, (32768, 1024), narrow_walks=False).kernels[0]
    assert (main.mapping.block_r, main.mapping.block_c, main.mapping.num_warps) == (rows, 1024, 16)
    per_thread = rows * 1024 // (32 * 16)
    assert per_thread * dtype.itemsize == 64 and main.mapping.row_blocks >= 4
    assert main.mapping.grid <= 2 * DEVICES["H200"].sms
    narrow = _h200_plan(lambda x: x.sum(0), dtype, (32768, 1024)).kernels[0]
    assert (narrow.mapping.block_r, narrow.mapping.num_warps) == (rows // 2, 8) and narrow.prefetch
    assert narrow.mapping.block_r * 1024 // (32 * 8) == per_thread and narrow.mapping.grid == main.mapping.grid
    old = _h200_plan(lambda x: x.sum(0), dtype, (32768, 1024), partial_bytes_per_thread=0,
                     narrow_walks=False).kernels[0]
    assert old.mapping.block_r == 4


def test_column_partials_beside_full_size_writes_keep_their_tiles():
    """A norm backward writes its input gradient beside the weight gradient's partials:
    taller tiles took 83-121 registers for sm_90 there (64 before), too many for two
    16-warp programs an SM, so its tiles stay."""

    def ln_bwd(x, w, b, dy):
        return torch.ops.aten.native_layer_norm_backward(dy, x, (1024,), x.mean(-1, keepdim=True),
                                                         x.var(-1, keepdim=True).add(1e-5).rsqrt(), w, b,
                                                         [True, True, True])

    shapes = [(16384, 1024), (1024,), (1024,), (16384, 1024)]
    new = _h200_plan(ln_bwd, torch.bfloat16, *shapes)
    old = _h200_plan(ln_bwd, torch.bfloat16, *shapes, partial_bytes_per_thread=0)
    with_partials = [k for k in new.kernels if k.partials]
    assert with_partials and any(k.outputs and max(new.graph[o].numel for o in k.outputs) == 16384 * 1024
                                 for k in with_partials)
    assert [k.mapping for k in new.kernels] == [k.mapping for k in old.kernels]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_taller_column_partials_match_eager(dtype):
    """Under the interpreter (the `cpu` device of the table: 2 SMs, so 4 partial programs)
    the column sum takes the taller tiles and still matches eager, forward and backward."""
    x = torch.randn(2048, 96, dtype=dtype)
    plan = plan_of(lambda x: x.sum(0) * 2, x)
    main = next(k for k in plan.kernels if k.partials)
    assert main.mapping.block_r > 4096 // 128, main.mapping
    from stitchml.testing import compare_against_float64
    cmp, judgement = compare_against_float64(lambda x: (x * 1.5).sum(0), [x.clone().requires_grad_(True)])
    judgement.assert_ok()
    assert all(r.plan is not None for r in cmp.backend.records)


def test_programs_of_two_byte_data_hold_twice_the_elements():
    """`block_elems` / `pointwise_block` count float32 elements: a bfloat16 program holds
    twice as many (the same bytes); knob `dtype_scaled_blocks` off keeps the counts."""
    def ln(x, w, b):
        return F.layer_norm(x, (1024,), w, b)
    shapes = [(32768, 1024), (1024,), (1024,)]
    tiles = {}
    for dtype in (torch.float32, torch.bfloat16):   # (rows of 1024 are a warp's each by default: `warp_rows`)
        (k,) = _h200_plan(ln, dtype, *shapes, warp_rows=False).kernels
        tiles[dtype] = (k.mapping.block_r, k.mapping.block_c, k.mapping.grid)
    assert tiles == {torch.float32: (4, 1024, 8192), torch.bfloat16: (8, 1024, 4096)}
    (k,) = _h200_plan(ln, torch.bfloat16, *shapes, dtype_scaled_blocks=False, warp_rows=False).kernels
    assert (k.mapping.block_r, k.mapping.grid) == (4, 8192)
    (p,) = _h200_plan(lambda x: torch.sigmoid(x) * 2, torch.bfloat16, (1 << 24,)).kernels
    (q,) = _h200_plan(lambda x: torch.sigmoid(x) * 2, torch.float32, (1 << 24,)).kernels
    assert (p.mapping.form, p.mapping.block_r, q.mapping.block_r) == ("pointwise", 2048, 1024)


def test_column_partial_tiles_are_not_scaled_by_dtype():
    """A kernel with column partials keeps `block_elems` elements whatever its dtype (its
    registers hold the float32 accumulators: `deeper_partial_tile` sizes those tiles;
    knob `narrow_walks` off: the walk at half the warps, prefetched, is
    tests/test_prefetch.py's)."""
    x = torch.randn(16384, 1024, dtype=torch.bfloat16, requires_grad=True)
    w = torch.randn(1024, dtype=torch.bfloat16, requires_grad=True)
    b = torch.randn(1024, dtype=torch.bfloat16, requires_grad=True)

    def bwd(x, w, b, dy):
        out = F.layer_norm(x, (1024,), w, b)
        return torch.autograd.grad(out, (x, w, b), dy)
    from torch.fx.experimental.proxy_tensor import make_fx
    from stitchml.capture.decomp import decomposition_table
    from stitchml.lower.lower import lower
    from stitchml.plan.planner import build_plan
    with config.override(device="H200", narrow_walks=False):
        gm = make_fx(bwd, decomposition_table=decomposition_table(), tracing_mode="fake")(x, w, b, torch.randn_like(x))
        plan = build_plan(lower(gm))
    part = [k for k in plan.kernels if k.partials]
    assert part and all(k.mapping.block_r * k.mapping.block_c == 4096 for k in part), [k.mapping for k in part]


def test_rows_read_twice_walk_a_persistent_grid_when_their_rereads_would_miss_l2():
    """layer_norm over [1024, 32768] fp32 reads each row three times: with a program a row,
    every resident row (134 MB in flight) is evicted from L2 before its next pass; one
    program an SM walks rows instead, and the model's bytes drop to one DRAM read."""
    def ln(x, w, b):
        return F.layer_norm(x, (32768,), w, b)
    shapes = [(1024, 32768), (32768,), (32768,)]
    (k,) = _h200_plan(ln, torch.float32, *shapes).kernels
    assert (k.mapping.form, k.mapping.block_c, k.mapping.grid, k.mapping.row_blocks) == ("row_looped", 8192, 132, 8)
    (old,) = _h200_plan(ln, torch.float32, *shapes, persistent_rows=False).kernels
    assert old.mapping.grid == 1024 and old.mapping.row_blocks == 1
    assert k.bytes_read < 0.5 * old.bytes_read and k.predicted_s < old.predicted_s
    # a row read once (a row sum) keeps a program a row
    (s,) = _h200_plan(lambda x: x.sum(-1), torch.float32, (1024, 32768)).kernels
    assert s.mapping.row_blocks == 1 and s.mapping.grid == 1024


@pytest.mark.parametrize("fn", ["layer_norm", "softmax"])
def test_persistent_looped_rows_match_eager(fn, monkeypatch):
    """The grid-stride walk over rows under the interpreter, forward and backward, against
    float64: planned for a small made-up device (4 SMs, 256 KB of L2) that 12 rows of 48 KB
    in flight overflow, so that the case stays small."""
    from stitchml.plan.devices import Device
    from stitchml.testing import compare_against_float64
    monkeypatch.setitem(DEVICES, "tiny", Device("tiny", 1e11, 4, 3e-6, 2e-6, l2_bytes=256 * 1024))
    f = {"layer_norm": lambda x, w: F.layer_norm(x, (12288,), w) * 2,
         "softmax": lambda x, w: torch.softmax(x * w, -1)}[fn]
    x = torch.randn(12, 12288, requires_grad=True)
    w = (torch.rand(12288) + 0.5).requires_grad_(True)
    with config.override(device="tiny"):
        plan = plan_of(f, x.detach(), w.detach())
        walk = [k for k in plan.kernels if k.mapping.form == "row_looped"]
        assert walk and all(k.mapping.row_blocks > 1 and k.mapping.grid == 4 for k in walk), \
            [k.mapping for k in plan.kernels]
        cmp, judgement = compare_against_float64(f, [x, w])
    judgement.assert_ok()
    assert all(r.plan is not None for r in cmp.backend.records)


def _long_row_forms(dtype, **knobs):
    n = 32768
    cases = {
        "softmax": (lambda x: torch.softmax(x, -1), [(1024, n)]),
        "softmax_bwd": (lambda y, dy: y * (dy - (y * dy).sum(-1, keepdim=True)), [(1024, n), (1024, n)]),
        "layer_norm": (lambda x, w, b: F.layer_norm(x, (n,), w, b), [(1024, n), (n,), (n,)]),
    }
    return {name: [k.mapping.form for k in plan_on("H200", f, *shapes, dtype=dtype, **knobs).kernels]
            for name, (f, shapes) in cases.items()}


def test_long_half_type_rows_are_held_whole_where_their_inputs_fit():
    """Rows of 32768 bf16 elements (H200 2026-11-30: softmax 74.6 -> 50.2 us held whole,
    its backward 67.1 -> 56.5) are one program's registers when the inputs varying along
    the row hold at most 65536 elements (x; y and dy); a layer norm's x, weight and bias
    (48.7 -> 53.5 us held whole) keep the looped form, and so does float32 (not measured)
    and the knob off."""
    assert _long_row_forms(torch.bfloat16) == {"softmax": ["row_persistent"], "softmax_bwd": ["row_persistent"],
                                               "layer_norm": ["row_looped"]}
    assert set(sum(_long_row_forms(torch.float32).values(), [])) == {"row_looped"}
    assert set(sum(_long_row_forms(torch.bfloat16, persistent_long_rows=False).values(), [])) == {"row_looped"}
    # a lowered `persistent_max_cols` (tests, the fuzzer) still loops rows up to 8192
    with config.override(persistent_max_cols=64):
        p = plan_of(lambda x: torch.softmax(x, -1), torch.empty(16, 4096, dtype=torch.bfloat16))
    assert [k.mapping.form for k in p.kernels] == ["row_looped"]


@pytest.mark.parametrize("cols", [16384, 30522])
def test_long_half_type_rows_held_whole_match_eager(cols):
    x = torch.randn(8, cols, dtype=torch.bfloat16) * 4
    dy = torch.randn(8, cols, dtype=torch.bfloat16)

    def f(x, dy):
        y = torch.softmax(x.float(), -1)
        return y.to(x.dtype), (y * (dy.float() - (y * dy.float()).sum(-1, keepdim=True))).to(x.dtype)
    cmp = compare_with_eager(f, [x, dy])   # (raises where an output differs beyond its tolerance)
    forms = {k.mapping.form for r in cmp.backend.records if r.plan is not None for k in r.plan.kernels}
    assert forms == {"row_persistent"}, forms
    # a cross-entropy's forward and backward over such rows, targets at both ends
    x = x.detach().requires_grad_()
    t = torch.randint(0, cols, (8,))
    t[0], t[1] = 0, cols - 1
    cmp = compare_with_eager(lambda x, t: F.cross_entropy(x.float(), t), [x, t])
    forms = {k.mapping.form for r in cmp.backend.records if r.plan is not None for k in r.plan.kernels
             if k.domain.cols >= cols}
    assert forms == {"row_persistent"}, forms
