"""Issue 18.7: the op table.  An op docs/OPS.md lists as stitched must still be
stitched (a rule or a decomposition), so a lost rule fails here, not silently in a
user's model; and the table is what `stitchml ops` prints."""
from pathlib import Path

from stitchml.tools import opstable

ROOT = Path(__file__).resolve().parents[1]


def test_no_op_moved_from_stitched_to_eager():
    listed = opstable.stitched_in_doc((ROOT / "docs" / "OPS.md").read_text())
    assert len(listed) > 100
    now = {r.op: r for r in opstable.rows()}
    moved = sorted(f"{op}: now {now[op].status} ({now[op].how})" if op in now else f"{op}: gone"
                   for op in listed if op not in now or now[op].status != opstable.STITCHED)
    assert not moved, moved


def test_issue_18_ops_are_stitched_and_library_ops_say_why():
    import torch
    aten = torch.ops.aten
    for op in (aten.avg_pool2d.default, aten.max_pool2d_with_indices.default, aten.native_group_norm.default,
               aten.flip.default, aten.index_put.default, aten.scatter_add.default, aten.cumsum.default,
               aten.slice_scatter.default, aten.reflection_pad2d.default, aten.upsample_nearest2d.default,
               aten.histc.default, aten._unsafe_index.Tensor, aten.all.dim, aten.scatter.src,
               aten.index_copy.default, aten.index_fill.int_Scalar, aten.cumprod.default, aten.logcumsumexp.default,
               aten.masked_scatter.default, aten._embedding_bag.default, aten._cdist_forward.default,
               aten._pdist_forward.default, aten.grid_sampler_2d.default):
        row = opstable.classify(op)
        assert row.status == opstable.STITCHED, row
    assert opstable.classify(aten.sort.default).status == opstable.LIBRARY
    assert "sort" in opstable.classify(aten.sort.default).how
    assert opstable.classify(aten.mm.default).status == opstable.LIBRARY
    assert opstable.classify(aten.randperm.default).status == opstable.LIBRARY
    assert opstable.classify(aten._fft_r2c.default).status == opstable.LIBRARY


def test_cli_ops_prints_the_table(capsys):
    from stitchml.cli import main
    assert main(["ops"]) == 0
    assert "| `aten.flip.default` | stitched | rules_window |" in capsys.readouterr().out


def test_math_ops_and_var_dim_are_stitched_and_runtime_checks_are_library_ops():
    import torch
    from stitchml import config
    from stitchml.fallback import NO_RULE, no_rule_reason
    aten = torch.ops.aten
    for op in (aten.acos.default, aten.acosh.default, aten.asin.default, aten.asinh.default, aten.atan.default,
               aten.atan2.default, aten.atanh.default, aten.sinh.default, aten.cosh.default, aten.tan.default,
               aten.log10.default, aten.fmod.Tensor, aten.fmod.Scalar, aten.var.dim):
        row = opstable.classify(op)
        assert row.status == opstable.STITCHED, row
    assert "var.correction" in opstable.classify(aten.var.dim).how
    # (not core ATen ops, so not in the table: they have rules)
    from stitchml.lower.registry import RULES
    for op in (aten.bitwise_left_shift.Tensor, aten.bitwise_right_shift.Tensor_Scalar, aten.__lshift__.Scalar,
               aten.__rshift__.Tensor):
        assert op in RULES, op
    with config.override(strict=True):  # F.one_hot's checks: a library op with its reason, never a strict error
        reason = no_rule_reason(aten._assert_async.msg)
    assert reason != NO_RULE and "runtime check" in reason
