"""A kernel Triton refuses at its planned warp count runs at another (runtime/launcher.py).

On a GPU the first launch compiles; Triton 3.6 refuses a few kernels at some warp
counts and takes them at others (bench/NOTES.md, forty-second session).  Here a
stand-in for Triton's JIT function refuses chosen warp counts the way Triton does
(the launch and `warmup`, which compiles without launching, both raise), on CPU."""
import inspect
import re
import warnings

import pytest
import torch

import stitchml
from stitchml import config
from stitchml.runtime import launcher as launcher_mod
from stitchml.runtime import wrapper
from stitchml.capture.backend import StitchBackend
from stitchml.runtime.launcher import Launcher, _retry_warps

from blocks import norm_softmax_gelu

REFUSAL = "PassManager::run failed"


class Compiled:
    def __init__(self, log, warps):
        self.log, self.warps = log, warps
        self.function = "fn-handle"
        self.packed_metadata = ("meta", warps)

    def run(self, gx, gy, gz, stream, function, metadata, launch_md, enter, exit_, *args):
        self.log.append(("direct", metadata[1], args))


class RefusingJit:
    """`fn[grid](*args, **options)` and `fn.warmup(...)`: refuses the warp counts in
    `refused` (a compile error, before anything runs); `fault`: compiles, then the
    launch raises (a fault at run time)."""

    def __init__(self, refused=(), fault=False):
        self.refused, self.fault = set(refused), fault
        self.log = []
        self.warmups = []
        self.params = []

    def _compile(self, options):
        if options.get("num_warps", 4) in self.refused:
            raise RuntimeError(f"{REFUSAL}\nerror: operand #0 does not dominate this use")
        return Compiled(self.log, options.get("num_warps", 4))

    def warmup(self, *args, grid, **options):
        self.warmups.append(options.get("num_warps"))
        return self._compile(options)

    def __getitem__(self, grid):
        def call(*args, **options):
            self.log.append(("jit", options.get("num_warps"), args))
            kernel = self._compile(options)
            if self.fault:
                raise RuntimeError("CUDA error: an illegal memory access was encountered")
            return kernel
        return call


class Ptr:
    def __init__(self, addr):
        self.addr, self.dtype, self.device = addr, torch.float32, torch.device("cuda", 0)

    def data_ptr(self):
        return self.addr


@pytest.fixture(autouse=True)
def _fresh_retries():
    saved, refused = list(launcher_mod.RETRIES), dict(launcher_mod.REFUSED)
    launcher_mod.RETRIES.clear()
    launcher_mod.REFUSED.clear()
    yield
    launcher_mod.RETRIES[:] = saved
    launcher_mod.REFUSED.clear()
    launcher_mod.REFUSED.update(refused)


def _launcher(fn):
    return Launcher(fn, stream=lambda index: 7)


def test_retry_order_halves_first_then_doubles():
    assert _retry_warps(8) == [4, 2, 1, 16]
    assert _retry_warps(1) == [2, 4, 8, 16]
    assert _retry_warps(4) == [2, 1, 8, 16]


def test_a_refused_warp_count_is_retried_and_the_compiled_one_kept(caplog):
    fn = RefusingJit(refused={8})
    k = _launcher(fn)
    a = Ptr(4096)
    with caplog.at_level("WARNING"):
        k[(3,)](a, 5, num_warps=8)
    # the planned launch raised; the kernel compiled at 4 warps and launched there
    assert [e[:2] for e in fn.log] == [("jit", 8), ("jit", 4)]
    assert fn.warmups == [8, 4]
    assert launcher_mod.RETRIES == [("RefusingJit", 8, 4, f"RuntimeError: {REFUSAL}")]
    assert list(launcher_mod.REFUSED.values()) == [{"num_warps": 4}]
    assert "runs at 4 warps" in caplog.text
    # bound: later launches call the compiled (4-warp) kernel directly
    k[(3,)](a, 5, num_warps=8)
    assert fn.log[-1][:2] == ("direct", 4)
    # a launch that specialises otherwise goes to the JIT at the warps that compiled, first time
    n = len(fn.log)
    k[(3,)](Ptr(4100), 5, num_warps=8)
    assert [e[:2] for e in fn.log[n:]] == [("jit", 4)]
    assert len(launcher_mod.RETRIES) == 1


