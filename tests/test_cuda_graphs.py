"""CUDA graphs by default where safe (issue 12.3).  Capture itself needs CUDA (the
`gpu` test); everything else runs on the CPU: the decisions, the kernels' device
seeds, and the capture/replay bookkeeping against a stand-in for the CUDA graph that
replays the captured wrapper on the graph's static buffers."""
import pytest
import torch

import stitchml
from stitchml import config
from stitchml.codegen import generate_all
from stitchml.plan.data import EagerStep, Plan
from stitchml.runtime import cuda_graphs as cg
from stitchml.runtime import wrapper as wr
from planning import graph_of, plan_of

CPU = torch.device("cpu")
CUDA = torch.device("cuda")


class _Rec:
    kind = "inference"
    cuda_graph_note = ""


# ----------------------------------------------------------------------------- decisions

def test_mode_decides_from_knob_device_and_dynamic_sizes():
    assert config.KNOBS["cuda_graphs"].default is True
    assert cg.mode("forward", CUDA) == cg.Decision(True)
    assert cg.mode("backward", CUDA).capture  # training graphs too
    assert not cg.mode("inference", CUDA, dynamic=True).capture
    assert "dynamic sizes" in cg.mode("inference", CUDA, dynamic=True).reason
    cpu = cg.mode("inference", CPU)
    assert not cpu.capture and "need a CUDA device" in cpu.reason
    with config.override(cuda_graphs=False):
        assert cg.mode("inference", CUDA) == cg.Decision(False, "")


def test_a_refusal_warns_only_when_cuda_graphs_were_asked_for(recwarn):
    rec = _Rec()
    assert not cg.enabled("inference", CUDA, rec, dynamic=True)   # the default: recorded, silent
    assert "dynamic sizes" in rec.cuda_graph_note and not recwarn.list
    cpu = _Rec()
    assert not cg.enabled("inference", CPU, cpu) and not cpu.cuda_graph_note   # CPU by default: nothing to say
    with config.override(cuda_graphs=True), pytest.warns(UserWarning, match="CUDA device"):
        cg.enabled("inference", CPU, _Rec())


def test_plan_with_a_host_sync_is_refused():
    g = graph_of(lambda x: x * 2.0, torch.randn(4))
    plan = Plan(g, steps=[EagerStep(0, "aten._local_scalar_dense.default", "library op")])
    assert "synchronises with the CPU" in cg.plan_refusal(plan)
    assert cg.plan_refusal(plan_of(lambda x: torch.softmax(x, -1), torch.randn(4, 8))) is None


def test_inputs_written_by_eager_ops_are_found():
    def f(x, y):
        x.add_(1.0)            # an in-place op on input 0 (kept by make_fx: an eager op)
        return y * 2.0
    g = graph_of(f, torch.randn(4), torch.randn(4))
    assert cg.mutated_inputs(g) == {0}
    assert cg.mutated_inputs(graph_of(lambda x, y: x + y, torch.randn(4), torch.randn(4))) == set()


# ----------------------------------------------------------------------------- seeds in device memory

def _dropout(x):
    return torch.ops.aten.native_dropout(x, 0.5, True)[0] * 3.0


def test_device_seeds_differ_per_call_and_repeat_under_manual_seed():
    x = torch.randn(64, 32)
    plan = plan_of(_dropout, x)
    sources = generate_all(plan.graph, plan)
    call, code = wr.build_callable(plan, sources, CPU, device_seeds=True)
    assert "SEEDS.draw()" in code and "_seeds(" not in code
    assert any("tl.load(" in cg.device_seed_source(ks).source and "_ptr" in cg.device_seed_source(ks).source
               for ks in sources.values())
    torch.manual_seed(0)
    a = call([x])[0]
    b = call([x])[0]
    torch.manual_seed(0)
    a2 = call([x])[0]
    keep = a != 0
    assert 0.35 < keep.float().mean() < 0.65
    torch.testing.assert_close(a[keep], x[keep] * 6.0)       # kept elements scaled by 1/(1-p), then 3x
    assert not torch.equal(a, b) and torch.equal(a, a2)


