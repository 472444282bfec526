"""Issues 18/19: the math ops that ran eagerly for "no lowering rule" now stitch
(lower/rules_pointwise.py, codegen/triton_ops.py): inverse trigonometric and
hyperbolic functions, sinh/cosh/tan/log10, atan2, fmod (floats and integers), bit
shifts; `var.dim` (traced as var.correction) and F.one_hot's runtime checks
(`_assert_async`, a library op that still raises).

Each op runs forward and backward against eager on fresh random inputs (odd sizes,
a transposed input) in float32 and bfloat16, forward in float64, with kernel-count
asserts; the float formulas are checked against float64 over wide ranges and at
their special values; every new expression compiles for sm_90."""
import math
import textwrap

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from stitchml import config
from stitchml.fallback import NO_RULE
from stitchml.testing import compare_with_eager
from launches import count_launches
from seeds import stable_seed

aten = torch.ops.aten


def _uniform(lo, hi):
    return lambda shape, dtype: (torch.rand(*shape, dtype=torch.float64) * (hi - lo) + lo).to(dtype)


def _magnitude(lo, hi, positive=False):
    """Log-uniform magnitudes in [lo, hi), random signs unless `positive`."""
    def make(shape, dtype):
        m = torch.exp(torch.empty(*shape, dtype=torch.float64).uniform_(math.log(lo), math.log(hi)))
        return (m if positive else m * (torch.randint(0, 2, shape) * 2 - 1)).to(dtype)
    return make


# op -> (function, well-conditioned inputs for the gradient checks, wide inputs for accuracy)
UNARY = {
    "asin": (torch.asin, _uniform(-0.9, 0.9), _uniform(-1, 1)),
    "acos": (torch.acos, _uniform(-0.9, 0.9), _uniform(-1, 1)),
    "atan": (torch.atan, _uniform(-4, 4), _magnitude(1e-30, 1e30)),
    "asinh": (torch.asinh, _uniform(-4, 4), _magnitude(1e-30, 1e30)),
    "acosh": (torch.acosh, _uniform(1.1, 5), lambda s, d: (1 + _magnitude(1e-12, 1e30, True)(s, torch.float64)).to(d)),
    "atanh": (torch.atanh, _uniform(-0.9, 0.9), _uniform(-1, 1)),
    "sinh": (torch.sinh, _uniform(-3, 3), _uniform(-88, 88)),
    "cosh": (torch.cosh, _uniform(-3, 3), _uniform(-88, 88)),
    "tan": (torch.tan, _uniform(-1.2, 1.2), _uniform(-1.5, 1.5)),
    "log10": (torch.log10, _uniform(0.1, 5), _magnitude(1e-30, 1e30, True)),
}
DTYPES = [torch.float32, torch.bfloat16]
IDS = ["fp32", "bf16"]


def _nonzero(x: torch.Tensor) -> torch.Tensor:
    return torch.where(x == 0, torch.full_like(x, 0.25), x)


def _transposed(make, rows, cols, dtype):
    """A non-contiguous (rows, cols) input: the transpose of a fresh (cols, rows) buffer."""
    t = _nonzero(make((cols, rows), dtype)).t()
    assert not t.is_contiguous()
    return t


def _tol(dtype):
    return {} if dtype != torch.bfloat16 else dict(rtol=2e-2, atol=2e-2, grad_rtol=4e-2, grad_atol=4e-2)


def _assert_stitched(cmp, launches):
    records = cmp.backend.records
    assert all(r.eager_reason is None for r in records), [r.eager_reason for r in records]
    eager = [(f.op, f.reason) for r in records if r.graph is not None for f in r.graph.fallbacks]
    assert not [e for e in eager if e[1] == NO_RULE], eager
    assert not eager, eager
    # (a backward may need no kernel: fmod by a scalar passes its gradient through)
    assert launches["n"] >= 1 and cmp.launches_per_graph[0] >= 1, cmp.launches_per_graph


