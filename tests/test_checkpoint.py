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

Known limit (xfail below): dropout in a checkpointed block *inside* a compiled model.
AOTAutograd (`_functorch/partitioners.py::functionalize_rng_ops`) wraps the random op
of a recomputed region as `higher_order.run_and_save_rng_state(native_dropout, ...)`
in the forward graph and `higher_order.run_with_rng_state(state, native_dropout, ...)`
in the backward graph.  stitchml has no rule for either, and the forward graph's
nested tuple result (`(state, (out, mask))`) makes `lower/lower.py::Lowerer._item`
raise "getitem of a non-tuple value", so the whole forward graph runs eagerly (with a
warning) and the dropout runs eagerly in both graphs.  The results are still right
(eager replays the same generator state)."""
import copy
import warnings

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

import stitchml
from stitchml import config
from stitchml.testing import assert_close

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


def _dropout_inside_compiled_model():
    torch.manual_seed(0)
    model = Model(p=P, ckpt=True)
    model.train()
    x, cot = _inputs(4)
    backend = stitchml.StitchBackend()
    torch.manual_seed(321)
    with warnings.catch_warnings(record=True) as caught, config.override(strict=False):  # (it falls back)
        warnings.simplefilter("always")
        actual = _run(torch.compile(model, backend=backend), list(model.parameters()), x, cot)
    return model, x, cot, backend, actual, [str(w.message) for w in caught if "stitchml" in str(w.message)]


def test_dropout_in_checkpoint_inside_compiled_model_is_right():
    """The known limit (module docstring): not stitched, but the masks agree."""
    model, x, cot, backend, actual, stitch_warnings = _dropout_inside_compiled_model()
    _check(actual, _judge_with_forward_masks(model, actual, x, cot), _names(model))
    # what happens today, asserted so that a change is noticed
    fw = [r for r in backend.records if r.kind == "forward"]
    bw = [r for r in backend.records if r.kind == "backward"]
    assert len(fw) == 1 and fw[0].eager_reason == "Unsupported: getitem of a non-tuple value", fw
    assert any("forward graph runs eagerly" in w for w in stitch_warnings), stitch_warnings  # not silent
    assert len(bw) == 1 and bw[0].eager_reason is None and bw[0].plan.num_kernels > 0
    assert [op for op, reason in _fallbacks(bw[0]) if reason == "no lowering rule"] == ["run_with_rng_state"] * BLOCKS


@pytest.mark.xfail(strict=True, raises=AssertionError,
                   reason="run_and_save_rng_state / run_with_rng_state (AOTAutograd's rng functionalisation of a "
                          "recomputed region) have no lowering rule, and their nested tuple result makes the "
                          "forward graph run eagerly")
def test_dropout_in_checkpoint_inside_compiled_model_is_stitched():
    _, _, _, backend, _, _ = _dropout_inside_compiled_model()
    _assert_stitched(backend, {"forward": 1, "backward": 1})
