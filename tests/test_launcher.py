"""The direct launch path (runtime/launcher.py), on CPU: a stand-in for Triton's JIT
function and compiled kernel records every call, so the binding logic is checked
without a GPU (on a GPU, tests/test_gpu.py runs real kernels through it)."""
import pytest
import torch

from stitchml import config
from stitchml.runtime.launcher import Launcher, arg_spec, bind_launchers


class FakeCompiled:
    def __init__(self, log):
        self.log = log
        self.function = "fn-handle"
        self.packed_metadata = ("meta",)

    def run(self, gx, gy, gz, stream, function, metadata, launch_md, enter, exit_, *args):
        self.log.append(("direct", (gx, gy, gz), stream, function, metadata, args))


class Param:
    def __init__(self, dns=False):
        self.do_not_specialize = dns


class FakeJit:
    """`fn[grid](*args, **options)` like a JITFunction: records, returns its compiled kernel."""

    def __init__(self, nparams=3, fresh=()):
        self.log = []
        self.compiled = FakeCompiled(self.log)
        self.params = [Param(i in fresh) for i in range(nparams)]

    def __getitem__(self, grid):
        def call(*args, **options):
            self.log.append(("jit", grid, args, options))
            return self.compiled
        return call


class Ptr:
    """A tensor stand-in with a chosen address."""

    def __init__(self, addr, dtype=torch.float32):
        self.addr, self.dtype, self.device = addr, dtype, torch.device("cuda", 0)

    def data_ptr(self):
        return self.addr


def _launcher(fn):
    return Launcher(fn, stream=lambda index: 1234 + index)


def test_first_launch_through_the_jit_then_direct():
    fn = FakeJit()
    k = _launcher(fn)
    a, b = Ptr(4096), Ptr(8192)
    k[(7,)](a, b, 5, num_warps=4)
    k[(7,)](a, b, 5, num_warps=4)
    assert fn.log[0] == ("jit", (7,), (a, b, 5), {"num_warps": 4})
    kind, grid, stream, function, meta, args = fn.log[1]
    assert (kind, grid, stream, function, meta, args) == ("direct", (7, 1, 1), 1234, "fn-handle", ("meta",),
                                                            (a, b, 5))


def test_other_specialisation_goes_back_to_the_jit():
    fn = FakeJit()
    k = _launcher(fn)
    k[(2,)](Ptr(4096), Ptr(4096), 5, num_warps=4)
    k[(2,)](Ptr(4100), Ptr(4096), 5, num_warps=4)      # misaligned pointer
    k[(2,)](Ptr(4096), Ptr(4096), 16, num_warps=4)     # an int that became a multiple of 16
    k[(2,)](Ptr(4096), Ptr(4096), 1, num_warps=4)      # ... or 1
    k[(2,)](Ptr(4096, torch.bfloat16), Ptr(4096), 5, num_warps=4)   # another dtype
    k[(2,)](Ptr(8192), Ptr(4096), 7, num_warps=4)      # same specialisation again
    assert [e[0] for e in fn.log] == ["jit", "jit", "jit", "jit", "jit", "direct"]


def test_arguments_triton_does_not_specialise_on_keep_the_direct_path():
    fn = FakeJit(fresh=(2,))    # e.g. a seed: do_not_specialize
    k = _launcher(fn)
    for seed in (5, 16, 1, 12345):
        k[(3,)](Ptr(4096), Ptr(4096), seed, num_warps=4)
    assert [e[0] for e in fn.log] == ["jit", "direct", "direct", "direct"]
    k[(3,)](Ptr(4096), Ptr(4096), 2**40, num_warps=4)   # a wider integer is another type
    assert fn.log[-1][0] == "jit"


