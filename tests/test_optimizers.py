"""Compiled optimizer steps (`torch.compile(opt.step)`, gradient clipping): the
multi-tensor `_foreach_*` ops split per tensor (capture/decomp_foreach.py) and the new
parameters and moments written into the caller's tensors by the kernels that compute
them (plan/in_place.py).  Each step is judged against the same optimizer run eagerly on
a copy, over several steps with fresh random gradients; the compiled side runs in
strict mode (an op left to eager raises)."""
import copy
import dataclasses

import pytest
import torch
import torch.nn.functional as F

from stitchml import config
from stitchml.capture.backend import StitchBackend
from stitchml.capture.decomp_foreach import table as foreach_table
from stitchml.plan.data import LaunchGroup
from stitchml.plan.in_place import in_place_writes

OPTIMIZERS = {
    "adamw": lambda ps: torch.optim.AdamW(ps, lr=1e-2, weight_decay=0.1, foreach=True),
    "adam_amsgrad": lambda ps: torch.optim.Adam(ps, lr=1e-2, amsgrad=True, foreach=True),
    "sgd_nesterov": lambda ps: torch.optim.SGD(ps, lr=1e-2, momentum=0.9, nesterov=True, weight_decay=1e-4,
                                               foreach=True),
    "rmsprop_centered": lambda ps: torch.optim.RMSprop(ps, lr=1e-3, momentum=0.5, centered=True, foreach=True),
}
SHAPES = [(48, 32), (32,), (32, 48), (48,)]


def _params(seed: int) -> list[torch.nn.Parameter]:
    g = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(s, generator=g)) for s in SHAPES]


def _state_tensors(opt: torch.optim.Optimizer) -> list[torch.Tensor]:
    return [v for p in opt.param_groups[0]["params"] for _, v in sorted(opt.state[p].items())
            if isinstance(v, torch.Tensor)]


def _run(name: str, clip: bool, steps: int = 3):
    """(eager parameters and states, compiled ones, the backend, the compiled side's
    tensors' addresses before and after) after `steps` steps on the same gradients."""
    eager_ps, mine_ps = _params(0), _params(0)
    eager_opt, mine_opt = OPTIMIZERS[name](eager_ps), OPTIMIZERS[name](mine_ps)
    backend = StitchBackend()

    def step():
        if clip:
            torch.nn.utils.clip_grad_norm_(mine_ps, 0.5, foreach=True)
        mine_opt.step()

    compiled = torch.compile(step, backend=backend)
    g = torch.Generator().manual_seed(1)
    addresses = []
    for _ in range(steps):
        for a, b in zip(eager_ps, mine_ps):
            a.grad = torch.randn(a.shape, generator=g)
            b.grad = a.grad.clone()
        if clip:
            torch.nn.utils.clip_grad_norm_(eager_ps, 0.5, foreach=True)
        eager_opt.step()
        addresses.append([t.data_ptr() for t in mine_ps + _state_tensors(mine_opt)])
        with config.override(strict=True, fallback_on_error=False):
            compiled()
    addresses.append([t.data_ptr() for t in mine_ps + _state_tensors(mine_opt)])
    return (eager_ps + _state_tensors(eager_opt), mine_ps + _state_tensors(mine_opt), backend, addresses)


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_compiled_optimizer_step_matches_eager_and_writes_in_place(name):
    torch._dynamo.reset()
    eager, mine, backend, addresses = _run(name, clip=(name == "adamw"))
    assert len(eager) == len(mine) > len(SHAPES)
    for a, b in zip(eager, mine):
        torch.testing.assert_close(b.detach(), a.detach(), rtol=2e-5, atol=2e-6)
    # the caller's tensors were updated where they live (after the step that made the
    # optimizer's state, every later step keeps every address)
    assert addresses[1] == addresses[-1]
    graphs = [r for r in backend.records if r.plan is not None]
    writes = [(r, pos, new) for r in graphs for pos, new in r.plan.graph.written()]
    assert writes, "the step wrote no graph input"
    assert all(not r.plan.graph.fallbacks for r in graphs)
    # every parameter and moment is overwritten by the kernel that computes it; only 0-d
    # values (step counters, read by every parameter's kernel) may be copied after the call
    copied = [(pos, r.plan.in_place[new]) for r, pos, new in writes if r.plan.in_place[new] is not None]
    assert all(r.plan.in_place[new] is None for r, pos, new in writes if r.plan.graph[new].numel > 1), copied
    # the element-wise update of the four tensors: few kernels (one per tensor shape at
    # most, plus the scalar bias corrections and the clipping's norms)
    last = graphs[-1].plan
    assert last.num_kernels <= len(SHAPES) + 3, last.num_kernels
    # ... and the wrapper copies nothing else after the kernels, in one call at most
    for r in graphs:
        n = sum(1 for _, new in r.plan.graph.written() if r.plan.in_place[new] is not None)
        assert r.wrapper_source.count("copy_(") == (n > 0), r.wrapper_source
        assert n < 2 or "torch._foreach_copy_([" in r.wrapper_source


