"""A kernel that would write an exact widening cast of a value it computes writes the
narrow value, and each reader casts it (knob `narrow_writes`,
`plan/planner.py::_narrower_writes`): ResNet-50's backward wrote the float32 cast of the
ReLU of a residual gradient, `where(y <= 0, 0, dy_a + dy_b)`, for its batch norms' dx
kernel (three full-size sources: too many to be recomputed as a cheap chain).
Interpreter tier (bf16 against float64, fp32 against eager, outputs poisoned) and plan
tier (no kernel run)."""
import sys

import pytest
import torch

from stitchml import config
from stitchml.testing import compare_against_float64, compare_with_eager

sys.path.insert(0, "tests")
from planning import plan_of  # noqa: E402


def relu_residual_bn_grads(y, a, b, x, w):
    """The shape of a residual block's batch-norm backward: the ReLU's gradient of two
    summed branch gradients, in float32, summed per channel (column partials and a
    combine) and read again by the element-wise dx (after the combine: its own kernel)."""
    h = torch.where(y <= 0, torch.zeros((), dtype=a.dtype), a + b)
    hf = h.float()
    n = hf.numel() // hf.shape[1]
    mean_h = hf.sum((0, 2, 3), keepdim=True) / n
    mean_hx = (hf * x.float()).sum((0, 2, 3), keepdim=True) / n
    dx = (hf - mean_h - x.float() * mean_hx) * w.float().reshape(1, -1, 1, 1)
    return dx.to(a.dtype), mean_h.squeeze()


def _inputs(dtype, shape=(6, 16, 9, 7)):
    cl = torch.channels_last
    return [torch.randn(shape).to(memory_format=cl).to(dtype),
            *(torch.randn(shape).to(memory_format=cl).to(dtype).requires_grad_() for _ in range(2)),
            torch.randn(shape).to(memory_format=cl).to(dtype),
            (torch.rand(shape[1]) + 0.5).to(dtype)]


def _fp32_full_writes(plan, numel):
    g = plan.graph
    return [(k.name, g[o].op) for k in plan.kernels for o in k.outputs
            if o not in k.partials and g[o].dtype == torch.float32 and g[o].numel == numel]


def test_the_narrow_value_is_written_and_cast_by_its_reader():
    """H200 plan at a ResNet stage's size (b32, 256 x 56 x 56, bf16, channels last): with
    the knob no kernel writes a full-size float32 value, and the step moves at least
    numel x 4 bytes less (2 bytes narrower written, 2 narrower read back) than without."""
    shape = (32, 256, 56, 56)
    ins = [torch.empty(shape, dtype=torch.bfloat16).to(memory_format=torch.channels_last) for _ in range(4)]
    ins.append(torch.empty(256, dtype=torch.bfloat16))
    numel = ins[0].numel()
    with config.override(device="H200"):
        on = plan_of(relu_residual_bn_grads, *ins)
    with config.override(device="H200", narrow_writes=False):
        off = plan_of(relu_residual_bn_grads, *ins)
    assert _fp32_full_writes(off, numel), "the case no longer writes the wide cast: the test tests nothing"
    assert not _fp32_full_writes(on, numel), _fp32_full_writes(on, numel)
    g = on.graph
    narrow = [o for k in on.kernels for o in k.outputs
              if g[o].numel == numel and g[o].dtype == torch.bfloat16 and g[o].op == "where"]
    assert narrow, [(k.name, [g[o].op for o in k.outputs]) for k in on.kernels]
    moved = lambda p: sum(k.bytes_read + k.bytes_written for k in p.kernels)   # noqa: E731
    assert moved(off) - moved(on) >= numel * 4 * 0.95, (moved(off) / 1e6, moved(on) / 1e6)
    assert on.predicted_s < off.predicted_s


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_results_unchanged(dtype):
    """Compiled against float64 (bf16) or eager (fp32: no widening, nothing changes),
    outputs poisoned; bf16's cast of a bf16 value is exact, so writing the narrow value
    changes no number."""
    if dtype == torch.bfloat16:
        c, verdict = compare_against_float64(relu_residual_bn_grads, _inputs(dtype))
        verdict.assert_ok("residual ReLU / batch-norm backward shape")
    else:
        c = compare_with_eager(relu_residual_bn_grads, _inputs(dtype))
    (fwd,) = [r for r in c.backend.records if r.kind == "forward"]
    assert not _fp32_full_writes(fwd.plan, _inputs(dtype)[0].numel()) or dtype == torch.float32


def test_graph_outputs_keep_their_wide_type():
    """A widened value that is a graph output is written as it is (the caller gets the
    float32 tensor)."""
    def fn(a, b):
        h = torch.relu(a + b)
        hf = h.float()
        return hf, hf.sum(0) * 2

    shape = (64, 48)
    with config.override(device="H200"):
        plan = plan_of(fn, torch.empty(shape, dtype=torch.bfloat16), torch.empty(shape, dtype=torch.bfloat16))
    assert _fp32_full_writes(plan, 64 * 48)


def test_explain_says_the_narrow_value_is_written():
    from stitchml.tools.explain import Report
    c, _ = compare_against_float64(relu_residual_bn_grads, _inputs(torch.bfloat16))
    text = Report(c.backend.records).to_text()
    assert "an exact widening cast: the narrow value is written, readers cast it" in text


def test_the_cast_of_a_reshaped_value_is_narrowed_too():
    """LLaMA's last RMSNorm backward: its row kernel wrote the float32 cast of the reshaped
    gradient for the embedding backward (a scatter-add kernel); the view is looked through,
    the bfloat16 gradient written instead."""
    def fn(a, b, idx):
        x = torch.sigmoid(a) * b            # (not a cheap chain: computed once, by the row kernel)
        rows = x.float().sum(-1)            # (the producer is a row kernel: the scatter cannot join it)
        flat = x.reshape(32, 64).float()
        return rows, torch.zeros(10, 64).index_add(0, idx, flat)

    ins = [torch.empty(64, 32, dtype=torch.bfloat16), torch.empty(64, 32, dtype=torch.bfloat16),
           torch.zeros(32, dtype=torch.int64)]
    with config.override(device="H200"):
        on = plan_of(fn, *ins)
    with config.override(device="H200", narrow_writes=False):
        off = plan_of(fn, *ins)
    assert _fp32_full_writes(off, 64 * 32) and not _fp32_full_writes(on, 64 * 32)
    a, b = torch.randn(64, 32, dtype=torch.bfloat16), torch.randn(64, 32, dtype=torch.bfloat16)
    _, verdict = compare_against_float64(fn, [a, b, torch.randint(0, 10, (32,))], backward=False)
    verdict.assert_ok("reshaped cast")
