"""Named regression tests for bugs found after the fact."""
import warnings

import pytest
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


def test_interpreter_variable_set_after_triton_import_falls_back_instead_of_crashing():
    # Triton picks interpreter mode when it is imported; setting TRITON_INTERPRET later
    # used to make every kernel call crash.  Now the graph runs eagerly, with a reason.
    import os
    import subprocess
    import sys

    code = (
        "import os, torch, stitchml\n"
        "os.environ['TRITON_INTERPRET'] = '1'\n"
        "x = torch.randn(4, 8)\n"
        "r = stitchml.explain(lambda x: torch.softmax(x, -1), x)\n"
        "f = torch.compile(lambda x: torch.softmax(x, -1), backend='stitch')\n"
        "print(torch.allclose(f(x), torch.softmax(x, -1)), r.num_kernels, r.fallbacks[0].reason)\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    if out.returncode != 0 and "CUDA" in out.stderr:
        return
    assert out.returncode == 0, out.stderr[-2000:]
    last = out.stdout.strip().splitlines()[-1]
    assert last.startswith("True 0") and "TRITON_INTERPRET" in last


def test_merge_that_closes_a_cycle_through_another_kernel_is_refused():
    # softmax + cross-entropy backward: kernel B (the loss normaliser) read one kernel's
    # output and fed another; merging those two made B both before and after the
    # merged kernel, with no node-level path between them ("plan has a cycle")
    import torch.nn.functional as F

    from stitchml.testing import compare_with_eager

    def fn(x, t):
        return torch.autograd.grad(F.cross_entropy(x, t), x)

    x, t = torch.randn(24, 40, requires_grad=True), torch.randint(0, 40, (24,))
    cmp = compare_with_eager(fn, [x, t], backward=False)
    assert all(r.plan is not None for r in cmp.backend.records)


def test_consumer_of_a_column_reduction_never_joins_its_kernel_through_another_edge():
    # softmax over dim 0: exp feeds both the column sum and the division by it; the
    # division joined exp's kernel after the column sum had, reading a value that is
    # only complete after the combine ("reduction requested at a column-dependent index")
    from planning import plan_of
    from stitchml.codegen.triton_kernel import generate

    plan = plan_of(lambda x: torch.softmax(torch.softmax(x, -1), 0), torch.randn(96, 80))
    for k in plan.kernels:
        generate(plan.graph, k)
        for m in k.members:
            assert not set(plan.graph[m].refs) & set(k.partials) or plan.graph[m].kind == "view"


def test_cuda_graph_mode_on_cpu_falls_back_with_a_message():
    import pytest

    from stitchml import config

    if torch.cuda.is_available():
        pytest.skip("this checks the CPU fallback")
    be = stitchml.StitchBackend()
    x = torch.randn(8, 40)
    with config.override(cuda_graphs=True), pytest.warns(UserWarning, match="CUDA graphs need a CUDA device"):
        out = torch.compile(lambda x: torch.softmax(x, -1), backend=be)(x)
    torch.testing.assert_close(out, torch.softmax(x, -1))
    assert be.records[0].plan.num_kernels == 1 and "CUDA graphs" in be.records[0].cuda_graph_note


def test_column_reduction_to_a_single_element():
    # ELECTRA's Linear(hidden, 1) bias gradient: (N, 1) summed over dim 0; the combine
    # kernel stored a block through a scalar pointer
    from stitchml.testing import compare_with_eager

    for shape, dims in (((10, 1), 0), ((3, 10, 1), (0, 1))):
        torch._dynamo.reset()  # a new shape for the same function would compile a dynamic graph
        cmp = compare_with_eager(lambda x: x.sum(dims), [torch.randn(*shape, requires_grad=True)])
        assert all(r.plan is not None for r in cmp.backend.records)


def test_deep_element_wise_chains_generate_without_recursion_errors():
    # code generation pulls values recursively: a 200-step chain exceeded Python's
    # default recursion limit and the graph fell back to eager
    def chain(x):
        for _ in range(300):
            x = torch.sin(x) * 0.5 + x
        return x

    be = stitchml.StitchBackend()
    x = torch.randn(256)
    out = torch.compile(chain, backend=be)(x)
    assert be.records[0].eager_reason is None and be.records[0].plan.num_kernels == 1
    torch.testing.assert_close(out, chain(x), rtol=1e-4, atol=1e-4)


def test_size_one_cat_branch_is_read_at_zero():
    # backward of squeeze/unsqueeze/slice: slice_backward pads a per-row sum into a
    # cat; its size-1 branch was indexed by the column position (masked, but
    # symbolically column-dependent), so the sum was "requested at a column index"
    from stitchml.testing import compare_with_eager

    def fn(x):
        return x.squeeze().unsqueeze(-2) - x.squeeze().unsqueeze(-1)[:, :1]

    cmp = compare_with_eager(fn, [torch.randn(1, 7, 1, 33, 1, requires_grad=True)])
    assert all(r.plan is not None for r in cmp.backend.records)


def test_looped_rows_with_shared_reduction_loops_match_eager():
    # small on-chip limits force the row-looped form, where sibling reductions share a loop
    import torch.nn.functional as F

    from stitchml import config
    from stitchml.testing import compare_with_eager

    def fn(x, w, b):
        return F.layer_norm(x, (50,), w, b), torch.softmax(x, -1) * x.sum(-1, keepdim=True), x.var(-1)

    x, w, b = torch.randn(6, 50), torch.randn(50), torch.randn(50)
    with config.override(persistent_max_cols=16, loop_block_cols=8):
        torch._dynamo.reset()
        cmp = compare_with_eager(fn, [x.requires_grad_(), w.requires_grad_(), b.requires_grad_()])
    assert all(r.plan is not None for r in cmp.backend.records)


def test_constant_rows_normalise_exactly():
    # fuzz seed 375 (long profile): the mean of a row of equal values must be that value
    # (eager's Welford reduction gives it exactly), or layer norm amplifies the error by
    # 1/sqrt(eps); var_mean is the corrected two-pass algorithm, which refines the mean
    import torch.nn.functional as F

    from stitchml.capture.backend import StitchBackend

    x = torch.full((31, 1), 0.4) + torch.zeros(31, 1)  # 31 equal values: sum / 31 != 0.4 in fp32
    w = torch.randn(31, 1)
    torch._dynamo.reset()
    fn = torch.compile(lambda x, w: (F.layer_norm(x, (31, 1), w, None), x.var(0), x.mean(0)), backend=StitchBackend())
    y, v, m = fn(x, w)
    assert torch.equal(y, torch.zeros_like(y)), y.abs().max()
    assert torch.equal(v, torch.zeros_like(v)), v
    torch.testing.assert_close(m, x.mean(0))


def test_an_output_eager_returns_as_a_new_tensor_is_not_an_expanded_alias():
    # found in Whisper's decoder (tests/test_zoo.py::test_whisper, skipped since it was
    # found): `repeat` lowers to broadcasts and reshapes of its input, and as a graph
    # output the graph returned that expanded view (strides (0, 1), the input's storage)
    # where eager returns a new contiguous tensor.  The backward, reading the saved
    # position ids with eager's strides, gathered garbage indices and its embedding
    # gradient's atomic add wrote out of bounds (a segfault under the interpreter); a
    # caller writing into the output wrote into the input.
    def f(x):
        return x.repeat(3, 1), x.expand(2, 3).clone(), x.t().repeat(1, 2)

    x = torch.randn(1, 3)
    outs = torch.compile(f, backend=stitchml.StitchBackend())(x)
    for got, want in zip(outs, f(x)):
        assert torch.equal(got, want)
        assert got.stride() == want.stride(), (got.stride(), want.stride())
        assert got.untyped_storage().data_ptr() != x.untyped_storage().data_ptr()
    outs[0].add_(1)
    assert torch.equal(x, f(x)[1][:1])   # the input is untouched


def test_saved_repeat_indices_feed_the_embedding_backward_with_eager_strides():
    from stitchml import config
    from stitchml.testing import compare_with_eager

    def f(w, pos):
        return torch.nn.functional.embedding(pos.repeat(3, 1), w) * 2

    w = torch.randn(32, 16, requires_grad=True)
    pos = torch.arange(5, 13).unsqueeze(0)
    fwd = torch.compile(lambda pos: pos.repeat(3, 1), backend=stitchml.StitchBackend())(pos)
    assert fwd.stride() == (8, 1)   # (checked first: with an expanded alias the backward crashes)
    with config.override(fallback_on_error=False, poison_outputs=True):
        cmp = compare_with_eager(f, [w, pos])
    assert all(r.plan is not None and r.plan.num_kernels >= 1 for r in cmp.backend.records)


def test_a_growing_kv_cache_compiles_once_dynamic_not_once_a_token():
    """The pattern matchers read sizes with int(): on a SymInt that adds a guard to
    Dynamo's shape environment, so the dynamic graph of a decode step was specialised to
    its cache length and recompiled at every token of `generate()` (Dynamo's own
    guards, with backend="eager", compile twice).  Masked attention over a cache that
    grows by one each call: two graphs (the first size, then one dynamic graph) for six
    sizes, and the values match eager."""
    torch.manual_seed(0)
    backend = stitchml.StitchBackend()

    def step(q, k, v, mask):
        s = torch.matmul(q, k.transpose(-1, -2)) * 0.25 + mask
        return torch.matmul(torch.softmax(s, -1), v)

    f = torch.compile(step, backend=backend)
    for t in range(5, 11):
        q = torch.randn(2, 4, 1, 16)
        k, v = torch.randn(2, 4, t, 16), torch.randn(2, 4, t, 16)
        mask = torch.randn(2, 1, 1, t)
        out = f(q, k, v, mask)
        torch.testing.assert_close(out, step(q, k, v, mask), rtol=1e-5, atol=1e-5)
    assert len(backend.records) == 2, [r.kind for r in backend.records]
    assert backend.records[1].dynamic is not None



def test_a_kernel_entered_at_a_later_member_still_counts_as_a_path_between_two_groups():
    """Fuzz seed 10510 (reduced): in the backward graph a kernel with members early and
    late in the graph (a layer norm's gradient sums and a max's gradient gather) was
    entered from a group about to merge at one of its late members; the cycle test stopped
    at node ids past both merging groups, missed the way back through that kernel's early
    members, and the merge made a cycle: "plan has a cycle between kernels (planner bug)",
    the backward graph run eagerly. Now planned and stitched, gradients as eager's."""
    import torch.nn.functional as F
    from stitchml import config
    from stitchml.testing import compare_with_eager

    def program(a0, a1, a2, a4, a8, a9, a10):
        v2 = F.layer_norm(-a0, (100,), a1, a2).max(0, keepdim=True).values
        v11 = F.batch_norm(a4, None, None, training=True)
        v14 = torch.logsumexp(torch.erf(v11).reshape((3,)), 0, keepdim=False)
        v22 = torch.log2(torch.where(a8 > 0.5, a2, a9).abs() + 0.1) / -0.75
        return torch.maximum(v22.reshape((100,)), v14), torch.cat([v11 + v2, a10], 1)

    torch.manual_seed(10510)
    ins = [torch.randn(100), torch.randn(100), torch.randn(100), torch.randn(3, 1), torch.rand(()),
           torch.randn(100), torch.randn(3, 2)]
    for i in (0, 1, 2, 3, 5, 6):
        ins[i].requires_grad_()
    with config.override(fallback_on_error=False):
        c = compare_with_eager(program, ins, rtol=1e-4, atol=1e-5)
    assert all(r.plan is not None and r.eager_reason is None for r in c.backend.records), \
        [r.eager_reason for r in c.backend.records]
    assert any(r.kind == "backward" for r in c.backend.records)


def test_a_reduction_whose_kernel_failed_a_dry_run_takes_no_sibling_with_reordered_readers():
    """Fuzz seed 12021 (reduced): a layer norm over rows of 26 reshaped into rows of 221 for
    a variance.  In the backward graph the variance's row sum and a kernel of the layer
    norm's gradient (its element-wise work over [2, 17, 1, 26] holding the variance's
    gradient too) read the same buffer, so sibling merging put them in one kernel, where
    the per-row values of 221 are needed at an index of the rows of 26: the dry run of
    code generation failed, the planner forbade the reduction's merges, but sibling
    merging did not ask, made the same kernel again, and the backward graph ran eagerly
    ("kernel k0 cannot be generated and cannot be split").  Now planned and stitched."""
    import torch.nn.functional as F
    from stitchml import config
    from stitchml.testing import compare_with_eager

    def program(a2, a3, a4, a5):
        v7 = F.layer_norm(a2, (26,), a3, a4).reshape((4, 221))
        v10 = torch.sinh(v7.var(1, correction=0, keepdim=True) * 0.0123)
        return torch.logsumexp(v10 * (a5 < 0.3), 1, keepdim=False)

    torch.manual_seed(12021)
    ins = [torch.randn(2, 17, 1, 26, requires_grad=True), torch.randn(26, requires_grad=True),
           torch.randn(26, requires_grad=True), torch.rand(4, 1)]
    with config.override(fallback_on_error=False):
        c = compare_with_eager(program, ins, rtol=1e-4, atol=1e-5)
    assert all(r.plan is not None and r.eager_reason is None for r in c.backend.records), \
        [r.eager_reason for r in c.backend.records]
    assert any(r.kind == "backward" for r in c.backend.records)


def test_a_slice_written_into_a_transposed_view_of_a_viewed_buffer_keeps_its_layout():
    # Longformer's `_mask_invalid_locations`: a slice of `buf.view(...).transpose(2, 1)`
    # written in place.  Functionalisation scatters into the transposed view and
    # `view`s the result back to the buffer's shape; our slice_scatter decomposition
    # returned a contiguous tensor, which cannot be viewed back ("Cannot view a tensor
    # with shape [2, 4, 12, 5] and strides (240, 5, 20, 1)"): the graph crashed
    from stitchml.testing import compare_with_eager

    def f(a):
        buf = a * 2.0
        y = buf.view(2, 4, 12, 5).transpose(2, 1)
        y[:, :2, :, :3] = torch.where(y[:, :2, :, :3] > 0, -1.0, y[:, :2, :, :3])
        y[:, -1] = y[:, -1] * 3.0                        # select_scatter, the same way
        return y * 1.0, buf + 1.0

    cmp = compare_with_eager(f, [torch.randn(8, 6, 2, 5, requires_grad=True)])
    assert all(r.plan is not None and r.plan.num_kernels >= 1 and not r.graph.fallbacks
               for r in cmp.backend.records)


def test_slice_and_select_scatter_decompositions_return_the_written_tensors_strides():
    from stitchml.capture.decomp_window import select_scatter, slice_scatter

    x = torch.randn(2, 4, 12, 5).transpose(2, 1)        # dense, not contiguous
    src = torch.randn(2, 12, 2, 5)
    out = slice_scatter(x, src, 2, 1, 3)
    assert out.stride() == x.stride()
    assert torch.equal(out, torch.slice_scatter(x, src, 2, 1, 3))
    out = select_scatter(x, src[:, :, 0], 2, -1)
    assert out.stride() == x.stride()
    assert torch.equal(out, torch.select_scatter(x, src[:, :, 0], 2, -1))


def test_operands_passed_by_keyword_are_matched_not_crashed_on():
    # I-BERT calls `F.linear(x, weight=..., bias=...)`: the pattern matchers indexed
    # node.args[1] and raised IndexError inside the compile (a crash the fallback hid)
    import torch.nn.functional as F

    from stitchml import config
    from stitchml.testing import compare_with_eager

    x = torch.randn(4, 6, 8, requires_grad=True)
    w, b = torch.randn(16, 8, requires_grad=True), torch.randn(16, requires_grad=True)
    t = torch.randint(0, 16, (24,))
    q = torch.randn(2, 3, 5, 8, requires_grad=True)
    cases = {
        "gemm_epilogue": (lambda x, w, b: F.gelu(input=F.linear(input=x, weight=w, bias=b)).sum(), [x, w, b]),
        "linear_ce": (lambda x, w, t: F.cross_entropy(input=F.linear(x, weight=w).reshape(-1, 16), target=t),
                      [x, w, t]),
        "attention": (lambda q: torch.matmul(
            input=torch.softmax(input=torch.matmul(input=q, other=q.transpose(-1, -2)) * 0.3, dim=-1), other=q), [q]),
    }
    def methods(q):   # the tensor-method forms, by keyword
        qt = q.permute(dims=(0, 2, 1, 3))
        s = torch.matmul(qt, qt.transpose(dim0=-1, dim1=-2)) * 0.3
        return torch.matmul(s.softmax(dim=-1), qt).flatten(start_dim=1)
    cases["attention (methods)"] = (methods, [q])
    for pattern, (fn, inputs) in cases.items():
        with config.override(gemm_epilogue="on"):
            cmp = compare_with_eager(fn, inputs)
        assert [r.pattern for r in cmp.backend.patterns if r.applied] == [pattern.split()[0]], cmp.backend.patterns
    # torch.bmm's second operand is `mat2`
    cmp = compare_with_eager(lambda x: torch.softmax(torch.bmm(input=x, mat2=x.transpose(1, 2)), -1), [x])
    assert all(r.plan is not None for r in cmp.backend.records)


def test_an_attention_output_written_in_place_keeps_the_math_form():
    # Nystromformer adds a convolution of v into the attention output in place
    # (`context += conv(v)`): the product's backward does not read its output, the
    # fused attention's does, so rewriting it made autograd raise "modified by an
    # inplace operation" while tracing the backward
    from stitchml.testing import compare_with_eager

    def f(q, k, v):
        ctx = torch.matmul(torch.softmax(torch.matmul(q, k.transpose(-1, -2)) * 0.35, dim=-1), v)
        ctx += v * 2.0
        return ctx

    qkv = [torch.randn(2, 3, 7, 8, requires_grad=True) for _ in range(3)]
    cmp = compare_with_eager(f, qkv)
    refused = [r for r in cmp.backend.patterns if r.pattern == "attention"]
    assert refused and not refused[0].applied and "in place" in refused[0].detail


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_scan_fed_by_a_broadcast_over_a_square_domain_keeps_its_scanned_dim(dtype):
    """Fuzz seed 14912 (reduced): cumsum over dim 0 of a [17, 17] product of a [17, 1]
    column and a [17] row.  The product's broadcast kernel walks dim 1 as its columns,
    the scan needs dim 0 there; with rows x cols equal (17 x 17) the merge kept the
    broadcast's domain, the scan was asked for at a column-dependent row, and the
    graph ran eagerly ("kernel k1 cannot be generated and cannot be split").  The
    scan's dims now stay the columns of the kernel it joins."""
    from stitchml import config
    from stitchml.testing import compare_with_eager

    def program(a0):
        v0 = torch.lerp(a0, a0, 0.25)
        v6 = torch.atanh(torch.tanh(torch.cosh(v0) * 2) * 0.9)
        return torch.cumsum(v0.reshape(17, 1) * v6, 0)

    torch.manual_seed(14912)
    tol = dict(rtol=1e-4, atol=1e-5) if dtype == torch.float32 else dict(rtol=2e-2, atol=2e-2)
    with config.override(fallback_on_error=False):
        c = compare_with_eager(program, [torch.randn(17, dtype=dtype)], **tol)
    plans = [r.plan for r in c.backend.records]
    assert all(p is not None for p in plans), [r.eager_reason for r in c.backend.records]
    # the chain, the broadcast product and the scan in one kernel
    assert any(k.dominant and any(p.graph[m].op == "mul" and p.graph[m].shape == (17, 17) for m in k.members)
               for p in plans for k in p.kernels)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_a_half_value_a_kernel_stores_is_read_inside_it_as_stored(dtype):
    """A kernel that writes a half-precision value and uses it again reads it rounded, as
    every other reader (another kernel, a backward recomputing from it) sees it: y * y
    from the stored y is eager's value bit for bit (before: ~half of 4096 elements one
    ulp off, from y held unrounded in float32).  Fuzz seed 11393: the backward recomputed
    a layer norm's output from a stored reciprocal the forward had used unrounded, and
    sign() of a value at 0.002 came out the other way."""
    from stitchml import config
    from stitchml.capture.backend import StitchBackend

    def program(x):
        y = x * 3.3
        return y, y * y

    torch.manual_seed(11393)
    x = torch.randn(4096, dtype=dtype)
    backend = StitchBackend()
    with config.override(fallback_on_error=False, poison_outputs=True):
        y, z = torch.compile(program, backend=backend)(x)
    ey, ez = program(x)
    assert sum(len(r.plan.kernels) for r in backend.records) == 1
    assert torch.equal(y, ey) and torch.equal(z, ez), (z != ez).sum().item()


def test_fuzz_seed_11393_backward_agrees_with_its_forward_at_a_kink():
    """Fuzz seed 11393 (reduced; fp16): |layer_norm(1.5 / (|v0| + 0.5))| with an element of
    the normalised row at 0.0023: the backward's sign() of the recomputed value must see
    the forward's (stored, rounded) operand.  Judged by the fuzzer's float64 verdict."""
    from stitchml.fuzz.cases import run_case
    r = run_case(11393, "long")
    assert r.status == "pass", r.line()


def test_a_column_only_value_from_a_scalar_stored_under_a_dynamic_row_block():
    """DeBERTa-v2 (model sweep): its relative-position buckets are computed from an arange
    and two 0-d tensors into a [n, n] table, one row of n * n columns.  Under dynamic
    shapes the row block is fixed at 32, and a 0-d tensor is loaded as a block of the
    row axis, so the stored value was [32, C] against a [1, C] pointer: "Expected pointer
    argument to have shape [32, 128] but got [1, 128]" at the second size, the crash
    hidden by the fallback (the graph eager).  The pointer is now a block of the rows."""
    from stitchml import config
    from stitchml.capture.backend import StitchBackend

    def program(x, c0, c1):
        q = torch.arange(x.shape[-1])
        rel = q[:, None] - q[None, :]
        abs_pos = torch.where((rel < 4) & (rel > -4), c0, rel.abs())
        log_pos = torch.ceil(torch.log(abs_pos / 4) / torch.log(c1) * 3) + 4
        bucket = torch.where(abs_pos <= 4, rel.to(log_pos.dtype), log_pos * torch.sign(rel)).long()
        return (bucket + 8).clamp(0, 15)[None, None] + x, (-bucket + 8).clamp(0, 15)

    c0, c1 = torch.tensor(3), torch.tensor(15 / 4)
    backend = StitchBackend()
    compiled = torch.compile(program, backend=backend)
    for n in (12, 9, 10):
        x = torch.randn(2, 3, n, n)
        with config.override(fallback_on_error=False, poison_outputs=True):
            got = compiled(x, c0, c1)
        want = program(x, c0, c1)
        assert all(torch.equal(a, b) for a, b in zip(got, want)), n
    assert any(r.dynamic is not None for r in backend.records)
    assert all(r.eager_reason is None for r in backend.records)


def test_a_kernel_writing_an_input_in_place_reads_no_value_of_it_through_a_view():
    # fuzz seed 53791: the kernel that wrote x in place (x := f(x)) also built a diagonal
    # scatter of a value computed from x, pulling x again at the diagonal's indices after
    # its store: the diagonal read the new x.  That write now goes through a buffer of its own.
    import stitchml
    from stitchml import config

    def program(x, a):
        v1 = torch.pow(torch.cos(x).abs() + 0.5, torch.tanh(x))
        v5 = torch.atan2(v1, a.abs() + 0.5).clone()
        v5.diagonal(0, 0, 2).add_(1.0)
        x.copy_(v1.clone())
        return v5

    base, a = torch.randn(3, 31, 9, 1), torch.randn(3, 31, 1, 1)
    xe, xc = base.clone().permute(0, 1, 3, 2), base.clone().permute(0, 1, 3, 2)
    want = program(xe, a)
    backend = stitchml.StitchBackend()
    with config.override(strict=True, fallback_on_error=False, poison_outputs=True):
        got = torch.compile(program, backend=backend, dynamic=False)(xc, a)
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(xc, xe)
    (plan,) = [r.plan for r in backend.records]
    (reason,) = plan.in_place.values()
    assert reason is not None and "also reads a value computed from it" in reason, reason
