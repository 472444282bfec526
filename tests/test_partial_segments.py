"""Column partials beside rows whose width is not a power of two are held as row segments
(`plan/mapping.py::segmented_partials`, knob `partial_segments`): 384 columns as three
unmasked tiles of 128, not one tile of 512 with a quarter of its lanes masked."""
import sys

import torch

from stitchml import config
from stitchml.testing import compare_against_float64, compare_with_eager

sys.path.insert(0, "tests")
from planning import plan_on  # noqa: E402
from test_looped_partials import ln_backward_by_hand  # noqa: E402


def gelu_grad_by_hand(x, dy):
    """An FFN's GELU backward with its bias gradient (Swin-T's, 384 columns a token)."""
    xf, g = x.float(), dy.float()
    cdf = 0.5 * (1 + torch.erf(xf * 0.7071067811865476))
    pdf = torch.exp(-0.5 * xf * xf) * 0.3989422804014327
    dx = g * (cdf + xf * pdf)
    return dx.to(x.dtype), dx.sum(0).to(x.dtype)


def _partial_kernel(plan):
    (k,) = [k for k in plan.kernels if k.partials]
    return k


def test_rows_of_384_are_three_unmasked_segments_beside_their_column_sum():
    shapes = [(100352, 384), (100352, 384)]
    m = _partial_kernel(plan_on("H200", gelu_grad_by_hand, *shapes, dtype=torch.bfloat16)).mapping
    assert (m.form, m.segments, m.block_c, m.num_warps, m.block_r) == ("packed_rows", 3, 128, 8, 16), m
    off = _partial_kernel(plan_on("H200", gelu_grad_by_hand, *shapes, dtype=torch.bfloat16,
                                  partial_segments=False)).mapping
    assert (off.segments, off.block_c) == (1, 512), off
    # a power-of-two row has no masked lanes to drop
    m2 = _partial_kernel(plan_on("H200", gelu_grad_by_hand, (100352, 512), (100352, 512),
                                 dtype=torch.bfloat16)).mapping
    assert m2.segments == 1, m2


def test_a_norm_backward_beside_its_partials_keeps_one_tile():
    # row reductions as well: a vector of every segment a thread took 255 registers on sm_90
    plan = plan_on("H200", ln_backward_by_hand, (100352, 384), (384,), (100352, 384), dtype=torch.bfloat16)
    assert all(k.mapping.segments == 1 for k in plan.kernels if k.partials)


def test_segmented_partials_match_eager():
    x, dy = torch.randn(512, 384), torch.randn(512, 384)
    c = compare_with_eager(gelu_grad_by_hand, [x, dy], backward=False)
    (rec,) = c.backend.records
    m = _partial_kernel(rec.plan).mapping
    assert m.segments == 3 and m.block_c == 128, m
    src = rec.kernels[_partial_kernel(rec.plan).name].source
    loop = src.split("for rblk")[1].split("\n    cflat = ")[0]   # (the walk over row blocks)
    assert "cmask_s2 = tl.full" in loop and "< 384" not in loop, src   # three whole segments, no lane masked


def test_segmented_partials_in_bfloat16_against_float64():
    x, dy = torch.randn(256, 384).to(torch.bfloat16), torch.randn(256, 384).to(torch.bfloat16)
    c, verdict = compare_against_float64(gelu_grad_by_hand, [x, dy], backward=False)
    verdict.assert_ok("GELU backward with its bias gradient, bf16, as row segments")
    assert _partial_kernel(c.backend.records[0].plan).mapping.segments == 3


AOT_SCRIPT = '''
import json, torch
from stitchml import config
from stitchml.tools.aot_check import check
import sys
sys.path.insert(0, "tests")
from test_partial_segments import gelu_grad_by_hand
bf = torch.bfloat16
out = {}
for on in (True, False):
    with config.override(partial_segments=on):
        r = check(gelu_grad_by_hand, torch.empty(100352, 384, dtype=bf), torch.empty(100352, 384, dtype=bf),
                  device="H200")
    out[str(on)] = [x.__dict__ for x in r]
print(json.dumps(out))
'''


def test_segments_compile_for_sm90_with_fewer_instructions():
    """sm_90 (no GPU needed): the segmented kernel compiles without spilling and issues
    under 80 % of the masked tile's warp-instructions (Triton 3.6: 1.52 against 2.14 a
    real element)."""
    from test_aot_gpu import _run_outside_interpreter
    res = _run_outside_interpreter(AOT_SCRIPT)
    assert all(r["ok"] for rs in res.values() for r in rs), res

    def partial_kernel(rs):
        (r,) = [r for r in rs if r["warp_instructions"] and r["kernel"] == "k0"]
        return r
    on, off = partial_kernel(res["True"]), partial_kernel(res["False"])
    assert on["spills"] == 0 and on["registers"] <= 128, on
    assert on["warp_instructions"] < 0.8 * off["warp_instructions"], (on["warp_instructions"],
                                                                      off["warp_instructions"])


def test_the_knob_is_read_by_the_plan_options():
    from stitchml.plan.options import PlanOptions
    with config.override(partial_segments=False):
        assert PlanOptions.from_config("H200").partial_segments is False
    assert PlanOptions.from_config("H200").partial_segments is True
