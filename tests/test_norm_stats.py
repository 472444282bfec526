"""Normalisation statistics between forward and backward stay float32 (capture/norm_stats.py).

On the CPU eager batch/layer/group norm save their mean and inverse std in bfloat16 for a
bfloat16 input, and torch's decompositions follow; the backward then recomputes
x̂ = (x - mean) * rstd with the rounded mean, which on values far from zero relative to
their spread is not the forward's x̂.  Stitched training graphs read the float32 values.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from stitchml import StitchBackend
from stitchml import config as stitchml_config
from stitchml.testing import compare_against_float64

CASES = {
    # (function, input shape, channels of the affine parameters)
    "batch_norm": (lambda x, w, b: F.batch_norm(x, None, None, w, b, training=True), (6, 16), 16),
    "batch_norm_2d": (lambda x, w, b: F.batch_norm(x, None, None, w, b, training=True), (3, 8, 2, 2), 8),
    "layer_norm": (lambda x, w, b: F.layer_norm(x, (16,), w, b), (6, 16), 16),
    "group_norm": (lambda x, w, b: F.group_norm(x, 4, w, b), (3, 16, 2), 16),
}


def _inputs(shape, c, seed):
    gen = torch.Generator().manual_seed(seed)
    # a spread of 0.5 on an offset of 100: bfloat16's spacing there is 0.5, its rounding of
    # the mean up to 0.25, i.e. half a standard deviation
    x = (torch.randn(shape, generator=gen) * 0.5 + 100).bfloat16().requires_grad_()
    w = (torch.randn(c, generator=gen) * 0.5 + 1).bfloat16().requires_grad_()
    b = torch.randn(c, generator=gen).bfloat16().requires_grad_()
    return [x, w, b]


@pytest.mark.parametrize("name", list(CASES))
def test_norm_backward_reads_float32_statistics(name):
    fn, shape, c = CASES[name]
    backend = StitchBackend()
    comp, judgement = compare_against_float64(fn, _inputs(shape, c, seed=len(name)), backend=backend)
    judgement.assert_ok()
    assert comp.num_kernels >= 2
    # the gradients of x and the weight are an order of magnitude closer to float64 than
    # eager's own (whose backward reads the rounded mean); before, they were eager's or worse
    grads = {r.name: r for r in judgement.rows if r.name in ("grad of input 0", "grad of input 1")}
    assert len(grads) == 2
    for r in grads.values():
        assert r.err_actual <= 0.1 * r.err_eager, r.line()
    (rec,) = backend.partitions
    assert rec.precise_stats >= 2 and "norm statistics read float32" in rec.line()


def test_saved_statistics_a_graph_returns_keep_eagers_dtype():
    """A graph that returns batch norm's saved mean and rstd gives them in eager's dtype
    (bfloat16 on the CPU), rounded once from float32 (eager's own rstd is up to 40 % off
    float64 here: its variance), and its backward still reads the float32 values."""
    def fn(x, w, b):
        out, mean, rstd = torch.ops.aten.native_batch_norm(x, w, b, None, None, True, 0.1, 1e-5)
        return out * 2, mean, rstd

    x, w, b = _inputs((6, 16), 16, seed=3)
    eager = fn(x, w, b)
    backend = StitchBackend()
    got = torch.compile(fn, backend=backend)(x, w, b)
    assert [t.dtype for t in got] == [t.dtype for t in eager] == [torch.bfloat16] * 3
    ref = fn(*(t.detach().double() for t in (x, w, b)))
    for g, r in zip(got[1:], ref[1:]):
        torch.testing.assert_close(g.double(), r, rtol=2 ** -8, atol=0)
    (rec,) = backend.partitions
    assert rec.precise_stats >= 2


def test_float32_graphs_are_left_alone():
    fn, shape, c = CASES["layer_norm"]
    x, w, b = (t.detach().float().requires_grad_() for t in _inputs(shape, c, seed=5))
    backend = StitchBackend()
    comp, judgement = compare_against_float64(fn, [x, w, b], backend=backend)
    judgement.assert_ok()
    (rec,) = backend.partitions
    assert rec.precise_stats == 0 and "norm statistics" not in rec.line()


def test_dynamic_sizes_rewire_through_symbolic_views():
    """Under dynamic shapes the views between a rounded statistic and its backward use
    take symbolic sizes (fx nodes): the float32 copy of each view is made from their
    values (fuzz seed 56051, instance norm twice in bfloat16, crashed the backend)."""
    def fn(x):
        return F.instance_norm(F.instance_norm(x))

    backend = StitchBackend()
    compiled = torch.compile(fn, backend=backend, dynamic=True)
    for shape in ((5, 6, 5), (7, 6, 9)):
        x = (torch.randn(shape) * 0.5 + 100).bfloat16()
        mine, ref = x.clone().requires_grad_(), x.double().requires_grad_()
        cot = torch.randn(shape, dtype=torch.float64)
        with stitchml_config.override(fallback_on_error=False):
            (compiled(mine).double() * cot).sum().backward()
        (fn(ref) * cot).sum().backward()
        err = float((mine.grad.double() - ref.grad).norm() / ref.grad.norm())
        assert err < 2e-2, err
    assert all(r.dynamic is not None for r in backend.records[2:])
    assert all(p.precise_stats >= 2 for p in backend.partitions)