def test_global_launches_zero_their_barrier_counter_in_graph_mode():
    # a replay repeats the host's arguments: the barrier base cannot grow per call, so in
    # graph mode the counter is zeroed (a captured memset) before each global launch
    x = torch.randn(4096, 64)
    # (column partials + combine: one global launch; the exp's argument kept small: a sum of
    # 4096 values times 2 made its result ~1e19 and any summation order 1e-4 off)
    fn = lambda x: (x.sum(0) * 0.05).exp()  # noqa: E731
    plan = plan_of(fn, x)
    assert [g.kind for g in plan.groups] == ["global"]
    call, code = wr.build_callable(plan, generate_all(plan.graph, plan), CPU, device_seeds=True)
    assert "BARRIER.reset()" in code and "BARRIER.take(" not in code
    for _ in range(3):
        x = torch.randn(4096, 64)
        torch.testing.assert_close(call([x])[0], fn(x), rtol=1e-4, atol=1e-4)


# ----------------------------------------------------------------------------- capture and replay bookkeeping

class FakeGraphs:
    """Stands in for torch.cuda.CUDAGraph: capture runs the wrapper once on the graph's
    inputs; a replay runs it again on the inputs at the captured addresses and writes
    the results into the captured outputs (a real graph writes the same memory)."""

    def __init__(self):
        self.captures = 0
        self.replays = 0

    def capture(self, call, inputs):
        self.captures += 1
        self.out = call(list(inputs))
        return call, self.out

    def replay(self, graph, inputs):
        self.replays += 1
        for o, n in zip(self.out, graph(list(inputs))):
            if isinstance(o, torch.Tensor) and o is not n:
                if cg._dense(o):
                    o.copy_(n)
                else:   # a broadcast output: write the storage range it reads
                    cg._span(o).copy_(cg._span(n))

    def on_device(self, t):
        return True


def _record_runners(monkeypatch) -> list:
    """Every graph the compiler wraps from now on is planned for capture (as on a CUDA
    device) and runs under a `GraphRunner` with the stand-in graph; returns the list the
    runners are appended to, in creation order."""
    runners = []

    class Recorded(cg.GraphRunner):
        def __init__(self, *a, **k):
            super().__init__(*a, backend=FakeGraphs(), **{x: v for x, v in k.items() if x != "backend"})
            runners.append(self)

    monkeypatch.setattr(cg, "mode", lambda kind, device, dynamic=False: cg.Decision(not dynamic))
    monkeypatch.setattr(cg, "GraphRunner", Recorded)
    return runners


def _model(w, x):
    return torch.tanh(x @ w) * 2.0, (x * 3.0).sum(0)


def _runner(fn, *inputs, device_seeds=False, warmup=1):
    plan = plan_of(fn, *inputs)
    call, _ = wr.build_callable(plan, generate_all(plan.graph, plan), CPU, device_seeds=device_seeds)
    backend = FakeGraphs()
    return cg.GraphRunner(call, _Rec(), cg.mutated_inputs(plan.graph), backend, warmup=warmup,
                          by_position=plan.graph.read_by_position()), backend


def test_parameters_are_read_in_place_and_only_user_inputs_are_copied():
    w = torch.nn.Parameter(torch.randn(8, 8))
    runner, backend = _runner(_model, w.detach(), torch.randn(4, 8))

    seen = []   # every x kept alive: a fresh one never lands at an earlier one's address

    def step():  # (the caller lets go of the outputs between steps)
        x = torch.randn(4, 8)
        seen.append(x)
        for o, r in zip(runner([w, x]), _model(w.detach(), x)):
            torch.testing.assert_close(o, r)

    for _ in range(5):
        step()
    assert backend.captures == 1 and runner.replays == 4 and runner.misses == 0, (runner.captured, getattr(runner, "note", None), runner.recaptures)
    assert runner.static == [0] and list(runner.copies) == [1]     # w in place, x copied
    assert runner.copies[1].data_ptr() != 0 and "1 copied per replay" in runner.captured


def test_outputs_still_held_are_never_overwritten():
    w = torch.randn(8, 8)
    runner, backend = _runner(_model, w, torch.randn(4, 8))
    kept = []
    for step in range(5):
        x = torch.randn(4, 8)
        kept.append((runner([w, x]), _model(w, x)))    # every output kept (e.g. logged losses)
    for out, ref in kept:
        for o, r in zip(out, ref):
            torch.testing.assert_close(o, r)
    # the first replay found last call's outputs held: it ran without the graph, the
    # graph was captured again and those outputs are cloned from then on
    assert runner.misses == 1 and backend.captures == 2 and all(p == ("clone",) for p in runner.policy)
    assert runner.replays == 3


