"""Kernels whose row count (element count, for flat kernels) the row block divides test
no row mask (`KernelPlan.exact_rows`, knob `exact_rows`): `rmask` is a constant True,
which Triton folds, so a masked load followed by `where(mask, x, identity)` costs no
select per element.  Every kernel form that takes it, alone, in a horizontal launch and
as a phase of a global launch, against eager on fresh random inputs, outputs poisoned
(tests/conftest.py); the sm_90 instruction counts are checked in tests/test_aot_gpu.py."""
import sys

import pytest
import torch
import torch.nn.functional as F

from stitchml import config
from stitchml.codegen import generate_all
from stitchml.testing import compare_with_eager

sys.path.insert(0, "tests")
from planning import graph_of, plan_of  # noqa: E402

CONSTANT = "rmask = tl.full("


def _sources(plan) -> dict:
    return {name: ks.source for name, ks in generate_all(plan.graph, plan).items()}


def _row_masks(plan) -> dict[str, bool]:
    """Per kernel of the plan: whether its row mask is the constant."""
    srcs = _sources(plan)
    return {k.name: CONSTANT in srcs[k.name] for k in plan.kernels}


def test_divisible_rows_get_a_constant_mask_and_others_do_not():
    # 64 rows of 301: looped or on-chip rows, the row block divides 64
    plan = plan_of(lambda x: torch.softmax(x, -1) * 2, torch.randn(64, 301))
    (k,) = plan.kernels
    assert k.exact_rows and k.mapping.block_r and 64 % k.mapping.block_r == 0
    src = _sources(plan)[k.name]
    assert CONSTANT in src and "rmask = rflat <" not in src, src
    # 7 rows of 100 (packed: a warp holds several such rows): a row block of 8 does not
    # divide them, the mask stays
    plan = plan_of(lambda x: torch.softmax(x, -1) * 2, torch.randn(7, 100))
    (k,) = plan.kernels
    assert k.mapping.block_r == 8 and "rmask = rflat < 7" in _sources(plan)[k.name]
    # flat: 4096 elements in blocks that divide them; 4099 do not divide
    assert all(_row_masks(plan_of(lambda x: x.exp() + 1, torch.randn(4096))).values())
    assert not any(_row_masks(plan_of(lambda x: x.exp() + 1, torch.randn(4099))).values())
    with config.override(exact_rows=False):
        plan = plan_of(lambda x: torch.softmax(x, -1) * 2, torch.randn(64, 301))
    assert not any(_row_masks(plan).values()) and not any(k.exact_rows for k in plan.kernels)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_row_forms_with_constant_masks_match_eager(dtype):
    """On-chip rows, packed rows, looped rows (online softmax, cross-entropy), and layer
    norm's backward with column partials walked by a grid-stride loop over row blocks."""
    x = torch.randn(64, 300).to(dtype).requires_grad_()
    w, b = torch.randn(300, requires_grad=True), torch.randn(300, requires_grad=True)
    c = compare_with_eager(lambda x, w, b: F.layer_norm(x.float(), (300,), w, b), [x, w, b])
    kernels = [k for r in c.backend.records for k in r.plan.kernels]
    assert any(k.partials for k in kernels)
    assert sum(CONSTANT in ks.source for r in c.backend.records
               for ks in generate_all(r.plan.graph, r.plan).values()) >= 2
    long = torch.randn(16, 9000).to(dtype).requires_grad_()
    t = torch.randint(0, 9000, (16,))
    c = compare_with_eager(lambda x, t: (F.cross_entropy(x.float(), t), torch.softmax(x.float(), -1)), [long, t])
    looped = [(r, k) for r in c.backend.records for k in r.plan.kernels if k.mapping.form == "row_looped"]
    assert looped and any(CONSTANT in generate_all(r.plan.graph, r.plan)[k.name].source for r, k in looped)


def test_constant_masks_inside_horizontal_and_global_launches_match_eager():
    """A body in a horizontal launch gets program ids below its own grid, and a global
    launch's phase walks virtual ids below its grid: their rows stay in range without
    the mask.  Small independent kernels (horizontal) and a column sum's partials with
    their combine (global, where the cost model picks it) over divisible rows."""
    a, b = torch.randn(64, 32), torch.randn(128, 16)

    def fn(a, b):
        return a.exp().sum(-1), (b * 2).amax(-1), a.sum(0) + 1

    c = compare_with_eager(fn, [a, b], backward=False)
    groups = [g for r in c.backend.records for g in r.plan.groups]
    assert groups, "expected a launch group"
    srcs = [ks.source for r in c.backend.records for ks in generate_all(r.plan.graph, r.plan).values()]
    assert any(CONSTANT in s for s in srcs)


def test_dynamic_templates_keep_the_row_mask():
    """A dynamic template's row count is an argument: its kernels keep `rflat < rows`
    (planned with fixed row blocks)."""
    from stitchml.plan.options import PlanOptions
    from stitchml.plan.planner import build_plan
    plan = build_plan(graph_of(lambda x: torch.softmax(x, -1) * 2, torch.randn(64, 301)),
                      PlanOptions.from_config(fixed_row_blocks=True))
    assert not any(_row_masks(plan).values()) and not any(k.exact_rows for k in plan.kernels)