def test_a_launch_line_retries_too():
    fn = RefusingJit(refused={4, 2})
    k = _launcher(fn)
    ns: dict = {}
    site = k.site(ns, "_L0", (2,), "..", num_warps=4)
    site(Ptr(4096), 3)
    assert [e[:2] for e in fn.log] == [("jit", 4), ("jit", 1)]
    ns["_L0"](Ptr(4096), 3)
    assert fn.log[-1][:2] == ("direct", 1)


def test_refused_at_every_warp_count_raises_kernel_refused_with_the_first_error():
    fn = RefusingJit(refused={1, 2, 4, 8, 16})
    with pytest.raises(launcher_mod.KernelRefused, match="at every warp count.*PassManager") as caught:
        _launcher(fn)[(1,)](Ptr(4096), num_warps=4)
    assert fn.warmups == [4, 2, 1, 8, 16]
    assert launcher_mod.RETRIES == [] and not caught.value.barrier
    assert REFUSAL in str(caught.value.__cause__)


def test_a_fault_at_run_time_is_not_retried():
    fn = RefusingJit(fault=True)
    with pytest.raises(RuntimeError, match="illegal memory access"):
        _launcher(fn)[(1,)](Ptr(4096), num_warps=4)
    assert fn.warmups == [4]        # it compiles: not a refusal, nothing else tried
    assert [e[:2] for e in fn.log] == [("jit", 4)]


def test_grid_barrier_kernels_and_the_knob_off_are_not_retried():
    fn = RefusingJit(refused={8})
    with pytest.raises(launcher_mod.KernelRefused, match="grid-barrier") as caught:
        _launcher(fn)[(1,)](Ptr(4096), num_warps=8, maxnreg=128)
    assert caught.value.barrier and fn.warmups == [8]      # (the compile that tells a refusal from a fault)
    with config.override(retry_refused_kernels=False):
        with pytest.raises(RuntimeError, match="PassManager") as plain:
            _launcher(fn)[(1,)](Ptr(4096), num_warps=8)
    assert not isinstance(plain.value, launcher_mod.KernelRefused)
    assert fn.warmups == [8]
    assert launcher_mod.RETRIES == []


class Refusing:
    """A real Triton function (interpreted, or JIT-compiled on a GPU) behind a stand-in
    compiler that refuses the launches `refuses(options)` says, launch and `warmup` alike,
    as a compiler bug would; everything else goes to the function."""

    def __init__(self, fn, refuses):
        self.inner, self.refuses = fn, refuses

    def warmup(self, *args, grid, **options):
        if self.refuses(options):
            raise RuntimeError(REFUSAL)
        return self.inner.warmup(*args, grid=grid, **options)

    def __getitem__(self, grid):
        def call(*args, **options):
            if self.refuses(options):
                raise RuntimeError(REFUSAL)
            return self.inner[grid](*args, **options)
        return call

    def __getattr__(self, name):
        return getattr(self.inner, name)


def refuse_first_warps(fn):
    """`fn` refused at the warp count of its first launch."""
    first = []

    def refuses(options):
        if not first:
            first.append(options.get("num_warps"))
        return options.get("num_warps") == first[0]
    return Refusing(fn, refuses)


def test_a_model_whose_kernels_are_all_refused_as_planned_still_runs_stitched(monkeypatch):
    real_bind = wrapper.bind_launchers
    monkeypatch.setattr(wrapper, "bind_launchers",
                        lambda functions: real_bind({n: refuse_first_warps(f) for n, f in functions.items()}))
    torch._dynamo.reset()

    def f(x, w):
        h = torch.nn.functional.layer_norm(x, (x.shape[-1],), w)
        return torch.softmax(h * 2.0, dim=-1) + torch.nn.functional.gelu(x)

    x, w = torch.randn(37, 300), torch.randn(300)
    compiled = stitchml.compile(f)
    with warnings.catch_warnings():
        warnings.simplefilter("error")      # a whole graph run eagerly would warn
        out = compiled(x, w)
        out2 = compiled(x, w)
    torch.testing.assert_close(out, f(x, w), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out2, out)
    assert launcher_mod.RETRIES, "no kernel was retried"
    assert all(planned != used for _, planned, used, _ in launcher_mod.RETRIES)
    report = stitchml.explain(f, x, w).to_text()
    assert "runs eagerly" not in report
    assert "at their planned warp count" in report and REFUSAL in report


