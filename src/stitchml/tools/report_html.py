"""The explain report as one self-contained HTML page (Skyline's point: see the
performance at a glance).

What the page shows, per compiled model: a summary (predicted time, kernels,
launches, where the cost model's figures come from), the what-if table, each graph
drawn by Graphviz (`dot -Tsvg`, inlined) with every op filled with its kernel's
colour and framed by its scheme's colour, the per-kernel table (bytes, predicted and
measured time), a bandwidth roofline and the what-if bars (matplotlib, inlined as PNG),
the launch groups and the plan search per graph, the pattern rewrites of the Dynamo
graph (applied, or refused with the reason), the refused fusions and the eager ops
with their reasons.  Nothing is fetched: no external scripts, styles or fonts.
Without Graphviz the graph section says so and lists the ops per kernel instead.
"""
from __future__ import annotations

import base64
import colorsys
import html
import io
import os
import shutil
import subprocess
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..ir import nodes as ir
from ..plan.data import EagerStep, Plan
from ..plan.devices import Device, current_device, describe_source
from ..plan.graph_view import GraphView, is_free

if TYPE_CHECKING:
    from ..plan.ilp import SearchReport
    from .explain import Report

SCHEME_COLOURS = {"local": "#1f77b4", "regional": "#e6550d", "scatter": "#756bb1", "combine": "#31a354"}
EAGER_FILL = "#d9d9d9"
MAX_DRAWN_OPS = 2500     # above this a graph is drawn one box per kernel (dot gets slow)
DOT_TIMEOUT_S = 120
MAX_REFUSAL_ROWS = 400


class ReportError(OSError):
    """The report cannot be written where it was asked to go."""


def _esc(x: Any) -> str:
    return html.escape(str(x), quote=True)


def kernel_colour(i: int) -> str:
    """A light fill per kernel: golden-ratio hues, so neighbours differ."""
    h = (i * 0.618033988749895) % 1.0
    r, g, b = colorsys.hls_to_rgb(h, 0.80, 0.65)
    return f"#{int(r * 255):02x}{int(g * 255):02x}{int(b * 255):02x}"


def check_writable(path: str | os.PathLike) -> Path:
    """Fail early, with a clear message, if `path` cannot be written."""
    p = Path(path)
    parent = p.parent if str(p.parent) else Path(".")
    if p.is_dir():
        raise ReportError(f"cannot write the HTML report to {str(p)!r}: it is a directory")
    if not parent.is_dir():
        raise ReportError(f"cannot write the HTML report to {str(p)!r}: directory {str(parent)!r} does not exist")
    if not os.access(parent, os.W_OK) or (p.exists() and not os.access(p, os.W_OK)):
        raise ReportError(f"cannot write the HTML report to {str(p)!r}: permission denied")
    return p


# --------------------------------------------------------------------------- graph

