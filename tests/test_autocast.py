"""Mixed precision as users write it (`torch.autocast`): training and inference of a
transformer block stitched under autocast, judged against a float64 run of the same
model, with eager autocast's own error as the allowance.  On CPU the interpreter runs
the kernels under `autocast("cpu")`; `-m gpu` runs the same under `autocast("cuda")`."""
import copy
import warnings

import pytest
import torch
import torch.nn as nn

from stitchml.capture.backend import StitchBackend
from stitchml.testing import judge_against_float64


class Block(nn.Module):
    def __init__(self, d: int = 64):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.attn = nn.MultiheadAttention(d, 4, batch_first=True)
        self.fc1, self.fc2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.ln1(x)
        a, _ = self.attn(h, h, h, need_weights=False)
        x = x + a
        return x + self.fc2(nn.functional.gelu(self.fc1(self.ln2(x))))


def _step(model: nn.Module, x: torch.Tensor, device_type: str, dtype: torch.dtype | None,
          cot: torch.Tensor) -> list[torch.Tensor]:
    """Output and every parameter's gradient of one step (under autocast when `dtype`)."""
    model.zero_grad(set_to_none=True)
    if dtype is None:
        out = model(x)
    else:
        with torch.autocast(device_type, dtype=dtype):
            out = model(x)
    out.backward(cot.to(out.dtype))
    return [out.detach().float()] + [p.grad.detach().float() for p in model.parameters()]


def _check(device: str, dtype: torch.dtype) -> None:
    torch.manual_seed(0)
    torch._dynamo.reset()
    model = Block().to(device)
    x = torch.randn(2, 16, 64, device=device)
    cot = torch.randn(2, 16, 64, device=device)
    eager = _step(model, x, device, dtype, cot)
    reference = _step(copy.deepcopy(model).double(), x.double(), device, None, cot.double())
    backend = StitchBackend()
    compiled = torch.compile(model, backend=backend)
    with warnings.catch_warnings():
        warnings.simplefilter("error")      # a graph run eagerly would warn
        for _ in range(2):                  # (the second call: a CUDA graph's capture on a GPU)
            actual = _step(compiled, x, device, dtype, cot)
    names = ["output"] + [n for n, _ in model.named_parameters()]
    groups = ["output"] + ["grad"] * (len(names) - 1)
    # (eager's error here is the half-precision products', which stitch runs the same: its
    # element-wise kernels measured 1.00-1.08x eager's error, so twice is a tight allowance)
    judge_against_float64(actual, eager, [r.float() for r in reference], names, groups=groups,
                          factor=2.0).assert_ok(f"autocast {dtype}")
    assert [r.kind for r in backend.records] == ["forward", "backward"]
    assert all(r.plan is not None and r.plan.num_kernels >= 2 for r in backend.records), \
        [(r.kind, r.eager_reason) for r in backend.records]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_autocast_training_step_matches_float64_within_eager_autocasts_error(dtype):
    _check("cpu", dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_autocast_training_step_on_a_gpu(dtype):
    _check("cuda", dtype)
