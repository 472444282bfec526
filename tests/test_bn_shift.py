"""Batch-norm training statistics in one pass over x (knob `bn_shift_sample`): the sums
of deviations d = x - s and d² share one kernel, where s, the shift that keeps the
variance's difference exact enough, is the per-channel mean of the batch's leading
ceil(N / k) samples (`capture/decomp.py::_shift_sample`) instead of a full pass of its
own; x is read twice (statistics, output) instead of three times.  Also: the sample is a
slice of a channels-last tensor, whose column reduction is found through the view's
memory layout (`plan/grouping.py::memory_stride`), and the batch-norm counters
(`num_batches_tracked + 1`) of a training step are one kernel (`_merge_input_leaves`).
Interpreter tier (against eager and float64, adversarial batches, outputs poisoned) and
plan tier (full-size H200 plans of ResNet-50's stem, no kernel run)."""
import sys

import pytest
import torch
import torch.nn.functional as F

from stitchml import config
from stitchml.capture.decomp import batch_norm_functional
from stitchml.ir import nodes as ir
from stitchml.plan.data import EagerStep
from stitchml.plan.grouping import LEAF_MAX_ELEMS
from stitchml.testing import compare_against_float64, compare_with_eager

sys.path.insert(0, "tests")
from planning import plan_of  # noqa: E402


def bn_stats(x, w, b, rm, rv):
    """The normalised output and the running statistics it updated (their update holds
    the batch's mean and unbiased variance: the statistics are outputs to judge)."""
    y = F.batch_norm(x, rm, rv, w, b, training=True, momentum=0.5, eps=1e-5)
    return y, rm * 1, rv * 1


def _inputs(x, dtype=torch.float32):
    c = x.shape[1]
    x = x.to(dtype).requires_grad_()
    w = (torch.randn(c) * 0.1 + 1).to(dtype).requires_grad_()
    b = torch.randn(c).to(dtype).requires_grad_()
    return [x, w, b, torch.randn(c).to(dtype), (torch.rand(c) + 0.5).to(dtype)]


def _batches():
    torch.manual_seed(0)
    cl = torch.channels_last
    plain = torch.randn(40, 6, 5, 3) * 2 + 0.5                  # N = 40: a sample of 3
    offset = torch.randn(9, 6, 4, 4) + 1e3                       # a large offset: var/mean² = 1e-6
    unlike = torch.randn(20, 6, 3, 5)                            # the first sample (the shift) far off
    unlike[0] += 50.0
    few = torch.randn(20, 6, 1, 1) * 0.01 + 3                    # BatchNorm1d-like: 1 value a sample
    one = torch.randn(1, 6, 8, 8)                                # N = 1: the whole batch is the sample
    return {"plain_cl": plain.to(memory_format=cl), "offset": offset, "unlike_first_cl": unlike.to(memory_format=cl),
            "few_values": few, "batch_of_one": one}


@pytest.mark.parametrize("name", list(_batches()))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_batch_norm_statistics_against_float64(name, dtype):
    """Output, running mean and variance, and every gradient within the verdict's factor
    of eager's own error against float64, on batches chosen to hurt a shifted sum: a
    large common offset, a first sample 50 std away from the rest (the worst case the
    bound allows), one value a sample, a batch of one."""
    c, verdict = compare_against_float64(bn_stats, _inputs(_batches()[name], dtype))
    verdict.assert_ok(f"batch norm ({name})")
    (fwd,) = [r for r in c.backend.records if r.kind == "forward"]
    assert fwd.plan.kernels


