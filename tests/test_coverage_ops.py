"""Issue 18: ops that ran eagerly now stitch (decompositions in capture/decomp.py and
capture/decomp_window.py, rules in lower/rules_index.py, rules_scatter.py,
rules_window.py, rules_reduce.py).  Each case runs forward and backward against eager
on fresh random inputs with odd sizes and a non-contiguous input, in float32 and
bfloat16, and asserts that no op of either graph ran eagerly and that kernels ran."""
import warnings

import pytest
import torch
import torch.nn.functional as F

from stitchml import StitchBackend
from stitchml.testing import compare_with_eager
from launches import count_launches
from seeds import stable_seed

aten = torch.ops.aten


def _nc(*shape, dtype=torch.float32):
    """A non-contiguous tensor (a transposed buffer) with fresh random values."""
    t = torch.randn(*shape[:-2], shape[-1], shape[-2], dtype=dtype).transpose(-1, -2)
    assert not t.is_contiguous()
    return t.requires_grad_()


def _leaf(*shape, dtype=torch.float32):
    return torch.randn(*shape, dtype=dtype).requires_grad_()


def _idx(hi, *shape, neg=False):
    t = torch.randint(0, hi, shape)
    return t - hi * (torch.rand(shape) < 0.5) if neg else t


CASES = {
    "group_norm": (lambda x, w, b: F.group_norm(x, 3, w, b), lambda d: [_nc(2, 6, 5, 7, dtype=d), _leaf(6, dtype=d),
                                                                        _leaf(6, dtype=d)]),
    "avg_pool2d": (lambda x: F.avg_pool2d(x, 3, 2, 1), lambda d: [_nc(2, 3, 9, 7, dtype=d)]),
    "avg_pool2d_ceil_nopad": (lambda x: F.avg_pool2d(x, 2, 2, 1, ceil_mode=True, count_include_pad=False),
                              lambda d: [_nc(2, 3, 7, 5, dtype=d)]),
    "max_pool2d": (lambda x: F.max_pool2d(x, 3, 2, 1), lambda d: [_nc(2, 3, 9, 7, dtype=d)]),
    "max_pool2d_dilated_ceil": (lambda x: F.max_pool2d(x, 2, 2, 0, dilation=2, ceil_mode=True),
                                lambda d: [_nc(2, 3, 9, 8, dtype=d)]),
    "adaptive_avg_pool2d": (lambda x: F.adaptive_avg_pool2d(x, (3, 2)), lambda d: [_nc(2, 3, 9, 6, dtype=d)]),
    "avg_pool3d": (lambda x: F.avg_pool3d(x, 3, 2, 1), lambda d: [_nc(2, 3, 5, 7, 6, dtype=d)]),
    "avg_pool3d_ceil_nopad": (lambda x: F.avg_pool3d(x, (2, 3, 2), (2, 2, 1), (1, 1, 0), ceil_mode=True,
                                                     count_include_pad=False), lambda d: [_nc(2, 3, 5, 7, 6, dtype=d)]),
    "max_pool3d": (lambda x: F.max_pool3d(x, 3, 2, 1), lambda d: [_nc(2, 3, 5, 7, 6, dtype=d)]),
    "max_pool3d_dilated_ceil": (lambda x: F.max_pool3d(x, 2, 2, 0, dilation=(1, 2, 1), ceil_mode=True),
                                lambda d: [_nc(3, 5, 9, 8, dtype=d)]),
    "adaptive_avg_pool3d": (lambda x: F.adaptive_avg_pool3d(x, (1, 3, 2)), lambda d: [_nc(2, 3, 4, 6, 6, dtype=d)]),
    "avg_pool1d": (lambda x: aten.avg_pool1d(x, [3], [2], [1]), lambda d: [_nc(2, 3, 9, dtype=d)]),
    "adaptive_avg_pool1d": (lambda x: aten.adaptive_avg_pool1d(x, [3]), lambda d: [_nc(2, 3, 9, dtype=d)]),
    # issue 19's op_db gaps, through torch's decompositions (capture/decomp.py)
    "logaddexp": (lambda x, y: torch.logaddexp(x, y * 3), lambda d: [_nc(3, 7, dtype=d), _leaf(7, dtype=d)]),
    "nansum": (lambda x: torch.nansum(torch.where(x > 1, float("nan"), x), 1), lambda d: [_nc(4, 7, dtype=d)]),
    "take": (lambda x: torch.take(x * 2, _IDX["sc"]), lambda d: [_nc(3, 5, dtype=d)]),
    "put": (lambda x, s: torch.put(x, _IDX["uniq"], s * 2), lambda d: [_nc(3, 5, dtype=d), _leaf(3, dtype=d)]),
    "max_unpool2d": (lambda x: F.max_unpool2d(*F.max_pool2d(x, 2, 2, return_indices=True), 2, 2),
                     lambda d: [_nc(2, 3, 6, 4, dtype=d)]),
    "glu": (lambda x: F.glu(x * 2, 1), lambda d: [_nc(3, 8, dtype=d)]),
    "prelu": (lambda x, w: F.prelu(x, w), lambda d: [_nc(2, 3, 5, dtype=d), _leaf(3, dtype=d)]),
    "binary_cross_entropy": (lambda x, t: F.binary_cross_entropy(torch.sigmoid(x), torch.sigmoid(t)),
                             lambda d: [_nc(4, 7, dtype=d), _leaf(4, 7, dtype=d)]),
    "logit_rot90": (lambda x: torch.rot90(torch.logit(torch.sigmoid(x), 1e-3), 1, (0, 1)),
                    lambda d: [_nc(4, 7, dtype=d)]),
    "weight_norm": (lambda v, g: torch._weight_norm(v, g, 0), lambda d: [_nc(5, 7, dtype=d), _leaf(5, 1, dtype=d)]),
    "slice_scatter": (lambda x, y: torch.slice_scatter(x, y * 2, 1, 1, 6, 2), lambda d: [_nc(4, 9, dtype=d),
                                                                                     _leaf(4, 3, dtype=d)]),
    "select_scatter": (lambda x, y: torch.select_scatter(x, y * 2, 1, 3), lambda d: [_nc(4, 9, dtype=d),
                                                                                 _leaf(4, dtype=d)]),
    "flip": (lambda x: torch.flip(x, (0, 2)) * 2, lambda d: [_nc(3, 4, 5, dtype=d)]),
    "reflect_pad": (lambda x: F.pad(x, (1, 2, 2, 1), mode="reflect"), lambda d: [_nc(2, 3, 5, 6, dtype=d)]),
    "replicate_pad": (lambda x: F.pad(x, (1, 2, 2, 1), mode="replicate"), lambda d: [_nc(2, 3, 5, 6, dtype=d)]),
    "nearest": (lambda x: F.interpolate(x, scale_factor=2, mode="nearest"), lambda d: [_nc(2, 3, 5, 6, dtype=d)]),
    "unfold_im2col": (lambda x: F.unfold(x, 3, padding=1), lambda d: [_nc(2, 3, 5, 6, dtype=d)]),
    # (contiguous input: as_strided of a transposed input still runs eagerly, rules_views.py)
    "tensor_unfold": (lambda x: x.unfold(1, 3, 2) * 2, lambda d: [_leaf(3, 9, dtype=d)]),
    "cumsum": (lambda x: torch.cumsum(x * 2, 1) + 1, lambda d: [_nc(3, 7, dtype=d)]),
    "logcumsumexp": (lambda x: torch.logcumsumexp(x, 1), lambda d: [_nc(3, 7, dtype=d)]),
    "index_two_tensors": (lambda x: x[_IDX["a"], :, _IDX["b"]] * 2, lambda d: [_nc(4, 3, 5, dtype=d)]),
    "index_adjacent": (lambda x: x[:, _IDX["a"], _IDX["c"]] * 2, lambda d: [_nc(2, 4, 5, dtype=d)]),
    "index_put_dups": (lambda x, v: x.index_put((_IDX["dup"],), v * 2, accumulate=True),
                       lambda d: [_nc(4, 5, dtype=d), _leaf(6, 5, dtype=d)]),
    "index_add": (lambda x, s: x.index_add(1, _IDX["dup"], s), lambda d: [_nc(3, 4, dtype=d), _leaf(3, 6, dtype=d)]),
    "scatter_add": (lambda x, s: x.scatter_add(1, _IDX["sc"], s), lambda d: [_nc(3, 4, dtype=d), _leaf(3, 4, dtype=d)]),
    "scatter_src": (lambda x, s: x.scatter(1, _IDX["perm"], s * 2), lambda d: [_nc(3, 5, dtype=d),
                                                                              _leaf(3, 4, dtype=d)]),
    "index_put_write": (lambda x, v: x.index_put((_IDX["b"], _IDX["c"]), v * 2), lambda d: [_nc(6, 5, 3, dtype=d),
                                                                                          _leaf(2, 3, dtype=d)]),
    "index_copy": (lambda x, s: x.index_copy(0, _IDX["uniq"], s), lambda d: [_nc(5, 4, dtype=d), _leaf(3, 4, dtype=d)]),
    "safe_softmax": (lambda x: aten._safe_softmax(x, -1), lambda d: [_nc(3, 7, dtype=d)]),
    "cumprod": (lambda x: torch.cumprod(x * 0.5 + 1, 0), lambda d: [_nc(6, 5, dtype=d)]),
    # data-dependent index ops through the scan form (capture/decomp_index.py); masks,
    # indices and offsets are drawn fresh for each run (inputs, not constants)
    "masked_scatter": (lambda x, s, m: x.masked_scatter(m, s * 2) + 1,
                       lambda d: [_nc(4, 7, dtype=d), _leaf(30, dtype=d), torch.rand(4, 7) < 0.6]),
    "masked_scatter_broadcast": (lambda x, s, m: x.masked_scatter(m, s),
                                 lambda d: [_nc(4, 6, dtype=d), _leaf(5, 7, dtype=d), torch.rand(4, 1) < 0.5]),
    "embedding_bag_sum": (lambda w, i, o: F.embedding_bag(i, w * 2, o, mode="sum"),
                          lambda d: [_leaf(11, 5, dtype=d), _idx(11, 13), _offsets(13, 4)]),
    "embedding_bag_mean_padding": (lambda w, i, o: F.embedding_bag(i, w, o, mode="mean", padding_idx=3),
                                   lambda d: [_leaf(11, 5, dtype=d), _idx(11, 13), _offsets(13, 5)]),
    "embedding_bag_weighted_last_offset": (
        lambda w, i, o, p: F.embedding_bag(i, w, o, mode="sum", per_sample_weights=p * 2, include_last_offset=True),
        lambda d: [_leaf(11, 5, dtype=d), _idx(11, 13), torch.cat([_offsets(13, 3), torch.tensor([13])]),
                   _leaf(13, dtype=d)]),
    "embedding_bag_2d_mean": (lambda w, i: F.embedding_bag(i, w, mode="mean"),
                              lambda d: [_leaf(11, 5, dtype=d), _idx(11, 3, 4)]),
    # max bags: scatter amax of the rows, scatter amin of the winning positions
    "embedding_bag_max": (lambda w, i, o: F.embedding_bag(i, w * 2, o, mode="max"),
                          lambda d: [_leaf(11, 5, dtype=d), _idx(11, 13), _offsets(13, 4)]),
    "embedding_bag_max_padding_2d": (lambda w, i: F.embedding_bag(i, w, mode="max", padding_idx=3),
                                     lambda d: [_leaf(11, 5, dtype=d), _idx(11, 3, 4)]),
    # pairwise distances (capture/decomp_distance.py): eager's direct path per p, its
    # matrix-product path for p = 2 beyond 25 rows, and pdist's upper triangle
    "cdist_p2": (lambda x, y: torch.cdist(x * 2, y), lambda d: [_nc(2, 5, 4, dtype=d), _leaf(2, 6, 4, dtype=d)]),
    "cdist_p1_5": (lambda x, y: torch.cdist(x, y, p=1.5), lambda d: [_nc(5, 4, dtype=d), _leaf(7, 4, dtype=d)]),
    "cdist_inf": (lambda x, y: torch.cdist(x, y, p=float("inf")), lambda d: [_nc(5, 4, dtype=d), _leaf(7, 4, dtype=d)]),
    "cdist_mm": (lambda x, y: torch.cdist(x, y), lambda d: [_nc(27, 4, dtype=d), _leaf(6, 4, dtype=d)]),
    "pdist_p3": (lambda x: torch.pdist(x, 3) * 2, lambda d: [_nc(7, 3, dtype=d)]),
    # 'mean' reductions into scattered positions: sums and counts by atomics, then divided
    "scatter_reduce_mean": (lambda x, s: x.scatter_reduce(0, _IDX["sc"][:, :4], s * 2, "mean"),
                            lambda d: [_nc(4, 5, dtype=d), _leaf(3, 4, dtype=d)]),
    "scatter_reduce_mean_exclude_self": (
        lambda x, s: x.scatter_reduce(1, _IDX["sc"], s, "mean", include_self=False),
        lambda d: [_nc(3, 5, dtype=d), _leaf(3, 4, dtype=d)]),
    # amax / amin: order-preserving integer keys and an int64 atomic max
    "scatter_reduce_amax": (lambda x, s: x.scatter_reduce(0, _IDX["sc"][:, :4], s * 2, "amax"),
                            lambda d: [_nc(4, 5, dtype=d), _leaf(3, 4, dtype=d)]),
    "index_reduce_amin_exclude_self": (lambda x, s: x.index_reduce(1, _IDX["dup"], s, "amin", include_self=False),
                                       lambda d: [_nc(3, 5, dtype=d), _leaf(3, 6, dtype=d)]),
    "index_reduce_mean": (lambda x, s: x.index_reduce(1, _IDX["dup"], s, "mean", include_self=False),
                          lambda d: [_nc(3, 5, dtype=d), _leaf(3, 6, dtype=d)]),
    # 'prod': a compare-and-swap multiply into a buffer of ones (duplicates multiply up)
    "scatter_reduce_prod": (lambda x, s: x.scatter_reduce(0, _IDX["sc"][:, :4], s * 0.5 + 1, "prod"),
                            lambda d: [_nc(4, 5, dtype=d), _leaf(3, 4, dtype=d)]),
    "index_reduce_prod_exclude_self": (lambda x, s: x.index_reduce(1, _IDX["dup"], s + 1.5, "prod",
                                                                   include_self=False),
                                       lambda d: [_nc(3, 5, dtype=d), _leaf(3, 6, dtype=d)]),
    # adaptive max pooling (torch's forward for global and evenly tiled windows, our backward)
    "adaptive_max_pool2d": (lambda x: F.adaptive_max_pool2d(x * 2, (3, 4)), lambda d: [_nc(2, 3, 6, 8, dtype=d)]),
    "adaptive_max_pool2d_global": (lambda x: F.adaptive_max_pool2d(x, 1) + 1, lambda d: [_nc(2, 3, 5, 7, dtype=d)]),
    "adaptive_max_pool3d": (lambda x: F.adaptive_max_pool3d(x, (2, 3, 2)), lambda d: [_nc(2, 3, 4, 6, 4, dtype=d)]),
    "cdist_broadcast_batch": (lambda x, y: torch.cdist(x, y, p=1.0), lambda d: [_nc(2, 1, 5, 4, dtype=d),
                                                                              _leaf(3, 6, 4, dtype=d)]),
    # grid_sample (torch's forward, our backward: capture/decomp_sample.py); grid points
    # reach outside [-1, 1] so every padding mode's clip and reflection are exercised
    "grid_sample_bilinear_zeros": (lambda x, g: F.grid_sample(x, g * 1.3, align_corners=False),
                                   lambda d: [_nc(2, 3, 5, 7, dtype=d), _grid(2, 4, 6, dtype=d)]),
    "grid_sample_bilinear_reflection_aligned": (
        lambda x, g: F.grid_sample(x, g * 1.3, padding_mode="reflection", align_corners=True),
        lambda d: [_nc(2, 3, 5, 7, dtype=d), _grid(2, 4, 6, dtype=d)]),
    "grid_sample_bilinear_border": (lambda x, g: F.grid_sample(x, g * 1.3, padding_mode="border"),
                                    lambda d: [_nc(1, 2, 6, 4, dtype=d), _grid(1, 5, 3, dtype=d)]),
    "grid_sample_nearest_reflection": (lambda x, g: F.grid_sample(x, g, mode="nearest", padding_mode="reflection"),
                                       lambda d: [_nc(2, 3, 5, 7, dtype=d), _grid(2, 4, 6, dtype=d)]),
    # volumetric grid_sample (capture/decomp_sample.py: eight corners, forward and backward)
    "grid_sample_3d_trilinear_border": (
        lambda x, g: F.grid_sample(x, g * 1.3, padding_mode="border", align_corners=True),
        lambda d: [_nc(2, 3, 4, 5, 6, dtype=d), _grid3(2, 3, 4, 5, dtype=d)]),
    "grid_sample_3d_trilinear_zeros": (lambda x, g: F.grid_sample(x * 2, g * 1.3),
                                       lambda d: [_nc(1, 2, 3, 5, 4, dtype=d), _grid3(1, 2, 3, 4, dtype=d)]),
    "grid_sample_3d_nearest_reflection": (
        lambda x, g: F.grid_sample(x, g * 1.3, mode="nearest", padding_mode="reflection"),
        lambda d: [_nc(2, 3, 4, 5, 6, dtype=d), _grid3(2, 3, 4, 5, dtype=d)]),
    # adaptive pooling over windows that do not tile evenly (capture/decomp_window.py:
    # a gather of clamped window indices per axis; the backward the transposed gather)
    "adaptive_avg_pool2d_uneven": (lambda x: F.adaptive_avg_pool2d(x, (3, 4)), lambda d: [_nc(2, 3, 7, 9, dtype=d)]),
    "adaptive_avg_pool2d_upsampling": (lambda x: F.adaptive_avg_pool2d(x * 2, (5, 7)),
                                       lambda d: [_nc(2, 3, 3, 4, dtype=d)]),
    "adaptive_avg_pool1d_uneven": (lambda x: F.adaptive_avg_pool1d(x, 4), lambda d: [_nc(2, 3, 11, dtype=d)]),
    "adaptive_avg_pool3d_uneven": (lambda x: F.adaptive_avg_pool3d(x, (2, 3, 4)),
                                   lambda d: [_nc(2, 2, 5, 7, 6, dtype=d)]),
    "adaptive_max_pool2d_uneven": (lambda x: F.adaptive_max_pool2d(x * 2, (4, 5), return_indices=True),
                                   lambda d: [_nc(2, 3, 6, 8, dtype=d)]),
    "adaptive_max_pool3d_uneven": (lambda x: F.adaptive_max_pool3d(x, (2, 3, 4), return_indices=True),
                                   lambda d: [_nc(2, 2, 5, 7, 6, dtype=d)]),
    # antialiased bilinear resize (torchvision's Resize(antialias=True)): per axis a
    # weighted window gather; the backward an index_add of each output's weighted gradient
    "interpolate_antialias_down": (lambda x: F.interpolate(x * 2, size=(5, 7), mode="bilinear", antialias=True),
                                   lambda d: [_nc(2, 3, 13, 16, dtype=d)]),
    "interpolate_antialias_mixed_scales": (
        lambda x: F.interpolate(x, scale_factor=(1.7, 0.45), mode="bilinear", antialias=True, align_corners=False),
        lambda d: [_nc(1, 2, 9, 16, dtype=d)]),
    # replication padding's backward as slices and edge sums per axis (no atomics)
    "replicate_pad_1d": (lambda x: F.pad(x, (3, 2), mode="replicate") * 2, lambda d: [_nc(2, 3, 7, dtype=d)]),
    "replicate_pad_negative": (lambda x: F.pad(x * 2, (-1, 2, 1, -2), mode="replicate"),
                               lambda d: [_nc(1, 3, 5, 6, dtype=d)]),
    # every input cropped on one side: all outputs copy the one at the other end
    "replicate_pad_all_cropped": (lambda x: F.pad(x * 2, (-6, 5, 3, -5), mode="replicate"),
                                  lambda d: [_nc(1, 3, 5, 6, dtype=d)]),
    "avg_pool3d_divisor": (lambda x: F.avg_pool3d(x, 3, 2, 1, ceil_mode=True, divisor_override=5),
                           lambda d: [_nc(2, 3, 5, 7, 6, dtype=d)]),
    "replicate_pad_3d": (lambda x: F.pad(x, (1, 2, 0, 3, 2, 1), mode="replicate"),
                         lambda d: [_nc(1, 2, 3, 5, 6, dtype=d)]),
    "reflect_pad_3d": (lambda x: F.pad(x, (1, 2, 0, 1, 2, 1), mode="reflect"), lambda d: [_nc(1, 2, 3, 5, 6, dtype=d)]),
    # losses and backwards through torch's decompositions, addbmm as one matrix product
    "smooth_l1_loss": (lambda x, y: F.smooth_l1_loss(x, y, beta=0.5), lambda d: [_nc(4, 7, dtype=d),
                                                                                 _leaf(4, 7, dtype=d)]),
    "huber_loss": (lambda x, y: F.huber_loss(x * 2, y, delta=0.7, reduction="sum"),
                   lambda d: [_nc(4, 7, dtype=d), _leaf(4, 7, dtype=d)]),
    "logsigmoid": (lambda x: F.logsigmoid(x * 3), lambda d: [_nc(4, 7, dtype=d)]),
    "sgn": (lambda x: torch.sgn(x) * x + x, lambda d: [_nc(4, 7, dtype=d)]),
    "angle": (lambda x: torch.angle(x) + x, lambda d: [_nc(4, 7, dtype=d)]),
    "addbmm": (lambda s, a, b: torch.addbmm(s, a * 2, b, beta=0.5, alpha=1.5),
               lambda d: [_nc(5, 6, dtype=d), _leaf(3, 5, 4, dtype=d), _leaf(3, 4, 6, dtype=d)]),
}


