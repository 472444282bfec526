"""`stitchml bench`: the benchmark harness (issue 5).

Modules, one job each:

    workload.py     what a case is (inputs, function, byte floor, how to check it)
    compare.py      correctness against eager, before any timing
    timing.py       CUDA-event / perf_counter timing, statistics, peak memory
    contenders.py   eager, Inductor, Inductor max-autotune, stitchml, JAX/XLA
    harness.py      run cases x contenders, collect results, drive the progress bar
    micro.py, models.py, simulator.py, time_to_target.py   the four suites
    environment.py  GPU/CPU, driver, versions, measured copy bandwidth
    report.py       results.json and results.md;  plots.py   PNG figures

Entry points: `stitchml bench ...` (cli.py) and `run_bench(BenchOptions(...))`.
"""
from __future__ import annotations

from .harness import BenchOptions, BenchRun, run_bench

__all__ = ["BenchOptions", "BenchRun", "run_bench"]
