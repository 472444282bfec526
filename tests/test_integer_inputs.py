"""Integer and bool inputs where the op takes them (issue 19, item 2): what the OpInfo
sweep's int64 / int32 / bool configurations found running eagerly or wrong — integer
pools, accumulating writes into bool tensors, the triangle-index constructors — and
addbmm's silent float32 result for integer tensors.  gcd and lcm are in
test_coverage_math.py."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from launches import count_launches
from stitchml import StitchBackend
from stitchml.testing import compare_with_eager


def _no_eager(cmp) -> None:
    """Every graph planned, every op in a kernel (or a view)."""
    records = cmp.backend.records
    assert records and all(r.eager_reason is None for r in records), [r.eager_reason for r in records]
    eager = [(f.op, f.reason) for r in records for f in r.graph.fallbacks]
    assert not eager, eager


def test_addbmm_of_integers_keeps_the_type_and_truncates_the_scalars_like_eager():
    """Our decomposition scaled int64 tensors by beta=0.6, alpha=0.2 as floats: a float32
    result where eager's is int64 (it converts the scalars to the integer type first)."""
    torch.manual_seed(1)
    m = torch.randint(-9, 9, (5, 6))
    a, b = torch.randint(-9, 9, (3, 5, 4)), torch.randint(-9, 9, (3, 4, 6))

    def fn(m, a, b):
        return (torch.addbmm(m, a, b, beta=0.6, alpha=0.2), torch.addbmm(m, a, b, beta=2.7, alpha=-1.5),
                torch.addbmm(m, a, b, beta=1, alpha=3))
    cmp = compare_with_eager(fn, [m, a, b], backward=False)
    assert [o.dtype for o in cmp.outputs] == [torch.int64] * 3


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.int8, torch.uint8], ids=str)
def test_integer_max_pools_stitch_with_eagers_values_and_indices(dtype):
    """Padding by the type's minimum (not -inf); a window of minima takes its first
    position inside the input, as eager's.  Unrolled and reduced windows, 2-d and 3-d (eager has no integer max_pool1d)."""
    info = torch.iinfo(dtype)
    torch.manual_seed(2)
    x = torch.randint(max(info.min, -100), min(info.max, 100), (2, 3, 7, 9), dtype=dtype)
    x[0, 0, :3, :3] = info.min

    def fn(x):
        return (F.max_pool2d(x, 3, 2, 1, return_indices=True), F.max_pool2d(x, 6, 1, 3, return_indices=True),
                F.max_pool3d(x, 2, 1, 1, return_indices=True))
    with count_launches() as launches:
        cmp = compare_with_eager(fn, [x], backward=False)
    _no_eager(cmp)
    assert launches["n"] == cmp.num_kernels >= 1


def test_int64_average_pools_divide_like_eager():
    """Eager sums int64 windows and truncates the quotient (-7.75 is -7); the 3-d pool
    divides once by the 3-d count (two truncating stages would round twice)."""
    torch.manual_seed(3)
    x = torch.randint(-100, 100, (2, 3, 7, 9))

    def fn(x):
        return (F.avg_pool2d(x, 3, 2, 1), F.avg_pool2d(x, (2, 3), (1, 2), 1, ceil_mode=True, count_include_pad=False),
                F.avg_pool2d(x, 2, divisor_override=3), F.avg_pool2d(x, 6, 1, 3),
                F.avg_pool3d(x, 2, 1, 1), F.avg_pool3d(x, (2, 3, 2), 2, 1, ceil_mode=True, count_include_pad=False),
                F.avg_pool1d(x.flatten(2), 3, 2, 1))
    cmp = compare_with_eager(fn, [x], backward=False)
    _no_eager(cmp)
    # (means that are not integers, negative ones among them: where truncation and floor differ)
    means = F.avg_pool2d(x.double(), 3, 2, 1)
    assert ((means % 1 != 0) & (means < 0)).any()


_IDX = torch.tensor([0, 2, 0, 5])   # (a duplicate destination)


@pytest.mark.parametrize("name", ["index_put", "index_add", "scatter_add", "scatter_sum_no_self", "put",
                                  "amax", "amax_no_self", "amin", "amin_no_self", "prod", "prod_no_self",
                                  "index_reduce_prod", "zero_dim"])
def test_accumulating_into_bool_tensors_is_a_logical_or_in_a_kernel(name):
    """Eager adds bools as C++ does (true + true stored as true) and takes amax/amin/prod as
    or/and/and; these ran eagerly ("into a bool tensor runs eagerly", "'prod' of bools")."""
    torch.manual_seed(4)
    x, v = torch.rand(6, 5) > 0.6, torch.rand(4, 5) > 0.5
    col = _IDX.view(4, 1).expand(4, 5)
    fns = {
        "index_put": lambda x, v: x.index_put((_IDX,), v, accumulate=True),
        "index_add": lambda x, v: x.index_add(0, _IDX, v),
        "scatter_add": lambda x, v: x.scatter_add(0, col, v),
        "scatter_sum_no_self": lambda x, v: x.scatter_reduce(0, col, v, "sum", include_self=False),
        "put": lambda x, v: x.put(torch.tensor([1, 3, 1, 29]), v[0, :4], accumulate=True),
        "amax": lambda x, v: x.scatter_reduce(0, col, v, "amax"),
        "amax_no_self": lambda x, v: x.scatter_reduce(0, col, v, "amax", include_self=False),
        "amin": lambda x, v: x.scatter_reduce(0, col, v, "amin"),
        "amin_no_self": lambda x, v: x.scatter_reduce(0, col, v, "amin", include_self=False),
        "prod": lambda x, v: x.scatter_reduce(0, col, v, "prod"),
        "prod_no_self": lambda x, v: x.scatter_reduce(0, col, v, "prod", include_self=False),
        "index_reduce_prod": lambda x, v: x.index_reduce(0, _IDX, v, "prod"),
        "zero_dim": lambda x, v: x[0, 0].scatter_add(0, torch.tensor(0), v[1, 1]),
    }
    cmp = compare_with_eager(fns[name], [x, v], backward=False)
    _no_eager(cmp)
    assert cmp.outputs.dtype == torch.bool and cmp.num_kernels >= 1


def test_triangle_indices_are_constants_copied_by_a_kernel():
    """tril_indices / triu_indices (no lowering rule before): computed at compile time,
    read by the consumer's kernel; a returned one is a new tensor each call."""
    x = torch.randn(4, 6, 5)

    def fn(x):
        li = torch.tril_indices(6, 5, -1)
        return li, torch.triu_indices(6, 5, 1, dtype=torch.int32), x[:, li[0], li[1]] * 2
    with count_launches() as launches:
        cmp = compare_with_eager(fn, [x], backward=False)
    _no_eager(cmp)
    assert launches["n"] == cmp.num_kernels <= 3
    backend = StitchBackend()
    f = torch.compile(lambda: torch.triu_indices(4, 4), backend=backend)
    first = f()
    first.fill_(7)   # the caller owns the result: the next call is not changed by it
    assert torch.equal(f(), torch.triu_indices(4, 4))
    assert [r.plan.num_kernels for r in backend.records] == [1]