def _dot_source(plan: Plan, colours: dict[str, str], kind: str) -> tuple[str, int, bool]:
    g = plan.graph
    gv = GraphView(g)
    kernel_of = {m: k for k in plan.kernels if not k.combine_of for m in k.members}
    eager = {s.node: s for s in plan.steps if isinstance(s, EagerStep)}
    drawn = [n for n in g.nodes if not is_free(n) and (n.id in kernel_of or n.id in eager)]
    ids = {n.id for n in drawn}
    for n in list(drawn):   # inputs and other producers read by drawn ops
        for s in gv.sources[n.id]:
            if s not in ids:
                ids.add(s)
    lines = [f'digraph "{kind}" {{', '  graph [rankdir=TB, fontname="Helvetica", fontsize=11, nodesep=0.15, '
             'ranksep=0.25, bgcolor="white"];',
             '  node [shape=box, style="rounded,filled", fontname="Helvetica", fontsize=9, height=0.25, '
             'margin="0.05,0.02", penwidth=1.5];', '  edge [arrowsize=0.5, color="#888888"];']
    collapsed = len(ids) > MAX_DRAWN_OPS
    groups = {m: grp for grp in plan.groups for m in grp.members}
    if collapsed:   # one box per kernel and eager op
        owner = {}
        for k in plan.kernels:
            if k.combine_of:
                continue
            grp = groups.get(k.name)
            lines.append(f'  "{k.name}" [label="{k.name} {k.scheme}\\n{len(k.members)} ops", '
                         f'fillcolor="{colours[k.name]}", color="{SCHEME_COLOURS.get(k.scheme, "#000")}", '
                         f'tooltip="{k.name}: {k.mapping.describe()}{" in " + grp.name if grp else ""}"];')
            for m in k.members:
                owner[m] = k.name
        for nid, st in eager.items():
            lines.append(f'  "e{nid}" [label="{_esc(st.op)}", fillcolor="{EAGER_FILL}", shape=box, style=filled];')
            owner[nid] = f"e{nid}"
        edges = set()
        for nid in owner:
            for s in gv.sources[nid]:
                if s in owner and owner[s] != owner[nid]:
                    edges.add((owner[s], owner[nid]))
        lines.extend(f'  "{a}" -> "{b}";' for a, b in sorted(edges))
        lines.append("}")
        return "\n".join(lines), len(owner), True
    by_kernel: dict[str, list[int]] = {}
    for nid in sorted(ids):
        k = kernel_of.get(nid)
        if k is not None:
            by_kernel.setdefault(k.name, []).append(nid)
    kplans = {k.name: k for k in plan.kernels}

    def node_line(nid: int, fill: str, colour: str, extra: str = "") -> str:
        n = g[nid]
        tip = f"%{nid} {n.kind}.{n.op} {_shape(n)} {str(n.dtype).replace('torch.', '')}{extra}"
        return (f'    n{nid} [id="op{nid}", label="{_esc(n.op)}", fillcolor="{fill}", color="{colour}", '
                f'tooltip="{_esc(tip)}"];')

    for name, members in by_kernel.items():
        k = kplans[name]
        grp = groups.get(name)
        colour = SCHEME_COLOURS.get(k.scheme, "#000000")
        lines.append(f'  subgraph "cluster_{name}" {{')
        launch = f" [{grp.kind} {grp.name}]" if grp else ""
        lines.append(f'    label="{name} {k.scheme} {k.mapping.form}{launch}"; '
                     f'color="{colour}"; penwidth=2; fontsize=9; fontcolor="{colour}"; style="rounded";')
        lines.extend(node_line(m, colours[name], colour, f" in {name} ({k.scheme})") for m in members)
        lines.append("  }")
    for nid in sorted(ids):
        if nid in kernel_of:
            continue
        n = g[nid]
        if nid in eager:
            lines.append(node_line(nid, EAGER_FILL, "#555555", f" eager: {eager[nid].reason}").replace(
                "    n", "  n", 1))
        else:   # graph inputs and values produced outside this view
            lines.append(f'  n{nid} [label="{_esc(n.op if n.kind != ir.INPUT else "input")}", shape=ellipse, '
                         f'style=solid, color="#999999", fontcolor="#555555", '
                         f'tooltip="%{nid} {_esc(n.kind)} {_shape(n)}"];')
    for nid in sorted(ids):
        for s in gv.sources[nid]:
            if s in ids and (nid in kernel_of or nid in eager):
                lines.append(f"  n{s} -> n{nid};")
    lines.append("}")
    return "\n".join(lines), len(ids), False


def _shape(n: ir.Node) -> str:
    shape = getattr(n, "shape", None)
    return str(tuple(shape)) if shape is not None else ""


