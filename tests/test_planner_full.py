"""Full planner: column and multi-axis reductions, global scheme, horizontal fusion,
cost model and ILP launch search."""
import time

import pytest
import torch
import torch.nn.functional as F

from stitchml import config, explain
from stitchml.testing import compare_with_eager
from launches import count_launches
from planning import plan_of


def ln_fwd_bwd(x, w, b, g):
    y = F.layer_norm(x, (x.shape[-1],), w, b)
    return (y,) + torch.autograd.grad(y, (x, w, b), g)


def rms_fwd_bwd(x, w, g):
    y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w
    return (y,) + torch.autograd.grad(y, (x, w), g)


def softmax_xent_bwd(x, t):
    loss = F.cross_entropy(x, t)
    return torch.autograd.grad(loss, x)


def running(x, y, z):
    """AStitch's running example: reduce → divide → power → broadcast → reduce → multiply."""
    a = x + y
    r1 = a.sum(1, keepdim=True)
    p1 = (a / r1) ** 2
    r2 = p1.sum(0)
    return p1 * (r2 / z), r2


def gelu_colsum(x):
    return F.gelu(x).sum(0)


def bias_grad(g):
    return g.sum((0, 1))


def attention_scores(s, mask):
    return F.dropout(torch.softmax(s * 0.125 + mask, -1), 0.1, training=True)


def four_regions(a, b, c, d):
    return a * 2 + 1, b.exp(), torch.sin(c) * 3, d - 1


def residual_dropout_ln(x, r, w, b):
    return F.layer_norm(r + F.dropout(x, 0.1, training=True), (x.shape[-1],), w, b)


def two_axes(x):
    return torch.softmax(torch.softmax(x, -1).t(), -1)


def row_then_column_softmax(x):
    return torch.softmax(torch.softmax(x, -1), 0)


def layer_norm_then_batch_norm(x):
    return F.batch_norm(F.layer_norm(x, (x.shape[-1],)), None, None, training=True)


def softmax_then_head_mean(s):
    """attention probabilities averaged over heads (attention rollout): the mean runs
    along a different axis than the softmax"""
    return torch.softmax(s, -1).mean(1)


def ln_forward(x, w, b):
    return F.layer_norm(x, (x.shape[-1],), w, b)


def rn(*s, grad=False):
    return torch.randn(*s, requires_grad=grad)


N, C = 96, 80
CANONICAL = {
    # name: (fn, inputs, max launches, schemes that must appear)
    "layer_norm_fwd_bwd": (ln_fwd_bwd, lambda: [rn(N, C, grad=True), rn(C, grad=True), rn(C, grad=True), rn(N, C)],
                           2, {"regional"}),
    "rms_norm_bwd": (rms_fwd_bwd, lambda: [rn(N, C, grad=True), rn(C, grad=True), rn(N, C)], 2, {"regional"}),
    "softmax_xent_bwd": (softmax_xent_bwd, lambda: [rn(N, C, grad=True), torch.randint(0, C, (N,))], 2,
                         {"regional"}),
    "astitch_running": (running, lambda: [rn(N, C).abs() + 1, rn(N, C).abs() + 1, rn(C).abs() + 1], 1,
                        {"regional", "combine"}),
    "gelu_colsum": (gelu_colsum, lambda: [rn(N, C)], 1, {"combine"}),
    "bias_grad": (bias_grad, lambda: [rn(4, N, C)], 1, {"combine"}),
    "attention_scores": (attention_scores, lambda: [rn(2, 4, 16, 16), rn(2, 1, 1, 16)], 1, {"regional"}),
    "four_regions": (four_regions, lambda: [rn(7, 3), rn(100), rn(5, 6, 7), rn(33)], 1, {"local"}),
    "residual_dropout_ln": (residual_dropout_ln, lambda: [rn(N, C), rn(N, C), rn(C), rn(C)], 1, {"regional"}),
    "two_axes_softmax": (two_axes, lambda: [rn(N, C)], 1, {"regional"}),
    "layer_norm_forward": (ln_forward, lambda: [rn(N, C), rn(C), rn(C)], 1, {"regional"}),
    "softmax_then_head_mean": (softmax_then_head_mean, lambda: [rn(4, 8, 32, 32)], 1, {"regional"}),
    "row_then_column_softmax": (row_then_column_softmax, lambda: [rn(N, C)], 1, {"regional", "combine"}),
    "layer_norm_then_batch_norm": (layer_norm_then_batch_norm, lambda: [rn(N, C)], 1, {"regional", "combine"}),
}


@pytest.mark.parametrize("name", sorted(CANONICAL))
def test_canonical_plans(name):
    fn, make, max_launches, schemes = CANONICAL[name]
    plan = plan_of(fn, *make())
    assert plan.num_kernels <= max_launches, [(k.name, k.scheme) for k in plan.kernels]
    assert schemes <= {k.scheme for k in plan.kernels}
    s = plan.search
    assert s.chosen_s <= s.rule_s + 1e-12, (s.chosen_s, s.rule_s)


