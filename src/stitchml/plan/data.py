"""The plan as plain data: what each kernel computes, how it is mapped, what it moves.

Tests inspect these objects directly; no code is generated to build them.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ..ir.nodes import Graph, prod


@dataclass(frozen=True)
class Domain:
    """Iteration space of a kernel: `shape` with `col_dims` walked along a program's
    column axis (the reduced dims, or the broadcast dims of a row-broadcast kernel)."""

    shape: tuple[int, ...]
    col_dims: tuple[int, ...] = ()
    # the row dims from outermost to innermost, where not in order (empty: in order): a
    # kernel without reductions walks its domain in the order its memory is laid out
    # (a value stored transposed, `plan/access.py::layout_order`)
    order: tuple[int, ...] = ()

    @property
    def row_dims(self) -> tuple[int, ...]:
        """The dims walked along a program's row axis, outermost first."""
        return self.order or tuple(d for d in range(len(self.shape)) if d not in self.col_dims)

    @property
    def rows(self) -> int:
        return prod(s for i, s in enumerate(self.shape) if i not in self.col_dims)

    @property
    def cols(self) -> int:
        return prod(self.shape[i] for i in self.col_dims)

    @property
    def is_flat(self) -> bool:
        return not self.col_dims


@dataclass(frozen=True)
class Mapping:
    """How programs cover the domain (the thread mapping)."""

    form: str        # pointwise | row_persistent | packed_rows | row_looped | combine
    block_r: int     # rows per block (elements per program for pointwise)
    block_c: int     # columns per block (1 for pointwise)
    num_warps: int
    grid: int
    row_blocks: int = 1  # row blocks each program walks (kernels with column partials)
    # on-chip rows held as this many tiles of `block_c` columns side by side (a warp a
    # row inside a program of several warps: `plan/mapping.py::WARP_ROW_ELEMS`)
    segments: int = 1
    # column partials whose programs' warps lie along the columns only, the row block
    # shrunk alike (`plan/mapping.py::column_lane_partials`), and their combine, tiled for
    # as few warps; the cost model prices both at the 16-warp tiles' occupancy
    column_lanes: bool = False

    def describe(self) -> str:
        if self.form == "pointwise":
            return f"pointwise BLOCK={self.block_r} warps={self.num_warps} grid={self.grid}"
        loop = f" x{self.row_blocks} row blocks" if self.row_blocks > 1 else ""
        seg = f" x{self.segments} segments" if self.segments > 1 else ""
        seg += " column lanes" if self.column_lanes else ""
        return (f"{self.form} BLOCK_R={self.block_r} BLOCK_C={self.block_c}{seg}{loop} warps={self.num_warps} "
                f"grid={self.grid}")


@dataclass
class KernelPlan:
    name: str
    members: tuple[int, ...]          # IR nodes computed in this kernel (topological order)
    outputs: tuple[int, ...]          # members written to global memory
    inputs: tuple[int, ...]           # materialised values read (graph inputs, other kernels, eager ops)
    domain: Domain
    mapping: Mapping
    scheme: str                       # local | regional
    dominant: tuple[int, ...]         # reduce nodes (or expensive broadcast producers) anchoring it
    stitches: tuple[tuple[int, int, str], ...]  # (producer, consumer, scheme) edges inside
    bytes_read: int = 0
    bytes_written: int = 0
    seeds: tuple[int, ...] = ()       # RAND nodes needing a per-call seed
    partials: tuple[int, ...] = ()    # column reductions written as per-program partials
    combine_of: str = ""              # for a combine kernel: the kernel whose partials it sums
    predicted_s: float = 0.0          # cost-model time on the target device
    transposed: tuple[int, ...] = ()  # inputs read transposed: the mapping took taller tiles (plan/access.py)
    row_runs: bool = False            # a flat kernel reading row runs: one element a thread (plan/access.py)
    # warps capped to lie along a rows-contiguous tile (`mapping.warps_along_rows`): in a
    # horizontal group, which runs every body at the group's widest warp count, they would
    # lie across the columns again (H200: LLaMA's GQA gradient, 150 µs a launch in one), so
    # such a kernel joins none.  Global chains keep it (no measurement against them yet:
    # there it runs at the chain's warps, as before)
    own_warps: bool = False
    column_tail: bool = False         # a looped row's whole column blocks unmasked, the last block apart
    # rows whose count the row block divides need no row mask (static shapes; the code
    # generator checks the mapping it emits for: `codegen/triton_kernel.py::_row_mask`)
    exact_rows: bool = False
    # a looped row's whole column blocks start where the largest unaligned access's row
    # is 16-byte aligned: (its offset's coefficient of the row, constant, elements a
    # 16-byte vector); () = no shift (`codegen/triton_kernel.py::row_alignment`)
    row_align: tuple[int, ...] = ()
    # a combine kernel's reductions stored as their only consumer, a cast (reduce id, cast id)
    combine_casts: tuple[tuple[int, int], ...] = ()
    # bytes of 32-byte sectors that transposed reads move beyond the bytes they use: a
    # program's rows cover less than a sector of each column's run (`plan/access.py`,
    # `cost.sector_waste`); priced as more bytes by the cost model
    sector_waste: int = 0
    # a walk over row blocks (column partials: `Mapping.row_blocks` > 1) that issues the next
    # block's loads before computing this one (`codegen/prefetch.py`; knob `prefetch_rows`):
    # the cost model prices the walk's memory latency as hidden then (`cost.walk_latency`)
    prefetch: bool = False
    # why such a walk prefetches or not, beyond the knob (`planner._walk_prefetch`): its tile
    # narrowed so that the held loads fit, or the register limit that refused it; for explain
    walk_note: str = ""
    # a row-looped kernel's column blocks a program loads one after another (its row blocks
    # x the passes over each row x the column blocks a pass), set with its bytes by the
    # planner; the cost model prices a wait for each (`cost.loop_latency`)
    loop_waits: int = 0
    # a combine kernel's epilogue: per-column element-wise members computed from its
    # reductions after they are complete (a batch norm's rstd and running-statistics
    # update), in place of a one-program kernel after it (`planner._absorb_epilogues`)
    epilogue: tuple[int, ...] = ()
    # placed concatenations (`plan/placement.py`) this kernel writes parts of: a reader of one
    # depends on every kernel that completes it (launch grouping, epilogue moves)
    completes: tuple[int, ...] = ()

    @property
    def provides(self) -> tuple[int, ...]:
        """What a later kernel may read once this one ran: its outputs and the placed
        concatenations it writes parts of (the dependency tests of launch grouping)."""
        return self.outputs + self.completes

    @property
    def walks_rows(self) -> bool:
        """Its programs walk several row blocks one after another (column partials): a
        memory latency a block (`cost.walk_latency`), hidden by `prefetch`."""
        return bool(self.partials) and self.mapping.row_blocks > 1