def test_a_clone_at_a_reused_address_is_not_read_in_place():
    """Graph A's outputs are held by the caller across calls, so A returns them as clones
    (a fresh allocation each call); graph B reads such a clone (a backward reading the KV
    cache a model also returns).  Where B's warm-up and capture see the clone at one
    address (as the allocator may hand out), B still copies it rather than trust the
    address and capture again when it moves (LLaMA's backward on CPU stand-ins: three
    captures of the three allowed)."""
    w = torch.randn(8, 8)
    a, _ = _runner(_model, w, torch.randn(4, 8))
    b, _ = _runner(lambda t, u: (t * 2.0 + u,), torch.randn(4, 8), torch.randn(4, 8))
    keep = []
    x = torch.randn(4, 8)
    keep.append(a([w, x]))
    keep.append(a([w, x]))
    out = a([w, x])                      # held outputs: A captured again and clones them now
    keep.append(out)
    out = a([w, x])
    assert a.clone and cg._cloned_elsewhere(out[0])
    t, u = out[0], torch.randn(4, 8)
    b([t, u])                            # warm-up and capture with the same clone: same address
    got = b([t, u])
    torch.testing.assert_close(got[0], t * 2.0 + u)
    assert 0 in b.copies and 0 not in b.static


def test_an_input_read_in_place_that_moves_is_not_trusted():
    w = torch.randn(8, 8)
    runner, backend = _runner(_model, w, torch.randn(4, 8))
    x = torch.randn(4, 8)
    runner([w, x])
    runner([w, x])                      # captured: both inputs kept their address
    assert runner.static == [0, 1] and backend.captures == 1
    x2 = torch.randn(4, 8)              # now x moves: that call runs without the graph ...
    out = runner([w, x2])
    torch.testing.assert_close(out[0], _model(w, x2)[0])
    assert runner.misses == 1 and runner.graph is None
    for _ in range(3):                  # ... and the graph is captured again, x copied
        x3 = torch.randn(4, 8)
        torch.testing.assert_close(runner([w, x3])[1], _model(w, x3)[1])
    assert backend.captures == 2 and list(runner.copies) == [1]
    x4 = torch.randn(4, 8)              # once moved, always copied (even at a repeated address)
    for _ in range(2):
        torch.testing.assert_close(runner([w, x4])[0], _model(w, x4)[0])
    assert backend.captures == 2 and runner.misses == 1


def _ptrs_equal_contract(calls: list):
    """torch's `_tensors_data_ptrs_at_indices_equal(tensors, ptrs, indices)` as the C++ reads
    it (its .pyi, and Inductor's cudagraph_trees, which passes one entry per input):
    `ptrs[i]` is input i's address, for every i in `indices`; an index past `ptrs` raises."""
    def ptrs_equal(tensors, ptrs, idxs):
        calls.append(len(idxs))
        assert len(ptrs) == len(tensors), "ptrs must hold one entry per input"
        return all(tensors[i].data_ptr() == ptrs[i] for i in idxs)
    return ptrs_equal


def test_replay_checks_addresses_in_one_call_where_torch_has_it(monkeypatch):
    """CUDA builds of torch compare the static inputs' addresses in one C++ call
    (`_tensors_data_ptrs_at_indices_equal`); the CPU build has none and the runner uses a
    Python twin.  A stand-in with the C++ contract: used every replay, and a moved input is
    still caught."""
    calls = []
    monkeypatch.setattr(cg, "_PTRS_EQUAL", _ptrs_equal_contract(calls))
    w = torch.randn(8, 8)
    runner, backend = _runner(_model, w, torch.randn(4, 8))
    x = torch.randn(4, 8)
    for _ in range(3):
        runner([w, x])
    assert calls == [2] and runner.replays == 2 and backend.captures == 1   # (capture, then one replay)
    x2 = torch.randn(4, 8)
    torch.testing.assert_close(runner([w, x2])[0], _model(w, x2)[0])
    assert runner.misses == 1 and runner.graph is None and calls == [2, 2]


