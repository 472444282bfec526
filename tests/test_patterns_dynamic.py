"""The pattern rewrites keep applying under dynamic shapes (issue 15 with issue 18's size
changes): after a size change Dynamo hands over a graph whose token counts are
symbolic; the attention, cross-entropy and linear + cross-entropy rewrites compare
sizes without specialising them (`patterns/common.py::same`), so the second and third
sizes run the fused forms too — one dynamic graph, no recompile — forward and backward
against eager.  Before, each refused ("symbolic sizes"): every step after a size change
materialised the score tensor and the log-probabilities."""
import torch
import torch.nn.functional as F

import stitchml
from stitchml import config

W = torch.randn(11, 16, generator=torch.Generator().manual_seed(0), requires_grad=True)


def step(q, k, v, mask, logits, t, h, t2):
    s = (q @ k.transpose(-2, -1)) * 0.125 + mask
    p = torch.softmax(s.float(), dim=-1).to(q.dtype)
    lm = F.linear(h, W).view(-1, 11)
    return p @ v, F.cross_entropy(logits, t), F.cross_entropy(lm, t2.view(-1))


def _inputs(n: int):
    g = torch.Generator().manual_seed(n)
    q, k, v = (torch.randn(2, 4, n, 16, generator=g, requires_grad=True) for _ in range(3))
    return (q, k, v, torch.randn(2, 1, n, n, generator=g), torch.randn(n, 11, generator=g, requires_grad=True),
            torch.randint(0, 11, (n,), generator=g), torch.randn(2, n, 16, generator=g, requires_grad=True),
            torch.randint(0, 11, (2, n), generator=g))


def test_attention_and_both_losses_stay_rewritten_at_new_sizes():
    torch._dynamo.reset()
    backend = stitchml.StitchBackend()
    compiled = torch.compile(step, backend=backend)
    for n in (8, 6, 10):
        args = _inputs(n)
        wrt = [args[i] for i in (0, 1, 2, 4, 6)] + [W]
        with config.override(strict=True, fallback_on_error=False, poison_outputs=True):
            got = compiled(*args)
            got_g = torch.autograd.grad(sum(x.sum() for x in got), wrt)
        want = step(*args)
        want_g = torch.autograd.grad(sum(x.sum() for x in want), wrt)
        for a, e in zip(list(got) + list(got_g), list(want) + list(want_g)):
            assert torch.allclose(a, e, rtol=1e-4, atol=1e-5), n
    applied = [(p.pattern, p.applied) for p in backend.patterns]
    # two Dynamo graphs (the first size, then one with symbolic sizes), each rewritten thrice
    assert sorted(applied) == sorted([("attention", True), ("cross_entropy", True), ("linear_ce", True)] * 2), \
        [p.line() for p in backend.patterns]
    assert [(r.kind, r.dynamic is not None) for r in backend.records] == [
        ("forward", False), ("backward", False), ("forward", True), ("backward", True)]
    assert any("[s" in p.detail for p in backend.patterns if p.pattern == "cross_entropy")   # symbolic rows


def test_a_one_row_reduction_of_a_dynamic_backward_stores_under_its_fixed_row_block():
    """cross-entropy's backward counts the valid targets (one row, the tokens as columns);
    a dynamic template fixes the row block (512), and the store of that row's values
    must address a block of the value's shape (a [1, C] pointer for a [512, C] value
    failed to launch)."""
    torch._dynamo.reset()
    compiled = torch.compile(lambda x, t: F.cross_entropy(x, t, ignore_index=3), backend=stitchml.StitchBackend())
    for n in (8, 6, 10):
        g = torch.Generator().manual_seed(n)
        x = torch.randn(n, 11, generator=g, requires_grad=True)
        t = torch.randint(0, 11, (n,), generator=g)
        with config.override(strict=True, fallback_on_error=False, poison_outputs=True):
            (gx,) = torch.autograd.grad(compiled(x, t), (x,))
        (wx,) = torch.autograd.grad(F.cross_entropy(x, t, ignore_index=3), (x,))
        assert torch.allclose(gx, wx, rtol=1e-5, atol=1e-6)