def test_grid_and_options_are_part_of_the_binding():
    fn = FakeJit()
    k = _launcher(fn)
    a = Ptr(4096)
    k[(2,)](a, a, 3, num_warps=4)
    k[(4,)](a, a, 3, num_warps=4)
    k[(2,)](a, a, 3, num_warps=8)
    k[(4,)](a, a, 3, num_warps=4)
    assert [e[0] for e in fn.log] == ["jit", "jit", "jit", "direct"]
    assert fn.log[-1][1] == (4, 1, 1)


def test_knob_off_and_interpreter_keep_the_jit():
    fn = FakeJit()
    k = _launcher(fn)
    with config.override(direct_launch=False):
        for _ in range(3):
            k[(1,)](Ptr(4096), Ptr(4096), 3, num_warps=4)
    assert [e[0] for e in fn.log] == ["jit"] * 3

    class Interpreted(FakeJit):     # the interpreter's launch returns no compiled kernel
        def __getitem__(self, grid):
            def call(*args, **options):
                self.log.append(("jit", grid, args, options))
            return call
    fn = Interpreted()
    k = _launcher(fn)
    for _ in range(3):
        k[(1,)](Ptr(4096), Ptr(4096), 3, num_warps=4)
    assert [e[0] for e in fn.log] == ["jit"] * 3 and not k.direct


def test_arg_spec_mirrors_triton_specialisation():
    t = torch.empty(8)
    assert arg_spec((t,))[0] == (t.data_ptr() % 16 == 0, torch.float32)
    assert arg_spec((1,)) == ((True, True, False),)
    assert arg_spec((32,)) == ((True, False, True),)
    assert arg_spec((2**33,)) == ((False, False, True),)
    assert arg_spec((1.5, True)) == (None, None)


def test_names_sharing_a_function_share_a_launcher():
    f, g = FakeJit(), FakeJit()
    launchers = bind_launchers({"k0": f, "k1": f, "k2": g})
    assert launchers["k0"] is launchers["k1"] and launchers["k0"] is not launchers["k2"]


# ----------------------------------------------------------------------------- launch lines (`Site`)

def _site(fn, checks, grid=(5,)):
    namespace = {}
    k = _launcher(fn)
    namespace["_L0"] = k.site(namespace, "_L0", grid, checks, num_warps=4)
    return k, namespace


def test_a_launch_line_binds_a_generated_function_into_the_wrapper_namespace():
    fn = FakeJit()
    k, ns = _site(fn, "c.")
    site = ns["_L0"]
    a, own = Ptr(4096), Ptr(8192)
    ns["_L0"](a, own, 5)
    fast = ns["_L0"]
    assert fn.log[0] == ("jit", (5,), (a, own, 5), {"num_warps": 4})
    assert fast is not site and fast.site is site and site.fast is fast
    fast(a, own, 5)
    assert fn.log[1] == ("direct", (5, 1, 1), 1234, "fn-handle", ("meta",), (a, own, 5))
    # the wrapper's source executed again (its lean version) gets the bound function back
    assert k.site(ns, "_L0", (5,), "c.", num_warps=4) is fast


def test_a_launch_line_checks_only_what_can_change_between_calls():
    fn = FakeJit()
    _, ns = _site(fn, "c.")
    ns["_L0"](Ptr(4096), Ptr(8192), 5)
    fast = ns["_L0"]
    fast(Ptr(4096), Ptr(4100), 7)                    # position 1 is the wrapper's own buffer: not checked
    assert fn.log[-1][0] == "direct"
    fast(Ptr(4100), Ptr(8192), 7)                    # a misaligned input: the JIT compiles its variant
    fast(Ptr(4096, torch.bfloat16), Ptr(8192), 7)    # an input of another dtype
    fast(Ptr(4096), Ptr(8192), 16)                   # an integer that became a multiple of 16 (past the mask)
    assert [e[0] for e in fn.log[-3:]] == ["jit", "jit", "jit"]
    fast(Ptr(8192), Ptr(4096), 9)                    # the bound specialisation again
    assert fn.log[-1][0] == "direct" and ns["_L0"] is fast


