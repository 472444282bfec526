"""Every knob of stitchml in one place: name, environment variable, default, help.

Read a knob with `config.get("name")`; override it for a block with
`with config.override(name=value): ...`.  `stitchml config` prints this table.
"""
from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator


@dataclass(frozen=True)
class Knob:
    name: str
    env: str
    default: Any
    parse: Callable[[str], Any]
    help: str


def _bool(s: str) -> bool:
    return s.strip().lower() not in ("", "0", "false", "no", "off")


def off_auto_on(s: str | bool) -> str:
    """A three-way knob: `off`, `auto` or `on` (also a boolean: 1/true/yes and 0/false/no)."""
    if isinstance(s, bool):
        return "on" if s else "off"
    v = str(s).strip().lower()
    if v in ("1", "true", "yes", "on"):
        return "on"
    if v in ("", "0", "false", "no", "off"):
        return "off"
    if v == "auto":
        return "auto"
    raise ValueError(f"{s!r} is not one of off, auto, on")


KNOBS: dict[str, Knob] = {k.name: k for k in [
    Knob("pointwise_block", "STITCHML_POINTWISE_BLOCK", 1024, int,
         "Elements per program in flat point-wise kernels (power of two)."),
    Knob("persistent_max_cols", "STITCHML_PERSISTENT_MAX_COLS", 8192, int,
         "Longest row (elements, rounded up to a power of two) kept whole on chip; longer rows loop."),
    Knob("persistent_long_rows", "STITCHML_PERSISTENT_LONG_ROWS", True, _bool,
         "Rows longer than `persistent_max_cols` and 8192, up to 32768 elements, are also kept whole on chip in kernels "
         "without column partials whose data is 2 bytes an element, where the row's inputs that vary along it "
         "hold at most 65536 elements together (a softmax's x, its backward's y and dy; not a layer norm's x, "
         "weight and bias). H200, 2026-11-30, bf16 [1024 x 32768] (micro-check p32k): softmax forward 74.6 -> "
         "50.2 us, backward 67.1 -> 56.5, RMS norm 43.7 -> 41.7 against the looped form, layer norm 48.7 -> "
         "53.5 (three rows: stays looped). Static shapes only; float32 not measured (stays looped)."),
    Knob("loop_block_cols", "STITCHML_LOOP_BLOCK_COLS", 2048, int,
         "Columns per iteration in row-looped kernels."),
    Knob("block_elems", "STITCHML_BLOCK_ELEMS", 4096, int,
         "Target elements per program for row kernels; short rows are packed up to this many."),
    Knob("partial_programs_per_sm", "STITCHML_PARTIAL_PROGRAMS_PER_SM", 2, int,
         "Column partials beside rows held on chip (a norm backward's weight gradient): programs per SM, each "
         "walking several row blocks and storing one partial row (more programs: more latency hidden, a "
         "larger partial buffer). H200, 2026-11-25: layer_norm_bwd N=1024 at 2 per SM ran 4x its prediction."),
    Knob("prefetch_rows", "STITCHML_PREFETCH_ROWS", True, _bool,
         "Kernels whose programs walk row blocks (column partials beside rows held on chip) issue the next "
         "block's loads before computing the current one, hiding a memory latency per block. H200, 2026-11-30 "
         "(without it): these kernels ran 2.0-2.6x bytes over bandwidth, ~0.75 us a walked block "
         "(bench/NOTES.md, forty-eighth session); with it: not measured yet."),
    Knob("narrow_walks", "STITCHML_NARROW_WALKS", True, _bool,
         "A walk over row blocks whose programs cannot hold the next block's loads (16-warp tiles, two an "
         "SM: 64 registers a thread) is planned at half the warps and half the rows a tile, prefetched, "
         "where the cost model prices that lower (layer/RMS norm backward over rows of 1024-4096). "
         "H200: not measured yet (bench/NOTES.md, forty-ninth session)."),
    Knob("prefetch_columns", "STITCHML_PREFETCH_COLUMNS", True, _bool,
         "Row-looped kernels on a persistent grid (one program an SM walking rows, at most 16 elements a "
         "thread a column block) issue each loop's next column block's loads before computing the current "
         "one: with one program an SM, each block otherwise waits a memory latency (layer_norm_fwd "
         "[1024 x 32768] float32: 96 waits a program). Column-partial kernels are left alone (prefetched, "
         "their registers cost programs their place on the SM). Not measured yet (bench/NOTES.md, "
         "forty-ninth session)."),
    Knob("looped_partial_elems", "STITCHML_LOOPED_PARTIAL_ELEMS", 2048, int,
         "Column partials beside long (looped) rows: elements per loop iteration of a program's row block "
         "(rows x columns). H200, 2026-11-25: rms_norm_bwd N=32768 at 2048 ran 3.7x its prediction."),
    Knob("partial_lanes", "STITCHML_PARTIAL_LANES", True, _bool,
         "Column partials beside long (looped) rows: a program's tile keeps all its rows in each thread, its "
         "warps side by side along the columns (a column block of 32 x warps x 16-byte vectors), so each "
         "column block's partial row is summed in registers. Off: `looped_partial_elems` elements a tile, "
         "which Triton lays out with warps across the rows: sm_90 code of rms_norm_bwd N=32768 then sums "
         "every block's rows through shared memory (12 barriers an iteration; the H200 ran that kernel "
         "at 0.75 TB/s). Only where rows x vector fit 32 values a thread. Not yet measured on a GPU."),
    Knob("walk_looped_partials", "STITCHML_WALK_LOOPED_PARTIALS", "auto", off_auto_on,
         "Column partials beside long (looped) rows: `auto`: where the cost model prices it lower (`on`: "
         "wherever it applies, as the fuzzer draws it; `off`: never), one or two "
         "programs an SM walk the rows one at a time (a grid stride), each adding every row's column "
         "block into its own partial row (in L2), instead of a program for every few rows with all rows "
         "in flight at once: the re-reads of a row (a norm backward reads x and dy twice) then hit L2, and "
         "the partial buffer and its combine shrink to a row a program. rms_norm_bwd [1024 x 32768] bf16 "
         "on the H200: 2 x 128 MB in flight against 60 MB of L2, 109 us measured (2026-11-27) for 48 us "
         "of bytes. Static shapes. Not yet measured on a GPU."),
    Knob("partial_bytes_per_thread", "STITCHML_PARTIAL_BYTES_PER_THREAD", 64, int,
         "Column partials beside rows held on chip (a column sum, a bias gradient): the row block grows "
         "until a thread loads this many bytes an iteration (several independent 16-byte loads in flight), "
         "within 32 float32 accumulator values a thread and 4 iterations a program; 0 keeps "
         "`block_elems`. H200, 2026-11-25: column_sum [32768 x 1024] bf16 with 16 bytes a thread ran at "
         "29 % of copy bandwidth. Not yet measured on a GPU."),
    Knob("dtype_scaled_blocks", "STITCHML_DTYPE_SCALED_BLOCKS", True, _bool,
         "`pointwise_block` and `block_elems` count float32 elements: a program of 2-byte data holds twice "
         "as many (1-byte: four times), so it moves the same bytes (not kernels with column partials). "
         "H200, 2026-11-25: layer norm forward [32768 x 1024] took 76.3 us in bf16 and 79.2 in fp32 with "
         "the same tiles (programs latency-bound: 42 % of copy bandwidth against 81 %). Not yet measured "
         "on a GPU."),
    Knob("persistent_rows", "STITCHML_PERSISTENT_ROWS", True, _bool,
         "Row-looped kernels that read their rows more than once (a long row's statistics, then its output) "
         "run as one or two programs an SM walking rows, so that the rows in flight fit in half of L2 and the "
         "later passes read L2; chosen where the cost model's L2 estimate says the re-reads would otherwise "
         "miss. H200, 2026-11-25: layer_norm_fwd N=32768 fp32 (three passes, a program a row) ran at DRAM "
         "speed for all three, 136.5 us against Inductor's 84.8. Not yet measured on a GPU."),
    Knob("row_values", "STITCHML_ROW_VALUES", True, _bool,
         "Element-wise kernels (no reductions) that read values broadcast along rows of 1024 or more "
         "(a cross-entropy backward's per-token target, masks and log-sum-exp over [tokens, vocab]) walk "
         "rows: each per-row value loaded once a row, no division of the flat index per element. Flat, "
         "sm_90 code of GPT-2's loss backward took 50 instructions an element. Not yet measured on a GPU."),
    Knob("flat_row_runs", "STITCHML_FLAT_ROW_RUNS", True, _bool,
         "Flat element-wise kernels that read an input in row runs out of their flat order (a padded row "
         "read back to its traced width, a slice of each row) run one element a thread, so every warp "
         "access is 32 consecutive elements; with several a thread Triton issued such reads element by "
         "element, 16 bytes apart across the warp (GPT-2's logits copy-back: 20 % of copy bandwidth on "
         "an H200). Chosen by a probe of the kernel's reads (`plan/access.py`). Not yet measured on a GPU."),
    Knob("layout_order", "STITCHML_LAYOUT_ORDER", True, _bool,
         "Flat element-wise kernels whose reads and stores are contiguous along another dim than the "
         "innermost walk their domain in that order (a value stored transposed: LLaMA's key copy), and "
         "where two layouts meet (a transpose: BERT's key, read [tokens, hidden] and stored [.., head dim, "
         "tokens]) walk tiles of a cache line's worth of rows x columns, each access coalesced along its "
         "own dim and the tile converted through shared memory; before, one of the two was read or "
         "stored 2-4 bytes at a time, a warp touching 32 sectors. Chosen by a probe of the kernel's "
         "accesses (`plan/access.py`). Not yet measured on a GPU."),
    Knob("column_tails", "STITCHML_COLUMN_TAILS", True, _bool,
         "Row-looped kernels whose column count is not a multiple of the column block (GPT-2's 50257-wide "
         "logits) walk the whole blocks with a constant column mask and the last, partial block apart: "
         "Triton vectorises an access only where its mask is uniform over the vector, and `col < 50257` "
         "is not, so every such row was read 2-4 bytes at a time. Static shapes only (a dynamic "
         "template's column count is an argument). Not yet measured on a GPU."),
    Knob("align_rows", "STITCHML_ALIGN_ROWS", True, _bool,
         "Row-looped kernels over rows whose stride is not a multiple of 16 bytes (GPT-2's 50257-wide "
         "bfloat16 logits: row r starts 2r bytes past a 16-byte boundary) start each row's whole column "
         "blocks at its first 16-byte boundary, with the row's first few columns and its tail in a "
         "masked loop after them; the aligned start is told to Triton (`tl.multiple_of`), which then "
         "reads and stores 16 bytes a thread instead of 2 (sm_90 SASS: `tools/aot_check`). Needs "
         "column_tails. Not yet measured on a GPU."),
    Knob("warp_rows", "STITCHML_WARP_ROWS", True, _bool,
         "Row kernels (no column partials) over rows wider than one warp's 16-byte vectors and at most 32 "
         "elements a lane (bfloat16 257-1024 wide, float32 129-1024) run one row a program on one warp: row "
         "statistics are warp shuffles instead of shared-memory rounds, and a 768-wide row's dead lanes are "
         "dropped by the compiler (plan/mapping.py::WARP_ROW_ELEMS). sm_90 issue floors, bfloat16 (Triton 3.6): "
         "BERT's 768-wide layer norms -60 %, barriers 12 -> 0; a 1024-wide layer norm -30 %, barriers 8 -> 0. "
         "Static shapes only. H200, 2026-11-28 (bf16, against both knobs off): layer norm forward [32768 x 1024] "
         "43.1 -> 38.2 us, residual + dropout + layer norm 78.9 -> 70.4 us (Inductor 37.8, 125.7)."),
    Knob("warp_row_warps", "STITCHML_WARP_ROW_WARPS", 1, int,
         "Warps (rows) a program of a warp-row kernel (`warp_rows`): 1 gives programs of one warp and one row; "
         "more gives programs of that many rows, one a warp, each row held as segments one warp's 16-byte "
         "vectors wide side by side (plan/mapping.py::warp_row_mapping; kernels with scans, arg-reductions or "
         "register-heavy ops keep one-warp programs). The same instructions a row; fewer, larger programs "
         "for the block scheduler. H200, 2026-11-28 (bf16): 4 and 16 were no faster than 1 on any row measured, "
         "and 16 took residual + dropout + layer norm 70.4 -> 83.0 us."),
    Knob("trim_row_warps", "STITCHML_TRIM_ROW_WARPS", True, _bool,
         "A program of one whole row whose length is not a power of two runs at the warps that leave the "
         "fewest masked lanes live (plan/mapping.py::live_lane_warps): repeats of Triton's layout wholly past "
         "the row are dropped by the compiler, a repeat the row's end cuts is issued in full. softmax over "
         "5000-wide bfloat16 rows: 16 -> 4 warps, sm_90 warp-instructions a row -52 % (Triton 3.6). Static "
         "shapes only. H200, 2026-11-28 (bf16, with `warp_rows`, against both off): softmax over [6710 x 5000] "
         "46.8 -> 38.0 us, layer norm 58.8 -> 41.3 us (Inductor's softmax 104.8)."),
    Knob("partial_column_warps", "STITCHML_PARTIAL_COLUMN_WARPS", True, _bool,
         "Column partials beside rows held on chip (a norm backward's weight gradient, a bias gradient) over "
         "few rows, each program walking at most 4 row blocks of the 16-warp tile (BERT's 2048 tokens, GPT-2's "
         "4096) and rows that fill 4 warps of 16-byte vectors at least: programs with their warps side by side "
         "along the columns only (768-1024 bfloat16 columns: 4 warps), the row block shrunk to keep a thread's "
         "values, the combine's warps and tile scaled alike (plan/mapping.py::column_lane_partials). Static "
         "shapes only. H200, 2026-11-28 (bf16, [2048 x 768], the same plans through `block_elems=1024`): column "
         "sum 14.8 -> 5.2 us of device time, layer norm backward 28.3 -> 11.7 us (Inductor 5.1, 15.3); BERT's "
         "36 such launches a step took 30-36 us each. Rows of 4096 columns or more (a tile of one row) take the "
         "warps that leave the fewest lanes masked, at least 4 (BERT's 3072-wide GELU backward: 16 -> 4 warps, "
         "sm_90 issue floor 12.8 -> 9.2 us, Triton 3.6; not yet measured on a GPU)."),
    Knob("partial_segments", "STITCHML_PARTIAL_SEGMENTS", True, _bool,
         "Column partials beside rows of several a tile whose width is not a power of two, a fifth or more of "
         "the tile's lanes past the row: each row held as segments of the largest power of two dividing it "
         "(384 = 3 x 128), no lane masked (plan/mapping.py::segmented_partials). Swin-T's GELU backward with "
         "its bias gradient: sm_90 warp-instructions a real element 2.14 -> 1.52 (Triton 3.6). Static shapes "
         "only. Not yet measured on a GPU."),
    Knob("combine_spread", "STITCHML_COMBINE_SPREAD", True, _bool,
         "The combine of column partials takes column tiles narrower than 32 (down to 8 float32 columns, one "
         "32-byte sector a partial row) until the columns give programs for half the SMs "
         "(plan/mapping.py::combine_mapping): each program walks the partial rows in a chain of loads, so "
         "its latency sets these small kernels' time. H200, 2026-11-28 (BERT-base training): the 3072-wide "
         "combine, 96 programs, 2.3 us; the 768-wide ones, 24 programs, 4.8-4.9 us. A 768-wide combine gets "
         "96 programs of 8 columns. Static shapes only. Not yet measured on a GPU."),
    Knob("exact_rows", "STITCHML_EXACT_ROWS", True, _bool,
         "Kernels whose row count (element count, for flat kernels) the row block divides test no row "
         "mask: `rflat < rows` is then a constant, which Triton folds. Seen in sm_90 SASS: a masked "
         "load followed by `where(mask, x, -inf)` costs a select and predicate logic per element, ~3 of "
         "19 instructions an element in a looped softmax over bfloat16 (issue-bound at the H200's "
         "~16 an element). Static shapes only (a dynamic template's row count is an argument). Not yet "
         "measured on a GPU."),
    Knob("combine_casts", "STITCHML_COMBINE_CASTS", True, _bool,
         "A column reduction summed in float32 whose only reader is a cast (a bias or norm-weight gradient "
         "in bfloat16) is stored cast by the combine kernel of its partials, instead of a one-program "
         "kernel of its own after it (52 such launches a BERT-base backward step). Not yet measured on a GPU."),
    Knob("combine_epilogues", "STITCHML_COMBINE_EPILOGUES", True, _bool,
         "Element-wise work over a column reduction's result alone (a batch norm's mean, rstd and "
         "running-statistics update, read from its combined sums) is computed by the combine kernel after "
         "its reductions, instead of a one-program kernel after it (two launches a channels-last batch norm). "
         "Static shapes. Not yet measured on a GPU."),
    Knob("transposed_tiles", "STITCHML_TRANSPOSED_TILES", True, _bool,
         "Kernels with column partials that read an input transposed (unit stride along the rows, a large "
         "stride along the columns) walk tiles of 8-16 rows x a column block instead of 4 whole rows, so "
         "each column's run of contiguous values fills a 32-byte sector (a 4-row tile used a quarter of "
         "it). Chosen by a probe of the kernel's reads at plan time (`plan/access.py`). Not yet measured "
         "on a GPU."),
    Knob("transposed_row_warps", "STITCHML_TRANSPOSED_ROW_WARPS", True, _bool,
         "A whole-row tile of a row reduction that reads its input transposed (rows contiguous in memory, "
         "the reduced columns strided: batch-norm chunk statistics, a weight gradient over few tokens) gets "
         "64 elements a thread (2 warps for a 4096-element tile) instead of 8 (16 warps): Triton lays the "
         "tile out along its rows, so every row statistic crosses all the warps through shared memory, a "
         "fixed cost a thread. sm_90 code of the 56x56x256 chunk statistics: 46.5 M warp-instructions at 16 "
         "warps, 10.4 M at 2. Never fewer warps than the rows fill side by side, only where the grid has two "
         "programs an SM, and only with `transposed_tiles` on (the transposed-read family's knob). Not yet "
         "measured on a GPU."),
    Knob("layout_columns", "STITCHML_LAYOUT_COLUMNS", True, _bool,
         "A reduction over the dims that are outermost in memory, keeping the innermost (a batch norm's "
         "statistics over N, H, W of a channels-last tensor), is computed as a column reduction: programs "
         "of whole contiguous rows of channels walk row blocks and write partials that a combine sums. Off: "
         "a row reduction per channel, whose programs read one element of every 32-byte sector (2 bytes in "
         "bfloat16) and number only C (64 on ResNet-50's stem). Not yet measured on a GPU."),
    Knob("free_cats", "STITCHML_FREE_CATS", True, _bool,
         "A concatenation whose parts are cheap to read (an input padded with a constant, a gradient "
         "interleaved with zeros) is computed by the kernels that read it, each part loaded under its "
         "position's mask, where the plan weighs that cheaper than writing it and reading it back: a "
         "pooling window reads the input in place of its -inf padded copy. Not yet measured on a GPU."),
    Knob("window_recompute_ops", "STITCHML_WINDOW_RECOMPUTE_OPS", 256.0, float,
         "A value that a kernel would compute again at each of many index maps (a producer fused into a "
         "pooling window evaluated at every window offset) is written once and read instead when the "
         "recomputation exceeds this many operations an element ((evaluations - 1) x operations per "
         "evaluation; 0: no limit). timm cspnext's SPPF: a batch norm + SiLU fused into 5x5, 9x9 and 13x13 "
         "windows was evaluated 275 times an element (a 7900-line kernel, minutes of Triton compile); "
         "ResNet-50's stem pool (~8 operations an element) and PoolFormer's 3x3 stride-1 pool of a group norm stay fused. Not yet measured on a GPU."),
    Knob("narrow_writes", "STITCHML_NARROW_WRITES", True, _bool,
         "A kernel that would write an exact widening cast (bfloat16 to float32) of a value it computes writes "
         "the narrow value, and each reader casts it: half the bytes written and read back, the same numbers "
         "(ResNet-50's backward: the float32 ReLU of a residual gradient). Not yet measured on a GPU."),
    Knob("cat_parts", "STITCHML_CAT_PARTS", True, _bool,
         "An element-wise kernel that exists only to compute parts of one concatenation (a SwiGLU backward's "
         "gate and up gradients, concatenated for the weight gradient) is computed by the concatenation's "
         "kernel, each part at its own positions: the parts are never written and read back. Not yet measured "
         "on a GPU."),
    Knob("place_cats", "STITCHML_PLACE_CATS", True, _bool,
         "A concatenation whose parts are all computed by kernels is allocated first and each part is "
         "written straight into its slice (a GRU step's gate gradients, concatenated for the next matrix "
         "product): no kernel copies them. Off under dynamic shapes. Not yet measured on a GPU."),
    Knob("reduction_sums", "STITCHML_REDUCTION_SUMS", True, _bool,
         "A tree of adds of four or more sums over the same dims of same-shaped values (a recurrence's "
         "bias gradient, accumulated over its steps) is one sum over their concatenation: one reduction "
         "instead of one per step, rounded once (reassociated, not bit-equal to eager's order). Only with "
         "place_cats (and not under dynamic shapes): the steps' values are then written into the "
         "concatenation the sum reads. Not yet measured on a GPU."),
    Knob("product_sums", "STITCHML_PRODUCT_SUMS", True, _bool,
         "A tree of adds of four or more matrix products of one shape (a recurrence's weight gradient, "
         "accumulated over its steps) is one product over their concatenated inner dimension, where the cost "
         "model prices it and the operand copies below the products it replaces: rounded once (not bit-equal "
         "to eager's order). Not yet measured on a GPU."),
    Knob("chained_columns", "STITCHML_CHAINED_COLUMNS", False, _bool,
         "Two dependent reductions over the same few leading rows (at most 1024: a softmax or a two-pass "
         "variance over a small leading dim, the merge of batch-norm chunk statistics) as row reductions, each "
         "program holding its columns' rows whole and reading them transposed in tall tiles: one kernel instead "
         "of column partials and a combine for each. Static shapes. Off by default: built for `bn_chunk_stats` "
         "(bench/NOTES.md, thirty-ninth session), not measured on a GPU."),
    Knob("bn_chunk_stats", "STITCHML_BN_CHUNK_STATS", False, _bool,
         "Batch-norm training statistics from chunks of rows where x keeps its channels innermost (channels-last "
         "images, [N, C]) and its sizes are static: each chunk's mean and the sums of the deviations from it in "
         "one kernel, the chunks merged by Chan's formula in a second (exact, no shift to choose): three launches "
         "a batch norm, not five (with `chained_columns` on). Off by default until a GPU measures it "
         "(`tools/gpu_run.sh models-18`, bench-bn-chunks/): ResNet-50 training is predicted 2457 -> 2397 us, "
         "408 -> 304 launches; the chunk kernel's sm_90 code, 15x the old statistics' warp instructions at "
         "first, is now at their level (bench/NOTES.md, thirty-ninth and fortieth sessions)."),
    Knob("bn_shift_sample", "STITCHML_BN_SHIFT_SAMPLE", 16, int,
         "Batch-norm training statistics are sums of deviations from a shift, the per-channel mean of the "
         "batch's leading ceil(N / this) samples (a read of that fraction of x): both sums then take one pass "
         "and x is read twice, not three times. The variance's rounding error grows at most by a factor of "
         "this (a first sample unlike the rest), about 2 for ordinary batches. 1: the shift is the mean of "
         "the whole batch (a full extra read). Not yet measured on a GPU."),
    Knob("split_min_cols", "STITCHML_SPLIT_MIN_COLS", 1024, int,
         "Task splitting: rows split into chunks of at least this many elements, only when there are fewer "
         "rows than two programs per SM (AStitch's rule: split when rows < programs per wave and a row "
         "has > 1024 elements). Not yet tuned on a GPU."),
    Knob("split_long_variance", "STITCHML_SPLIT_LONG_VARIANCE", False, _bool,
         "A variance (layer norm) over rows longer than `persistent_max_cols` takes the chunk statistics of "
         "task splitting (chunks held on chip, their sums and M2 combined by Chan's formula) with any number "
         "of rows, instead of a looped kernel that walks each row three times (mean, variance, output). "
         "H200, 2026-11-27: layer_norm_fwd [1024 x 32768] bf16 ran 111 us (Inductor 68.5) where the cost "
         "model, counting the re-reads as L2 hits, predicted 34 and RMSNorm of that shape (two walks) took "
         "43.4; split, it reads the input twice from DRAM (predicted 57 us). Off until measured "
         "(`gpu_run.sh variants`)."),
    Knob("looped_partials", "STITCHML_LOOPED_PARTIALS", True, _bool,
         "Column reductions (a norm's weight and bias gradients) beside rows too long to hold on chip are "
         "computed in the row-looped kernel itself: each program walks a few rows together and writes one "
         "partial row per column block, a combine kernel sums the partials (instead of the element-wise "
         "product going to memory and separate column-sum kernels reading it back). Static shapes, and rows "
         "enough for two programs per SM; off = those column sums as kernels of their own."),
    Knob("fallback_on_error", "STITCHML_FALLBACK_ON_ERROR", True, _bool,
         "If planning or code generation fails, run the graph eagerly with a warning instead of raising."),
    Knob("interpreter_tree", "STITCHML_INTERPRETER_TREE", True, _bool,
         "Under Triton's interpreter (TRITON_INTERPRET=1), run `tl.reduce`/`tl.associative_scan` with a "
         "custom combine as a vectorised tree (pairwise halving, Hillis-Steele) instead of Triton's "
         "element-by-element Python loop: a GPU's combination order, log2(n) NumPy calls "
         "(runtime/interpreter_tree.py). No effect on a GPU."),
    Knob("interpreter_calls", "STITCHML_INTERPRETER_CALLS", True, _bool,
         "Under Triton's interpreter, a `@triton.jit` helper called inside a running launch runs directly, "
         "without Triton re-patching `triton.language` at every call (the launch's patches are in place): "
         "the same results, ~1.5 ms less a call (runtime/interpreter_calls.py). No effect on a GPU."),
    Knob("debug_dir", "STITCHML_DEBUG_DIR", "", str,
         "If set, write every generated kernel and wrapper source here."),
    Knob("cache_dir", "STITCHML_CACHE_DIR", str(Path.home() / ".cache" / "stitchml"), str,
         "Where generated kernel modules are written (Triton needs them on disk)."),
    Knob("record_launches", "STITCHML_RECORD_LAUNCHES", "", str,
         "A folder: every distinct kernel launch (its module file, name, argument types and the "
         "specialisation the JIT would give them, launch options) is appended there as a JSON line, so that "
         "`python -m stitchml.tools.aot_replay FOLDER` compiles for sm_90 every kernel a run under the "
         "interpreter launched (a test suite, a sweep, the fuzzer). Empty: nothing recorded."),
    Knob("retry_refused_kernels", "STITCHML_RETRY_REFUSED_KERNELS", True, _bool,
         "When Triton refuses to compile a kernel at its planned warp count (a compiler error, not a fault "
         "at run time), try the other warp counts and keep the first that compiles (logged; explain lists "
         "them) instead of running the whole graph eagerly. Grid-barrier kernels are never retried. "
         "(runtime/launcher.py)"),
    Knob("poison_outputs", "STITCHML_POISON_OUTPUTS", False, _bool,
         "Fill kernel outputs with NaN (max int for integers) before launching, so elements a kernel "
         "fails to write show up. For testing; costs a fill per output."),
    Knob("global_barriers", "STITCHML_GLOBAL_BARRIERS", True, _bool,
         "Allow the global scheme: dependent kernels as phases of one persistent launch with grid "
         "barriers. Off = the phase-split twin (one launch per phase)."),
    Knob("horizontal_fusion", "STITCHML_HORIZONTAL_FUSION", True, _bool,
         "Launch independent, launch-bound kernels together (dispatch on program-id ranges)."),
    Knob("sibling_fusion", "STITCHML_SIBLING_FUSION", True, _bool,
         "Merge independent element-wise kernels of the same shape that read a common buffer into one kernel "
         "(the buffer read once, one launch; also under dynamic shapes, where launches are never packed). "
         "Reductions over the same rows reading a common buffer are always merged."),
    Knob("serial_siblings", "STITCHML_SERIAL_SIBLINGS", False, _bool,
         "Merge such element-wise kernels also where the common buffer is small (a 0-d value): no byte is "
         "saved, and each merged body is more serial work for the same programs (H200: an AdamW step's 49 "
         "merged 768x768 updates ran at 25% of copy bandwidth). Off: they are left to launch grouping, which "
         "runs each on programs of its own."),
    Knob("dense_embedding_grad_rows", "STITCHML_DENSE_EMBEDDING_GRAD_ROWS", 4, int,
         "Embedding backward of a table with at most this many rows (BERT's token types: 2) and at least 8 "
         "tokens a row, computed as masked column sums (row e = the sum over tokens of where(id == e, grad, 0)): "
         "no atomics, deterministic; the gradient is read once a table row (from cache after the first), so "
         "few rows only. The scatter form's atomics queue on those few addresses (BERT-base: 1024 adds an "
         "address), the suspect of a 31-µs launch on an H200 (2026-11-28; unconfirmed). 0 = off."),
    Knob("compact_embedding_grads", "STITCHML_COMPACT_EMBEDDING_GRADS", True, _bool,
         "Embedding backward of a table with at least twice as many rows as the tokens reading it (a "
         "vocabulary), where that moves 16 MB less, sums the gradient over rows of the tokens: each "
         "table row's last token is its representative (an int32 atomic max), tokens add into their "
         "representative's row of a [tokens, H] float32 buffer, and each table row reads its "
         "representative's sum. Otherwise a zeroed float32 copy of the whole table takes the sums and "
         "is read back (8 bytes a table element: 309 MB of a GPT-2 training step). Not yet measured "
         "on a GPU."),
    Knob("multi_output_siblings", "STITCHML_MULTI_OUTPUT_SIBLINGS", True, _bool,
         "Merge column reductions of one domain whose reads are all outputs of one multi-output op "
         "(the query, key and value bias gradients of an attention backward: three partial kernels and "
         "three combines become one of each), though they read different buffers. Independent "
         "reductions of other origins stay apart (merging them could keep a buffer alive longer). "
         "Not yet measured on a GPU."),
    Knob("tuple_reductions", "STITCHML_TUPLE_REDUCTIONS", False, _bool,
         "Kernels holding whole rows on chip reduce sibling row sums (same axis, neither reading the "
         "other: a layer norm's corrected variance sums d and d*d, its backward sums g*dy and "
         "g*dy*xhat) in one `tl.reduce` of a tuple, one cross-warp round instead of one each. The same "
         "additions in the same order as separate sums. sm_90: one barrier fewer a row block. Off until "
         "measured on a GPU (predicted a few percent on layer norms); `tools/gpu_run.sh small-cols` and "
         "`variants` measure it."),
    Knob("ilp", "STITCHML_ILP", True, _bool,
         "Choose launch-level stitching (global / horizontal / separate) by ILP (scipy HiGHS); off = rules."),
    Knob("ilp_time_limit", "STITCHML_ILP_TIME_LIMIT", 3.0, float,
         "Seconds HiGHS may spend per region before the rule-based choice is kept: a safety bound only "
         "(a region it stops plans by the rules, so its plan would depend on the machine's speed; "
         "`ilp_node_limit` is the bound meant to apply). 2-core CPU, 2026-12-01: Swin-T's hardest region "
         "took 1.2-1.3 s, its next 0.4-0.5 s, against the former 0.5 s."),
    Knob("ilp_node_limit", "STITCHML_ILP_NODE_LIMIT", 200, int,
         "Branch-and-bound nodes HiGHS may explore per region before the rule-based choice is kept: a limit "
         "that does not depend on the machine's speed, so the same model plans the same everywhere "
         "(Swin-T's hardest region needed 5)."),
    Knob("cuda_graphs", "STITCHML_CUDA_GRAPHS", True, _bool,
         "Capture each compiled graph (inference, training forward and backward) in a CUDA graph at its second "
         "call and replay it: parameters and stable inputs are read in place, only changing inputs are copied; "
         "kernels' seeds come from a device buffer redrawn per replay. CUDA only; refusals (CPU sync, dynamic "
         "sizes, mutated copied inputs, a failed capture) are recorded for explain."),
    Knob("reuse_outputs", "STITCHML_REUSE_OUTPUTS", True, _bool,
         "A CUDA-graph replay hands out the output tensors of its last replay again where nobody kept them "
         "(Python reference count, TensorImpl use count and version unchanged) instead of making a fresh alias "
         "of each static output (runtime/cuda_graphs.py): ~0.5 us of host time an output, ~430 outputs a "
         "BERT-base training step. Not yet measured on a GPU."),
    Knob("reuse_buffers", "STITCHML_REUSE_BUFFERS", True, _bool,
         "The runtime wrapper gives a kernel output the storage of a dead intermediate buffer of the same "
         "size and dtype (never a graph output's) instead of allocating."),
    Knob("device", "STITCHML_DEVICE", "", str,
         "Device the cost model predicts for (H100, H200, A100, cpu); empty = the visible GPU, else cpu."),
    Knob("verbose", "STITCHML_VERBOSE", False, _bool,
         "Log each compiled graph's plan summary."),
    Knob("plan_search", "STITCHML_PLAN_SEARCH", "ilp", lambda s: s.strip().lower(),
         "How the plan is searched: `ilp` (HiGHS decides merges and launch grouping per region, the rule "
         "plan as warm start and fallback) or `rules` (the AStitch rules and rule-based launch groups only)."),
    Knob("strict", "STITCHML_STRICT", False, _bool,
         "CI mode: every fallback to eager (a whole graph, or an op with no lowering rule) raises "
         "stitchml.fallback.StrictFallbackError naming the op or graph and the reason, instead of "
         "running eagerly with a warning. Library ops by design (matmul, sort, topk) still run."),
    Knob("plan_cache", "STITCHML_PLAN_CACHE", True, _bool,
         "Keep planned and generated graphs on disk (under cache_dir), keyed by the lowered graph, knobs, "
         "device and stitchml's source: a second process compiling the same model skips planning and "
         "code generation."),
    Knob("compile_workers", "STITCHML_COMPILE_WORKERS", -1, int,
         "Processes that compile a graph's distinct kernels in parallel before its first launch (GPU only); "
         "-1 = one per CPU core (at most 16), 0 = no pool (Triton compiles each kernel at its first launch)."),
    Knob("compile_pool_method", "STITCHML_COMPILE_POOL_METHOD", "forkserver", lambda s: s.strip().lower(),
         "How the compile pool's workers start: 'forkserver' (one clean process imports torch, Triton and "
         "stitchml once and forks each worker; no CUDA in it) or 'spawn' (each worker a fresh interpreter that "
         "imports them itself: 16 at once took most of the 9-11 s an H200 host spent starting the pool). "
         "'forkserver' sets the process's fork-server preload list if no fork server runs yet."),
    Knob("compile_pool_prestart", "STITCHML_COMPILE_POOL_PRESTART", True, _bool,
         "Start the compile pool's workers in the background when the first graph reaches the backend on a GPU, "
         "so they are up by the time its kernels are generated; skipped when the cache folder holds compiled-"
         "kernel markers from an earlier process (a warm start then starts the pool only if a kernel needs it)."),
    Knob("pdl", "STITCHML_PDL", "off", str,
         "Programmatic dependent launch (Hopper and later): each stitched kernel (grid-barrier kernels "
         "excepted) is launched with Triton's `launch_pdl` and starts with a grid-dependency wait, so the "
         "next kernel's launch overlaps the previous one's tail. off | auto (CUDA GPUs of compute "
         "capability 9.0 or more) | on (every device: for sm_90 compile checks; the interpreter ignores "
         "it). Torch's static launcher takes no launch attributes: such kernels use Triton's launcher. "
         "Not yet measured on a GPU (runtime/pdl.py)."),
    Knob("static_launch", "STITCHML_STATIC_LAUNCH", True, _bool,
         "Bound launches go through torch's static CUDA launcher for Triton cubins "
         "(`torch._C._StaticCudaLauncher`, what Inductor launches with) instead of Triton's compiled "
         "entry point, which checks every pointer with a driver call; a kernel it refuses keeps "
         "Triton's (`runtime/launcher.py`). Needs `direct_launch`. Not yet measured on a GPU."),
    Knob("direct_launch", "STITCHML_DIRECT_LAUNCH", True, _bool,
         "Launch compiled kernels through a launcher bound once (Triton's compiled-kernel entry point, no "
         "JIT dispatch per call); off = every launch goes through Triton's JIT. GPU only."),
    Knob("pad_gemm", "STITCHML_PAD_GEMM", "auto", lambda s: s.strip().lower(),
         "Pad matrix products (mm, addmm, bmm) whose operands or result have a leading dimension that is not a "
         "multiple of 16 bytes (odd vocabularies: BERT 30522, GPT-2 50257), so that cuBLAS runs its fast kernels "
         "(capture/pad_gemm.py): `auto` (CUDA tensors), `on` (also CPU, for tests), `off`."),
    Knob("linear_ce", "STITCHML_LINEAR_CE", True, _bool,
         "Rewrite an LM head (h @ Wᵀ, optional bias and tanh softcap) followed by cross-entropy into the "
         "chunked fused op (stitchml::linear_cross_entropy): the [tokens, vocab] logits are never "
         "materialised; grad_h and grad_W are computed in the forward pass. Refused when the logits escape."),
    Knob("linear_ce_chunk", "STITCHML_LINEAR_CE_CHUNK", 0, int,
         "Tokens per chunk in the fused linear + cross-entropy op; 0 = auto (a power of two: the chunk's logits "
         "within 128 MiB but at least 256 tokens, so the chunk's GEMMs stay compute-bound)."),
    Knob("linear_ce_fp32_grad_w", "STITCHML_LINEAR_CE_FP32_GRAD_W", False, _bool,
         "Fused linear + cross-entropy with bf16/fp16 weights: sum grad_W over token chunks in an fp32 buffer "
         "(one rounding, like eager; costs 2x W's size) instead of in place in W's dtype (one rounding per chunk)."),
    Knob("linear_ce_grads_in_forward", "STITCHML_LINEAR_CE_GRADS_IN_FORWARD", True, _bool,
         "Fused linear + cross-entropy: compute grad_h and grad_W in the forward pass (one logits product per "
         "chunk; the gradients live until backward). Off: the forward keeps one float per token and the "
         "backward recomputes each chunk's logits (one more product; nothing of W's size held across the step)."),
    Knob("ignore_once_logging", "STITCHML_IGNORE_ONCE_LOGGING", True, _bool,
         "Let Dynamo trace through `logging.Logger.warning_once` / `info_once` (Hugging Face's once-only "
         "messages) as no-ops instead of breaking the graph there (capture/logging_breaks.py): GPT-2's "
         "training step warns about its loss type inside forward, which split its LM head from the loss (no "
         "linear_ce). Set when stitchml is imported, by stitchml.compile, a new StitchBackend and the bench once a "
         "case is built (wherever transformers is imported by then); affects "
         "every torch.compile backend of the process. The message is not printed from compiled code."),
    Knob("cross_entropy", "STITCHML_CROSS_ENTROPY", True, _bool,
         "Rewrite F.cross_entropy(x, t) / nll_loss(log_softmax(x, -1), t) on 2-D logits (that linear_ce left) into "
         "log-sum-exp form (patterns/cross_entropy.py): backward keeps the logits and one float per row instead of "
         "the [rows, classes] log-probabilities, about 3 passes over the logits for forward + backward instead of "
         "6. Refused (with the reason) for class weights, soft targets, N-D inputs, non-constant options."),
    Knob("aot_cache", "STITCHML_AOT_CACHE", True, _bool,
         "Keep each graph's AOTAutograd result (forward and backward ATen graphs, runtime metadata) in torch's "
         "AOTAutograd cache, bundled with stitch's compiler (capture/aot_cache.py): a second process skips "
         "tracing the joint graph and partitioning it (BERT-base training on the 2-core CPU: ~4.7 s of a 7.6 s "
         "warm first step) and compiles the cached graphs through stitch's own warm caches. Static sizes only; "
         "keyed by torch's key, stitchml's source and every knob; entries under TORCHINDUCTOR_CACHE_DIR."),
    Knob("remat", "STITCHML_REMAT", True, _bool,
         "Split training graphs with AOTAutograd's min-cut rematerialisation partitioner: the backward recomputes "
         "cheap element-wise values from what the forward saves anyway (e.g. RMSNorm's normalised input from x and "
         "the row's rsqrt: modelled backward bytes 539 -> 405 MB at [32768, 1024] fp32) instead of the forward "
         "writing them and the backward reading them back. What a backward comparison of two tensors reads (a "
         "max/min mask, a max-pool's arg-max) is saved, not recomputed, and a cast out of a half type "
         "rounds first, so recomputed values match the saved ones where the program subtracts or compares them. "
         "Off: the default partitioner (saves every intermediate the backward uses)."),
    Knob("attention_sdpa", "STITCHML_ATTENTION_SDPA", True, _bool,
         "Rewrite a captured math attention (q·kᵀ, scale, additive/boolean/causal mask, softmax, dropout, ·v) "
         "into F.scaled_dot_product_attention, so a fused attention kernel runs instead of the score tensor "
         "going to memory."),
    Knob("masked_setitem", "STITCHML_MASKED_SETITEM", True, _bool,
         "Rewrite y[mask] = v (one boolean mask after full slices, v one value or one row for every selected "
         "position, e.g. a mask token) into y.copy_(where(mask, v, y)) on the Dynamo graph: one point-wise kernel, "
         "and v's gradient traces (index_put's own backward reads grad[mask], a data-dependent shape that breaks "
         "the graph)."),
    Knob("gemm_epilogue", "STITCHML_GEMM_EPILOGUE", "auto", off_auto_on,
         "Linear + (bias, GELU, tanh-GELU, SiLU, relu, silu*mul, residual add, cast) as one Triton GEMM with the "
         "element-wise work in its epilogue (stitchml::linear_epilogue): `auto` lets the cost model choose "
         "between that and cuBLAS + a stitched element-wise kernel per product, and fuses only where the "
         "device's calibration measured our GEMM template against cuBLAS (`stitchml calibrate`; until then "
         "every product stays with cuBLAS, the reason in `explain`); `on` fuses every match, `off` none "
         "(1/0 read as on/off)."),
]}

_overrides: list[dict[str, Any]] = []


def get(name: str) -> Any:
    knob = KNOBS[name]
    for layer in reversed(_overrides):
        if name in layer:
            return layer[name]
    raw = os.environ.get(knob.env)
    if raw is None:
        return knob.default
    try:
        return knob.parse(raw)
    except ValueError as e:   # name the variable: the parser only saw its value
        raise ValueError(f"{knob.env}={raw!r}: {e}") from None


@contextlib.contextmanager
def override(**values: Any) -> Iterator[None]:
    unknown = set(values) - set(KNOBS)
    if unknown:
        raise KeyError(f"unknown stitchml knob(s): {sorted(unknown)}")
    _overrides.append(values)
    try:
        yield
    finally:
        _overrides.pop()


def table() -> str:
    rows = [f"{k.env:32} {str(k.default)[:30]:32} {k.help}" for k in KNOBS.values()]
    return "\n".join([f"{'variable':32} {'default':32} help"] + rows)
