"""A direct launch path for compiled kernels.

Triton's `JITFunction.run` does per launch: bind arguments to parameters, compute the
specialisation of every argument, hash it into a cache key, look the compiled kernel
up, build launch metadata, then call the compiled kernel's entry point.  That is most
of a stitched kernel's host cost (13.4 µs a launch on an H100, issue 12).

`Launcher` keeps the call shape of Triton's functions (`kernel[(grid,)](*args,
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

Torch's static CUDA launcher.  Triton's compiled entry point is C, but it checks every
pointer argument with a driver call and goes through launch metadata and hooks; torch
ships a launcher for Triton cubins (`torch._C._StaticCudaLauncher`, wrapped by
`StaticallyLaunchedCudaKernel`, what Inductor launches its kernels with) that takes the
arguments as they are.  Where it is importable and takes the kernel (no launch
attributes, cubin written to our cache folder and loaded), a bound launch calls its
`run(gx, gy, gz, stream, *args)` with the arguments Triton did not turn into constants;
anything it refuses, or that fails while binding, keeps Triton's entry point (logged
once).  Knob: `static_launch`.  (The calibrate tool measures both paths.)

Launch lines.  A wrapper launches a kernel at a fixed grid through a `Site`, one per
line of its source (`_L3 = k4.site(globals(), "_L3", (grid,), checks, num_warps=N)` at
module level, `_L3(*args)` in `call`).  The site's first launch goes through the JIT
and binds: it replaces itself in the wrapper's namespace by a function generated for
that line, whose only work is to check the arguments that can change between calls
and to call the compiled entry point.  The wrapper marks which those are
(`wrapper.mark_checks`): its own buffers, allocated in the call or views of them at
fixed offsets, keep their dtype and 16-byte alignment, so only inputs, eager results
and integers are checked.  Launches whose grid is a size expression (dynamic
templates) keep `launcher[(grid,)](*args, num_warps=N)`.

Host cost (the Python part; Triton's `run` replaced by a no-op, 8 tensors and 3
integers, the loaded 2-core CPU machine): spec tuples and a per-call closure 15.1 µs;
one compiled check expression per binding (`_spec_check`) and a launch callable per
grid 7.8 µs (thirteenth session) and 2.6 µs on a quieter run; a launch line with 6 of
the 8 tensors the wrapper's own 0.73 µs (1.55 µs with every argument checked).
`bench/NOTES.md`, sixteenth session.

A kernel Triton refuses.  The first launch is where Triton compiles a kernel, and a
compiler can refuse a kernel it should take: Triton 3.6 (torch 2.11's) rejects a few
half-precision kernels at some warp counts with "operand does not dominate this use"
in its layout pass, and the same kernels compile at others (bench/NOTES.md,
forty-second session).  Where the JIT raises, the launcher asks whether the kernel
compiles at all (`warmup`: compile, no launch); if not, it is a refusal and the
launcher tries the other warp counts (`_retry_warps`: halves first, then doubles),
keeping the first that compiles for every later launch of that kernel body (`REFUSED`,
keyed by its module file and name), and logs it (`RETRIES`, shown by explain).  The
compile pool retries the same way before the first launch (runtime/precompile.py) and
fills `REFUSED`, and its marker keeps the warps for a later process, so the refused
compile is not repeated at the launch.  Warps change how a program's threads share its block,
never what it computes; kernels with a grid barrier (a `maxnreg` launch option) are
not retried, since their grid was sized for co-residency at the planned warps.  An
error from a kernel that compiles (a fault at run time) is raised as it was.
Knob: `retry_refused_kernels`.
"""
from __future__ import annotations

import logging
from typing import Any, Callable

from .. import config

_I32 = (-2**31, 2**31)
log = logging.getLogger(__name__)

# Kernels Triton refused at their planned launch options, and the options it compiled
# instead: (kernel origin, planned options) -> options.  Filled by a launch's retry
# (`Launcher.compiling_options`) and by the compile pool (`precompile`), so that a
# kernel is compiled at its refused warp count once, not at every launch site.
REFUSED: dict[tuple, dict] = {}
# What explain lists: (kernel function name, planned warps, warps used, the refusal's first line).
RETRIES: list[tuple[str, int, int, str]] = []
_WARPS = (1, 2, 4, 8, 16)