@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
@pytest.mark.parametrize("name", sorted(UNARY))
def test_unary_forward_and_backward(name, dtype):
    fn, make, _ = UNARY[name]
    torch.manual_seed(stable_seed(name))
    x = _transposed(make, 7, 33, dtype).requires_grad_()
    with count_launches() as launches:
        cmp = compare_with_eager(fn, [x], **_tol(dtype))
    assert [r.kind for r in cmp.backend.records] == ["forward", "backward"]
    _assert_stitched(cmp, launches)


@pytest.mark.parametrize("name", sorted(UNARY))
def test_unary_forward_float64(name):
    fn, make, wide = UNARY[name]
    torch.manual_seed(1 + stable_seed(name))
    x = torch.cat([_transposed(make, 7, 33, torch.float64), _transposed(wide, 5, 33, torch.float64)])
    with count_launches() as launches:
        cmp = compare_with_eager(fn, [x], backward=False)
    _assert_stitched(cmp, launches)


@pytest.mark.parametrize("name", sorted(UNARY))
def test_integer_inputs_promote_to_float32(name):
    fn = UNARY[name][0]
    x = torch.randint(1, 4, (7, 33), dtype=torch.int32)  # 1..3: in every op's domain but acos/asin/atanh's
    with count_launches() as launches:
        cmp = compare_with_eager(lambda t: fn(t) * 2, [x], backward=False)
    assert cmp.outputs.dtype == torch.float32
    _assert_stitched(cmp, launches)


def _ulps(got: torch.Tensor, ref: torch.Tensor, dtype) -> torch.Tensor:
    fi = torch.finfo(dtype)
    return (got.double() - ref).abs() / (ref.abs().clamp_min(fi.tiny) * fi.eps)


@pytest.mark.parametrize("name", sorted(UNARY))
def test_unary_accuracy_over_wide_ranges(name):
    """float32 against a float64 run, over the whole domain (magnitudes 1e-30 to 1e30
    where the op takes them, edges of asin/acos/atanh's domain): a few ulps, like eager."""
    fn, make, wide = UNARY[name]
    torch.manual_seed(2 + stable_seed(name))
    x = torch.cat([wide((4000,), torch.float32), make((1000,), torch.float32)])
    if name in ("asin", "acos", "atanh"):  # next to +-1
        edge = 1 - torch.exp(torch.empty(1000, dtype=torch.float64).uniform_(-16, 0))
        x = torch.cat([x, edge.float(), -edge.float()])
    x = _nonzero(x)
    got = torch.compile(fn, backend="stitch")(x)
    ref = fn(x.double())
    finite = ref.isfinite() & (ref.abs() < torch.finfo(torch.float32).max)
    assert (got.isfinite() == finite).all()
    err, eager_err = _ulps(got, ref, torch.float32)[finite], _ulps(fn(x), ref, torch.float32)[finite]
    assert err.max() <= 4, (name, err.max().item(), eager_err.max().item())


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["fp32", "fp64"])
def test_special_values_match_eager_bit_for_bit(dtype):
    """nan, +-inf, signed zeros, subnormals, the domain edges (asin(>1) = nan, acosh(<1)
    = nan, atanh(+-1) = +-inf) and the thresholds where the formulas switch.  (Not
    sinh/cosh of float32 |x| in (88.72, 89.4]: eager's vectorised CPU kernel overflows
    to inf there, its scalar path does not; ours gives the finite value.)"""
    sp = [0.0, -0.0, 1.0, -1.0, math.inf, -math.inf, math.nan, 2.0, -2.0, 0.5, -0.5, 1e-45, -1e-45, 1e-310,
          3e38, -3e38, 20.0, 19.999998, 20.000002, 268435456.0, 268435460.0, 88.0, 1.5707963267948966,
          1.0000001, -1.0000001, 0.9999999, -0.9999999]
    x = torch.tensor(sp, dtype=dtype)
    fns = [f for f, _, _ in UNARY.values()]
    got = torch.compile(lambda t: [f(t) for f in fns], backend="stitch")(x)
    for f, g in zip(fns, got):
        e = f(x)
        same = ((g == e) & (g.signbit() == e.signbit())) | (g.isnan() & e.isnan())
        near = torch.isclose(g, e, rtol=4 * torch.finfo(dtype).eps, atol=0) & (g.signbit() == e.signbit())
        bad = ~(same | near)
        assert not bad.any(), (f.__name__, x[bad].tolist(), g[bad].tolist(), e[bad].tolist())


