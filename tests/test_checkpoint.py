"""Activation checkpointing (`torch.utils.checkpoint.checkpoint(..., use_reentrant=False)`,
issue 18.6) with the stitch backend, both ways it is used:

- **inside** a compiled model: Dynamo traces the checkpointed block as a higher-order op
  and AOTAutograd's partitioner recomputes the block's forward in the backward graph
  (stitchml compiles that backward graph, recomputation included);
- **around** compiled blocks: the eager checkpoint reruns the block's compiled forward
  graph during backward, after restoring the RNG state it saved.

Outputs and every gradient (parameters and input) match eager in float32, stitched
kernels run in the forward and the backward graphs, and the recomputation is counted.

Dropout inside the checkpointed block: stitchml's dropout draws its Philox seed from
torch's default generator when the kernel launches, so checkpoint's RNG-state restore
must make the recomputed mask equal the forward's.  Stitched Philox masks are not
eager's bernoulli masks, so the judge is eager run with the mask the compiled forward
applied (read off its dropout output): the gradients, computed from the recomputed
mask, must match it.

Dropout inside the checkpointed block *inside* a compiled model: AOTAutograd
(`_functorch/partitioners.py::functionalize_rng_ops`) wraps the random op of a
recomputed region as `higher_order.run_and_save_rng_state(native_dropout, ...)` in the
forward graph (returning `(state, (out, mask))`) and `higher_order.run_with_rng_state(
state, native_dropout, ...)` in the backward graph.  stitchml lowers both
(`lower/rules_rng_state.py`): the forward saves the generator's state (marked as
stitchml's) and advances the generator, and both graphs seed their Philox kernel from
a hash of that state, so the recomputed mask is the forward's.  Mixed modes (one graph
stitched, the other eager) never pair an eager mask with a Philox one: they fail
loudly, or the backward falls back to eager where the forward did."""
import copy
import warnings

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

import stitchml
import stitchml.pipeline
from stitchml import config
from stitchml.ir import nodes as ir
from stitchml.lower import rules_rng_state
from stitchml.lower.lower import Lowerer
from stitchml.lower.registry import Unsupported
from stitchml.runtime import cuda_graphs
from stitchml.runtime.steps import RNG_STATE_MARK, CaptureRngState
from stitchml.testing import assert_close
from torch._prims.rng_prims import run_and_save_rng_state, run_with_rng_state

B, T, D, BLOCKS = 3, 5, 16, 2
P = 0.25  # dropout probability in the dropout variants


class Block(nn.Module):
    """Pre-norm MLP block; returns the new residual stream and the dropout output.
    With `mask` set, the dropout is replaced by that fixed mask (the eager judge)."""

    def __init__(self, d: int, p: float = 0.0):
        super().__init__()
        self.ln = nn.LayerNorm(d)
        self.fc1, self.fc2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)
        self.p = p
        self.mask: torch.Tensor | None = None

    def forward(self, x):
        h = F.gelu(self.fc1(self.ln(x)))
        d = h * self.mask * (1.0 / (1.0 - self.p)) if self.mask is not None else F.dropout(h, self.p, self.training)
        return x + self.fc2(d), d


class Model(nn.Module):
    def __init__(self, p: float = 0.0, ckpt: bool = True):
        super().__init__()
        self.blocks = nn.ModuleList(Block(D, p) for _ in range(BLOCKS))
        self.ckpt = ckpt

    def forward(self, x):
        drops = []
        for blk in self.blocks:
            x, d = checkpoint(blk, x, use_reentrant=False) if self.ckpt else blk(x)
            drops.append(d)
        return x, drops


def _inputs(seed: int):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(B, T, D, generator=g)
    return x, torch.randn(B, T, D, generator=g)  # input, cotangent


def _run(fn, params, x, cot):
    """Output and gradients (parameters, then input) of loss = <out, cot>."""
    x = x.clone().requires_grad_()
    out, drops = fn(x)
    grads = torch.autograd.grad((out * cot).sum(), [*params, x])
    return out.detach(), [d.detach() for d in drops], grads


def _check(actual, expected, names):
    out_a, _, grads_a = actual
    out_e, _, grads_e = expected
    assert_close(out_a, out_e, "output")
    for name, a, e in zip(names, grads_a, grads_e):
        assert_close(a, e, f"grad {name}")


