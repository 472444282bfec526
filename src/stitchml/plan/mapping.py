"""Thread mapping: which kernel form and block shape cover a domain.

Rules (thresholds are knobs in config.py; defaults are the AStitch paper's guidance
and Triton's usual register budget until measured on a GPU):
- no column axis → flat point-wise, `pointwise_block` elements per program;
- rows that fit on chip (next pow2 ≤ `persistent_max_cols`) → whole row per program;
  short rows are packed (horizontal packing) until a program holds `block_elems`;
- longer rows → one row per program, looping over `loop_block_cols` columns.
Under dynamic shapes (`fixed_row_blocks`, entered by the dynamic runner) the row and
flat blocks take their cap instead of next_pow2 of the row count, so the mapping of a
kernel changes only with its column extent: the power-of-two size buckets of
`dynamic/shapes.py::bucket_of`.
"""
from __future__ import annotations

import contextlib
from typing import Iterator

from .. import config
from .data import Domain, Mapping


def next_pow2(n: int) -> int:
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


def _warps(elems: int) -> int:
    return max(1, min(16, next_pow2(max(elems // 256, 1))))


_FIXED_ROW_BLOCKS: list[bool] = []


@contextlib.contextmanager
def fixed_row_blocks() -> Iterator[None]:
    """Dynamic shapes: the row (and flat) block takes its largest size instead of the
    next power of two of the row count, so one bucket's kernels do not change with a
    row count that is a multiple of a size (3*s rows span two powers of two within a
    bucket of s).  Columns keep next_pow2: they define the bucket."""
    _FIXED_ROW_BLOCKS.append(True)
    try:
        yield
    finally:
        _FIXED_ROW_BLOCKS.pop()


def choose(domain: Domain, partials: bool = False) -> Mapping:
    fixed = bool(_FIXED_ROW_BLOCKS)
    if domain.is_flat:
        n = domain.rows
        block = config.get("pointwise_block") if fixed else min(config.get("pointwise_block"), next_pow2(n))
        return Mapping("pointwise", block, 1, _warps(block), -(-n // block))
    rows, cols = domain.rows, domain.cols
    bc = next_pow2(cols)
    if bc <= config.get("persistent_max_cols"):
        cap = config.get("block_elems") // bc
        br = max(1, cap if fixed else min(next_pow2(rows), cap))
        form = "packed_rows" if br > 1 else "row_persistent"
        blocks = -(-rows // br)
        if not partials:
            return Mapping(form, br, bc, _warps(br * bc), blocks)
        # column partials: each program walks several row blocks (grid-stride) so the
        # partial buffer (programs x cols) stays small; a few waves of programs suffice
        grid = min(blocks, _partial_programs())
        return Mapping(form, br, bc, _warps(br * bc), grid, -(-blocks // grid))
    bc = config.get("loop_block_cols")
    return Mapping("row_looped", 1, bc, _warps(bc), rows)


def combine_mapping(rows: int, cols: int) -> Mapping:
    """The combine of column partials (rows = programs that wrote partials): narrow
    column tiles so several programs share the work, and tiles of partial rows so the
    rows are reduced in a few wide steps instead of a chain of dependent loads."""
    bc = min(next_pow2(cols), 32 if next_pow2(cols) >= 512 else 128)   # (a function of the size bucket)
    cap = max(1, config.get("block_elems") // bc)
    br = cap if _FIXED_ROW_BLOCKS else min(next_pow2(rows), cap)   # rows follow the sizes: not a block shape then
    return Mapping("combine", br, bc, _warps(br * bc), -(-cols // bc))


def _partial_programs() -> int:
    # two programs per SM keep DRAM busy while bounding the partial buffer (and so the
    # combine's reads) to 2*SMs rows
    from .devices import current_device
    return max(2, 2 * current_device().sms)
