"""Dependent reductions over the same few leading rows (knob `chained_columns`,
`plan/grouping.py::_chained_columns`): a softmax or a two-pass variance over a small
leading dim, the merge of batch-norm chunk statistics.  As column partials each reduction
is a kernel and a combine, one after the other; as row reductions one program holds its
columns' rows whole and computes both, reading them transposed in tall tiles
(`mapping.transposed_rows`, with `few=True` where the columns give under a program an SM
and the model prices that below one row a program).  Interpreter tier (against eager and
float64, outputs poisoned) and plan tier (full-size H200 plans, no kernel run).  The knob is
off by default (bench/NOTES.md, thirty-ninth session): every test here turns it on."""
import sys

import pytest
import torch

from stitchml import config
from stitchml.testing import compare_against_float64, compare_with_eager

sys.path.insert(0, "tests")
from planning import plan_on  # noqa: E402


@pytest.fixture(autouse=True)
def _chained():
    with config.override(chained_columns=True):
        yield


def softmax0(x):
    return torch.softmax(x, 0)


def var0(x, w):
    return torch.var(x * w, 0, correction=1) + x.mean(0)


def _kernels(c):
    (rec,) = c.backend.records
    return rec.plan.kernels


@pytest.mark.parametrize("fn,shape", [(softmax0, (50, 300)), (var0, (64, 70))], ids=["softmax", "var"])
def test_one_kernel_and_eager_results(fn, shape):
    inputs = [torch.randn(*shape) * 3] + ([torch.randn(shape[1])] if fn is var0 else [])
    c = compare_with_eager(fn, inputs, backward=False)
    ks = _kernels(c)
    assert len(ks) == 1 and not ks[0].partials, [k.mapping.describe() for k in ks]
    with config.override(chained_columns=False):
        off = compare_with_eager(fn, inputs, backward=False)
    assert len(_kernels(off)) >= 3 and any(k.partials for k in _kernels(off))


@pytest.mark.parametrize("fn,shape", [(softmax0, (33, 129)), (var0, (100, 40))], ids=["softmax", "var"])
def test_bf16_against_float64(fn, shape):
    inputs = [(torch.randn(*shape) * 3 + 1).bfloat16().requires_grad_()]
    if fn is var0:
        inputs.append(torch.randn(shape[1]).bfloat16().requires_grad_())
    c, verdict = compare_against_float64(fn, inputs)
    verdict.assert_ok(fn.__name__)
    fwd = [r for r in c.backend.records if r.kind == "forward"][0]
    assert not any(k.partials for k in fwd.plan.kernels)


def test_many_rows_stay_column_partials():
    """Above 1024 rows a program would not hold them: column partials as before."""
    plan = plan_on("H200", softmax0, (4096, 512))
    assert any(k.partials for k in plan.kernels)


def test_few_columns_read_in_tall_tiles_at_full_size():
    """[1024, 256] float32 (a batch-norm merge's size): 256 columns give 32 programs of 8
    rows, under one an SM; still taken, since one row a program would read every
    element in its own 32-byte sector (8x the bytes)."""
    plan = plan_on("H200", softmax0, (1024, 256))
    (k,) = plan.kernels
    assert not k.partials and k.transposed and k.mapping.block_r >= 8 and not k.sector_waste, \
        k.mapping.describe()
    assert k.mapping.grid < 132