def test_every_foreach_op_splits_per_tensor_and_matches_eager():
    """One graph applying every functional `_foreach_*` overload of the table (lists of
    three tensors of different shapes) against eager's multi-tensor kernels."""
    torch._dynamo.reset()
    aten = torch.ops.aten
    g = torch.Generator().manual_seed(3)
    xs = [torch.rand(s, generator=g) + 0.5 for s in [(5, 7), (3,), (2, 3, 4)]]
    ys = [torch.rand(x.shape, generator=g) + 0.5 for x in xs]
    zs = [torch.rand(x.shape, generator=g) + 0.5 for x in xs]
    scalars = [0.5, 2.0, -1.5]

    def calls(x, y, z):
        out = []
        for op in foreach_table():
            schema, name = op._schema, op._schema.name[len("aten::_foreach_"):]
            if name in ("mm", "copy", "zero", "clone"):
                continue
            args, kwargs = [], {}
            for i, a in enumerate(schema.arguments):
                k = str(a.type)
                if a.kwarg_only:
                    kwargs[a.name] = 0.5   # (alpha=)
                    continue
                if k == "List[Tensor]":
                    args.append([x, y, z][i % 3])
                elif k in ("List[number]", "List[Scalar]"):
                    args.append(scalars)
                elif k == "Tensor":
                    args.append(torch.tensor([0.25, 0.5, 2.0]) if schema.overload_name == "Tensor"
                                and name in ("addcmul", "addcdiv") else torch.tensor(0.75))
                elif k == "number" or k == "Scalar":
                    args.append(2.0 if name not in ("pow",) or i else 1.5)
                elif k.startswith("Optional") or k == "int?" or "ScalarType" in k:
                    args.append(None)
                else:
                    raise AssertionError(f"{schema}: argument type {k}")
            out.extend(op(*args, **kwargs))
        out.extend(aten._foreach_copy.default(x, y))
        out.extend(aten._foreach_zero.default(x))
        out.extend(aten._foreach_clone.default(z))
        return out

    expected = calls(xs, ys, zs)
    backend = StitchBackend()
    with config.override(strict=True, fallback_on_error=False):
        got = torch.compile(lambda *a: calls(*a), backend=backend)(xs, ys, zs)
    assert len(got) == len(expected) > 150
    for e, a in zip(expected, got):
        torch.testing.assert_close(a, e, rtol=1e-5, atol=1e-6, equal_nan=True)
    assert all(not r.plan.graph.fallbacks for r in backend.records if r.plan is not None)


def _compiled(fn, *inputs, **knobs):
    """The record of the one graph `fn` compiles to, after one call on `inputs`."""
    backend = StitchBackend()
    with config.override(fallback_on_error=False, **knobs):
        torch.compile(fn, backend=backend)(*inputs)
    return next(r for r in backend.records if r.plan is not None)


def _plan_of_compiled(fn, *inputs):
    return _compiled(fn, *inputs).plan