def _retry_warps(planned: int) -> list[int]:
    """Warp counts to try after `planned` was refused: fewer first (each halving), then
    more (each doubling), within 1-16."""
    fewer = sorted((w for w in _WARPS if w < planned), reverse=True)
    return fewer + [w for w in _WARPS if w > planned]


def compiling_warps(compile_at: Callable[[int], Any], planned: int) -> int | None:
    """The first warp count after `planned` (`_retry_warps` order) at which
    `compile_at(warps)` does not raise; None if every one does."""
    for warps in _retry_warps(planned):
        try:
            compile_at(warps)
        except Exception:
            continue
        return warps
    return None


def kernel_origin(fn: Any) -> tuple[str, str]:
    """(file, function name) of a Triton function: what names one kernel body in this
    process and in the compile pool's workers (both load it from the same module file)."""
    inner = getattr(fn, "fn", fn)
    code = getattr(inner, "__code__", None)
    return (code.co_filename if code is not None else f"<{id(fn)}>", getattr(inner, "__name__", type(fn).__name__))


def note_refusal(origin: tuple[str, str], options: dict, warps: int, reason: str) -> dict:
    """Record that Triton refused `origin` at `options` and compiled it at `warps`
    (logged, listed by explain); the options later launches use."""
    other = {**options, "num_warps": warps}
    REFUSED[(origin, tuple(options.items()))] = other
    planned = int(options.get("num_warps", 4))
    RETRIES.append((origin[1], planned, warps, reason))
    log.warning("stitchml: Triton refused kernel %s at %d warps (%s); it runs at %d warps",
                origin[1], planned, reason, warps)
    return other


class KernelRefused(RuntimeError):
    """Triton refused a kernel at its first launch and no other warp count helps: every
    count refused, or a grid-barrier kernel, whose warps are not changed.  `barrier`: it
    has a grid barrier (the graph may be planned again without them: compiler.py)."""

    def __init__(self, origin: tuple[str, str], reason: str, barrier: bool):
        what = ("a grid-barrier kernel (not retried at other warp counts)" if barrier
                else "at every warp count")
        super().__init__(f"Triton refused kernel {origin[1]} {what}: {reason}")
        self.origin, self.reason, self.barrier = origin, reason, barrier


def launch_options(num_warps: int, maxnreg: int | None = None, pdl: bool = False) -> dict[str, Any]:
    """A kernel's launch options in the one order every caller passes them (a wrapper's
    launch line, the compile pool's job): a refused kernel's options key both (`REFUSED`)."""
    out: dict[str, Any] = {"num_warps": num_warps}
    if maxnreg:
        out["maxnreg"] = maxnreg
    if pdl:
        out["launch_pdl"] = True
    return out


def refusal_reason(error: BaseException) -> str:
    """`Type: first line` of a compiler's error (its message can be pages of IR)."""
    first = (str(error).strip().splitlines() or [""])[0][:200]
    return f"{type(error).__name__}: {first}" if first else type(error).__name__


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


def _spec_terms(args: tuple, fresh: frozenset[int], name: Callable[[int], str], env: dict,
                skip: str = "") -> list[str]:
    """The terms of `_spec_check` for the arguments `args` (one per position, `name(i)`
    its expression in the generated code, dtypes put in `env`); positions marked "."
    in `skip` are left out (a wrapper's own buffers: the same dtype and alignment at
    every call)."""
    terms = []
    for i, a in enumerate(args):
        if i < len(skip) and skip[i] == ".":
            continue
        x = name(i)
        if getattr(a, "data_ptr", None) is not None:
            env[f"d{i}"] = getattr(a, "dtype", None)
            aligned = "==" if a.data_ptr() % 16 == 0 else "!="
            terms.append(f"{x}.data_ptr() % 16 {aligned} 0 and {x}.dtype is d{i}")
        elif isinstance(a, int) and not isinstance(a, bool):
            wide = "" if _I32[0] <= a < _I32[1] else "not "
            terms.append(f"type({x}) is int and {wide}({_I32[0]} <= {x} < {_I32[1]})")
            if i not in fresh:
                terms.append(f"({x} == 1) is {a == 1} and ({x} % 16 == 0) is {a % 16 == 0}")
        else:
            terms.append(f"not hasattr({x}, 'data_ptr') and (type({x}) is not int)")
    return terms