@pytest.mark.gpu
def test_the_cpp_address_check_reads_addresses_by_input_position():
    """The contract the runner relies on, checked against torch's own C++ call."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    cpp = getattr(torch._C, "_tensors_data_ptrs_at_indices_equal", None)
    if cpp is None:
        pytest.skip("this torch build has no _tensors_data_ptrs_at_indices_equal")
    a, b, c = (torch.randn(4, device="cuda") for _ in range(3))
    for tensors, ptrs, idx in [([a, b, c], [None, b.data_ptr(), c.data_ptr()], [1, 2]),
                               ([a, a, c], [None, b.data_ptr(), c.data_ptr()], [1, 2]),
                               ([a, b, c], [a.data_ptr(), None, None], [0])]:
        assert cpp(tensors, ptrs, idx) == cg._ptrs_equal_py(tensors, ptrs, idx)
    assert cg._PTRS_EQUAL is cpp


def _model_x_first(x, w):
    return torch.tanh(x @ w) * 2.0, (x * 3.0).sum(0)


def test_static_inputs_that_are_not_a_prefix_are_compared_at_their_positions(monkeypatch):
    """A training backward reads saved activations and parameters in place after inputs it
    copies: its static positions are not 0..k-1.  H200 2026-11-30: a list of addresses in the
    order of the static positions made torch's C++ check raise IndexError on the first replay
    of every model's backward; a moved static input must still be caught, at its position."""
    calls = []
    monkeypatch.setattr(cg, "_PTRS_EQUAL", _ptrs_equal_contract(calls))
    w = torch.nn.Parameter(torch.randn(8, 8))
    runner, backend = _runner(_model_x_first, torch.randn(4, 8), w.detach())

    def step():   # x fresh every call: copied; w a parameter: read in place at position 1
        x = torch.randn(4, 8)     # (the outputs let go of between calls, as a training loop does)
        for o, r in zip(runner([x, w]), _model_x_first(x, w.detach())):
            torch.testing.assert_close(o, r)
    for _ in range(4):
        step()
    assert runner.static == [1] and list(runner.copies) == [0]
    assert calls == [1, 1] and runner.replays == 3 and runner.misses == 0, (calls, runner.replays, runner.misses, runner.last_miss)
    w2 = torch.nn.Parameter(torch.randn(8, 8))   # the parameter moves (e.g. reassigned)
    x = torch.randn(4, 8)
    torch.testing.assert_close(runner([x, w2])[0], _model_x_first(x, w2.detach())[0])
    assert runner.misses == 1 and "input 1" in runner.last_miss


def test_the_python_twin_of_the_address_check_has_the_cpp_contract():
    a, b, c = torch.randn(2), torch.randn(2), torch.randn(2)
    ptrs = [None, b.data_ptr(), c.data_ptr()]
    assert cg._ptrs_equal_py([a, b, c], ptrs, [1, 2])
    assert not cg._ptrs_equal_py([a, a, c], ptrs, [1, 2])
    with pytest.raises(IndexError):
        cg._ptrs_equal_py([a, b, c], [b.data_ptr()], [1])   # a list by rank, not by position


def test_an_output_held_only_through_a_view_is_never_overwritten():
    """The replay's held check reads each output storage's use count (cached at capture):
    a slice of an output, the output itself let go, still holds its storage."""
    w = torch.randn(8, 8)
    runner, backend = _runner(_model, w, torch.randn(4, 8))
    kept = []
    for _ in range(5):
        x = torch.randn(4, 8)
        kept.append((runner([w, x])[0][1:], _model(w, x)[0][1:]))   # a view; the tuple dropped
    for got, ref in kept:
        torch.testing.assert_close(got, ref)
    assert runner.misses == 1 and runner.policy[0] == ("clone",)


def _train(steps: int, keep_last: bool):
    """A forward graph and a backward graph reading its outputs, replayed `steps` times
    against eager; `keep_last`: the loop holds last step's second output into the next
    forward call (a logged loss).  Returns the runners and their stand-in backends."""
    w = torch.randn(8, 8)
    fwd, fb = _runner(_model, w, torch.randn(4, 8))
    bwd, bb = _runner(lambda a, b: (a * 2.0 + 1.0, b.sum()), torch.randn(4, 8), torch.randn(8))
    kept = None
    for _ in range(steps):
        x = torch.randn(4, 8)
        a, b = fwd([w, x])
        got = bwd([a, b])
        ref = _model(w, x)
        torch.testing.assert_close(got[0], ref[0] * 2.0 + 1.0)
        torch.testing.assert_close(got[1], ref[1].sum())
        kept = b if keep_last else None
        del a, b, got
    assert (kept is not None) == keep_last
    return fwd, fb, bwd, bb


