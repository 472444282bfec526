"""Writing results: results.json (every sample, the environment, every failure with
its reason and traceback) and results.md (one table per suite, then the failures)."""
from __future__ import annotations

import json
import math
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .harness import BenchRun, CaseResult

SCHEMA = 1


def _clean(v: Any) -> Any:
    """JSON has no inf/nan: write them as strings."""
    if isinstance(v, float) and not math.isfinite(v):
        return str(v)
    if isinstance(v, dict):
        return {k: _clean(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_clean(x) for x in v]
    return v


def to_json(run: "BenchRun") -> dict[str, Any]:
    return _clean({
        "schema": SCHEMA,
        "complete": run.complete,
        "elapsed_s": run.elapsed_s,
        "environment": run.environment,
        "earlier_environments": run.earlier_environments,
        "options": run.options,
        "results": [asdict(r) for r in run.all_results()],
        "time_to_target": run.all_time_to_target(),
    })


def write_json(run: "BenchRun", path: Path) -> Path:
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(to_json(run), indent=1))
    tmp.replace(path)   # atomic: a crash never leaves half a file
    return path


# --------------------------------------------------------------------------- markdown

def fmt_time(s: float | None) -> str:
    if s is None or not math.isfinite(s):
        return "—"
    if s < 1e-3:
        return f"{s * 1e6:.1f} µs"
    if s < 1.0:
        return f"{s * 1e3:.2f} ms"
    return f"{s:.2f} s"


def _fmt_bytes(b: int | None) -> str:
    if b is None:
        return "n/a"
    return f"{b / 2**20:.1f} MiB"


def _status(r: "CaseResult") -> str:
    if r.status == "ok":
        return "ok"
    reason = r.reason.replace("|", "/").replace("\n", " ")
    return f"**{r.status}**: {reason[:90]}{'…' if len(reason) > 90 else ''}" if r.status == "FAILED" \
        else f"{r.status}: {reason[:70]}{'…' if len(reason) > 70 else ''}"


def speedups(results: list["CaseResult"]) -> dict[tuple[str, str, str], float]:
    """(case, dtype, contender) -> eager median / contender median, for timed results."""
    eager = {(r.case, r.dtype): r.median_s for r in results if r.contender == "eager" and r.median_s}
    out = {}
    for r in results:
        base = eager.get((r.case, r.dtype))
        if base and r.median_s:
            out[(r.case, r.dtype, r.contender)] = base / r.median_s
    return out


def _dev(r: "CaseResult") -> str:
    """Device (kernel) time per call from the profiler, or —."""
    d = r.device_time or {}
    return fmt_time(d.get("median_s"))


def _graph_mark(r: "CaseResult") -> str:
    method = (r.timing or {}).get("method", "")
    return " (g)" if "graph" in method else ""