def _spec_check(args: tuple, fresh: frozenset[int]) -> Callable[[tuple], bool]:
    """A function of a launch's arguments that is true when they specialise as `args`
    did (`arg_spec`, with `fresh` arguments' width only): one unrolled expression,
    compiled once per binding, instead of building and comparing spec tuples."""
    env: dict = {}
    terms = [f"len(a) == {len(args)}"] + _spec_terms(args, fresh, lambda i: f"a[{i}]", env)
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


def _static_class() -> Any:
    """Torch's `StaticallyLaunchedCudaKernel` (its module was renamed in torch 2.13), or
    None where this torch has none."""
    try:
        from torch._inductor.runtime.static_triton_launcher import StaticallyLaunchedCudaKernel
    except ImportError:
        try:
            from torch._inductor.runtime.static_cuda_launcher import StaticallyLaunchedCudaKernel
        except ImportError:
            return None
    return StaticallyLaunchedCudaKernel


def constant_positions(kernel: Any) -> frozenset[int]:
    """Argument positions Triton compiled as constants (an integer equal to 1, declared
    constexprs): the cubin has no parameter for them, so a direct launch leaves them
    out.  Read from the compiled kernel's source signature (name or index keys)."""
    src = kernel.src
    names = list(getattr(src.fn, "arg_names", ()))

    def index(key: Any) -> int:
        if isinstance(key, str):
            return names.index(key)
        return key[0] if isinstance(key, tuple) else key
    out = {index(k) for k, ty in src.signature.items() if ty == "constexpr"}
    out |= {index(k) for k in getattr(src, "constants", {})}
    return frozenset(out)


_STATIC_REFUSED: set[str] = set()   # reasons already logged


def static_entry(kernel: Any, nargs: int, device: int) -> tuple | None:
    """(run, kept argument positions) of torch's static launcher for a compiled Triton
    kernel, or None (knob off, no such launcher, or it refused the kernel: the reason is
    logged once)."""
    if not config.get("static_launch"):
        return None
    cls = _static_class()
    if cls is None:
        return None
    try:
        meta = kernel.metadata
        if getattr(meta, "launch_pdl", False) or getattr(meta, "launch_cooperative_grid", False):
            raise NotImplementedError("launch attributes")
        cubin = kernel.asm["cubin"]
        from .kernel_cache import atomic_write, cache_root
        path = cache_root() / "cubin" / str(kernel.hash) / f"{kernel.src.fn.__name__}.cubin"
        if not path.exists():
            atomic_write(path, cubin)
        kernel._cubin_path = str(path)    # where torch's class reads the binary from
        static = cls(kernel)
        try:
            static.load_kernel(device)
        except TypeError:                 # (torch before 2.12: no device argument)
            static.load_kernel()
        consts = constant_positions(kernel)
        return static.run, tuple(i for i in range(nargs) if i not in consts)
    except Exception as e:   # any refusal: Triton's own entry point launches it
        reason = f"{type(e).__name__}: {e}"
        if reason not in _STATIC_REFUSED:
            _STATIC_REFUSED.add(reason)
            log.info("stitchml: torch's static launcher refused a kernel (%s); Triton's launcher is used", reason)
        return None


def _stream_getter() -> Callable[[int], int]:
    import torch
    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    if raw is not None:
        return raw
    return lambda index: torch.cuda.current_stream(index).cuda_stream