# ------------------------------------------------------------------------------ binary float ops

def _divisor(shape, dtype):
    """Magnitudes in [0.5, 2.5), random signs: away from zero, so fmod's other-gradient
    (-trunc(a / b)) is well defined."""
    return ((torch.rand(*shape, dtype=torch.float64) * 2 + 0.5) * (torch.randint(0, 2, shape) * 2 - 1)).to(dtype)


BINARY = {
    "atan2": (torch.atan2, _uniform(-3, 3), _uniform(-3, 3)),
    "fmod": (torch.fmod, _uniform(-20, 20), _divisor),
    "fmod_scalar": (lambda a, b: torch.fmod(a, 0.75) + torch.fmod(b, -1.5), _uniform(-20, 20), _uniform(-9, 9)),
}


@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
@pytest.mark.parametrize("name", sorted(BINARY))
def test_binary_forward_and_backward(name, dtype):
    fn, make_a, make_b = BINARY[name]
    torch.manual_seed(3 + stable_seed(name))
    a = _transposed(make_a, 7, 33, dtype).requires_grad_()
    b = _nonzero(make_b((7, 33), dtype)).requires_grad_()
    with count_launches() as launches:
        cmp = compare_with_eager(fn, [a, b], **_tol(dtype))
    assert [r.kind for r in cmp.backend.records] == ["forward", "backward"]
    _assert_stitched(cmp, launches)


@pytest.mark.parametrize("name", sorted(BINARY))
def test_binary_forward_float64(name):
    fn, make_a, make_b = BINARY[name]
    torch.manual_seed(4 + stable_seed(name))
    a = _transposed(make_a, 7, 33, torch.float64)
    b = _nonzero(make_b((7, 33), torch.float64))
    with count_launches() as launches:
        cmp = compare_with_eager(fn, [a, b], backward=False)
    _assert_stitched(cmp, launches)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["fp32", "fp64"])
def test_atan2_and_fmod_over_wide_ranges(dtype):
    """atan2 within a few ulps of float64 over magnitudes 1e-30..1e30 (both octants);
    fmod exact (equal to eager, sign of the dividend) with quotients up to 1e30, and
    at nan/inf/zero operands."""
    torch.manual_seed(5)
    y, x = _magnitude(1e-30, 1e30)((4096,), dtype), _magnitude(1e-30, 1e30)((4096,), dtype)
    a, b = _magnitude(1e-10, 1e20)((4096,), dtype), _magnitude(1e-10, 1e10)((4096,), dtype)
    # (no subnormal divisor for fmod: eager's vectorised float32 CPU kernel gives nan where
    # the quotient overflows, its scalar path and C do not)
    sp = torch.tensor([0.0, -0.0, 1.0, -1.0, math.inf, -math.inf, math.nan, 1e-40, -3e38], dtype=dtype)
    sa, sb = (t.reshape(-1) for t in torch.meshgrid(sp, sp, indexing="ij"))
    fa, fb = (t.reshape(-1) for t in torch.meshgrid(sp[:7], torch.cat([sp[:7], sp[8:]]), indexing="ij"))

    def fn(y, x, a, b, sa, sb, fa, fb):
        return torch.atan2(y, x), torch.fmod(a, b), torch.atan2(sa, sb), torch.fmod(fa, fb)
    at, fm, sat, sfm = torch.compile(fn, backend="stitch")(y, x, a, b, sa, sb, fa, fb)
    wide = np.longdouble if dtype == torch.float64 else np.float64
    ref = np.arctan2(y.numpy().astype(wide), x.numpy().astype(wide))
    fi = np.finfo(np.float32 if dtype == torch.float32 else np.float64)
    ulps = np.abs(at.numpy().astype(wide) - ref) / (np.maximum(np.abs(ref), fi.tiny) * fi.eps)
    assert ulps.max() <= 3, float(ulps.max())
    torch.testing.assert_close(fm, torch.fmod(a, b), rtol=0, atol=0)
    assert (fm.signbit() == a.signbit()).all()
    for got, want, p, q in ((sat, torch.atan2(sa, sb), sa, sb), (sfm, torch.fmod(fa, fb), fa, fb)):
        same = ((got == want) & (got.signbit() == want.signbit())) | (got.isnan() & want.isnan())
        near = torch.isclose(got, want, rtol=4 * torch.finfo(dtype).eps, atol=0)
        assert (same | near).all(), (p[~(same | near)].tolist(), q[~(same | near)].tolist())