@pytest.mark.gpu
def test_a_retried_kernel_binds_and_launches_at_the_warps_that_compiled_on_a_gpu():
    """Triton's own `warmup` with real tensors decides the retry, and the direct launch
    path calls the kernel compiled at the other warp count."""
    import triton
    import triton.language as tl

    @triton.jit
    def scale(x, out, n):
        i = tl.program_id(0) * 256 + tl.arange(0, 256)
        tl.store(out + i, tl.load(x + i, mask=i < n) * 3.0, mask=i < n)

    k = Launcher(Refusing(scale, lambda options: options.get("num_warps") == 4))
    x = torch.randn(2000, device="cuda")
    for _ in range(3):
        out = torch.full_like(x, float("nan"))
        k[(8,)](x, out, 2000, num_warps=4)
        torch.testing.assert_close(out, x * 3.0)
    assert launcher_mod.RETRIES == [("scale", 4, 2, f"RuntimeError: {REFUSAL}")]
    assert k.bound, "the retried kernel should have bound the direct path"


# ----------------------------------------------------------------------------- the compile pool

_MODULE = """
def k_fake():
    pass


class _Kernel:
    fn = staticmethod(k_fake)
    calls = []

    def warmup(self, *args, grid, num_warps, **options):
        _Kernel.calls.append(num_warps)
        if num_warps in REFUSED_WARPS:
            raise RuntimeError("PassManager::run failed\\nerror: operand #0 does not dominate this use")


KERNEL = _Kernel()
"""


def _fake_kernel_module(folder, refused):
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "sk_fake.py"
    path.write_text(f"REFUSED_WARPS = {set(refused)!r}\n" + _MODULE)
    return str(path)


def test_the_pool_worker_retries_like_the_launcher(tmp_path):
    from stitchml.runtime import precompile as pc
    job = pc.Job(_fake_kernel_module(tmp_path, {8, 4}), (torch.float32, 7), (("a", "*fp32"), ("n", "i32")), 8)
    seconds, retried = pc._warm_up(job, None, True)
    assert retried == (2, "k_fake", f"RuntimeError: {REFUSAL}")
    with pytest.raises(RuntimeError, match="PassManager"):
        pc._warm_up(job, None, False)                      # the knob off: the refusal stands
    with pytest.raises(RuntimeError, match="PassManager"):  # a grid-barrier kernel is never retried
        pc._warm_up(pc.Job(job.path, job.arg_types, job.signature, 8, maxnreg=128), None, True)
    ok = pc.Job(_fake_kernel_module(tmp_path / "ok", set()), job.arg_types, job.signature, 8)
    assert pc._warm_up(ok, None, True)[1] is None