@dataclass
class LaunchGroup:
    """Several kernels launched as one: `global` phases separated by grid barriers
    (persistent grid) or `horizontal` bodies dispatched on program-id ranges."""

    name: str
    kind: str                      # global | horizontal
    members: tuple[str, ...]       # KernelPlan names, in launch order
    grid: int                      # persistent grid (global) or total programs (horizontal)
    predicted_s: float = 0.0
    reason: str = ""               # why the cost model chose it


@dataclass(frozen=True)
class EagerStep:
    node: int
    op: str
    reason: str


@dataclass(frozen=True)
class Refusal:
    producer: int
    consumer: int
    reason: str


@dataclass
class Plan:
    graph: Graph
    steps: list = field(default_factory=list)        # KernelPlan | EagerStep, in launch order
    materialized: set[int] = field(default_factory=set)
    refusals: list[Refusal] = field(default_factory=list)
    unfused_bytes: int = 0                           # one kernel per primitive op, for comparison
    groups: list[LaunchGroup] = field(default_factory=list)
    search: object = None                            # ilp.SearchReport: how launches were chosen
    launch_s: float = 0.0                            # what a launch was priced at (a CUDA-graph replay's gap
    graph_replay: bool = False                       # when planned for capture, else the host launch path)
    # the lowered graph `build_plan` was given, before its rewrites (folds, splits,
    # recompute marks, placement): what-if plans it again without them.  Not pickled
    # (the plan cache would store two graphs); the pipeline sets it again on a cache hit
    source: Graph | None = None
    # each in-place write's new value (`Graph.input_writes`): None where its kernel writes
    # it into the input's buffer, else why it is copied there after the call (plan/in_place.py)
    in_place: dict[int, str | None] = field(default_factory=dict)

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["source"] = None
        return state

    def __setstate__(self, state: dict) -> None:
        state.setdefault("source", None)   # (plans pickled before the field)
        state.setdefault("in_place", {})
        self.__dict__.update(state)

    @property
    def kernels(self) -> list[KernelPlan]:
        return [s for s in self.steps if isinstance(s, KernelPlan)]

    @property
    def launched(self) -> list[str]:
        """Names of the kernels launched per call: a global or horizontal group launches
        as its composite kernel (named after the group), never its members one by one."""
        grouped = {m for g in self.groups for m in g.members}
        return [k.name for k in self.kernels if k.name not in grouped] + [g.name for g in self.groups]

    @property
    def num_kernels(self) -> int:
        """GPU kernels launched per call: a global or horizontal group counts once."""
        return len(self.launched)

    def copy_reason(self, new: int) -> str | None:
        """None where an in-place write's new value (`Graph.written`) is stored by its kernel
        into the input's buffer, else why it is copied there after the call."""
        return self.in_place.get(new, "not planned")

    def group_of(self, kernel_name: str) -> LaunchGroup | None:
        for g in self.groups:
            if kernel_name in g.members:
                return g
        return None

    @property
    def predicted_s(self) -> float:
        grouped = {m for g in self.groups for m in g.members}
        return (sum(k.predicted_s for k in self.kernels if k.name not in grouped)
                + sum(g.predicted_s for g in self.groups))