def test_a_graph_reads_another_graphs_static_outputs_in_place():
    """Forward → backward: the backward's warm-up sees the forward's plain-call results,
    its capture sees aliases of the forward graph's static outputs.  Those moved once,
    yet they are read in place (no copy per replay), and the results stay right."""
    fwd, fb, bwd, bb = _train(5, keep_last=False)
    assert fb.captures == 1 and bb.captures == 1 and bwd.misses == 0
    assert bwd.static == [0, 1] and bwd.copies == {}, bwd.captured      # nothing copied per replay
    assert bwd.replays == 4


def test_static_outputs_read_in_place_after_the_producer_is_captured_again():
    """A training loop that keeps last step's outputs (the loss it logs): the forward's
    replay at step 3 finds them held, runs plain and captures again with those outputs
    cloned; meanwhile the backward saw its inputs move.  Once the forward's new static
    outputs exist, the backward reads them in place again (no copy per replay)."""
    fwd, fb, bwd, bb = _train(8, keep_last=True)
    assert fwd.misses == 1 and fb.captures == 2                          # once: b cloned from then on
    assert bwd.copies == {} or list(bwd.copies) == [1], bwd.captured     # a (a static output) never copied
    assert 0 in bwd.static and bwd.replays >= 3


def test_inputs_copied_while_the_producer_ran_plain_are_read_in_place_once_it_is_captured_again():
    """The bench harness's order (H200, 2026-11-27: 233 copies and 0.73 ms a BERT step,
    143 and 0.80 ms LLaMA): the first call's results are kept, the second call's results
    are held while the third runs.  The forward's third call finds its output held, runs
    plain and captures again later; the backward captured at that third call, copying
    the forward's plain results.  Once the forward's new static outputs exist the
    backward captures again and reads them in place: nothing is copied per replay."""
    w = torch.randn(8, 8)
    fwd, fb = _runner(_model, w, torch.randn(4, 8))
    # (two warm-up calls, as `wrap` gives a backward graph)
    bwd, bb = _runner(lambda a: (a * 2.0 + 1.0,), torch.randn(4, 8), warmup=2)
    x = torch.randn(4, 8)                    # one batch, like the harness's fixed inputs

    def step():   # a: a saved activation (the backward's alone); b: the loss the caller gets
        a, b = fwd([w, x])
        got = bwd([a])
        ref = _model(w, x)
        torch.testing.assert_close(got[0], ref[0] * 2.0 + 1.0)
        torch.testing.assert_close(b, ref[1])
        return b, got

    first = step()                           # kept for the check
    held = step()                            # held while the next calls run
    for _ in range(6):
        step()
    assert first and held
    assert fwd.misses == 1 and bwd.recaptures == 1, (fwd.misses, bwd.recaptures, bwd.captured)
    assert bwd.copies == {} and not bwd.dead and "0 copied per replay" in bwd.captured
    assert bwd.replays >= 3


@pytest.mark.parametrize("case", ["bert_train", "llama8_train"])
def test_model_training_steps_in_the_bench_order_copy_nothing_per_replay(monkeypatch, case):
    """The bench harness's own calls (its first result kept, the second held while the
    next run) on the models suite's training steps, at --quick sizes, with the stand-in
    graph: forward and backward replay, nothing is copied per replay (H200, 2026-11-27:
    the backward copied every saved activation), the results equal eager's."""
    from stitchml.bench import models as bm
    from stitchml.bench.contenders import build_step
    from stitchml.bench.harness import _check, reference
    runners = _record_runners(monkeypatch)
    spec = next(c for c in bm.cases(quick=True) if c.name.startswith(case))
    w = spec.build("fp32", CPU, spec.name)
    ref = reference(w)
    torch._dynamo.reset()
    be = stitchml.StitchBackend()
    step, _ = build_step(w, torch.compile(w.fn, backend=be))
    first = step()                                 # the cold call's results, kept for the check
    held = step()                                  # wall_call's result, held by the harness
    for _ in range(4):
        step()                                     # the timing loops drop each result
    last = step()
    assert held and _check(w, first, ref).ok and _check(w, last, ref).ok
    assert [r.rec.kind for r in runners] == ["forward", "backward"]
    for r in runners:
        assert not r.dead and r.copies == {} and r.replays >= 3, (r.rec.kind, r.summary())
    # explain says what a replay reads in place and copies, and why a call ran plain
    from stitchml.tools.explain import Report
    text = Report(be.records).to_text()
    assert text.count("0 copied per replay") == 2 and "calls without the graph (last: " in text, text