def _names(model):
    return [n for n, _ in model.named_parameters()] + ["x"]


def _fallbacks(rec) -> list[tuple[str, str]]:
    return [(f.op, f.reason) for f in rec.graph.fallbacks]


def _assert_stitched(backend, calls: dict[str, int]):
    """Every graph compiled (none fell back whole), has kernels, leaves only matrix
    products to ATen, and ran `calls[kind]` times in all."""
    recs = backend.records
    assert {r.kind for r in recs} == {"forward", "backward"}, [r.kind for r in recs]
    for r in recs:
        assert r.eager_reason is None, (r.kind, r.eager_reason)
        assert r.plan.num_kernels > 0, r.kind
        bad = [f for f in _fallbacks(r) if not f[1].startswith("compute-intensive")]
        assert not bad, (r.kind, bad)
    for kind, n in calls.items():
        assert sum(r.calls for r in recs if r.kind == kind) == n, [(r.kind, r.calls) for r in recs]


def test_checkpoint_inside_compiled_model_matches_eager_and_recomputes():
    torch.manual_seed(0)
    model = Model(ckpt=True)
    params = list(model.parameters())
    x, cot = _inputs(1)
    expected = _run(model, params, x, cot)

    backend = stitchml.StitchBackend()
    actual = _run(torch.compile(model, backend=backend), params, x, cot)
    _check(actual, expected, _names(model))
    _assert_stitched(backend, {"forward": 1, "backward": 1})  # one graph each: the whole model

    # the same model without checkpoint, compiled: what a graph holds without recomputation
    plain = Model(ckpt=False)
    plain.load_state_dict(model.state_dict())
    plain_backend = stitchml.StitchBackend()
    _check(_run(torch.compile(plain, backend=plain_backend), list(plain.parameters()), x, cot), expected,
           _names(plain))

    def graph(be, kind):
        (rec,) = [r for r in be.records if r.kind == kind]
        return rec

    def addmms(rec):
        return sum(op == "aten.addmm.default" for op, _ in _fallbacks(rec))

    # recomputation happened in the backward graph: each block's fc1 (a forward matrix
    # product, with its bias) is recomputed there; without checkpoint the backward has none
    assert addmms(graph(backend, "backward")) == BLOCKS, _fallbacks(graph(backend, "backward"))
    assert addmms(graph(plain_backend, "backward")) == 0
    # and the forward saves less for the backward (its outputs beyond the model's own)
    saved_ckpt = len(graph(backend, "forward").graph.outputs)
    saved_plain = len(graph(plain_backend, "forward").graph.outputs)
    assert saved_ckpt < saved_plain, (saved_ckpt, saved_plain)
    # the recomputed LayerNorm/GELU are stitched into the backward graph's kernels
    assert graph(backend, "backward").plan.num_kernels > graph(plain_backend, "backward").plan.num_kernels


def _compiled_blocks(model: Model, backend) -> list:
    return [torch.compile(blk, backend=backend) for blk in model.blocks]


def _blocks_fn(blocks, ckpt: bool, preserve_rng_state: bool = True):
    def fn(x):
        drops = []
        for blk in blocks:
            if ckpt:
                x, d = checkpoint(blk, x, use_reentrant=False, preserve_rng_state=preserve_rng_state)
            else:
                x, d = blk(x)
            drops.append(d)
        return x, drops
    return fn


def test_compiled_blocks_inside_checkpoint_match_eager_and_rerun_the_forward_graph():
    torch.manual_seed(0)
    model = Model(ckpt=False)
    params = list(model.parameters())
    x, cot = _inputs(2)
    expected = _run(_blocks_fn(model.blocks, ckpt=True), params, x, cot)
    backend = stitchml.StitchBackend()
    actual = _run(_blocks_fn(_compiled_blocks(model, backend), ckpt=True), params, x, cot)
    _check(actual, expected, _names(model))
    # each block's compiled forward ran twice (forward, then recomputation in backward),
    # its backward once
    _assert_stitched(backend, {"forward": 2 * BLOCKS, "backward": BLOCKS})


