"""One regression test per class of crash inside stitchml that the OpInfo sweep found
(issue 19).  Each runs with `fallback_on_error` off, so an exception inside the
compiler fails the test instead of silently sending the graph to eager:

- zero-size tensors (index arithmetic divided by a zero extent; empty kernels launched);
- 0-d tensors (scatter's value form);
- float64 (square roots emitted as the float32-only `tl.sqrt_rn`; rounding thresholds of
  float32 applied to float64);
- float16 handled like bfloat16 (computed in float32, rounded once on the way out);
- integer and bool inputs of ops that take them.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from launches import count_launches
from stitchml import config
from stitchml.ir import index as ix
from stitchml.testing import compare_with_eager


def _strict(fn, inputs, *, backward=True, launches=None, rtol=None, atol=None):
    """Compare with eager, fallback off; every graph must have been compiled (no graph
    sent to eager for an internal error).  `launches`: the exact number of kernel
    launches of the whole call (forward and backward)."""
    with config.override(fallback_on_error=False), count_launches() as n:
        cmp = compare_with_eager(fn, inputs, backward=backward, rtol=rtol, atol=atol)
    assert cmp.backend.records, "no graph was compiled"
    assert all(r.plan is not None for r in cmp.backend.records), [r.eager_reason for r in cmp.backend.records]
    if launches is not None:
        assert n["n"] == launches, f"{n['n']} kernel launches, expected {launches}"
    return cmp


def _g(*shape, dtype=torch.float32):
    return torch.randn(*shape, dtype=dtype).requires_grad_()


# -- zero-size tensors ------------------------------------------------------------------

def test_index_algebra_never_divides_by_a_zero_extent():
    # a flatten/unravel pair over a shape with a 0 dim (a reshape of an empty tensor)
    i, j = ix.var("i", 5, "row"), ix.var("j", 5, "col")
    flat = ix.flatten((i, ix.const(0), j), (5, 0, 5))
    out = ix.unravel(flat, (5, 0, 5))
    assert len(out) == 3
    assert ix.mod(i, 0) == ix.const(0) and ix.floordiv(i, 0) == ix.const(0)


def test_index_mod_of_a_reversed_dim_never_goes_negative():
    # (49 - i) % 5 was reduced to (4 - i) % 5: negative for i > 4, where Triton's `%`
    # (C's, the sign of the dividend) differs from the floor modulo -> wrong elements
    i = ix.var("i", 49, "row")
    e = ix.mod(ix.const(49) - i, 5)
    atoms = [a for a, _ in e.terms if isinstance(a, ix.Mod)]
    assert atoms and all(ix.bounds(a.expr)[0] >= 0 for a in atoms)
    # end to end: a reversed slice of a flattened 2-d value, and prod's backward (which
    # reverses a flattened input inside its cumulative products)
    _strict(lambda x: (x * 1).reshape(-1)[1:].flip(0) * 2, [_g(10, 5)])
    _strict(lambda x: x.prod(), [(torch.rand(10, 5) + 0.5).requires_grad_()])


EMPTY_CASES = {
    # a reshape chain of an empty tensor: ZeroDivisionError in ir/index.py:mod (backward too)
    "reshape_chain": (lambda x: (x.reshape(5, 0) * 2).t().exp(), lambda: [_g(5, 0, 5)]),
    # aminmax on a (5,0,5) input, forward and backward
    "aminmax": (lambda x: torch.aminmax(x, dim=-1)[0] * 2, lambda: [_g(5, 0, 5)]),
    "permute_add": (lambda x: (x.permute(2, 0, 1) * 2 + 1).reshape(-1), lambda: [_g(5, 0, 5)]),
    # a backward graph of a linear-algebra op on a batch of zero matrices
    "eigvalsh": (lambda x: torch.linalg.eigvalsh(x + x.transpose(-1, -2)), lambda: [_g(0, 3, 3)]),
    "softmax": (lambda x: torch.softmax(x, -1) * 3, lambda: [_g(5, 0)]),
}


@pytest.mark.parametrize("case", sorted(EMPTY_CASES))
def test_empty_tensors_compile_and_launch_no_kernel(case):
    fn, inputs = EMPTY_CASES[case]
    _strict(fn, inputs(), launches=0)


def test_empty_sum_is_a_constant_next_to_real_work():
    # the (5,5) sum over an empty dim is zeros; the non-empty y still runs in a kernel
    _strict(lambda x, y: x.sum(1) + y.exp(), [_g(5, 0, 5), _g(5, 5)])


# -- 0-d tensors ------------------------------------------------------------------------

def test_scatter_value_on_0d_tensors():
    # `dim %= nd` with nd == 0 in the scatter value rule
    x, idx = torch.tensor(2.5), torch.tensor(0)
    _strict(lambda x, i: torch.scatter(x * 2, 0, i, 1.5), [x, idx], backward=False)


def test_reductions_and_views_of_0d_tensors():
    x = torch.tensor(1.7, requires_grad=True)
    _strict(lambda x: (x.sum() + x.amax() * x.reshape(1, 1)).exp().squeeze(), [x])


# -- float64 ----------------------------------------------------------------------------

F64_CASES = {
    "sqrt": lambda x: torch.sqrt(x.abs() + 1),
    "std": lambda x: torch.std(x, 1),
    "var_mean": lambda x: torch.var_mean(x, 1)[0] + torch.var_mean(x, 1)[1],
    "norm": lambda x: torch.linalg.vector_norm(x, dim=-1),
    "normalize": lambda x: F.normalize(x, dim=-1),
    "cosine_similarity": lambda x: F.cosine_similarity(x, x * 2 + x[0], dim=-1),
    "batch_norm": lambda x: F.batch_norm(x, None, None, training=True),
    "layer_norm": lambda x: F.layer_norm(x, (8,)),
    "pow_half": lambda x: (x.abs() + 0.5) ** 0.5,
}


@pytest.mark.parametrize("case", sorted(F64_CASES))
def test_float64_ops_compile_to_kernels(case):
    cmp = _strict(F64_CASES[case], [_g(4, 8, dtype=torch.float64)])
    assert cmp.num_kernels >= 1


def test_float64_round_keeps_eagers_rounding_above_2_pow_23():
    # float32's "already an integer" threshold (2**23) is wrong for float64
    x = torch.tensor([8388608.5, 1e10 + 0.5, 1e10 + 1.5, -3.5, 2.5, 1e17], dtype=torch.float64)
    _strict(lambda x: torch.round(x * 1), [x], backward=False, launches=1, rtol=1e-300, atol=1e-300)


def test_float64_values_chosen_among_literals_stay_float64():
    """sign, sgn and pow(x, 0) select among Python float literals, which Triton types
    float32: in a float64 kernel every op after them computed in float32 (the fuzzer's
    float64 programs: atan(sign(x)) was 2e-8 off).  A where between two numbers (typed
    constants, `tl.full`) is checked beside them.  Judged at float64's own precision,
    not TOL's."""
    x = _g(5, 7, dtype=torch.float64)
    fns = [lambda t: torch.atan(torch.sign(t) * 0.3), lambda t: torch.exp(torch.sgn(t) * 0.1),
           lambda t: torch.exp(torch.pow(t, 0.0) * 0.1), lambda t: torch.exp(torch.where(t > 0, 0.1, 0.3))]
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)   # (a where between two numbers is float64 then)
    try:
        for fn in fns:
            _strict(fn, [x], backward=False, rtol=1e-15, atol=1e-15)
    finally:
        torch.set_default_dtype(default)


