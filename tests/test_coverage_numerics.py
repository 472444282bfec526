"""Issue 18.4: BatchNorm training statistics on few values per channel (batch 2, tiny
spatial extent, a large common offset) are no further from a float64 run than eager
is: the variance is the corrected two-pass one (capture/decomp.py::var_mean), forward
and backward, with running statistics updated like eager."""
import pytest
import torch
import torch.nn as nn

import stitchml


@pytest.mark.parametrize("spatial", [1, 4])
def test_batch_norm_training_is_as_close_to_float64_as_eager(spatial):
    torch.manual_seed(spatial)
    bn = nn.BatchNorm2d(6)
    with torch.no_grad():
        bn.weight.uniform_(0.5, 1.5)
        bn.bias.uniform_(-1, 1)
    bn64 = nn.BatchNorm2d(6).double()
    bn64.load_state_dict(bn.state_dict())
    bn_eager = nn.BatchNorm2d(6)
    bn_eager.load_state_dict(bn.state_dict())
    compiled = torch.compile(bn, backend=stitchml.StitchBackend())
    x = torch.randn(2, 6, spatial, spatial) * 0.1 + 50.0  # small spread on a large mean
    go = torch.randn(2, 6, spatial, spatial)
    results = {}
    for name, mod, dtype in (("stitch", compiled, torch.float32), ("eager", bn_eager, torch.float32),
                             ("f64", bn64, torch.float64)):
        xi = x.to(dtype).clone().requires_grad_()
        out = mod(xi)
        out.backward(go.to(dtype))
        m = mod if name != "stitch" else bn
        results[name] = (out.double(), xi.grad.double(), m.weight.grad.double(), m.running_var.double())
    for i, what in enumerate(("output", "input grad", "weight grad", "running var")):
        ref = results["f64"][i]
        err = (results["stitch"][i] - ref).abs().max().item()
        err_eager = (results["eager"][i] - ref).abs().max().item()
        scale = ref.abs().max().item()
        assert err <= max(2 * err_eager, 1e-6 * scale), (what, err, err_eager)