def test_fp32_statistics_match_eager():
    """fp32 against eager itself (its own tolerance), poisoned outputs, channels last."""
    compare_with_eager(bn_stats, _inputs(_batches()["plain_cl"]))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_stem_twin_of_the_gpu_test(dtype):
    """The CPU twin of tests/test_gpu.py::test_resnet_stem_norm_and_pool_on_gpu at a small
    size: batch norm with running statistics, ReLU, 3x3/2 max-pool, channels last; judged
    against float64, every step of both graphs a kernel (nothing eager)."""
    def fn(x, w, b, rm, rv):
        y = F.batch_norm(x, rm, rv, w, b, training=True, momentum=0.1, eps=1e-5)
        return F.max_pool2d(F.relu(y), 3, 2, 1), rm * 1, rv * 1

    torch.manual_seed(1)
    x = (torch.randn(20, 8, 11, 11) * 2 + 0.5).to(memory_format=torch.channels_last)
    inputs = [x.to(dtype).requires_grad_(), (torch.rand(8) + 0.5).to(dtype).requires_grad_(),
              torch.randn(8).to(dtype).requires_grad_(), torch.zeros(8).to(dtype), torch.ones(8).to(dtype)]
    c, verdict = compare_against_float64(fn, inputs)
    verdict.assert_ok(f"stem {dtype}")
    assert {r.kind for r in c.backend.records} == {"forward", "backward"}
    for rec in c.backend.records:
        assert rec.plan is not None and not [s for s in rec.plan.steps if isinstance(s, EagerStep)], rec.kind


def _stem(k: int | None = None, **knobs):
    """The plan of a ResNet-50 stem batch norm → ReLU forward (b32, bf16, channels last,
    H200), with `bn_shift_sample` k (default: the knob's) and other knobs."""
    x = torch.empty(32, 64, 112, 112, dtype=torch.bfloat16).to(memory_format=torch.channels_last)
    w = torch.empty(64, dtype=torch.bfloat16)

    def fn(x, w, b, rm, rv):
        # the decomposition a training step's functional batch norm takes (AOTAutograd's
        # `_native_batch_norm_legit_functional`; make_fx alone would trace torch's)
        return F.relu(batch_norm_functional(x, w, b, rm, rv, True, 0.1, 1e-5)[0])

    if k is not None:
        knobs["bn_shift_sample"] = k
    with config.override(device="H200", **knobs):
        return x, plan_of(fn, x, w, w, w.float(), w.float())


def _full_size_readers(x, plan):
    """Kernels that read the full-size input x (graph input 0)."""
    g = plan.graph
    x_id = g.inputs[0]
    return [k for k in plan.kernels if x_id in k.inputs]


CHUNKS = {"bn_chunk_stats": True, "chained_columns": True}   # (both off by default: NOTES, thirty-ninth session)


def test_the_stem_in_three_kernels_from_chunk_statistics():
    """Knobs `bn_chunk_stats` and `chained_columns` on: three kernels — the chunks' statistics (x
    read once, in tiles a sector tall across its channels), their merge (reads no x: the
    [K, C] statistics, transposed, in tall tiles), the normalising kernel with the ReLU —
    no column partials, no combine; fewer launches and less predicted time than the
    shifted sums of a sample (five kernels)."""
    x, plan = _stem(**CHUNKS)
    _, shifted = _stem()
    assert len(plan.kernels) == 3 and not any(k.partials or k.combine_of for k in plan.kernels), \
        [k.mapping.describe() for k in plan.kernels]
    readers = _full_size_readers(x, plan)
    assert len(readers) == 2
    chunks, merge = plan.kernels[0], plan.kernels[1]
    assert chunks in readers and merge not in readers
    assert chunks.mapping.block_r * 2 >= 32 and not chunks.sector_waste, chunks.mapping.describe()
    assert merge.transposed and merge.mapping.block_r >= 8 and not merge.sector_waste, merge.mapping.describe()
    assert len(shifted.kernels) == 5
    assert plan.predicted_s < shifted.predicted_s


def test_the_stem_reads_x_twice_and_a_sixteenth_more():
    """The default (knob `bn_chunk_stats` off): two kernels read all of x (statistics partials, the
    normalising kernel), one reads its first 2 of 32 samples, as column partials over
    contiguous channel rows (a slice of a channels-last tensor: no 32-byte sectors
    wasted); the forward moves at least 0.85 x's bytes less than with the shift over the
    whole batch (three full reads)."""
    x, plan = _stem()
    _, whole = _stem(1)
    xb = x.numel() * x.element_size()
    readers = _full_size_readers(x, plan)
    assert len(readers) == 3 and len(_full_size_readers(x, whole)) == 3
    sample = [k for k in readers if k.domain.shape[0] == 2]
    assert len(sample) == 1, [k.domain.shape for k in readers]
    (s,) = sample
    assert s.partials and s.domain.col_dims == (1,) and not s.sector_waste, s.mapping.describe()
    assert s.bytes_read <= xb / 16 * 1.05
    assert sum(1 for k in readers if k.domain.shape[0] == 32) == 2
    total = sum(k.bytes_read + k.bytes_written for k in plan.kernels)
    before = sum(k.bytes_read + k.bytes_written for k in whole.kernels)
    assert before - total >= 0.85 * xb, (before / 1e6, total / 1e6)
    assert plan.predicted_s < whole.predicted_s


