"""Pure IR nodes that repeat an earlier one are merged before planning
(`ir/dce.py::merge_duplicates`): no kernel writes the same value twice, no two graph
outputs become one tensor, and no twin is merged across an eager op that writes a
buffer."""
import sys

import torch

from stitchml.ir.dce import merge_duplicates
from stitchml.testing import compare_with_eager

sys.path.insert(0, "tests")
from planning import graph_of  # noqa: E402


def _twins(x):
    return x.float().sum(0), x.float() * 2, x.float(), x.float()


def test_twins_merge_but_outputs_stay_distinct():
    g = graph_of(_twins, torch.randn(37, 50).to(torch.bfloat16))
    casts = [n.id for n in g.nodes if n.op == "cast"]
    assert len(casts) == 4
    m = merge_duplicates(g)
    assert sum(n.op == "cast" for n in m.nodes) == 2           # the two readers' casts became one
    outs = m.output_ids()
    assert len(set(outs)) == len(outs) == 4                     # the two returned casts stay two tensors
    assert merge_duplicates(m) is m                             # nothing repeats any more


def test_twins_merged_match_eager_and_write_each_value_once():
    c = compare_with_eager(_twins, [torch.randn(37, 50).to(torch.bfloat16)], backward=False)
    plan = c.backend.records[0].plan
    assert sum(n.op == "cast" for n in plan.graph.nodes) == 2
    assert c.outputs[2] is not c.outputs[3] and c.outputs[2].data_ptr() != c.outputs[3].data_ptr()


def test_no_merge_across_an_eager_write():
    def f(x, buf):
        a = buf * 2
        buf.add_(x)              # an in-place write into a graph input
        return a, buf * 2        # the same expression, read after the write
    x, buf = torch.randn(8, 16), torch.randn(8, 16)
    compare_with_eager(f, [x, buf], backward=False)
