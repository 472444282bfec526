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