def test_a_launch_line_keeps_the_jit_under_the_interpreter_and_with_the_knob_off():
    class Interpreted(FakeJit):
        def __getitem__(self, grid):
            def call(*args, **options):
                self.log.append(("jit", grid, args, options))
            return call
    for fn, knob in ((Interpreted(), True), (FakeJit(), False)):
        _, ns = _site(fn, "..")
        site = ns["_L0"]
        with config.override(direct_launch=knob):
            for _ in range(3):
                ns["_L0"](Ptr(4096), Ptr(4096), 3)
        assert ns["_L0"] is site and [e[0] for e in fn.log] == ["jit"] * 3


def test_wrapper_marks_its_own_buffers_and_checks_the_rest():
    from stitchml.runtime.steps import Alloc, EagerCall, Launch, Layout, View
    from stitchml.runtime.wrapper import mark_checks
    steps = [Alloc("v1", (4, 8), (8, 1), torch.float32),
             View("v2", "v1", Layout((8, 4), (1, 8), 0)),
             View("v3", "v1", Layout((4, 4), (8, 1), 4)),
             View("v4", "a0", Layout((8, 4), (1, 8), 0)),
             EagerCall("v5", "C1", (), (), ("a0",)),
             Alloc("v6", (4,), (1,), torch.float32, reuse="v1"),
             Launch("k0", 2, ("a0", "v1", "v2", "v3", "v4", "v5", "v6", "h0"), 4)]
    assert mark_checks(steps)[-1].checks == "c...cc.c"
    # a dynamic template's views may move with the sizes: checked
    assert mark_checks(steps, generic=True)[-1].checks == "c.cccc.c"


@pytest.mark.gpu
def test_direct_launch_matches_the_jit_on_a_gpu():
    import triton
    import triton.language as tl

    @triton.jit(do_not_specialize=["seed"])
    def add(x, y, out, n, seed):
        i = tl.program_id(0) * 128 + tl.arange(0, 128)
        tl.store(out + i, tl.load(x + i, mask=i < n) + tl.load(y + i, mask=i < n) + seed, mask=i < n)

    k = Launcher(add)
    x, y = torch.randn(1000, device="cuda"), torch.randn(1000, device="cuda")
    for seed in (3, 16, 1):
        out = torch.full_like(x, float("nan"))
        k[(8,)](x, y, out, 1000, seed, num_warps=4)
        torch.testing.assert_close(out, x + y + seed)
    assert k.bound, "the second launch should have bound the direct path"
    out = torch.full((999,), float("nan"), device="cuda")
    k[(8,)](x[1:], y[1:], out, 999, 3, num_warps=4)     # misaligned: the JIT compiles that variant
    torch.testing.assert_close(out, x[1:] + y[1:] + 3)


# ----------------------------------------------------------------------------- `stitchml calibrate`'s launch overheads

def test_calibrate_times_the_wrapper_launch_through_the_launcher_and_the_jit():
    """On CPU (interpreter) the stitched kernel is compiled and launched the way its
    wrapper launches it; Inductor has no Triton launcher there: reported, not raised."""
    from stitchml.tools import calibrate
    res = calibrate.measure_launch_overheads("cpu", launches=2, rounds=1)
    for key in ("stitch_launcher", "stitch_triton_entry", "triton_jit", "stitch_call"):
        assert res[key]["host_us"] > 0 and res[key]["wall_us"] >= res[key]["host_us"], res[key]
    assert res["stitch_launcher"]["static"] is False and res["stitch_triton_entry"]["direct"] is False
    assert res["stitch_launcher"]["direct"] is False      # the interpreter: no compiled kernel to bind
    assert set(res["stitch_launcher"]["options"]) == {"num_warps"}   # the wrapper's call shape
    for key in ("inductor_run", "inductor_launcher", "inductor_call"):
        assert "C++" in res[key]["unavailable"]
    text = "\n".join(calibrate.describe_launch_overheads(res))
    assert "Launcher" in text and "unavailable: RuntimeError: Inductor generates C++" in text


