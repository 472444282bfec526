"""Kernels without reductions walk their domain in memory order (plan/access.py::layout_domain,
knob `layout_order`): a value stored in a transposed layout is walked along that layout, a
transpose is walked in tiles whose reads and stores are each coalesced; and the index
simplifier inside a cat's branches (ix.restrict: a rotary embedding's rotate-half).
Plan tier and interpreter tier (outputs poisoned, tests/conftest.py); the sm_90 code of
such kernels is checked in tests/test_aot_gpu.py."""
import sys

import pytest
import torch

from stitchml import config
from stitchml.codegen import generate_all
from stitchml.ir import index as ix
from stitchml.testing import compare_with_eager

sys.path.insert(0, "tests")
from planning import plan_of  # noqa: E402

DTYPES = [torch.float32, torch.bfloat16]
IDS = ["fp32", "bf16"]


def _transposed_copy(x):
    # the key of an attention product read [batch, tokens, dim] and stored [batch, dim, tokens]
    return (x.transpose(-1, -2) * 0.5).contiguous()


def _stored_transposed(x):
    # element-wise on a permuted view keeps its layout (eager's strides): walked in that order
    return x.permute(0, 2, 1) * 3 + 1


def _only_kernel(plan):
    (k,) = plan.kernels
    return k


@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
def test_a_transpose_is_walked_in_tiles_and_matches_eager(dtype):
    x = torch.randn(3, 70, 37).to(dtype)      # odd sizes: masked tile edges on both axes
    c = compare_with_eager(_transposed_copy, [x], backward=False)
    (rec,) = c.backend.records
    k = _only_kernel(rec.plan)
    # the two contiguous dims (the store's, 2, and the read's, 1) are the tile's: the
    # longer one along the rows (more programs), the other the columns
    assert not k.domain.is_flat and k.domain.col_dims == (1,) and k.domain.row_dims[-1] == 2, k.domain
    assert k.mapping.block_r >= 32 and k.mapping.form in ("packed_rows", "row_looped"), k.mapping.describe()
    from stitchml.tools.explain import Report
    assert "a transpose in tiles" in Report(c.backend.records).to_text()


def test_a_transpose_of_few_rows_takes_shorter_tiles_for_more_programs():
    with config.override(device="H100"):
        k = _only_kernel(plan_of(_transposed_copy, torch.randn(8192, 4096, dtype=torch.bfloat16)))
    assert k.domain.rows == 8192 and k.mapping.grid >= 264, (k.domain, k.mapping.describe())
    assert k.mapping.block_r * 2 >= 32, k.mapping.describe()    # still a sector's run a column


@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
def test_a_value_stored_transposed_is_walked_in_its_layout_and_matches_eager(dtype):
    x = torch.randn(5, 33, 20).to(dtype)
    c = compare_with_eager(_stored_transposed, [x], backward=False)
    assert c.outputs.stride() == c.expected.stride()
    k = _only_kernel(c.backend.records[0].plan)
    assert k.domain.is_flat and k.domain.row_dims == (0, 2, 1), k.domain
    src = generate_all(c.backend.records[0].plan.graph, c.backend.records[0].plan)[k.name].source
    # both accesses are the flat index itself: one load and one store Triton can vectorise
    assert "in0 + rflat" in src and "out1 + rflat" in src, src


def test_transpose_with_gradient_matches_eager():
    x = torch.randn(4, 24, 40, requires_grad=True)
    c = compare_with_eager(lambda x: torch.tanh(_transposed_copy(x)) * 2, [x])
    assert any(not k.domain.is_flat for r in c.backend.records for k in r.plan.kernels)


def test_knob_off_and_plain_kernels_keep_the_flat_domain():
    x = torch.randn(16, 64, 48)
    with config.override(layout_order=False):
        k = _only_kernel(plan_of(_transposed_copy, x))
    assert k.domain.is_flat and not k.domain.order and k.mapping.form == "pointwise"
    k = _only_kernel(plan_of(lambda x: x * 2 + 1, x))                  # contiguous: untouched
    assert k.domain.is_flat and not k.domain.order
    k = _only_kernel(plan_of(_transposed_copy, torch.randn(16, 64, 5)))  # a 5-long run: no tile
    assert k.domain.is_flat and k.mapping.form == "pointwise"


