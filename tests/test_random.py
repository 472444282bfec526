"""Random numbers generated inside kernels: distribution, seeding, independence."""
import sys
from pathlib import Path

import torch

import stitchml

sys.path.insert(0, str(Path(__file__).parent))
from philox_ref import four_word_uniforms, recorded_seeds  # noqa: E402


def _run(fn, *args):
    be = stitchml.StitchBackend()
    out = torch.compile(fn, backend=be)(*args)
    assert all(r.plan is not None and not r.graph.fallbacks for r in be.records), \
        [r.graph.fallbacks for r in be.records]
    return out


def test_uniform_normal_and_bernoulli_statistics():
    def f(x, p):
        # the uniform draw is returned as drawn: (x + u) - x can round up to exactly 1.0
        return torch.rand_like(x), x * 2, torch.randn(20000), torch.bernoulli(p), torch.bernoulli(x, 0.25)

    x = torch.randn(20000)
    p = torch.rand(20000)
    u, x2, n, b, b2 = _run(f, x, p)
    assert torch.equal(x2, x * 2)
    assert 0 <= u.min().item() and u.max().item() < 1 and abs(u.mean().item() - 0.5) < 0.02
    assert abs(n.mean().item()) < 0.03 and abs(n.std().item() - 1) < 0.03
    assert set(b.unique().tolist()) <= {0.0, 1.0}
    # bernoulli(p) hits with probability p: compare against the expected count
    assert abs(b.sum().item() - p.sum().item()) < 4 * (p * (1 - p)).sum().sqrt().item()
    assert abs(b2.mean().item() - 0.25) < 0.02


def test_manual_seed_reproduces_and_calls_differ():
    f = torch.compile(lambda x: x * torch.rand_like(x), backend=stitchml.StitchBackend())
    x = torch.randn(5000)
    torch.manual_seed(3)
    a = f(x)
    torch.manual_seed(3)
    b = f(x)
    c = f(x)
    assert torch.equal(a, b) and not torch.equal(a, c)


def test_two_random_tensors_in_one_kernel_are_independent():
    u, v = _run(lambda x: (torch.rand_like(x), torch.rand_like(x)), torch.randn(20000))
    assert not torch.equal(u, v)
    assert abs(torch.corrcoef(torch.stack([u, v]))[0, 1].item()) < 0.05


def test_in_place_uniform_and_normal_fills_are_stitched_with_their_range_and_moments():
    """`empty(...).uniform_(a, b)` / `.normal_(m, s)` (functionalised to aten.uniform /
    aten.normal_functional: NumPy random draws that Dynamo traces into torch ops, weight
    inits in a compiled step)."""
    def f(x):
        u = torch.empty(20000).uniform_(-3.0, 5.0)
        n = torch.empty(20000).normal_(2.0, 0.5)
        u01 = torch.empty_like(x).uniform_()
        return u, n, u01 * 1.0 + x * 0.0

    u, n, u01 = _run(f, torch.randn(20000))
    assert -3.0 <= u.min().item() and u.max().item() < 5.0 and abs(u.mean().item() - 1.0) < 0.08
    assert abs(u.std().item() - 8.0 / 12 ** 0.5) < 0.05
    assert abs(n.mean().item() - 2.0) < 0.02 and abs(n.std().item() - 0.5) < 0.02
    assert 0.0 <= u01.min().item() and u01.max().item() < 1.0 and abs(u01.mean().item() - 0.5) < 0.02