class FakeTuner:
    """Inductor's CachingAutotuner as calibrate sees it: `run(*args, stream=...)` ends in
    its one launcher."""

    def __init__(self, launchers=1):
        self.calls = []
        self.launchers = [self._launch for _ in range(launchers)]

    def _launch(self, *args, stream):
        self.calls.append(("launcher", args, stream))

    def run(self, *args, stream):
        self.calls.append(("run", args, stream))


def test_calibrate_times_inductor_through_run_and_its_launcher(monkeypatch):
    from stitchml.tools import calibrate
    tuner, whole = FakeTuner(), []
    monkeypatch.setattr(calibrate, "inductor_launch",
                        lambda device: (tuner, ("x", 4096), {"stream": 7}, lambda: whole.append(1)))
    res = calibrate.measure_launch_overheads("cpu", launches=3, rounds=2)
    assert res["inductor_run"]["host_us"] > 0 and res["inductor_run"]["kernel"] == "FakeTuner"
    assert res["inductor_launcher"]["host_us"] > 0 and "_launch" in res["inductor_launcher"]["kernel"]
    assert res["inductor_call"]["launches"] == 3
    runs = [c for c in tuner.calls if c[0] == "run"]
    assert len(runs) == 1 + 3 * 2 and runs[0] == ("run", ("x", 4096), 7)   # the first launch is not timed
    assert len(whole) == 1 + 3 * 2


def test_calibrate_reports_missing_inductor_pieces_instead_of_failing(monkeypatch):
    from stitchml.tools import calibrate

    def no_inductor(device):
        raise ImportError("torch._inductor.runtime.triton_heuristics moved")
    monkeypatch.setattr(calibrate, "inductor_launch", no_inductor)
    res = calibrate.measure_launch_overheads("cpu", launches=1, rounds=1)
    assert all(res[k]["unavailable"].startswith("ImportError: torch._inductor") for k in
               ("inductor_run", "inductor_launcher", "inductor_call"))
    assert res["stitch_launcher"]["host_us"] > 0
    monkeypatch.setattr(calibrate, "inductor_launch",
                        lambda device: (FakeTuner(launchers=2), (), {"stream": 0}, lambda: None))
    res = calibrate.measure_launch_overheads("cpu", launches=1, rounds=1)
    assert res["inductor_run"]["host_us"] > 0 and "2 launchers" in res["inductor_launcher"]["unavailable"]


def test_recording_puts_methods_back_as_they_were():
    from stitchml.tools.calibrate import recording

    class Base:
        def f(self, x):
            return x + 1

    class Child(Base):
        pass

    with recording(Child, "f") as seen:
        assert Child().f(2) == 3 and Base().f(5) == 6
    assert [(args, kwargs) for _, args, kwargs in seen] == [((2,), {})]
    assert "f" not in vars(Child) and Child.f is Base.f
    with recording(Base, "f"):
        pass
    assert vars(Base)["f"](None, 1) == 2 and Base.f.__name__ == "f"


@pytest.mark.gpu
def test_calibrate_launch_overheads_on_a_gpu():
    from stitchml.tools import calibrate
    res = calibrate.measure_launch_overheads("cuda", launches=500, rounds=3)
    print("\n".join(calibrate.describe_launch_overheads(res)))
    ours, jit = res["stitch_launcher"], res["triton_jit"]
    assert ours["direct"], "the Launcher did not bind its direct path"
    assert ours["static"], "the launch line was not bound through torch's static launcher"
    assert res["stitch_triton_entry"]["direct"], res["stitch_triton_entry"]
    assert ours["host_us"] < jit["host_us"], (ours, jit)
    for key in ("inductor_run", "inductor_launcher", "inductor_call"):
        assert "host_us" in res[key] or res[key]["unavailable"], res[key]


