"""Writing results: results.json (every sample, the environment, every failure with
its reason and traceback) and results.md (one table per suite, then the failures)."""
from __future__ import annotations

import json
import math
import statistics
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


def _predicted(r: "CaseResult") -> str:
    return fmt_time(r.predicted_s) if r.predicted_s is not None else "—"


def _ratio(r: "CaseResult") -> str:
    """measured median / predicted; n/m where the timing is not meaningful (CPU)."""
    t = r.timing or {}
    if not r.predicted_s or not t.get("median_s"):
        return "—"
    if not t.get("meaningful", False):
        return "n/m"
    return f"{t['median_s'] / r.predicted_s:.2f}"


def _suite_table(results: list["CaseResult"]) -> list[str]:
    sp = speedups(results)
    lines = ["| case | dtype | contender | median | IQR | predicted | meas./pred. | device time | × eager | GB/s | "
             "% copy BW | launches/call | cold call | warm call | peak mem | status |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
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
            fmt_time(t.get("iqr_s")), _predicted(r), _ratio(r), _dev(r), f"{x:.2f}" if x else "—",
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
    pc = (f", plan cache {fmt_time(st['plan_cache_s'])}, lower+plan+codegen {fmt_time(st.get('plan_codegen_s'))}"
          if st.get("plan_cache_s") is not None else "")
    extra = f" (stitch compile {fmt_time(st.get('compile_s'))}{pc}{hits})" if st else ""
    return fmt_time(wc.get("first_call_s")) + extra


def _models_table(results: list["CaseResult"]) -> list[str]:
    """Where a training/inference step's time goes, per contender: wall (CUDA events),
    GPU-busy (profiler kernel time), host time to issue the step, launches, and compile."""
    sp = speedups(results)
    lines = ["| case | dtype | contender | wall median | IQR | predicted | meas./pred. | × eager | GPU busy | "
             "busy % | host/step | launches/step | cold call (empty caches) | warm cache, fresh process | stitch plan cache | "
             "stitch lower+plan+codegen | stitch compile split | peak mem | status |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        t, h = r.timing or {}, r.host_time or {}
        x = sp.get((r.case, r.dtype, r.contender))
        dev = r.device_time or {}
        launches = dev.get("kernels_per_step", r.launches)
        st = (r.compile or {}).get("stitch") or {}
        lines.append(" | ".join([
            f"| {r.case}", r.dtype, r.contender, fmt_time(t.get("median_s")), fmt_time(t.get("iqr_s")),
            _predicted(r), _ratio(r), f"{x:.2f}" if x else "—", fmt_time(dev.get("median_s")),
            f"{100 * r.busy_fraction:.0f}%" if r.busy_fraction is not None else "—",
            fmt_time(h.get("median_s")), "n/a" if launches is None else str(launches),
            fmt_time((r.compile or {}).get("cold_s", r.cold_s)), _warm_cache(r), fmt_time(st.get("plan_cache_s")),
            fmt_time(st.get("plan_codegen_s")), _split(r), _fmt_bytes(r.peak_mem_bytes), _status(r) + " |"]))
    return lines


# --------------------------------------------------------------------------- checked predictions (issue 17.4)

KERNEL_CLASSES = ("pointwise", "row_persistent", "packed_rows", "row_looped", "combine", "global", "horizontal")
NOT_MEASURED = "no GPU: not measured"


def _ape(predicted: float, measured: float) -> float:
    return 100.0 * abs(predicted - measured) / measured


def kernel_class_errors(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per kernel class (the mapping form, or a launch group's kind), from per-kernel
    rows {class, predicted_s, predicted_device_s, measured_s, launches}: how many rows
    were measured, their launches, the mean absolute % error of the prediction against
    the profiler's time (|predicted - measured| / measured), the same without the launch
    term, and the median signed error (+: the model predicts too slow).  Rows with no
    measurement count as `unmatched`.  Classes in KERNEL_CLASSES order, others after."""
    by: dict[str, dict[str, Any]] = {}
    for r in rows:
        c = by.setdefault(r["class"], {"class": r["class"], "n": 0, "launches": 0, "unmatched": 0, "_ape": [],
                                       "_dev": [], "_signed": []})
        m = r.get("measured_s")
        if not m or m <= 0:
            c["unmatched"] += 1
            continue
        c["n"] += 1
        c["launches"] += int(r.get("launches") or 0)
        c["_ape"].append(_ape(r["predicted_s"], m))
        c["_dev"].append(_ape(r.get("predicted_device_s", r["predicted_s"]), m))
        c["_signed"].append(100.0 * (r["predicted_s"] - m) / m)
    out = []
    order = {k: i for i, k in enumerate(KERNEL_CLASSES)}
    for c in sorted(by.values(), key=lambda c: (order.get(c["class"], len(order)), c["class"])):
        ape, dev, signed = c.pop("_ape"), c.pop("_dev"), c.pop("_signed")
        c["mape_pct"] = sum(ape) / len(ape) if ape else None
        c["device_mape_pct"] = sum(dev) / len(dev) if dev else None
        c["median_signed_pct"] = statistics.median(signed) if signed else None
        out.append(c)
    return out


def _kernel_rows(results: list["CaseResult"]) -> list[dict[str, Any]]:
    """Per-kernel rows of stitchml's rows, one contender per (suite, case, dtype): the
    kernels of `stitchml` and `stitchml-nograph` are the same, counting both would
    weigh them twice."""
    chosen: dict[tuple[str, str, str], "CaseResult"] = {}
    for r in results:
        if r.kernel_times is None or r.status != "ok":
            continue
        key = (r.suite, r.case, r.dtype)
        if key not in chosen or r.contender == "stitchml":
            chosen[key] = r
    return [dict(k, case=r.case, dtype=r.dtype) for r in chosen.values() for k in r.kernel_times.get("rows", [])]


def _pct(v: float | None) -> str:
    return "—" if v is None else f"{v:.1f}%"


def prediction_lines(results: list["CaseResult"]) -> list[str]:
    """The results.md section: where stitchml's predictions come from, the step-level
    ratio per suite, and the per-kernel-class error table (GPU), or why it is empty."""
    rows = [r for r in results if r.prediction is not None]
    if not rows:
        return []
    sources = sorted({f"{r.prediction.get('device')} ({r.prediction.get('figures')})" for r in rows})
    lines = ["## prediction check (cost model vs measured)", "",
             f"predicted = the cost model's time for one call: the sum over the graphs the call runs (forward and "
             f"backward for a training step) of the plan's predicted time, on {', '.join(sources)}: the stitched "
             "kernels with their launches, and the library calls between them (matrix products, attention, "
             "convolutions, other eager ops: `plan/library_cost.py`). It is device time: a step whose host "
             "launches slower than the GPU runs (no CUDA graphs) measures above it. Graphs that ran eagerly and "
             "ops with no price are not in it (results.json: `prediction.unpriced`). meas./pred. = measured "
             "median / predicted (n/m: CPU timings are not meaningful).",
             ""]
    ratios: dict[str, list[float]] = {}
    for r in rows:
        t = r.timing or {}
        if r.status == "ok" and r.predicted_s and t.get("median_s") and t.get("meaningful"):
            ratios.setdefault(r.suite, []).append(t["median_s"] / r.predicted_s)
    for suite, vals in sorted(ratios.items()):
        lines.append(f"- {suite}: measured/predicted median {statistics.median(vals):.2f} over {len(vals)} rows "
                     f"(min {min(vals):.2f}, max {max(vals):.2f})")
    kernel_rows = _kernel_rows(results)
    measured = [k for k in kernel_rows if k.get("measured_s")]
    lines += ([""] if ratios else []) + ["### per kernel class", "",
              "Per stitchml kernel: predicted time (cost model, launch term included) against the profiler's device "
              "time, matched by the name the kernel runs under (`k_<hash of its body>`: kernels equal up to their "
              "name, e.g. the same kernel in every layer, share one name and are one entry, their predictions "
              "summed). Class = mapping form, or the launch group's kind (global, horizontal); `library:<kind>` = "
              "the library calls of that kind in a step (predicted by `plan/library_cost.py`) against the profiler's "
              "library kernels of that kind (by name: cuBLAS/CUTLASS products, attention, convolutions, other "
              "ATen kernels). error = |predicted - "
              "measured| / measured; 'w/o launch' leaves out the model's per-launch term, which a kernel's device "
              "duration does not contain; signed: + = predicted slower than measured.", ""]
    if not measured:
        note = NOT_MEASURED if not any((r.kernel_times or {}).get("measured") for r in rows) else \
            "GPU run, but no stitchml kernel name was matched in the profiler's trace (see results.json)"
        by_class: dict[str, int] = {}
        for k in kernel_rows:
            by_class[k["class"]] = by_class.get(k["class"], 0) + 1
        lines.append(f"**{note}** (predicted kernels per class: "
                     + (", ".join(f"{c} {n}" for c, n in sorted(by_class.items())) or "none") + ")")
        return lines + [""]
    lines += ["| class | kernels measured | launches | mean abs % error | mean abs % error w/o launch | "
              "median signed % | not matched |", "|---|---|---|---|---|---|---|"]
    for c in kernel_class_errors(kernel_rows):
        lines.append(f"| {c['class']} | {c['n']} | {c['launches']} | {_pct(c['mape_pct'])} | "
                     f"{_pct(c['device_mape_pct'])} | {_pct(c['median_signed_pct'])} | {c['unmatched']} |")
    unmatched = [k for k in kernel_rows if not k.get("measured_s")]
    if unmatched:
        lines += ["", f"{len(unmatched)} kernel(s) could not be matched to a profiler name:"]
        lines += [f"- `{k['case']}` {k['dtype']} {', '.join(k['kernels'])}: {k['note']}" for k in unmatched[:20]]
        if len(unmatched) > 20:
            lines.append(f"- ... {len(unmatched) - 20} more in results.json")
    stray = [(r.case, r.dtype, u) for r in results if r.kernel_times for u in r.kernel_times.get("unmatched", [])]
    if stray:
        lines += ["", "Profiler kernels named like stitchml's that no planned kernel has (not in the table):"]
        lines += [f"- `{case}` {dtype} {u['profiler_name']}: {fmt_time(u['measured_s'])}"
                  for case, dtype, u in stray[:20]]
    return lines + [""]


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
                      "shares the cold call's caches; predicted, meas./pred.: stitchml's cost model (section "
                      "'prediction check'); stitch plan cache = plan-cache key, lookup and store; stitch "
                      "lower+plan+codegen = lowering + plan cache + planning + code generation (the figure issue 14 "
                      "bounds), summed over the graphs of the cold call.", ""] + _models_table(rows) + [""]
        elif rows:
            lines += [f"## {suite}", "",
                      "(g) = replayed from a CUDA graph (micro rows: every contender); device time "
                      "= kernel time per call from the profiler (GPU only); predicted, meas./pred.: stitchml's cost "
                      "model (section 'prediction check'); for a row replayed from a CUDA graph each stitched launch is priced "
                      "at the replay's gap between kernels (`contenders.as_replayed`).", ""] + _suite_table(rows) + [""]
    lines += prediction_lines(results)
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
