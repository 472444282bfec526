"""Issue 19: searchsorted, bucketize, isin, nonzero_static and repeat_interleave with a
tensor of repeats stitched
(capture/decomp_search.py): a branch-free binary search of element-wise ops and gathers
(one kernel with what consumes it), isin's comparison reduction or sorted-set search,
nonzero_static's scan and scatter-write.

Each op runs against eager on fresh random inputs (seeded per test: tests/seeds.py) with
odd sizes, non-contiguous operands, duplicates in the sorted sequence (where left and
right differ), values below, above and equal to every boundary, NaN where eager defines
its result, in float32, bfloat16 and int64; outputs are poisoned (tests/conftest.py),
no op may run eagerly (isin's sort excepted: a library op) and the kernel count is
checked.  The kernels also compile for sm_90 ahead of time."""
import math

import pytest
import torch

from stitchml import StitchBackend
from stitchml.capture import decomp_search
from stitchml.fallback import NO_RULE
from stitchml.testing import compare_with_eager
from launches import count_launches
from seeds import stable_seed

pytestmark = pytest.mark.filterwarnings("ignore:torch.searchsorted.*non-contiguous")
aten = torch.ops.aten
NAN, INF = math.nan, math.inf
DTYPES = [pytest.param(torch.float32, id="fp32"), pytest.param(torch.bfloat16, id="bf16"),
          pytest.param(torch.int64, id="i64")]
SORT_REASON = "library op: sorting networks are not a stitched kernel form"


def _eager_ops(cmp) -> list[tuple[str, str]]:
    records = cmp.backend.records
    assert all(r.eager_reason is None for r in records), [r.eager_reason for r in records]
    return [(f.op, f.reason) for r in records if r.graph is not None for f in r.graph.fallbacks]


def _run(fn, inputs, kernels: int | None = 1, eager_ops=()):
    """Compiled vs eager (exact for integer and bool outputs); only `eager_ops` may run
    eagerly; `kernels` stitched kernels launched (None: not checked).  Static sizes: a
    function run again at other sizes would be recompiled with symbolic ones."""
    torch._dynamo.reset()
    with count_launches() as launches:
        cmp = compare_with_eager(fn, inputs, backward=False)
    assert sorted(_eager_ops(cmp)) == sorted(eager_ops)
    if kernels is not None:
        assert cmp.num_kernels == kernels and launches["n"] == kernels, (cmp.launches_per_graph, launches)
    return cmp


def _sorted_seq(*shape, dtype, hi=12):
    """Sorted along the last dim, from a transposed buffer (non-contiguous when 2-d),
    with many duplicates."""
    t = torch.sort(torch.randint(0, hi, shape[::-1]).to(dtype), 0).values.t() if len(shape) == 2 \
        else torch.sort(torch.randint(0, hi, shape).to(dtype)).values
    assert len(shape) == 1 or not t.is_contiguous()
    return t


def _values(*shape, dtype, hi=12):
    """Below, above, equal to and (floats) between the boundaries; dims reversed in
    memory (non-contiguous from 2-d on)."""
    t = torch.randint(-4, 2 * hi + 4, shape[::-1]).to(torch.float64) / 2
    t = (t.round() if not dtype.is_floating_point else t).to(dtype).permute(*range(len(shape) - 1, -1, -1))
    assert tuple(t.shape) == shape and (len(shape) < 2 or not t.is_contiguous())
    return t


def _unsorted(*shape, dtype, hi=12):
    return torch.randint(0, hi, shape).to(dtype)


