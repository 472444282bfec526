"""Buffer placement (`plan/placement.py`, knob `place_cats`): kernels write the parts of a
concatenation straight into its slices, and no kernel copies them; with the folds of a
recurrence's accumulated gradients (`ir/product_sums.py`, knob `product_sums`;
`ir/cat_sums.py::fold_reduction_sums`, knob `reduction_sums`) a GRU's step gradients go
into one buffer that a single weight-gradient product reads.  Interpreter tier (fp32 against
eager, bf16 against float64, outputs poisoned) and plan tier (no kernel run)."""
import sys

import pytest
import torch

from stitchml import config
from stitchml.ir import nodes as ir
from stitchml.plan.data import EagerStep
from stitchml.plan.placement import contiguous_run
from stitchml.testing import compare_against_float64, compare_with_eager

sys.path.insert(0, "tests")
from planning import plan_of  # noqa: E402


def three_parts(x, y, w):
    a = torch.sigmoid(x) * y
    b = torch.tanh(x) + y
    r = (a * b).sum(1)                         # (the parts' kernel reduces: it stays a kernel)
    c = (x * y).sum(-1, keepdim=True) * x      # a part from another kernel with a row reduction
    z = torch.cat([a, b, c], dim=1)
    return z @ w, z.sum(0), r


def _cat_members(plan):
    return [m for k in plan.kernels for m in k.members if plan.graph[m].kind == ir.CAT]


def _placed(plan):
    return {n.id: n.attr("placed_in") for n in plan.graph.nodes if n.attr("placed_in") is not None}


def test_parts_written_in_place_and_match():
    x, y, w = torch.randn(64, 40), torch.randn(64, 40), torch.randn(120, 8)
    c = compare_with_eager(three_parts, [x, y, w], backward=False)
    (rec,) = c.backend.records
    plan = rec.plan
    assert not _cat_members(plan), "a kernel still copies the concatenation"
    placed = _placed(plan)
    assert len(placed) == 3 and len({cat for cat, _ in placed.values()}) == 1
    assert sorted(off for _, off in placed.values()) == [0, 40, 80]   # element offsets of the column slices
    assert "placed" in rec.wrapper_source                               # the parts are views of one buffer
    with config.override(place_cats=False):
        off = plan_of(three_parts, x, y, w)
    assert _cat_members(off) and not _placed(off)
    moved = lambda p: sum(k.bytes_read + k.bytes_written for k in p.kernels)   # noqa: E731
    assert moved(plan) < moved(off)


def test_placement_bf16_against_float64():
    x, y, w = (torch.randn(33, 48).bfloat16(), torch.randn(33, 48).bfloat16(), torch.randn(144, 8).bfloat16())
    c, verdict = compare_against_float64(three_parts, [x, y, w], backward=False)
    verdict.assert_ok("placed concatenation, bf16")
    assert _placed(c.backend.records[0].plan)


def test_explain_names_the_placement():
    from stitchml.tools.explain import explain
    text = explain(three_parts, torch.randn(16, 40), torch.randn(16, 40), torch.randn(120, 8)).to_text()
    assert "written in place" in text and "buffer placement" in text


def test_a_returned_part_is_not_placed():
    """A graph output keeps a buffer of its own: the concatenation is copied."""
    def fn(x, y):
        a, b = x.sin(), y.cos()
        return torch.cat([a, b], 1), a

    x, y = torch.randn(32, 24), torch.randn(32, 24)
    c = compare_with_eager(fn, [x, y], backward=False)
    plan = c.backend.records[0].plan
    assert not _placed(plan) and _cat_members(plan)


def test_narrow_parts_are_not_placed():
    """Parts of 4 floats a row (16 bytes) would be written in partial sectors."""
    def fn(x, y):
        return torch.cat([x.sin(), y.cos()], 1).sum(1)

    plan = plan_of(fn, torch.empty(256, 4), torch.empty(256, 4))
    assert not _placed(plan)
    assert contiguous_run((256, 4), (8, 1)) == 4 and contiguous_run((256, 4), (4, 1)) == 1024
    assert contiguous_run((2, 3, 4), (12, 1, 3)) == 24 and contiguous_run((2, 3, 4), (24, 1, 6)) == 3


def test_a_part_mutated_in_place_is_not_placed():
    def fn(x, y):
        a = x * 2
        z = torch.cat([a, y + 1], 0)
        a.add_(1)
        return z, a

    x, y = torch.randn(16, 32), torch.randn(16, 32)
    compare_with_eager(fn, [x, y], backward=False)


