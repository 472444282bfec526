"""Code generation cached by kernel content (codegen/canonical.py, codegen/probes.py).

The canonical text of a kernel is the key of the kernel-source cache and of the
planner's dry runs of the index analysis: it must hold everything the emitters read.
A repeated layer's kernels are analysed once, and the answers handed to the other
layers are the ones their own analysis gives."""
import dataclasses
import inspect
import re
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from stitchml.codegen import canonical, probes, triton_kernel
from stitchml.ir import index as ix
from stitchml.plan.data import KernelPlan

from planning import graph_of
from stitchml.plan.planner import build_plan


def test_every_kernel_plan_field_is_in_the_text_or_not_read_by_the_emitters():
    fields = {f.name for f in dataclasses.fields(KernelPlan)}
    text_src = inspect.getsource(canonical.canonical_kernel)
    in_text = {f for f in fields if re.search(rf"\bk\.{f}\b", text_src)}
    left_out = set(canonical.NOT_READ_BY_CODEGEN)
    assert fields == in_text | left_out, f"classify in codegen/canonical.py: {sorted(fields - in_text - left_out)}"
    assert not in_text & left_out
    # the fields left out (the name apart: the caches put each kernel's own name back)
    # must not be read by any emitter
    codegen = Path(canonical.__file__).parent
    for path in codegen.glob("*.py"):
        src = path.read_text()
        for f in left_out - {"name"}:
            assert not re.search(rf"\b(k|kp|self\.k|plan)\.{f}\b", src), f"{path.name} reads KernelPlan.{f}"


def _block(x, w, b, m):
    # between two matrix products (which end kernels): a layer norm, GELU, a scaled softmax
    h = F.gelu(F.layer_norm(x @ m, x.shape[-1:], w, b))
    return torch.softmax(h * 0.5, -1) @ m


def _two_blocks(x, w1, b1, m1, w2, b2, m2):
    return _block(_block(x, w1, b1, m1), w2, b2, m2)


SHAPES = [(64, 96), (96,), (96,), (96, 96), (96,), (96,), (96, 96)]


def test_a_repeated_block_is_analysed_once_and_gets_its_own_answers(monkeypatch):
    g = graph_of(_two_blocks, *[torch.randn(*s) for s in SHAPES])
    probes.forget()
    before = dict(probes.STATS)
    plan = build_plan(g)
    asked = probes.STATS["asked"] - before["asked"]
    analysed = probes.STATS["analysed"] - before["analysed"]
    assert asked > 0 and analysed < asked, (asked, analysed)
    # a kept answer, renumbered, is what the kernel's own analysis gives
    checked = 0
    for k in plan.kernels:
        if k.combine_of:
            continue
        expected = triton_kernel.access_offsets(g, k)
        n = probes.STATS["analysed"]
        assert probes.access_offsets(g, k) == expected
        assert probes.STATS["analysed"] == n   # (answered from memory: planning asked already)
        checked += 1
    assert checked >= 2
    # and the plan is the one planned without the memory
    probes.forget()
    monkeypatch.setattr(probes, "_keep", lambda key, answer: None)
    again = build_plan(g)
    assert [(k.members, k.mapping, k.outputs) for k in again.kernels] == \
        [(k.members, k.mapping, k.outputs) for k in plan.kernels]


def test_a_refusal_is_kept_and_raised_again_for_the_same_content(monkeypatch):
    g = graph_of(_two_blocks, *[torch.randn(*s) for s in SHAPES])
    plan = build_plan(g)
    k = next(k for k in plan.kernels if k.dominant and len(k.members) > 1)
    probes.forget()
    calls = []

    def refuse(g, k):
        calls.append(k.name)
        raise ix.IndexMismatch("stand-in refusal")
    monkeypatch.setattr(triton_kernel, "access_offsets", refuse)
    assert probes.index_mismatch(g, k) and probes.index_mismatch(g, k)
    with pytest.raises(ix.IndexMismatch, match="stand-in refusal"):
        probes.load_offsets(g, k)
    assert calls == [k.name]
    # another knob value of code generation is another key
    from stitchml import config
    with config.override(loop_block_cols=1024):
        assert probes.index_mismatch(g, k)
    assert len(calls) == 2
    probes.forget()
