"""Knob `remat` (off by default): AOTAutograd's min-cut partitioner recomputes cheap
element-wise values in the backward instead of saving them.  RMSNorm is the case it
pays for: the backward then reads x, its row rsqrt and the gradient, not a saved
normalised copy of x."""
import torch

from stitchml import config
from stitchml.testing import compare_with_eager


def rms_norm(x, w):
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6)).to(x.dtype) * w


def _saved_full_tensors(remat: bool) -> tuple[int, object]:
    x = torch.randn(48, 40, requires_grad=True)
    w = torch.randn(40, requires_grad=True)
    with config.override(remat=remat):
        c = compare_with_eager(rms_norm, [x, w])
    (bwd,) = [r for r in c.backend.records if r.kind == "backward"]
    # inputs of the backward graph shaped like x, other than x itself and the incoming gradient
    full = [n for n in bwd.graph.nodes if n.kind == "input" and n.shape == (48, 40)
            and not n.op.startswith(("primals", "tangents"))]
    return len(full), c


def test_remat_recomputes_the_normalised_input_instead_of_saving_it():
    saved_default, c0 = _saved_full_tensors(False)
    saved_remat, c1 = _saved_full_tensors(True)
    assert saved_default >= 1 and saved_remat == 0
    assert c1.num_kernels >= 1 and all(r.eager_reason is None for r in c1.backend.records)


def test_remat_is_off_by_default():
    from torch._functorch.partitioners import default_partition, min_cut_rematerialization_partition

    from stitchml.capture.backend import partitioner
    assert config.KNOBS["remat"].default is False
    with config.override(remat=False):
        assert partitioner() is default_partition
    with config.override(remat=True):
        assert partitioner() is min_cut_rematerialization_partition