def _grid(n, h, w, dtype=torch.float32):
    """Sampling points in [-1, 1]^2 (times the case's own scale), fresh each run."""
    return (torch.rand(n, h, w, 2) * 2 - 1).to(dtype).requires_grad_()


def _grid3(n, d, h, w, dtype=torch.float32):
    return (torch.rand(n, d, h, w, 3) * 2 - 1).to(dtype).requires_grad_()


def _offsets(n: int, bags: int) -> torch.Tensor:
    """Sorted bag starts in [0, n], the first 0; repeats make empty bags."""
    inner = torch.sort(torch.randint(0, n + 1, (bags - 1,))).values
    return torch.cat([torch.zeros(1, dtype=torch.int64), inner])

# fixed index tensors (captured as constants): duplicates and negative indices included
torch.manual_seed(0)
_IDX = {"a": torch.tensor([[0, -1], [2, 1], [3, 0]]), "b": torch.tensor([1, -5]), "c": torch.tensor([4, -1]),
        "dup": torch.tensor([0, 2, 0, 3, 2, 0]), "sc": torch.tensor([[0, 1, 1, 3], [2, 2, 0, 0], [3, 3, 3, 1]]),
        "perm": torch.tensor([[4, 0, 2, 1], [1, 4, 3, 0], [2, 3, 0, 4]]), "uniq": torch.tensor([3, 0, 4])}


