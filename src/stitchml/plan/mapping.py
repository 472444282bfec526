"""Thread mapping: which kernel form and block shape cover a domain.

Rules (thresholds are fields of `PlanOptions`, from knobs in config.py; defaults are
the AStitch paper's guidance and Triton's usual register budget until measured on a GPU):
- no column axis → flat point-wise, `pointwise_block` elements per program;
- rows that fit on chip (next pow2 ≤ `persistent_max_cols`, or a half-type row of up to
  32768 whose varying inputs fit: `long_row_on_chip`) → whole row per program;
  short rows are packed (horizontal packing) until a program holds `block_elems`;
- longer rows → one row per program, looping over `loop_block_cols` columns; beside
  column reductions (`looped_partials`) a few rows per program, so that each column
  block's partial sums over those rows are one store (`partials_fit`, `looped_rows`).
Under dynamic shapes (`PlanOptions.fixed_row_blocks`, set by the dynamic runner) the
row and flat blocks take their cap instead of next_pow2 of the row count, so the
mapping of a kernel changes only with its column extent: the power-of-two size
buckets of `dynamic/shapes.py::bucket_of`.
"""
from __future__ import annotations

from dataclasses import replace

from .data import Domain, Mapping
from .options import PlanOptions


def next_pow2(n: int) -> int:
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