def gru_loss(x, h0, w_ih, w_hh, b_ih, b_hh):
    """An unrolled GRU (torch.nn.GRUCell's equations) over x's steps, summed."""
    h, outs = h0, []
    gi_all = x @ w_ih.t() + b_ih
    for t in range(x.shape[1]):
        gi = gi_all[:, t]
        gh = h @ w_hh.t() + b_hh
        i_r, i_z, i_n = gi.chunk(3, 1)
        h_r, h_z, h_n = gh.chunk(3, 1)
        r = torch.sigmoid(i_r + h_r)
        z = torch.sigmoid(i_z + h_z)
        n = torch.tanh(i_n + r * h_n)
        h = (1 - z) * n + z * h
        outs.append(h)
    return torch.stack(outs, 1)


def _gru_inputs(b, t, d, hidden, dtype=torch.float32):
    def p(*s):
        return (torch.randn(*s) * 0.3).to(dtype).requires_grad_()
    return [torch.randn(b, t, d).to(dtype).requires_grad_(), torch.randn(b, hidden).to(dtype).requires_grad_(),
            p(3 * hidden, d), p(3 * hidden, hidden), p(3 * hidden), p(3 * hidden)]


def _backward_plan(c):
    return [r for r in c.backend.records if r.kind == "backward"][0].plan


def test_gru_training_step_one_weight_gradient_product():
    """Six steps: the hidden weights' gradient is one product over the six steps (not six
    products and five adds), its operand the step gradients written in place."""
    c = compare_with_eager(gru_loss, _gru_inputs(16, 6, 12, 32))
    plan = _backward_plan(c)
    g = plan.graph
    mms = [g[s.node] for s in plan.steps if isinstance(s, EagerStep) and s.op == "aten.mm.default"]
    folded = [n for n in mms if n.attr("fx_name", "").startswith("folded_mm")]
    assert len(folded) == 1, [n.shape for n in mms]
    a = g[folded[0].refs[0]]
    while a.kind == ir.VIEW:
        a = g[a.refs[0]]
    assert a.kind == ir.CAT and len(a.refs) == 6
    # each step's gate gradients (a step concatenation) are placed in the joined operand
    assert a.attr("placed") and all(g[r].attr("placed_in") == (a.id, i * 16 * 96) for i, r in enumerate(a.refs))
    with config.override(product_sums=False):
        c_off = compare_with_eager(gru_loss, _gru_inputs(16, 6, 12, 32))
    off = _backward_plan(c_off)
    n_off = sum(isinstance(s, EagerStep) and s.op == "aten.mm.default" for s in off.steps)
    assert len(mms) <= n_off - 5, (len(mms), n_off)


def test_a_concatenation_of_step_concatenations_is_read_piece_by_piece():
    """The input weights' gradient reads the steps' gate gradients, each step a
    concatenation of three gates: one load a gate, its pointer chosen per row among the
    steps (`emit_core._cat_of_cats`), not a select of the steps' selects (3 x 6 loads; the
    96-wide rows are 3 segments of 32 beside the bias gradient's partials, each reading the
    3 pieces: `mapping.segmented_partials`)."""
    c = compare_with_eager(gru_loss, _gru_inputs(16, 6, 12, 32))
    rec = [r for r in c.backend.records if r.kind == "backward"][0]
    g = rec.plan.graph

    def inner_pieces(k):   # the pieces of each part, where k's members hold such a concatenation
        for m in k.members:
            n = g[m]
            if n.kind == ir.CAT and len(n.refs) >= 4:
                parts = [g[r] for r in n.refs]
                while all(p.kind == ir.VIEW for p in parts):
                    parts = [g[p.refs[0]] for p in parts]
                if all(p.kind == ir.CAT for p in parts):
                    return len(parts[0].refs)
        return 0
    found = [(k, inner_pieces(k)) for k in rec.plan.kernels if inner_pieces(k)]
    assert found, "no kernel reads a concatenation of concatenations: test something else"
    for k, pieces in found:   # (the kernel reads nothing else; each row segment reads every piece)
        assert rec.kernels[k.name].source.count("tl.load(") == pieces * k.mapping.segments and pieces == 3, k.name


def test_gru_bf16_against_float64():
    c, verdict = compare_against_float64(gru_loss, _gru_inputs(8, 5, 16, 24, torch.bfloat16))
    verdict.assert_ok("GRU training step, bf16")
    plan = _backward_plan(c)
    assert any(plan.graph[s.node].attr("fx_name", "").startswith("folded_mm") for s in plan.steps
               if isinstance(s, EagerStep))


def sum_of_products(xs, ws):
    out = xs[0] @ ws[0]
    for x, w in zip(xs[1:], ws[1:]):
        out = out + x @ w
    return out