def test_ilp_is_strictly_better_than_rules_on_at_least_three():
    better = []
    for name, (fn, make, _, _) in CANONICAL.items():
        s = plan_of(fn, *make()).search
        assert s.method in ("ilp", "rules")
        if s.chosen_s < s.rule_s - 1e-12:
            better.append(name)
    assert len(better) >= 3, better


def test_column_reduction_is_coalesced_along_kept_axis_with_one_combine():
    plan = plan_of(bias_grad, rn(4, 512, 96))
    main, comb = plan.kernels
    assert main.partials and main.domain.cols == 96 and main.domain.rows == 4 * 512
    assert main.mapping.row_blocks >= 1 and comb.combine_of == main.name
    assert plan.num_kernels == 1  # joined by a grid barrier


def test_every_refusal_has_a_reason():
    plan = plan_of(two_axes, rn(N, C))
    assert plan.refusals and all(r.reason for r in plan.refusals)


LAUNCH_CASES = {
    # name: (fn, inputs, max launches over forward + backward, backward?)
    "layer_norm_fwd_bwd": (ln_forward, lambda: [rn(N, C, grad=True), rn(C, grad=True), rn(C, grad=True)], 3),
    "rms_norm_fwd_bwd": (lambda x, w: x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w,
                         lambda: [rn(N, C, grad=True), rn(C, grad=True)], 3),
    "astitch_running": (running, lambda: [rn(N, C).abs() + 1, rn(N, C).abs() + 1, rn(C).abs() + 1], 1),
    "gelu_colsum": (gelu_colsum, lambda: [rn(N, C)], 2),
    "four_regions": (four_regions, lambda: [rn(7, 3), rn(100), rn(5, 6, 7), rn(33)], 1),
}


@pytest.mark.parametrize("name", sorted(LAUNCH_CASES))
def test_launch_counts_under_the_interpreter(name):
    fn, make, limit = LAUNCH_CASES[name]
    inputs = make()
    grad = any(x.requires_grad for x in inputs)
    with count_launches() as n:
        compare_with_eager(fn, inputs, backward=grad)
    assert n["n"] <= limit, n["n"]
    # the phase-split twin (one launch per phase, what a GPU barrier kernel is checked
    # against) computes the same values with at least as many launches
    torch._dynamo.reset()
    with config.override(global_barriers=False, horizontal_fusion=False), count_launches() as m:
        compare_with_eager(fn, inputs, backward=grad)
    assert m["n"] >= n["n"]
    if name in ("astitch_running", "four_regions"):
        assert m["n"] > n["n"]


def test_explain_prints_predicted_times_and_the_search():
    r = explain(running, rn(N, C).abs() + 1, rn(N, C).abs() + 1, rn(C).abs() + 1)
    text = r.to_text()
    assert "predicted" in text and "us" in text and "launch search" in text
    assert all(k.predicted_us > 0 for k in r.kernels)


@pytest.mark.slow
def test_bert_base_training_graph_plans_within_two_seconds():
    pytest.importorskip("transformers")
    from stitchml.tools.graphstats import bert_base, measure
    model, ids = bert_base(batch=1, seq=16, layers=12)
    t0 = time.perf_counter()
    stats = measure(model, ids)
    assert time.perf_counter() - t0 < 600
    # CPU time of the (single-threaded) planner: wall time is at the mercy of whatever
    # else the machine runs (xdist workers); both are printed by graphstats
    cpu_s = sum(g.cpu_s for g in stats.graphs)
    assert cpu_s <= 2.0, stats.line()
    kernels = sum(g.kernels for g in stats.graphs)
    assert kernels < stats.eager_memory_kernels / 2, stats.line()
    assert sum(g.modelled_bytes for g in stats.graphs) < sum(g.unfused_bytes for g in stats.graphs) / 2


def test_every_kernel_a_dry_run_refuses_is_learned_in_the_same_round(monkeypatch):
    """Three copies of fuzz seed 402's pattern (a layer norm read back through a permute:
    the dry run of code generation refuses each copy's kernel).  Each round of planning
    learns from every refused kernel, not from the first only: 6 planning rounds that
    find refusals instead of 18 (halonet's backward was planned 36 times; planning both
    its graphs took 74.7 s, now 27.5 s: bench/NOTES.md, forty-fourth session).  The plan is the same either
    way (12 kernels)."""
    import torch.nn.functional as F

    from stitchml.plan import planner

    def f(*xs):
        return [torch.minimum(F.layer_norm(x.movedim(1, -1), (2,)).movedim(-1, 1), x) for x in xs]

    rounds = []
    real = planner._invalid_kernels

    def counted(g, plan):
        bad = real(g, plan)
        rounds.append(len(bad))
        return bad
    monkeypatch.setattr(planner, "_invalid_kernels", counted)
    plan = plan_of(f, *[rn(24, 2, 2) for _ in range(3)])
    assert len(plan.kernels) == 12
    assert sum(1 for b in rounds if b) <= 6 and max(rounds) == 3, rounds