def test_in_place_write_refused_where_an_old_element_is_read_after_its_overwrite():
    """`x.copy_(x.flip(0) * 2)`: the kernel reads x at another element than it writes,
    so its new value goes to its own buffer and is copied into x after the call; an
    element-wise update of x is written straight into x."""
    torch._dynamo.reset()
    x0 = torch.randn(64, 33)

    def flipped(x):
        with torch.no_grad():
            x.copy_(x.flip(0) * 2)

    def scaled(x):
        with torch.no_grad():
            x.mul_(2).add_(1)

    for fn, in_place in ((flipped, False), (scaled, True)):
        torch._dynamo.reset()
        x, ref = x0.clone(), x0.clone()
        fn(ref)
        rec = _compiled(fn, x)
        plan = rec.plan
        torch.testing.assert_close(x, ref)
        assert ("a0.copy_(" in rec.wrapper_source) != in_place
        [(pos, new)] = plan.graph.written()
        assert (plan.in_place[new] is None) == in_place, plan.in_place
        if not in_place:
            assert "other than element-wise" in plan.in_place[new] or "reads it in" in plan.in_place[new]
        # the decision is the plan's, recomputed from plain data
        assert in_place_writes(plan) == plan.in_place


def test_an_input_read_in_a_combines_epilogue_is_not_overwritten_before_it():
    """Fuzz seed 28251: a statistic written into an input in place, and a softmax over that
    statistic divided by a function of the input's old value.  The division is in the
    epilogue of the combine that finishes the softmax's sum, launched after the kernel that
    writes the statistic: the epilogue is a reader of the old value, so the write is
    refused (copied after the call) and the output matches eager; it was written in place
    and the epilogue read the new value (error 0.32)."""
    torch._dynamo.reset()

    def fn(a3, a4):
        v15 = (a3 / 3.0).transpose(1, 0).var(0, correction=0, keepdim=True)
        v17 = torch.softmax(v15, 0) / (1 + a4 * a4)
        a4.copy_(v15.clone())
        return v17

    a3, a4 = torch.randn(1, 64), torch.randn(1, 1) + 2.0
    ref_a4 = a4.clone()
    want = fn(a3.clone(), ref_a4)
    backend = StitchBackend()
    with config.override(fallback_on_error=False):
        out = torch.compile(fn, backend=backend)(a3, a4)
    torch.testing.assert_close(out, want)
    torch.testing.assert_close(a4, ref_a4)
    plan = next(r for r in backend.records if r.plan is not None).plan
    [(pos, new)] = plan.graph.written()
    x = plan.graph.inputs[pos]
    readers = [k for k in plan.kernels if k.combine_of and k.epilogue and x in k.inputs]
    assert readers, [(k.name, k.epilogue, k.inputs) for k in plan.kernels]
    # (after the writer, or in its launch: both orders read the new value)
    reason = plan.in_place[new]
    assert reason is not None and any(f"kernel {k.name} reads it" in reason for k in readers), plan.in_place
    assert in_place_writes(plan) == plan.in_place


def test_an_input_read_for_a_mirrored_element_is_not_overwritten_in_place():
    """Fuzz seed 29842: `x.copy_(erf(x).flip(0))` beside a reduction of the same value, in
    one kernel of three programs of four rows (knob block_elems=32).  The kernel reads x
    element-wise into erf, but each new element comes from the erf of the mirrored row,
    which another program may already have overwritten: the write is refused (copied after
    the call), with the reason, and the results match eager (they did not: error 0.47)."""
    torch._dynamo.reset()

    def fn(x):
        v = torch.erf(x).flip(0)
        out = torch.sigmoid(v) * v.amax(-1, keepdim=True)
        x.copy_(v.clone())
        return out

    x0 = torch.randn(9, 6)
    ref_x = x0.clone()
    want = fn(ref_x)
    x = x0.clone()
    backend = StitchBackend()
    with config.override(fallback_on_error=False, block_elems=32):
        out = torch.compile(fn, backend=backend)(x)
    torch.testing.assert_close(out, want)
    torch.testing.assert_close(x, ref_x)
    plan = next(r for r in backend.records if r.plan is not None).plan
    [(pos, new)] = plan.graph.written()
    assert len(plan.kernels) == 1 and plan.kernels[0].mapping.grid > 1   # (programs that race)
    assert "at other elements than it writes" in (plan.in_place[new] or ""), plan.in_place
    assert in_place_writes(plan) == plan.in_place