# name -> (function, input makers(dtype)); every output feeds an element-wise op
SEARCHES = {
    "left_1d": (lambda s, v: torch.searchsorted(s, v) * 2 + 1,
                lambda d: [_sorted_seq(37, dtype=d), _values(5, 9, dtype=d)]),
    "right_1d_int32": (lambda s, v: torch.searchsorted(s, v, right=True, out_int32=True) - 3,
                       lambda d: [_sorted_seq(37, dtype=d), _values(5, 9, dtype=d)]),
    "side_right_3d_values": (lambda s, v: torch.searchsorted(s, v, side="right") * 3,
                             lambda d: [_sorted_seq(21, dtype=d), _values(3, 4, 5, dtype=d)]),
    "rows_left": (lambda s, v: torch.searchsorted(s, v) + 1,
                  lambda d: [_sorted_seq(4, 23, dtype=d), _values(4, 11, dtype=d)]),
    "rows_right_int32": (lambda s, v: torch.searchsorted(s, v, right=True, out_int32=True) * 2,
                         lambda d: [_sorted_seq(5, 16, dtype=d), _values(5, 9, dtype=d)]),
    "sorter_1d": (lambda s, v, p: torch.searchsorted(s, v, sorter=p) + torch.searchsorted(s, v, side="right",
                                                                                         sorter=p),
                  lambda d: _with_sorter(_unsorted(29, dtype=d), _values(5, 7, dtype=d))),
    "sorter_rows": (lambda s, v, p: torch.searchsorted(s, v, right=True, sorter=p) * 2,
                    lambda d: _with_sorter(_unsorted(3, 17, dtype=d), _values(3, 8, dtype=d))),
    "python_scalar": (lambda s: torch.searchsorted(s, 5) * 2 + torch.searchsorted(s, 7, right=True),
                      lambda d: [_sorted_seq(19, dtype=d)]),
    "zero_dim_values": (lambda s, v: torch.searchsorted(s, v, right=True) + 1,
                        lambda d: [_sorted_seq(19, dtype=d), torch.tensor(5).to(d)]),
    "bucketize": (lambda v, b: torch.bucketize(v, b) * 2 + torch.bucketize(v, b, right=True, out_int32=True),
                  lambda d: [_values(3, 5, 7, dtype=d), _sorted_seq(31, dtype=d)]),
    "bucketize_scalar": (lambda b: torch.bucketize(5, b) + torch.bucketize(6, b, right=True),
                         lambda d: [_sorted_seq(13, dtype=d)]),
}


def _with_sorter(raw, values):
    return [raw, values, torch.argsort(raw, -1)]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", sorted(SEARCHES))
def test_search_matches_eager_in_one_kernel(name, dtype):
    torch.manual_seed(stable_seed("search", name, str(dtype)))
    fn, make = SEARCHES[name]
    _run(fn, make(dtype))


@pytest.mark.parametrize("n", [1, 2, 7, 8, 9, 16])
def test_every_insertion_point_at_step_count_boundaries(n):
    """Sequences of 2^k - 1, 2^k and 2^k + 1 values (bit_length(n) steps): every
    insertion point, from both sides, for strictly increasing and all-equal sequences."""
    seq = torch.arange(n, dtype=torch.float32) * 2
    vals = torch.arange(-1, 2 * n + 1, dtype=torch.float32)      # each boundary and each gap

    def fn(s, v, same):
        return torch.searchsorted(s, v), torch.searchsorted(s, v, right=True), torch.searchsorted(same, v * 0)
    _run(fn, [seq, vals, torch.zeros(n)])


NAN_SEQUENCES = [[1.0, 2.0, 2.0, 3.0, NAN], [1.0, NAN, 2.0], [NAN, NAN], [NAN], [NAN, 1.0, 2.0, 3.0, 4.0, 5.0],
                 [-INF, 0.0, 0.0, INF, NAN, NAN, NAN]]