# eager's CPU kernels have no bfloat16 avg_pool3d or antialiased backward: nothing to compare against
NO_BF16_EAGER = {"avg_pool3d", "avg_pool3d_ceil_nopad", "avg_pool3d_divisor", "interpolate_antialias_down",
                 "interpolate_antialias_mixed_scales", "cdist_p2", "cdist_p1_5", "cdist_inf", "cdist_mm", "pdist_p3",
                 "cdist_broadcast_batch",
                 # eager's bfloat16 grid_sample rounds the pixel coordinates to bfloat16 (a
                 # whole pixel off near the border): judged against float64 below instead
                 "grid_sample_bilinear_zeros", "grid_sample_bilinear_reflection_aligned",
                 "grid_sample_bilinear_border", "grid_sample_nearest_reflection",
                 "grid_sample_3d_trilinear_border", "grid_sample_3d_trilinear_zeros",
                 "grid_sample_3d_nearest_reflection"}


@pytest.mark.parametrize("name, dtype", [pytest.param(n, d, id=f"{n}-{i}") for n in sorted(CASES)
                                         for d, i in ((torch.float32, "fp32"), (torch.bfloat16, "bf16"))
                                         if not (n in NO_BF16_EAGER and d == torch.bfloat16)])
def test_op_stitches_and_matches_eager(name, dtype):
    fn, make = CASES[name]
    torch.manual_seed(stable_seed(name))
    inputs = make(dtype)
    tol = {} if dtype == torch.float32 else dict(rtol=2e-2, atol=2e-2, grad_rtol=4e-2, grad_atol=4e-2)
    with count_launches() as launches:
        cmp = compare_with_eager(fn, inputs, **tol)
    # (matrix products stay the library's: cdist's p = 2 path beyond 25 rows has them)
    eager = [(f.op, f.reason) for r in cmp.backend.records if r.graph is not None for f in r.graph.fallbacks
             if not f.reason.startswith("compute-intensive")]
    assert not eager, eager
    assert [r.kind for r in cmp.backend.records] == ["forward", "backward"]
    assert all(r.eager_reason is None for r in cmp.backend.records)
    # pooling backwards place each of the k*k window offsets with its own strided pad
    # (a few kernels per offset: not yet one gather kernel); everything else is a few kernels
    bound = 30 if "pool2d" in name and "adaptive" not in name else 12
    assert launches["n"] >= 2 and cmp.num_kernels <= bound, (launches["n"], cmp.launches_per_graph)


