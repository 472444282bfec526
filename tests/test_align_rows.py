"""Row-looped kernels over rows whose stride is not a multiple of 16 bytes start each
row's whole column blocks at the row's first 16-byte boundary (`KernelPlan.row_align`,
knob `align_rows`): the aligned start is hinted to Triton (`tl.multiple_of`), and the
row's head (the columns before the boundary) and tail are walked in one masked loop
after the whole blocks.  Every looped construct against eager on fresh random inputs,
outputs poisoned (tests/conftest.py), with values placed in the head and the tail; the
sm_90 accesses are checked in tests/test_aot_gpu.py."""
import sys

import pytest
import torch
import torch.nn.functional as F

from stitchml import config
from stitchml.codegen import generate_all
from stitchml.plan.devices import DEVICES, Device
from stitchml.testing import compare_against_float64, compare_with_eager

sys.path.insert(0, "tests")
from planning import plan_of  # noqa: E402

ODD = 8195          # > persistent_max_cols: looped in blocks of 2048, row r starts r * 8195 elements in


def _aligned(c) -> list:
    """The kernels with an anchor among `c`'s plans, each one's hints checked."""
    out = []
    for r in c.backend.records:
        sources = generate_all(r.plan.graph, r.plan)
        for k in r.plan.kernels:
            if k.row_align:
                _check_hints(sources[k.name].source, k.domain.rows)
                out.append(k)
    return out


class _Tl:
    """The names the hint lines use, for evaluating them in Python."""
    def __init__(self, row: int):
        self.row = row

    def program_id(self, axis: int) -> int:
        return self.row

    @staticmethod
    def multiple_of(x: int, vec: int) -> int:
        return x


def _check_hints(source: str, rows: int) -> None:
    """Evaluate a kernel's `lead = ...` and `arowN = tl.multiple_of(x, vec)` lines for
    every row (one row a program or a walk's step): each x a multiple of vec, and lead
    within a vector.  Triton takes the hint on trust and the interpreter ignores it."""
    lines = [ln.strip() for ln in source.splitlines()]
    lead = next(ln.split(" = ", 1)[1] for ln in lines if ln.startswith("lead = "))
    hints = [ln.split(" = ", 1)[1] for ln in lines if ln.startswith("arow")]
    assert hints and all(h.startswith("tl.multiple_of(") for h in hints), hints
    for row in range(rows):
        env = {"tl": _Tl(row), "rblk": row}   # (a persistent walk: the row is its loop variable)
        env["lead"] = eval(lead, env)
        assert 0 <= env["lead"] < 16
        for h in hints:
            x, vec = eval(h[len("tl.multiple_of"):], env)
            assert x % vec == 0, (row, h, x, vec)


def test_odd_strides_get_an_anchor_and_aligned_strides_do_not():
    plan = plan_of(lambda x: torch.softmax(x.float(), -1), torch.randn(4, ODD, dtype=torch.bfloat16))
    (k,) = [k for k in plan.kernels if k.mapping.form == "row_looped"]
    # the bfloat16 read anchors (8 elements a vector): the float32 store (4) is congruent to it
    assert k.row_align == (ODD, 0, 8), k.row_align
    src = generate_all(plan.graph, plan)[k.name].source
    assert src.count("tl.multiple_of(") == 2 and "+ crel)" in src and "cflat = tl.where(cq < lead" in src, src
    # 8200 bfloat16 values a row: every row starts on a 16-byte boundary, nothing to shift
    (k,) = [k for k in plan_of(lambda x: torch.softmax(x.float(), -1),
                               torch.randn(4, 8200, dtype=torch.bfloat16)).kernels if k.mapping.form == "row_looped"]
    assert k.column_tail and not k.row_align
    with config.override(align_rows=False):
        plan = plan_of(lambda x: torch.softmax(x.float(), -1), torch.randn(4, ODD, dtype=torch.bfloat16))
    assert not any(k.row_align for k in plan.kernels)
    assert "multiple_of" not in "".join(s.source for s in generate_all(plan.graph, plan).values())