def test_other_argument_kinds_keep_or_leave_the_binding():
    """Floats, booleans and None are not specialised on; an argument that changes kind
    (a tensor where an int was, fewer arguments) goes back to the JIT."""
    fn = FakeJit(nparams=5)
    k = _launcher(fn)
    a = Ptr(4096)
    k[(1,)](a, 2.5, True, None, 3, num_warps=4)
    k[(1,)](a, -7.0, False, None, 5, num_warps=4)          # same kinds: direct
    k[(1,)](a, 2.5, True, None, Ptr(4096), num_warps=4)    # an int became a pointer
    k[(1,)](a, 2.5, True, None, num_warps=4)               # one argument fewer
    k[(1,)](a, 3, True, None, 3, num_warps=4)              # a float became an int
    assert [e[0] for e in fn.log] == ["jit", "direct", "jit", "jit", "jit"]


def test_host_time_binds_every_launch_line_of_a_real_wrapper():
    """`tools/host_time`: a BERT-shaped training step whose kernels are swapped for dry
    compiled ones after the first call — every launch line of both wrappers binds its
    generated function (the path a GPU takes), and a step launches through them."""
    from stitchml.tools import host_time
    r = host_time.measure(layers=1, rounds=2, per_round=1)
    assert r["graphs"] == 2 and r["launches_per_step"] > 5 and r["step_us"] > 0
    assert r["sites"] > 5 and r["sites_bound"] == r["sites"], r


# ----------------------------------------------------------------------------- torch's static launcher

class StaticCompiled(FakeCompiled):
    """A compiled kernel as torch's static launcher reads it: its cubin, hash and source
    signature (argument 2 an integer Triton made a constant: equal to 1)."""

    def __init__(self, log):
        super().__init__(log)
        self.metadata = type("Meta", (), {"num_warps": 4, "shared": 0})()
        self.asm = {"cubin": b"\x7fELF fake cubin"}
        self.hash = "abc123"
        fn = type("Fn", (), {"__name__": "k7", "arg_names": ["in0", "out1", "n", "seed"]})()
        self.src = type("Src", (), {"fn": fn, "signature": {"in0": "*fp32", "out1": "*fp32", "n": "constexpr",
                                                           "seed": "i32"}, "constants": {}})()


class FakeStatic:
    """torch's `StaticallyLaunchedCudaKernel` as the launcher uses it: built from the
    compiled kernel (reading `_cubin_path`), loaded on a device, `run(gx, gy, gz,
    stream, *args)` with the arguments the cubin takes."""
    made: list = []

    def __init__(self, kernel):
        self.cubin_path = kernel._cubin_path
        self.loaded = None
        FakeStatic.made.append(self)

    def load_kernel(self, device):
        self.loaded = device

    def run(self, gx, gy, gz, stream, *args):
        self.log.append(("static", (gx, gy, gz), stream, args))


class StaticJit(FakeJit):
    def __init__(self, nparams=4):
        super().__init__(nparams)
        self.compiled = StaticCompiled(self.log)


@pytest.fixture
def fake_static(monkeypatch, tmp_path):
    from stitchml.runtime import launcher
    FakeStatic.made = []
    monkeypatch.setattr(launcher, "_static_class", lambda: FakeStatic)
    with config.override(cache_dir=str(tmp_path)):
        yield tmp_path


def _bind_log(fn):
    for s in FakeStatic.made:
        s.log = fn.log