def test_index_put_with_duplicates_adds_every_value():
    def f(x, v):
        return x.index_put((_IDX["dup"],), v, accumulate=True)
    x, v = torch.randn(4, 3), torch.randn(6, 3)
    cmp = compare_with_eager(f, [x, v], backward=False)
    assert cmp.num_kernels >= 1
    want = x.clone()
    for k, i in enumerate(_IDX["dup"].tolist()):
        want[i] += v[k]
    torch.testing.assert_close(cmp.outputs, want)


def test_index_put_with_an_index_out_of_range_writes_nothing_outside():
    """Eager raises on an index out of range; a kernel cannot, unless Triton's debug mode
    makes its assertion live.  The write through two index tensors (one out of range in
    its dim: a linear index past every row) is dropped, not made outside the buffer or
    into another row; the other writes land as eager's do without that pair."""
    def f(x, i, j, v):
        return torch.index_put(x * 1, (i, j), v, accumulate=True)
    x, v = torch.randn(4, 5, 3), torch.randn(6, 3)
    i, j = torch.tensor([0, 1, 3, 2, 1, 0]), torch.tensor([0, 4, 1, 2, 7, 3])
    with pytest.raises(IndexError):
        f(x, i, j, v)
    keep = j < 5
    want = f(x, i[keep], j[keep], v[keep])
    backend = StitchBackend()
    got = torch.compile(f, backend=backend)(x, i, j, v)
    torch.testing.assert_close(got, want)
    assert sum(r.plan.num_kernels for r in backend.records) >= 1


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_scatter_writes_with_duplicates_keep_the_last_writer(dtype):
    """Non-accumulating writes to one position: the last source position wins (what
    eager's serial CPU loop does), in a fixed number of kernels, also under
    torch.use_deterministic_algorithms(True) (the winner is an integer atomic max)."""
    def f(x, s, v):
        return x.scatter(1, _IDX["sc"], s), x.index_put((_IDX["dup"],), v), x.scatter(0, _IDX["sc"][:, :3], -2.5)
    x, s, v = torch.randn(4, 4, dtype=dtype), torch.randn(3, 4, dtype=dtype), torch.randn(6, 4, dtype=dtype)
    want_sc, want_ip = x.clone(), x.clone()
    for r in range(3):
        for c in range(4):
            want_sc[r, _IDX["sc"][r, c]] = s[r, c]
    for k, i in enumerate(_IDX["dup"].tolist()):
        want_ip[i] = v[k]
    was = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        cmp = compare_with_eager(f, [x, s, v], backward=False)
    finally:
        torch.use_deterministic_algorithms(was)
    assert not [f for r in cmp.backend.records for f in r.graph.fallbacks]
    # per scatter: a winner kernel (index math fused in) and a write kernel; the two
    # scatters' write kernels read the same x in one domain, so they are one kernel
    # (sibling fusion); launches may be fewer: horizontal fusion packs independent ones
    assert sum(len(r.plan.kernels) for r in cmp.backend.records) == 5 and 2 <= cmp.num_kernels <= 5
    torch.testing.assert_close(cmp.outputs[0], want_sc, rtol=0, atol=0)
    torch.testing.assert_close(cmp.outputs[1], want_ip, rtol=0, atol=0)


@pytest.mark.parametrize("op", ["index_put_accumulate", "scatter_reduce_prod"])
def test_atomic_scatters_refuse_under_deterministic_algorithms(op):
    def f(x, v):
        if op == "scatter_reduce_prod":
            return x.scatter_reduce(0, _IDX["dup"][:, None].expand(6, 3), v * 2, "prod")
        return x.index_put((_IDX["dup"],), v * 2, accumulate=True)
    was = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        cmp = compare_with_eager(f, [torch.randn(4, 3), torch.randn(6, 3)], backward=False)
    finally:
        torch.use_deterministic_algorithms(was)
    reasons = [f.reason for r in cmp.backend.records for f in r.graph.fallbacks]
    assert len(reasons) == 1 and "use_deterministic_algorithms" in reasons[0], reasons


def test_integer_accumulates_stitch_and_are_exact_even_under_deterministic_algorithms():
    """Integer sums and products are exact in any order: index_put / scatter_add /
    index_add / scatter_reduce prod into integer tensors use int64 atomics (products a
    compare-and-swap loop), allowed under use_deterministic_algorithms."""
    def f(x, v, i, j):
        return (x.index_put((i,), v * 3, accumulate=True), x.scatter_add(1, _IDX["sc"][:, :3], v[:3, :3]),
                x.index_add(0, j, v), x.scatter_reduce(1, _IDX["sc"][:, :3], v[:3, :3] % 5 - 2, "prod"))
    x = torch.randint(-100, 100, (4, 5), dtype=torch.int32)
    v, i, j = torch.randint(-(2**20), 2**20, (6, 5), dtype=torch.int32), _idx(4, 6, neg=True), _idx(4, 6)
    was = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        from stitchml import config
        with config.override(strict=True):
            cmp = compare_with_eager(f, [x, v, i, j], backward=False, rtol=0, atol=0)
    finally:
        torch.use_deterministic_algorithms(was)
    assert cmp.num_kernels >= 1 and [o.dtype for o in cmp.outputs] == [torch.int32] * 4


@pytest.mark.parametrize("include_self", [True, False])
def test_integer_scatter_mean_rounds_down_like_eager(include_self):
    """Integer means divide with floor rounding (negative sums included), exactly."""
    def f(x, s, i):
        return x.scatter_reduce(0, i, s, "mean", include_self=include_self), x.index_reduce(
            1, i[0, :3], s[:, :3].repeat(2, 1)[:4] * 3, "mean", include_self=include_self)
    x, s = torch.randint(-20, 20, (4, 5)), torch.randint(-20, 20, (3, 5))
    i = torch.randint(0, 4, (3, 5))
    from stitchml import config
    with config.override(strict=True):
        cmp = compare_with_eager(f, [x, s, i], backward=False, rtol=0, atol=0)
    assert cmp.num_kernels >= 1


@pytest.mark.parametrize("reduce", ["amax", "amin"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int32, torch.uint8, torch.float64, torch.int64],
                         ids=["fp32", "bf16", "i32", "u8", "fp64", "i64"])
