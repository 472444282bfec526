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


# ----------------------------------------------- nn.TransformerEncoder's inference fast path

@pytest.mark.parametrize("norm_first,activation", [(False, "relu"), (True, "gelu")], ids=["post-relu", "pre-gelu"])
def test_transformer_encoder_inference_fast_path_is_stitched(norm_first, activation):
    """In eval mode without gradients each layer is one native op,
    `aten._transformer_encoder_layer_fwd` (it ran eagerly: "no lowering rule"); taken apart
    (capture/decomp_transformer.py), its layer norms, residual adds and activation stitch
    and only the attention block and the linear layers stay library work."""
    layer = nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True, norm_first=norm_first,
                                       activation=activation)
    enc = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False).eval()
    backend = stitchml.StitchBackend()
    compiled = torch.compile(enc, backend=backend)
    x = torch.randn(3, 5, 16)
    pad = torch.rand(3, 5) > 0.6
    pad[:, 0] = False   # (a sequence all padding is NaN in the fast path, values in the slow one)
    with torch.no_grad():
        for kw in ({}, {"src_key_padding_mask": pad}):
            torch.testing.assert_close(compiled(x, **kw), enc(x, **kw))
    ops = {f.op for r in backend.records for f in r.graph.fallbacks}
    assert "aten._native_multi_head_attention.default" in ops, ops
    assert not any("transformer_encoder_layer" in op for op in ops), ops
    # per layer: the two layer norms with their residual adds and the activation at least
    _check_stitched(backend, kernels=2 * 3)


@pytest.mark.parametrize("mask_type", [None, 0, 1, 2])
@pytest.mark.parametrize("norm_first,use_gelu", [(False, False), (True, True)])
def test_transformer_layer_decomposition_is_the_native_ops_composition(mask_type, norm_first, use_gelu):
    """The decomposition against the native op in float64, for every mask type the
    module passes (0: an (L, L) mask; 1: a (B, L) key padding mask; 2: (B, H, L, L))."""
    from stitchml.capture.decomp_transformer import transformer_encoder_layer
    torch.manual_seed(3)
    b, n, e, h, f = 2, 6, 8, 2, 12
    d = dict(dtype=torch.float64)
    args = [torch.randn(b, n, e, **d), e, h, torch.randn(3 * e, e, **d) / 3, torch.randn(3 * e, **d),
            torch.randn(e, e, **d) / 3, torch.randn(e, **d), use_gelu, norm_first, 1e-5,
            torch.rand(e, **d) + 0.5, torch.randn(e, **d), torch.rand(e, **d) + 0.5, torch.randn(e, **d),
            torch.randn(f, e, **d) / 3, torch.randn(f, **d), torch.randn(e, f, **d) / 3, torch.randn(e, **d)]
    shape = {None: None, 0: (n, n), 1: (b, n), 2: (b, h, n, n)}[mask_type]
    mask = None if shape is None else torch.rand(shape) > 0.6
    if mask is not None:
        mask[..., 0] = False   # (no row masked whole)
    want = torch.ops.aten._transformer_encoder_layer_fwd(*args, mask, mask_type)
    got = transformer_encoder_layer(*args, mask, mask_type)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    empty = torch.empty(0, n, e, **d)
    assert transformer_encoder_layer(empty, *args[1:], None, None).shape == empty.shape


# ------------------------------------------------------------------ recurrent layers

@pytest.fixture
def _allow_rnn():
    # Dynamo runs nn.RNN/GRU/LSTM eagerly, whole, unless asked (under any backend)
    with torch._dynamo.config.patch(allow_rnn=True):
        yield


@pytest.mark.parametrize("cls", [nn.GRU, nn.RNN], ids=["gru", "rnn"])
def test_recurrent_layers_train_stitched_with_allow_rnn(cls, _allow_rnn):
    torch.manual_seed(0)
    m, e = cls(8, 6, num_layers=2, batch_first=True), cls(8, 6, num_layers=2, batch_first=True)
    e.load_state_dict(m.state_dict())
    backend = stitchml.StitchBackend()
    compiled = torch.compile(m, backend=backend)
    x = torch.randn(3, 5, 8)
    w = torch.randn(3, 5, 6)
    got, want = compiled(x)[0], e(x)[0]
    (got * w).sum().backward()
    (want * w).sum().backward()
    torch.testing.assert_close(got, want)
    for p, q in zip(m.parameters(), e.parameters()):
        torch.testing.assert_close(p.grad, q.grad)
    assert {r.kind for r in backend.records} == {"forward", "backward"}
    _check_stitched(backend, kernels=10)


