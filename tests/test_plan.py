"""Tier 1: plans are plain data; these tests generate no code and run no kernel."""
import torch
import torch.nn.functional as F

from stitchml import config
from stitchml.codegen.triton_kernel import generate
from stitchml.plan.cost import row_passes
from stitchml.plan.data import EagerStep
from planning import plan_of, plan_on


def test_layer_norm_plan_is_one_regional_kernel_a_warp_a_row():
    x, w, b = torch.randn(64, 130), torch.randn(130), torch.randn(130)
    plan = plan_of(lambda x, w, b: F.layer_norm(x, (130,), w, b), x, w, b)
    (k,) = plan.kernels
    assert k.scheme == "regional"
    assert (k.domain.rows, k.domain.cols) == (64, 130)
    # 130 float32 values: wider than a warp's 16-byte vectors (128), so one warp a row
    assert (k.mapping.form, k.mapping.block_r, k.mapping.block_c, k.mapping.num_warps) == ("row_persistent", 1, 256, 1)
    assert k.mapping.block_r * k.mapping.grid >= 64
    reduces = [plan.graph[d] for d in k.dominant]
    assert [r.op for r in reduces] == ["sum", "sum", "sum"]  # mean; then sums of deviations and of their squares
    # modelled bytes: x, w, b read once, y written once
    assert k.bytes_read == (64 * 130 + 2 * 130) * 4
    assert k.bytes_written == 64 * 130 * 4
    assert plan.unfused_bytes > 3 * (k.bytes_read + k.bytes_written)


def test_long_rows_use_the_looped_form_and_emit_one_loop_per_pass():
    x = torch.randn(4, 20000)
    plan = plan_of(lambda x: torch.softmax(x, -1), x)
    (k,) = plan.kernels
    assert k.mapping.form == "row_looped" and k.mapping.block_r == 1
    src = generate(plan.graph, k).source
    # one pass for the max and the sum of exp (a running maximum), one for the output
    assert src.count("for cbase in range(0, ") == 2 and "mrun" in src
    assert row_passes(plan.graph, k) == 2   # the cost model counts the passes the code makes


def test_looped_layer_norm_shares_one_loop_between_sibling_reductions():
    # mean; then the deviations' sum and sum of squares in ONE loop; then the output:
    # three passes over the row, not four
    x, w, b = torch.randn(4, 20000), torch.randn(20000), torch.randn(20000)
    plan = plan_of(lambda x, w, b: F.layer_norm(x, (20000,), w, b), x, w, b)
    (k,) = plan.kernels
    assert k.mapping.form == "row_looped"
    src = generate(plan.graph, k).source
    assert src.count("for cbase in range(0, ") == 3 and row_passes(plan.graph, k) == 3
    # softmax's max and sum of exp (an online pair) share their loop with the row sum
    plan = plan_of(lambda x: torch.softmax(x, -1) * x.sum(-1, keepdim=True), x)
    (k,) = plan.kernels
    src = generate(plan.graph, k).source
    assert src.count("for cbase in range(0, ") == 2  # max, sum of exp and row sum; output


def test_single_rows_are_not_packed():
    x = torch.randn(3, 3000)
    with config.override(device="H100"):  # rows too short to split into a wave of chunks
        (k,) = plan_of(lambda x: torch.softmax(x, -1), x).kernels
    assert k.mapping.form == "row_persistent" and k.mapping.block_r == 1 and k.mapping.block_c == 4096


def test_pointwise_chain_is_one_local_kernel():
    x, y = torch.randn(33, 7), torch.randn(7)
    plan = plan_of(lambda x, y: torch.sigmoid(x * 2 + y).exp() - 1, x, y)
    (k,) = plan.kernels
    assert k.scheme == "local" and k.mapping.form == "pointwise"
    assert k.bytes_read == (33 * 7 + 7) * 4


def test_element_wise_siblings_of_one_input_are_one_kernel_reading_it_once():
    """Independent element-wise outputs of one input (rotary halves, gate and up
    activations): one kernel that reads the input once; with the knob off, one kernel
    each (each reads it)."""
    x, s = torch.randn(37, 9), torch.randn(3)

    def f(x, s):
        return torch.sin(x) * s[0], torch.cos(x) + s[1], torch.sigmoid(x * s[2])
    plan = plan_of(f, x, s)
    (k,) = plan.kernels
    assert k.mapping.form == "pointwise" and len(k.outputs) == 3
    assert k.bytes_read == (37 * 9 + 3) * 4 and k.bytes_written == 3 * 37 * 9 * 4
    with config.override(sibling_fusion=False):
        apart = plan_of(f, x, s)
    assert len(apart.kernels) == 3
    assert sum(k.bytes_read for k in apart.kernels) > 2 * k.bytes_read