def test_scatter_extremes_are_exact_with_nan_and_signed_zeros(reduce, dtype):
    """Every value survives its key round trip bit for bit (±inf, subnormals, NaN of
    either sign: NaN wins, as eager propagates it; zeros by value); integer atomics, so
    allowed under deterministic algorithms."""
    from stitchml import config
    if dtype.is_floating_point:
        tiny = 1e-310 if dtype == torch.float64 else 1e-40   # a subnormal of the dtype
        pool = torch.tensor([0.0, -0.0, tiny, -tiny, float("inf"), -float("inf"), 3.5, -2.25, 7.0],
                            dtype=torch.float64)
        s = pool[torch.randint(0, len(pool), (6, 5))].to(dtype)
        s[2, 1] = float("nan")
        s[4, 3] = -float("nan")
        x = torch.randn(4, 5).to(dtype)
    else:
        lo, hi = {torch.uint8: (0, 255), torch.int32: (-2**31, 2**31 - 1), torch.int64: (-2**63, 2**63 - 1)}[dtype]
        s = torch.randint(lo, hi, (6, 5), dtype=torch.int64).to(dtype)
        x = torch.randint(lo, hi, (4, 5), dtype=torch.int64).to(dtype)
        s[0, 0] = lo  # the least value: 64-bit keys have no spare key for "nothing arrived"
    i = torch.randint(0, 4, (6, 5))

    def f(x, s, i):
        return x.scatter_reduce(0, i, s, reduce), x.scatter_reduce(0, i, s, reduce, include_self=False)
    was = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        with config.override(strict=True):
            cmp = compare_with_eager(f, [x, s, i], backward=False, rtol=0, atol=0)
    finally:
        torch.use_deterministic_algorithms(was)
    for got, want in zip(cmp.outputs, cmp.expected):
        if dtype.is_floating_point:
            # bit for bit, except the sign of a zero that won a tie of -0.0 and +0.0: eager keeps
            # whichever its loop met first, the keys order -0.0 below +0.0 (both are correct)
            assert torch.equal(got.isnan(), want.isnan())
            same = got.isnan() | ((got == want) & ((got == 0) | (got.signbit() == want.signbit())))
            assert same.all(), (got, want)


def test_embedding_bag_scale_grad_by_freq_backward_on_the_cpu_runs_eagerly_with_its_reason_and_strict_raises():
    """The forward stitches (the flag changes only the gradient); the CPU backward stays
    eager, since eager's CPU kernel divides by another index's count (decomp_index.py)."""
    from stitchml import config
    from stitchml.fallback import StrictFallbackError

    def f(w, i, o):
        return F.embedding_bag(i, w * 2, o, mode="sum", scale_grad_by_freq=True)
    args = [torch.randn(11, 5).requires_grad_(), _idx(11, 9), _offsets(9, 3)]
    cmp = compare_with_eager(f, args)
    by_kind = {r.kind: {f.reason for f in r.graph.fallbacks} for r in cmp.backend.records}
    assert by_kind["forward"] == set(), by_kind
    assert len(by_kind["backward"]) == 1 and "scale_grad_by_freq" in by_kind["backward"].pop()
    with config.override(strict=True), pytest.raises(Exception) as info:
        torch.compile(f, backend=StitchBackend())(*args)[0].sum().backward()
    chain, e = [], info.value
    while e is not None:
        chain.append(e)
        e = e.__cause__ or e.__context__
    assert any(isinstance(x, StrictFallbackError) and "scale_grad_by_freq" in str(x) for x in chain), chain


@pytest.mark.parametrize("mode", ["sum", "mean"])
def test_embedding_bag_scale_grad_by_freq_divides_each_index_by_its_count(mode, monkeypatch):
    """The stitched backward as CUDA's eager computes it (each weight row's gradient over
    the number of times its index occurs), checked here against that rule in float64:
    the CPU's eager kernel has the upstream slip, so the rule is the reference."""
    import stitchml.capture.decomp_index as decomp_index
    monkeypatch.setattr(decomp_index, "_eager_count_is_wrong", lambda device: False)
    w = torch.randn(11, 5)
    idx = torch.tensor([1, 2, 1, 4, 1, 2, 7, 0, 9, 9, 3])
    off = torch.tensor([0, 3, 5, 5, 8])
    psw = torch.rand(11) + 0.5 if mode == "sum" else None
    g = torch.randn(5, 5)

    def f(w, i, o):
        return F.embedding_bag(i, w * 2, o, mode=mode, scale_grad_by_freq=True, per_sample_weights=psw,
                               padding_idx=3)
    torch._dynamo.reset()
    backend = StitchBackend()
    wc = w.clone().requires_grad_()
    torch.compile(f, backend=backend)(wc, idx, off).backward(g)
    assert not [f.reason for r in backend.records for f in r.graph.fallbacks]
    # the rule, by hand: the plain gradient (eager, no scaling) over each index's count
    w64 = w.double().requires_grad_()
    F.embedding_bag(idx, w64 * 2, off, mode=mode, per_sample_weights=None if psw is None else psw.double(),
                    padding_idx=3).backward(g.double())
    count = torch.bincount(idx, minlength=11).clamp(min=1).double().unsqueeze(1)
    want = w64.grad / count
    assert (want[[1, 2]] != w64.grad[[1, 2]]).all()   # repeated indices: the scaling shows
    torch.testing.assert_close(wc.grad.double(), want, rtol=1e-5, atol=1e-6)


def test_embedding_bag_forward_with_a_sparse_gradient_stitches_and_its_backward_stays_eager():
    def f(w, i, o):
        return F.embedding_bag(i, w * 2, o, mode="sum", sparse=True)
    w = torch.randn(11, 5)
    args = (_idx(11, 9), _offsets(9, 3))
    cmp = compare_with_eager(f, [w] + list(args), backward=False)
    assert not [f for r in cmp.backend.records for f in r.graph.fallbacks]
    torch._dynamo.reset()
    backend = StitchBackend()
    wc = w.clone().requires_grad_()
    torch.compile(f, backend=backend)(wc, *args).sum().backward()
    w2 = w.clone().requires_grad_()
    f(w2, *args).sum().backward()
    assert wc.grad.is_sparse and torch.equal(wc.grad.to_dense(), w2.grad.to_dense())
    reasons = {r.kind: {f.reason for f in r.graph.fallbacks} for r in backend.records}
    assert reasons["forward"] == set() and reasons["backward"] and all("sparse" in x for x in reasons["backward"]), reasons


@pytest.mark.parametrize("p", [0.0, 0.5, 1.0, 2.0, 3.0, float("inf")], ids=str)
def test_distances_at_zero_and_between_equal_rows_match_eager(p):
    """Rows shared between the operands (distance 0: eager's gradient is 0 there, not
    NaN) and equal coordinates (|diff| = 0 under fractional p)."""
    x = torch.randn(4, 3)
    y = torch.cat([x[:2], torch.randn(3, 3)])
    y[3, 1] = x[2, 1]
    args = [x.requires_grad_(), y.requires_grad_()]

    def f(a, b):
        return torch.cdist(a, b, p=p), torch.pdist(torch.cat([a, b]), p)
    cmp = compare_with_eager(f, args, rtol=1e-4, atol=1e-4)   # (gradients compared too, NaN positions included)
    assert not [f for r in cmp.backend.records for f in r.graph.fallbacks]
    assert [r.kind for r in cmp.backend.records] == ["forward", "backward"]
    torch.autograd.backward(f(*args), [torch.ones(4, 5), torch.ones(36)])
    assert all(torch.isfinite(a.grad).all() for a in args)   # eager's own gradient there is finite


@pytest.mark.parametrize("padding", ["zeros", "reflection"])
def test_grid_sample_bf16_is_as_close_to_float64_as_eager(padding):
    from stitchml.testing import compare_against_float64

    def f(x, g):
        return F.grid_sample(x, g * 1.3, padding_mode=padding, align_corners=padding == "reflection")
    cmp, judgement = compare_against_float64(f, [_nc(2, 3, 5, 7, dtype=torch.bfloat16),
                                                 _grid(2, 4, 6, dtype=torch.bfloat16)])
    judgement.assert_ok(padding)
    assert not [f for r in cmp.backend.records for f in r.graph.fallbacks]
    cmp, judgement = compare_against_float64(f, [_nc(1, 2, 3, 5, 4, dtype=torch.bfloat16),
                                                 _grid3(1, 2, 3, 4, dtype=torch.bfloat16)])
    judgement.assert_ok(f"3-d {padding}")
    assert not [f for r in cmp.backend.records for f in r.graph.fallbacks]