def test_float64_digamma_and_spherical_bessel_at_float64_precision():
    """The series behind digamma (asymptotic, at x + 8) and spherical_bessel_j0 (Taylor,
    below 0.5) were cut for float32: 1.5e-13 and 2e-11 off in float64."""
    x = torch.linspace(0.05, 3.0, 301, dtype=torch.float64)
    _strict(torch.digamma, [x], backward=False, rtol=1e-14, atol=1e-15)
    _strict(torch.special.spherical_bessel_j0, [x - 1.5], backward=False, rtol=1e-15, atol=1e-16)


# -- every op of the table in every float dtype -------------------------------------------

UNARY_OPS = ["exp", "exp2", "log", "log2", "log1p", "expm1", "sqrt", "rsqrt", "sin", "cos", "tanh",
             "sigmoid", "erf", "abs", "neg", "reciprocal", "floor", "ceil", "round", "trunc", "sign",
             "relu", "isnan", "isinf", "square", "frac"]


@pytest.mark.parametrize("dtype", [torch.float16, torch.float64], ids=str)
def test_unary_op_table_in_half_and_double(dtype):
    x = (torch.rand(4, 6) * 4 + 0.1).to(dtype)  # positive: log/sqrt defined

    def fn(x):
        outs = [getattr(torch, op)(x) for op in UNARY_OPS]
        return torch.stack([o.to(x.dtype) for o in outs])
    cmp = _strict(fn, [x], backward=False)
    assert not [f for r in cmp.backend.records for f in r.graph.fallbacks]