def _suite_table(results: list["CaseResult"]) -> list[str]:
    sp = speedups(results)
    lines = ["| case | dtype | contender | median | IQR | device time | × eager | GB/s | % copy BW | launches/call | "
             "cold call | warm call | peak mem | status |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        t = r.timing or {}
        launches = "n/a" if r.launches is None else str(r.launches)
        if r.eager_ops:
            launches += f" (+{r.eager_ops} eager ops)"
        if r.device_ops_profiled is not None:
            launches += f" [profiler: {r.device_ops_profiled}]"
        x = sp.get((r.case, r.dtype, r.contender))
        lines.append(" | ".join([
            f"| {r.case}", r.dtype, r.contender, fmt_time(t.get("median_s")) + _graph_mark(r),
            fmt_time(t.get("iqr_s")), _dev(r), f"{x:.2f}" if x else "—",
            f"{r.gbps:.1f}" if r.gbps is not None else "—",
            f"{r.pct_of_copy_bw:.1f}" if r.pct_of_copy_bw is not None else "—",
            launches, fmt_time(r.cold_s), fmt_time(r.warm_s), _fmt_bytes(r.peak_mem_bytes), _status(r) + " |"]))
    return lines


def _split(r: "CaseResult") -> str:
    st = (r.compile or {}).get("stitch")
    if not st:
        return "—"
    parts = [f"{k} {fmt_time(st.get(k + '_s'))}" for k in ("lower", "plan", "codegen", "triton", "load")
             if st.get(k + "_s") is not None]
    if not parts:
        parts = [f"compile {fmt_time(st.get('compile_s'))}"]
    other = (r.compile or {}).get("other_s")
    hits = f", {st['plan_cache_hits']} plan-cache hits" if st.get("plan_cache_hits") else ""
    return ", ".join(parts) + (f"; other {fmt_time(other)}" if other is not None else "") + \
        f" ({st.get('graphs')} graphs, {st.get('kernels')} kernels{hits})"


def _warm_cache(r: "CaseResult") -> str:
    wc = (r.compile or {}).get("warm_cache")
    if not wc:
        return "—"
    if "error" in wc:
        return "error: " + str(wc["error"]).replace("|", "/")[:60]
    st = wc.get("stitch") or {}
    hits = f", {st['plan_cache_hits']}/{st.get('graphs')} plan-cache hits" if st.get("plan_cache_hits") else ""
    extra = f" (stitch compile {fmt_time(st.get('compile_s'))}{hits})" if st else ""
    return fmt_time(wc.get("first_call_s")) + extra


def _models_table(results: list["CaseResult"]) -> list[str]:
    """Where a training/inference step's time goes, per contender: wall (CUDA events),
    GPU-busy (profiler kernel time), host time to issue the step, launches, and compile."""
    sp = speedups(results)
    lines = ["| case | dtype | contender | wall median | IQR | × eager | GPU busy | busy % | host/step | "
             "launches/step | cold call (empty caches) | warm cache, fresh process | stitch compile split | "
             "peak mem | status |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        t, h = r.timing or {}, r.host_time or {}
        x = sp.get((r.case, r.dtype, r.contender))
        dev = r.device_time or {}
        launches = dev.get("kernels_per_step", r.launches)
        lines.append(" | ".join([
            f"| {r.case}", r.dtype, r.contender, fmt_time(t.get("median_s")), fmt_time(t.get("iqr_s")),
            f"{x:.2f}" if x else "—", fmt_time(dev.get("median_s")),
            f"{100 * r.busy_fraction:.0f}%" if r.busy_fraction is not None else "—",
            fmt_time(h.get("median_s")), "n/a" if launches is None else str(launches),
            fmt_time((r.compile or {}).get("cold_s", r.cold_s)), _warm_cache(r), _split(r),
            _fmt_bytes(r.peak_mem_bytes), _status(r) + " |"]))
    return lines


def _ttt_table(rows: list[dict[str, Any]]) -> list[str]:
    lines = ["| contender | target loss | steps to target | wall to target (median) | IQR | runs | compile (first "
             "call) | final loss | status |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        final = next((x.get("final_loss") for x in reversed(r.get("runs", [])) if x.get("final_loss") is not None),
                     None)
        status = "ok" if r["status"] == "ok" else f"**{r['status']}**: {r['reason'][:90]}"
        lines.append(" | ".join([
            f"| {r['contender']}", f"{r['target']:g}", str(r.get("steps_to_target", "—")),
            fmt_time(r.get("wall_s_median")), fmt_time(r.get("wall_s_iqr")), str(len(r.get("runs", []))),
            fmt_time(r.get("compile_s_median")), f"{final:.4f}" if final is not None else "—", status + " |"]))
    return lines


def _env_lines(env: dict[str, Any]) -> list[str]:
    bw = env.get("copy_bandwidth", {})
    dev = env.get("gpu") or f"CPU: {env.get('cpu')} ({env.get('cpu_count')} cores)"
    lines = [
        f"- date (UTC): {env.get('date_utc')}",
        f"- device: {dev}" + (f", driver {env.get('driver')}, CUDA {env.get('torch_cuda')}, "
                              f"{env.get('sms')} SMs" if env.get("gpu") else ""),
        f"- torch {env.get('torch')}, triton {env.get('triton')}, jax {env.get('jax')}, "
        f"transformers {env.get('transformers')}, python {env.get('python')}",
        f"- stitchml {env.get('stitchml')} at {env.get('git_commit')}",
        f"- measured copy bandwidth: **{bw.get('bytes_per_s', float('nan')) / 1e9:.1f} GB/s** "
        f"({bw.get('counts')}; {bw.get('method')}); cost-model table: "
        f"{env.get('stitchml_cost_model_device', {}).get('name')} "
        f"{env.get('stitchml_cost_model_device', {}).get('bandwidth', 0) / 1e9:.0f} GB/s",
    ]
    if not env.get("timings_meaningful"):
        lines.append("- **WARNING: no GPU. Kernels ran under the Triton interpreter (TRITON_INTERPRET=1) on the "
                     "CPU. These timings are NOT meaningful: this run checks that the harness and the contenders "
                     "work, nothing about speed.**")
    return lines


def to_markdown(run: "BenchRun", plot_files: list[Path], plot_note: str) -> str:
    opts = run.options
    lines = ["# stitchml benchmark results", ""]
    lines += _env_lines(run.environment)
    lines += [f"- options: suites {opts.get('suites')}, dtypes {opts.get('dtypes')}, reps {opts.get('reps')}, "
              f"quick {opts.get('quick')}, contenders {opts.get('contenders')}",
              f"- elapsed {run.elapsed_s:.0f} s{'' if run.complete else ' (INCOMPLETE: the run stopped early)'}",
              *([f"- resumed (--resume) from earlier runs on the same device: "
                 f"{', '.join(e.get('date_utc', '?') for e in run.earlier_environments)}; each row's "
                 "run_date in results.json says which run measured it"] if run.earlier_environments else []),
              "",
              "Median and IQR over reps (GPU: CUDA events, L2 flushed before each rep; CUDA-graph replay below "
              "10 µs). GB/s and % copy BW use the case's byte floor (inputs read once, outputs written once) "
              "against the copy bandwidth measured above. launches/call: stitchml from its plans (+ the eager "
              "ops between kernels; [profiler: device activities counted on a GPU]); others from the profiler on "
              "a GPU, else n/a. cold call = the first call, "
              "compile included. peak mem = allocation peak of one call above what was allocated before it.",
              ""]
    results, ttt = run.all_results(), run.all_time_to_target()
    for suite in ("micro", "models", "simulator"):
        rows = [r for r in results if r.suite == suite]
        if rows and suite == "models":
            lines += [f"## {suite}", "",
                      "wall = CUDA events around the step, no CUDA graph of the harness's (host overhead counted); "
                      "GPU busy = sum of device-activity durations per step (torch.profiler); busy % = busy / wall "
                      "(far below 100%: the host is the bottleneck); host/step = from a synchronised start to the "
                      "call's return; launches/step = device activities (kernels) the profiler saw, else the plan's "
                      "count; cold call with empty compile caches; warm cache = first call of a fresh process that "
                      "shares the cold call's caches.", ""] + _models_table(rows) + [""]
        elif rows:
            lines += [f"## {suite}", "",
                      "(g) = replayed from a CUDA graph (micro forward+backward rows: every contender); device time "
                      "= kernel time per call from the profiler (GPU only).", ""] + _suite_table(rows) + [""]
    if ttt:
        lines += ["## time_to_target", "",
                  "Steps and training wall time until the training loss reaches the target (the compile, in the "
                  "first-batch correctness check, is excluded and shown separately).", ""]
        lines += _ttt_table(ttt) + [""]
    failed = [r for r in results if r.status == "FAILED"]
    failed_ttt = [r for r in ttt if r["status"] == "FAILED"]
    lines += ["## failures", ""]
    if not failed and not failed_ttt:
        lines.append("none")
    for r in failed:
        lines.append(f"- `{r.case}` {r.dtype} **{r.contender}**: {r.reason}")
    for r in failed_ttt:
        lines.append(f"- time_to_target **{r['contender']}**: {r['reason']}")
    lines += ["", "## plots", ""]
    if plot_note:
        lines.append(plot_note)
    for p in plot_files:
        lines.append(f"![{p.stem}]({p.name})")
    return "\n".join(lines) + "\n"


def write_all(run: "BenchRun", out: Path, *, plots: bool = True) -> list[Path]:
    from . import plots as plotting
    files = [write_json(run, out / "results.json")]
    pngs, note = (plotting.write_plots(run, out) if plots else ([], "plots disabled (--no-plots)"))
    md = out / "results.md"
    md.write_text(to_markdown(run, pngs, note))
    return files + [md] + pngs
