"""Embedding's backward over a table much larger than its tokens (knob
`compact_embedding_grads`, `lower/rules_index.py::_embedding_backward_compact`): the
gradient is summed over rows of the tokens (each table row's last token its
representative) instead of a zeroed float32 copy of the whole table.  Against eager on
fresh random inputs with repeated and padding indices, outputs poisoned
(tests/conftest.py); the size thresholds are lowered so that the cases stay small."""
import pytest
import torch
import torch.nn.functional as F

from stitchml import config
from stitchml.ir import nodes as ir
from stitchml.lower import rules_index
from stitchml.testing import compare_with_eager


@pytest.fixture
def small_tables(monkeypatch):
    monkeypatch.setattr(rules_index, "COMPACT_MIN_SAVED_BYTES", 0)


def _scatters(c) -> list[int]:
    """Per plan of `c`: how many scatter nodes its kernels hold."""
    return [sum(1 for k in r.plan.kernels for m in k.members if r.plan.graph[m].kind == ir.SCATTER_ADD)
            for r in c.backend.records]


def _ids(shape, rows, padding):
    ids = torch.randint(0, rows, shape)
    ids.view(-1)[:5] = 7                     # one row read by five tokens
    ids.view(-1)[5:8] = rows - 1             # the last row
    if padding is not None:
        ids.view(-1)[8:11] = padding         # tokens of the padding row: no gradient there
    return ids


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("padding", [None, 3], ids=["nopad", "pad3"])
def test_compact_sums_match_eager(small_tables, dtype, padding):
    """Judged against float64 with eager's error as the yardstick: a bf16 row read by five
    tokens is summed in float32 by the kernel and rounded once; eager's bf16 sum can be
    off by more than an element-wise 2 % (a fresh-clone run: 1 of 1164 elements at 6.7 %)."""
    from stitchml.testing import compare_against_float64
    w = torch.randn(97, 12, dtype=dtype, requires_grad=True)
    ids = _ids((3, 7), 97, padding)          # 21 tokens over indices of two dims
    c, judgement = compare_against_float64(lambda w, i: F.embedding(i, w, padding_idx=padding) * 3, [w, ids])
    judgement.assert_ok(f"embedding backward, {dtype}, padding {padding}")
    assert _scatters(c) == [0, 2], _scatters(c)     # the backward: representatives, then the sums
    # each token's representative is gathered inside the kernel that adds its row
    bwd = c.backend.records[-1].plan
    assert any({bwd.graph[m].op for m in k.members} >= {"index_select", "embedding_backward"} for k in bwd.kernels)
    with config.override(compact_embedding_grads=False):
        torch._dynamo.reset()
        plain, judgement = compare_against_float64(lambda w, i: F.embedding(i, w, padding_idx=padding) * 3, [w, ids])
    judgement.assert_ok(f"embedding backward, plain form, {dtype}, padding {padding}")
    assert _scatters(plain) == [0, 1]


def test_tied_table_and_head_match_eager(small_tables):
    """GPT-2's tied weights: the table's gradient from the embedding plus the head's
    product, in bfloat16."""
    w = torch.randn(101, 16, dtype=torch.bfloat16, requires_grad=True)
    ids = _ids((2, 9), 101, None)

    def lm(w, i):
        h = torch.tanh(F.embedding(i, w).float()).to(torch.bfloat16)
        return F.cross_entropy((h @ w.t()).float().view(-1, 101), i.view(-1))
    c = compare_with_eager(lm, [w, ids])
    assert _scatters(c)[-1] == 2


def test_small_savings_keep_the_plain_form():
    """With the real threshold, a table of 97 rows saves too few bytes to pay two more
    launches: one scatter kernel, as before."""
    w = torch.randn(97, 12, requires_grad=True)
    c = compare_with_eager(lambda w, i: F.embedding(i, w) * 3, [w, _ids((3, 7), 97, None)])
    assert _scatters(c) == [0, 1]
    assert rules_index._compact_pays((50257, 768), 4096) and not rules_index._compact_pays((1024, 768), 512)
    assert not rules_index._compact_pays((30522, 768), 20000)   # fewer rows than twice the tokens


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("padding", [None, 1], ids=["nopad", "pad1"])
@pytest.mark.parametrize("rows", [2, 4])
def test_few_row_tables_sum_as_masked_columns_without_atomics(dtype, padding, rows):
    """Knob `dense_embedding_grad_rows` (`_embedding_backward_dense`): a table of a few rows
    read by many tokens (BERT's token types: 2 rows, 2048 tokens) gets its gradient as a
    column reduction of where(id == e, grad, 0), no scatter node and no atomics; judged
    against float64 (eager sums bf16 rows over 40+ tokens), with a non-contiguous gradient
    (the embedding's output used transposed).  With the knob at 0: the scatter form."""
    from stitchml.testing import compare_against_float64
    w = torch.randn(rows, 24, dtype=dtype, requires_grad=True)
    ids = torch.randint(0, rows, (6, 17))
    ids[0, :3] = rows - 1

    def f(w, i):
        return (F.embedding(i, w, padding_idx=padding).transpose(0, 1) * 3).sin()
    c, judgement = compare_against_float64(f, [w, ids])
    judgement.assert_ok(f"few-row embedding backward, {dtype}, padding {padding}")
    assert _scatters(c) == [0, 0], _scatters(c)
    bwd = c.backend.records[-1].plan
    records = c.backend.records
    assert all(r.eager_reason is None and not r.graph.fallbacks for r in records)   # nothing ran eagerly
    reduces = {m for k in bwd.kernels for m in k.members if bwd.graph[m].kind == ir.REDUCE}
    assert len(reduces) == 1 and tuple(bwd.graph[min(reduces)].shape) == (rows, 24)
    with config.override(dense_embedding_grad_rows=0):
        torch._dynamo.reset()
        plain, judgement = compare_against_float64(f, [w, ids])
    judgement.assert_ok(f"few-row embedding backward, scatter form, {dtype}, padding {padding}")
    assert _scatters(plain) == [0, 1]


def test_few_tokens_a_row_keep_the_scatter_form():
    """Under `DENSE_TOKENS_PER_ROW` tokens a table row, atomics hardly contend: the scatter
    form (one pass over the tokens) is kept."""
    assert rules_index._dense_pays((2, 768), 2048) and rules_index._dense_pays((4, 64), 32)
    assert not rules_index._dense_pays((4, 64), 31) and not rules_index._dense_pays((5, 64), 4096)
    w = torch.randn(12, 8, requires_grad=True)
    c = compare_with_eager(lambda w, i: F.embedding(i, w) * 3, [w, torch.randint(0, 12, (40,))])
    assert _scatters(c) == [0, 1]
