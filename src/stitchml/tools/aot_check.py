"""Compile generated kernels ahead of time for a GPU target, without a GPU.

Triton lowers to LLVM, PTX and (with the ptxas it ships) a cubin on any machine, so a
CPU-only CI can prove that every kernel stitchml generates for a function compiles
for, e.g., Hopper (sm_90), and report register and spill counts.  Must run in a
process where Triton is NOT in interpreter mode.
"""
from __future__ import annotations

import bisect
import os
import re
import struct
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator, Sequence

import torch

from .. import config
from ..codegen.triton_ops import SIG_DTYPE

if TYPE_CHECKING:
    from triton.runtime.jit import JITFunction

    from ..plan.data import Plan


@dataclass
class AotResult:
    kernel: str
    ok: bool
    error: str = ""
    registers: int | None = None
    spills: int | None = None
    # global loads and stores in the PTX, by bytes per thread per instruction
    # ({"ld": {"16": 2, "2": 8}, "st": {...}}), and how many loads/stores Triton laid out
    # with several consecutive elements per thread but issued element by element
    # ("strided scalar": a warp's lanes 4-16 bytes apart in each instruction)
    accesses: dict | None = None
    strided_scalar: int | None = None
    # layout conversions (through shared memory, with barriers) inside loops: a tile
    # converted on every iteration of a row-block loop is work Triton adds per element
    loop_conversions: int | None = None
    # reductions inside column loops whose reduced axis is spread over several warps: each
    # is a shared-memory round trip with barriers, every block (a looped softmax's running
    # maximum per column block; a looped partial's sum over rows laid out across warps)
    loop_cross_warp_reductions: int | None = None
    # the SASS of the kernel's hot region (its innermost loops that touch global memory,
    # else the whole kernel): instructions a thread issues per byte it loads or stores
    # there, and barriers per iteration (`SassProfile.as_dict`: plain data, so that
    # results travel as JSON)
    sass: dict | None = None
    # bytes the plan says the kernel moves (a launch group: its members'), for ranking
    bytes: int | None = None
    # warp-instructions the whole launch issues in its hot region: blocks of the domain
    # (ceil(rows / block rows) x ceil(columns / block columns), one hot-loop iteration
    # each) x warps x the region's instructions a thread.  Counted per block rather than
    # from bytes: a per-row value loaded once a thread, or a masked block's idle lanes,
    # would make a byte count wrong.  An upper bound where the hot region holds loops
    # that run less often than once a block (a column tail's loop, once a row, counts
    # as often as the whole blocks' loop), or a loop the compiler partly unrolled.  None for combine kernels (Triton unrolls
    # their row loop) and launch groups.
    warp_instructions: int | None = None
    # the launch's warps a program and programs (a launch group's: its composite kernel's),
    # for `residency`
    warps: int | None = None
    grid: int | None = None


CAPPED_GRID_PROGRAMS_PER_SM = 4   # residency: a grid of at most this many programs an SM is meant to run at once


