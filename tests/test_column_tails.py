"""Row-looped kernels whose column count is not a multiple of the column block walk the
whole blocks with a constant column mask and the partial block in a loop of its own
(`KernelPlan.column_tail`, knob `column_tails`), so that Triton can vectorise the reads
of the whole blocks.  Every looped construct (reductions, the online softmax pair, arg
reductions, forward scans, element-wise outputs, column partials) against eager on
fresh random inputs, outputs poisoned (tests/conftest.py); the sm_90 code is checked in
tests/test_aot_gpu.py."""
import sys

import pytest
import torch
import torch.nn.functional as F

from stitchml import config
from stitchml.codegen import generate_all
from stitchml.testing import compare_with_eager

sys.path.insert(0, "tests")
from planning import plan_of  # noqa: E402

ODD = 8195          # > persistent_max_cols (8192): looped, 4 whole blocks of 2048 and a 3-column tail


def _looped(plan):
    return [k for k in plan.kernels if k.mapping.form == "row_looped"]


def test_odd_rows_get_a_tail_loop_and_even_rows_do_not():
    # (rows of 8195 are also an odd stride: the aligned form is tests/test_align_rows.py)
    with config.override(align_rows=False):
        plan = plan_of(lambda x: torch.softmax(x, -1), torch.randn(4, ODD))
    (k,) = _looped(plan)
    assert k.column_tail
    src = generate_all(plan.graph, plan)[k.name].source
    assert f"for cbase in range(0, 8192, {k.mapping.block_c}):" in src, src
    assert f"for cbase in range(8192, {ODD}, {k.mapping.block_c}):" in src, src
    assert "cmask = tl.full(" in src and f"cmask = cflat < {ODD}" in src
    (k,) = _looped(plan_of(lambda x: torch.softmax(x, -1), torch.randn(4, 16384)))
    assert not k.column_tail
    with config.override(column_tails=False):
        (k,) = _looped(plan_of(lambda x: torch.softmax(x, -1), torch.randn(4, ODD)))
    assert not k.column_tail


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_softmax_and_cross_entropy_over_odd_rows_match_eager(dtype):
    # (the looped form is what these cover: bfloat16 rows this long are otherwise held whole,
    # knob `persistent_long_rows`, which tests/test_mapping.py checks against eager)
    with config.override(persistent_long_rows=False):
        x = torch.randn(5, ODD).to(dtype).requires_grad_()
        c = compare_with_eager(lambda x: torch.softmax(x.float(), -1), [x])
        assert any(k.column_tail for r in c.backend.records for k in r.plan.kernels)
        t = torch.randint(0, ODD, (5,))
        c = compare_with_eager(lambda x, t: F.cross_entropy(x.float(), t), [x, t])
        assert any(k.column_tail for r in c.backend.records for k in r.plan.kernels)


def test_argmax_sum_and_elementwise_outputs_over_odd_rows_match_eager():
    x = torch.randn(3, ODD)
    x[1, 8193] = 50.0                       # the maximum in the tail block
    x[2, 17] = 50.0                         # and in a whole block
    c = compare_with_eager(lambda x: (x.argmax(-1), x.sum(-1), x - x.amax(-1, keepdim=True)), [x],
                           backward=False)
    assert any(k.column_tail for r in c.backend.records for k in r.plan.kernels)


@pytest.mark.parametrize("scan", ["cumsum", "cummax", "reversed_cumsum"])
def test_scans_over_odd_rows_match_eager(scan):
    """Forward scans carry their prefix from the whole blocks into the tail; a scan read
    backwards walks the row from its end in one masked loop (no tail split)."""
    fn = {"cumsum": lambda x: torch.cumsum(x, -1) * 2,
          "cummax": lambda x: torch.cummax(x, -1).values + 1,
          "reversed_cumsum": lambda x: torch.flip(torch.cumsum(torch.flip(x, (-1,)), -1), (-1,)) * 2}[scan]
    x = torch.randn(3, 301, dtype=torch.float64)
    with config.override(persistent_max_cols=64, loop_block_cols=16):   # looped rows of 301 in blocks of 16
        c = compare_with_eager(fn, [x], backward=False)
    looped = [k for r in c.backend.records for k in r.plan.kernels if k.mapping.form == "row_looped"]
    assert looped and all(k.column_tail for k in looped), [k.mapping.describe() for k in looped]


def test_layer_norm_backward_with_looped_column_partials_over_odd_rows_matches_eager():
    x = torch.randn(16, ODD, requires_grad=True)
    w, b = torch.randn(ODD, requires_grad=True), torch.randn(ODD, requires_grad=True)
    c = compare_with_eager(lambda x, w, b: F.layer_norm(x, (ODD,), w, b), [x, w, b])
    tails = [k for r in c.backend.records for k in r.plan.kernels if k.column_tail]
    assert any(k.partials for k in tails), [(k.name, k.mapping.describe(), k.partials) for k in tails]