def test_an_input_that_is_not_dense_is_copied_by_its_storage_range():
    """A broadcast input (a table expanded over the batch) and a slice of a fused
    projection move every call: each is copied by the storage range it reads (a
    broadcast cannot be a copy's destination), results equal to eager at every replay;
    an input arriving with other strides is not trusted (plain call, captured again)."""
    def f(t, q):
        return (t * 2.0 + q.sum(-1, keepdim=True),)

    # (the graph's body here is eager: a compiled plan is specialised to its layouts,
    # which Dynamo's guards keep; the runner's own check is what this test is about)
    backend = FakeGraphs()
    runner = cg.GraphRunner(lambda inputs: f(*inputs), _Rec(), set(), backend)
    keep = []
    for _ in range(5):
        t, q = torch.randn(1, 8).expand(4, 8), torch.randn(4, 24)[:, 8:16]
        keep.append((t, q))                  # fresh addresses every call
        torch.testing.assert_close(runner([t, q])[0], f(t, q)[0])
    assert backend.captures == 1 and runner.misses == 0 and not runner.dead
    assert sorted(runner.copies) == [0, 1] and runner.copies[0].stride() == (0, 1)
    assert runner.copies[0].untyped_storage().nbytes() == 8 * 4      # the 8 elements, not 32
    t = torch.randn(4, 8)                    # the same values, dense: another layout
    q = torch.randn(4, 24)[:, 8:16]
    torch.testing.assert_close(runner([t, q])[0], f(t, q)[0])
    assert runner.misses == 1 and runner.graph is None
    for _ in range(3):
        t, q = torch.randn(4, 8), torch.randn(4, 24)[:, 8:16]
        keep.append((t, q))
        torch.testing.assert_close(runner([t, q])[0], f(t, q)[0])
    assert backend.captures == 2 and runner.copies[0].stride() == (8, 1)


def test_a_collected_runner_leaves_no_static_addresses_behind():
    """The registry of graphs' static outputs forgets a runner that is garbage-collected
    (a model replaced, `torch._dynamo.reset()`): a stale address would make an unrelated
    input allocated there look read-in-place at every capture."""
    import gc
    w = torch.randn(8, 8)
    fwd, _ = _runner(_model, w, torch.randn(4, 8))
    for _ in range(3):
        fwd([w, torch.randn(4, 8)])
    key = id(fwd)
    assert key in cg._STATIC_OUTPUTS and cg._STATIC_OUTPUTS[key]
    del fwd
    gc.collect()
    assert key not in cg._STATIC_OUTPUTS


def test_mutated_user_input_refuses_capture():
    def f(x, y):
        x.add_(1.0)
        return y * 2.0
    runner, backend = _runner(f, torch.randn(4), torch.randn(4))
    for _ in range(3):
        x, y = torch.randn(4), torch.randn(4)
        x0 = x.clone()
        out = runner([x, y])
        torch.testing.assert_close(out[0], y * 2.0)
        torch.testing.assert_close(x, x0 + 1.0)      # the user's tensor was written, not a copy
    assert runner.dead and "input 0 is written in place" in runner.rec.cuda_graph_note and backend.captures == 0


def test_an_input_read_by_storage_position_refuses_capture_where_it_would_be_copied():
    """as_strided between a user input's elements reads its storage by position
    (`rules_views.storage_read`); a copy into a static buffer holds its elements (or
    their range) at another offset, so the graph runs uncaptured, right, with the reason."""
    def f(x):
        return torch.as_strided(x, (2, 2), (1, 2), 0) * 2.0
    base = torch.randn(18)
    runner, backend = _runner(f, base.as_strided((3, 3), (6, 2), 1))
    assert _plan_graph(f, base.as_strided((3, 3), (6, 2), 1)).read_by_position() == {0}
    for _ in range(3):
        base = torch.randn(18)
        x = base.as_strided((3, 3), (6, 2), 1)
        assert torch.equal(runner([x])[0], f(x))
    assert runner.dead and "input 0 is read by storage position" in runner.rec.cuda_graph_note
    assert backend.captures == 0