def test_an_input_copied_into_itself_rotated_is_not_overwritten_in_place():
    """Fuzz seed 32227 (reduced): `a2.copy_(v1)` with v1 = cat([a2[1:3], a2[0:1]]), a
    rotation of a2 by a row that a stack also reads; the planner evaluates the cat where
    it is read, so the copy's kernel (two programs of 128 elements, knob pointwise_block)
    loaded a2 rotated while writing it in place: the second program read rows the first
    had overwritten (error 3.2).  The write is refused with the reason; a2 matches eager."""
    torch._dynamo.reset()

    def fn(a0, a2, a3, a4):
        v1 = torch.cat([a2.narrow(0, 1, 2), a2.narrow(0, 0, 1)], 0)
        v3 = torch.stack([v1, v1], 2).reshape((24, 2, 8))
        v7 = torch.minimum(torch.relu(a3), a4)
        v9 = torch.cat([v7.narrow(1, 1, 1), v7.narrow(1, 0, 1)], 1)
        a2.copy_(v1.clone())
        a4.copy_(v7.clone())
        return v7.reshape(96), F.log_softmax(a0, dim=-3), v3.reshape(384), v9 + a3.var((0, 1, 2))

    ins = [torch.randn(1, 5, 127, 1), torch.randn(3, 64, 1), torch.randn(2, 2, 8),
           torch.randn(8, 2, 2, 3).permute(3, 1, 2, 0)]
    ref = [t.clone() for t in ins]
    want = fn(*ref)
    got_in = [t.clone() for t in ins]
    backend = StitchBackend()
    with config.override(fallback_on_error=False, pointwise_block=128, loop_block_cols=8, horizontal_fusion=False,
                         ilp=False):
        got = torch.compile(fn, backend=backend)(*got_in)
    for a, b in zip(got_in + list(got), ref + list(want)):
        torch.testing.assert_close(a, b)
    plan = next(r for r in backend.records if r.plan is not None).plan
    reasons = [v for v in plan.in_place.values() if v]
    assert any("reads it at other elements than it writes" in v for v in reasons), plan.in_place
    assert in_place_writes(plan) == plan.in_place


def test_input_read_by_another_kernel_is_overwritten_only_after_it():
    """The old x is read by a column-sum kernel and a new x is written by another: the
    write goes straight into x because the sum's kernel launches first (poisoned
    buffers, the sum of the old values); with the writer moved before the reader, or
    into its launch, the plan's decision is a copy after the call."""
    torch._dynamo.reset()
    x0 = torch.randn(128, 96)

    def fn(x):
        with torch.no_grad():
            s = x.sum(0)
            x.mul_(3)
            return s * 2

    x, ref = x0.clone(), x0.clone()
    expected = fn(ref)
    plan = _plan_of_compiled(fn, x)
    x2 = x0.clone()
    backend = StitchBackend()
    torch._dynamo.reset()
    with config.override(fallback_on_error=False, poison_outputs=True):
        out = torch.compile(fn, backend=backend)(x2)
    torch.testing.assert_close(out, expected)
    torch.testing.assert_close(x2, ref)
    torch.testing.assert_close(x, ref)
    [(pos, new)] = plan.graph.written()
    assert plan.in_place[new] is None, plan.in_place
    writer = next(k for k in plan.kernels if new in k.outputs)
    reader = next(k for k in plan.kernels if k.partials)
    steps = list(plan.steps)
    i, j = steps.index(reader), steps.index(writer)
    assert i < j
    steps[i], steps[j] = writer, reader
    swapped = dataclasses.replace(plan, steps=steps, groups=[])
    assert "reads it after" in in_place_writes(swapped)[new]
    together = dataclasses.replace(plan, groups=[LaunchGroup("g9", "horizontal", (reader.name, writer.name), 2)])
    assert "in the same launch" in in_place_writes(together)[new]


