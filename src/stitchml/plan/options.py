"""Everything planning depends on besides the graph, as one value.

`build_plan(graph, options)` is a function of its two arguments: the cost model's
device and the mapping/launch choices are fields here, never read from the
environment or a module global in the middle of planning.  `PlanOptions.from_config`
takes the knobs (config.py) once, at the top; callers that plan differently (the
dynamic runner's fixed row blocks, CUDA-graph mode, what-if alternatives, tools that
plan for another device) pass changed fields instead of overriding global state.
The plan cache keys on the options.
"""
from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from .. import config
from .devices import Device, current_device, get_device


@dataclass(frozen=True)
class PlanOptions:
    device: Device                 # the cost model's device (calibrated figures if any)
    pointwise_block: int = 1024    # elements per program, flat point-wise kernels
    persistent_max_cols: int = 8192   # longest row (next pow2) kept whole on chip
    persistent_long_rows: bool = True   # ... and half-type rows up to 32768 whose varying inputs fit (mapping.long_row_on_chip)
    loop_block_cols: int = 2048    # columns per iteration of row-looped kernels
    block_elems: int = 4096        # target elements per program of row kernels
    split_min_cols: int = 1024     # task splitting: smallest chunk of a split row
    split_long_variance: bool = False   # variances over rows too long for registers: chunk statistics, any rows
    partial_programs_per_sm: int = 2   # column partials beside on-chip rows: programs per SM
    prefetch_rows: bool = True   # ... whose walk over row blocks issues the next block's loads first (codegen/prefetch.py)
    narrow_walks: bool = True    # ... at half the warps where a 16-warp walk cannot hold those loads
    prefetch_columns: bool = True   # persistent looped grids: each column loop issues the next block first
    looped_partial_elems: int = 2048   # column partials beside looped rows: elements per iteration
    partial_lanes: bool = True   # looped column partials: a tile's rows in each thread, warps along the columns
    walk_looped_partials: str = "auto"   # ... or 1-2 programs an SM walking rows, each adding into its partial row
    partial_bytes_per_thread: int = 64   # column partials beside on-chip rows: bytes a thread loads an iteration
    dtype_scaled_blocks: bool = True   # block knobs count float32 elements: 2-byte data gets twice as many
    persistent_rows: bool = True   # looped rows read twice or more: 1-2 programs an SM walk rows (L2 reuse)
    looped_partials: bool = True   # column reductions beside long (looped) rows as column partials
    transposed_tiles: bool = True  # column-partial kernels reading an input transposed: 8-16-row tiles
    transposed_row_warps: bool = True   # whole-row tiles read transposed: 64 elements a thread
    layout_columns: bool = True    # reductions over the dims outermost in memory (channels last): column partials
    chained_columns: bool = False  # two dependent reductions over the same <= 1024 leading rows: row reductions
    free_cats: bool = True         # concatenations of cheap parts computed by their readers (weighed on the plan)
    window_recompute_ops: float = 256.0   # ops an element a value may be recomputed through window maps (0: no limit)
    narrow_writes: bool = True     # a written exact widening cast of a computed value: the narrow value written
    cat_parts: bool = True         # element-wise kernels that only feed a concatenation: computed by its kernel
    reduction_sums: bool = True    # adds of many same-shaped sums: one sum over their concatenation
    product_sums: bool = True      # adds of many small matrix products: one product over the joined inner dim
    place_cats: bool = True        # kernels write a concatenation's parts into its slices (no copy kernel)
    row_values: bool = True        # flat kernels reading per-row values along long rows: walked as rows
    flat_row_runs: bool = True     # flat kernels reading row runs out of flat order: one element a thread
    layout_order: bool = True      # kernels without reductions walk memory order; transposes in tiles
    column_tails: bool = True      # looped rows: whole column blocks unmasked, the partial block apart
    warp_rows: bool = True         # rows of up to 32 elements a lane: one warp a row, one row a program
    warp_row_warps: int = 1        # ... or programs of this many rows, a warp each, held as row segments
    trim_row_warps: bool = True    # one-row programs: the warps that leave the fewest masked lanes live
    partial_column_warps: bool = True   # held-row column partials over few rows: warps along the columns only
    partial_segments: bool = True  # held-row column partials, rows not a power of two: rows as unmasked segments
    combine_spread: bool = True   # combines: column tiles narrowed until there are programs for half the SMs
    exact_rows: bool = True        # row counts the row block divides: no row mask
    align_rows: bool = True        # looped odd-stride rows: whole column blocks from a 16-byte boundary
    combine_casts: bool = True     # a column reduction's cast (to a half-type gradient) stored by its combine
    combine_epilogues: bool = True  # per-column element-wise work on a combine's reductions done by the combine
    global_barriers: bool = True   # the global scheme (phases + grid barrier) may be chosen
    horizontal_fusion: bool = True   # independent launch-bound kernels may share a launch
    sibling_fusion: bool = True    # element-wise kernels of one domain reading one buffer merge
    # ... also where the common buffer is small (no byte saved; each merged body is serial
    # work for the same programs: `grouping._serial_siblings`)
    serial_siblings: bool = False
    multi_output_siblings: bool = True   # column reductions over one multi-output op's outputs merge
    ilp: bool = True               # launch grouping by ILP (else the rules)
    plan_search: str = "ilp"       # ilp | rules
    ilp_time_limit: float = 3.0    # seconds per region (a safety bound)
    ilp_node_limit: int = 200      # branch-and-bound nodes per region (the bound meant to apply)
    # dynamic shapes: row and flat blocks take their cap instead of next_pow2 of the row
    # count, so a kernel's mapping moves only with its column extent (the size bucket)
    fixed_row_blocks: bool = False
    # the graph is planned for capture in a CUDA graph: its device's launch cost is the
    # replay's per-kernel gap (`Device.replayed`), set by `from_config(graph_replay=True)`
    graph_replay: bool = False

    def __post_init__(self) -> None:
        # three-way knobs as their canonical word (an override may pass a boolean)
        object.__setattr__(self, "walk_looped_partials", config.off_auto_on(self.walk_looped_partials))

    @classmethod
    def from_config(cls, device: Device | str | None = None, **changes: Any) -> "PlanOptions":
        """The knobs' current values (the `device` knob, else the visible GPU), with
        `changes` applied; `device` may be a table name or a Device."""
        dev = device if isinstance(device, Device) else get_device(device) if device else current_device()
        knobs = {f.name: config.get(f.name) for f in fields(cls) if f.name in config.KNOBS and f.name != "device"}
        knobs.update(changes)
        if knobs.get("graph_replay"):
            dev = dev.replayed()
        return cls(dev, **knobs)

    def milp_options(self) -> dict[str, Any]:
        """HiGHS's limits for one ILP region or scheduling piece (`scipy.optimize.milp`'s
        options; plan/ilp.py takes only a proved optimum)."""
        return {"node_limit": self.ilp_node_limit, "time_limit": self.ilp_time_limit, "disp": False}

    def key(self) -> str:
        """A stable text of every field (the plan cache's key part)."""
        return repr(self)


__all__ = ["PlanOptions"]
