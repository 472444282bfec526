"""A direct launch path for compiled kernels.

Triton's `JITFunction.run` does per launch: bind arguments to parameters, compute the
specialisation of every argument, hash it into a cache key, look the compiled kernel
up, build launch metadata, then call the compiled kernel's entry point.  That is most
of a stitched kernel's host cost (13.4 µs a launch on an H100, issue 12).

`Launcher` keeps the call shape the wrapper uses (`kernel[(grid,)](*args,
num_warps=N)`).  The first launch of a kernel at a grid goes through the JIT (which
compiles, or loads from Triton's cache, and launches); the launcher keeps the compiled
kernel it returns together with the argument specialisation it was compiled for.
Later launches whose arguments have the same specialisation call the compiled entry
point directly: `run(grid, 1, 1, stream, function, packed_metadata, None, None, None,
*args)`.  A launch whose arguments specialise differently (a pointer that is not
16-byte aligned, an integer that became 1 or a multiple of 16) goes through the JIT
again, which compiles the variant it needs: never a kernel compiled for other
arguments.

The stream is read per launch (a cheap C call): CUDA-graph capture runs on a side
stream.  Under the Triton interpreter the JIT returns no compiled kernel, so every
launch goes through it.  Knob: `direct_launch`.

Host cost.  The check that a launch's arguments specialise as the bound ones did is
one expression compiled per binding (`_spec_check`: unrolled, no tuples built), and
the launch callable of each grid is made once (`__getitem__`): with 8 tensors and 3
integers, and Triton's `run` replaced by a no-op, the Python part of a launch took about
half the time of the spec tuples and per-call closure before (15.1 → 7.8 µs, medians of
one run on the loaded 2-core CPU machine; `bench/NOTES.md`, thirteenth session).
"""
from __future__ import annotations

from typing import Any, Callable

from .. import config

_I32 = (-2**31, 2**31)


def arg_spec(args: tuple) -> tuple:
    """What Triton specialises a kernel on, per argument: a tensor's dtype and 16-byte
    alignment; an integer's width, whether it is 1 and whether it is a multiple of 16.
    (The launch path checks the same as one compiled expression, `_spec_check`.)"""
    out = []
    for a in args:
        ptr = getattr(a, "data_ptr", None)
        if ptr is not None:
            out.append((ptr() % 16 == 0, getattr(a, "dtype", None)))
        elif isinstance(a, bool) or not isinstance(a, int):
            out.append(None)
        else:
            out.append((_I32[0] <= a < _I32[1], a == 1, a % 16 == 0))
    return tuple(out)


def _spec_check(args: tuple, fresh: frozenset[int]) -> Callable[[tuple], bool]:
    """A function of a launch's arguments that is true when they specialise as `args`
    did (`arg_spec`, with `fresh` arguments' width only): one unrolled expression,
    compiled once per binding, instead of building and comparing spec tuples."""
    terms, env = [f"len(a) == {len(args)}"], {}
    for i, a in enumerate(args):
        if getattr(a, "data_ptr", None) is not None:
            env[f"d{i}"] = getattr(a, "dtype", None)
            aligned = "==" if a.data_ptr() % 16 == 0 else "!="
            terms.append(f"a[{i}].data_ptr() % 16 {aligned} 0 and a[{i}].dtype is d{i}")
        elif isinstance(a, int) and not isinstance(a, bool):
            wide = "" if _I32[0] <= a < _I32[1] else "not "
            terms.append(f"type(a[{i}]) is int and {wide}({_I32[0]} <= a[{i}] < {_I32[1]})")
            if i not in fresh:
                terms.append(f"(a[{i}] == 1) is {a == 1} and (a[{i}] % 16 == 0) is {a % 16 == 0}")
        else:
            terms.append(f"not hasattr(a[{i}], 'data_ptr') and (type(a[{i}]) is not int)")
    return eval("lambda a: " + " and ".join(terms), env)   # noqa: S307 (text built above from types only)


def _hooks_active() -> bool:
    """Whether a launch hook is installed (Triton ≥ 3.4 keeps them in hook chains, empty
    unless a tool adds one; older versions keep a callable or None).  Checked when a
    kernel is bound: a hook added later sees JIT launches only."""
    try:
        import triton
        runtime = triton.knobs.runtime
    except (ImportError, AttributeError):
        return False
    for hook in (runtime.launch_enter_hook, runtime.launch_exit_hook):
        if hook is not None and (getattr(hook, "calls", None) is None or hook.calls):
            return True
    return False


def _stream_getter() -> Callable[[int], int]:
    import torch
    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    if raw is not None:
        return raw
    return lambda index: torch.cuda.current_stream(index).cuda_stream


class Launcher:
    """`launcher[(grid,)](*args, num_warps=N)` like the Triton function it wraps."""

    __slots__ = ("fn", "bound", "fresh", "stream", "direct", "grids")

    def __init__(self, fn: Any, stream: Callable[[int], int] | None = None):
        self.fn = fn
        # (grid, options) -> (spec check, run, gx, gy, gz, function, metadata, device)
        self.bound: dict[tuple, tuple] = {}
        params = getattr(fn, "params", None)  # JITFunction parameters (absent in the interpreter)
        self.fresh = frozenset(i for i, p in enumerate(params or ()) if getattr(p, "do_not_specialize", False))
        self.stream = stream
        self.direct = True
        self.grids: dict[tuple, Callable] = {}   # grid -> its launch callable, made once

    def __getitem__(self, grid: tuple) -> Callable:
        launch = self.grids.get(grid)
        if launch is None:
            def launch(*args, **options):
                return self.launch(grid, args, options)
            self.grids[grid] = launch
        return launch

    def launch(self, grid: tuple, args: tuple, options: dict) -> None:
        key = (grid, tuple(options.items()))   # (a call site passes its options in one order)
        bound = self.bound.get(key)
        if bound is not None:
            ok, run, gx, gy, gz, function, metadata, device = bound
            if ok(args):
                run(gx, gy, gz, self.stream(device), function, metadata, None, None, None, *args)
                return
        kernel = self.fn[grid](*args, **options)   # the JIT: compiles or loads, then launches
        if bound is None and self.direct and config.get("direct_launch"):
            self._bind(key, args, kernel)

    def _bind(self, key: tuple, args: tuple, kernel: Any) -> None:
        run = getattr(kernel, "run", None)
        function = getattr(kernel, "function", None)
        metadata = getattr(kernel, "packed_metadata", None)
        if run is None or function is None or metadata is None:
            self.direct = False   # no compiled kernel (the interpreter): the JIT it is
            return
        if _hooks_active():
            self.direct = False   # a profiler hooks launches (proton): keep the JIT path so it sees them
            return
        device = next((a.device.index for a in args if hasattr(a, "data_ptr") and hasattr(a, "device")), 0)
        if self.stream is None:
            self.stream = _stream_getter()
        grid = key[0]
        self.bound[key] = (_spec_check(args, self.fresh), run, grid[0], grid[1] if len(grid) > 1 else 1,
                           grid[2] if len(grid) > 2 else 1, function, metadata, device or 0)


def bind_launchers(functions: dict[str, Any]) -> dict[str, Launcher]:
    """A launcher per kernel name; names that share a Triton function share its launcher."""
    by_fn: dict[int, Launcher] = {}
    return {name: by_fn.setdefault(id(fn), Launcher(fn)) for name, fn in functions.items()}


__all__ = ["Launcher", "arg_spec", "bind_launchers"]
