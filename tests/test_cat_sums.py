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


def _padded_steps(g: ir.Graph, steps: list[int], length: int) -> list[int]:
    """One zero-padded concatenation along dim 1 per step's [2, 1, 4] input."""
    f32, cats = torch.float32, []
    for t, x in enumerate(steps):
        parts, sizes = [], []
        for size, ref in ((t, None), (1, x), (length - t - 1, None)):
            if size:
                ref = ref if ref is not None else g.add(ir.POINTWISE, "full", (), (2, size, 4), f32,
                                                        (size * 4, 4, 1), (("value", 0),))
                parts.append(ir.Ref(ref))
                sizes.append(size)
        cats.append(g.add(ir.CAT, "cat", tuple(parts), (2, length, 4), f32, (length * 4, 4, 1),
                          (("dim", 1), ("sizes", tuple(sizes)))))
    return cats


def _chain(g: ir.Graph, nodes: list[int]) -> int:
    acc = nodes[0]
    for c in nodes[1:]:
        acc = g.add(ir.POINTWISE, "add", (ir.Ref(acc), ir.Ref(c)), g[c].shape, torch.float32, g[c].stride)
    return acc


def test_fold_on_hand_built_graphs():
    """Four padded steps summed → one cat of the four inputs (the adds before it left to
    dead-node elimination); a sum of two steps is left as it is (too few pieces to pay);
    adding a step again overlaps: that add stays, over the folded four."""
    g = ir.Graph(inputs=[], outputs=[])
    xs = [g.add(ir.INPUT, "input", (), (2, 1, 4), torch.float32, (4, 4, 1)) for _ in range(4)]
    g.inputs = xs
    g.outputs = [ir.Ref(_chain(g, _padded_steps(g, xs, 4)))]
    new = fold_cat_sums(g)
    out = new[new.outputs[0].id]
    assert out.kind == ir.CAT and out.attr("sizes") == (1, 1, 1, 1) and out.attr("dim") == 1
    assert [new.inputs.index(r) for r in out.refs] == [0, 1, 2, 3]

    two = ir.Graph(inputs=[], outputs=[])
    ys = [two.add(ir.INPUT, "input", (), (2, 1, 4), torch.float32, (4, 4, 1)) for _ in range(2)]
    two.inputs = ys
    two.outputs = [ir.Ref(_chain(two, _padded_steps(two, ys, 2)))]
    assert fold_cat_sums(two) is two

    over = ir.Graph(inputs=[], outputs=[])
    zs = [over.add(ir.INPUT, "input", (), (2, 1, 4), torch.float32, (4, 4, 1)) for _ in range(4)]
    over.inputs = zs
    cats = _padded_steps(over, zs, 4)
    over.outputs = [ir.Ref(_chain(over, cats + [cats[2]]))]   # step 2 added twice
    folded = fold_cat_sums(over)
    last = folded[folded.outputs[0].id]
    assert last.kind == ir.POINTWISE and last.op == "add"      # the overlapping add stays
    first, again = (folded[r] for r in last.refs)
    assert first.kind == ir.CAT and first.attr("sizes") == (1, 1, 1, 1)
    assert again.kind == ir.CAT and again.attr("sizes") == (2, 1, 1)


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
