"""Access-pattern probes at plan time (plan/access.py): flat kernels that read row runs
out of their flat order take one element a thread; the probe itself on plain, sliced,
padded and transposed reads.  Plan tier and interpreter tier; the sm_90 code of such a
kernel is checked in tests/test_aot_gpu.py."""
import sys

import pytest
import torch
import torch.nn.functional as F

from stitchml import config
from stitchml.plan.access import row_run_reads, transposed_reads
from stitchml.testing import compare_with_eager

sys.path.insert(0, "tests")
from planning import plan_of  # noqa: E402


def _copy_back(x):
    # a padded buffer's rows read back to their traced width (pad_gemm's copy-back)
    return x[:, :45] * 2


def _only_kernel(plan):
    (k,) = plan.kernels
    return k


def test_the_probe_tells_row_runs_from_flat_and_transposed_reads():
    x = torch.randn(37, 48)
    plan = plan_of(_copy_back, x)
    k = _only_kernel(plan)
    assert row_run_reads(plan.graph, k) and not transposed_reads(plan.graph, k)
    plan = plan_of(lambda x: x * 2, x)                                   # flat order: no runs
    assert not row_run_reads(plan.graph, _only_kernel(plan))
    plan = plan_of(lambda x: F.pad(x, (0, 3)) * 2, torch.randn(37, 45))  # the pad reads runs of 45
    assert row_run_reads(plan.graph, _only_kernel(plan))
    plan = plan_of(lambda x, b: x + b, x, torch.randn(48))               # a broadcast vector is no full read
    assert not row_run_reads(plan.graph, _only_kernel(plan))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_row_runs_run_one_element_a_thread_and_match_eager(dtype):
    x = torch.randn(37, 48).to(dtype)
    c = compare_with_eager(_copy_back, [x], backward=False)
    k = _only_kernel(c.backend.records[0].plan)
    assert k.row_runs and k.mapping.form == "pointwise"
    assert k.mapping.num_warps * 32 == k.mapping.block_r, k.mapping.describe()
    assert k.mapping.block_r * k.mapping.grid >= 37 * 45
    from stitchml.tools.explain import Report
    assert "row runs out of flat order" in Report(c.backend.records).to_text()


def test_row_runs_knob_off_keeps_the_block_layout():
    x = torch.randn(64, 1030)
    with config.override(flat_row_runs=False):
        k = _only_kernel(plan_of(lambda x: x[:, :1000] * 2, x))
    assert not k.row_runs and k.mapping.num_warps * 32 < k.mapping.block_r
    k = _only_kernel(plan_of(lambda x: x[:, :1000] * 2, x))
    assert k.row_runs and k.mapping.num_warps * 32 == k.mapping.block_r == 512   # (16 warps, the cap)


def test_aligned_row_runs_keep_their_vectors():
    """Runs of 768 at a row stride of 2304 (a fused QKV projection's query part): Triton
    reads them in 16-byte vectors already, so the block layout stays."""
    x = torch.randn(512, 2304, dtype=torch.bfloat16)
    k = _only_kernel(plan_of(lambda x: x[:, :768] * 2, x))
    assert not k.row_runs and k.mapping.num_warps * 32 < k.mapping.block_r


def _loss_grad(x, lse, w):
    """A cross-entropy backward's shape: [tokens, vocab] logits against per-token values
    (the log-sum-exp and a weight), broadcast along each row."""
    return ((x.float() - lse[:, None]).exp() * w[:, None]).to(x.dtype)


def _row_inputs(rows, cols, dtype=torch.float32, device="cpu"):
    return (torch.randn(rows, cols, dtype=dtype, device=device), torch.randn(rows, device=device).abs() + 2,
            torch.randn(rows, device=device))