@pytest.mark.parametrize("dtype", [pytest.param(torch.float32, id="fp32"), pytest.param(torch.bfloat16, id="bf16")])
def test_nan_as_eager(dtype):
    """eager's binary search goes right unless seq[mid] >= v (> v for right), so a NaN
    value lands at n and a NaN met at mid sends the search right, even mid-sequence:
    each result equals eager's, sorted sequence or not; NaN rows of an N-d sequence too."""
    vals = torch.tensor([-INF, -1.0, 0.0, 1.0, 1.5, 2.0, 3.0, 4.5, 5.0, INF, NAN], dtype=dtype)

    def fn(s, v):
        return torch.searchsorted(s, v), torch.searchsorted(s, v, right=True), torch.bucketize(v, s, right=True)
    for seq in NAN_SEQUENCES:
        _run(fn, [torch.tensor(seq, dtype=dtype), vals])
    torch.manual_seed(stable_seed("nan rows", str(dtype)))
    rows = _sorted_seq(6, 13, dtype=dtype).clone()
    rows[1, -3:] = NAN
    rows[2, 5] = NAN
    rows[4, :] = NAN
    v = _values(6, 9, dtype=dtype).clone()
    v[0, 2] = v[3, 4] = NAN
    _run(lambda s, v: torch.searchsorted(s, v, side="right") * 2 + torch.searchsorted(s, v), [rows, v])


def test_edge_cases():
    """An empty sequence (every index 0), empty values, one boundary, mixed dtypes
    compared in the promoted dtype (an int64 sequence and fractional values, float
    boundaries and integer values, a 0-d float64 value that does not promote)."""
    f32 = torch.float32
    fn = lambda s, v: torch.searchsorted(s, v, right=True) * 2  # noqa: E731
    _run(fn, [torch.tensor([], dtype=f32), _values(3, 5, dtype=f32)])
    _run(fn, [torch.empty(4, 0), _values(4, 5, dtype=f32)])
    _run(fn, [_sorted_seq(9, dtype=f32), torch.empty(0, 3)], kernels=0)
    _run(fn, [torch.tensor([2.0]), torch.tensor([1.0, 2.0, 3.0])])
    _run(fn, [torch.tensor([1, 2, 2, 3]), torch.tensor([1.5, 2.0, 2.5, -7.0])])
    _run(fn, [torch.tensor([1.5, 2.0, 2.5]), torch.tensor([1, 2, 3])])
    _run(fn, [torch.tensor([0.1], dtype=f32), torch.tensor(0.1, dtype=torch.float64)])    # f32 compare: 1
    _run(fn, [torch.tensor([0.1], dtype=f32), torch.tensor([0.1], dtype=torch.float64)])  # f64 compare: 0
    _run(lambda v, b: torch.bucketize(v, b, out_int32=True), [_values(4, 3, dtype=f32), torch.tensor([])])


def test_bucketize_reuses_the_search_not_torchs_decomposition():
    """torch's bucketize decomposition returns the input's dtype for empty boundaries;
    ours returns eager's int64 (it is the same search as searchsorted)."""
    assert decomp_search.table()[aten.bucketize.Tensor] is decomp_search.bucketize
    out = torch.compile(lambda v, b: torch.bucketize(v, b), backend="stitch")(torch.rand(5), torch.tensor([]))
    assert out.dtype == torch.int64 and torch.equal(out, torch.zeros(5, dtype=torch.int64))


def test_symbolic_sequence_lengths_share_a_graph_per_step_count():
    """Under dynamic shapes the step count guards a range of lengths [2^(k-1), 2^k), not
    the length itself: 9 and 13 share a graph, 6 and 40 take their own."""
    backend = StitchBackend()
    f = torch.compile(lambda s, v: torch.searchsorted(s, v) * 2, backend=backend)
    graphs = []
    for n in (5, 9, 13, 6, 40):
        s, v = _sorted_seq(n, dtype=torch.float32), _values(n + 3, dtype=torch.float32)
        with count_launches() as launches:
            got = f(s, v)
        assert torch.equal(got, torch.searchsorted(s, v) * 2) and launches["n"] == 1
        graphs.append(len(backend.records))
    assert graphs == [1, 2, 2, 3, 4], graphs
    assert not [f for r in backend.records for f in (r.graph.fallbacks if r.graph is not None else [])]