def test_siblings_sharing_only_a_small_read_are_not_one_kernel():
    """Updates of unrelated tensors that read one 0-d value (an optimizer's bias
    correction) save no byte in one kernel: each merged body is serial work for the same
    programs (H200: 49 AdamW updates of 768 x 768 weights merged ran at 25% of copy
    bandwidth).  Planned for the H200 at those sizes: one kernel per tensor (launch
    grouping may still share a launch); the knob `serial_siblings` restores the merge."""
    def f(a, b, c, s):
        s = s.reshape(())
        return a * s + 1.0, b * s - 2.0, torch.exp(c * s)
    shapes = [(768, 768)] * 3 + [(1,)]
    plan = plan_on("H200", f, *shapes, dtype=torch.bfloat16)
    assert len(plan.kernels) == 3 and all(len(k.outputs) == 1 for k in plan.kernels)
    merged = plan_on("H200", f, *shapes, dtype=torch.bfloat16, serial_siblings=True)
    assert len(merged.kernels) == 1 and len(merged.kernels[0].outputs) == 3
    # a large common read still merges (read once): the same updates of one tensor
    one = plan_on("H200", lambda a, s: (a * s + 1.0, a * s - 2.0, torch.exp(a * s)), (768, 768), (1,),
                  dtype=torch.bfloat16)
    assert len(one.kernels) == 1


def test_siblings_of_different_domains_stay_apart():
    x = torch.randn(8, 6)
    # a row reduction and an element-wise op of x: different domains
    assert len(plan_of(lambda x: (x.sum(1), torch.exp(x)), x).kernels) == 2
    # element-wise outputs of other shapes (x read through a transpose): kept apart
    assert len(plan_of(lambda x: (torch.exp(x), torch.sin(x.t())), x).kernels) == 2
    assert len(plan_of(lambda x: (torch.exp(x), torch.sin(x)), x).kernels) == 1


def test_row_softmax_then_column_sum_is_one_kernel_plus_a_combine():
    x = torch.randn(16, 40)
    plan = plan_of(lambda x: torch.softmax(x, -1).sum(0), x)
    main, combine = plan.kernels
    assert main.partials and combine.scheme == "combine" and combine.combine_of == main.name
    assert (main.domain.rows, main.domain.cols) == (16, 40)


def test_reductions_along_different_axes_are_refused_with_a_reason():
    x = torch.randn(16, 40)
    plan = plan_of(lambda x: torch.softmax(torch.softmax(x, -1).t(), -1), x)
    assert len(plan.kernels) == 2
    assert any("different reduction axes" in r.reason for r in plan.refusals)


def test_merge_through_an_eager_op_is_refused_as_a_cycle():
    x, w = torch.randn(8, 8), torch.randn(8, 8)

    def fn(x, w):
        y = torch.exp(x)
        return (y @ w) + y

    plan = plan_of(fn, x, w)
    assert len(plan.kernels) == 2
    assert any(isinstance(s, EagerStep) and "mm" in s.op for s in plan.steps)
    assert any(r.reason.startswith("cycle") for r in plan.refusals)


def test_views_are_index_maps_not_copies():
    x = torch.randn(6, 4, 5)
    plan = plan_of(lambda x: x.permute(2, 0, 1).reshape(5, 24)[:, 1:20:3] * 3, x)
    (k,) = plan.kernels
    g = plan.graph
    assert [g[m].op for m in k.members] == ["mul"]
    assert k.inputs == tuple(g.inputs)


def test_expensive_broadcast_producer_gets_a_row_domain():
    x, y = torch.randn(10, 64), torch.randn(10, 1)
    plan = plan_of(lambda x, y: x * torch.exp(y), x, y)
    (k,) = plan.kernels
    assert k.domain.col_dims == (1,) and k.domain.rows == 10
    assert k.scheme == "regional"
    x, y = torch.randn(10, 64), torch.randn(64)
    plan = plan_of(lambda x, y: x * torch.exp(y), x, y)
    # broadcast along rows (leading dim): not stitched regionally, the reason says why
    assert len(plan.kernels) == 2
    assert any("trailing" in r.reason for r in plan.refusals)