def test_seeds_of_a_call_are_drawn_at_once_and_differ_per_kernel():
    """Kernels with random ops in separate launches (an eager matrix product between
    them) take their seeds from one draw at the start of the call: distinct seeds,
    new ones each call, the same again under torch.manual_seed."""
    w = torch.randn(64, 64)

    def f(x):
        a = torch.nn.functional.dropout(x, 0.5)
        return torch.nn.functional.dropout(a @ w, 0.5), a

    be = stitchml.StitchBackend()
    g = torch.compile(f, backend=be)
    x = torch.randn(64, 64)
    torch.manual_seed(7)
    y1, a1 = g(x)
    src = be.records[0].wrapper_source
    assert "h0, h1, = _seeds(2)" in src and "_seed()" not in src, src
    keep = (a1 != 0)
    # each mask keeps about half, and the two launches' masks are not the same draw
    assert abs(keep.float().mean().item() - 0.5) < 0.05 and abs((y1 != 0).float().mean().item() - 0.5) < 0.05
    assert not torch.equal(keep, y1 != 0)
    torch.manual_seed(7)
    y2, a2 = g(x)
    y3, a3 = g(x)
    assert torch.equal(y1, y2) and torch.equal(a1, a2) and not torch.equal(a1, a3)
    torch.testing.assert_close(a1, torch.where(keep, x * 2, 0.0))   # eager's scaling of what it keeps




def test_device_seeds_give_the_four_word_uniforms(monkeypatch):
    """CUDA-graph mode (kernels read their seed from a device buffer redrawn per call):
    the same four-words-a-Philox-call values as the host-seeded form, bit for bit, on the
    seed the buffer held for that call (the recorder reads the buffer back, as the GPU
    twin in tests/test_gpu.py does under a real replay)."""
    from planning import plan_of
    from stitchml.codegen import generate_all
    from stitchml.runtime import wrapper as wr

    drawn = recorded_seeds(monkeypatch)
    n = 4 * 1031 + 3
    x = torch.randn(n)
    fn = lambda x: torch.rand_like(x) + x * 0   # noqa: E731
    plan = plan_of(fn, x)
    call, code = wr.build_callable(plan, generate_all(plan.graph, plan), torch.device("cpu"), device_seeds=True)
    assert "SEEDS.draw()" in code
    for _ in range(2):   # (the buffer is redrawn: the second call's seed is read back)
        u = call([x])[0]
        seeds = list(drawn)
        assert len(seeds) == 1 and not drawn.host
        assert torch.equal(four_word_uniforms(seeds[0], n), u)


def test_each_philox_call_serves_four_neighbouring_elements(monkeypatch):
    """Element i's uniform is word (i & 3) of the Philox block at i >> 2: one call serves
    four elements.  Every kernel form gives the same values — the point-wise and row forms
    from one `randint4x` over a quarter-width tile (`emit_core._uniform_tile`), a
    row-looped kernel per element (`triton_ops._rand4`) — checked bit for bit against
    Triton's own `randint4x` on the seed the call drew.  Neighbours stay uncorrelated (a
    block's four words are independent) and normals keep their moments."""
    drawn = recorded_seeds(monkeypatch)
    n = 4 * 1031 + 3   # (a last, partial block)
    u, z = _run(lambda x: (torch.rand_like(x), torch.randn_like(x)), torch.empty(n))
    assert any(torch.equal(four_word_uniforms(s, n), u) for s in drawn), \
        "no seed of the call gives the kernel's uniforms as four words a Philox call"
    # a row form (the mask feeds a softmax of its rows: its tile is the row block's
    # columns) and a looped row (too long for registers: per element)
    for shape in ((24, 1000), (3, 40000)):
        drawn.clear()
        x = torch.randn(shape)
        keep, _ = _run(lambda x: (lambda m: (m, (x * m).softmax(-1)))(torch.rand_like(x) < 0.5), x)
        assert 0.4 < keep.float().mean().item() < 0.6
        assert any(torch.equal(keep, four_word_uniforms(s, x.numel()).view(shape) < 0.5) for s in drawn), shape
    assert abs(torch.corrcoef(torch.stack([u[:-1], u[1:]]))[0, 1].item()) < 0.05
    assert abs(z.mean().item()) < 0.06 and abs(z.std().item() - 1) < 0.05
    assert abs(torch.corrcoef(torch.stack([z[:-1], z[1:]]))[0, 1].item()) < 0.05
