"""Micro (or, with `--suite models`, model) cases under knob variants, in one process, each variant into its own results
folder: for GPU sessions, where device time is short and every new process costs its
start (a mapping choice is then measured against the default in the same call).

    python -m stitchml.tools.bench_variants --out DIR \\
        --variant 'default::rms_norm_bwd[N=32768]' \\
        --variant 'elems8k:looped_partial_elems=8192:rms_norm_bwd[N=32768]'

A variant is NAME:KNOB=VALUE[,KNOB=VALUE...]:CASE[;CASE...] (knobs of config.py, parsed
as their environment variables are).  Each folder holds the bench's results.json/.md.
"""
from __future__ import annotations

import argparse
from pathlib import Path
from typing import Sequence

from .. import config


def parse_variant(spec: str) -> tuple[str, dict, tuple[str, ...]]:
    """(name, knob values, cases) of one --variant."""
    try:
        name, knobs, cases = spec.split(":", 2)
    except ValueError:
        raise SystemExit(f"--variant {spec!r}: expected NAME:KNOB=VALUE,...:CASE;CASE") from None
    values = {}
    for item in filter(None, knobs.split(",")):
        key, _, raw = item.partition("=")
        if key not in config.KNOBS:
            raise SystemExit(f"--variant {name}: unknown knob {key!r}")
        values[key] = config.KNOBS[key].parse(raw)
    return name, values, tuple(c for c in cases.split(";") if c)


def main(argv: Sequence[str] | None = None) -> int:
    from ..bench import BenchOptions, run_bench
    ap = argparse.ArgumentParser(prog="python -m stitchml.tools.bench_variants", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--variant", action="append", required=True)
    ap.add_argument("--dtype", default="bf16", choices=("fp32", "bf16", "both"))
    ap.add_argument("--contender", action="append", help="default: stitchml")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--suite", default="micro", choices=("micro", "models"))
    args = ap.parse_args(argv)
    for spec in args.variant:
        name, values, cases = parse_variant(spec)
        with config.override(**values):
            run = run_bench(BenchOptions(suites=(args.suite,), cases=cases, dtype=args.dtype, out=args.out / name,
                                         contenders=tuple(args.contender or ["stitchml"]), progress=False,
                                         plots=False, quick=args.quick))
        for r in run.results:
            t = (r.timing or {}).get("median_s")
            print(f"VARIANT {name} {r.case} {r.dtype} {r.contender} {r.status} "
                  f"{t * 1e6 if t else float('nan'):.1f} us {values}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