def test_lstm_inference_on_the_cpu_takes_onednns_layer_as_library_work(_allow_rnn):
    """torch's LSTM decomposition picks oneDNN's fused layer on the CPU: a vendor kernel,
    by design (it had no reason and strict mode refused it).  (Training the same way
    fails in AOTAutograd itself, under `aot_eager` and Inductor too: the layer's
    workspace is None outside training mode, which its runtime does not save.)"""
    m = nn.LSTM(8, 6, num_layers=2, batch_first=True).eval()
    backend = stitchml.StitchBackend()
    compiled = torch.compile(m, backend=backend)
    x = torch.randn(3, 5, 8)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x)[0], m(x)[0])
    ops = {f.op for r in backend.records for f in r.graph.fallbacks}
    if torch.backends.mkldnn.is_available():
        assert "aten.mkldnn_rnn_layer.default" in ops, ops
    _check_stitched(backend, kernels=0)


def test_an_eager_result_returned_only_may_be_none_as_eager_returns_it():
    """The check of an eager op's result: None where the metadata says a tensor passes
    through for a value no kernel or view reads (oneDNN's LSTM workspace outside training,
    only saved for its own backward op); anywhere else it is an error, not a wrong read."""
    from stitchml.runtime.wrapper import Checker
    check = Checker()
    i = check.register("op[3]")
    assert check(None, (2,), (1,), torch.float32, i, True) is None and i in check.passed
    j = check.register("op[0]")
    with pytest.raises(RuntimeError, match="returned NoneType"):
        check(None, (2,), (1,), torch.float32, j)


# ------------------------------------------------- the rest of torch.optim's optimizers

OPTIMIZERS = {   # (tests/test_optimizers.py: AdamW, Adam with amsgrad, SGD with Nesterov, centered RMSprop)
    "adagrad": lambda ps: torch.optim.Adagrad(ps, lr=1e-2, foreach=True),
    "adadelta": lambda ps: torch.optim.Adadelta(ps, foreach=True),
    "adamax": lambda ps: torch.optim.Adamax(ps, lr=1e-2, foreach=True),
    "nadam": lambda ps: torch.optim.NAdam(ps, lr=1e-2, foreach=True, decoupled_weight_decay=True, weight_decay=0.01),
    "radam": lambda ps: torch.optim.RAdam(ps, lr=1e-2, foreach=True),
    "asgd": lambda ps: torch.optim.ASGD(ps, lr=1e-2, foreach=True),
    "rprop": lambda ps: torch.optim.Rprop(ps, lr=1e-2, foreach=True),
    "sgd_per_tensor": lambda ps: torch.optim.SGD(ps, lr=1e-2, foreach=False),
}


@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_optimizer_steps_compile_to_kernels_and_match_eager(name):
    g = torch.Generator().manual_seed(int(torch.randint(0, 2**31, ())))
    eager_ps = [nn.Parameter(torch.randn(s, generator=g)) for s in [(8, 6), (6,), (5, 8)]]
    mine_ps = [nn.Parameter(p.detach().clone()) for p in eager_ps]
    eager_opt, mine_opt = OPTIMIZERS[name](eager_ps), OPTIMIZERS[name](mine_ps)
    backend = stitchml.StitchBackend()
    step = torch.compile(lambda: mine_opt.step(), backend=backend)
    for _ in range(3):
        for p, q in zip(eager_ps, mine_ps):
            grad = torch.randn(p.shape, generator=g)
            p.grad, q.grad = grad.clone(), grad.clone()
        eager_opt.step()
        step()
    for p, q in zip(eager_ps, mine_ps):
        torch.testing.assert_close(q, p, rtol=1e-5, atol=1e-6)
    _check_stitched(backend)


# ------------------------------------------------------- the gradient scaler's ops

