"""Named regression tests for bugs found after the fact."""
import warnings

import torch

import stitchml


def test_cat_branches_do_not_read_outside_their_inputs():
    # found in LLaMA's rotate_half: each cat branch loaded every lane and dropped the
    # unwanted ones with a select, reading out of bounds; poison the neighbours with
    # huge values so any such read overflows in the interpreter
    def f(x):
        return torch.cat((x[16:] * 2.0, x[:16] * 2.0))

    base = torch.full((3, 32), 3e38)
    base[1] = torch.rand(32)
    x = base[1]
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        out = torch.compile(f, backend=stitchml.StitchBackend())(x)
    assert torch.equal(out, f(x))
