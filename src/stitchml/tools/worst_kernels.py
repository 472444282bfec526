"""The stitched kernels that lost most time against the cost model's prediction in a
bench run: per kernel (profiler name `k_<hash>`), measured minus predicted device time
per call, summed over a case's launches, largest first.

    python -m stitchml.tools.worst_kernels RESULTS.json [--top 8] [--regex]

`--regex` prints one `name|name|...` for Nsight Compute's `-k regex:` (what
`tools/gpu_run.sh ncu` profiles: kernel names are content hashes, so they are read
from the measurement rather than typed in).  Why: on the H200 (2026-11-27) column-partial
kernels at 2048-4096 rows and one horizontal group took 30-150 µs a launch against
4-8 µs predicted (bench/NOTES.md).
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any


def worst(results: dict[str, Any], top: int = 8, contender: str = "stitchml") -> list[dict[str, Any]]:
    """Rows {case, name, class, launches, measured_us, predicted_us, lost_us} of the
    stitched kernels of `contender`'s rows, by lost time (measured - predicted device
    time, all launches of a call), largest first; each name once (its worst case)."""
    rows: dict[str, dict[str, Any]] = {}
    for r in results.get("results", []):
        if r.get("contender") != contender or not r.get("kernel_times"):
            continue
        for k in r["kernel_times"].get("rows", []):
            name, measured = k.get("profiler_name"), k.get("measured_s")
            if not name or not measured or str(k.get("class", "")).startswith("library"):
                continue
            lost = measured - k.get("predicted_device_s", 0.0)
            row = {"case": r["case"], "name": name, "class": k.get("class"), "launches": k.get("measured_launches"),
                   "measured_us": measured * 1e6, "predicted_us": k.get("predicted_device_s", 0.0) * 1e6,
                   "lost_us": lost * 1e6}
            if name not in rows or rows[name]["lost_us"] < row["lost_us"]:
                rows[name] = row
    return sorted(rows.values(), key=lambda x: -x["lost_us"])[:top]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m stitchml.tools.worst_kernels", description=__doc__.split("\n\n")[0])
    ap.add_argument("results", type=Path, help="a bench results.json")
    ap.add_argument("--top", type=int, default=8)
    ap.add_argument("--contender", default="stitchml")
    ap.add_argument("--regex", action="store_true", help="print name|name|... for ncu -k regex:")
    a = ap.parse_args(argv)
    rows = worst(json.loads(a.results.read_text()), a.top, a.contender)
    if a.regex:
        print("|".join(r["name"] for r in rows))
        return 0 if rows else 1
    for r in rows:
        print(f"{r['lost_us']:9.1f} µs lost  {r['measured_us']:9.1f} measured  {r['predicted_us']:8.1f} predicted  "
              f"x{r['launches']}  {r['class']:12s} {r['name']}  {r['case']}")
    return 0 if rows else 1


if __name__ == "__main__":
    raise SystemExit(main())