def test_the_sample_is_the_leading_samples_and_symbolic_batches_keep_the_whole():
    from stitchml.capture.decomp import _shift_sample
    x = torch.randn(33, 3, 2, 2)
    with config.override(bn_shift_sample=16):
        assert _shift_sample(x).shape[0] == 3 and _shift_sample(x[:1]).shape[0] == 1
        assert _shift_sample(x[:16]).shape[0] == 1 and _shift_sample(x[:17]).shape[0] == 2
    with config.override(bn_shift_sample=1):
        assert _shift_sample(x) is x


def test_chunking_divides_the_rows_into_at_most_1024_chunks():
    from stitchml.capture.decomp import CHUNKS_MAX, _chunk_stats, _chunking
    assert _chunking(401408) == 392 and _chunking(100352) == 98 and _chunking(600) == 20
    assert _chunking(12) == 12 and _chunking(1568) == 16
    for rows in (401408, 100352, 25088, 6272, 1568, 600, 300):
        ch = _chunking(rows)
        assert rows % ch == 0 and rows // ch <= CHUNKS_MAX and ch >= 16
    assert _chunking(2053) is None                                     # a prime above CHUNK_MAX
    cl = torch.channels_last
    with config.override(bn_chunk_stats=True):
        assert _chunk_stats(torch.randn(4, 3, 5, 5).to(memory_format=cl)) is not None
        assert _chunk_stats(torch.randn(4, 3, 5, 5)) is None           # channels not innermost
        assert _chunk_stats(torch.randn(1, 3, 1, 2053).to(memory_format=cl)) is None
        assert _chunk_stats(torch.randn(37, 3)) is None                # one chunk of 37 rows
    with config.override(bn_chunk_stats=False):
        assert _chunk_stats(torch.randn(4, 3, 5, 5).to(memory_format=cl)) is None


def _chunk_batches():
    torch.manual_seed(2)
    cl = torch.channels_last
    offset = torch.randn(9, 6, 4, 4) + 1e3                       # var/mean² = 1e-6
    far = torch.randn(16, 6, 4, 4)
    far[5] += 80.0                                               # one sample (chunks in the middle) far off
    spread = torch.randn(8, 6, 6, 6) * torch.logspace(-3, 3, 6).view(1, 6, 1, 1)
    flat = torch.randn(40, 6) * 3 + 20                           # [N, C]: BatchNorm1d, two chunks of 20
    return {"offset_cl": offset.to(memory_format=cl), "one_sample_far_cl": far.to(memory_format=cl),
            "channel_scales_cl": spread.to(memory_format=cl), "batchnorm1d": flat}


@pytest.mark.parametrize("name", list(_chunk_batches()))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_chunk_statistics_against_float64(name, dtype):
    """The chunk form (channels innermost, static sizes) on batches chosen against a merge
    of chunk statistics: a large common offset, one sample 80 std off in the middle
    chunks, channels whose scales span 6 decades, a [40, C] batch; output, running
    statistics and every gradient within the verdict's factor of eager's own error."""
    x = _chunk_batches()[name]
    from stitchml.capture.decomp import _chunk_stats
    with config.override(**CHUNKS):
        assert _chunk_stats(x) is not None
        c, verdict = compare_against_float64(bn_stats, _inputs(x, dtype))
    verdict.assert_ok(f"chunk statistics ({name})")
    (fwd,) = [r for r in c.backend.records if r.kind == "forward"]
    assert not any(k.partials for k in fwd.plan.kernels), [k.mapping.describe() for k in fwd.plan.kernels]