@pytest.fixture
def inline_gpu_pool(monkeypatch):
    """`precompile` believing a GPU is there, its pool running each job in this process."""
    from concurrent.futures import Future

    import stitchml.compiler as compiler
    from stitchml.runtime import precompile as pc
    submitted = []

    class InlinePool:
        def submit(self, fn, *args):
            submitted.append(args[0])
            f = Future()
            try:
                f.set_result(fn(*args))
            except Exception as e:
                f.set_exception(e)
            return f

    monkeypatch.setattr(pc, "pool", lambda: InlinePool())
    monkeypatch.setattr(pc, "_POOL", [])
    monkeypatch.setattr(pc, "_DONE", set())
    monkeypatch.setattr(pc.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(pc, "_target", lambda: ((9, 0), "3.6.0", "2.11.0", "/tmp/triton"))
    monkeypatch.setattr(compiler, "_interpreter_on", lambda: False)
    return submitted


def test_a_kernel_the_pool_compiled_at_other_warps_launches_there_in_this_and_a_later_process(
        tmp_path, inline_gpu_pool):
    """The pool's retry fills `launcher.REFUSED` and its marker keeps the warps: the
    launch (this process, and a later one that only reads the markers) goes straight to
    the warps that compiled, without compiling the refused kernel again."""
    from stitchml.runtime import precompile as pc
    path = _fake_kernel_module(tmp_path, {8})
    jobs = [pc.Job(path, (torch.float32,), (("a", "*fp32"),), 8),
            pc.Job(_fake_kernel_module(tmp_path / "ok", set()), (torch.float32,), (("a", "*fp32"),), 4)]
    with config.override(cache_dir=str(tmp_path / "cache"), compile_workers=2):
        pc.precompile(jobs).wait()
        assert len(inline_gpu_pool) == 2
        assert pc.marker(jobs[0]).read_text().startswith("4 k_fake ")
        assert pc.marker(jobs[1]).read_text() == ""
        key = ((path, "k_fake"), (("num_warps", 8),))
        assert launcher_mod.REFUSED == {key: {"num_warps": 4}}

        # the launcher of that kernel body (same module file and name) launches at 4 warps at once
        fn = RefusingJit(refused={8})
        fn.fn = pc._load_function(path).fn
        k = _launcher(fn)
        k[(1,)](Ptr(4096), num_warps=8)
        assert [e[:2] for e in fn.log] == [("jit", 4)] and fn.warmups == []

        launcher_mod.REFUSED.clear()          # a later process: markers only
        pc._DONE.clear()
        assert pc.precompile(jobs).futures == [] and len(inline_gpu_pool) == 2
        assert launcher_mod.REFUSED == {key: {"num_warps": 4}}



def test_a_refused_grid_barrier_kernel_replans_its_graph_without_barriers(monkeypatch):
    """The layer-norm backward is one global launch here.  Its grid-barrier kernel (one
    with a `counter` parameter) refused at every warp count, as Triton 3.6 refused a
    float16 global launch of the fuzz tests at 1-8 warps (bench/NOTES.md, forty-third
    session), the graph is planned again without grid barriers at its first call (its
    phases as launches of their own) and runs stitched: results as eager's, no eager
    fallback, explain says why."""
    real_bind = wrapper.bind_launchers
    monkeypatch.setattr(wrapper, "bind_launchers",
                        lambda functions: real_bind({n: Refusing(f, lambda options, barrier="counter" in f.arg_names: barrier)
                                                    for n, f in functions.items()}))
    torch._dynamo.reset()
    backend = StitchBackend()
    x, w, b = torch.randn(37, 300), torch.randn(300), torch.randn(300)
    ins = [t.clone().requires_grad_() for t in (x, w, b)]
    ref = [t.clone().requires_grad_() for t in (x, w, b)]
    with warnings.catch_warnings():
        warnings.simplefilter("error")      # a graph run eagerly would warn
        f = torch.compile(norm_softmax_gelu, backend=backend)
        out = f(*ins)
        cot = torch.randn_like(out)
        out.backward(cot)
    expected = norm_softmax_gelu(*ref)
    expected.backward(cot)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
    for a, e in zip(ins, ref):
        torch.testing.assert_close(a.grad, e.grad, rtol=1e-4, atol=1e-4)
    back = next(r for r in backend.records if r.kind == "backward")
    assert back.eager_reason is None and "without grid barriers" in back.replan_note
    assert back.plan is not None and not any(g.kind == "global" for g in back.plan.groups)
    assert "counter" not in back.wrapper_source
    assert "planned again without grid barriers" in stitchml.Report(backend.records).to_text()


def test_a_refused_column_tail_kernel_replans_its_graph_with_one_loop_a_row(monkeypatch):
    """Triton 3.6 refused a float16 fuzz kernel (seeds 24400-25199, recorded and replayed)
    at every warp count: a looped row's whole column blocks and its partial block in two
    loops, a value of the first used in the second ("operand does not dominate this
    use").  Such a kernel refused here by a stand-in, the graph is planned again without
    column tails (one masked loop a row) and runs stitched: results as eager's, no eager
    fallback, explain says why."""
    def two_loops(f) -> bool:   # a second loop over the partial block (or over aligned whole blocks)
        src = inspect.getsource(f.fn if hasattr(f, "fn") else f)
        return bool(re.search(r"for cbase in range\([1-9]", src)) or "whole" in src
    real_bind = wrapper.bind_launchers
    monkeypatch.setattr(wrapper, "bind_launchers",
                        lambda functions: real_bind({n: Refusing(f, lambda options, refused=two_loops(f): refused)
                                                    for n, f in functions.items()}))
    torch._dynamo.reset()
    backend = StitchBackend()
    x = torch.randn(6, 5000)      # rows looped in column blocks, the last one partial
    with warnings.catch_warnings(), config.override(persistent_max_cols=1024, loop_block_cols=1024):
        warnings.simplefilter("error")      # a graph run eagerly would warn
        out = torch.compile(lambda t: torch.softmax(t * 1.5, -1), backend=backend)(x)
    torch.testing.assert_close(out, torch.softmax(x * 1.5, -1), rtol=1e-5, atol=1e-6)
    (rec,) = backend.records
    assert rec.eager_reason is None and "column tails" in rec.replan_note
    assert not any(k.column_tail or k.row_align for k in rec.plan.kernels)
    assert any(k.mapping.form == "row_looped" for k in rec.plan.kernels)
    assert "without grid barriers or column tails" in stitchml.Report(backend.records).to_text()