def render_svg(dot_source: str) -> tuple[str | None, str]:
    """(inline SVG, '') or (None, why not)."""
    dot = shutil.which("dot")
    if dot is None:
        return None, ("Graphviz is not installed (no `dot` on PATH), so the graph is not drawn: install it "
                      "with `apt-get install graphviz`. The ops of each kernel are listed below instead.")
    try:
        res = subprocess.run([dot, "-Tsvg"], input=dot_source, capture_output=True, text=True,
                             timeout=DOT_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return None, f"Graphviz took more than {DOT_TIMEOUT_S} s to lay out this graph; it is listed below instead."
    except OSError as e:
        return None, f"Graphviz could not run ({e}); the ops of each kernel are listed below instead."
    if res.returncode != 0 or "<svg" not in res.stdout:
        return None, f"Graphviz failed ({res.stderr.strip()[:300]}); the ops of each kernel are listed below."
    svg = res.stdout[res.stdout.index("<svg"):]
    return svg, ""


# --------------------------------------------------------------------------- charts

def _png(fig) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=96, bbox_inches="tight")
    import matplotlib.pyplot as plt
    plt.close(fig)
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def roofline_png(rows: list[dict], dev: Device) -> str | None:
    """Bandwidth roofline: bytes a kernel moves against the bandwidth it achieves
    (predicted, and measured where given); the roof is what the model allows at that
    size, launch-bound on the left, copy bandwidth on the right."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        import numpy as np
    except Exception:
        return None
    pts = [r for r in rows if r["bytes"] > 0 and r["predicted_us"] > 0]
    if not pts:
        return None
    fig, ax = plt.subplots(figsize=(7.5, 4.2))
    lo = max(min(r["bytes"] for r in pts) / 4, 1.0)
    hi = max(r["bytes"] for r in pts) * 4
    xs = np.logspace(np.log10(lo), np.log10(hi), 200)
    ax.plot(xs, xs / (dev.launch_s + xs / dev.bandwidth) / 1e9, color="black", lw=1.5,
            label=f"model roof: launch {dev.launch_s * 1e6:.1f} us + copy {dev.bandwidth / 1e12:.2f} TB/s")
    ax.axhline(dev.bandwidth / 1e9, color="black", ls=":", lw=1)
    for scheme, colour in SCHEME_COLOURS.items():
        sel = [r for r in pts if r["scheme"] == scheme]
        if sel:
            ax.scatter([r["bytes"] for r in sel], [r["bytes"] / (r["predicted_us"] * 1e-6) / 1e9 for r in sel],
                       s=22, color=colour, alpha=0.8, label=f"{scheme} (predicted)")
    meas = [r for r in pts if r.get("measured_us")]
    if meas:
        ax.scatter([r["bytes"] for r in meas], [r["bytes"] / (r["measured_us"] * 1e-6) / 1e9 for r in meas],
                   s=30, marker="x", color="#d62728", label="measured")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("bytes moved by the kernel (read + written)")
    ax.set_ylabel("achieved bandwidth (GB/s)")
    ax.set_title(f"bandwidth roofline on {dev.name}")
    ax.grid(True, which="both", alpha=0.25)
    ax.legend(fontsize=7, loc="lower right")
    return _png(fig)


def whatif_png(table: dict) -> str | None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception:
        return None
    plans = table["plans"]
    fig, ax = plt.subplots(figsize=(7.5, 0.35 * len(plans) + 1.0))
    names = [p["name"] for p in plans][::-1]
    vals = [p["predicted_us"] for p in plans][::-1]
    colours = ["#e6550d" if n == table["chosen"] else "#9ecae1" for n in names]
    ax.barh(names, vals, color=colours)
    ax.set_xscale("log")
    from matplotlib.ticker import NullFormatter
    ax.xaxis.set_minor_formatter(NullFormatter())   # minor labels of a short log axis collide
    ax.set_xlabel("predicted time of the memory-intensive part (us, log scale)")
    ax.set_title(f"what-if on {table['device']}")
    for y, v in enumerate(vals):
        ax.text(v, y, f" {v:.1f}", va="center", fontsize=7)
    return _png(fig)


# --------------------------------------------------------------------------- page

CSS = """
body{font-family:Helvetica,Arial,sans-serif;margin:16px 24px;color:#222;background:#fff}
h1{font-size:22px;margin:0 0 6px}h2{font-size:17px;margin:22px 0 6px;border-bottom:1px solid #ddd}
h3{font-size:14px;margin:14px 0 4px}
.cards{display:flex;gap:12px;flex-wrap:wrap}.card{border:1px solid #ccc;border-radius:6px;padding:6px 12px;
background:#f7f9fc}.card b{display:block;font-size:18px}
table{border-collapse:collapse;font-size:12px;margin:4px 0}th,td{border:1px solid #ccc;padding:2px 6px;
text-align:left}th{background:#e8eef7;cursor:pointer}tr:nth-child(even) td{background:#fafafa}
td.num{text-align:right;font-variant-numeric:tabular-nums}.sw{display:inline-block;width:12px;height:12px;
border:1px solid #888;vertical-align:middle}.graphbox{border:1px solid #bbb;max-height:620px;overflow:auto;
background:#fff}.graphbox.fit svg{width:100%;height:auto}.note{color:#666;font-size:12px}
.chosen td{font-weight:bold}.warn{color:#a00}button{font-size:12px}
"""

SCRIPT = """
(function(){
  function sortTable(th){
    var table=th.closest('table'), body=table.tBodies[0];
    if(!body){return;}
    var idx=Array.prototype.indexOf.call(th.parentNode.children, th);
    var asc=th.getAttribute('data-asc')!=='1'; th.setAttribute('data-asc', asc?'1':'0');
    var rows=Array.prototype.slice.call(body.rows);
    rows.sort(function(a,b){
      var x=a.cells[idx]?a.cells[idx].getAttribute('data-v')||a.cells[idx].textContent:'';
      var y=b.cells[idx]?b.cells[idx].getAttribute('data-v')||b.cells[idx].textContent:'';
      var nx=parseFloat(x), ny=parseFloat(y);
      var c=(!isNaN(nx)&&!isNaN(ny))?nx-ny:(x<y?-1:(x>y?1:0));
      return asc?c:-c;});
    rows.forEach(function(r){body.appendChild(r);});
  }
  document.querySelectorAll('th').forEach(function(th){
    th.addEventListener('click', function(){sortTable(th);});});
  document.querySelectorAll('button[data-fit]').forEach(function(b){
    b.addEventListener('click', function(){
      document.getElementById(b.getAttribute('data-fit')).classList.toggle('fit');});});
  // wide graphs: scroll each box so that its first ops are in view
  document.querySelectorAll('.graphbox').forEach(function(box){
    var node=box.querySelector('g.node');
    if(!node){return;}
    var nb=node.getBoundingClientRect(), bb=box.getBoundingClientRect();
    box.scrollLeft=Math.max(0, nb.left-bb.left-bb.width/3);
  });
  var layout={};
  ['summary','whatif','graph-0','kernels','roofline'].forEach(function(id){
    var el=document.getElementById(id);
    if(el){var r=el.getBoundingClientRect();
      layout[id]=[Math.round(r.left),Math.round(r.top),Math.round(r.width),Math.round(r.height)];}});
  document.body.setAttribute('data-ready','1');
  console.log('stitchml-report-ready '+JSON.stringify(layout));
})();
"""


def _table(headers: list[str], rows: list[list[Any]], elem_id: str = "", row_cls: list[str] | None = None) -> str:
    out = [f'<table{f" id={chr(34)}{elem_id}{chr(34)}" if elem_id else ""}><thead><tr>']
    out += [f"<th>{_esc(h)}</th>" for h in headers]
    out.append("</tr></thead><tbody>")
    for i, r in enumerate(rows):
        cls = f' class="{row_cls[i]}"' if row_cls and row_cls[i] else ""
        out.append(f"<tr{cls}>")
        for c in r:
            if isinstance(c, tuple):      # (html, sort value)
                out.append(f'<td data-v="{_esc(c[1])}">{c[0]}</td>')
            elif isinstance(c, (int, float)):
                out.append(f'<td class="num" data-v="{c}">{c:,.1f}</td>' if isinstance(c, float)
                           else f'<td class="num" data-v="{c}">{c:,}</td>')
            else:
                out.append(f"<td>{_esc(c)}</td>")
        out.append("</tr>")
    out.append("</tbody></table>")
    return "".join(out)


def _kernel_rows(report, colours: dict[str, str], measured: dict[str, float]) -> list[dict]:
    rows = []
    for rec in report.graphs:
        if rec.plan is None:
            continue
        g = rec.plan.graph
        for k in rec.plan.kernels:
            grp = rec.plan.group_of(k.name)
            key = f"{rec.kind}:{k.name}"
            rows.append({"key": key, "graph": rec.kind, "kernel": k.name, "scheme": k.scheme,
                         "form": k.mapping.form, "mapping": k.mapping.describe(),
                         "group": f"{grp.kind} {grp.name}" if grp else "",
                         "ops": [g[m].op for m in k.members], "read": k.bytes_read, "written": k.bytes_written,
                         "bytes": k.bytes_read + k.bytes_written, "predicted_us": k.predicted_s * 1e6,
                         "measured_us": measured.get(key), "colour": colours.get(key, "#fff")})
    return rows


def build_html(report: Report, measured_us: dict[str, float] | None = None, title: str = "",
               what_if: dict | None = None) -> str:
    measured = dict(measured_us or {})
    dev = current_device()
    colours: dict[str, str] = {}
    i = 0
    for rec in report.graphs:
        if rec.plan is None:
            continue
        for k in rec.plan.kernels:
            colours[f"{rec.kind}:{k.name}"] = kernel_colour(i)
            i += 1
    krows = _kernel_rows(report, colours, measured)
    if what_if is None:
        try:
            what_if = report.what_if()
        except Exception as e:  # the page is still worth having without it
            what_if = {"error": f"{type(e).__name__}: {e}"}
    parts = ["<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>",
             f"<title>{_esc(title or 'stitchml explain report')}</title><style>{CSS}</style></head><body>",
             f"<h1>{_esc(title or 'stitchml explain report')}</h1>"]
    pred = sum(r["predicted_us"] for r in krows)
    n_meas = sum(1 for r in krows if r["measured_us"])
    parts.append("<div id='summary' class='cards'>")
    for label, value in [("predicted (memory-intensive part)", f"{report.predicted_us:,.1f} us"),
                         ("kernels", f"{len(krows)}"), ("launches per call", f"{report.num_kernels}"),
                         ("eager ops", f"{len(report.fallbacks)}"),
                         ("modelled bytes", f"{report.modelled_bytes / 1e6:,.2f} MB"),
                         ("unfused bytes", f"{report.unfused_bytes / 1e6:,.2f} MB"),
                         ("device", dev.name), ("measured kernels", f"{n_meas} of {len(krows)}"),
                         ("pattern rewrites", _pattern_count(report))]:
        parts.append(f"<div class='card'>{_esc(label)}<b>{_esc(value)}</b></div>")
    parts.append("</div>")
    parts.append(f"<p class='note'>Cost-model figures: {_esc(describe_source(dev))}. "
                 f"Sum of kernel predictions {pred:,.1f} us (launch groups share launches).</p>")

    # what-if
    parts.append("<h2>What if</h2><div id='whatif'>")
    if "error" in what_if:
        parts.append(f"<p class='warn'>what-if not available: {_esc(what_if['error'])}</p>")
    else:
        base = next((p["predicted_us"] for p in what_if["plans"] if p["name"] == what_if["chosen"]), 0) or 1e-30
        def us(v):   # (a row without its own library price, e.g. `unfused`: a dash)
            return "—" if v is None else float(v)
        rows = [[p["name"], p["device"], float(p["predicted_us"]), (f"{p['predicted_us'] / base:.2f}x",
                 p["predicted_us"] / base), p["kernels"], p["launches"], us(p.get("library_us")),
                 us(p.get("step_us")), p.get("note", "")] for p in what_if["plans"]]
        cls = ["chosen" if p["name"] == what_if["chosen"] else "" for p in what_if["plans"]]
        parts.append(_table(["plan", "device", "predicted us", "vs chosen", "kernels", "launches", "library us",
                             "step us", "note"], rows, row_cls=cls))
        parts.append(f"<p class='note'>chosen: <b>{_esc(what_if['chosen'])}</b> on {_esc(what_if['device'])} "
                     f"({_esc(what_if.get('source', ''))}); {_esc(what_if.get('note', ''))}</p>")
        if "library_us" in what_if:
            unpriced = what_if.get("unpriced_ops") or []
            parts.append(f"<p>library ops of the chosen plan (matrix products, attention, other eager ops): "
                         f"{what_if['library_us']:.1f} us over {what_if['library_ops']} op(s)"
                         + (f", no price for {_esc(', '.join(unpriced))}" if unpriced else "")
                         + f"; the step ({_esc(what_if['chosen'])} + library ops): <b>{what_if['step_us']:.1f} us</b>"
                         "</p>")
        png = whatif_png(what_if)
        if png:
            parts.append(f"<img alt='what-if chart' src='{png}'>")
    parts.append("</div>")

    # graphs
    parts.append("<h2>Graphs: ops coloured by kernel, framed by scheme</h2><p class='note'>Legend: "
                 + " ".join(f"<span class='sw' style='background:#fff;border:2px solid {c}'></span> {s}"
                            for s, c in SCHEME_COLOURS.items())
                 + f" &nbsp; <span class='sw' style='background:{EAGER_FILL}'></span> eager op"
                 " &nbsp; ellipse: graph input. Hover an op for its shape and kernel.</p>")
    gi = 0
    for rec in report.graphs:
        parts.append(f"<h3>{_esc(rec.kind)} graph</h3>")
        if rec.plan is None:
            parts.append(f"<p class='warn'>runs eagerly: {_esc(rec.eager_reason)}</p>")
            continue
        local = {k.name: colours[f"{rec.kind}:{k.name}"] for k in rec.plan.kernels}
        src, drawn, collapsed = _dot_source(rec.plan, local, rec.kind)
        svg, why = render_svg(src)
        box = f"graph-{gi}"
        gi += 1
        if svg is not None:
            how = " (one box per kernel: graph too large)" if collapsed else ""
            parts.append(f"<p class='note'>{drawn} ops drawn{how}. "
                         f"<button data-fit='{box}'>fit to width / natural size</button></p>")
            parts.append(f"<div class='graphbox' id='{box}'>{svg}</div>")
        else:
            parts.append(f"<p class='warn' id='{box}'>{_esc(why)}</p>")
            rows = [[(f"<span class='sw' style='background:{local[k.name]}'></span> {_esc(k.name)}", k.name),
                     k.scheme, ", ".join(rec.plan.graph[m].op for m in k.members)] for k in rec.plan.kernels]
            parts.append(_table(["kernel", "scheme", "ops"], rows))

    # kernels
    parts.append("<h2>Kernels</h2>")
    rows = []
    for r in krows:
        ops = ", ".join(r["ops"][:8]) + (f", ... ({len(r['ops'])} ops)" if len(r["ops"]) > 8 else "")
        meas = r["measured_us"]
        rows.append([(f"<span class='sw' style='background:{r['colour']}'></span> {_esc(r['key'])}", r["key"]),
                     r["scheme"], r["mapping"], r["group"], float(r["read"] / 1e3), float(r["written"] / 1e3),
                     float(r["predicted_us"]), (f"{meas:,.1f}" if meas else "not measured", meas or -1), ops])
    parts.append(_table(["kernel", "scheme", "mapping", "launch group", "read kB", "written kB", "predicted us",
                         "measured us", "ops"], rows, elem_id="kernels"))
    png = roofline_png(krows, dev)
    if png:
        parts.append(f"<h2>Roofline</h2><img id='roofline' alt='bandwidth roofline' src='{png}'>")

    # launch groups and the plan search
    parts.append("<h2>Launch groups and plan search</h2>")
    rows = []
    for rec in report.graphs:
        if rec.plan is None:
            continue
        for grp in rec.plan.groups:
            rows.append([rec.kind, grp.name, grp.kind, "+".join(grp.members), grp.grid, float(grp.predicted_s * 1e6),
                         grp.reason])
    parts.append(_table(["graph", "group", "kind", "kernels", "grid", "predicted us", "why"], rows)
                 if rows else "<p class='note'>no launch groups</p>")
    rows = []
    for rec in report.graphs:
        s = rec.plan.search if rec.plan is not None else None
        if s is None:
            continue
        for line in search_lines(s):
            rows.append([rec.kind] + line)
    if rows:
        parts.append(_table(["graph", "region", "winner", "rules us", "chosen us", "saved", "note"], rows))

    parts.append(pattern_section(report))
    parts.append(partition_section(report))

    # refusals and eager ops
    parts.append("<h2>Refused fusions</h2>")
    reasons: Counter = Counter()
    rrows = []
    for rec in report.graphs:
        if rec.plan is None:
            continue
        g = rec.plan.graph
        for r in rec.plan.refusals:
            reasons[r.reason] += 1
            if len(rrows) < MAX_REFUSAL_ROWS:
                rrows.append([rec.kind, f"%{r.producer} {g[r.producer].op}", f"%{r.consumer} {g[r.consumer].op}",
                              r.reason])
    if reasons:
        parts.append(_table(["reason", "count"], [[k, v] for k, v in reasons.most_common()]))
        more = sum(reasons.values()) - len(rrows)
        parts.append(f"<details><summary>every refusal ({sum(reasons.values())})</summary>"
                     + _table(["graph", "producer", "consumer", "reason"], rrows)
                     + (f"<p class='note'>{more} more not listed</p>" if more > 0 else "") + "</details>")
    else:
        parts.append("<p class='note'>no fusion was refused</p>")
    parts.append("<h2>Eager ops</h2>")
    erows: Counter = Counter()
    for rec in report.graphs:
        if rec.eager_reason is not None:
            erows[(rec.kind, "<whole graph>", rec.eager_reason)] += 1
        elif rec.plan is not None:
            for st in rec.plan.steps:
                if isinstance(st, EagerStep):
                    erows[(rec.kind, st.op, st.reason)] += 1
    parts.append(_table(["graph", "op", "reason", "count"], [[a, b, c, n] for (a, b, c), n in sorted(erows.items())])
                 if erows else "<p class='note'>no eager ops</p>")
    wrows: Counter = Counter()
    for rec in report.graphs:
        if rec.plan is None:
            continue
        for pos, new in rec.plan.graph.written():
            why = rec.plan.copy_reason(new)
            wrows[(rec.kind, "overwritten by the kernel computing it" if why is None
                   else f"copied into it after the call: {why}")] += 1
    if wrows:   # graph inputs written (optimizer steps, batch-norm buffers: plan/in_place.py)
        parts.append("<h2>Graph inputs written</h2>")
        parts.append(_table(["graph", "how", "inputs"], [[a, b, n] for (a, b), n in sorted(wrows.items())]))
    breaks = getattr(report, "graph_breaks", None)
    if breaks:   # Dynamo's: each ends a graph, so nothing is fused across it
        parts.append("<h2>Dynamo graph breaks</h2><p class='note'>nothing is fused or rewritten across a break; "
                     "the code between graphs runs eagerly</p>")
        parts.append(_table(["reason", "count"], [[r, n] for r, n in breaks]))
    parts.append(f"<script>{SCRIPT}</script></body></html>")
    return "\n".join(parts)


def _pattern_count(report) -> str:
    if not getattr(report, "patterns_recorded", True):
        return "not recorded"
    recs = getattr(report, "patterns", None) or []
    applied = sum(r.applied for r in recs)
    return f"{applied} applied, {len(recs) - applied} refused"


def pattern_section(report: Report) -> str:
    """The pattern rewrites of the Dynamo graph (before AOTAutograd): each applied or
    refused, at which node, and what it produced or why it refused."""
    recs = getattr(report, "patterns", None) or []
    out = ["<h2>Pattern rewrites (Dynamo graph, before AOTAutograd)</h2><div id='patterns'>"]
    if not getattr(report, "patterns_recorded", True):
        out.append("<p class='note'>not recorded: this report was built without the stitch backend's pattern "
                   "rewrites (planning only)</p>")
    elif not recs:
        out.append("<p class='note'>no pattern rewrite applied or refused (nothing matched, or the rewrites are "
                   "switched off)</p>")
    else:
        rows = [[r.pattern, r.anchor, ("<b>rewritten</b>" if r.applied else "<span class='warn'>refused</span>",
                                       "rewritten" if r.applied else "refused"), r.detail] for r in recs]
        out.append(_table(["pattern", "at node", "outcome", "what it produced / why it refused"], rows))
    out.append("</div>")
    return "".join(out)


def partition_section(report: Report) -> str:
    """How AOTAutograd split each training graph (knob remat): min-cut or the default
    partition, and the forward values kept from recomputation for backward comparisons.
    Empty where nothing was recorded (inference, a planning-only report, a cache hit)."""
    recs = getattr(report, "partitions", None) or []
    if not recs:
        return ""
    rows = [[r.method, r.runs, ", ".join(r.saved) or "—", r.line()] for r in recs]
    return ("<h2>Training graphs split (AOTAutograd, knob remat)</h2><div id='partitions'>"
            + _table(["method", "min-cut runs", "saved for backward comparisons", "meaning"], rows) + "</div>")


def search_lines(s: SearchReport) -> list[list[Any]]:
    """Rows for the plan-search table: per region where the search reports them,
    else one row for the whole graph."""
    regions = getattr(s, "per_region", None) or []
    if regions:
        return [[r.region, r.winner, float(r.rule_s * 1e6), float(r.chosen_s * 1e6),
                 f"{(r.rule_s - r.chosen_s) * 1e6:.2f} us", r.note] for r in regions]
    return [["all", s.method, float(s.rule_s * 1e6), float(s.chosen_s * 1e6),
             f"{(s.rule_s - s.chosen_s) * 1e6:.2f} us", s.note]]


def write_html(report: Report, path: str | os.PathLike, measured_us: dict[str, float] | None = None, title: str = "",
               what_if: dict | None = None) -> str:
    p = check_writable(path)
    page = build_html(report, measured_us=measured_us, title=title, what_if=what_if)
    try:
        p.write_text(page, encoding="utf-8")
    except OSError as e:
        raise ReportError(f"cannot write the HTML report to {str(p)!r}: {e.strerror or e}") from e
    return str(p)


__all__ = ["write_html", "build_html", "ReportError", "check_writable", "render_svg", "kernel_colour",
           "pattern_section", "partition_section"]