def test_per_row_values_along_long_rows_walk_rows_at_full_size():
    """GPT-2's loss backward at full size (4096 x 50257, bfloat16, H100): a row kernel that
    loads each token's values once, not a flat kernel dividing its index per element;
    odd rows with a single per-row value, few rows, or short rows stay flat; the knob
    off keeps it flat."""
    from stitchml.plan.access import row_values_domain
    with config.override(device="H100"):
        plan = plan_of(_loss_grad, *_row_inputs(4096, 50257, torch.bfloat16, "meta"))
        k = _only_kernel(plan)
        assert k.domain.col_dims == (1,) and k.mapping.form == "row_looped" and k.mapping.grid == 4096
        assert k.column_tail   # 50257 = 24 whole blocks of 2048 and a tail
        with config.override(row_values=False):
            assert _only_kernel(plan_of(_loss_grad, *_row_inputs(4096, 50257, torch.bfloat16, "meta"))).domain.is_flat
        one = plan_of(lambda x, s: (x.float() * s[:, None]).to(x.dtype), *_row_inputs(4096, 50257, torch.bfloat16,
                                                                                     "meta")[::2])
        assert _only_kernel(one).domain.is_flat                                    # odd rows, one value: vectors win
        one = plan_of(lambda x, s: (x.float() * s[:, None]).to(x.dtype), *_row_inputs(4096, 32000, torch.bfloat16,
                                                                                     "meta")[::2])
        assert _only_kernel(one).domain.col_dims == (1,)                           # aligned rows keep their vectors
        assert _only_kernel(plan_of(_loss_grad, *_row_inputs(128, 50257, torch.bfloat16, "meta"))).domain.is_flat
        short = plan_of(_loss_grad, *_row_inputs(4096, 512, torch.bfloat16, "meta"))
        assert _only_kernel(short).domain.is_flat and row_values_domain(short.graph, _only_kernel(short), 2) is None


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("knobs", [{}, dict(persistent_max_cols=512, loop_block_cols=256)], ids=["rows", "looped"])
def test_per_row_values_walked_as_rows_match_eager(dtype, knobs):
    """16 rows of 1030 (odd: a column tail when looped): the row kernel's values as eager's,
    a transposed full-size read keeps the flat form."""
    with config.override(**knobs):
        c = compare_with_eager(_loss_grad, list(_row_inputs(16, 1030, dtype)), backward=False,
                               **({} if dtype == torch.float32 else dict(rtol=2e-2, atol=2e-2)))
        plan = plan_of(_loss_grad, *_row_inputs(16, 1030, dtype))
        xt = torch.randn(1030, 16, dtype=dtype).t()
        transposed = plan_of(_loss_grad, xt, *_row_inputs(16, 1030, dtype)[1:])
    assert c.num_kernels == 1
    k = _only_kernel(plan)
    assert k.domain.col_dims == (1,) and k.mapping.form == ("row_looped" if knobs else "packed_rows")
    (kt,) = transposed.kernels   # walked in its memory order instead (layout_order), flat
    assert kt.domain.is_flat and kt.mapping.form == "pointwise"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_a_sum_over_few_strided_columns_keeps_its_warps_along_the_rows_and_its_own_launch(dtype):
    """LLaMA's GQA K/V gradient: [b, kv, s, rep, d] summed over its `rep` query heads (4
    columns 64 apart, rows contiguous).  Triton vectorises along the rows and put the
    warps the rows did not fill across the 4 columns (sm_90 at 16 warps: warpsPerCTA
    [4, 4], 3 layout conversions; H200: 150 µs a launch in a horizontal group against
    7.5 predicted).  The mapping caps the warps to those the rows fill and the kernel is
    kept out of launch groups, which run every body at the group's widest warp count."""
    def gqa(x, y):
        return x.sum(3) * 2.0, (y.float() * 3.0).sum(-1)      # an independent launch-bound neighbour
    x = torch.randn(2, 2, 64, 4, 64).to(dtype)
    y = torch.randn(64, 32).to(dtype)
    plan = plan_of(gqa, x, y)
    (k,) = [k for k in plan.kernels if k.mapping.block_c == 4]
    vec = 16 // x.element_size()
    assert k.own_warps and k.mapping.num_warps == max(1, k.mapping.block_r // (32 * vec)), k.mapping
    assert all(k.name not in g.members for g in plan.groups), plan.groups
    compare_with_eager(gqa, [x, y], backward=False, rtol=2e-2 if dtype == torch.bfloat16 else 1e-5,
                       atol=2e-2 if dtype == torch.bfloat16 else 1e-5)
    with config.override(transposed_tiles=False):    # the knob of the transposed-read family
        off = plan_of(gqa, x, y)
    (k_off,) = [k for k in off.kernels if k.mapping.block_c == 4]
    assert not k_off.own_warps and k_off.mapping.num_warps > k.mapping.num_warps
