"""An element-wise copy of a computed value in the same dtype and layout is that value
(`ir/dce.py::fold_copies`): no kernel writes the same values into two buffers.  A copy
stays where it is observable: of a graph input, into another layout, or as a second
graph output of the same values."""
import sys

import torch

from stitchml.ir.dce import fold_copies
from stitchml.testing import compare_with_eager

sys.path.insert(0, "tests")
from planning import graph_of  # noqa: E402


def _attention_probs(s, v):
    # Swin-T's attention: the probabilities saved for the backward and, through a copy
    # (its dropout of probability 0 in training), read by the next matrix product
    p = torch.softmax(s, -1)
    return p, p.clone() @ v


def test_a_copy_for_a_matrix_product_is_the_saved_value():
    s, v = torch.randn(6, 49, 49), torch.randn(6, 49, 16)
    g = graph_of(lambda s, v: _attention_probs(s, v)[1], s, v)
    copies = [n.id for n in g.nodes if n.op == "identity"]
    assert copies
    folded = fold_copies(g)
    assert not any(n.op == "identity" for n in folded.nodes)
    assert fold_copies(folded) is folded


def test_folded_copies_match_eager_and_write_each_value_once():
    s = torch.randn(6, 49, 49, requires_grad=True)
    v = torch.randn(6, 49, 16, requires_grad=True)
    c = compare_with_eager(_attention_probs, [s, v])
    fwd = c.backend.records[0].plan
    assert not any(n.op == "identity" for n in fwd.graph.nodes)
    # the softmax kernel writes the probabilities once: no output of the same shape twice
    (k,) = [k for k in fwd.kernels if any(fwd.graph[m].op == "exp" for m in k.members)]
    assert [fwd.graph[o].shape for o in k.outputs].count((6, 49, 49)) == 1


def test_a_copy_returned_beside_its_value_stays_a_tensor_of_its_own():
    def f(x):
        y = torch.tanh(x)
        return y, y.clone()
    c = compare_with_eager(f, [torch.randn(7, 33)], backward=False)
    a, b = c.outputs
    assert a.data_ptr() != b.data_ptr()


def test_a_copy_of_an_input_or_into_another_layout_stays():
    def f(x, y):
        t = torch.sigmoid(y)
        return x.clone(), t.clone(memory_format=torch.channels_last) * 1.0, t.clone()
    x, y = torch.randn(2, 3, 4, 5), torch.randn(2, 3, 4, 5)
    g = graph_of(f, x, y)
    folded = fold_copies(g)
    kept = [n for n in folded.nodes if n.op == "identity"]
    assert len(kept) == 2     # the input's copy and the channels-last one; t.clone() is t
    c = compare_with_eager(f, [x, y], backward=False)
    assert c.outputs[0].data_ptr() != x.data_ptr()
    assert c.outputs[1].stride() == f(x, y)[1].stride()