def _plan_graph(fn, *inputs):
    return plan_of(fn, *inputs).graph


def test_dropout_under_replay_differs_per_replay_and_repeats_under_the_seed():
    x = torch.randn(64, 32)
    runner, backend = _runner(_dropout, x, device_seeds=True)

    def masks():
        return [(runner([x])[0] != 0) for _ in range(3)]

    masks()                              # warm-up and capture: from here on every call replays
    torch.manual_seed(1)
    first = masks()
    torch.manual_seed(1)
    again = masks()
    assert backend.captures == 1 and runner.replays == 8
    assert not torch.equal(first[0], first[1]) and not torch.equal(first[1], first[2])
    assert all(torch.equal(a, b) for a, b in zip(first, again))


def test_explain_shows_why_a_graph_is_not_captured():
    x = torch.randn(4, 8)
    with config.override(cuda_graphs=True), pytest.warns(UserWarning, match="CUDA device"):
        report = stitchml.explain(lambda x: torch.softmax(x, -1), x)
    assert "CUDA graphs: CUDA graphs need a CUDA device" in report.to_text()
    torch._dynamo.reset()
    assert "CUDA graphs:" not in stitchml.explain(lambda x: torch.softmax(x, -1), x).to_text()


@pytest.mark.gpu
def test_training_step_is_captured_and_dropout_differs_per_replay():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Dropout(0.1),
                                torch.nn.Linear(64, 32)).cuda()
    be = stitchml.StitchBackend()
    compiled = torch.compile(model, backend=be)
    for _ in range(4):
        x = torch.randn(16, 32, device="cuda")
        compiled(x).square().mean().backward()
    assert all(not r.cuda_graph_note for r in be.records), [r.cuda_graph_note for r in be.records]


def test_training_forward_and_backward_are_replayed_without_copying_parameters(monkeypatch):
    """The compiler's wiring on the CPU, with the stand-in graph: a training loop whose
    forward and backward graphs are both captured and replayed, gradients equal to
    eager at every step, parameters never copied, the backward reading the forward's
    saved activations in place."""
    runners = _record_runners(monkeypatch)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.LayerNorm(32), torch.nn.GELU(),
                                torch.nn.Linear(32, 16))
    ref_model = torch.nn.Sequential(*[m for m in model])  # the same parameters, run eagerly
    compiled = torch.compile(model, backend=stitchml.StitchBackend())

    keep = []   # every step's x and output gradient stay alive: their addresses never repeat

    def step():
        x, g = torch.randn(8, 16), torch.randn(8, 16)
        keep.append((x, g))
        compiled(x).backward(g)
        got = [p.grad.clone() for p in model.parameters()]
        model.zero_grad()
        ref_model(x).backward(g)
        want = [p.grad.clone() for p in model.parameters()]
        model.zero_grad()
        for a, b in zip(got, want):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)

    for _ in range(8):
        step()
    fwd, bwd = runners
    # forward: warm-up, capture, then replays; backward: two warm-ups (its saved
    # activations are the forward's static outputs from the second step on), then replays
    assert (fwd.replays, bwd.replays, fwd.misses, bwd.misses) == (7, 6, 0, 0)
    # copied per replay: x in the forward; the output gradient and the saved x in the
    # backward.  Parameters and saved activations are read in place
    assert [tuple(c.shape) for c in fwd.copies.values()] == [(8, 16)]
    assert [tuple(c.shape) for c in bwd.copies.values()] == [(8, 16), (8, 16)]
    nparams = len(list(model.parameters()))
    assert len(fwd.static) == nparams and len(bwd.static) >= 5 and not fwd.dead and not bwd.dead


def test_a_view_of_a_parameter_held_by_the_caller_does_not_stop_replays():
    def f(w, x):
        return x @ w * 2.0, w.t()          # the second output is a view of the parameter
    w = torch.nn.Parameter(torch.randn(8, 8))
    runner, backend = _runner(f, w.detach(), torch.randn(4, 8))
    held = []
    for _ in range(5):
        x = torch.randn(4, 8)
        out, wt = runner([w, x])
        held.append(wt)                      # kept by the caller across calls
        torch.testing.assert_close(out, f(w.detach(), x)[0])
        del out
    assert torch.equal(held[-1], w.detach().t())
    assert runner.policy[1] == ("view",) and runner.misses == 0 and runner.replays == 4