def test_a_computed_scalar_broadcast_over_a_large_tensor_is_not_one_program():
    """`x * s.exp()` with a 0-d `s` (a learned temperature; an optimizer's bias
    correction): planned on an H200, the exp is not stitched into a one-row kernel that a
    single program walks (2 ms predicted for 16 MB) but written by its own kernel and read
    as a broadcast by a point-wise kernel over the whole grid."""
    from planning import plan_of

    with config.override(device="H200"):
        plan = plan_of(lambda x, s: x * s.exp(), torch.empty(4096, 1024), torch.empty(()))
    big = [k for k in plan.kernels if k.domain.rows * k.domain.cols == 4096 * 1024]
    assert len(big) == 1 and big[0].mapping.grid >= 132, [k.mapping.describe() for k in plan.kernels]
    assert plan.predicted_s < 50e-6, plan.predicted_s
    assert any("too few rows to spread" in r.reason for r in plan.refusals)


def test_a_kernel_reading_the_input_for_another_value_copies_the_new_one():
    """`y = x + z` and `x = z * 3` share a kernel (both read z): the load of x for y is
    not one the store of x's new value depends on, so nothing orders it before that
    store; the new value goes to its own buffer and is copied into x after the call."""
    torch._dynamo.reset()
    x0, z = torch.randn(64, 40), torch.randn(64, 40)

    def fn(x, z):
        with torch.no_grad():
            y = x + z
            x.copy_(z * 3)
            return y

    x, ref = x0.clone(), x0.clone()
    expected = fn(ref, z)
    backend = StitchBackend()
    with config.override(fallback_on_error=False, poison_outputs=True):
        out = torch.compile(fn, backend=backend)(x, z)
    torch.testing.assert_close(out, expected)
    torch.testing.assert_close(x, ref)
    plan = next(r.plan for r in backend.records if r.plan is not None)
    [(pos, new)] = plan.graph.written()
    assert plan.num_kernels == 1 and "for another value" in plan.in_place[new], plan.in_place


def test_rows_walked_in_several_passes_are_not_overwritten_in_place():
    """A row longer than the chip holds (here: more than `persistent_max_cols` = 64) is
    walked once for its mean and again for the output: the kernel form is not one the
    rule trusts (one pass a row), so the new value is copied into x after the call."""
    torch._dynamo.reset()
    x0 = torch.randn(8, 256)

    def fn(x):
        with torch.no_grad():
            x.sub_(x.mean(-1, keepdim=True))

    x, ref = x0.clone(), x0.clone()
    fn(ref)
    rec = _compiled(fn, x, persistent_max_cols=64)
    torch.testing.assert_close(x, ref, rtol=1e-5, atol=1e-5)
    [(pos, new)] = rec.plan.graph.written()
    writer = next(k for k in rec.plan.kernels if new in k.outputs)
    assert writer.mapping.form == "row_looped" and "row_looped" in rec.plan.in_place[new], rec.plan.in_place