def _judge_with_forward_masks(model: Model, actual, x, cot):
    """Eager with each block's dropout replaced by the mask the compiled forward applied."""
    judge = copy.deepcopy(model)
    for blk, d in zip(judge.blocks, actual[1]):
        blk.mask = (d != 0).to(d.dtype)
        assert 0 < blk.mask.mean().item() < 1  # dropout really dropped something
    return _run(judge, list(judge.parameters()), x, cot)


def test_dropout_mask_replayed_by_checkpoint_around_compiled_blocks():
    """Compiled blocks with dropout under eager checkpoint: the recomputation draws its
    Philox seed again after checkpoint restored torch's generator, so the backward's mask
    is the forward's.  Without the restore (`preserve_rng_state=False`) it is not: the
    same check then fails, which shows the check can see a wrong mask."""
    torch.manual_seed(0)
    model = Model(p=P, ckpt=False)
    model.train()
    params = list(model.parameters())
    x, cot = _inputs(3)
    backend = stitchml.StitchBackend()
    blocks = _compiled_blocks(model, backend)

    torch.manual_seed(123)
    actual = _run(_blocks_fn(blocks, ckpt=True), params, x, cot)
    _check(actual, _judge_with_forward_masks(model, actual, x, cot), _names(model))
    _assert_stitched(backend, {"forward": 2 * BLOCKS, "backward": BLOCKS})
    # the dropout is stitched: a random number node inside a forward kernel
    fw = [r for r in backend.records if r.kind == "forward"]
    assert all(any(k.seeds for k in r.plan.kernels) for r in fw)

    # the same seed without checkpoint gives the same forward (and so the same gradients)
    torch.manual_seed(123)
    plain = _run(_blocks_fn(blocks, ckpt=False), params, x, cot)
    for a, e in zip(plain[1], actual[1]):
        assert torch.equal(a != 0, e != 0)
    _check(plain, actual, _names(model))

    # negative control: no RNG restore, so the recomputed mask differs
    torch.manual_seed(123)
    wrong = _run(_blocks_fn(blocks, ckpt=True, preserve_rng_state=False), params, x, cot)
    with pytest.raises(AssertionError, match="^grad "):
        _check(wrong, _judge_with_forward_masks(model, wrong, x, cot), _names(model))


def _dropout_inside_compiled_model(seed: int = 321, steps: int = 1, backend=None):
    """The dropout model compiled, run `steps` times after `torch.manual_seed(seed)`:
    (model, x, cot, backend, results per step, stitchml warnings)."""
    torch.manual_seed(0)
    model = Model(p=P, ckpt=True)
    model.train()
    x, cot = _inputs(4)
    backend = backend or stitchml.StitchBackend()
    compiled = torch.compile(model, backend=backend)
    torch.manual_seed(seed)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        results = [_run(compiled, list(model.parameters()), x, cot) for _ in range(steps)]
    return model, x, cot, backend, results, [str(w.message) for w in caught if "stitchml" in str(w.message)]


def _masks(result) -> list[torch.Tensor]:
    return [d != 0 for d in result[1]]


def _graph(backend, kind: str):
    (rec,) = [r for r in backend.records if r.kind == kind]
    return rec


def _replayed_random_nodes(rec) -> list:
    """Random nodes of a graph seeded from a saved RNG state, each inside a kernel."""
    seeded = {nid for k in rec.plan.kernels for nid in k.seeds}
    nodes = [n for n in rec.graph.nodes if n.kind == ir.RAND]
    assert {n.id for n in nodes} <= seeded, "a random node outside any kernel"
    return [n for n in nodes if n.refs]


def test_dropout_in_checkpoint_inside_compiled_model_is_stitched():
    _, _, _, backend, _, stitch_warnings = _dropout_inside_compiled_model()
    _assert_stitched(backend, {"forward": 1, "backward": 1})
    assert not stitch_warnings, stitch_warnings