def test_declined_case_runs_eagerly_with_its_reason():
    """A sorter that is not int64: the decomposition declines and eager raises its own
    error, the op reported with DECLINED's reason (not "no lowering rule")."""
    backend = StitchBackend()
    s = torch.tensor([3.0, 1.0, 2.0])
    with pytest.raises(RuntimeError, match="sorter must be a tensor of long dtype"):
        torch.compile(lambda s, p: torch.searchsorted(s, s, sorter=p), backend=backend)(s, torch.argsort(s).int())
    reasons = [(f.op, f.reason) for r in backend.records for f in r.graph.fallbacks]
    assert reasons == [("aten.searchsorted.Tensor", decomp_search.DECLINED[aten.searchsorted.Tensor])]
    assert NO_RULE not in reasons[0][1]


# ----------------------------------------------------------------------------- isin

def _isin_inputs(dtype, test_shape, test_nans=2):
    e = torch.randint(0, 40, (13, 7)).to(dtype).t()
    t = torch.randint(0, 40, test_shape).to(dtype)
    if dtype.is_floating_point:
        e[1, :3] = NAN
        t.view(-1)[:test_nans] = NAN
        e[2, :2] = torch.tensor([-0.0, 0.0], dtype=dtype)
    return [e, t]


def _isin_both(e, t):
    return torch.isin(e, t), torch.isin(e, t, invert=True)


@pytest.mark.parametrize("dtype", DTYPES)
def test_isin_small_test_set_is_one_reduction_kernel(dtype):
    """any(e[..., None] == t.flatten()) over a 2-d test set with duplicates; NaN is in
    no set; invert=True in the same kernel."""
    torch.manual_seed(stable_seed("isin small", str(dtype)))
    assert not decomp_search._isin_sorts(7 * 13, 12)
    _run(_isin_both, _isin_inputs(dtype, (3, 4)))


@pytest.mark.parametrize("dtype", DTYPES)
def test_isin_large_test_set_sorts_and_searches(dtype, monkeypatch):
    """Beyond the threshold (lowered here, so the interpreter runs small sizes) the test
    set is sorted (eager's library sort) and searched; NaN (sorted last) is never found,
    and NaNs met at mid (40 of 101 test values) hide no value up to the last non-NaN one."""
    monkeypatch.setattr(decomp_search, "ISIN_BRUTE_MAX_PAIRS", 1000)
    torch.manual_seed(stable_seed("isin large", str(dtype)))
    e, t = _isin_inputs(dtype, (101,), test_nans=40)
    e[0, 0] = torch.nan_to_num(t).max() if dtype.is_floating_point else t.max()
    assert decomp_search._isin_sorts(e.numel(), t.numel())
    # (a sort per isin call: the compiled graph has two)
    _run(_isin_both, [e, t], kernels=None, eager_ops=[("aten.sort.default", SORT_REASON)] * 2)
    _run(lambda e, t: torch.isin(e, t).to(torch.int64) * 2, [e, t], eager_ops=[("aten.sort.default", SORT_REASON)])


def test_isin_threshold():
    """The sorted form needs more than 64 test values and 2^27 compared pairs."""
    assert not decomp_search._isin_sorts(10 ** 8, 64)
    assert decomp_search._isin_sorts(10 ** 8, 65)
    assert not decomp_search._isin_sorts(2 ** 20, 2 ** 7)      # exactly 2^27 pairs
    assert decomp_search._isin_sorts(2 ** 20 + 1, 2 ** 7)
    assert not decomp_search._isin_sorts(1, 10 ** 6)           # one element: a single row reduction