def test_embedding_bag_max_follows_eagers_nan_and_tie_rules():
    """Eager keeps a bag's first row and replaces it only by a strictly greater one: a
    NaN first row stays, later NaN rows are skipped, ties keep the earlier row (the
    max_indices output and the gradient's destination say which)."""
    w = torch.randint(0, 3, (11, 5)).float()   # many ties
    w[3, 1] = float("nan")
    w[7, 2] = float("nan")
    idx = torch.tensor([3, 1, 3, 0, 7, 3, 9, 9, 2, 1, 4, 6, 7])
    off = torch.tensor([0, 2, 2, 6, 9])

    def f(w, i, o):
        return torch.ops.aten._embedding_bag(w, i, o, False, 2, False, None, False, -1)
    cmp = compare_with_eager(f, [w, idx, off], backward=False)
    got, want = cmp.outputs, cmp.expected
    assert torch.equal(got[0].isnan(), want[0].isnan()) and got[0].isnan().any()
    assert torch.equal(got[3], want[3])  # the winning rows
    assert not [f for r in cmp.backend.records for f in r.graph.fallbacks]


from stitchml.capture.decomp_index import DECLINED as _INDEX_DECLINED  # noqa: E402

DECLINED_SEGMENT = _INDEX_DECLINED[aten.segment_reduce.default]
SEGMENT_LENGTHS = torch.tensor([2, 0, 3, 1, 1])   # an empty segment included
SEGMENT_OFFSETS = torch.tensor([0, 2, 2, 5, 6, 7])


@pytest.mark.parametrize("reduce", ["sum", "mean", "max", "min", "prod"])
@pytest.mark.parametrize("initial", [None, 0.5], ids=["no_initial", "initial"])
@pytest.mark.parametrize("how", ["lengths", "offsets"])
def test_segment_reduce_matches_eager_with_ties_zeros_and_empty_segments(reduce, initial, how):
    """segment_reduce as scatter reductions: eager's empty-segment values and `initial`
    rule (mean: added to the sum), and its backward — ties share a positive gradient,
    products with one zero take the others' product."""
    torch.manual_seed(stable_seed(f"segment-{reduce}-{initial}-{how}"))
    d = torch.randn(7, 3)
    d[0, 1] = d[1, 1]          # a tie
    d[3, 0] = 0.0              # one zero in a product
    d[3, 2] = d[4, 2] = 0.0    # two zeros
    kw = {"lengths": SEGMENT_LENGTHS} if how == "lengths" else {"offsets": SEGMENT_OFFSETS}
    cmp = compare_with_eager(lambda t: torch.segment_reduce(t * 1.5, reduce, initial=initial, **kw),
                             [d.t().contiguous().t().requires_grad_()])
    assert not [f for r in cmp.backend.records for f in r.graph.fallbacks]
    assert cmp.num_kernels >= 1


def test_segment_reduce_with_batched_lengths_runs_eagerly_with_its_reason():
    lengths = torch.tensor([[2, 1], [0, 3]])
    cmp = compare_with_eager(lambda t: torch.segment_reduce(t * 2, "sum", lengths=lengths, axis=1),
                             [torch.randn(2, 3)], backward=False)
    reasons = [f.reason for r in cmp.backend.records for f in r.graph.fallbacks]
    assert reasons == [DECLINED_SEGMENT], reasons


def test_distances_without_pairs_or_features_are_stitched_zeros():
    def f(x, y, one):
        return torch.cdist(x[:, :0], y[:, :0]) + 1, torch.pdist(one * 2), torch.cdist(x, y, p=0.0)
    args = [_leaf(4, 3), _leaf(5, 3), _leaf(1, 3)]
    cmp = compare_with_eager(f, args)
    assert not [f for r in cmp.backend.records for f in r.graph.fallbacks]
    assert cmp.outputs[1].shape == (0,)


def test_uneven_adaptive_max_pool_ties_pick_the_first_position_like_eager():
    """Windows of unequal length over values with many ties (small integers): the
    positions must be eager's (the first maximum in row-major order of the window)."""
    x = torch.randint(0, 3, (2, 3, 7, 9)).float()
    cmp = compare_with_eager(lambda t: F.adaptive_max_pool2d(t, (3, 4), return_indices=True), [x],
                             backward=False)
    assert torch.equal(cmp.outputs[1], F.adaptive_max_pool2d(x, (3, 4), return_indices=True)[1])
    assert not [f for r in cmp.backend.records for f in r.graph.fallbacks]


def test_zero_dim_max_dim_and_index_reduce_stitch():
    """0-d operands of max.dim and of the scatter reductions: the 1-element case."""
    def f(x, s):
        v, i = torch.max(x * 2, 0)
        m = x.index_reduce(0, torch.tensor([0]), s, "amax")
        return v + m + x.scatter_reduce(0, torch.tensor(0), s, "mean"), i
    cmp = compare_with_eager(f, [torch.randn(()).requires_grad_(), torch.randn(()).requires_grad_()])
    assert not [f for r in cmp.backend.records for f in r.graph.fallbacks]
    assert cmp.num_kernels >= 1


def test_embedding_max_norm_renormalises_the_weight_in_place_like_eager():
    """embedding_renorm_ (F.embedding with max_norm) rewrites the looked-up rows of the
    weight: the mutated weight and the output both match eager; duplicates included."""
    w = torch.randn(10, 4) * 3
    idx = torch.tensor([[1, 3, 3], [0, 9, 1]])
    w_eager, w_ours = w.clone(), w.clone()
    backend = StitchBackend()
    out = torch.compile(lambda t, i: F.embedding(i, t, max_norm=1.5) * 2, backend=backend)(w_ours, idx)
    ref = F.embedding(idx, w_eager, max_norm=1.5) * 2
    torch.testing.assert_close(out, ref)
    torch.testing.assert_close(w_ours, w_eager)
    assert not torch.equal(w_ours, w)  # rows were renormalised
    assert not [f for r in backend.records for f in r.graph.fallbacks]


@pytest.mark.parametrize("padding,align", [("zeros", False), ("border", True), ("reflection", False),
                                           ("reflection", True)])
def test_bicubic_grid_sample_backward_is_stitched(padding, align):
    """Bicubic grid_sample (torch's forward decomposition, our backward): the 4x4 taps
    mapped by the padding mode, points beyond the image (scale 1.3), a non-contiguous
    input; both gradients against eager, and no op left eagerly."""
    def f(x, g):
        return F.grid_sample(x * 2, g * 1.3, mode="bicubic", padding_mode=padding, align_corners=align)
    cmp = compare_with_eager(f, [_nc(2, 3, 5, 6), _grid(2, 3, 4)], rtol=1e-4, atol=1e-4)
    assert not [f for r in cmp.backend.records for f in r.graph.fallbacks]
    assert cmp.num_kernels >= 2


def test_zero_dim_scatter_value_does_not_drop_the_graph():
    def f(x, i):
        return torch.scatter(x * 2, 0, i, 3.0) + 1
    cmp = compare_with_eager(f, [torch.randn(()), torch.tensor(0)], backward=False)
    assert all(r.eager_reason is None for r in cmp.backend.records)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_histc_counts_like_eager(dtype):
    def f(x):
        return torch.histc(x * 2, bins=5, min=-1, max=3)
    x = torch.randn(7, 9, dtype=dtype)
    x[0, :3] = torch.tensor([-0.5, 1.5, 5.0])  # the upper edge (2 * 1.5 == max) and an element outside
    if dtype == torch.bfloat16:
        # eager's bfloat16 histc computes each bin position in bfloat16 and files values next
        # to a bin edge in the neighbouring bin (5 of 60 seeds: a flaky comparison); the
        # counts are judged exactly against a float64 run of the same values instead
        backend = StitchBackend()
        got = torch.compile(f, backend=backend)(x.clone())
        assert torch.equal(got, f(x.double()).to(dtype)), (got, f(x.double()), f(x))
        assert backend.records[0].plan.num_kernels >= 1
        assert not [f for r in backend.records for f in r.graph.fallbacks]
        return
    cmp = compare_with_eager(f, [x], backward=False)
    assert cmp.num_kernels >= 1
    assert not [f for r in cmp.backend.records for f in r.graph.fallbacks]