def test_dropout_in_checkpoint_inside_compiled_model_is_replayed_exactly():
    """Forward and backward both stitch the dropout (one Philox random node per block,
    seeded from the state the forward saved), and the gradients, computed from the
    recomputed masks, equal eager's run with the forward's masks."""
    model, x, cot, backend, (actual,), _ = _dropout_inside_compiled_model()
    _check(actual, _judge_with_forward_masks(model, actual, x, cot), _names(model))
    fw, bw = _graph(backend, "forward"), _graph(backend, "backward")
    for rec in (fw, bw):
        assert len(_replayed_random_nodes(rec)) == BLOCKS, rec.kind
        assert rec.wrapper_source.count("_state_seed(") == BLOCKS, rec.wrapper_source
        assert not [f for f in _fallbacks(rec) if "rng_state" in f[0]], _fallbacks(rec)
        # the state is captured / the seed derived on the host per call: no CUDA-graph replay
        assert "activation-checkpointed" in (cuda_graphs.plan_refusal(rec.plan) or ""), rec.kind
    # the forward returns the generator states it saved (one per block), stitchml-marked
    states = [n for n in fw.graph.nodes if n.kind == ir.OPAQUE and n.op.startswith(CaptureRngState.NAME)]
    marked = (torch.get_rng_state().numel() + len(RNG_STATE_MARK),)
    assert len(states) == BLOCKS and all(n.dtype == torch.uint8 and n.shape == marked for n in states)
    # dropout's statistics: about 1 - P of the elements kept, each block its own mask
    m0, m1 = _masks(actual)
    for m in (m0, m1):
        assert abs(m.float().mean().item() - (1 - P)) < 0.06, m.float().mean()
    assert not torch.equal(m0, m1)


def test_single_output_random_op_in_checkpoint_is_replayed():
    """`rand_like` (one result: the backward's `run_with_rng_state` has no getitem users
    and no metadata) is stitched in both graphs; the gradient uses the forward's mask."""
    def fn(x):
        return checkpoint(lambda x: x.sin() * (torch.rand_like(x) > 0.3), x, use_reentrant=False)

    backend = stitchml.StitchBackend()
    x, cot = torch.randn(4, 33, requires_grad=True), torch.randn(4, 33)
    torch.manual_seed(1)
    out = torch.compile(fn, backend=backend)(x)
    (grad,) = torch.autograd.grad((out * cot).sum(), [x])
    keep = out != 0
    assert 0.5 < keep.float().mean().item() < 0.9
    assert_close(grad, x.detach().cos() * keep * cot, "grad x")
    for kind in ("forward", "backward"):
        rec = _graph(backend, kind)
        assert rec.eager_reason is None and not _fallbacks(rec), (kind, rec.eager_reason, _fallbacks(rec))
        assert len(_replayed_random_nodes(rec)) == 1, kind


def test_checkpointed_dropout_masks_differ_per_call_and_repeat_under_manual_seed():
    _, _, _, _, (a1, a2), _ = _dropout_inside_compiled_model(seed=321, steps=2)
    _, _, _, _, (b1, b2), _ = _dropout_inside_compiled_model(seed=321, steps=2)
    _, _, _, _, (c1,), _ = _dropout_inside_compiled_model(seed=322)
    assert not torch.equal(_masks(a1)[0], _masks(a2)[0])   # each call draws anew
    assert not torch.equal(_masks(a1)[0], _masks(c1)[0])   # another seed, other masks
    for a, b in ((a1, b1), (a2, b2)):                     # the same seed, the same step: bit-equal
        assert torch.equal(a[0], b[0])
        assert all(torch.equal(p, q) for p, q in zip(a[1], b[1]))
        assert all(torch.equal(p, q) for p, q in zip(a[2], b[2]))


def test_generator_advances_in_the_forward_and_is_left_alone_by_the_backward():
    torch.manual_seed(0)
    model = Model(p=P, ckpt=True)
    model.train()
    x, cot = _inputs(4)
    compiled = torch.compile(model, backend=stitchml.StitchBackend())
    _run(compiled, list(model.parameters()), x, cot)  # (compiles both graphs)

    torch.manual_seed(7)
    before = torch.rand(8)
    torch.manual_seed(7)
    xr = x.clone().requires_grad_()
    out, _ = compiled(xr)
    after_forward = torch.get_rng_state()
    (out * cot).sum().backward()
    assert torch.equal(torch.get_rng_state(), after_forward)  # as eager's run_with_rng_state leaves it
    assert not torch.equal(torch.rand(8), before)             # the forward drew: later numbers differ