class Launcher:
    """`launcher[(grid,)](*args, num_warps=N)` like the Triton function it wraps; and
    `launcher.site(...)`, one launch line of a wrapper (`Site`)."""

    __slots__ = ("fn", "bound", "fresh", "stream", "direct", "grids", "sites", "origin")

    def __init__(self, fn: Any, stream: Callable[[int], int] | None = None):
        self.fn = fn
        # (grid, options) -> (spec check, run, gx, gy, gz, function, metadata, device)
        self.bound: dict[tuple, tuple] = {}
        params = getattr(fn, "params", None)  # JITFunction parameters (absent in the interpreter)
        self.fresh = frozenset(i for i, p in enumerate(params or ()) if getattr(p, "do_not_specialize", False))
        self.stream = stream
        self.direct = True
        self.grids: dict[tuple, Callable] = {}   # grid -> its launch callable, made once
        self.sites: dict[str, Site] = {}         # a wrapper's launch lines, by name
        self.origin = kernel_origin(fn)          # the key of its refusals (REFUSED)

    def __getitem__(self, grid: tuple) -> Callable:
        launch = self.grids.get(grid)
        if launch is None:
            def launch(*args, **options):
                return self.launch(grid, args, options)
            self.grids[grid] = launch
        return launch

    def jit(self, grid: tuple, args: tuple, options: dict) -> Any:
        """A launch through Triton's JIT (compiles or loads, then launches); the
        compiled kernel it returns (None under the interpreter)."""
        if REFUSED:
            options = REFUSED.get((self.origin, tuple(options.items())), options)
        if config.get("record_launches"):
            from .launch_record import record
            record(self.fn, args, options)
        try:
            return self.fn[grid](*args, **options)
        except Exception as error:
            other = self.compiling_options(grid, args, options, error)
            if other is None:
                raise
            return self.fn[grid](*args, **other)

    def compiling_options(self, grid: tuple, args: tuple, options: dict, error: Exception) -> dict | None:
        """After the JIT raised `error`: launch options at which Triton compiles the
        kernel it refused at `options` (other warps), remembered for later launches
        (`REFUSED`); None where the kernel compiles as planned (the error is not a
        refusal) or nothing is tried (knob off, no `warmup`: the interpreter).  A refusal
        no other warp count mends (every count refused, or a grid-barrier kernel: its
        grid was sized for co-residency at the planned warps) raises `KernelRefused`."""
        warmup = getattr(self.fn, "warmup", None)
        if warmup is None or not config.get("retry_refused_kernels"):
            return None
        try:
            warmup(*args, grid=grid, **options)
            return None            # it compiles: the error came from the launch or the kernel's run
        except Exception:
            pass
        reason = refusal_reason(error)
        if "maxnreg" in options:
            raise KernelRefused(self.origin, reason, barrier=True) from error
        warps = compiling_warps(lambda w: warmup(*args, grid=grid, **{**options, "num_warps": w}),
                                int(options.get("num_warps", 4)))
        if warps is None:
            raise KernelRefused(self.origin, reason, barrier=self._barrier_kernel()) from error
        return note_refusal(self.origin, options, warps, reason)

    def _barrier_kernel(self) -> bool:
        """Whether the kernel takes a grid-barrier counter (its parameters name one)."""
        return "counter" in (getattr(self.fn, "arg_names", None) or ())

    def launch(self, grid: tuple, args: tuple, options: dict) -> None:
        key = (grid, tuple(options.items()))   # (a call site passes its options in one order)
        bound = self.bound.get(key)
        if bound is not None:
            ok, fire, device = bound
            if ok(args):
                fire(args, self.stream(device))
                return
        kernel = self.jit(grid, args, options)
        if bound is None:
            entry = self.entry(kernel, args)
            if entry is not None:
                env = {"run": entry[0], "FN": entry[1], "META": entry[2], "SRUN": entry[4] and entry[4][0]}
                call = _call_text(_grid3(grid), "s", [f"a[{i}]" for i in range(len(args))], entry[4])
                fire = eval(f"lambda a, s: {call}", env)   # noqa: S307 (text built from positions only)
                self.bound[key] = (_spec_check(args, self.fresh), fire, entry[3])

    def entry(self, kernel: Any, args: tuple) -> tuple | None:
        """(run, function, metadata, device, static) of a compiled kernel that a direct
        launch can call (`static`: torch's launcher and the argument positions it takes,
        or None: Triton's `run`), or None where launches keep to the JIT: the knob is
        off, the interpreter returned no compiled kernel, or a profiler hooks launches."""
        if not (self.direct and config.get("direct_launch")):
            return None
        run = getattr(kernel, "run", None)
        function = getattr(kernel, "function", None)
        metadata = getattr(kernel, "packed_metadata", None)
        if run is None or function is None or metadata is None:
            self.direct = False   # no compiled kernel (the interpreter): the JIT it is
            return None
        if _hooks_active():
            self.direct = False   # a profiler hooks launches (proton): keep the JIT path so it sees them
            return None
        device = next((a.device.index for a in args if hasattr(a, "data_ptr") and hasattr(a, "device")), 0) or 0
        if self.stream is None:
            self.stream = _stream_getter()
        return run, function, metadata, device, static_entry(kernel, len(args), device)

    def site(self, namespace: dict, name: str, grid: tuple, checks: str, **options: Any) -> Callable:
        """The callable of the wrapper line `name` (see `Site`): the same object each
        time the wrapper's source is executed again in `namespace`."""
        site = self.sites.get(name)
        if site is None or site.namespace is not namespace:
            site = self.sites[name] = Site(self, namespace, name, grid, checks, options)
        return site.fast or site