def test_restrict_simplifies_with_the_narrowed_range():
    r3 = ix.var("r3", 64, "row")
    r1 = ix.var("r1", 16, "row")
    (v,) = [a for a, _ in r3.terms]
    # x[..., 32:] read in the branch r3 < 32 of a rotate-half: (r3 + 32) // 64 is 0 there
    e = ix.floordiv(r3 + 32, 64) + r1
    assert ix.restrict(e, v, 0, 32) == r1
    # the second branch (r3 in [32, 64)): (r1*64 + r3 + 992) % 1024 is r1*64 + r3 - 32 there
    low = ix.restrict(ix.mod(r1 * 64 + r3 + 992, 1024), v, 32, 64)
    assert not any(isinstance(a, (ix.Div, ix.Mod)) for a, _ in low.terms)
    for r in range(32, 64):
        for q in (0, 7, 15):
            assert ix.evaluate(low, {"r3": r, "r1": q}) == (q * 64 + r + 992) % 1024
    # one quotient over the whole range folds to a constant (without the branch too)
    assert ix.floordiv(r3 + 128, 256) == ix.const(0)
    a = ix.var("a", 10, "row")
    assert ix.floordiv(a + 30, 20) == ix.const(1) and ix.mod(a + 30, 20) == a + 10


def _rotate_half_rope(q, cos, sin):
    b, s, h = q.shape
    q = q.view(b, s, h // 64, 64).transpose(1, 2)
    half = torch.cat((-q[..., 32:], q[..., :32]), dim=-1)
    return (q * cos + half * sin) * 0.125


@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
def test_rotate_half_reads_are_plain_offsets_and_match_eager(dtype):
    q = torch.randn(2, 24, 256).to(dtype)
    cos, sin = torch.randn(24, 64).to(dtype), torch.randn(24, 64).to(dtype)
    c = compare_with_eager(_rotate_half_rope, [q, cos, sin], backward=False)
    plan = c.backend.records[0].plan
    src = "\n".join(s.source for s in generate_all(plan.graph, plan).values())
    loads = [line for line in src.splitlines() if "tl.load(in0" in line]
    assert len(loads) == 3 and not any("//" in line or "%" in line for line in loads), src


@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
def test_row_reductions_over_a_transposed_read_take_cache_line_tall_tiles(dtype):
    """Few tokens and a hidden size too long for column partials on chip: the column sum
    is a row reduction whose rows are the hidden dim, read along its stride."""
    with config.override(device="H100"):
        k = _only_kernel(plan_of(lambda x: x.sum(0), torch.randn(256, 16384, dtype=dtype)))
    assert k.domain.col_dims == (0,) and k.transposed, k
    assert k.mapping.block_r * dtype.itemsize == 128 and k.mapping.grid >= 132, k.mapping.describe()
    with config.override(device="H100", transposed_tiles=False):
        k = _only_kernel(plan_of(lambda x: x.sum(0), torch.randn(256, 16384, dtype=dtype)))
    assert not k.transposed and k.mapping.block_r * dtype.itemsize < 128, k.mapping.describe()


@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
def test_transposed_row_reductions_match_eager(dtype):
    x = torch.randn(300, 9000).to(dtype)
    with config.override(device="H100"):
        # (sums of 300 values of |sum| ~ 17: another summation order moves them by ~1e-5)
        c = compare_with_eager(lambda x: x.sum(0) * 2, [x], backward=False,
                               atol=1e-4 if dtype == torch.float32 else None)
    k = _only_kernel(c.backend.records[0].plan)
    assert k.transposed and k.mapping.form == "row_looped" and k.mapping.block_r >= 16, k.mapping.describe()


def test_layer_norm_backward_over_few_tokens_matches_eager():
    """The weight and bias gradients of a layer norm over 150 tokens of 9000: the per-token
    statistics are read along the columns of tiles laid out along their rows."""
    x = torch.randn(150, 9000, requires_grad=True)
    w, b = torch.randn(9000, requires_grad=True), torch.randn(9000, requires_grad=True)
    with config.override(device="H100"):
        c = compare_with_eager(lambda x, w, b: torch.nn.functional.layer_norm(x, (9000,), w, b), [x, w, b])
    assert any(k.transposed and not k.partials for r in c.backend.records for k in r.plan.kernels)


def test_tiles_of_huge_tensors_index_their_columns_in_int64():
    """2**31 elements or more: the tile's column lanes are int64 like its rows (a column
    index times the transposed stride, 65536 here, passed 2**31 in int32: wrong reads)."""
    x = torch.empty(32776, 65536, dtype=torch.int8, device="meta")
    plan = plan_of(lambda x: (x.t() + 1).contiguous(), x)
    (k,) = plan.kernels
    assert not k.domain.is_flat, k.domain
    src = generate_all(plan.graph, plan)[k.name].source
    assert "tl.program_id(0).to(tl.int64)" in src and "[None, :].to(tl.int64)" in src, src


def test_a_small_view_of_a_huge_storage_indexes_in_int64():
    """idx64 follows the farthest element a buffer's strides reach, not its element count."""
    x = torch.empty(4, 8, device="meta").as_strided((4, 8), (2**30, 1))
    src = "\n".join(s.source for s in generate_all(*(lambda p: (p.graph, p))(plan_of(lambda x: x * 2, x))).values())
    assert ".to(tl.int64)" in src, src