def test_as_strided_scatter_and_copy_of_a_contiguous_run():
    def f(x, y):
        z = torch.zeros(30) + x
        full = torch.as_strided_scatter(z, y.reshape(2, 4) * 2, (2, 4), (4, 1), 7)
        whole = torch.ops.aten.copy.default(torch.zeros(3, 10), x.reshape(3, 10) + 1)
        return full, whole
    cmp = compare_with_eager(f, [torch.randn(30), torch.randn(8)], backward=False)  # (copy has no derivative)
    assert not [f for r in cmp.backend.records for f in r.graph.fallbacks]
    # a kernel per output (launched together where both are launch-bound)
    assert len(cmp.backend.records[0].plan.kernels) >= 2


AS_STRIDED = {
    # (function, inputs, backward): eager's storage layout decides what as_strided reads
    "view_of_transposed_input": (lambda a: torch.as_strided(a * 2, (3, 4), (2, 3), 1) + 1,
                                 lambda: [torch.randn(5, 6).t().requires_grad_()], True),
    "view_of_permuted_intermediate": (lambda a: torch.as_strided(a.t() * 2, (3, 4), (1, 5), 2),
                                      lambda: [torch.randn(5, 6).requires_grad_()], True),
    "scatter_strided": (lambda a, s: torch.as_strided_scatter(a * 2, s, (2, 3), (1, 4), 1),
                        lambda: [torch.randn(5, 4).requires_grad_(), torch.randn(2, 3).requires_grad_()], True),
    # (eager refuses the gradient of a non-contiguous as_strided_scatter)
    "scatter_into_transposed": (lambda a, s: torch.as_strided_scatter(a.t() * 2, s, (2, 3), (3, 1), 0),
                                lambda: [torch.randn(5, 4), torch.randn(2, 3)], False),
    "scatter_overlapping_view": (lambda a, s: torch.as_strided_scatter(a * 2, s, (3, 3), (1, 1), 0),
                                 lambda: [torch.randn(5, 4), torch.randn(3, 3)], False),
    # a column slice has gaps in its storage: views that address its elements only are
    # re-indexes of them (`rules_views.element_view`); unfold's decomposition of a slice
    "view_of_sliced_intermediate": (lambda a: torch.as_strided((a * 2)[:, 1:4], (2, 3), (6, 1), 1) * 2,
                                    lambda: [torch.randn(4, 6).requires_grad_()], True),
    "unfold_of_strided_slice": (lambda a: (a * 2)[:, ::2].unfold(1, 3, 2) * 3,
                                lambda: [torch.randn(5, 14).requires_grad_()], True),
    "view_of_a_step_slice_with_offset": (lambda a: torch.as_strided((a + 1)[1:, ::3], (2, 2, 2), (18, 9, 3), 12),
                                         lambda: [torch.randn(5, 9).requires_grad_()], True),
    "scatter_into_step_slice": (lambda a, s: torch.as_strided_scatter((a * 2)[:, ::2], s, (2, 2), (14, 2), 2),
                                lambda: [torch.randn(5, 14), torch.randn(2, 2)], False),
}


@pytest.mark.parametrize("name", sorted(AS_STRIDED))
def test_as_strided_and_its_scatter_follow_eagers_storage_layout(name):
    fn, make, backward = AS_STRIDED[name]
    torch.manual_seed(stable_seed(name))
    cmp = compare_with_eager(fn, make(), backward=backward)
    assert not [f for r in cmp.backend.records for f in r.graph.fallbacks]
    assert cmp.num_kernels >= 1


def test_as_strided_between_the_elements_of_a_sliced_intermediate_runs_eagerly_with_its_reason():
    """A column slice of a value of ours has gaps in its storage: a view reaching a gap
    would read values that are not the operand's elements, and our buffer has no
    storage laid out as eager's — eager with the reason, never a wrong re-index."""
    cmp = compare_with_eager(lambda a: torch.as_strided((a * 2)[:, 1:4], (2, 5), (6, 1), 1) * 2,
                             [torch.randn(4, 6)], backward=False)
    reasons = [(f.op, f.reason) for r in cmp.backend.records for f in r.graph.fallbacks]
    assert reasons == [("aten.as_strided.default",
                        "as_strided of an operand with gaps addresses storage between its elements")], reasons


def _gapped(shape: tuple[int, ...], stride: tuple[int, ...], offset: int, storage: int) -> torch.Tensor:
    """A graph input with gaps, random values in the gaps and around (op_db's
    non-contiguous samples: (3, 3) with strides (6, 2) at offset 1)."""
    return torch.randn(storage).as_strided(shape, stride, offset)


# (input's shape, strides, storage offset, storage size; as_strided's size, stride, storage offset)
STORAGE_READS = {
    "gaps": ((3, 3), (6, 2), 1, 18, (2, 2), (1, 2), 0),              # op_db's samples
    "gaps_offset": ((3, 3), (6, 2), 1, 18, (2, 2), (1, 2), 1),
    "before_its_first_element": ((1,), (2,), 1, 2, (1,), (1,), 0),
    "overlapping_windows": ((16,), (2,), 1, 32, (2, 1, 1, 2), (1, 7, 7, 1), 0),
    "past_its_last_element": ((2, 3), (3, 1), 0, 12, (3, 4), (4, 1), None),   # the input's own offset
}


@pytest.mark.parametrize("name", sorted(STORAGE_READS))
def test_as_strided_of_an_input_reads_its_storage_by_position_in_a_kernel(name):
    """as_strided of a graph input that is no re-index of its elements reads the
    input's storage at eager's positions (`rules_views.storage_read`): stitched, equal
    to eager on random storage, and still right for an input that comes at another
    storage offset with the same sizes and strides (Dynamo does not guard the offset)."""
    shape, stride, offset, storage, size, vstride, voff = STORAGE_READS[name]

    def f(x):
        return torch.as_strided(x, size, vstride, voff) * 2 + 1 if voff is not None else \
            torch.as_strided(x, size, vstride) * 2 + 1
    torch.manual_seed(stable_seed(name))
    backend = StitchBackend()
    compiled = torch.compile(f, backend=backend)
    for off in (offset, offset + 3):   # the second call: the same graph, the input elsewhere in its storage
        x = _gapped(shape, stride, off, storage + 3)
        got, want = compiled(x), f(x)
        assert torch.equal(got, want), (off, got, want)
    assert len(backend.records) == 1
    assert not [f for r in backend.records for f in r.graph.fallbacks]
    assert backend.records[0].plan.num_kernels == 1


def test_as_strided_scatter_into_an_input_at_a_storage_offset_runs_eagerly_with_its_reason():
    """Which elements of the input an absolute offset addresses moves with the input's
    storage offset, which Dynamo does not guard: eager, right at every offset."""
    def f(x, s):
        return torch.as_strided_scatter(x, s * 2, (2, 2), (1, 2), 1) + 1
    backend = StitchBackend()
    compiled = torch.compile(f, backend=backend)
    for off in (1, 2):
        x, s = torch.randn(20).as_strided((3, 3), (6, 2), off), torch.randn(2, 2)
        assert torch.equal(compiled(x, s), f(x, s))
    assert len(backend.records) == 1
    reasons = [(f.op, f.reason) for r in backend.records for f in r.graph.fallbacks]
    assert reasons == [("aten.as_strided_scatter.default", "as_strided(_scatter) of a graph input at a storage "
                        "offset, which Dynamo does not guard")], reasons


def test_an_input_read_by_storage_position_is_not_written_in_place():
    """An input written in place that an as_strided also reads by storage position: the
    new value goes to a buffer of its own and is copied in after the kernel read the old
    storage, with the reason on the plan."""
    def f(x):
        y = torch.as_strided(x, (2, 2), (1, 2), 0) * 2
        x.mul_(3)
        return y
    base = torch.randn(18)
    x, xe = base.as_strided((3, 3), (6, 2), 1), base.clone().as_strided((3, 3), (6, 2), 1)   # (gaps too)
    backend = StitchBackend()
    got = torch.compile(f, backend=backend)(x)
    want = f(xe)
    assert torch.equal(got, want) and torch.equal(x, xe)
    plan = backend.records[0].plan
    assert list(plan.in_place.values()) == [
        "an as_strided reads the input's storage by position (between or past its elements)"], plan.in_place
    assert not [f for r in backend.records for f in r.graph.fallbacks]


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.float32], ids=["i64", "i32", "fp32"])
def test_integer_divisions_and_remainder_round_like_eager(dtype):
    def f(a, b):
        return (torch.floor_divide(a, b), torch.remainder(a, b), torch.remainder(a, 3), a // -4,
                torch.div(a, b, rounding_mode="trunc"), torch.div(a, -3, rounding_mode="trunc"),
                torch.div(a, b, rounding_mode="floor"), torch.ops.prims.div(a, b))
    a = torch.randint(-50, 50, (5, 7)).to(dtype)
    b = torch.randint(1, 9, (5, 7)).to(dtype) * (1 - 2 * (torch.rand(5, 7) < 0.5)).to(dtype)
    if dtype == torch.float32:
        a = a + torch.rand(5, 7)
    cmp = compare_with_eager(f, [a, b], backward=False)
    assert not [f for r in cmp.backend.records for f in r.graph.fallbacks]
    assert cmp.num_kernels == 1