def _grid3(grid: tuple) -> tuple[int, int, int]:
    return grid[0], grid[1] if len(grid) > 1 else 1, grid[2] if len(grid) > 2 else 1


def _call_text(grid: tuple[int, int, int], stream: str, args: list[str], static: tuple | None) -> str:
    """The launch call of a bound kernel: torch's static launcher (`SRUN`) with the
    arguments it takes, else Triton's compiled entry point (`run`, `FN`, `META`)."""
    gx, gy, gz = grid
    if static is not None:
        return f"SRUN({gx}, {gy}, {gz}, {stream}{''.join(', ' + args[i] for i in static[1])})"
    return f"run({gx}, {gy}, {gz}, {stream}, FN, META, None, None, None{''.join(', ' + a for a in args)})"


class Site:
    """One launch line of a wrapper, at a fixed grid and options: `_L3(v1, v2, h0)`.

    The wrapper's source defines `_L3 = k4.site(globals(), "_L3", (grid,), checks,
    num_warps=N)` and calls `_L3(*args)`.  The first call launches through the JIT and
    binds the compiled kernel: it puts in the namespace, under the line's name, a
    function generated for this line (`fast`), so that later calls are one Python call
    that checks the arguments and calls the compiled entry point.  `checks` has a
    character per argument: "." for the wrapper's own buffers (allocated in the call,
    or views of them at fixed offsets), which have the same dtype and 16-byte alignment
    at every call, so their specialisation is not checked again; any other character
    (and every argument past the string: a dynamic template's sizes) is checked as the
    launcher checks. An argument that specialises otherwise goes through the JIT,
    which compiles the variant it needs."""

    __slots__ = ("launcher", "namespace", "name", "grid", "checks", "options", "fast")

    def __init__(self, launcher: Launcher, namespace: dict, name: str, grid: tuple, checks: str, options: dict):
        self.launcher, self.namespace, self.name = launcher, namespace, name
        self.grid, self.checks, self.options = grid, checks, options
        self.fast: Callable | None = None

    def __call__(self, *args: Any) -> None:
        kernel = self.launcher.jit(self.grid, args, self.options)
        if self.fast is None:
            entry = self.launcher.entry(kernel, args)
            if entry is not None:
                self.fast = self.namespace[self.name] = self._generate(args, *entry)

    def miss(self, args: tuple) -> None:
        """A launch whose arguments specialise otherwise than the bound ones: the JIT."""
        self.launcher.jit(self.grid, args, self.options)

    def _generate(self, args: tuple, run: Any, function: Any, metadata: Any, device: int,
                  static: tuple | None) -> Callable:
        env = {"run": run, "stream": self.launcher.stream, "FN": function, "META": metadata, "miss": self.miss,
               "SRUN": static and static[0]}
        names = [f"a{i}" for i in range(len(args))]
        params = ", ".join(names)
        terms = _spec_terms(args, self.launcher.fresh, names.__getitem__, env, self.checks)
        call = _call_text(_grid3(self.grid), f"stream({device})", names, static)
        if terms:
            body = f"    if {' and '.join(terms)}:\n        return {call}\n    return miss(({params},))\n"
        else:
            body = f"    return {call}\n"
        exec(f"def fast({params}):\n{body}", env)   # noqa: S102 (text built above from types only)
        fast = env["fast"]
        fast.site = self
        return fast


def bind_launchers(functions: dict[str, Any]) -> dict[str, Launcher]:
    """A launcher per kernel name; names that share a Triton function share its launcher."""
    by_fn: dict[int, Launcher] = {}
    return {name: by_fn.setdefault(id(fn), Launcher(fn)) for name, fn in functions.items()}


__all__ = ["REFUSED", "RETRIES", "KernelRefused", "Launcher", "Site", "arg_spec", "bind_launchers", "compiling_warps", "launch_options",
           "kernel_origin", "note_refusal"]