@pytest.mark.parametrize("sort", [False, True], ids=["compare", "sorted"])
def test_isin_mixed_dtypes_and_scalars(sort, monkeypatch):
    """Operands compared in eager's promoted dtype (2^24 + 1 equals 2^24 in float32; a 0-d
    float64 test value does not promote float32 elements); Python scalars on either side."""
    if sort:
        monkeypatch.setattr(decomp_search, "ISIN_BRUTE_MAX_PAIRS", 0)
        monkeypatch.setattr(decomp_search, "ISIN_SORT_MIN_TEST", 1)   # (a scalar test value is compared)
    sorts = [("aten.sort.default", SORT_REASON)] if sort else []
    _run(_isin_both, [torch.tensor([1, 2, 3, 2 ** 24 + 1]), torch.tensor([1.5, 2.0, 2.0 ** 24])], kernels=None,
         eager_ops=sorts * 2)
    _run(_isin_both, [torch.tensor([1.5, 2.0, 3.0]), torch.tensor([1, 2])], kernels=None, eager_ops=sorts * 2)
    _run(_isin_both, [torch.tensor([0.1, 0.2]), torch.tensor([0.1, 0.3], dtype=torch.float64)], kernels=None,
         eager_ops=sorts * 2)
    _run(_isin_both, [torch.tensor([0.1, 0.2]), torch.tensor(0.1, dtype=torch.float64)])   # (one value: compared)
    _run(lambda e: (torch.isin(e, 2.0), torch.isin(e, NAN, invert=True)), [torch.tensor([[1.0, 2.0], [NAN, 2.0]])])
    _run(lambda t: torch.isin(3, t), [torch.tensor([NAN, 1.0, 3.0])], kernels=None, eager_ops=sorts)
    _run(_isin_both, [torch.empty(0, 3), torch.tensor([1.0])], kernels=0)
    _run(_isin_both, [torch.tensor([1.0, 2.0]), torch.tensor([])])


# ----------------------------------------------------------------------------- nonzero_static

@pytest.mark.parametrize("dtype", DTYPES + [pytest.param(torch.bool, id="bool")])
def test_nonzero_static_smaller_equal_and_larger_sizes(dtype):
    """The first `size` nonzero positions in row-major order (a non-contiguous 3-d input),
    the remaining rows fill_value: a scan kernel and a scatter kernel per call."""
    torch.manual_seed(stable_seed("nonzero", str(dtype)))
    x = (torch.rand(7, 5, 3) < 0.4).to(dtype).permute(2, 0, 1)
    if dtype.is_floating_point:
        x = x * torch.randn(3, 7, 5).to(dtype)
        x[0, 0, :2] = torch.tensor([NAN, -0.0], dtype=dtype)     # NaN is nonzero, -0.0 is not
    count = int((x != 0).sum())
    assert count > 4
    for size, fill in ((count - 4, -1), (count, 0), (count + 5, -7)):
        _run(lambda t, size=size, fill=fill: torch.nonzero_static(t, size=size, fill_value=fill), [x], kernels=2)


def test_nonzero_static_edge_cases():
    """size 0, 0-d inputs (shape (size, 0)), an empty input, all zeros, complex values."""
    def nz(size, fill=-1):
        return lambda t: torch.nonzero_static(t, size=size, fill_value=fill)
    _run(nz(0), [torch.randn(3, 4)], kernels=0)
    _run(nz(3), [torch.tensor(2.0)], kernels=0)
    _run(nz(3), [torch.tensor(0.0)], kernels=0)
    _run(nz(4, -5), [torch.empty(0, 3)], kernels=None)
    _run(nz(4, -5), [torch.zeros(6, 3)], kernels=2)
    _run(nz(3, 9), [torch.tensor([1j, 0, 2, 0, 1 + 1j, 0j])], kernels=2)
    _run(lambda t: torch.nonzero_static(t > 0.5, size=7) * 2, [torch.rand(33)], kernels=2)


# ----------------------------------------------------------------------------- sm_90