@pytest.mark.parametrize("op", [torch.cumsum, torch.cumprod, torch.logcumsumexp])
def test_scan_of_one_element_rows_stitches(op):
    def f(x):
        return op(x * 2, 1) + 1
    cmp = compare_with_eager(f, [torch.randn(5, 1, 3, requires_grad=True)])
    assert not [f for r in cmp.backend.records for f in r.graph.fallbacks]
    assert cmp.num_kernels >= 1


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_fill_tensor_zero_and_empty_constructors_stitch(dtype):
    # Swin builds its attention mask with fill.Tensor; EfficientNet's stochastic depth
    # allocates with new_empty_strided: both ran eagerly for "no lowering rule"
    from stitchml import config

    def f(x, v):
        y = torch.ops.aten.fill.Tensor(x * 2, v) + x
        e = torch.ops.aten.new_empty_strided(x, (3, 5), (1, 3)).zero_()
        return y, e + x.t()[:3], torch.zeros_like(x).fill_(v) * x
    with config.override(strict=True):
        cmp = compare_with_eager(f, [_nc(5, 3, dtype=dtype), torch.tensor(1.5)], rtol=2e-2, atol=2e-2)
    assert cmp.num_kernels >= 2


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_masked_assignment_of_one_value_stitches(dtype):
    # `y[mask] = v` (one value): torch turns the mask into nonzero indices (a data-dependent
    # shape); our decomposition writes where(mask, v, y).  Inference only: in training,
    # index_put's autograd formula calls nonzero before any decomposition (a graph break).
    from stitchml import config

    def f(x, m, v):
        y = x * 2
        y[m] = v
        return y + 1, torch.ops.aten.index_put(x, [m], v, True)
    with config.override(strict=True):
        cmp = compare_with_eager(f, [torch.randn(4, 5, 3, dtype=dtype), torch.rand(4, 5) > 0.5,
                                     torch.randn((), dtype=dtype)], backward=False)
    assert len(cmp.backend.records) == 1 and cmp.num_kernels >= 1


AOT_SCRIPT = '''
import json, torch
import torch.nn.functional as F
from stitchml.tools.aot_check import check

def prods(x, s, i, xi, si, xd):
    return (x.scatter_reduce(0, i, s, "prod"), x.scatter_reduce(0, i, s, "prod", include_self=False),
            xi.scatter_reduce(0, i, si, "prod"), xd.scatter_reduce(0, i, xd[:3, :4] * 2, "prod"),
            xd.scatter_reduce(0, i, xd[:3, :4], "amin", include_self=False), xi.scatter_reduce(0, i, si, "amax"))

def windows(x, v, a, s):
    return (F.adaptive_avg_pool2d(x, (3, 4)), *F.adaptive_max_pool2d(x, (4, 5), return_indices=True),
            F.interpolate(x, size=(3, 5), mode="bilinear", antialias=True),
            F.grid_sample(v, torch.rand(2, 3, 4, 5, 3) * 2.6 - 1.3, padding_mode="reflection"),
            torch.as_strided_scatter(a * 2, s, (2, 3), (1, 4), 1))

def backward(x, v, g, p):   # the gradients, traced through autograd (joint graph)
    x, v, g, p = (t.detach().requires_grad_() for t in (x, v, g, p))
    out = (F.adaptive_avg_pool2d(x, (3, 4)).sum() + F.adaptive_max_pool2d(x, (4, 5)).sum()
           + F.grid_sample(v, g).sum() + F.pad(p, (2, 3, 1, 0, 1, 2), mode="replicate").sum()
           + F.interpolate(x, size=(3, 5), mode="bilinear", antialias=True).sum())
    return torch.autograd.grad(out, [x, v, g, p])

idx = torch.tensor([[0, 1, 1, 3], [2, 2, 0, 0], [3, 3, 3, 1]])
out = {"prod": check(prods, torch.randn(4, 5), torch.rand(3, 4) + 0.5, idx, torch.randint(-3, 4, (4, 5)),
                     torch.randint(-3, 4, (3, 4)), torch.randn(4, 5, dtype=torch.float64)),
       "windows": check(windows, torch.randn(2, 3, 7, 9), torch.randn(2, 3, 4, 5, 6), torch.randn(5, 4),
                        torch.randn(2, 3)),
       "backward": check(backward, torch.randn(2, 3, 7, 9), torch.randn(2, 3, 4, 5, 6),
                         torch.rand(2, 3, 4, 5, 3) * 2 - 1, torch.randn(1, 2, 3, 5, 6))}
print(json.dumps({k: [r.__dict__ for r in v] for k, v in out.items()}))
'''


def test_this_sessions_kernel_forms_compile_for_sm90():
    """The compare-and-swap product (float32, float64 bits, int64), 64-bit amax/amin keys, uneven adaptive
    pooling's window gathers, grid_sample 3-d, as_strided_scatter's scatter-write and
    the backwards (transposed gathers, replication-pad edge sums) compile for an H100
    ahead of time: code the interpreter accepts but compiled Triton rejects fails here."""
    from test_aot_gpu import compiled_for_sm90
    results, kernels = compiled_for_sm90(AOT_SCRIPT)
    assert set(results) == {"prod", "windows", "backward"}
    assert len(kernels) >= 6


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_memory_format_copies_stitch_in_eagers_layout(dtype):
    """`.to(memory_format=...)` (with or without a dtype change) is a copy written in the
    requested layout: same values and the same strides as eager, no op left eager."""
    def f(x):
        return (x.to(memory_format=torch.channels_last), (x * 2).to(torch.float16, memory_format=torch.channels_last),
                (x + 1).contiguous(memory_format=torch.channels_last).sum((2, 3)))
    x = torch.randn(2, 3, 5, 7, dtype=dtype).requires_grad_()
    cmp = compare_with_eager(f, [x], **({} if dtype == torch.float32 else dict(rtol=2e-2, atol=2e-2)))
    for got, want in zip(cmp.outputs, cmp.expected):
        assert got.stride() == want.stride(), (got.stride(), want.stride())
    assert not [f for r in cmp.backend.records for f in r.graph.fallbacks]
    assert cmp.num_kernels >= 1


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int64], ids=["fp32", "fp64", "int64"])
def test_scatter_with_reduce_multiply_is_the_product_scatter(dtype):
    """The older string form `scatter(..., reduce="multiply")` (tensor and value sources)
    is scatter_reduce's 'prod' with x included: duplicates multiply in, untouched
    positions keep x; "add" stays the scatter-add."""
    idx = torch.tensor([[0, 1, 1, 3], [2, 2, 0, 0], [3, 3, 3, 1]])
    if dtype.is_floating_point:
        x, s, v = torch.randn(4, 5, dtype=dtype), (torch.rand(3, 4) + 0.5).to(dtype), 1.5
    else:
        x, s, v = torch.randint(-3, 4, (4, 5)), torch.randint(-3, 4, (3, 4)), 2

    def f(x, s):
        return (x.scatter(0, idx, s, reduce="multiply"), x.scatter(1, idx, v, reduce="multiply"),
                x.scatter(0, idx, s, reduce="add"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)   # (eager's deprecation notice of the string form)
        cmp = compare_with_eager(f, [x, s], backward=False)
    assert not [f for r in cmp.backend.records for f in r.graph.fallbacks]
    assert cmp.num_kernels >= 1