@pytest.mark.parametrize("dtype", [torch.float16, torch.float64], ids=str)
def test_binary_and_reduction_table_in_half_and_double(dtype):
    a, b = _g(4, 6, dtype=dtype), _g(4, 6, dtype=dtype)

    def fn(a, b):
        return torch.stack([a + b, a - b, a * b, a / (b.abs() + 1), torch.maximum(a, b), torch.minimum(a, b),
                            torch.where(a > b, a, b), a.clamp(-0.5, 0.5),
                            torch.floor_divide(a.detach(), b.detach().abs() + 1), a.abs() ** b,
                            torch.softmax(a, -1), torch.log_softmax(b, -1)]).sum(0)
    _strict(fn, [a, b], rtol=2e-2 if dtype == torch.float16 else None,
            atol=2e-2 if dtype == torch.float16 else None)


def test_float16_normalisations_forward_and_backward():
    x, w = _g(6, 16, dtype=torch.float16), _g(16, dtype=torch.float16)
    _strict(lambda x, w: F.layer_norm(x, (16,), w) + x.std(1, keepdim=True) + torch.softmax(x, -1),
            [x, w], rtol=3e-2, atol=3e-2)


# -- integer and bool inputs ------------------------------------------------------------

def test_integer_inputs_where_ops_take_them():
    x = torch.randint(-9, 9, (4, 6))

    def fn(x):
        return torch.stack([x.abs(), -x, x.sign(), x * 3 + 1, x.clamp(-2, 2), torch.maximum(x, x.flip(1)),
                            torch.where(x > 0, x, 7), x.amax(1, keepdim=True).expand(4, 6), x.cumsum(1) * 0
                            + x.sum(1, keepdim=True), x.floor(), x // 1, x & 3, ~x]).sum(0)
    _strict(fn, [x], backward=False)


def test_integer_pow_as_eager_computes_it():
    """Integer powers ran eagerly ("integer pow runs eagerly"): square-and-multiply over
    the exponent's bits, wrapping as integer products do, eager's rule below 0 (1 for a
    base of 1, +-1 for -1, 0 otherwise), unsigned exponents with no sign test, a literal
    exponent over its own bits; bit for bit."""
    a, b = torch.randint(-6, 7, (5, 9)), torch.randint(-3, 40, (5, 9))
    a[0, :3] = torch.tensor([1, -1, 0])
    b[0, :3] = torch.tensor([-3, -3, 0])

    def fn(a, b):
        return (a ** b, a ** 3, a ** 0, torch.pow(3, b.abs()), a.int() ** b.int(), a.to(torch.int8) ** 5,
                a.abs().to(torch.uint8) ** (b.abs() % 9).to(torch.uint8), a ** (b * 1000000))
    cmp = _strict(fn, [a, b], backward=False)   # (integer results: compared exactly)
    assert not [f for r in cmp.backend.records for f in r.graph.fallbacks]


def test_bool_inputs_where_ops_take_them():
    m = torch.rand(4, 6) > 0.5

    def fn(m):
        return (m.any(1), m.all(1), m.amax(1), m.amin(0), m.sum(1), (m & ~m.flip(0)) | m.logical_xor(m.t().t()),
                m.to(torch.float32).mean(1))
    _strict(fn, [m], backward=False)


# -- op_db entries stitched since the sweep (issue 19.5) ----------------------------------

def _no_fallbacks(cmp):
    return [(f.op, f.reason) for r in cmp.backend.records for f in r.graph.fallbacks]


MORE_OPS = {
    "diagonal": (lambda x: x.diagonal(1, 0, 2) * 2 + x.diagonal(-2, 2, 1).sum(), lambda: [_g(4, 3, 6)]),
    "diagonal_of_a_transpose": (lambda x: x.t().diagonal(-1).exp(), lambda: [_g(4, 6)]),
    "diag_embed": (lambda x: torch.diag_embed(x * 2, 1, 0, 2) + torch.diag_embed(x.exp(), -1, 2, 0).sum(),
                   lambda: [_g(3, 4)]),
    "diagonal_scatter": (lambda x, s: torch.diagonal_scatter(x * 1, s * 3, -1, 1, 0), lambda: [_g(5, 4), _g(3)]),
    "lgamma_digamma": (lambda x: torch.lgamma(x) + torch.digamma(x) * torch.polygamma(0, x),
                       lambda: [(torch.randn(40) * 6).requires_grad_()]),
    "fractional_arange": (lambda x: x + torch.arange(0.1, 2.3, 0.1), lambda: [_g(22)]),
    "nan_to_num": (lambda x: torch.nan_to_num(x / 0.0) + torch.nan_to_num(x.log(), 1.0, 2.0, -3.0),
                   lambda: [torch.tensor([0.0, 1.0, -1.0, 2.0, -0.0, 5.0])]),
    "amax_amin_of_bool": (lambda m: (m.amax(1), m.amin(0), m.max()), lambda: [torch.rand(4, 6) > 0.5]),
    "index_select_0d": (lambda x, i, s: (x.index_select(0, i) * 2, x[0].index_select(0, i) + 1,
                                         s.index_select(0, i.reshape(1) * 0) * 3),
                        lambda: [_g(5, 3), torch.tensor(2), torch.tensor(1.5, requires_grad=True)]),
}


@pytest.mark.parametrize("case", sorted(MORE_OPS))
def test_more_op_db_entries_stitch(case):
    fn, inputs = MORE_OPS[case]
    cmp = _strict(fn, inputs())
    # (polygamma of order 1, in digamma's backward, is stitched too: tests/test_coverage_zeta.py)
    assert not _no_fallbacks(cmp), _no_fallbacks(cmp)
    assert cmp.num_kernels >= 1


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
def test_lgamma_digamma_at_poles_and_infinities(dtype):
    x = torch.tensor([0.0, -0.0, -1.0, -2.0, 1.0, 2.0, -2.5, 0.5, 1e-3, 30.0, 1e6, float("inf"), float("-inf"),
                      float("nan"), -7.25], dtype=dtype)
    _strict(lambda x: (torch.lgamma(x), torch.digamma(x)), [x], backward=False, launches=1)


# ---- second pass over the op_db log (issue 19) ----

def test_empty_result_of_an_indexing_rule_needs_no_rule():
    # reflect pad's backward on an empty batch: a masked index whose linearisation divided
    # by the zero extent (ZeroDivisionError inside the rule); an empty result is a constant
    def f(x):
        return F.pad(x, (1, 2), mode="reflect") * 2
    cmp = _strict(f, [torch.randn(0, 3, 3, requires_grad=True)])
    assert all(r.eager_reason is None for r in cmp.backend.records)


@pytest.mark.parametrize("which", ["scatter_add", "index_put"])
def test_float64_scatter_adds_accumulate_in_float64(which):
    # the atomic scatter-add accumulated in float32 whatever the dtype: 4e-7 off in float64
    idx = torch.tensor([[0, 2, 0, 1, 2, 0]])

    def f(x, s):
        if which == "scatter_add":
            return x.scatter_add(1, idx, s)
        return x.index_put((idx[0],), s[0, :, None].expand(6, 3), accumulate=True)
    x = torch.randn(3, 3, dtype=torch.float64)
    s = torch.randn(1, 6, dtype=torch.float64) * 1e3 + 0.123456789
    cmp = _strict(f, [x, s], backward=False, rtol=1e-12, atol=1e-12)
    assert cmp.num_kernels >= 1


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_batch_norm_saved_statistics_in_eager_dtype(dtype):
    # eager on the CPU returns the saved mean and inverse std in the input's dtype;
    # torch's decomposition gave float32 (op_db native_batch_norm in half precision)
    def f(x, w, b, rm, rv):
        return torch.ops.aten.native_batch_norm(x, w, b, rm, rv, True, 0.1, 1e-5)
    ins = [torch.randn(4, 5, 3, dtype=dtype), torch.randn(5, dtype=dtype), torch.randn(5, dtype=dtype),
           torch.randn(5, dtype=dtype), torch.rand(5, dtype=dtype) + 0.5]
    cmp = _strict(f, ins, backward=False, rtol=2e-2, atol=2e-2)
    assert [t.dtype for t in cmp.outputs[:3]] == [dtype] * 3


def test_zero_dim_index_writes_do_not_crash():
    # index_copy of a 0-d tensor built indices for a dim it has not (IndexError inside
    # the rule); index_fill / scatter / gather on 0-d ran eagerly
    def f(x, s, i):
        return (x.index_copy(0, i, s) * 2, x.index_fill(0, i, -1.0) + 1, x.scatter(0, i, s) - 1,
                x.gather(0, i) * 3, x.scatter_add(0, i, s))
    cmp = _strict(f, [torch.randn(()), torch.randn(()), torch.tensor(0)], backward=False)
    assert not [fb for r in cmp.backend.records for fb in r.graph.fallbacks]


def test_scatter_reduce_sum_without_self_keeps_untouched_positions():
    def f(x, s):
        i = torch.tensor([[0, 2, 0], [1, 1, 1]])
        return x.scatter_reduce(1, i, s, "sum", include_self=False), x.scatter(1, i, s, reduce="add")
    cmp = _strict(f, [torch.randn(2, 4), torch.randn(2, 3)], backward=False)
    assert not [fb for r in cmp.backend.records for fb in r.graph.fallbacks]
    # two scatter-adds and the winner of the reached positions (launches may be fewer: one
    # global kernel can run them as phases)
    assert sum(k.scheme == "scatter" for r in cmp.backend.records for k in r.plan.kernels) == 3


def test_gather_of_a_0d_tensor_and_an_empty_index_backward_stitch():
    # op_db's gather samples: x () with index (1,), and x (5,) with an empty (2, 0) index,
    # whose backward scatters nothing with an index of another rank: both ran eagerly
    def f(x, y):
        return x.gather(0, torch.tensor([0])) * 2, y.gather(0, torch.zeros(2, 0, dtype=torch.long)).sum() + y
    cmp = _strict(f, [torch.randn((), requires_grad=True), torch.randn(5, requires_grad=True)])
    assert not [fb for r in cmp.backend.records for fb in r.graph.fallbacks]


def test_an_output_eager_lays_out_with_gaps_is_written_with_them():
    """diagonal_scatter of a strided slice keeps its input's layout, strides (20, 2) for a
    10 x 10 result: not dense, but no two elements share memory, so a kernel writes it
    there.  The whole graph ran eagerly ("expected with repeated elements"); the op_db
    sweep with non-contiguous samples found it.  Output poisoned, values, strides and
    gradients as eager's; a forward graph that saves it for the backward reads it back."""
    from stitchml import StitchBackend
    torch.manual_seed(12)
    base, s0 = torch.randn(10, 10), torch.randn(10)

    def run(fn, compiled):
        x = torch.empty_strided((10, 10), (20, 2)).copy_(base).requires_grad_()
        s = s0.clone().requires_grad_()
        backend = StitchBackend()
        with config.override(fallback_on_error=False):
            out = (torch.compile(fn, backend=backend) if compiled else fn)(x, s)
            torch.autograd.backward(out, [torch.ones_like(o) for o in out])
        return out, x.grad, s.grad, backend

    def fn(x, s):
        y = torch.diagonal_scatter(x, s)
        return y, (y.sin() * y).sum(0)
    (ye, ze), gxe, gse, _ = run(fn, False)
    (yc, zc), gxc, gsc, backend = run(fn, True)
    assert ye.stride() == yc.stride() == (20, 2)
    for a, e in ((yc, ye), (zc, ze), (gxc, gxe), (gsc, gse)):
        torch.testing.assert_close(a, e)
    assert [r.kind for r in backend.records] == ["forward", "backward"]
    assert all(r.plan is not None and r.plan.num_kernels >= 1 for r in backend.records)