def test_batch_norm_running_statistics_are_updated_in_place_by_the_combine():
    """A batch norm in training mode (here under `no_grad`: an inference graph) over a
    channels-last batch, planned for an H200: the running mean and variance are updated
    by the epilogue of the combine that finishes the channel statistics, one program a
    channel, straight into the module's buffers (AOTAutograd copied them back after the
    call, one launch per buffer: 159 for ResNet-50)."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    bn = torch.nn.BatchNorm2d(16).train()
    mine = copy.deepcopy(bn)
    x = torch.randn(8, 16, 12, 12).to(memory_format=torch.channels_last)
    for m in (bn, mine):   # (not the default statistics: the update reads them)
        m.running_mean.uniform_(-1, 1)
        m.running_var.uniform_(0.5, 2.0)
    mine.load_state_dict(bn.state_dict())
    expected = bn(x)
    backend = StitchBackend()
    buffers = [t.data_ptr() for t in (mine.running_mean, mine.running_var)]
    with torch.no_grad(), config.override(strict=True, fallback_on_error=False, device="H200"):
        out = torch.compile(mine, backend=backend)(x)
    torch.testing.assert_close(out, expected.detach(), rtol=1e-4, atol=1e-4)
    for a, b in ((mine.running_mean, bn.running_mean), (mine.running_var, bn.running_var),
                 (mine.num_batches_tracked, bn.num_batches_tracked)):
        torch.testing.assert_close(a, b)
    assert [t.data_ptr() for t in (mine.running_mean, mine.running_var)] == buffers
    plan = backend.records[0].plan
    written = plan.graph.written()
    assert len(written) == 3 and all(plan.in_place[n] is None for _, n in written), plan.in_place
    combines = [k for k in plan.kernels if k.combine_of and any(n in k.epilogue for _, n in written)]
    assert combines and ".copy_(" not in backend.records[0].wrapper_source


def test_a_strided_input_is_written_where_its_elements_live():
    """An input that is a strided slice (gaps between its elements) is updated in place
    by its kernel, with the slice's strides; the elements between are untouched."""
    torch._dynamo.reset()

    def fn(x, y):
        with torch.no_grad():
            x.mul_(2).add_(y)

    base, y = torch.randn(6, 10), torch.randn(6, 5)
    ref = base.clone()
    fn(ref[:, ::2], y)
    backend = StitchBackend()
    with config.override(strict=True, fallback_on_error=False):
        torch.compile(fn, backend=backend)(base[:, ::2], y)
    torch.testing.assert_close(base, ref)
    plan = backend.records[0].plan
    [(pos, new)] = plan.graph.written()
    assert plan.in_place[new] is None and plan.graph[new].stride == (10, 2)


def test_tensor_learning_rate_under_a_scheduler_compiles_once():
    """PyTorch's advice for compiled optimizers: the learning rate as a tensor (with
    `capturable=True`), so a scheduler's new rate recompiles nothing.  Four steps of a
    decaying rate, one graph, no eager op, against eager's float-rate AdamW."""
    torch._dynamo.reset()
    eager_ps, mine_ps = _params(0), _params(0)
    eager_opt = torch.optim.AdamW(eager_ps, lr=0.01, foreach=True)
    mine_opt = torch.optim.AdamW(mine_ps, lr=torch.tensor(0.01), foreach=True, capturable=True)
    scheds = [torch.optim.lr_scheduler.LambdaLR(o, lambda e: 0.9 ** e) for o in (eager_opt, mine_opt)]
    backend = StitchBackend()
    compiled = torch.compile(lambda: mine_opt.step(), backend=backend)
    g = torch.Generator().manual_seed(1)
    with config.override(strict=True, fallback_on_error=False):
        for _ in range(4):
            for a, b in zip(eager_ps, mine_ps):
                a.grad = torch.randn(a.shape, generator=g)
                b.grad = a.grad.clone()
            eager_opt.step()
            compiled()
            for s in scheds:
                s.step()
    for a, b in zip(eager_ps, mine_ps):
        torch.testing.assert_close(b.detach(), a.detach(), rtol=2e-5, atol=2e-6)
    assert len(backend.records) == 1 and not backend.records[0].plan.graph.fallbacks


def test_explain_and_its_html_page_say_which_inputs_were_overwritten():
    """The text report lists the inputs the kernels overwrote and, for each input copied
    after the call, why; the HTML page has the same in a table."""
    import stitchml
    from stitchml.tools.report_html import build_html
    torch._dynamo.reset()

    def fn(x, y):
        with torch.no_grad():
            x.mul_(2).add_(1)
            y.copy_(y.flip(0) * 2)

    report = stitchml.explain(fn, torch.randn(8, 6), torch.randn(8, 6))
    text = report.to_text()
    assert "graph inputs overwritten by the kernels computing their new values (1): 0" in text, text
    assert "graph input 1: new value copied into it after the call: kernel" in text, text
    html = build_html(report)
    assert "Graph inputs written" in html and "overwritten by the kernel computing it" in html
    assert "copied into it after the call: kernel" in html