# ------------------------------------------------------------------------------ integer ops

INTS = [torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64]
INT_IDS = ["i8", "u8", "i16", "i32", "i64"]


@pytest.mark.parametrize("dtype", INTS, ids=INT_IDS)
def test_integer_fmod_truncates_like_c(dtype):
    info = torch.iinfo(dtype)
    torch.manual_seed(6)
    a = torch.randint(max(info.min, -1000), min(info.max, 1000), (33, 7), dtype=dtype).t()
    sign = (torch.randint(0, 2, (7, 33)) * 2 - 1).to(dtype) if dtype.is_signed else 1
    b = torch.randint(1, 9, (7, 33), dtype=dtype) * sign
    if dtype.is_signed:
        a[0, 0], b[0, :3] = info.min, -1  # INT_MIN % -1 (overflows in C) and x % -1: 0

    def fn(a, b):
        return torch.fmod(a, b), torch.fmod(a, 3), torch.fmod(a, -1 if dtype.is_signed else 1), a.fmod(b * 0.5)
    with count_launches() as launches:
        cmp = compare_with_eager(fn, [a, b], backward=False)
    _assert_stitched(cmp, launches)


def test_integer_fmod_by_zero():
    """Eager raises for an integer divisor of zero (CPU).  A zero *scalar* divisor is
    refused at lowering, so that op runs eagerly and raises; a zero *element* of a
    divisor tensor cannot be seen statically: the kernel gives 0 there (documented)."""
    a = torch.randint(-50, 50, (7, 33), dtype=torch.int32)
    b = torch.randint(1, 9, (7, 33), dtype=torch.int32)
    b[2, 5] = 0
    out = torch.compile(lambda a, b: torch.fmod(a, b), backend="stitch")(a, b)
    want = torch.fmod(a, torch.where(b == 0, 1, b))
    assert torch.equal(out, want) and out[2, 5] == 0
    backend_calls = []

    def by_zero(a):
        return torch.fmod(a * 2, 0)
    compiled = torch.compile(by_zero, backend=_recording(backend_calls))
    with pytest.raises(RuntimeError, match="ZeroDivisionError"):
        compiled(a)
    reasons = [f.reason for r in backend_calls[0].records for f in r.graph.fallbacks]
    assert reasons and "zero scalar" in reasons[0], reasons


def _recording(store):
    from stitchml import StitchBackend
    backend = StitchBackend()
    store.append(backend)
    return backend


@pytest.mark.parametrize("dtype", INTS, ids=INT_IDS)
def test_shifts_match_eager_for_every_count(dtype):
    """Counts below 0 and from the bit width up: eager gives 0 (left), the sign fill
    a >> (bits - 1) (right, signed) or 0 (right, unsigned); in range the left shift wraps."""
    info = torch.iinfo(dtype)
    bits = info.bits
    torch.manual_seed(7)
    a = torch.randint(max(info.min, -1000), min(info.max, 1000), (33, 7), dtype=dtype).t()
    lo = 0 if not dtype.is_signed else -bits - 3
    b = torch.randint(lo, min(2 * bits + 3, info.max), (7, 33), dtype=dtype)
    b[0, :4] = torch.tensor([0, bits - 1, bits, max(lo, -1)], dtype=dtype)
    neg = -1 if dtype.is_signed else 1
    base = -7 if dtype.is_signed else 7

    def fn(a, b):
        return (a << b, a >> b, aten.bitwise_left_shift.Tensor(a, b), aten.bitwise_right_shift.Tensor(a, b),
                a << 3, a >> 2, a << bits, a >> (bits + 2), a >> neg, a << neg,
                aten.bitwise_left_shift.Tensor_Scalar(a, bits - 1), aten.bitwise_right_shift.Tensor_Scalar(a, bits),
                aten.bitwise_left_shift.Scalar_Tensor(5, b), aten.bitwise_right_shift.Scalar_Tensor(base, b))
    with count_launches() as launches:
        cmp = compare_with_eager(fn, [a, b], backward=False)
    _assert_stitched(cmp, launches)
    assert cmp.num_kernels <= 2  # (outputs in a's transposed layout and in b's)