AOT_SCRIPT = '''
import json, torch
from stitchml.capture import decomp_search
from stitchml.tools.aot_check import check

def search(s, v, rows, vrows, raw, order):
    return (torch.searchsorted(s, v) * 2 + 1, torch.searchsorted(rows, vrows, right=True, out_int32=True),
            torch.searchsorted(raw, v, side="right", sorter=order), torch.bucketize(v, s, right=True))

def isin(e, t, big):
    return torch.isin(e, t), torch.isin(e, big, invert=True)

def nonzero(x):
    return torch.nonzero_static(x, size=20, fill_value=-2)

out = {}
for dt in (torch.float32, torch.bfloat16, torch.int64):
    s = torch.sort(torch.randint(0, 9, (37,)).to(dt)).values
    raw = torch.randint(0, 9, (37,)).to(dt)
    rows = torch.sort(torch.randint(0, 9, (4, 23)).to(dt), -1).values
    out[f"search {dt}"] = check(search, s, torch.randint(-1, 10, (5, 9)).to(dt), rows,
                                torch.randint(-1, 10, (4, 11)).to(dt), raw, torch.argsort(raw))
    decomp_search.ISIN_BRUTE_MAX_PAIRS = 1000     # (the sorted form at a small size)
    out[f"isin {dt}"] = check(isin, torch.randint(0, 50, (7, 13)).to(dt), torch.randint(0, 50, (5,)).to(dt),
                              torch.randint(0, 50, (100,)).to(dt))
    decomp_search.ISIN_BRUTE_MAX_PAIRS = 2 ** 27
    out[f"nonzero {dt}"] = check(nonzero, torch.randint(0, 2, (3, 5, 7)).to(dt))
print(json.dumps({k: [r.__dict__ for r in v] for k, v in out.items()}))
'''


def test_search_kernels_compile_for_sm90():
    """The search (1-d, rows, sorter, bucketize), isin's reduction and sorted search, and
    nonzero_static's scan and scatter compile for an H100 ahead of time in float32,
    bfloat16 and int64, without spilling."""
    from test_aot_gpu import compiled_for_sm90
    results, kernels = compiled_for_sm90(AOT_SCRIPT)
    assert {name.split()[0] for name, _ in kernels} == {"search", "isin", "nonzero"} and len(results) == 9
    for name, r in kernels:
        assert not r["spills"], (name, r)


@pytest.mark.parametrize("case", ["rows", "zeros_in_repeats", "leading_dim_backward"])
def test_repeat_interleave_with_a_tensor_of_repeats_and_output_size(case):
    """x.repeat_interleave(r, dim, output_size=n): the indices searched in the running
    total of r (zeros in r skip their element), then the index_select: no op eager,
    forward and backward (the gradient sums each element's copies)."""
    torch.manual_seed(stable_seed(case))
    if case == "rows":
        x, r, dim = torch.randn(5, 7), torch.tensor([3, 1, 2, 1, 4]), 0
    elif case == "zeros_in_repeats":
        x, r, dim = torch.randn(4, 6), torch.tensor([0, 2, 0, 1, 3, 0]), 1
    else:
        x, r, dim = torch.randn(6, 3, 2).requires_grad_(), torch.tensor([2, 0, 1, 1, 3, 2]), 0
    n = int(r.sum())

    def f(x, r):
        return x.repeat_interleave(r, dim=dim, output_size=n) * 2
    with count_launches() as launches:
        cmp = compare_with_eager(f, [x, r], rtol=0, atol=0)
    assert not [fb for rec in cmp.backend.records for fb in rec.graph.fallbacks]
    assert launches["n"] >= 1


def test_repeat_interleave_without_output_size_says_why_it_runs_eagerly():
    from stitchml.capture.decomp import declined_reason
    assert decomp_search.repeat_interleave(torch.tensor([1, 2])) is NotImplemented
    assert "data, not shape" in declined_reason(aten.repeat_interleave.Tensor)