def test_counters_of_a_training_step_are_one_kernel():
    """Three batch norms' `num_batches_tracked + 1` (one int64 each, graph inputs only)
    become one kernel of three outputs, not three launches; results as eager's."""
    net = torch.nn.Sequential(torch.nn.BatchNorm2d(4), torch.nn.ReLU(), torch.nn.BatchNorm2d(4),
                              torch.nn.BatchNorm2d(4))
    net.train()
    x = torch.randn(3, 4, 5, 5)
    c = compare_with_eager(net, [x], backward=False)
    counters = [b for n, b in net.named_buffers() if n.endswith("num_batches_tracked")]
    # (the module's buffers are shared: one eager call, one compiled)
    assert len(counters) == 3 and all(int(t) == 2 for t in counters), counters
    (fwd,) = [r for r in c.backend.records if r.kind == "forward"]
    g = fwd.plan.graph
    scalar = [k for k in fwd.plan.kernels if all(g[m].numel <= 1 for m in k.members)]
    assert len(scalar) == 1, [k.mapping.describe() for k in scalar]
    assert sum(1 for m in scalar[0].members if g[m].kind == ir.POINTWISE and g[m].dtype == torch.int64) == 3


def test_input_leaves_stay_apart_by_domain_and_size():
    """Only tiny kernels reading graph inputs alone merge, one kernel per domain: a
    computed operand, a larger domain or another shape keeps its own kernel."""
    def fn(a, b, c, d, e, big):
        t = big.sin()
        return a + 1, b * 2, c - 1, d + t.sum(), e * 3, big + 1

    def inputs():   # (distinct tensors: make_fx would make one input of a tensor passed twice)
        return [torch.empty(()), torch.empty(()), torch.empty(7), torch.empty(()),
                torch.empty(LEAF_MAX_ELEMS + 1), torch.empty(LEAF_MAX_ELEMS + 1)]

    plan = plan_of(fn, *inputs())
    g = plan.graph
    by_ops = sorted(sorted(g[m].op for m in k.members if g[m].kind == ir.POINTWISE) for k in plan.kernels)
    # a + 1 and b * 2 (scalars) share a kernel; c - 1 ([7]) its own; d + t.sum() reads a reduction;
    # e * 3 and big + 1 are above the size
    scalar_leaves = [k for k in plan.kernels if {g[m].op for m in k.members} == {"add", "mul"}
                     and all(g[m].numel == 1 for m in k.members)]
    assert len(scalar_leaves) == 1, by_ops
    assert len(plan.kernels) == 5, by_ops   # sin+sum(+d's add), the scalar pair, c - 1, e * 3, big + 1
    with config.override(sibling_fusion=False):
        apart = plan_of(fn, *inputs())
    ga = apart.graph
    assert not [k for k in apart.kernels if {ga[m].op for m in k.members} == {"add", "mul"}]


def test_the_chunk_kernel_reads_x_once_in_few_warps():
    """ResNet-50's 56x56x256 batch norm (b32, bf16, channels last, H200) from chunk
    statistics: the chunk kernel loads x once — the merge's shift, the first chunk's mean,
    is read by the merge, not summed again by every program of the chunk kernel
    (`Grouper._rereads_reduction`) — at one multiply-add an address (the chunk view of
    the image rows flattens back, `index._simplified_partner`), and its whole-row tiles,
    read transposed, take 2 warps instead of 16 (knob `transposed_row_warps`: sm_90 code
    46.5 M against 10.4 M warp-instructions)."""
    from stitchml.codegen.triton_kernel import generate
    x = torch.empty(32, 256, 56, 56, dtype=torch.bfloat16).to(memory_format=torch.channels_last)
    w = torch.empty(256, dtype=torch.bfloat16)

    def fn(x, w, b, rm, rv):
        return batch_norm_functional(x, w, b, rm, rv, True, 0.1, 1e-5)[0]

    def chunk_kernel(**knobs):
        with config.override(device="H200", **CHUNKS, **knobs):
            plan = plan_of(fn, x, w, w, w.float(), w.float())
        (k,) = [k for k in _full_size_readers(x, plan) if not k.domain.is_flat]
        return plan, k

    plan, k = chunk_kernel()
    src = generate(plan.graph, k).source
    (load,) = [line for line in src.splitlines() if "tl.load(" in line]
    assert "//" not in load and "%" not in load, load
    assert k.mapping.num_warps == 2, k.mapping.describe()
    _, wide = chunk_kernel(transposed_row_warps=False)
    assert wide.mapping.num_warps == 16