@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
@pytest.mark.parametrize("overflow", [False, True], ids=["finite", "inf"])
def test_gradient_scaler_unscale_is_stitched_and_sets_found_inf_like_eager(dtype, overflow):
    """`_amp_foreach_non_finite_check_and_unscale_` (GradScaler.unscale_ in a compiled
    step) ran eagerly: the gradients times the inverse scale, found_inf set to 1 when any
    value is not finite and never cleared (capture/decomp_amp.py)."""
    grads = [(torch.randn(6, 4) * 1024).to(dtype), (torch.randn(4) * 1024).to(dtype)]
    if overflow:
        grads[1][2] = float("inf")
    found, inv = torch.full((), float(torch.rand(()) < 0.5)), torch.full((), 1 / 1024.0)
    want_grads, want_found = [g.clone() for g in grads], found.clone()
    backend = stitchml.StitchBackend()
    torch.compile(lambda g, f, i: torch._amp_foreach_non_finite_check_and_unscale_(g, f, i), backend=backend)(
        grads, found, inv)
    torch._amp_foreach_non_finite_check_and_unscale_(want_grads, want_found, inv)
    for g, w in zip(grads, want_grads):
        assert torch.equal(g, w)
    assert torch.equal(found, want_found)
    _check_stitched(backend)


@pytest.mark.parametrize("found_inf,tracker", [(0.0, 0), (0.0, 1998), (0.0, 1999), (1.0, 1999)])
def test_gradient_scaler_scale_update_follows_eager(found_inf, tracker):
    scale, growth = torch.full((), 3.0e38 if tracker == 1999 and found_inf == 0 else 1024.0), \
        torch.full((), tracker, dtype=torch.int32)
    cases = [(scale.clone(), growth.clone()), (torch.full((), 1024.0), growth.clone())]
    for s, t in cases:   # (the first at 3e38 where it would grow: a scale grown past float32 is not kept)
        s2, t2 = s.clone(), t.clone()
        backend = stitchml.StitchBackend()
        torch.compile(lambda s, t, f: torch._amp_update_scale_(s, t, f, 2.0, 0.5, 2000), backend=backend)(
            s, t, torch.full((), found_inf))
        torch._amp_update_scale_(s2, t2, torch.full((), found_inf), 2.0, 0.5, 2000)
        assert torch.equal(s, s2) and torch.equal(t, t2), (s, s2, t, t2)
        _check_stitched(backend)


@pytest.mark.parametrize("align_corners", [False, True])
@pytest.mark.parametrize("size", [(2, 3, 5, 7), (2, 3, 4, 5, 6)], ids=["2d", "3d"])
def test_affine_grid_is_stitched_around_its_product(size, align_corners):
    """`affine_grid_generator` ran eagerly ("no lowering rule"): torch's decomposition,
    the base grid times theta, is a batched product (library) and kernels."""
    theta = torch.randn(2, len(size) - 2, len(size) - 1)
    tc, te = theta.clone().requires_grad_(), theta.clone().requires_grad_()
    backend = stitchml.StitchBackend()
    got = torch.compile(lambda t: F.affine_grid(t, size, align_corners=align_corners), backend=backend)(tc)
    want = F.affine_grid(te, size, align_corners=align_corners)
    g = torch.randn(want.shape)
    got.backward(g)
    want.backward(g)
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(tc.grad, te.grad)
    _check_stitched(backend, kernels=2)


# ------------------------------------------------------------ jagged nested tensors

def test_jagged_nested_tensors_are_stitched_at_changing_lengths():
    """A jagged nested tensor reaches the backend as its dense values plus its ragged
    size, a number input nothing reads whose run-time value is a nested int: binding it as
    a size crashed inside stitchml (`dynamic/shapes.py`: it is an "unused" input now)."""
    backend = stitchml.StitchBackend()
    f = torch.compile(lambda t: F.layer_norm(F.gelu(t) * 2, (8,)), backend=backend)
    for lengths in ((3, 5), (2, 7), (6, 1)):
        nt = torch.nested.nested_tensor([torch.randn(n, 8) for n in lengths], layout=torch.jagged)
        got = f(nt)
        assert got.is_nested
        torch.testing.assert_close(got.values(), F.layer_norm(F.gelu(nt) * 2, (8,)).values())
    assert any(r.dynamic is not None for r in backend.records)
    _check_stitched(backend)


def test_jagged_nested_tensor_gradient():
    parts = [torch.randn(3, 8), torch.randn(5, 8)]
    mine, ref = (torch.nested.nested_tensor(parts, layout=torch.jagged, requires_grad=True) for _ in range(2))
    backend = stitchml.StitchBackend()
    torch.compile(lambda t: (F.gelu(t) * 2).values().sum(), backend=backend)(mine).backward()
    (F.gelu(ref) * 2).values().sum().backward()
    torch.testing.assert_close(mine.grad.values(), ref.grad.values())
    assert {r.kind for r in backend.records} == {"forward", "backward"}
    _check_stitched(backend, kernels=2)
