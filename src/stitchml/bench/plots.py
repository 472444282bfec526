"""PNG figures (matplotlib, Agg backend: no display needed): per suite and dtype, the
speedup of every contender over eager per case, and the achieved bandwidth per case
against the copy bandwidth measured at the start of the run."""
from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .harness import BenchRun, CaseResult

COLORS = {"eager": "#7f7f7f", "inductor": "#1f77b4", "max-autotune": "#17becf", "stitchml": "#d62728",
          "jax": "#2ca02c"}


def _grouped_barh(ax, cases: list[str], series: dict[str, list[float]]) -> None:
    n = max(len(series), 1)
    height = 0.8 / n
    for i, (name, vals) in enumerate(series.items()):
        ys = [j + (i - (n - 1) / 2) * height for j in range(len(cases))]
        ax.barh(ys, [v if math.isfinite(v) else 0.0 for v in vals], height=height, label=name,
                color=COLORS.get(name))
    ax.set_yticks(range(len(cases)))
    ax.set_yticklabels(cases, fontsize=7)
    ax.invert_yaxis()
    ax.legend(fontsize=7, loc="lower right")


def _figure(n_cases: int):
    import matplotlib.pyplot as plt
    return plt.subplots(figsize=(9, max(2.5, 0.32 * n_cases + 1.2)))


def _caption(run: "BenchRun") -> str:
    env = run.environment
    where = env.get("gpu") or "CPU"
    warn = "" if env.get("timings_meaningful") else "  [CPU / Triton interpreter: NOT meaningful]"
    return f"{where}, {env.get('date_utc', '')[:10]}{warn}"


def write_plots(run: "BenchRun", out: Path) -> tuple[list[Path], str]:
    """Write the figures; returns (files, a note for results.md)."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return [], "plots skipped: matplotlib is not installed"
    from .report import speedups
    files: list[Path] = []
    copy_gbps = run.environment.get("copy_bandwidth", {}).get("bytes_per_s", 0.0) / 1e9
    results = run.all_results()
    sp = speedups(results)
    for suite in ("micro", "models", "simulator"):
        for dtype in ("fp32", "bf16"):
            rows: list[CaseResult] = [r for r in results if r.suite == suite and r.dtype == dtype]
            timed = [r for r in rows if r.status == "ok" and r.median_s]
            if not timed:
                continue
            cases = list(dict.fromkeys(r.case for r in timed))
            others = [c for c in dict.fromkeys(r.contender for r in timed) if c != "eager"]
            series = {c: [sp.get((case, dtype, c), float("nan")) for case in cases] for c in others}
            if any(math.isfinite(v) for vals in series.values() for v in vals):
                fig, ax = _figure(len(cases))
                _grouped_barh(ax, cases, series)
                finite = [v for vals in series.values() for v in vals if math.isfinite(v) and v > 0]
                if finite and max(finite) / min(finite) > 30:
                    ax.set_xscale("log")    # interpreter runs and launch-bound cases span decades
                ax.axvline(1.0, color="black", linewidth=0.8)
                ax.set_xlabel("speedup over eager (eager median / contender median)")
                ax.set_title(f"{suite} {dtype}: speedup vs eager\n{_caption(run)}", fontsize=9)
                fig.tight_layout()
                path = out / f"speedup_{suite}_{dtype}.png"
                fig.savefig(path, dpi=110)
                plt.close(fig)
                files.append(path)
            with_bw = [r for r in timed if r.gbps is not None]
            if with_bw:
                bw_cases = list(dict.fromkeys(r.case for r in with_bw))
                names = list(dict.fromkeys(r.contender for r in with_bw))
                by = {(r.case, r.contender): r.gbps for r in with_bw}
                series = {c: [by.get((case, c), float("nan")) for case in bw_cases] for c in names}
                fig, ax = _figure(len(bw_cases))
                _grouped_barh(ax, bw_cases, series)
                if copy_gbps:
                    ax.axvline(copy_gbps, color="black", linestyle="--", linewidth=1.0,
                               label=f"measured copy {copy_gbps:.0f} GB/s")
                    ax.legend(fontsize=7, loc="lower right")
                ax.set_xlabel("achieved GB/s (byte floor / median time)")
                ax.set_title(f"{suite} {dtype}: achieved bandwidth vs measured ceiling\n{_caption(run)}", fontsize=9)
                fig.tight_layout()
                path = out / f"bandwidth_{suite}_{dtype}.png"
                fig.savefig(path, dpi=110)
                plt.close(fig)
                files.append(path)
    return files, "" if files else "no plots: no case was timed successfully"