def test_bound_launches_go_through_torchs_static_launcher_without_constants(fake_static):
    """The first launch binds (JIT); later ones call the static launcher's `run` with the
    grid, the stream, and the arguments less the one Triton compiled as a constant; the
    cubin is written under the cache folder and loaded on the arguments' device."""
    fn = StaticJit()
    k = _launcher(fn)
    a, b = Ptr(4096), Ptr(8192)
    k[(6,)](a, b, 1, 77, num_warps=4)
    (static,) = FakeStatic.made
    _bind_log(fn)
    k[(6,)](a, b, 1, 78, num_warps=4)
    assert fn.log[-1] == ("static", (6, 1, 1), 1234, (a, b, 78))
    assert static.loaded == 0 and static.cubin_path.startswith(str(fake_static))
    with open(static.cubin_path, "rb") as f:
        assert f.read() == b"\x7fELF fake cubin"
    # a launch line of a wrapper binds the same way
    ns = {}
    ns["_L0"] = k.site(ns, "_L0", (3, 2), "c.cc", num_warps=4)
    ns["_L0"](a, b, 1, 5)
    _bind_log(fn)
    ns["_L0"](a, b, 1, 9)
    assert fn.log[-1] == ("static", (3, 2, 1), 1234, (a, b, 9))
    # an argument that specialises otherwise (n no longer 1) goes back to the JIT
    ns["_L0"](a, b, 2, 9)
    assert fn.log[-1][0] == "jit"


def test_a_kernel_the_static_launcher_refuses_keeps_tritons_entry_point(fake_static, monkeypatch, caplog):
    class Refusing(FakeStatic):
        def __init__(self, kernel):
            raise NotImplementedError("Shared memory size > 48KB requires special triton handling")
    from stitchml.runtime import launcher
    monkeypatch.setattr(launcher, "_static_class", lambda: Refusing)
    fn = StaticJit()
    k = _launcher(fn)
    a = Ptr(4096)
    with caplog.at_level("INFO", logger="stitchml.runtime.launcher"):
        k[(2,)](a, a, 1, 5, num_warps=4)
        k[(2,)](a, a, 1, 6, num_warps=4)
    assert fn.log[-1] == ("direct", (2, 1, 1), 1234, "fn-handle", ("meta",), (a, a, 1, 6))
    assert "48KB" in caplog.text
    # the knob off: Triton's entry point, torch's class never built
    FakeStatic.made = []
    monkeypatch.setattr(launcher, "_static_class", lambda: FakeStatic)
    fn = StaticJit()
    k = _launcher(fn)
    with config.override(static_launch=False):
        k[(2,)](a, a, 1, 5, num_warps=4)
        k[(2,)](a, a, 1, 6, num_warps=4)
    assert fn.log[-1][0] == "direct" and not FakeStatic.made


def test_constant_positions_read_names_indices_and_old_constants():
    from stitchml.runtime.launcher import constant_positions
    kernel = StaticCompiled([])
    assert constant_positions(kernel) == {2}
    kernel.src.signature = {0: "*fp32", 1: "*fp32", 2: "i32", 3: "i32"}
    kernel.src.constants = {(3,): 1}      # Triton 3.2's form: constants apart, keyed by index tuples
    assert constant_positions(kernel) == {3}


@pytest.mark.gpu
def test_static_launcher_matches_the_jit_on_a_gpu():
    """Real kernels through torch's static launcher: an integer equal to 1 (a constant
    in the cubin) among the arguments, several grids."""
    import triton
    import triton.language as tl

    from stitchml.runtime import launcher

    @triton.jit(do_not_specialize=["seed"])
    def axpy(x, y, out, n, a, seed):
        i = tl.program_id(0) * 128 + tl.arange(0, 128)
        v = tl.load(x + i, mask=i < n) * a + tl.load(y + i, mask=i < n) + seed
        tl.store(out + i, v, mask=i < n)

    assert launcher._static_class() is not None
    k = Launcher(axpy)
    x, y = torch.randn(1000, device="cuda"), torch.randn(1000, device="cuda")
    for a in (1, 3):
        for seed in (3, 16, 1):
            out = torch.full_like(x, float("nan"))
            k[(8,)](x, y, out, 1000, a, seed, num_warps=4)
            torch.testing.assert_close(out, x * a + y + seed)
    assert k.bound and any(entry[1].__code__.co_names[0] == "SRUN" for entry in k.bound.values()), \
        "expected a binding through torch's static launcher"