def residency(r: AotResult, sms: int, regs_per_sm: int = 65536, max_warps_per_sm: int = 64) -> str:
    """'resident/needed' programs an SM for a compiled kernel: how many of its programs
    the registers (and the SM's warp slots) leave on an SM at once, against how many its
    grid puts on each.  A trailing `!` where a capped grid (a walk over row blocks, a
    persistent grid: at most CAPPED_GRID_PROGRAMS_PER_SM programs an SM, all meant to run
    at once) runs in two rounds or more (bench/NOTES.md, forty-eighth and forty-ninth
    sessions: 16-warp walks at 82-93 registers).  '' where unknown."""
    if not r.ok or not r.registers or not r.warps or not r.grid:
        return ""
    threads = r.warps * 32
    resident = min(regs_per_sm // (r.registers * threads), max_warps_per_sm // r.warps)
    needed = -(-r.grid // sms)
    flag = " !" if needed <= CAPPED_GRID_PROGRAMS_PER_SM and resident < needed else ""
    return f"{resident}/{needed}{flag}"


def _signature(ks, g) -> dict[str, str]:
    sig = {}
    for (kind, nid), name in zip(ks.params, ks.param_names):
        if kind in ("in", "out"):
            sig[name] = "*" + SIG_DTYPE[g[nid].dtype]
        elif kind == "partial":
            dt = g[nid].dtype
            sig[name] = "*" + SIG_DTYPE[torch.float32 if dt in (torch.float16, torch.bfloat16) else dt]
        elif kind == "counter":
            sig[name] = "*i64"
        elif kind == "base":
            sig[name] = "i64"
        else:  # seed
            sig[name] = "i32"
    return sig


def _attrs(signature: dict[str, str], ks=None, g=None) -> dict:
    """The divisibility the JIT gives aligned pointers (every buffer stitchml allocates
    is 16-byte aligned, and the launcher binds that specialisation): without it the
    offline compile would vectorise nothing.  With the kernel and its graph, a part written
    into a placed concatenation (`plan/placement.py`) at an offset that is no multiple of
    16 bytes gets none, as the launcher would find."""
    from ..plan.placement import placed_offset
    unaligned = {i for i, (kind, nid) in enumerate(ks.params if ks is not None else ())
                 if kind in ("in", "out") and placed_offset(g, nid) * g[nid].dtype.itemsize % 16}
    return {(i,): [["tt.divisibility", 16]] for i, t in enumerate(signature.values())
            if t.startswith("*") and i not in unaligned}


_PTX_LOC = re.compile(r"^\s*\.loc\s+\d+\s+(\d+)\s+(\d+)", re.M)
_PTX_ACCESS = re.compile(r"\b(ld|st)\.global(?:\.[\w:]+?)*?(?:\.v(\d))?\.[bfsu](\d+)\b")
_TTGIR_LAYOUT = re.compile(r"^#(blocked\d*) = #ttg\.blocked<\{sizePerThread = \[([\d, ]+)\].*?order = \[(\d+)", re.M)
_TTGIR_MEM = re.compile(r"\btt\.(load|store) .*?tensor<([\dx]+)x!tt\.ptr<(\w+)>, #(blocked\d*)> loc\(#(loc\d*)\)")
_TTGIR_LOCDEF = re.compile(r"^#(loc\d*) = loc\((.*)\)$", re.M)


def _loc_lines(ttgir: str) -> dict[str, tuple[int, int] | None]:
    """ttgir location aliases resolved to (line, column) of the kernel source."""
    raw = dict(_TTGIR_LOCDEF.findall(ttgir))

    def resolve(name: str, depth: int = 0) -> tuple[int, int] | None:
        body = raw.get(name, "")
        m = re.match(r'"[^"]*":(\d+):(\d+)$', body)
        if m:
            return int(m.group(1)), int(m.group(2))
        inner = re.search(r"#(loc\d*)", body)          # a named or fused location: its first part
        return resolve(inner.group(1), depth + 1) if inner and depth < 8 else None
    return {name: resolve(name) for name in raw}


def memory_accesses(ptx: str, ttgir: str) -> tuple[dict, int]:
    """(bytes-per-instruction histogram of global loads and stores, strided-scalar count).

    A load or store is *strided scalar* when its layout gives a thread several
    consecutive elements but the PTX at its source position reads or writes them one
    instruction per element: a warp's lanes are then 4-16 bytes apart in every
    instruction (16-32 sectors touched for 64-128 useful bytes).  Triton does this when
    it cannot prove the pointer aligned or the mask uniform over a vector (an odd row
    length, a division by an odd extent) while another access of the same values set
    the layout.  Matched by source line and column (ttgir locations, PTX `.loc`)."""
    hist: dict[str, dict[str, int]] = {"ld": {}, "st": {}}
    at: dict[tuple[str, tuple[int, int]], set[int]] = {}
    loc = (0, 0)
    pos = 0
    locs = [(m.start(), (int(m.group(1)), int(m.group(2)))) for m in _PTX_LOC.finditer(ptx)]
    for m in _PTX_ACCESS.finditer(ptx):
        while pos < len(locs) and locs[pos][0] < m.start():
            loc = locs[pos][1]
            pos += 1
        op, vec, bits = m.groups()
        nbytes = int(vec or 1) * int(bits) // 8
        hist[op][str(nbytes)] = hist[op].get(str(nbytes), 0) + 1
        at.setdefault((op, loc), set()).add(nbytes)
    # per layout: (its fastest dim, elements per thread along it)
    layouts = {name: (int(order), int(sizes.split(",")[int(order)].strip()))
               for name, sizes, order in _TTGIR_LAYOUT.findall(ttgir)}
    lines = _loc_lines(ttgir)
    strided = 0
    for op, shape, elem, layout, locname in _TTGIR_MEM.findall(ttgir):
        dim, per_thread = layouts.get(layout, (0, 1))
        dims = [int(d) for d in shape.split("x")]
        if per_thread <= 1 or dim >= len(dims) or dims[dim] == 1:
            continue     # one element per thread, or a broadcast column (a row's scalar)
        elem_bytes = max(int(re.sub(r"\D", "", elem) or 32), 8) // 8    # (i1 is stored as a byte)
        widths = at.get(("ld" if op == "load" else "st", lines.get(locname) or (-1, -1)))
        if widths and max(widths) <= elem_bytes:
            strided += 1
    return hist, strided


def _loop_lines(ttgir: str):
    """Each TTGIR line with its attribute dicts removed, and the `scf.for` loops it sits
    in (innermost last) as (brace depth, whether it is a column loop over `cbase`)."""
    depth, loops = 0, []
    for line in ttgir.splitlines():
        bare = re.sub(r"<\{[^{}]*\}>", "", line)
        yield line, bare, loops
        opened = "scf.for" in bare and bare.rstrip().endswith("{")
        depth += bare.count("{") - bare.count("}")
        if opened:
            loops.append((depth, "scf.for %cbase" in bare))
        while loops and depth < loops[-1][0]:
            loops.pop()


def loop_conversions(ttgir: str) -> int:
    """`ttg.convert_layout` ops of tensors with more than one element per dimension
    inside an `scf.for` body (conversions of a row's scalars or of a [1, C] vector are
    cheap; a tile's is a shared-memory round trip every iteration).  A conversion between
    layouts of different orders is a transpose the kernel asked for (a tile read along
    its rows and stored along its columns): not counted."""
    order = {name: o for name, _, o in _TTGIR_LAYOUT.findall(ttgir)}
    count = 0
    for _, bare, loops in _loop_lines(ttgir):
        if "ttg.convert_layout" in bare and loops:
            shape = re.search(r"tensor<([\dx]+)x\w+", bare)
            dims = [int(d) for d in shape.group(1).split("x")] if shape else []
            names = re.findall(r"#(blocked\d*)>", bare)
            transpose = len(names) == 2 and order.get(names[0]) != order.get(names[1])
            if len(dims) >= 2 and min(dims) > 1 and not transpose:
                count += 1
    return count


_TTGIR_WARPS = re.compile(r"^#(blocked\d*) = #ttg\.blocked<\{.*?warpsPerCTA = \[([\d, ]+)\]", re.M)


def loop_cross_warp_reductions(ttgir: str) -> int:
    """`tt.reduce` ops directly inside a column loop (an `scf.for` over `cbase`, the
    code generator's walk of a row in column blocks) whose operand's layout puts more
    than one warp along the reduced axis (`warpsPerCTA[axis] > 1`): Triton combines
    those warps through shared memory, with barriers, on every column block.  (A row's
    statistics after its column loop, or a row block's inside a grid-stride walk of
    rows, are one per row: not counted.)"""
    warps = {name: [int(w) for w in ws.split(",")] for name, ws in _TTGIR_WARPS.findall(ttgir)}
    count, pending = 0, None
    for line, _, loops in _loop_lines(ttgir):
        if '"tt.reduce"' in line and loops and loops[-1][1]:
            axis = re.search(r"axis = (\d+)", line)
            pending = int(axis.group(1)) if axis else None
        elif pending is not None and line.lstrip().startswith("})"):
            operand = re.search(r"\}\) : \(tensor<[\dx]+x\w+, #(blocked\d*)>", line)
            ws = warps.get(operand.group(1)) if operand else None
            if ws and pending < len(ws) and ws[pending] > 1:
                count += 1
            pending = None
    return count


@dataclass
class SassProfile:
    """What a thread issues in a kernel's hot region, from its SASS.

    The hot region is the innermost loops that load or store global memory (a column
    loop, a grid-stride walk of rows), taken together, or the whole kernel where no loop
    touches memory.  `per_byte` = instructions / bytes loaded and stored there, per
    thread: a streaming kernel is issue-bound, not memory-bound, when this exceeds the
    device's `issue_budget` (four warp-instructions a cycle per SM against the copy
    bandwidth: ~8 on an H200).  In practice dependent latency makes kernels issue-limited
    well below the budget; the figure ranks kernels, it does not time them."""
    instructions: int        # the whole kernel (no NOPs, no trailing self-branch)
    hot_instructions: int    # in the hot region (one iteration of each of its loops)
    hot_bytes: int           # global bytes a thread loads and stores there
    hot_barriers: int        # BAR.SYNC there (shared-memory rounds: cross-warp steps)
    loops: int               # loops in the hot region (0: the whole kernel)

    @property
    def per_byte(self) -> float:
        return self.hot_instructions / self.hot_bytes if self.hot_bytes else float("inf")

    def as_dict(self) -> dict:
        return {**self.__dict__, "per_byte": self.per_byte}


_SASS_LINE = re.compile(r"^\s*/\*([0-9a-f]+)\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)((?:\.[A-Z0-9_]+)*)([^;]*);", re.M)
_ACCESS_WIDTH = {"128": 16, "64": 8, "U16": 2, "S16": 2, "U8": 1, "S8": 1}


def sass_profile(sass: str) -> SassProfile:
    """`SassProfile` of one kernel's `cuobjdump -sass` text."""
    ins = []    # (address, opcode, modifiers, operands)
    for m in _SASS_LINE.finditer(sass):
        addr, op, mods, rest = int(m.group(1), 16), m.group(2), m.group(3).split(".")[1:], m.group(4)
        if op == "NOP":
            continue
        ins.append((addr, op, mods, rest))
    if ins and ins[-1][1] == "BRA" and ins[-1][3].strip() == hex(ins[-1][0]):
        ins.pop()     # the self-branch after the last EXIT

    def access(op: str, mods: list[str]) -> int:
        if op not in ("LDG", "STG"):
            return 0
        return next((w for m, w in _ACCESS_WIDTH.items() if m in mods), 4)

    # a loop: a branch back to an address at or before it
    loops = []
    for addr, op, _, rest in ins:
        target = re.search(r"0x([0-9a-f]+)", rest) if op == "BRA" else None
        if target and int(target.group(1), 16) <= addr:
            loops.append((int(target.group(1), 16), addr))

    def inside(lo: int, hi: int) -> list:
        return [i for i in ins if lo <= i[0] <= hi]

    touching = [(lo, hi) for lo, hi in loops if any(access(i[1], i[2]) for i in inside(lo, hi))]
    hot = [(lo, hi) for lo, hi in touching
           if not any((a, b) != (lo, hi) and lo <= a and b <= hi for a, b in touching)]
    region = [i for lo, hi in hot for i in inside(lo, hi)] if hot else ins
    return SassProfile(instructions=len(ins), hot_instructions=len(region),
                       hot_bytes=sum(access(i[1], i[2]) for i in region),
                       hot_barriers=sum(1 for i in region if i[1] == "BAR"), loops=len(hot))


def _nvidia_tool(name: str) -> Path | None:
    """A CUDA binary tool shipped in the Triton wheel (cuobjdump, nvdisasm), if present."""
    import triton
    tool = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / name
    return tool if tool.exists() else None


def _cubin_tool(cubin: bytes, *args: str) -> str | None:
    tool = _nvidia_tool("cuobjdump")
    if tool is None or not cubin:
        return None
    return _tool_on_bytes(tool, list(args), cubin, ".cubin", 60).stdout


def _tool_on_bytes(tool: Path, args: list[str], data: bytes, suffix: str,
                   timeout: int) -> subprocess.CompletedProcess:
    """`tool *args FILE` with `data` in a private temporary file (two test workers may
    hold the same kernels at once), removed afterwards."""
    fd, name = tempfile.mkstemp(suffix=suffix, prefix="stitchml_aot_")
    path = Path(name)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    try:
        return subprocess.run([str(tool), *args, str(path)], capture_output=True, text=True, timeout=timeout)
    finally:
        path.unlink(missing_ok=True)


def _resources(cubin: bytes) -> tuple[int | None, int | None]:
    out = _cubin_tool(cubin, "--dump-resource-usage")
    if out is None:
        return None, None
    regs = re.search(r"REG:(\d+)", out)
    stack = re.search(r"STACK:(\d+)", out)
    return (int(regs.group(1)) if regs else None), (int(stack.group(1)) if stack else None)


def _sass(cubin: bytes) -> dict | None:
    out = _cubin_tool(cubin, "-sass")
    return sass_profile(out).as_dict() if out else None


def _text_sections(cubin: bytes) -> list[bytes]:
    """The executable sections (`.text.<kernel>`) of a cubin, in file order: the ELF64
    section table read directly (a cubin is a plain little-endian ELF)."""
    if cubin[:4] != b"\x7fELF" or cubin[4] != 2:
        raise ValueError("not an ELF64 image")
    shoff, = struct.unpack_from("<Q", cubin, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", cubin, 0x3A)
    headers = [struct.unpack_from("<IIQQQQ", cubin, shoff + i * shentsize) for i in range(shnum)]
    names_at = headers[shstrndx][4]

    def name(h) -> bytes:
        start = names_at + h[0]
        return cubin[start:cubin.index(b"\0", start)]
    return [cubin[h[4]:h[4] + h[5]] for h in headers if name(h).startswith(b".text.")]


def sass_profiles(cubins: list[bytes], arch: int = 90) -> list[dict | None]:
    """`SassProfile.as_dict` of each cubin, from ONE disassembler run.

    Starting nvdisasm costs ~0.5 s of CPU for sm_90 whatever the input (its decoder
    tables), against milliseconds for a kernel: one `cuobjdump -sass` a kernel made the
    disassembly ~3/4 of an ahead-of-time check's time.  So the kernels' executable
    sections are laid end to end as one raw instruction image (`nvdisasm --binary`),
    disassembled once, and the listing cut back at the kernels' offsets.  The profile
    only compares addresses with each other (loops: branches back), so the image's
    addresses serve as well as each kernel's own.  A cubin whose sections cannot be read,
    or a disassembler failure, falls back to `cuobjdump -sass` for that cubin."""
    tool = _nvidia_tool("nvdisasm")
    chunks: list[tuple[int, int] | None] = []
    image = bytearray()
    for cubin in cubins:
        try:
            body = b"".join(_text_sections(cubin)) if cubin else b""
        except (ValueError, IndexError, struct.error):
            body = b""
        chunks.append((len(image), len(image) + len(body)) if body else None)
        image += body
    listing = ""
    if tool is not None and image:
        kind = f"SM{arch}a" if arch >= 90 else f"SM{arch}"
        proc = _tool_on_bytes(tool, ["--binary", kind], bytes(image), ".sass.bin", 300)
        listing = proc.stdout if proc.returncode == 0 else ""
    lines = [(int(m.group(1), 16), m.group(0)) for m in _SASS_LINE.finditer(listing)]   # (in address order)
    starts = [addr for addr, _ in lines]
    out: list[dict | None] = []
    for cubin, chunk in zip(cubins, chunks):
        mine = ([text for _, text in lines[bisect.bisect_left(starts, chunk[0]):bisect.bisect_left(starts, chunk[1])]]
                if chunk else [])
        out.append(sass_profile("\n".join(mine)).as_dict() if mine else _sass(cubin))
    return out


def compile_function(fn: JITFunction, sig: dict, consts: dict, options: dict, arch: int = 90,
                     aligned: Iterable[str] = ()) -> dict[str, Any]:
    """Compile Triton function `fn` for sm_`arch`: {ok, registers, spills | error}.  `sig`
    types its run-time arguments, `consts` its constexprs and the integers the JIT
    specialises at a launch (an argument equal to 1 is compiled as the constant 1),
    `aligned` the arguments the JIT marks divisible by 16, `options` Triton's (num_warps,
    num_stages, launch_pdl).  A failure is a verdict, not an exception: the callers report
    every kernel's.  A kernel launched with programmatic dependent launch (`launch_pdl`)
    whose code never waits on the grid before it (`griddepcontrol.wait`, runtime/pdl.py)
    would race with that grid's writes: a failure too."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    order = list(getattr(fn, "arg_names", ())) or list(sig) + list(consts)
    full = {n: ("constexpr" if n in consts else sig[n]) for n in order}
    aligned = set(aligned)
    attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(order) if n in aligned and n not in consts}
    try:
        compiled = triton.compile(ASTSource(fn, full, dict(consts), attrs), target=GPUTarget("cuda", arch, 32),
                                  options=dict(options))
    except Exception as e:
        text = str(e)
        # (Triton's message follows the kernel's source: keep its position and its end)
        short = text if len(text) <= 700 else text[:120] + " [...] " + text[-500:]
        return {"ok": False, "error": f"{type(e).__name__}: {short}"}
    if options.get("launch_pdl"):
        ptx = compiled.asm.get("ptx", "")
        wait = ptx.find("griddepcontrol.wait")
        access = re.search(r"\b(?:ld|st|atom|red|cp\.async)\.(?:global|shared::cluster)", ptx)
        if wait < 0 or (access is not None and access.start() < wait):
            return {"ok": False, "error": "launched with programmatic dependent launch (launch_pdl) but does not "
                                          "wait on the grid before it (griddepcontrol.wait) before its first "
                                          "global memory access: a race with that grid's writes"}
    regs, spills = _resources(compiled.asm.get("cubin", b""))
    return {"ok": True, "registers": regs, "spills": spills}


def check(fn: Callable, *inputs: Any, arch: int = 90, device: str = "H100") -> list[AotResult]:
    """Plan `fn` for `device`, generate every kernel, compile each for sm_`arch`."""
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        raise RuntimeError("aot_check needs Triton out of interpreter mode (unset TRITON_INTERPRET)")
    from torch.fx.experimental.proxy_tensor import make_fx

    from ..capture.decomp import decomposition_table
    from ..lower.lower import lower
    from ..plan.planner import build_plan

    with config.override(device=device):
        gm = make_fx(fn, decomposition_table=decomposition_table(), tracing_mode="fake")(*inputs)
        plan = build_plan(lower(gm))
    return check_plan(plan, arch)


def check_plan(plan: Plan, arch: int = 90) -> list[AotResult]:
    """Generate every kernel of `plan` and compile each for sm_`arch`."""
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        raise RuntimeError("aot_check needs Triton out of interpreter mode (unset TRITON_INTERPRET)")
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from ..codegen import generate_all
    from ..runtime.kernel_cache import load_module

    g = plan.graph  # planning may rewrite the graph (dead nodes dropped, long rows split)
    sources = generate_all(g, plan)
    moved = {k.name: k.bytes_read + k.bytes_written for k in plan.kernels}
    moved.update({grp.name: sum(moved.get(m, 0) for m in grp.members) for grp in plan.groups})
    mappings = {k.name: k for k in plan.kernels if k.mapping.form != "combine"}
    module = load_module([s.source for s in sources.values()])
    results, cubins = [], []
    for name, ks in sources.items():
        try:
            sig = _signature(ks, g)
            compiled = triton.compile(ASTSource(getattr(module, name), sig, {}, _attrs(sig, ks, g)),
                                      target=GPUTarget("cuda", arch, 32),
                                      options={"num_warps": ks.num_warps})
            cubin = compiled.asm.get("cubin", b"")
            regs, stack = _resources(cubin)
            ttgir = compiled.asm.get("ttgir", "")
            hist, strided = memory_accesses(compiled.asm.get("ptx", ""), ttgir)
            results.append(AotResult(name, True, registers=regs, spills=stack, accesses=hist,
                                     strided_scalar=strided, loop_conversions=loop_conversions(ttgir),
                                     loop_cross_warp_reductions=loop_cross_warp_reductions(ttgir),
                                     bytes=moved.get(name), warps=ks.num_warps,
                                     grid=ks.grid if isinstance(ks.grid, int) else None))
            cubins.append(cubin)
        except Exception as e:  # report, do not stop: the caller wants every kernel's verdict
            results.append(AotResult(name, False, f"{type(e).__name__}: {str(e)[:500]}"))
    # the SASS of all the plan's kernels in one disassembler run (`sass_profiles`)
    compiled_ok = [r for r in results if r.ok]
    for r, sass in zip(compiled_ok, sass_profiles(cubins, arch)):
        r.sass = sass
        try:
            r.warp_instructions = _warp_instructions(mappings.get(r.kernel), sass, g)
        except Exception as e:  # (as above: a verdict, not a stop)
            r.ok, r.error = False, f"{type(e).__name__}: {str(e)[:500]}"
    return results


def _warp_instructions(k, sass: dict | None, g=None) -> int | None:
    """`AotResult.warp_instructions` of kernel plan `k` (None without one): row blocks x
    hot-region runs a row block x warps x the region's instructions a thread.

    A looped row's hot region runs once a column block, unless the compiler unrolled the
    fixed-count column loop: then the region that is left (the whole program, or a
    persistent grid's walk of row blocks) holds several column blocks, or all of them.
    How many is read off the bytes: what a thread issues in one row block (each pass
    over the row, `cost.input_passes`; inputs and outputs as wide as the row, a per-row
    value not counted) over what the region loads and stores."""
    if k is None or sass is None:
        return None
    from ..plan.cost import input_passes
    m, dom = k.mapping, k.domain
    row_blocks = -(-dom.rows // m.block_r)
    col_blocks = -(-dom.cols // max(m.block_c, 1)) if m.form != "pointwise" else 1
    runs = col_blocks
    if not sass.get("loops"):
        runs = 1
    elif col_blocks > 1 and g is not None and sass.get("hot_bytes"):
        passes = input_passes(g, k) if m.form == "row_looped" else dict.fromkeys(k.inputs, 1)
        wide = [(i, passes[i]) for i in k.inputs if g[i].numel >= dom.cols]
        wide += [(o, 1) for o in k.outputs if o not in k.partials and g[o].numel >= dom.cols]
        per_row = sum(dom.cols * g[i].dtype.itemsize * n for i, n in wide if g[i].dtype is not None)
        per_thread = per_row * m.block_r / (m.num_warps * 32)
        runs = min(col_blocks, max(1, round(per_thread / sass["hot_bytes"])))
    return row_blocks * runs * m.num_warps * sass["hot_instructions"]


def check_dynamic(fn: Callable, *inputs: Any, arch: int = 90, device: str = "H100") -> list[AotResult]:
    """Dynamic shapes: trace `fn` with every size symbolic, build the template of the
    inputs' mapping buckets the way the dynamic runner does (static pipeline at the
    probe sizes, `dynamic/template.py`), and compile every kernel it launches, with
    its size arguments as i32/fp32 scalars, for sm_`arch`."""
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        raise RuntimeError("aot_check needs Triton out of interpreter mode (unset TRITON_INTERPRET)")
    import triton
    from torch.fx.experimental.proxy_tensor import make_fx
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from ..capture.decomp import decomposition_table
    from ..dynamic import template as tpl
    from ..dynamic.runner import sources_at
    from ..dynamic.shapes import probes, signature
    from ..runtime.kernel_cache import load_module

    gm = make_fx(fn, decomposition_table=decomposition_table(), tracing_mode="symbolic")(*inputs)
    sig = signature(gm)
    hints = getattr(sig.shape_env, "backed_var_to_val", None) or sig.shape_env.var_to_val  # (renamed in 2.12)
    values = {s: int(hints[s]) for s in sig.symbols}
    points = probes(sig, values)
    cuda = torch.device("cuda")
    builds, first = [], None
    with config.override(device=device):
        for p in points:
            built, sources = sources_at(gm, sig, p, cuda)
            builds.append(sources)
            first = first or built
    t = tpl.build(sig, points, builds)
    if isinstance(t, str):
        raise RuntimeError(f"no template: {t}")
    module = load_module(list(t.kernel_texts.values()))
    results = []
    for name in t.launched:
        ks = first.kernels[name]
        types = _signature(ks, first.graph)
        types.update({f"sz{i}": ty for i, ty in enumerate(t.size_arg_types.get(name, []))})
        try:
            compiled = triton.compile(ASTSource(getattr(module, name), types, {}),
                                      target=GPUTarget("cuda", arch, 32), options={"num_warps": ks.num_warps})
            regs, stack = _resources(compiled.asm.get("cubin", b""))
            nsizes = len(t.size_arg_types.get(name, []))
            results.append(AotResult(f"{name} ({nsizes} size arguments)", True, registers=regs, spills=stack))
        except Exception as e:
            results.append(AotResult(name, False, f"{type(e).__name__}: {str(e)[:500]}"))
    return results


def survey(suite: str = "micro", case_re: str = "", dtypes: Sequence[str] = ("fp32", "bf16"), arch: int = 90,
           device: str = "H100", replayed: bool = False) -> Iterator[tuple[str, str, str, AotResult]]:
    """Every kernel of every case of a bench suite (`micro` or `models`) at full size
    (forward and backward plans, as `stitchml.tools.predict` makes them for `device`;
    `replayed`: priced as CUDA-graph replays, as the models suite runs), compiled for
    sm_`arch`: yields (case, dtype, graph kind, AotResult)."""
    import re as _re

    from ..bench import micro, models
    from ..plan.devices import get_device
    from ..plan.options import PlanOptions
    from . import predict

    dev = get_device(device)
    opts = PlanOptions.from_config(dev.replayed() if replayed else dev,
                                   graph_replay=replayed or bool(config.get("cuda_graphs")))   # (as the bench)
    specs = (micro if suite == "micro" else models).cases(quick=False)
    for spec in specs:
        if case_re and not _re.search(case_re, spec.name):
            continue
        for dtype in dtypes:
            for i, plan in enumerate(predict.case_plans(spec, dtype, opts)[1]):
                for r in check_plan(plan, arch):
                    yield spec.name, dtype, f"graph {i}", r


def survey_micro(case_re: str = "", dtypes: Sequence[str] = ("fp32", "bf16"), arch: int = 90,
                 device: str = "H100") -> Iterator[tuple[str, str, str, AotResult]]:
    """`survey` of the micro suite."""
    yield from survey("micro", case_re, dtypes, arch, device)


def main(argv: list[str] | None = None) -> int:
    """`python -m stitchml.tools.aot_check --micro [--case RE]` (or `--models`): the
    register and stack use, the global memory accesses (bytes per instruction,
    strided-scalar count), the tile layout conversions and cross-warp reductions inside
    loops, and the SASS instructions per byte and barriers of the hot region of every
    kernel of the suite compiled for sm_90 (no GPU needed); exit status 1 if one fails to
    compile."""
    import argparse

    from ..plan.devices import get_device
    ap = argparse.ArgumentParser(description=main.__doc__)
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--micro", action="store_true", help="survey the micro suite")
    mode.add_argument("--models", action="store_true",
                      help="survey the models suite (planned as CUDA-graph replays, as it runs)")
    ap.add_argument("--case", default="", help="regular expression on case names")
    ap.add_argument("--dtype", nargs="+", default=["fp32", "bf16"])
    args = ap.parse_args(argv)
    if not (args.micro or args.models):
        ap.error("nothing to do: pass --micro or --models")
    device = config.get("device") if config.get("device") not in ("", "auto", "cpu") else "H100"
    dev = get_device(device)
    budget = dev.issue_budget
    import triton
    # register counts and load forms differ between Triton versions (bench/NOTES.md, twenty-fifth
    # session: 3.6 and 3.9 on BERT's norm backwards): say which one compiled these
    print(f"compiled by Triton {triton.__version__} (a GPU's own Triton may differ: compare with its version)")
    print(f"device {device}: issue budget {budget:.1f} SASS instructions a byte (4 warp-instructions a cycle "
          f"per SM against the copy bandwidth); `!` marks a hot region above half of it. `µs copy`: the "
          f"kernel's bytes at the copy bandwidth; `µs issue`: the warp-instructions of its hot region over "
          f"all its blocks at the full issue rate, 4 a cycle per SM (both floors; the larger one bounds the "
          f"kernel, and issue rarely runs near full rate)")
    print("`programs an SM`: resident / needed (registers and warp slots against the grid's programs an SM); "
          "`!` where a capped grid (a walk, a persistent grid) runs in two rounds or more")
    print("| case | dtype | graph | kernel | registers | stack bytes | programs an SM | loads (bytes x count) | stores "
          "| strided scalar | tile conversions in loops | cross-warp reductions in loops | SASS a byte (hot) "
          "| barriers (hot) | µs copy | µs issue |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    failed = 0
    rows = survey("models" if args.models else "micro", args.case, tuple(args.dtype), device=device,
                  replayed=args.models)
    totals: dict[tuple[str, str], list] = {}   # (case, dtype) -> [copy, max(copy, issue), issue-bound, excess]
    for case, dtype, graph, r in rows:
        failed += not r.ok
        if r.bytes is not None and r.warp_instructions is not None:
            copy, issue = r.bytes / dev.bandwidth * 1e6, r.warp_instructions / dev.warp_issue_rate * 1e6
            t = totals.setdefault((case, dtype), [0.0, 0.0, 0, 0.0])
            t[0] += copy
            t[1] += max(copy, issue)
            if issue > copy:
                t[2] += 1
                t[3] += issue - copy
        acc = r.accesses or {}
        ld, st = (" ".join(f"{b}x{n}" for b, n in sorted(acc.get(k, {}).items(), key=lambda i: -int(i[0])))
                  for k in ("ld", "st"))
        sp = r.sass
        per_byte = "" if sp is None else f"{sp['per_byte']:.2f}{' !' if sp['per_byte'] > budget / 2 else ''}"
        copy_us = "" if r.bytes is None else f"{r.bytes / dev.bandwidth * 1e6:.1f}"
        issue_us = ("" if r.warp_instructions is None
                    else f"{r.warp_instructions / dev.warp_issue_rate * 1e6:.1f}")
        print(f"| {case} | {dtype} | {graph} | {r.kernel} | {r.registers if r.ok else 'FAILED: ' + r.error[:80]} "
              f"| {r.spills} | {residency(r, dev.sms, dev.regs_per_sm, dev.max_warps_per_sm)} | {ld} | {st} "
              f"| {r.strided_scalar if r.ok else ''} | {r.loop_conversions if r.ok else ''} "
              f"| {r.loop_cross_warp_reductions if r.ok else ''} | {per_byte} | {'' if sp is None else sp['hot_barriers']} "
              f"| {copy_us} | {issue_us} |",
              flush=True)
    # per case, where the issue floor binds (kernels without both floors, e.g. combines and launch
    # groups, are left out of both sums): the place to look first (bench/NOTES.md, 41st session)
    for (case, dtype), (copy, bound, n, excess) in totals.items():
        print(f"summary {case} {dtype}: copy floors {copy:.1f} µs, sum of max(copy, issue) {bound:.1f} µs, "
              f"{n} kernels issue-bound by {excess:.1f} µs")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
