"""A tensor read slice by slice (a recurrence written out step by step) gets its gradient
as a sum of zero-padded concatenations, one a step; `ir/cat_sums.py` folds the sum into
one concatenation of the steps' gradients (DIEN's GRU backward: 50 masked loads, ~150
selects and 49 adds an element before; sm_90 spilled 512 bytes)."""
import pytest
import torch

from stitchml.ir import nodes as ir
from stitchml.capture.backend import StitchBackend
from stitchml.codegen.triton_kernel import generate
from stitchml.ir.cat_sums import fold_cat_sums
from seeds import stable_seed

B, T, D, H = 5, 6, 3, 7


def gru_like(x, w_in, b_in, w_h):
    """The input projection of every step at once, then a loop over its slices."""
    gx = x @ w_in + b_in                      # [B, T, H]
    h = torch.zeros(x.shape[0], w_h.shape[0], dtype=x.dtype)
    for t in range(x.shape[1]):
        h = torch.tanh(gx[:, t] + h @ w_h)
    return h


def overlapping(x, w_in, b_in, w_h):
    """Windows of two steps: every position but the ends is read by two slices."""
    gx = x @ w_in + b_in
    h = torch.zeros(x.shape[0], w_h.shape[0], dtype=x.dtype)
    for t in range(x.shape[1] - 1):
        h = torch.tanh(gx[:, t:t + 2].sum(1) + h @ w_h)
    return h


def _inputs(dtype):
    x = torch.randn(B, T, D, dtype=dtype, requires_grad=True)
    w_in = (torch.randn(D, H) / D ** 0.5).to(dtype).requires_grad_()
    b_in = torch.randn(H, dtype=dtype, requires_grad=True)
    w_h = (torch.randn(H, H) / H ** 0.5).to(dtype).requires_grad_()
    return x, w_in, b_in, w_h


def _cats_added(g: ir.Graph) -> int:
    return sum(1 for n in g.nodes if n.kind == ir.POINTWISE and n.op == "add"
               and len(n.refs) == 2 and all(g[r].kind == ir.CAT for r in n.refs))


def _backward_graphs(fn, args):
    backend = StitchBackend()
    out = torch.compile(fn, backend=backend)(*args)
    cot = torch.randn_like(out)
    got = torch.autograd.grad(out, args, cot)
    want = torch.autograd.grad(fn(*args), args, cot)
    return backend, got, want


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_sliced_gradients_are_one_concatenation(dtype):
    torch.manual_seed(stable_seed("cat_sums", str(dtype)))
    args = _inputs(dtype)
    backend, got, want = _backward_graphs(gru_like, args)
    (bwd,) = [r.plan for r in backend.records if r.kind == "backward"]
    assert all(r.eager_reason is None for r in backend.records)
    assert _cats_added(bwd.graph) == 0
    steps = [n for n in bwd.graph.nodes if n.kind == ir.CAT and len(n.refs) == T]
    assert len(steps) == 1 and not any(g.kind == ir.POINTWISE and g.op == "full"
                                       for g in (bwd.graph[r] for r in steps[0].refs))
    # the kernel reads the T gradients with one load: the step picks the buffer
    # (`emit_core._cat_by_pointer`), not T loads under T masks
    (k,) = [k for k in bwd.kernels if steps[0].id in k.members]
    body = "\n".join(generate(bwd.graph, k).body)
    assert body.count("tl.load(") == 1 and body.count("tl.where(") >= T - 1, body
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=2e-2, atol=2e-2)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, **tol)


def test_overlapping_slices_keep_their_adds_and_match_eager():
    """Pieces that overlap are not folded (both values count there)."""
    torch.manual_seed(stable_seed("cat_sums", "overlap"))
    args = _inputs(torch.float32)
    backend, got, want = _backward_graphs(overlapping, args)
    (bwd,) = [r.plan for r in backend.records if r.kind == "backward"]
    assert _cats_added(bwd.graph) > 0
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)


def test_fold_on_a_hand_built_graph():
    """cat(0, a) + cat(b, 0) along dim 1 → cat(b, a); adding cat(a', 0) to that (a' over
    the first piece too) does not fold; a graph with nothing to fold is returned as is."""
    g = ir.Graph(inputs=[], outputs=[])
    f32 = torch.float32
    a = g.add(ir.INPUT, "input", (), (2, 3, 4), f32, (12, 4, 1))
    b = g.add(ir.INPUT, "input", (), (2, 1, 4), f32, (4, 4, 1))
    g.inputs = [a, b]
    z1 = g.add(ir.POINTWISE, "full", (), (2, 1, 4), f32, (4, 4, 1), (("value", 0),))
    z3 = g.add(ir.POINTWISE, "full", (), (2, 3, 4), f32, (12, 4, 1), (("value", 0),))
    c1 = g.add(ir.CAT, "cat", (ir.Ref(z1), ir.Ref(a)), (2, 4, 4), f32, (16, 4, 1), (("dim", 1), ("sizes", (1, 3))))
    c2 = g.add(ir.CAT, "cat", (ir.Ref(b), ir.Ref(z3)), (2, 4, 4), f32, (16, 4, 1), (("dim", 1), ("sizes", (1, 3))))
    s = g.add(ir.POINTWISE, "add", (ir.Ref(c1), ir.Ref(c2)), (2, 4, 4), f32, (16, 4, 1))
    c3 = g.add(ir.CAT, "cat", (ir.Ref(b), ir.Ref(z3)), (2, 4, 4), f32, (16, 4, 1), (("dim", 1), ("sizes", (1, 3))))
    s2 = g.add(ir.POINTWISE, "add", (ir.Ref(s), ir.Ref(c3)), (2, 4, 4), f32, (16, 4, 1))
    g.outputs = [ir.Ref(s), ir.Ref(s2)]
    new = fold_cat_sums(g)
    folded = new[new.outputs[0].id]
    assert folded.kind == ir.CAT and folded.attr("sizes") == (1, 3) and folded.attr("dim") == 1
    assert [new[r].kind for r in folded.refs] == [ir.INPUT, ir.INPUT]
    assert [new.inputs.index(r) for r in folded.refs] == [1, 0]
    second = new[new.outputs[1].id]
    assert second.kind == ir.POINTWISE and second.op == "add" and second.refs[0] == folded.id
    untouched = ir.Graph(inputs=[a, b], outputs=[ir.Ref(c1)])
    untouched.nodes = g.nodes[:5]
    assert fold_cat_sums(untouched) is untouched


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_stack_of_buffers_loads_once_and_matches_eager(dtype):
    """torch.stack of five inputs read at one offset: one load an element; with one input
    transposed the offsets differ and each part is loaded under its mask, as before."""

    def fn(a, b, c, d, e, w):
        return torch.stack([a, b, c, d, e], dim=1) * w    # [R, 5, C] * [5, C]

    torch.manual_seed(stable_seed("stack", str(dtype)))
    R, C = 9, 11
    xs = [torch.randn(R, C, dtype=dtype) for _ in range(5)]
    w = torch.randn(5, C, dtype=dtype)
    for inputs, loads in ((xs, 2), (xs[:4] + [torch.randn(C, R, dtype=dtype).t()], 6)):
        backend = StitchBackend()
        got = torch.compile(fn, backend=backend)(*inputs, w)
        torch.testing.assert_close(got, fn(*inputs, w), rtol=0, atol=0)   # products, no sums: exact
        (plan,) = [r.plan for r in backend.records]
        (k,) = plan.kernels
        assert "\n".join(generate(plan.graph, k).body).count("tl.load(") == loads   # (w is the other load)