def _gcd_operands(dtype):
    """Every pair for 8-bit types; otherwise random pairs across the range, with zeros,
    the type's minimum (whose absolute value wraps) and the worst pair for Euclid's
    algorithm: the two largest consecutive Fibonacci numbers of the type."""
    info = torch.iinfo(dtype)
    if info.bits == 8:
        v = torch.arange(info.min, info.max + 1, dtype=torch.int64)
        return v.repeat_interleave(len(v)).to(dtype), v.repeat(len(v)).to(dtype)
    torch.manual_seed(11)
    a = torch.randint(info.min, info.max, (997,), dtype=dtype)
    b = torch.randint(info.min, info.max, (997,), dtype=dtype) // torch.randint(1, min(1 << 20, info.max), (997,), dtype=dtype)
    fib = [0, 1]
    while fib[-1] + fib[-2] <= info.max:
        fib.append(fib[-1] + fib[-2])
    special = [(fib[-1], fib[-2]), (fib[-2], fib[-1]), (-fib[-1], fib[-2]), (info.min, 6), (6, info.min),
               (info.min, info.min), (0, 0), (0, -12), (-12, 0), (info.min, 0), (48, -18)]
    a[:len(special)] = torch.tensor([p[0] for p in special], dtype=dtype)
    b[:len(special)] = torch.tensor([p[1] for p in special], dtype=dtype)
    return a, b


@pytest.mark.parametrize("dtype", INTS, ids=INT_IDS)
def test_gcd_and_lcm_stitch_and_match_eager_bit_for_bit(dtype):
    """Euclid's loop until the block's slowest pair is done (codegen `_gcd`): the worst
    pair (consecutive Fibonacci numbers) beside pairs done in one step, the minimum's
    wrapped absolute value as eager's, lcm's wrapping product (8/16-bit types through
    int as C promotes them), gcd(0, 0) = lcm(0, 0) = 0 (op_db: 'no lowering rule')."""
    a, b = _gcd_operands(dtype)

    def fn(a, b):
        return torch.gcd(a, b), torch.lcm(a, b), torch.gcd(a, b[:1].expand_as(b)) + 1
    with count_launches() as launches:
        cmp = compare_with_eager(fn, [a, b], backward=False)
    _assert_stitched(cmp, launches)
    assert cmp.num_kernels == 1


def test_shift_of_mixed_integer_types_promotes_like_eager():
    a = torch.randint(-100, 100, (7, 33), dtype=torch.int8)
    b = torch.randint(0, 40, (7, 33), dtype=torch.int64)
    with count_launches() as launches:
        cmp = compare_with_eager(lambda a, b: (a << b, a >> b, b << a.abs().to(torch.int16)), [a, b], backward=False)
    _assert_stitched(cmp, launches)
    assert [o.dtype for o in cmp.outputs] == [torch.int64, torch.int64, torch.int64]


# ------------------------------------------------------------------------------ var.dim, one_hot

def test_var_dim_is_traced_as_var_correction_and_stitches():
    from stitchml.tools import opstable
    assert opstable.classify(aten.var.dim).status == opstable.STITCHED

    def fn(x):
        return torch.var(x, 1, True, keepdim=True) * 2, aten.var.dim(x, [0], False)
    x = _transposed(_uniform(-3, 3), 7, 33, torch.float32).requires_grad_()
    with count_launches() as launches:
        cmp = compare_with_eager(fn, [x])
    _assert_stitched(cmp, launches)


