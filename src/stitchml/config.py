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


KNOBS: dict[str, Knob] = {k.name: k for k in [
    Knob("pointwise_block", "STITCHML_POINTWISE_BLOCK", 1024, int,
         "Elements per program in flat point-wise kernels (power of two)."),
    Knob("persistent_max_cols", "STITCHML_PERSISTENT_MAX_COLS", 8192, int,
         "Longest row (elements, rounded up to a power of two) kept whole on chip; longer rows loop."),
    Knob("loop_block_cols", "STITCHML_LOOP_BLOCK_COLS", 2048, int,
         "Columns per iteration in row-looped kernels."),
    Knob("block_elems", "STITCHML_BLOCK_ELEMS", 4096, int,
         "Target elements per program for row kernels; short rows are packed up to this many."),
    Knob("split_min_cols", "STITCHML_SPLIT_MIN_COLS", 1024, int,
         "Task splitting: rows split into chunks of at least this many elements, only when there are fewer "
         "rows than two programs per SM (AStitch's rule: split when rows < programs per wave and a row "
         "has > 1024 elements). Not yet tuned on a GPU."),
    Knob("fallback_on_error", "STITCHML_FALLBACK_ON_ERROR", True, _bool,
         "If planning or code generation fails, run the graph eagerly with a warning instead of raising."),
    Knob("debug_dir", "STITCHML_DEBUG_DIR", "", str,
         "If set, write every generated kernel and wrapper source here."),
    Knob("cache_dir", "STITCHML_CACHE_DIR", str(Path.home() / ".cache" / "stitchml"), str,
         "Where generated kernel modules are written (Triton needs them on disk)."),
    Knob("poison_outputs", "STITCHML_POISON_OUTPUTS", False, _bool,
         "Fill kernel outputs with NaN (max int for integers) before launching, so elements a kernel "
         "fails to write show up. For testing; costs a fill per output."),
    Knob("global_barriers", "STITCHML_GLOBAL_BARRIERS", True, _bool,
         "Allow the global scheme: dependent kernels as phases of one persistent launch with grid "
         "barriers. Off = the phase-split twin (one launch per phase)."),
    Knob("horizontal_fusion", "STITCHML_HORIZONTAL_FUSION", True, _bool,
         "Launch independent, launch-bound kernels together (dispatch on program-id ranges)."),
    Knob("ilp", "STITCHML_ILP", True, _bool,
         "Choose launch-level stitching (global / horizontal / separate) by ILP (scipy HiGHS); off = rules."),
    Knob("ilp_time_limit", "STITCHML_ILP_TIME_LIMIT", 0.5, float,
         "Seconds HiGHS may spend per region before the rule-based choice is kept."),
    Knob("cuda_graphs", "STITCHML_CUDA_GRAPHS", False, _bool,
         "Capture each compiled inference graph in a CUDA graph and replay it (cuts host launch overhead "
         "for small batches). CUDA only; refused, with a message, on CPU or when kernels draw random numbers."),
    Knob("device", "STITCHML_DEVICE", "", str,
         "Device the cost model predicts for (H100, H200, A100, cpu); empty = the visible GPU, else cpu."),
    Knob("verbose", "STITCHML_VERBOSE", False, _bool,
         "Log each compiled graph's plan summary."),
]}

_overrides: list[dict[str, Any]] = []


def get(name: str) -> Any:
    knob = KNOBS[name]
    for layer in reversed(_overrides):
        if name in layer:
            return layer[name]
    raw = os.environ.get(knob.env)
    return knob.default if raw is None else knob.parse(raw)


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
