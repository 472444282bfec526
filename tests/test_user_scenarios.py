"""How users call compiled code beyond a plain forward and backward: `inference_mode`,
`torch.func` transforms inside a compiled function, `autograd.functional.jacobian` of
one, module forward hooks and tensor gradient hooks, `mark_dynamic`, parameter updates
under `no_grad`, and double backward (which AOTAutograd refuses, as under Inductor).
Interpreter tier: every result against eager on fresh random inputs (outputs poisoned by
conftest), strict mode with the fallback off, kernels counted and no op eager but
library work."""
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import stitchml
from stitchml import config
from stitchml.fallback import by_design


class _Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln, self.l1, self.l2 = nn.LayerNorm(16), nn.Linear(16, 32), nn.Linear(32, 16)

    def forward(self, x):
        return x + self.l2(F.gelu(self.l1(self.ln(x))))


def _check_stitched(backend, kernels: int = 1) -> None:
    """Every graph planned (none whole eager), no op eager but library work, and at least
    `kernels` stitched kernels over the graphs."""
    assert backend.records
    for r in backend.records:
        assert r.eager_reason is None, r.eager_reason
        bad = [f"{f.op}: {f.reason}" for f in r.graph.fallbacks if not by_design(f.reason)]
        assert not bad, bad
    assert sum(r.plan.num_kernels for r in backend.records) >= kernels


@pytest.fixture(autouse=True)
def _strict():
    with config.override(strict=True, fallback_on_error=False):
        yield


def test_inference_mode_stitches_and_matches_eager():
    m = _Block()
    backend = stitchml.StitchBackend()
    compiled = torch.compile(m, backend=backend)
    x = torch.randn(4, 16)
    with torch.inference_mode():
        got = compiled(x)
        want = m(x)
    torch.testing.assert_close(got, want)
    _check_stitched(backend, kernels=2)


def test_vmap_grad_and_jacrev_inside_a_compiled_function():
    w = torch.randn(7)
    b1, b2, b3 = (stitchml.StitchBackend() for _ in range(3))
    vm = torch.compile(lambda x, w: torch.vmap(lambda r: (r * w).softmax(-1))(x), backend=b1)
    x = torch.randn(5, 7)
    torch.testing.assert_close(vm(x, w), (x * w).softmax(-1))
    gr = torch.compile(torch.func.grad(lambda t: (t.sin() * t).sum()), backend=b2)
    t = torch.randn(9)
    torch.testing.assert_close(gr(t), t.sin() + t * t.cos())
    jr = torch.compile(lambda t: torch.func.jacrev(lambda u: u.exp() * u.sum())(t), backend=b3)
    t = torch.randn(4)
    torch.testing.assert_close(jr(t), torch.diag(t.exp() * t.sum()) + t.exp()[:, None].expand(4, 4))
    for b in (b1, b2, b3):
        _check_stitched(b)


def test_jacobian_of_a_compiled_function():
    backend = stitchml.StitchBackend()
    f = torch.compile(lambda x: x.tanh().cumsum(0), backend=backend)
    x = torch.randn(6)
    got = torch.autograd.functional.jacobian(f, x)
    want = torch.autograd.functional.jacobian(lambda x: x.tanh().cumsum(0), x)
    torch.testing.assert_close(got, want)
    assert {r.kind for r in backend.records} == {"forward", "backward"}
    _check_stitched(backend, kernels=2)


def test_forward_hooks_and_gradient_hooks_match_eager():
    m, e = _Block(), _Block()
    e.load_state_dict(m.state_dict())
    for mod in (m, e):
        mod.l1.register_forward_hook(lambda _mod, _inp, out: out * 0.5)
    backend = stitchml.StitchBackend()
    compiled = torch.compile(m, backend=backend)
    x = torch.randn(4, 16, requires_grad=True)
    xe = x.detach().requires_grad_()
    got, want = compiled(x), e(xe)
    for y in (got, want):
        y.register_hook(lambda g: g * 2)
    w = torch.randn(4, 16)
    (got * w).sum().backward()
    (want * w).sum().backward()
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(x.grad, xe.grad)
    for p, q in zip(m.parameters(), e.parameters()):
        torch.testing.assert_close(p.grad, q.grad)
    _check_stitched(backend, kernels=3)


def test_mark_dynamic_serves_three_sizes_with_one_graph():
    backend = stitchml.StitchBackend()
    f = torch.compile(lambda x: F.layer_norm(x, (x.shape[-1],)) * x.amax(0), backend=backend)
    for n in (5, 9, 13):
        x = torch.randn(n, 24)
        torch._dynamo.mark_dynamic(x, 0)
        torch.testing.assert_close(f(x), F.layer_norm(x, (24,)) * x.amax(0))
    assert len(backend.records) == 1 and backend.records[0].dynamic is not None
    _check_stitched(backend)


def test_parameter_updates_under_no_grad_write_the_parameters():
    m, e = _Block(), _Block()
    e.load_state_dict(m.state_dict())
    backend = stitchml.StitchBackend()

    def update(model):
        with torch.no_grad():
            for p in model.parameters():
                p.mul_(0.9).add_(0.01)

    torch.compile(update, backend=backend)(m)
    update(e)
    for p, q in zip(m.parameters(), e.parameters()):
        torch.testing.assert_close(p, q)
    _check_stitched(backend)


def test_double_backward_raises_aotautograds_error_not_ours():
    """A gradient of a compiled graph's gradient: AOTAutograd's compiled backward is not
    differentiable (as under Inductor); the first gradient with create_graph=True is
    still eager's."""
    backend = stitchml.StitchBackend()
    f = torch.compile(lambda x: (x.sin() ** 2).sum(), backend=backend)
    x = torch.randn(5, requires_grad=True)
    (g,) = torch.autograd.grad(f(x), x, create_graph=True)
    torch.testing.assert_close(g, 2 * x.sin() * x.cos())
    with pytest.raises(RuntimeError, match="does not currently support double backward"):
        torch.autograd.grad(g.sum(), x)