def test_one_hot_under_strict_stitches_and_still_raises_out_of_range():
    def fn(labels, w):
        return F.one_hot(labels, 5).to(w.dtype) * w

    labels, w = torch.randint(0, 5, (33,)), torch.randn(33, 5)
    with config.override(strict=True):
        with count_launches() as launches:
            cmp = compare_with_eager(fn, [labels, w], backward=False)
        assert launches["n"] >= 1 and cmp.num_kernels >= 1
        eager = [(f.op, f.reason) for r in cmp.backend.records for f in r.graph.fallbacks]
        assert eager and all(op.startswith("aten._assert_async") and "runtime check" in why for op, why in eager)
        compiled = torch.compile(fn, backend="stitch")
        torch.testing.assert_close(compiled(labels, w), fn(labels, w))
        for bad, message in ((5, "smaller than num_classes"), (-1, "non-negative")):
            wrong = labels.clone()
            wrong[7] = bad
            with pytest.raises(RuntimeError, match=message):
                compiled(wrong, w)


# ------------------------------------------------------------------------------ sm_90

AOT_SCRIPT = textwrap.dedent("""
    import json, re, struct, tempfile, importlib.util, os, torch, triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from stitchml.tools.aot_check import check
    from stitchml.codegen.triton_ops import PRELUDE

    def unary(x):
        return (torch.asin(x * 0.5), torch.acos(x * 0.5), torch.atan(x), torch.asinh(x), torch.acosh(x.abs() + 1),
                torch.atanh(x * 0.5), torch.sinh(x), torch.cosh(x), torch.tan(x), torch.log10(x.abs()))

    def binary(x, y):
        return torch.atan2(x, y), torch.fmod(x, y), torch.fmod(x, 0.75), torch.remainder(x, y), x // y

    def ints(a, b):
        return torch.fmod(a, b), torch.fmod(a, 3), a << b, a >> b, a << 3, a >> 70, 5 << b, 5 >> b

    out = {}
    for dt in (torch.float32, torch.float64, torch.bfloat16, torch.float16):
        out[f"unary {dt}"] = check(unary, torch.randn(7, 33, dtype=dt))
        out[f"binary {dt}"] = check(binary, torch.randn(7, 33, dtype=dt), torch.randn(7, 33, dtype=dt))
    for dt in (torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64):
        out[f"ints {dt}"] = check(ints, torch.randint(1, 50, (7, 33), dtype=dt), torch.randint(1, 9, (7, 33), dtype=dt))
    result = {k: [r.__dict__ for r in v] for k, v in out.items()}

    # a float literal assigned to a local would be a float32 constant in compiled code
    # (not in the interpreter): the float64 atan polynomial must keep its float64 coefficients
    src = PRELUDE + '''
    @triton.jit
    def k(x, y, N: tl.constexpr):
        o = tl.arange(0, N)
        tl.store(y + o, _atan(tl.load(x + o)))
    '''
    path = os.path.join(tempfile.mkdtemp(), "atan64.py")
    open(path, "w").write(src)
    spec = importlib.util.spec_from_file_location("atan64", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    ptx = triton.compile(ASTSource(mod.k, {"x": "*fp64", "y": "*fp64"}, {"N": 128}),
                         target=GPUTarget("cuda", 90, 32)).asm["ptx"]
    want = "0d%016X" % struct.unpack("<Q", struct.pack("<d", -0.017922196523442038))[0]
    result["atan64 coefficient in PTX"] = [{"kernel": "k", "ok": want in ptx, "error": want, "registers": None}]
    print(json.dumps(result))
""")


@pytest.mark.slow
def test_new_expressions_compile_for_sm90():
    from test_aot_gpu import compiled_for_sm90
    results, kernels = compiled_for_sm90(AOT_SCRIPT)
    # every graph compiled (4 float dtypes x unary, binary; 5 integer dtypes; the PTX
    # check) — one kernel per graph since sibling fusion puts a graph's element-wise
    # outputs of one input in one kernel (this counted kernels, >= 60, and failed then)
    assert len(results) == 14 and all(len(rs) >= 1 for rs in results.values()), results