def test_host_time_tool_times_a_replay_without_misses():
    """`python -m stitchml.tools.host_time --graph-runner IN OUT`: every timed call is a
    replay (no recapture: the outputs are let go), and the figure is a time."""
    from stitchml.tools.host_time import graph_runner_replay, main
    r = graph_runner_replay(12, 7, rounds=3, per_round=4)
    assert r["replays"] == 3 * 4 + 3 - 1 and r["replay_us"] > 0 and (r["inputs"], r["outputs"]) == (12, 7)
    assert main(["--graph-runner", "3", "2", "--rounds", "2"]) == 0


# ----------------------------------------------------------------------------- outputs handed out again (knob reuse_outputs)

def test_outputs_nobody_kept_are_handed_out_again():
    """A replay hands out last replay's output tensors again (the same objects: no new
    alias a replay) while the caller lets go of them; values follow the inputs. Knob
    off: a fresh alias of each output every replay."""
    w = torch.randn(8, 8)
    for reuse in (True, False):
        with config.override(reuse_outputs=reuse):
            runner, backend = _runner(_model, w, torch.randn(4, 8))
        ids = []
        for _ in range(6):
            x = torch.randn(4, 8)
            out = runner([w, x])
            for o, r in zip(out, _model(w, x)):
                torch.testing.assert_close(o, r)
            ids.append(tuple(id(o) for o in out))
            del out, o
        assert runner.misses == 0 and runner.replays == 5 and backend.captures == 1
        assert (len(set(ids[2:])) == 1) == reuse, ids   # (ids of dead objects may repeat: from the second replay on)


def test_an_output_kept_only_by_autograd_is_never_overwritten():
    """The caller drops its Python reference to an output but an autograd node saved it
    (C++ holds the tensor: its TensorImpl's use count, not its Python reference count,
    says so): the next call must not replay over it. The gradient computed after later
    calls uses the values of the call that produced it."""
    w = torch.randn(8, 8)
    runner, backend = _runner(_model, w, torch.randn(4, 8))
    # every input stays alive: one landing at the warm-up's address would be read in place
    # and its next move count as a miss of its own (CI-like fresh clone, 2026-11-29)
    xs = [torch.randn(4, 8) for _ in range(7)]
    for x in xs[:3]:
        out = runner([w, x])
        del out
    a = torch.randn(4, 8, requires_grad=True)
    x = xs[3]
    y = runner([w, x])[0] * a                 # mul saves the output for a's gradient
    want = _model(w, x)[0]
    for x in xs[4:]:
        runner([w, x])                        # later calls
    (ga,) = torch.autograd.grad(y.sum(), a)
    torch.testing.assert_close(ga, want)
    assert runner.misses == 1 and runner.policy[0] == ("clone",)


def test_an_output_changed_in_place_and_dropped_is_not_handed_out_again():
    """The caller transposes an output in place (`t_()`: its shape changes, its version
    counter moves) and drops it: the next replay hands out a fresh alias of the right
    shape, with the new values."""
    w = torch.randn(8, 8)
    runner, backend = _runner(_model, w, torch.randn(4, 8))
    # every x stays alive: a fresh one landing at the warm-up's address would look like a
    # stable input (read in place), and its next move a miss (CI, 2026-11-28: misses == 1)
    xs = [torch.randn(4, 8) for _ in range(5)]
    for x in xs[:3]:
        out = runner([w, x])
        del out
    out = runner([w, xs[3]])
    first = id(out[0])
    out[0].t_()
    del out
    x = xs[4]
    out = runner([w, x])
    assert out[0].shape == (4, 8) and id(out[0]) != first
    torch.testing.assert_close(out[0], _model(w, x)[0])
    assert runner.misses == 0


def test_outputs_sharing_a_storage_are_handed_out_again_without_a_miss():
    """Two outputs on one storage (an output and a view of it): each handed-out alias
    alive is one more use of the storage, which the held check expects."""
    def f(x):
        y = x * 2.0
        return y, y[1:]
    runner, backend = _runner(f, torch.randn(4, 8))
    for _ in range(6):
        x = torch.randn(4, 8)
        a, b = runner([x])
        torch.testing.assert_close(a, x * 2.0)
        torch.testing.assert_close(b, (x * 2.0)[1:])
        del a, b
    assert runner.misses == 0 and runner.replays == 5, runner.summary()