def test_output_strides_follow_eager():
    x = torch.randn(5, 7).t()
    plan = plan_of(lambda x: x * 2, x)
    (k,) = plan.kernels
    (o,) = k.outputs
    assert plan.graph[o].stride == (x * 2).stride()


def test_graphs_planned_for_capture_price_launches_at_the_replay_gap():
    """A graph that will be replayed in a CUDA graph pays the GPU's gap between kernels
    per launch, not the host launch path: a grid barrier (2 us in the table) that beat a
    3 us host launch no longer beats a 1.5 us replayed one, so the layer-norm backward's
    partial kernel and its combine become two launches again."""
    from stitchml.bench.micro import cases
    from stitchml.plan.devices import get_device
    from stitchml.plan.options import PlanOptions
    from stitchml.tools import predict
    (spec,) = [s for s in cases(quick=False) if s.name == "layer_norm_bwd[N=1024]"]
    host = PlanOptions.from_config(get_device("H100"))
    replay = PlanOptions.from_config(get_device("H100"), graph_replay=True)
    assert replay.device.launch_s == get_device("H100").graph_launch_s < host.device.launch_s
    bwd_host = predict.case_plans(spec, "bf16", host)[1][-1]
    bwd_replay = predict.case_plans(spec, "bf16", replay)[1][-1]
    assert [g.kind for g in bwd_host.groups] == ["global"] and not bwd_host.graph_replay
    assert not any(g.kind == "global" for g in bwd_replay.groups)
    assert bwd_replay.graph_replay and bwd_replay.launch_s == replay.device.launch_s
    from stitchml.compiler import CompiledGraph
    from stitchml.tools.explain import Report
    text = Report([CompiledGraph("backward", graph=bwd_replay.graph, plan=bwd_replay)]).to_text()
    assert "launches priced at a CUDA-graph replay's gap (1.5 us" in text
    # replayed, a global launch also pays the memset node that zeroes its barrier counter
    from dataclasses import replace
    from stitchml.plan.cost import group_seconds
    (grp,) = bwd_host.groups
    members = [k for k in bwd_host.kernels if k.name in grp.members]
    rep = replay.device
    assert rep.replay and not host.device.replay
    extra = group_seconds("global", members, rep) - group_seconds("global", members, replace(rep, replay=False))
    assert abs(extra - rep.launch_s) < 1e-12


def test_horizontal_members_are_priced_at_the_composite_kernels_warps():
    """A horizontal launch is one composite kernel run at its widest member's warps
    (`codegen/composite.py`): a member written for one-warp programs runs 16-warp programs
    beside a 16-warp member, with other occupancy (here: two programs an SM, which at one
    warp each leave DRAM short of requests and at 16 do not).  `group_seconds` prices
    each member at the composite's warps; beside members of its own width, at its own."""
    from dataclasses import replace
    from stitchml.plan.cost import group_seconds, predict_seconds
    from stitchml.plan.data import Domain, KernelPlan, Mapping
    from stitchml.plan.devices import get_device
    dev = get_device("H100")

    def kernel(name, warps, grid, nbytes):
        return KernelPlan(name, (0,), (0,), (), Domain((grid, 1024), (1,)),
                          Mapping("row_persistent", 1, 1024, warps, grid), "local", (), (),
                          bytes_read=nbytes, bytes_written=nbytes)

    narrow = kernel("k0", 1, 2 * dev.sms, 8 << 20)
    wide = kernel("k1", 16, dev.sms, 1 << 20)
    mem = {w: predict_seconds(narrow, dev, w) - dev.launch_s for w in (1, 16)}
    assert mem[16] < 0.5 * mem[1]                  # the occupancy differs that much
    grouped = group_seconds("horizontal", [narrow, wide], dev)
    assert abs(grouped - (dev.launch_s + mem[16] + predict_seconds(wide, dev) - dev.launch_s)) < 1e-15
    twin = replace(narrow, name="k2")
    assert abs(group_seconds("horizontal", [narrow, twin], dev) - (dev.launch_s + 2 * mem[1])) < 1e-15