@pytest.mark.parametrize("transposed", [False, True], ids=["plain", "transposed"])
def test_sum_of_products_is_one_product(transposed):
    xs = [torch.randn(24, 8 + i) for i in range(5)]
    ws = [torch.randn(8 + i, 20) for i in range(5)]

    def fn(*t):
        if transposed:   # (x @ w)^T summed: folded as w^T x^T
            return sum_of_products([w.t() for w in t[5:]], [x.t() for x in t[:5]]).t() * 2
        return sum_of_products(t[:5], t[5:]) * 2

    c = compare_with_eager(fn, xs + ws, backward=False)
    plan = c.backend.records[0].plan
    mms = [s for s in plan.steps if isinstance(s, EagerStep)]
    assert len(mms) == 1 and plan.graph[mms[0].node].attr("fx_name").startswith("folded_mm")


def test_large_products_are_not_folded():
    """Four 4096-square products: concatenating their operands costs more than the three
    launches saved."""
    shapes = [(4096, 4096)] * 8
    with config.override(device="H200"):
        plan = plan_of(lambda *t: sum_of_products(t[:4], t[4:]), *[torch.empty(*s) for s in shapes])
    assert sum(isinstance(s, EagerStep) for s in plan.steps) == 4


def test_sums_over_steps_are_one_reduction():
    """Bias gradients accumulated over steps: the column sums of 6 values added are one sum."""
    def fn(*xs):
        out = xs[0].sum(0)
        for x in xs[1:]:
            out = out + x.sum(0)
        return out

    xs = [torch.randn(64, 30) for _ in range(6)]
    c = compare_with_eager(fn, xs, backward=False)
    plan = c.backend.records[0].plan
    reds = [m for k in plan.kernels for m in k.members if plan.graph[m].kind == ir.REDUCE]
    assert len({plan.graph[m].id for m in reds}) == 1
    with config.override(reduction_sums=False):
        off = plan_of(fn, *xs)
    assert len({m for k in off.kernels for m in k.members if off.graph[m].kind == ir.REDUCE}) == 6


def test_gru_with_changing_batch_matches_eager():
    """Dynamic shapes: the folds apply at every size, placement is off in the templates
    (`PlanOptions.fixed_row_blocks`), and every call matches eager."""
    import stitchml
    backend = stitchml.StitchBackend()
    f = torch.compile(gru_loss, backend=backend, dynamic=True)
    for b in (16, 23, 40):
        inputs = _gru_inputs(b, 5, 12, 32)
        ref_in = [t.detach().clone().requires_grad_() for t in inputs]
        out = f(*inputs)
        ref = gru_loss(*ref_in)
        cot = torch.randn_like(ref)
        out.backward(cot)
        ref.backward(cot)
        assert (out - ref).abs().max() <= 1e-5 * ref.abs().max() + 1e-6, b
        for a, e in zip(inputs, ref_in):
            assert (a.grad - e.grad).norm() <= 1e-5 * e.grad.norm() + 1e-6, (b, tuple(a.shape))
    assert all(r.eager_reason is None for r in backend.records)
    dyn = [r for r in backend.records if r.dynamic is not None]
    assert dyn and all(not r.dynamic.eager_calls for r in dyn)


def test_a_reader_of_a_placed_concatenation_never_shares_a_launch_with_its_writers():
    """Launch grouping sees a placed concatenation as written by the kernels that write its
    parts (`KernelPlan.completes`): launch-bound writers and readers side by side would
    otherwise run in one horizontal launch, the reader racing the writers on a GPU."""
    def fn(x, y):
        a = torch.sigmoid(x) * y
        b = torch.tanh(x) + y
        r = (a * b).sum(1)
        z = torch.cat([a, b], 1)
        return z * 3, z, r

    x, y = torch.randn(8, 32), torch.randn(8, 32)
    c = compare_with_eager(fn, [x, y], backward=False)
    plan = c.backend.records[0].plan
    assert _placed(plan)
    by_name = {k.name: k for k in plan.kernels}
    (cat,) = {c for c, _ in _placed(plan).values()}
    writers = {k.name for k in plan.kernels if cat in k.completes}
    readers = {k.name for k in plan.kernels if cat in k.inputs}
    assert writers and readers
    for grp in plan.groups:
        if grp.kind == "horizontal":
            assert not (writers & set(grp.members) and readers & set(grp.members)), grp
    for name in readers:   # and every reader runs after every writer
        order = [s.name for s in plan.steps if hasattr(s, "name")]
        assert all(order.index(w) < order.index(name) for w in writers)
    del by_name
