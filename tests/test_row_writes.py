"""Chains of in-place writes into rows: each write a select of the last version.

Chunked linear attention with a delta rule (Kimi Linear's KDA, Qwen3-Next's gated
DeltaNet in Hugging Face's reference code) inverts a unit lower-triangular chunk matrix
by forward substitution, written as C - 1 in-place row updates; functionalised, each
update is a `select_scatter` of a `slice_scatter` of the previous version, and each
version is read by the next update at a row and at a block of rows.  Two things made
that exponential in the chunk size (Kimi's sweep row timed out at 1200 s; a chunk of 12
took 180 s to generate): every kernel computed the whole chain of versions again (the
planner marked each version as cheaper to recompute, weighing each against the last
written), and code generation evaluated every part of a concatenation read at a known
row under its own branch condition, both parts of every level (`emit_core._cat`).
"""
import torch

from stitchml import StitchBackend, config
from stitchml.ir import nodes as ir
from stitchml.testing import compare_against_float64


def _substitution(k, beta, g):
    """(I + A)^-1-style forward substitution over chunk rows, A from decayed key products."""
    c = k.shape[-2]
    upper = torch.triu(torch.ones(c, c, dtype=torch.bool), diagonal=0)
    strict = torch.triu(torch.ones(c, c, dtype=torch.bool), diagonal=1)
    decay = (g.unsqueeze(-2) - g.unsqueeze(-3)).masked_fill(strict[..., None], float("-inf")).exp()
    a = -((k * beta.unsqueeze(-1)).unsqueeze(-2) * k.unsqueeze(-3) * decay).sum(-1).masked_fill(upper, 0)
    for i in range(1, c):
        row = a[..., i, :i].clone()
        block = a[..., :i, :i].clone()
        a[..., i, :i] = row + (row.unsqueeze(-1) * block).sum(-2)
    return a + torch.eye(c, dtype=a.dtype)


def _inputs(c: int, requires_grad: bool = False):
    gen = torch.Generator().manual_seed(c)
    k = torch.nn.functional.normalize(torch.randn(2, 2, 3, c, 8, generator=gen), dim=-1)
    beta = torch.rand(2, 2, 3, c, generator=gen)
    g = -(torch.rand(2, 2, 3, c, 8, generator=gen) * 0.2).cumsum(-2)
    return [t.requires_grad_(requires_grad) for t in (k, beta, g)]


def _generated_lines(backend: StitchBackend) -> tuple[int, int]:
    """(lines of every generated kernel, of the longest)."""
    lines = [len(src.body) for r in backend.records for src in r.kernels.values()]
    return sum(lines), max(lines)


def test_forward_substitution_matches_float64_forward_and_backward():
    backend = StitchBackend()
    with config.override(fallback_on_error=False, strict=True):
        _, judgement = compare_against_float64(_substitution, _inputs(10, requires_grad=True), backend=backend)
    judgement.assert_ok()
    assert all(r.eager_reason is None for r in backend.records)
    assert sum(len(r.kernels) for r in backend.records) >= 10


def test_generated_code_grows_with_the_chunk_not_exponentially():
    sizes = {}
    for c in (6, 12):
        backend = StitchBackend()
        with config.override(fallback_on_error=False, strict=True):
            out = torch.compile(_substitution, backend=backend)(*_inputs(c))
        torch.testing.assert_close(out, _substitution(*_inputs(c)), rtol=1e-4, atol=1e-5)
        sizes[c] = _generated_lines(backend)
    # one row update a kernel or two: twice the rows, about twice the code (it was ~30x
    # from 6 to 12, the longest kernel thousands of lines)
    assert sizes[12][0] < 2.6 * sizes[6][0], sizes
    assert sizes[12][1] < 400, sizes


def test_recomputed_row_versions_stack_at_most_the_planner_bound():
    # the planner's weighing marks values cheaper to compute in their readers; a chain
    # stacked on chains it marks stops where its evaluations of written values pass
    # planner.RECOMPUTE_PATHS (32): each version reads the last at two index maps (as a
    # whole and at its row), 1, 3, 7, 15, 31 evaluations, so after the fifth version (two
    # selects each: the row's and the matrix's) the next is written
    backend = StitchBackend()
    with config.override(fallback_on_error=False, strict=True):
        torch.compile(_substitution, backend=backend)(*_inputs(16))
    g = backend.records[0].plan.graph
    marked = {n.id for n in g.nodes if n.attr("recompute") and n.kind == ir.POINTWISE and n.op == "where"}
    assert marked, "the row writes' selects are no longer recomputed at all: the test lost its subject"
    depth: dict[int, int] = {}

    def stacked(nid: int) -> int:
        """Recomputed selects on the longest path from `nid` down through free nodes."""
        if nid not in depth:
            n = g[nid]
            below = [stacked(r) for r in n.refs
                     if g[r].kind in (ir.VIEW, ir.CAT) or g[r].attr("recompute")]
            depth[nid] = (nid in marked) + max(below, default=0)
        return depth[nid]

    deepest = max(stacked(m) for m in marked)
    assert 2 <= deepest <= 10, deepest


def test_a_concatenation_read_at_a_known_position_reads_only_that_part():
    # rows 0-3 from one computed value, rows 4-7 from another; one output reads row 5,
    # the other row 1 (a column of the transpose), each through the concatenation,
    # computed in the readers' kernel (placement off: the parts are not written apart)
    def f(x, y):
        z = torch.cat([x.exp(), y.sin()], 0)
        return z[5] * 2, z.t()[:, 1] + 1

    x, y = torch.randn(4, 33), torch.randn(4, 33)
    backend = StitchBackend()
    with config.override(fallback_on_error=False, strict=True, place_cats=False):
        out = torch.compile(f, backend=backend)(x, y)
    for a, e in zip(out, f(x, y)):
        torch.testing.assert_close(a, e)
    body = [line for r in backend.records for s in r.kernels.values() for line in s.body]
    assert len(backend.records[0].kernels) == 1, body
    # each output one load of the part that holds its row, one exp and one sin in all
    assert sum("tl.load(" in line for line in body) == 2, body
    assert sum("tl.exp(" in line for line in body) == 1 and sum("tl.sin(" in line for line in body) == 1, body
    assert not any("tl.where" in line for line in body), body
