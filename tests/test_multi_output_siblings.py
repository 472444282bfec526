"""Column reductions over the outputs of one multi-output op merge into one kernel
(knob `multi_output_siblings`): an attention backward returns the query, key and value
gradients together, and their three bias gradients become one kernel of partials and
one combine, though they read three buffers (`plan/grouping.py::_one_origin`).
Against eager on fresh random inputs, outputs poisoned (tests/conftest.py)."""
import torch
import torch.nn.functional as F

from stitchml import config
from stitchml.ir import nodes as ir
from stitchml.testing import compare_with_eager

B, S, H, D = 2, 19, 3, 8       # 38 rows of a 24-wide hidden


def attention(x, wq, bq, wk, bk, wv, bv, wo, bo):
    def heads(t):
        return t.view(B, S, H, D).transpose(1, 2)
    q, k, v = heads(F.linear(x, wq, bq)), heads(F.linear(x, wk, bk)), heads(F.linear(x, wv, bv))
    o = F.scaled_dot_product_attention(q, k, v)
    return F.linear(o.transpose(1, 2).reshape(B, S, H * D), wo, bo)


def _inputs():
    hid = H * D
    x = torch.randn(B, S, hid, requires_grad=True)
    params = []
    for _ in range(4):
        params += [(torch.randn(hid, hid) / hid ** 0.5).requires_grad_(), torch.randn(hid).requires_grad_()]
    return [x] + params


def _bias_kernels(c):
    """Per backward plan: the kernels with column sums over outputs of a multi-output op,
    each as the sorted ids of those ops."""
    def item(g, nid):   # the multi-output op's output a value is a view of, else None
        n = g[g[nid].refs[0]]
        while n.kind == ir.VIEW:
            n = g[n.refs[0]]
        return n if n.kind == ir.ITEM else None
    out = []
    for r in c.backend.records:
        g = r.plan.graph
        for k in r.plan.kernels:
            items = [item(g, p) for p in k.partials if item(g, p) is not None]
            if items:
                out.append((len(items), {n.refs[0] for n in items}))
    return out


def test_attention_bias_gradients_are_one_kernel_and_match_eager():
    c = compare_with_eager(attention, _inputs())
    merged = _bias_kernels(c)
    # the query, key and value bias gradients: one kernel of three partials over one op's outputs
    assert merged == [(3, merged[0][1])] and len(merged[0][1]) == 1, merged
    kernels_on = sum(r.plan.num_kernels for r in c.backend.records)
    with config.override(multi_output_siblings=False):
        torch._dynamo.reset()
        off = compare_with_eager(attention, _inputs())
    apart = _bias_kernels(off)
    assert sorted(n for n, _ in apart) == [1, 1, 1], apart
    # two launches fewer: two partial kernels and two combines, less what launch grouping had packed
    assert sum(r.plan.num_kernels for r in off.backend.records) > kernels_on


def test_independent_reductions_of_other_origins_stay_apart():
    """Two column sums of two graph inputs (not outputs of one op): merging them could
    keep one buffer alive until the other is ready, so they stay two kernels."""
    a, b = torch.randn(40, 24), torch.randn(40, 24)
    c = compare_with_eager(lambda a, b: (a.sum(0) * 2, (b * 3).sum(0)), [a, b], backward=False)
    (rec,) = c.backend.records
    assert len([k for k in rec.plan.kernels if k.partials]) == 2, [k.name for k in rec.plan.kernels]