def test_a_shift_that_would_unalign_more_bytes_than_it_aligns_is_not_taken():
    """Rows of 8195 read from a buffer of 8200-wide rows (aligned) and written to a
    contiguous one (not): aligning the store would unalign the larger read pair."""
    wide = torch.randn(4, 8200)
    other = torch.randn(4, 8200)
    fn = lambda a, b: torch.softmax(a[:, :ODD] + b[:, :ODD], -1)   # noqa: E731
    (k,) = [k for k in plan_of(fn, wide, other).kernels if k.mapping.form == "row_looped"]
    assert k.column_tail and not k.row_align
    # one aligned read against an unaligned read and store: shifted
    fn = lambda a, b: torch.softmax(a[:, :ODD] + b, -1)   # noqa: E731
    (k,) = [k for k in plan_of(fn, wide, torch.randn(4, ODD)).kernels if k.mapping.form == "row_looped"]
    assert k.row_align == (ODD, 0, 4), k.row_align
    c = compare_with_eager(fn, [wide, torch.randn(4, ODD)], backward=False)
    assert _aligned(c)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_log_softmax_and_cross_entropy_forward_and_backward_match_eager(dtype):
    # (the looped form is what these cover: bfloat16 rows this long are otherwise held whole,
    # knob `persistent_long_rows`, which tests/test_mapping.py checks against eager)
    with config.override(persistent_long_rows=False):
        x = torch.randn(2, 3, ODD).to(dtype).requires_grad_()      # rows over two dims, flattened
        c = compare_with_eager(lambda x: torch.log_softmax(x.float(), -1), [x])
        assert len(_aligned(c)) >= 2      # forward and backward
        x = torch.randn(5, ODD).to(dtype).requires_grad_()
        t = torch.randint(0, ODD, (5,))
        t[0], t[1] = 3, ODD - 1          # targets in the head and the tail of their rows
        c = compare_with_eager(lambda x, t: F.cross_entropy(x.float(), t), [x, t])
        assert _aligned(c)


def test_arg_reductions_sums_and_outputs_see_the_head_and_the_tail():
    x = torch.randn(9, ODD)
    x[1, 8193] = 50.0                       # the maximum in the tail
    x[2, 17] = 50.0                         # in a whole block
    x[3, 1] = 50.0                          # in the head (row 3 starts 3 past a boundary: lead 1)
    x[5, 0] = 50.0                          # the row's first column (lead 3)
    x[6, 0] = -50.0
    c = compare_with_eager(lambda x: (x.argmax(-1), x.argmin(-1), x.sum(-1), x - x.amax(-1, keepdim=True)),
                           [x], backward=False)
    assert _aligned(c)


def test_an_input_with_a_storage_offset_matches_eager():
    """A view starting 3 elements into its storage: its data pointer is not 16-byte
    aligned, so Triton's specialisation keeps its accesses narrow whatever the hint says
    about the offset; the result is the same."""
    base = torch.randn(4 * ODD + 5, dtype=torch.bfloat16)
    view = base[3:3 + 4 * ODD].view(4, ODD)
    c = compare_with_eager(lambda x: torch.softmax(x.float(), -1) * 2, [view], backward=False)
    assert _aligned(c)


def test_scans_keep_their_order_and_take_no_shift():
    x = torch.randn(3, 301, dtype=torch.float64)
    with config.override(persistent_max_cols=64, loop_block_cols=16):   # looped rows of 301 in blocks of 16
        plan = plan_of(lambda x: torch.cumsum(x, -1) * 2, x)
        assert all(k.column_tail and not k.row_align for k in plan.kernels if k.mapping.form == "row_looped")
        compare_with_eager(lambda x: torch.cumsum(x, -1) * 2, [x], backward=False)


# few rows (each program of the tiny device still walks more than one: row_blocks > 1 below)
ROWS_WALKED = 12


def test_persistent_row_walks_shift_each_row(monkeypatch):
    """The grid-stride walk over rows (`plan/mapping.py::persistent_looped`): each row's
    shift is computed from the row the program walks, not its program id.  Planned for
    the same small made-up device as tests/test_mapping.py, against float64."""
    monkeypatch.setitem(DEVICES, "tiny", Device("tiny", 1e11, 4, 3e-6, 2e-6, l2_bytes=256 * 1024))
    cols = 12289
    f = lambda x, w: torch.softmax(x * w, -1)   # noqa: E731
    x = torch.randn(ROWS_WALKED, cols, requires_grad=True)
    w = (torch.rand(cols) + 0.5).requires_grad_(True)
    with config.override(device="tiny"):
        plan = plan_of(f, x.detach(), w.detach())
        walk = [k for k in plan.kernels if k.mapping.form == "row_looped"]
        assert walk and all(k.mapping.row_blocks > 1 and k.row_align for k in walk), \
            [(k.mapping, k.row_align) for k in plan.kernels]
        cmp, judgement = compare_against_float64(f, [x, w])
    judgement.assert_ok()
    assert _aligned(cmp)