def _inject_eager(monkeypatch, hop, whole_graph: bool):
    """Make the graph holding `hop` run it eagerly: the whole graph (its lowering
    fails) or only the wrapped random op (its rule refuses)."""
    holds = lambda gm: any(n.target is hop for n in gm.graph.nodes)  # noqa: E731
    if whole_graph:
        real = stitchml.pipeline.lower

        def lower(gm):
            if holds(gm):
                raise Unsupported("injected lowering failure")
            return real(gm)
        monkeypatch.setattr(stitchml.pipeline, "lower", lower)
        return
    real_rule = Lowerer.apply_rule

    def apply_rule(self, node, args, kwargs):
        if isinstance(node, rules_rng_state._Wrapped) and holds(self.gm):
            raise Unsupported("injected refusal")
        return real_rule(self, node, args, kwargs)
    monkeypatch.setattr(Lowerer, "apply_rule", apply_rule)


@pytest.mark.parametrize("whole_graph", [False, True], ids=["op", "graph"])
def test_stitched_forward_with_an_eager_backward_fails_loudly(monkeypatch, whole_graph):
    """The forward stitched the dropout; the backward would replay it with eager's
    bernoulli (another mask: silently wrong gradients).  Eager's `run_with_rng_state`
    refuses stitchml's marked state instead."""
    _inject_eager(monkeypatch, run_with_rng_state, whole_graph)
    backend = stitchml.StitchBackend()
    # (CPU: "Expected a CPUGeneratorImplState of size 5056 but found ... 5072"; CUDA: "RNG state is wrong size")
    with config.override(fallback_on_error=True), pytest.raises(RuntimeError, match="RNG state (is wrong )?size"):
        _dropout_inside_compiled_model(backend=backend)
    assert _graph(backend, "forward").eager_reason is None and _replayed_random_nodes(_graph(backend, "forward"))
    bw = _graph(backend, "backward")
    if whole_graph:  # (the backward's saved-state input has a symbolic size: the dynamic runner's per-call eager)
        reasons = [bw.eager_reason] + (bw.dynamic.eager_calls if bw.dynamic is not None else [])
        assert "Unsupported: injected lowering failure" in reasons, reasons
    else:
        assert [op for op, reason in _fallbacks(bw) if reason.endswith("injected refusal")] == \
            ["run_with_rng_state"] * BLOCKS
        assert "run_with_rng_state reads or sets the RNG state" in cuda_graphs.plan_refusal(bw.plan)


@pytest.mark.parametrize("fallback", [False, True], ids=["raises", "falls-back"])
def test_eager_forward_with_a_stitched_backward_never_mixes_masks(monkeypatch, fallback):
    """The forward ran the dropout eagerly (bernoulli, eager's generator state); the
    stitched backward cannot replay that mask and refuses the unmarked state: an error,
    or with the fallback on, that backward call runs eagerly and the gradients are right."""
    _inject_eager(monkeypatch, run_and_save_rng_state, whole_graph=True)
    with config.override(fallback_on_error=fallback):
        if not fallback:
            with pytest.raises(RuntimeError, match="RNG state its forward did not save"):
                _dropout_inside_compiled_model()
            return
        model, x, cot, backend, (actual,), stitch_warnings = _dropout_inside_compiled_model()
    _check(actual, _judge_with_forward_masks(model, actual, x, cot), _names(model))
    assert any("RNG state its forward did not save" in w for w in stitch_warnings), stitch_warnings


def test_checkpointed_dropout_under_dynamic_shapes_stays_stitched():
    """The saved RNG state's size is a symbol no input binds: the dynamic runner must not
    try to express kernel numbers through it (it raised NameError per call before)."""
    torch.manual_seed(0)
    lin = nn.Linear(16, 16)

    def f(x):
        return checkpoint(lambda y: F.dropout(torch.relu(lin(y)), 0.2, training=True), x, use_reentrant=False).sum()

    backend = stitchml.StitchBackend()
    compiled = torch.compile(f, backend=backend, dynamic=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")   # no per-call eager fallback warning
        for n in (5, 7, 9):
            x = torch.randn(n, 16, requires_grad=True)
            compiled(x).backward()
            assert x.grad is not None and torch.isfinite(x.grad).all()
    assert {r.kind for r in backend.records} == {"forward", "backward"}
    for r in backend.records:
        assert r.eager_reason is None and r.dynamic is not None
        assert not r.dynamic.eager_calls and not r.dynamic.refusals, r.dynamic.describe()