def test_independent_large_updates_share_one_launch_on_a_wide_grid():
    """Updates of equally shaped parameters that are not launch-bound (H200: 28 MB, over
    6 us each) are neither merged into one kernel's body (serial bodies ran at 25-60% of
    copy bandwidth) nor launched one by one: one horizontal launch runs them all as one
    grid (`launches.wide_horizontal`), each still written in place, matching eager."""
    torch._dynamo.reset()
    gen = torch.Generator().manual_seed(7)
    shape = (3072, 768)
    # (small vectors between the large weights, as in a model's parameter list: the large
    # updates move past the small ones' kernels to launch together)
    shapes = [shape, (768,), shape, (768,), shape]
    ps = [torch.randn(s, generator=gen) for s in shapes]
    gs = [torch.randn(s, generator=gen) for s in shapes]
    want = [p * 0.9 + 0.1 * g for p, g in zip(ps, gs)]
    addresses = [p.data_ptr() for p in ps]

    def step(ps, gs):
        torch._foreach_mul_(ps, 0.9)
        torch._foreach_add_(ps, gs, alpha=0.1)

    backend = StitchBackend()
    with config.override(device="H200", strict=True, fallback_on_error=False):
        torch.compile(step, backend=backend)(ps, gs)
    for p, w in zip(ps, want):
        torch.testing.assert_close(p, w, rtol=1e-6, atol=1e-6)
    assert [p.data_ptr() for p in ps] == addresses
    (rec,) = [r for r in backend.records if r.plan is not None]
    plan = rec.plan
    assert all(v is None for v in plan.in_place.values()) and len(plan.in_place) == 5
    kernels = [k for k in plan.kernels if k.domain.rows * k.domain.cols == shape[0] * shape[1]]
    assert len(kernels) == 3 and all(len(k.outputs) == 1 for k in kernels)   # one body a kernel
    (grp,) = [g for g in plan.groups if set(g.members) == {k.name for k in kernels}]
    assert grp.kind == "horizontal" and plan.num_kernels <= 3
    assert "independent point-wise kernels" in grp.reason


def test_a_wide_launch_never_holds_a_reader_of_an_input_another_member_overwrites():
    """`b` is updated from the old `a` while `a` is overwritten: in one launch the two
    bodies run side by side and `b` could read new elements of `a`.  The two kernels are
    not grouped, and both results match eager."""
    torch._dynamo.reset()
    gen = torch.Generator().manual_seed(8)
    shape = (3072, 768)
    a, b, g, h = (torch.randn(shape, generator=gen) for _ in range(4))
    want_a, want_b = g * 0.9 + h, b + a * 0.1

    def step(a, b, g, h):
        new_a = g * 0.9 + h       # (a new value that does not read `a`: no common read to merge on)
        b.copy_(b + a * 0.1)
        a.copy_(new_a)

    backend = StitchBackend()
    with config.override(device="H200", strict=True, fallback_on_error=False):
        torch.compile(step, backend=backend)(a, b, g, h)
    torch.testing.assert_close(a, want_a, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(b, want_b, rtol=1e-6, atol=1e-6)
    (rec,) = [r for r in backend.records if r.plan is not None]
    plan = rec.plan
    big = {k.name for k in plan.kernels if k.domain.rows * k.domain.cols == shape[0] * shape[1]}
    assert len(big) == 2
    assert not any(len(big & set(grp.members)) == 2 for grp in plan.groups), plan.groups
    # (`a` is copied after the call: the rule order runs its writer before b's kernel, a
    # reader launched after it; a reordering that would write it in place is not done yet)
    assert sum(v is None for v in plan.in_place.values()) >= 1, plan.in_place