def _warps(elems: int) -> int:
    return max(1, min(16, next_pow2(max(elems // 256, 1))))


def fits_on_chip(cols: int, opts: PlanOptions) -> bool:
    """A row of `cols` elements is held whole in one program's registers."""
    return next_pow2(cols) <= opts.persistent_max_cols


LONG_ROW_MAX_COLS = 32768     # long_row_on_chip: the longest row (next power of two) ...
LONG_ROW_MAX_ELEMS = 65536    # ... and the most elements its varying inputs hold together


def long_row_on_chip(cols: int, itemsize: int, row_values: int, opts: PlanOptions) -> bool:
    """A row longer than `persistent_max_cols` (and 8192) that is still held whole in one program
    (knob `persistent_long_rows`): 2-byte data, at most LONG_ROW_MAX_COLS elements, and
    the inputs varying along it (`row_values`) hold at most LONG_ROW_MAX_ELEMS elements
    together.  Only in kernels without column partials (grouping decides those with
    `fits_on_chip` alone).  H200, 2026-11-30, bf16 [1024 x 32768], rows held whole
    against looped: softmax 74.6 -> 50.2 us (one varying input), its backward 67.1 ->
    56.5 (two), RMS norm 43.7 -> 41.7 (two), layer norm 48.7 -> 53.5 (three: x, weight,
    bias; excluded).  The looped form walks a row two or three times, from L2 at best."""
    bc = next_pow2(cols)
    # (above 8192 whatever `persistent_max_cols` is: tests and the fuzzer lower that knob to
    # force short rows into the looped form)
    return (opts.persistent_long_rows and not opts.fixed_row_blocks and itemsize <= 2
            and max(opts.persistent_max_cols, 8192) < bc <= LONG_ROW_MAX_COLS
            and bc * max(row_values, 1) <= LONG_ROW_MAX_ELEMS)


def partials_fit(rows: int, cols: int, opts: PlanOptions) -> bool:
    """Column reductions over this domain's rows can be per-program partials: whole rows
    on chip, or (knob `looped_partials`, static shapes) long rows walked in column blocks
    by programs of several rows, when there are rows for two programs per SM at least."""
    if fits_on_chip(cols, opts):
        return True
    return opts.looped_partials and not opts.fixed_row_blocks and rows >= 4 * opts.device.sms


def looped_rows(rows: int, opts: PlanOptions) -> int:
    """Rows per program of a looped kernel with column partials: the fewest (at least 2,
    at most 32) that keep the grid within `partial_programs_per_sm` programs per SM (2).  The partial buffer is
    (rows / R) x cols float32 values, written once and read by the combine: 8 / R bytes
    per [rows, cols] element, against the 2 x itemsize that a norm backward's x and
    gradient cost (half of that at R = 4 in bfloat16, a quarter in float32; the float32
    product it replaces cost 8), while the grid keeps a program or two per SM busy."""
    r = 2
    while r < 32 and -(-rows // r) > opts.partial_programs_per_sm * opts.device.sms:
        r *= 2
    return r


def elems_scale(itemsize: int) -> int:
    """How many times `pointwise_block` / `block_elems` elements a program of 2-byte (or
    1-byte) data holds: the knobs count float32 elements, so that a program moves the
    same bytes whatever the dtype.  The H200 (twelfth session) ran the same kernel
    structure in about the same time per program in bfloat16 as in float32 (layer
    norm forward [32768 x 1024]: 76.3 vs 79.2 µs; softmax, RMS norm alike): programs of
    four 1024-wide rows are latency-bound, so half the bytes a program was half the
    bandwidth (42 % of copy against 81 %)."""
    return max(1, min(4, 4 // max(itemsize, 1)))


SCALED_MIN_PROGRAMS_PER_SM = 8   # dtype-scaled blocks only where programs of `block_elems` x scale elements
                                 # still number this many an SM
SCALED_MIN_COLS = 1024           # ... and, for row kernels, rows at least this wide (a row across warps)


def choose(domain: Domain, opts: PlanOptions, partials: bool = False, itemsize: int = 4,
           row_values: int = 1, row_loads: int = 1) -> Mapping:
    """The mapping of a kernel over `domain`; `itemsize`: the largest element size of
    its full-size accesses (programs hold the same bytes in any dtype, `elems_scale`;
    not kernels with column partials, whose tiles `deeper_partial_tile` sizes);
    `row_values`: how many inputs varying along the row it reads (what a thread holds
    per element of a row it keeps whole: `live_lane_warps` trims no further than they
    fit); `row_loads`: the loads it issues per element of such a row (each input once per
    index map it is read through): a warp a row holds 32 elements a lane of each
    (`WARP_ROW_LOADS`)."""
    fixed = opts.fixed_row_blocks
    scale = 1 if partials or not opts.dtype_scaled_blocks else elems_scale(itemsize)
    if scale > 1:
        base = opts.pointwise_block if domain.is_flat else max(opts.block_elems, next_pow2(domain.cols))
        if domain.rows * domain.cols < SCALED_MIN_PROGRAMS_PER_SM * opts.device.sms * base * scale:
            scale = 1   # few rows (BERT's 2048 tokens): bigger programs would leave SMs short of them
    if domain.is_flat:
        n = domain.rows
        block = opts.pointwise_block * scale
        block = block if fixed else min(block, next_pow2(n))
        return Mapping("pointwise", block, 1, _warps(block), -(-n // block))
    rows, cols = domain.rows, domain.cols
    bc = next_pow2(cols)
    if fits_on_chip(cols, opts) or not partials and long_row_on_chip(cols, itemsize, row_values, opts):
        # (tall tiles of narrow rows, [64, 128], took 75 registers for sm_90 where [32, 128] took 40)
        cap = opts.block_elems * (scale if bc >= SCALED_MIN_COLS else 1) // bc
        br = max(1, cap if fixed else min(next_pow2(rows), cap))
        form = "packed_rows" if br > 1 else "row_persistent"
        blocks = -(-rows // br)
        if not partials:
            vec = 16 // max(min(itemsize, 16), 1)
            if (opts.warp_rows and not fixed and 32 * vec < bc <= 32 * WARP_ROW_ELEMS
                    and bc // 32 * row_loads <= WARP_ROW_LOADS):
                return warp_row_mapping(rows, cols, vec, opts.warp_row_warps)   # a warp a row
            warps = _warps(br * bc)
            if br == 1 and opts.trim_row_warps and not fixed:
                warps = live_lane_warps(cols, warps, vec, values=row_values)
            return Mapping(form, br, bc, warps, blocks)
        # column partials: each program walks several row blocks (grid-stride) so the
        # partial buffer (programs x cols) stays small; a few waves of programs suffice
        mp = Mapping(form, br, bc, _warps(br * bc), *_partial_walk(rows, br, opts))
        if opts.partial_column_warps and not fixed:
            mp = column_lane_partials(mp, rows, cols, itemsize, opts)
        if opts.partial_segments and not fixed:
            mp = segmented_partials(mp, rows, cols, itemsize, opts)
        return mp
    if partials:   # several rows per program: one partial row per program and column block
        br = looped_rows(rows, opts)
        bc = min(next_pow2(cols), max(min(32, opts.looped_partial_elems), opts.looped_partial_elems // br))
        return Mapping("row_looped", br, bc, _warps(br * bc), -(-rows // br))
    bc = opts.loop_block_cols
    return Mapping("row_looped", 1, bc, _warps(bc), rows)


SEGMENT_MIN_WASTE = 0.2   # segmented_partials: where at least this share of the tile's lanes is past the row
SEGMENT_MAX = 4           # ... in at most this many segments (each segment's code is emitted in turn)


def segmented_partials(mp: Mapping, rows: int, cols: int, itemsize: int, opts: PlanOptions) -> Mapping:
    """Column partials beside rows of several a tile whose width is not a power of two:
    each row held as `cols / w` segments of the largest power of two w dividing it
    (`Mapping.segments`), no lane masked, a thread one 16-byte vector of each segment, as
    many warps as the segments need to keep the tile's vectors in flight (the next power of
    two of the warps over the segments), the row block what those warps fill.  Swin-T's
    GELU backward with its bias gradient, rows of 384 bfloat16 in [8, 512] tiles of 16
    warps, computed a quarter of its lanes masked: sm_90 (Triton 3.6) 2.14 warp-instructions
    a real element, as three [16, 128] segments at 8 warps 1.52 (issue floor 78.7 → ~56 µs,
    copy 53.9; bench/NOTES.md, forty-first session).  A one-row tile keeps
    `live_lane_warps` (there the compiler drops the repeats past the row); column-lane
    programs keep their tiles."""
    vec = 16 // max(min(itemsize, 16), 1)
    bc = next_pow2(cols)
    if (mp.block_r == 1 or mp.column_lanes or mp.segments > 1 or mp.block_c != bc
            or bc - cols < SEGMENT_MIN_WASTE * bc):
        return mp
    w = cols & -cols   # the largest power of two dividing cols
    segments = cols // w
    if w < 8 * vec or segments > SEGMENT_MAX:
        return mp
    warps = min(16, next_pow2(-(-mp.num_warps // segments)))
    br = warps * 32 * vec // w
    if br < 2:
        return mp
    return Mapping("packed_rows", br, w, warps, *_partial_walk(rows, br, opts), segments=segments)


COLUMN_LANE_MAX_WALK = 4   # column_lane_partials: only where a program walks at most this many row blocks
COLUMN_LANE_MIN_WARPS = 4  # ... and the columns fill this many warps (narrower rows: unmeasured, unchanged)


def column_lane_partials(mp: Mapping, rows: int, cols: int, itemsize: int, opts: PlanOptions) -> Mapping:
    """Column partials beside rows held on chip, over few rows (each program of the
    16-warp tile walking at most COLUMN_LANE_MAX_WALK row blocks): programs whose warps
    lie side by side along the columns only, as many as the row's next power of two
    fills with 32 lanes of 16-byte vectors (768-1024 bfloat16 columns: 4), the row
    block shrunk by the same factor so that a thread holds as many values as before.
    A [4, 1024] tile over 16 warps puts 4 warps across the rows (Triton fills the
    columns first), and BERT's [2048 x 768] norm backward and bias-gradient kernels in
    that form took 30-36 µs a launch on the H200 (2026-11-27/28) where 3-5 were
    predicted; the same plans at 4 warps (through `block_elems=1024`) took the column
    sum 14.8 -> 5.2 µs of device time and the layer-norm backward 28.3 -> 11.7 µs
    (Inductor 5.1 and 15.3).  Why 16-warp programs lose that much there is not known
    (sm_90 code of both has the same instructions a byte and no barriers in the
    loop); long walks (32768 rows) and rows that fill fewer than COLUMN_LANE_MIN_WARPS
    warps keep their tiles until measured.  `itemsize`: the largest element size of
    the kernel's full-size accesses (narrowest vector).

    A tile of one row (rows of 4096 columns or more) cannot shrink its row block: its
    warps become the fewest that cover the row with the fewest masked lanes
    (`live_lane_warps`, knob `trim_row_warps`, as for rows without partials; at least
    COLUMN_LANE_MIN_WARPS), the walk unchanged.  BERT's GELU backward with its bias
    gradient, [2048 x 3072] bf16 in a 4096 tile of 16 warps, computed a quarter of its
    lanes masked: 20.7 µs a launch on the H200 (2026-11-28) against 9.7 at copy
    bandwidth, its sm_90 issue floor 12.8 µs; at 4 warps (three whole repeats of 1024)
    that floor is 9.2 (`tools/aot_check`, Triton 3.6; bench/NOTES.md, twenty-ninth
    session)."""
    vec = 16 // max(min(itemsize, 16), 1)
    if mp.block_r == 1:
        live = (live_lane_warps(cols, mp.num_warps, vec, COLUMN_LANE_MIN_WARPS) if opts.trim_row_warps
                else mp.num_warps)
        return replace(mp, num_warps=live, column_lanes=True) if live < mp.num_warps else mp
    warps = max(1, min(mp.num_warps, mp.block_c // (32 * vec)))
    if warps >= mp.num_warps or warps < COLUMN_LANE_MIN_WARPS or mp.row_blocks > COLUMN_LANE_MAX_WALK:
        return mp
    br = max(1, mp.block_r * warps // mp.num_warps)
    return Mapping("packed_rows" if br > 1 else "row_persistent", br, mp.block_c, warps,
                   *_partial_walk(rows, br, opts), column_lanes=True)


WARP_ROW_ELEMS = 32   # a row this many elements a lane or fewer (1024) is one warp's, when wider than a warp's vectors
# Rows of 257-1024 bfloat16 (129-1024 float32) values were tiles of several rows over
# 16 warps, Triton's layout putting up to 4 warps across each row: every row statistic
# a shared-memory round with barriers, and a 768-wide row (BERT, GPT-2) in a 1024 tile
# whose fourth warp of each row only masked.  One warp a program, one row a warp: the
# statistics are warp shuffles, and the repeats past the row's end are dropped by the
# compiler (`live_lane_warps`).  sm_90 (Triton 3.6, `tools/aot_check`'s issue floors on
# the H200), bfloat16: BERT's 768-wide residual + layer norm 2.0 -> 0.8 µs, barriers
# 12 -> 0; layer norm forward over 32768 x 1024 20.4 -> 14.3 µs, barriers 8 -> 0
# (bench/NOTES.md, twenty-seventh session).


# ... while a lane's loads hold at most this many values: PoolFormer's float32 group norm
# recomputed at a 3x3 pool's nine offsets (chunks of 1024, 50 loads an element, five of
# them per offset) as a warp a row took 255 registers and 1160 stack bytes a thread for
# sm_90 (Triton 3.6; bench/NOTES.md, forty-fourth session)
WARP_ROW_LOADS = 384


def warp_row_mapping(rows: int, cols: int, vec: int, warps: int) -> Mapping:
    """A warp a row (`WARP_ROW_ELEMS`): with `warps` 1, programs of one warp and one row,
    the tile the row's next power of two; with more, programs of `warps` rows, one a
    warp, each row held as segments one warp's vectors wide (32 x `vec` columns) side by
    side: a [warps, 32 x vec] tile a segment, so Triton's layout puts the warps along the
    rows (`emit_core.KernelBuilder` emits each segment's code in turn and combines the
    segments' partial reductions in registers before one warp reduction)."""
    if warps <= 1:
        return Mapping("row_persistent", 1, next_pow2(cols), 1, rows)
    width = 32 * vec
    segments = -(-cols // width)
    br = min(warps, next_pow2(rows))
    return Mapping("packed_rows" if br > 1 else "row_persistent", br, width, br, -(-rows // br), segments=segments)


ROW_THREAD_ELEMS = 64   # live_lane_warps: most row elements a thread may hold after fewer warps
# ... and most input values (row elements x inputs varying along it): a batch-norm backward fused
# with a max-pool backward (dla46x_c, bf16: 11 inputs, rows of 6272 in an 8192 tile) trimmed
# to 4 warps held 56 elements of each, 255 registers and 1496 stack bytes a thread for
# sm_90 (Triton 3.6); at 8 warps 220 registers, no stack (bench/NOTES.md, forty-third session)
ROW_THREAD_VALUES = 384
REGISTERS_AT_16_WARPS = 128   # 65536 registers an SM over 512 threads


def live_lane_warps(cols: int, warps: int, vec: int, least: int = 1, values: int = 1) -> int:
    """The warps of a one-row program over a row of `cols` elements (a power-of-two tile)
    that leave the fewest masked lanes live, at most `warps`.  Triton lays the tile out
    as `warps` x 32 threads of `vec` consecutive elements, repeated along the row: a
    repeat lying wholly past the row is masked for every thread, which LLVM proves and
    drops; a repeat the row's end cuts is issued in full by every thread.  A 5000-wide
    bfloat16 row in an 8192 tile at 16 warps (4096 lanes a repeat) computes 8192 lanes
    for 5000 (39 % masked); at 4 warps (1024 a repeat) 5120: the softmax's sm_90
    warp-instructions a row fell from 16 x 286 to 4 x 544 (-52 %; Triton 3.6,
    bench/NOTES.md, twenty-seventh session).  Fewer warps only while a thread holds at
    most ROW_THREAD_ELEMS of the row and, over the kernel's `values` inputs that vary
    along the row, at most ROW_THREAD_VALUES values (registers), only where the span shrinks, and
    never below `least` warps."""
    def span(w: int) -> int:
        lanes = w * 32 * vec
        return -(-cols // lanes) * lanes

    def fits(w: int) -> bool:
        held = span(w) // (w * 32)
        return held <= ROW_THREAD_ELEMS and held * max(values, 1) <= ROW_THREAD_VALUES

    best, w = warps, warps // 2
    while w >= max(least, 1) and fits(w):
        if span(w) < span(best):
            best = w
        w //= 2
    if best == 16 and span(16) // 512 * values > REGISTERS_AT_16_WARPS and least <= 8 and fits(8):
        # sixteen warps leave a thread 128 registers: the dla46x_c kernel above spilled 160
        # bytes at 16 warps, none at 8 (same span, more registers a thread)
        best = 8
    return best


PARTIAL_LANE_WARPS = 8          # warps of a looped partial kernel's program, side by side along the columns
PARTIAL_LANE_VALUES = 32        # a tile's values a thread may hold per input (rows x one 16-byte vector)


def partial_lanes(mp: Mapping, cols: int, itemsize: int) -> Mapping:
    """A looped kernel with column partials (`choose(..., partials=True)`: R rows, a column
    block) laid out so that every thread holds all R rows of its columns: a column
    block of 32 x warps x (16 / `itemsize`) columns, the width Triton's 16-byte vectors
    give one warp's lanes, so that no two warps share a column and each column block's
    partial row (a sum over the R rows) is summed in registers.  With `looped_partial_elems`
    elements a tile ([4, 512] at 8 warps) Triton put the warps across the rows
    (warpsPerCTA [4, 2]); the sum then went through shared memory every iteration (sm_90
    code of rms_norm_bwd N=32768: 12 barriers an iteration; the H200 ran that kernel at
    0.75 TB/s, 18 % of copy bandwidth).  `itemsize`: the smallest element size of the
    kernel's full-size accesses (the widest vector).  Unchanged where R rows of a vector
    exceed PARTIAL_LANE_VALUES a thread (registers)."""
    vec = 16 // max(min(itemsize, 16), 1)
    if mp.form != "row_looped" or mp.block_r * vec > PARTIAL_LANE_VALUES:
        return mp
    bc = min(next_pow2(cols), 32 * PARTIAL_LANE_WARPS * vec)
    warps = max(1, min(PARTIAL_LANE_WARPS, bc // (32 * vec)))
    return replace(mp, block_c=bc, num_warps=warps)


PERSISTENT_LOOP_COLS = 8192   # column block of persistent looped rows: 16 elements a thread of 16 warps


def persistent_looped(rows: int, cols: int, row_bytes: float, opts: PlanOptions) -> Mapping:
    """A row-looped kernel that reads its rows more than once (statistics, then the
    output), as one or two programs an SM walking rows with a grid stride, so that the
    rows in flight fit in half of L2 and the passes after the first read L2, not DRAM.
    With a program for every row, 8 resident an SM, the H200 re-read every row from
    DRAM: 1056 rows of 128 KB (layer_norm_fwd N=32768 fp32, three passes) were 134 MB in
    flight against 60 MB of L2 (measured 136.5 µs; Inductor 84.8).  Fewer programs hold
    fewer bytes in flight, so each walks 8192-column blocks (32-64 KB an iteration)."""
    dev = opts.device
    per_sm = max(1, min(2, int(dev.l2_bytes // 2 // max(dev.sms * row_bytes, 1))))
    grid = min(rows, dev.sms * per_sm)
    bc = min(next_pow2(cols), max(opts.loop_block_cols, PERSISTENT_LOOP_COLS))
    return Mapping("row_looped", 1, bc, _warps(bc), grid, -(-rows // grid))


WALKED_PARTIAL_THREAD_BYTES = 192   # walking_looped_partials: a column block's bytes a thread


def walking_looped_partials(rows: int, cols: int, row_bytes: float, partials: int, opts: PlanOptions,
                            elem_bytes: int) -> Mapping:
    """Column partials beside looped rows as a persistent grid (`persistent_looped`): one
    row a tile, each program walking rows with a grid stride and adding each row's
    column block into its own partial row (`emit_store.looped_partial`), which stays in
    L2 between its rows; so the rows in flight and the partial rows (`partials` float32
    values a column each) together size the grid.  Against `choose`'s program for every
    R rows (all rows in flight at once: a norm backward's second read of x and dy misses
    L2 once they pass it), chosen where the model prices it lower (`planner`).
    `elem_bytes`: bytes a column of the block costs a thread (its full-size inputs and a
    float32 summand a partial); the block narrows until a thread's share is at most
    WALKED_PARTIAL_THREAD_BYTES.  sm_90 (Triton 3.6), [1, 8192] blocks at 16 warps: an RMS
    norm backward's (x, dy and one partial: 128 bytes in bfloat16, 192 in float32) took
    53 and 101 registers; a layer norm's in float32 (two partials, 256 bytes) 128 and
    spilled 40 bytes."""
    mp = persistent_looped(rows, cols, row_bytes + 4 * cols * partials, opts)
    bc = mp.block_c
    while bc > 32 * mp.num_warps and bc // (32 * mp.num_warps) * elem_bytes > WALKED_PARTIAL_THREAD_BYTES:
        bc //= 2
    return replace(mp, block_c=bc)


ACCUMULATOR_ELEMS_PER_THREAD = 32   # float32 column sums a thread may hold, all accumulators together
MIN_ROW_BLOCKS_PER_PROGRAM = 4      # a taller tile must leave each program this many iterations


def deeper_partial_tile(mp: Mapping, rows: int, bytes_per_elem: int, accumulators: int,
                        opts: PlanOptions) -> Mapping:
    """Column partials beside rows held on chip (`choose(..., partials=True)`): taller row
    blocks where a thread would load fewer than `partial_bytes_per_thread` bytes an
    iteration of its grid-stride loop.  Each iteration's loads wait on nothing but
    are issued after the previous iteration's adds: one [4, 1024] bfloat16 tile over 16
    warps is a single 16-byte load a thread in flight, and the H200 ran `column_sum`
    [32768 x 1024] bf16 that way at 29 % of copy bandwidth (Inductor 59 %).  The tile
    doubles while the float32 accumulators of all the kernel's column sums stay within
    ACCUMULATOR_ELEMS_PER_THREAD values a thread (registers) and each program keeps
    MIN_ROW_BLOCKS_PER_PROGRAM iterations; `bytes_per_elem` sums the itemsizes of the
    kernel's full-size reads."""
    target = opts.partial_bytes_per_thread
    if target <= 0 or mp.form not in ("packed_rows", "row_persistent") or bytes_per_elem <= 0:
        return mp
    threads = 32 * mp.num_warps
    br = mp.block_r
    while True:
        per_thread = br * mp.block_c // threads
        if (per_thread * bytes_per_elem >= target or 2 * per_thread * max(accumulators, 1) >
                ACCUMULATOR_ELEMS_PER_THREAD or _partial_walk(rows, 2 * br, opts)[1] < MIN_ROW_BLOCKS_PER_PROGRAM):
            break
        br *= 2
    if br == mp.block_r:
        return mp
    grid, row_blocks = _partial_walk(rows, br, opts)
    return replace(mp, form="packed_rows", block_r=br, grid=grid, row_blocks=row_blocks)


# point-wise ops whose helper holds many float64 values per element (long unrolled series,
# float64 sin/cos): with the usual 8 elements a thread their kernels reach 240-255
# registers and spill on sm_90 (tools/aot_check; bench/NOTES.md, eighth session)
REGISTER_HEAVY = frozenset({"bessel_j0", "bessel_j1", "bessel_y0", "bessel_y1", "bessel_k0", "bessel_k1",
                            "bessel_k0e", "bessel_k1e", "airy_ai", "igamma", "igammac"})
HEAVY_ELEMS_PER_THREAD = 2


def spread_for_registers(mp: Mapping) -> Mapping:
    """The same blocks over more warps, so that each thread holds at most
    HEAVY_ELEMS_PER_THREAD elements (up to 16 warps): for kernels with REGISTER_HEAVY ops,
    compute-bound, where fewer registers a thread beat wider loads."""
    want = next_pow2(-(-mp.block_r * mp.block_c // (32 * HEAVY_ELEMS_PER_THREAD)))
    return replace(mp, num_warps=max(mp.num_warps, min(16, want)))


ROWS_TILE_MAX_ELEMS = 32   # warps_along_rows: values a thread may hold (vec rows x all the columns)


def warps_along_rows(mp: Mapping, vec: int) -> Mapping:
    """At most the warps that a tile's rows fill when each thread holds `vec` consecutive
    rows (a 16-byte vector along contiguous rows) and a warp's 32 lanes run down the
    rows: no warp left over to lie across the columns.  Only where a thread then holds
    at most ROWS_TILE_MAX_ELEMS values (4 columns in bfloat16, 8 in float32): wider
    tiles keep their warps (a [256, 16] bfloat16 tile in one warp is 128 values a
    thread)."""
    cap = max(1, mp.block_r // (32 * vec))
    if mp.num_warps <= cap or mp.block_c * vec > ROWS_TILE_MAX_ELEMS:
        return mp
    return replace(mp, num_warps=cap)


COMBINE_MIN_COLS = 8   # combine_mapping: the narrowest column tile (32 bytes of float32 partials a row)


def combine_mapping(rows: int, cols: int, opts: PlanOptions, warps: int = 16) -> Mapping:
    """The combine of column partials (rows = programs that wrote partials): narrow
    column tiles so several programs share the work, and tiles of partial rows so the
    rows are reduced in a few wide steps instead of a chain of dependent loads.
    `warps` < 16: the partial kernel's programs were given fewer warps
    (`column_lane_partials`): the tile shrinks alike, so a global launch of the two
    keeps the fewer warps.

    Knob `combine_spread`: narrower column tiles (down to COMBINE_MIN_COLS, one 32-byte
    sector of float32 partials a row) until the columns give programs for half the SMs: each program
    walks the partial rows in a chain of loads, so its latency, not the bytes, sets
    the time of these small kernels.  The H200 (2026-11-28, BERT-base training) ran
    the 3072-wide combine, 96 programs, in 2.3 µs, and the 768-wide ones, 24 programs
    of 32 columns over fewer bytes each, in 4.8-4.9 µs."""
    npc = next_pow2(cols)
    bc = min(npc, 32 if npc >= 512 else 128)   # (a function of the size bucket)
    # (static shapes only: a dynamic template's grids come from a few size expressions,
    # and a tile narrower than the bucket makes the combine's grid vary within it)
    while opts.combine_spread and not opts.fixed_row_blocks and bc > COMBINE_MIN_COLS \
            and npc // bc < opts.device.sms // 2:
        bc //= 2
    cap = max(1, opts.block_elems // bc)
    if warps < 16:   # (still 8 rows a step at least: not a chain of dependent loads)
        cap = max(min(8, cap), opts.block_elems * max(warps, 1) // 16 // bc)
    br = cap if opts.fixed_row_blocks else min(next_pow2(rows), cap)   # rows follow the sizes: not a block shape then
    return Mapping("combine", br, bc, _warps(br * bc), -(-cols // bc), column_lanes=warps < 16)


def one_per_thread(mp: Mapping) -> Mapping:
    """A flat mapping whose programs hold one element a thread (the block over 32 x
    warps, at most 512): every load and store of a warp is 32 consecutive elements,
    whatever Triton can prove about their alignment (`plan/access.py`, row runs)."""
    block = min(mp.block_r, 512)      # (16 warps: the cap of every other mapping)
    return replace(mp, block_r=block, num_warps=max(1, block // 32), grid=-(-mp.block_r * mp.grid // block))


TRANSPOSED_RUN_BYTES = 32   # a sector: the contiguous run a transposed read should get per column


def transposed_tile(domain: Domain, opts: PlanOptions, itemsize: int) -> Mapping:
    """Column partials over a domain read transposed (`plan/access.py`): row-looped
    programs of `TRANSPOSED_RUN_BYTES / itemsize` rows (8 in float32, 16 in bfloat16;
    fewer, down to 8, where that leaves under a program per SM; more, up to 32, where
    the grid would pass `partial_programs_per_sm` programs per SM), walking column blocks
    of `looped_partial_elems / rows` columns; each program stores one partial row per
    column block (the looped form's partials).  Where the columns fit one block, the
    tiles hold whole rows and each program walks row blocks (`_partial_walk`)."""
    rows, cols = domain.rows, domain.cols
    br = max(8, TRANSPOSED_RUN_BYTES // max(itemsize, 1))
    while br > 8 and -(-rows // br) < opts.device.sms:
        br //= 2
    # many rows: taller tiles (at most 32), so the partial buffer stays within the
    # looped form's programs per SM (`looped_rows`), as whole-row tiles keep theirs
    br = max(br, looped_rows(rows, opts))
    bc = min(next_pow2(cols), max(32, opts.looped_partial_elems // br))
    if bc >= cols and not opts.fixed_row_blocks:
        # the columns fit one block (channels-last batch-norm statistics over 64-512
        # channels): a tile of whole rows that walks row blocks, as `choose` maps column
        # partials, instead of a program per row block (ResNet-50's stem: 12544 programs,
        # a 6.4 MB partial buffer and a 26 µs combine)
        return Mapping("packed_rows", br, bc, _warps(br * bc), *_partial_walk(rows, br, opts))
    return Mapping("row_looped", br, bc, _warps(br * bc), -(-rows // br))


TRANSPOSE_RUN_BYTES = 128   # a cache line: the run each column (rows) or row (columns) of a tile reads
TRANSPOSE_TILE_ELEMS = 4096


def _line_rows(rows: int, itemsize: int, programs: int) -> int:
    """Rows of a tile read along its rows: a cache line's worth, halved down to a
    sector's while that leaves fewer than `programs` row blocks (few rows: more,
    shorter tiles)."""
    br = max(8, TRANSPOSE_RUN_BYTES // max(itemsize, 1))
    floor = max(8, TRANSPOSED_RUN_BYTES // max(itemsize, 1))
    while br > floor and -(-rows // br) < programs:
        br //= 2
    return br


def transpose_tile(domain: Domain, opts: PlanOptions, itemsize: int) -> Mapping:
    """A kernel without reductions whose accesses are contiguous along two different
    dims (a transpose; `plan/access.py::layout_domain`): tiles of a cache line's worth of
    rows (32 float32, 64 bfloat16) x columns, so that the reads along the rows and the
    stores along the columns each cover whole lines; Triton converts the tile between
    the two layouts through shared memory.  Whole rows where they fit the tile, else
    row-looped over column blocks."""
    rows, cols = domain.rows, domain.cols
    br = min(next_pow2(rows), _line_rows(rows, itemsize, 2 * opts.device.sms))
    bc = max(8, TRANSPOSE_TILE_ELEMS // br)
    if next_pow2(cols) <= bc:
        bc = next_pow2(cols)
        br = min(next_pow2(rows), max(br, TRANSPOSE_TILE_ELEMS // bc))
        return Mapping("packed_rows", br, bc, _warps(br * bc), -(-rows // br))
    return Mapping("row_looped", br, bc, _warps(br * bc), -(-rows // br))


def transposed_rows(domain: Domain, opts: PlanOptions, itemsize: int, few: bool = False) -> Mapping | None:
    """Row reductions over a domain read transposed (`plan/access.py`; a weight
    gradient summed over few tokens, reduced along the stride of its hidden size):
    row-looped programs of a cache line's worth of rows (32 float32, 64 bfloat16; fewer,
    down to a sector's, where that leaves under a program per SM), walking column blocks,
    so each column's run fills whole sectors (4 whole rows read 8 bytes of each 32-byte
    sector in bfloat16).  Where even sector-tall tiles leave under a program per SM: None
    (the rows keep their mapping), or with `few` the sector-tall tiles all the same, for
    the caller to price against the mapping it has (a small buffer read by few programs
    can beat every element's own sector)."""
    rows, cols = domain.rows, domain.cols
    br = _line_rows(rows, itemsize, opts.device.sms)
    if -(-rows // br) < opts.device.sms and not few:
        return None
    bc = max(32, TRANSPOSE_TILE_ELEMS // br)
    if next_pow2(cols) <= bc:
        bc = next_pow2(cols)
        return Mapping("packed_rows", br, bc, _warps(br * bc), -(-rows // br))
    return Mapping("row_looped", br, bc, _warps(br * bc), -(-rows // br))


TRANSPOSED_ROW_THREAD_ELEMS = 64   # transposed_row_warps: elements a thread holds


def transposed_row_warps(mp: Mapping, vec: int) -> int:
    """Warps of a whole-row tile whose rows are contiguous in memory and whose columns,
    the reduced axis, are strided: TRANSPOSED_ROW_THREAD_ELEMS elements a thread instead
    of `_warps`' 8.  Triton lays such a tile out along its rows, so each warp holds a
    slice of the columns and every row statistic is a shared-memory round trip across
    all the warps: a fixed cost a thread that more elements a thread amortise.  sm_90
    (Triton 3.6, `tools/aot_check`) of batch-norm chunk statistics at 56x56x256 (tiles
    of 32 channels x 128 chunk rows, three statistics): 16 warps issue 46.5 M
    warp-instructions, 8 warps 26.0 M, 4 warps 16.0 M, 2 warps 10.4 M (80 registers);
    64 elements a thread in taller tiles the same ~10 M, 128 a thread 7.2 M but 128
    registers.  Never fewer than the warps the rows fill side by side (`vec` elements a
    thread along them: no warp then crosses another's rows, `warps_along_rows`), and never
    more than `mp` has."""
    elems = mp.block_r * mp.block_c
    along = max(1, mp.block_r // (32 * vec))
    return min(mp.num_warps, max(along, elems // (32 * TRANSPOSED_ROW_THREAD_ELEMS), 1))


NARROW_WALK_MIN_WARPS = 4   # narrower_walk: never below this many warps a program


def narrower_walk(mp: Mapping, rows: int, cols: int, opts: PlanOptions) -> Mapping | None:
    """A walk over row blocks (column partials beside rows held on chip) at half its warps
    and half the rows a tile, so that a thread keeps the elements it had; the grid stays
    `_partial_programs`, so each program walks twice the blocks.  For `planner.
    _walk_prefetch`: two 16-warp programs an SM leave a thread 64 registers, too few to hold
    the next block's loads (sm_90: 82-93), two 8-warp programs leave it 128 (Triton 3.6,
    prefetched [2, 1024] tiles of layer/RMS norm backward: 64-95; ResNet-50's batch-norm
    walks 32-126).  None for one-row tiles, whose threads would hold twice the elements
    (layer_norm_bwd [1, 4096] float32 at 8 warps prefetched: 174 registers, one program an
    SM), rows narrower than the tile (Swin-T's norm backward over 96-384 columns in
    128-512 tiles: 149-204 registers for 12-15 members, against 64-109 for the
    power-of-two rows), column lanes, row segments, and tiles already of
    NARROW_WALK_MIN_WARPS warps."""
    if (mp.form != "packed_rows" or mp.block_r < 2 or mp.column_lanes or mp.segments > 1
            or cols != mp.block_c or mp.num_warps // 2 < NARROW_WALK_MIN_WARPS or opts.fixed_row_blocks):
        return None
    br = mp.block_r // 2
    grid, walk = _partial_walk(rows, br, opts)
    return replace(mp, form="packed_rows" if br > 1 else "row_persistent", block_r=br,
                   num_warps=mp.num_warps // 2, grid=grid, row_blocks=walk)


def fewer_walkers(mp: Mapping, rows: int, cols: int, opts: PlanOptions) -> Mapping | None:
    """A walk over row blocks at one program an SM, same tile, twice the blocks each: for a
    one-row 16-warp tile (`narrower_walk` has no half of it), whose thread may then hold
    128 registers instead of 64 (room for the next block's loads, `planner._walk_prefetch`).
    layer_norm_bwd [8192 x 4096] float32 at two 16-warp programs an SM took 82 registers on
    sm_90 (Triton 3.6): one program fit an SM, its 264-program grid ran in two rounds.
    Rows narrower than the tile: none (as `narrower_walk`)."""
    if (mp.form not in ("packed_rows", "row_persistent") or mp.column_lanes or mp.segments > 1
            or cols != mp.block_c or opts.fixed_row_blocks or mp.grid <= opts.device.sms):
        return None
    blocks = -(-rows // mp.block_r)
    grid = min(blocks, opts.device.sms)
    return replace(mp, grid=grid, row_blocks=-(-blocks // grid))


def _partial_walk(rows: int, block_r: int, opts: PlanOptions) -> tuple[int, int]:
    """(grid, row blocks each program walks) of a kernel with column partials over
    `rows` in blocks of `block_r`: at most `_partial_programs` programs, grid stride."""
    blocks = -(-rows // block_r)
    grid = min(blocks, _partial_programs(opts))
    return grid, -(-blocks // grid)


def _partial_programs(opts: PlanOptions) -> int:
    # a few programs per SM (knob, default 2) bound the partial buffer (and so the
    # combine's reads) to that many rows per SM
    return max(2, opts.partial_programs_per_sm * opts.device.sms)
