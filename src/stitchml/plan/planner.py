"""Plan construction: groups → kernels in launch order, with materialisation decided,
a thread mapping per kernel, and modelled bytes."""
from __future__ import annotations

import heapq
from dataclasses import replace

import torch

from ..ir import index as ix
from ..ir import nodes as ir
from ..ir.cat_sums import fold_cat_sums, fold_reduction_sums
from ..ir.dce import eliminate_dead, fold_copies, merge_duplicates
from ..ir.product_sums import fold_product_sums
from . import mapping as mapping_rules
from .access import (generates, layout_domain, may_reorder, row_run_reads, row_values_domain, sector_waste,
                     transposed_reads)
from .cost import (input_passes, input_paths, kernel_bytes, loop_waits, predict_seconds, reread_miss, row_bytes,
                   unfused_bytes)
from .data import Domain, EagerStep, KernelPlan, Plan
from .graph_view import GraphView, cheap_chains, is_free, mark_recompute, recompute_cheap, source_bytes, view_base
from .grouping import Grouper, Group
from .options import PlanOptions
from .placement import candidates as placement_candidates, containers, place_cats
from .ilp import search
from .in_place import in_place_writes
from .window_reads import heavy_window_reads
from .split import split_long_rows


def build_plan(g: ir.Graph, options: PlanOptions | None = None) -> Plan:
    """Plan a lowered graph under `options` (default: the knobs' current values); the
    plan's `graph` may be a rewritten copy (dead nodes dropped, long rows split)."""
    opts = options or PlanOptions.from_config()
    source = g
    # sums accumulated over a recurrence's steps, of column sums and of matrix products:
    # one reduction, one product (ir/cat_sums.py, ir/product_sums.py)
    if opts.reduction_sums and opts.place_cats and not opts.fixed_row_blocks:
        # (without buffer placement the steps' values are copied into the concatenation
        # for their other readers anyway and the fold only adds a read: DIEN's backward,
        # 607.1 -> 620.2 us predicted, bench/NOTES.md, thirty-seventh session)
        g = fold_reduction_sums(g)
    if opts.product_sums:
        g = fold_product_sums(g, opts.device)
    # (dead nodes dropped again after the split: a variance's d*d is unused once its sum
    # is taken from chunk statistics)
    g = recompute_cheap(eliminate_dead(split_long_rows(eliminate_dead(fold_copies(merge_duplicates(fold_cat_sums(g)))), opts)))
    gv = GraphView(g)
    # What dry runs of code generation taught us: a pair {x, y} keeps the kernels of
    # dominant ops x and y apart; a singleton {d} keeps d's kernel from absorbing
    # consumers that read it through a reordering index map.
    forbidden: frozenset = frozenset()
    # values written once instead of computed again at each of many index maps (a
    # producer fused into large pooling windows: `window_reads`), with the reason
    cuts: dict[int, str] = {}
    weighed = placed = False
    while True:
        plan = _plan_once(g, gv, forbidden, opts, cuts)
        bads = _invalid_kernels(g, plan)
        if not bads:
            heavy = heavy_window_reads(g, plan, opts.window_recompute_ops)
            if heavy.keys() - cuts.keys():
                cuts.update(heavy)
                continue
            if opts.place_cats and not placed and not opts.fixed_row_blocks:
                # concatenations copied from parts other kernels write: the parts are written
                # into its slices instead (before the weighing below, which would have the
                # copy compute a cheap part itself and so keep it), and the graph is planned
                # again; not where the concatenation's kernel does more than copy and could
                # compute its parts from their sources (`_parts_of_cats`: the parts are then
                # never written, and what reads the concatenation shares its kernel).  A bare
                # copy is placed either way: one kernel writes the parts where they belong,
                # instead of one evaluating every part's expression at every position
                placed = True
                cats = placement_candidates(g, plan)
                if opts.cat_parts:
                    kernel_of = {m: k for k in plan.kernels for m in k.members}
                    cats -= {c for c in _absorbable_parts(g, gv, plan) if kernel_of[c].members != (c,)}
                if cats and (moved := place_cats(g, cats)) is not g:
                    g, gv, forbidden, cuts = moved, GraphView(moved), frozenset(), {}
                    continue
            cheaper: dict[int, str] = {}
            if not weighed:
                cheaper.update(dict.fromkeys(_cheaper_recomputed(g, gv, plan, opts),
                                             "cheaper to compute in its readers than to write and read back"))
                if opts.narrow_writes:
                    why = "an exact widening cast: the narrow value is written, readers cast it"
                    cheaper.update(dict.fromkeys(_narrower_writes(g, gv, plan), why))
                if opts.cat_parts:
                    cheaper.update(dict.fromkeys(_parts_of_cats(g, gv, plan),
                                                 "a part of a concatenation, computed by the concatenation's kernel"))
            weighed = True
            if cheaper:   # plan once more with those values computed by their readers
                # (node ids survive the marking, and so do the dry run's lessons: starting
                # over re-learned the same ones with a planning run each — every decoding
                # LLaMA graph's mask kernel, four plans a new size instead of three)
                g = mark_recompute(g, dict(sorted(cheaper.items())))
                gv, cuts = GraphView(g), {}
                continue
            plan.search = search(plan, opts)
            plan.launch_s, plan.graph_replay, plan.source = opts.device.launch_s, opts.graph_replay, source
            plan.in_place = in_place_writes(plan)   # (after launch grouping: it fixes the launch order)
            return plan
        # every kernel the dry run refused teaches its pairs at once (one at a time, halonet's
        # backward was planned 36 times: planning both graphs took 74.7 s, now 27.5 s,
        # bench/NOTES.md, forty-fourth session); each kernel's lesson is its own, as before
        learned: set = set()
        for bad in bads:
            pairs = {frozenset((x, y)) for x in bad.dominant for y in bad.dominant if x != y}
            if not pairs or pairs <= forbidden:
                pairs = {frozenset((d,)) for d in bad.dominant}
            if pairs <= forbidden:
                raise RuntimeError(f"kernel {bad.name} cannot be generated and cannot be split")
            learned |= pairs
        forbidden = forbidden | learned


# a recomputed chain evaluates its written sources at most this many times an element,
# through the recomputed chains below it (`_cheaper_recomputed`)
RECOMPUTE_PATHS = 32


def _cheaper_recomputed(g: ir.Graph, gv: GraphView, plan: Plan, opts: PlanOptions) -> set[int]:
    """Cheap values of at most two full-size sources (`graph_view.cheap_chains`) that a kernel
    writes and other kernels read, where the readers would read fewer bytes computing
    them from their sources (those a reader does not read anyway) than writing the value
    and reading it back costs: a float32 softmax backward's dy * y over split rows, whose
    last kernel reads y anyway.  A residual add read by one more kernel (a tie) stays
    written.  With knob `free_cats`, concatenations are chain links too: a pooling window
    reads its input where the -inf padded copy was written (ResNet-50's stem max-pool at
    b32: 70.6 -> 28.4 us predicted on an H200, one kernel instead of three).  Returned with
    the unwritten members of their chains (`_interior`)."""
    producer = {o: k for k in plan.kernels for o in k.outputs}
    readers: dict[int, list[KernelPlan]] = {}
    for k in plan.kernels:
        for i in k.inputs:
            readers.setdefault(i, []).append(k)
    escapes = gv.escapes   # (the view the plan was made with: its escapes are computed once)
    out: set[int] = set()
    weight: dict[int, int] = {}   # chosen value -> evaluations of written sources one evaluation costs
    # A chain's leaves are sources and values the plan writes anyway (a reader reads them
    # in place of the chain's result: a column reduction's combined per-channel values, a
    # gradient written for other kernels whose float32 cast a later kernel reads).  It
    # passes through free values and through members no other kernel reads (a ReLU
    # backward's mask and select inside the kernel that writes its float32 cast): those
    # are then computed by the readers too.
    def internal(m: int) -> bool:
        return bool(g[m].attr("recompute")) or (m not in producer and m not in escapes
                                                and g[m].kind in (ir.POINTWISE, ir.CAT))

    for nid, leaf in cheap_chains(g, free=internal, leaf_ok=producer.__contains__, cats=opts.free_cats):
        n = g[nid]
        if nid not in producer or nid in escapes or n.attr("recompute"):
            continue
        # chains come in graph order; one read from a value chosen above is recomputed on
        # top of it: a reader evaluates the lower chain once for each path the upper one
        # reads it through (each path another index map: no two evaluations share code).
        # Stacked without bound, a chain of writes into rows (Kimi's delta rule: 63 row
        # updates, each reading the last version as a whole and at its row) doubled the
        # evaluations a level: 25206 generated lines at a chunk of 32.  A chain whose
        # evaluations of its written sources, counted through the chains below it, pass
        # RECOMPUTE_PATHS is left written (within it: the max-pool backward's three stacked
        # chains, DIEN's two, Swin-T's float32 backward's nine; its shifted-window mask
        # counts 19)
        evals = sum(k * weight.get(s, 1) for s, k in _paths_to(g, nid, leaf).items())
        if evals > RECOMPUTE_PATHS:
            continue
        others = [k for k in readers.get(nid, []) if k is not producer[nid]]
        written = n.numel * n.dtype.itemsize * (1 + len(others))
        recomputed = sum(source_bytes(g, [s for s in leaf if s not in k.inputs]) for k in others)
        if recomputed < written:
            chosen = {nid} | _interior(g, nid, leaf)
            out |= chosen
            weight.update(dict.fromkeys(chosen, evals))
    return out


# casts that are exact: every value of the narrow type is a value of the wide one
_WIDENINGS = {(torch.float16, torch.float32), (torch.bfloat16, torch.float32), (torch.float16, torch.float64),
              (torch.bfloat16, torch.float64), (torch.float32, torch.float64)}


def _narrower_writes(g: ir.Graph, gv: GraphView, plan: Plan) -> set[int]:
    """Values a kernel writes that are an exact widening cast (a bfloat16 value to
    float32) of an element-wise value the same kernel computes: the kernel writes the
    narrow value instead and each reader casts it (the cast marked to be recomputed), half
    the bytes written and read back, the same numbers.  ResNet-50's backward wrote the
    float32 cast of `where(y <= 0, 0, dy_a + dy_b)` (the ReLU of a residual gradient: three
    full-size sources, too many for a cheap chain) for its batch norms' dx kernel: 295 MB a
    step at b32; LLaMA's last RMSNorm backward wrote the reshaped gradient's float32 cast
    for the embedding backward (16.8 MB).  Not a graph output or an eager op's operand
    (`escapes`), which must exist in the wide type."""
    out: set[int] = set()
    escapes = gv.escapes
    for k in plan.kernels:
        if k.combine_of:
            continue
        for o in k.outputs:
            n = g[o]
            if (o in k.partials or o in escapes or n.kind != ir.POINTWISE or n.op != "cast"
                    or n.attr("recompute") or len(n.refs) != 1):
                continue
            src = view_base(g, n.refs[0])   # (through views: a reshaped gradient's cast)
            if (src.id in k.members and src.kind == ir.POINTWISE and not is_free(src)
                    and src.numel == n.numel and (src.dtype, n.dtype) in _WIDENINGS):
                out.add(o)
    return out


def _parts_of_cats(g: ir.Graph, gv: GraphView, plan: Plan) -> set[int]:
    """Element-wise kernels that exist only to compute parts of one concatenation, which
    another kernel writes (the concatenation's own domain is wider, so the grouping could
    not merge them): their members are marked to be computed by the concatenation's
    kernel, each part at its own positions, so the parts are never written and read back.
    A Mixtral-style expert's SwiGLU backward computed the gate's and the up projection's
    gradients in one kernel and a second concatenated them for the grouped weight
    gradient: 92 MB a layer at b8 s512.  Only where each part's element is read once
    (through the concatenation alone), no member reduces, scans or scatters, and nothing
    the kernel writes is read elsewhere or escapes."""
    return set().union(*_absorbable_parts(g, gv, plan).values())


def _absorbable_parts(g: ir.Graph, gv: GraphView, plan: Plan) -> dict[int, set[int]]:
    """Per concatenation a kernel computes, the members of the kernels `_parts_of_cats`
    would have it compute itself (none: not listed)."""
    producer = {o: k for k in plan.kernels for o in k.outputs}
    out: dict[int, set[int]] = {}
    for kc in plan.kernels:
        for c in kc.members:
            cat = g[c]
            if cat.kind != ir.CAT or cat.attr("recompute"):
                continue
            parts = {view_base(g, r).id for r in cat.refs}
            kernels = {producer[p].name: producer[p] for p in parts if p in producer}
            for kp in kernels.values():
                if kp is kc or kp.partials or kp.combine_of or any(
                        g[m].kind != ir.POINTWISE or g[m].attr("recompute") for m in kp.members):
                    continue
                if all(o in parts and o not in gv.escapes and gv.consumers[o] == (c,) for o in kp.outputs):
                    out.setdefault(c, set()).update(kp.members)
    return out


def _paths_to(g: ir.Graph, nid: int, leaf) -> dict[int, int]:
    """For each leaf of the chain from `nid`, the paths that reach it from `nid` through
    the chain's nodes (how many times evaluating `nid` evaluates the leaf).  Counted
    from the top in descending id order (a node's readers have larger ids), without
    recursion: a chain may be hundreds of nodes deep."""
    nodes, stack = {nid}, [nid]
    while stack:
        for r in g[stack.pop()].refs:
            if r not in leaf and r not in nodes and g[r].kind in (ir.VIEW, ir.POINTWISE, ir.CAT):
                nodes.add(r)
                stack.append(r)
    count = dict.fromkeys(nodes, 0)
    count[nid] = 1
    paths: dict[int, int] = {}
    for m in sorted(nodes, reverse=True):
        for r in g[m].refs:
            if r in leaf:
                paths[r] = paths.get(r, 0) + count[m]
            elif r in count:
                count[r] += count[m]
    return paths


def _interior(g: ir.Graph, nid: int, leaf) -> set[int]:
    """The members between a chain's result and its leaves that are not free yet."""
    found: set[int] = set()
    stack = list(g[nid].refs)
    while stack:
        n = g[stack.pop()]
        if n.kind == ir.VIEW:
            stack.extend(n.refs)
        elif n.id not in leaf and n.id not in found and n.kind in (ir.POINTWISE, ir.CAT) and not is_free(n):
            found.add(n.id)
            stack.extend(n.refs)
    return found


def _invalid_kernels(g: ir.Graph, plan: Plan) -> list[KernelPlan]:
    """Dry-run the index analysis of every kernel that stitches a dominant op with
    other members (text only, nothing compiled); return those whose index spaces do not
    line up."""
    from ..codegen.probes import index_mismatch   # (once per kernel content: layers repeat)
    return [k for k in plan.kernels
            if k.dominant and len(k.members) > 1 and not k.combine_of and index_mismatch(g, k)]


def _plan_once(g: ir.Graph, gv: GraphView, forbidden: frozenset, opts: PlanOptions,
               cuts: dict[int, str] | None = None) -> Plan:
    grouper = Grouper(gv, opts, forbidden, cuts)
    groups = grouper.run()
    plan = Plan(graph=g, refusals=grouper.refusals)
    group_of = {m: grp for grp in groups for m in grp.members}

    # materialise every member read outside its kernel or needed as a real tensor
    for grp in groups:
        for m in grp.members:
            if m in gv.escapes or any(group_of.get(c) is not grp for c in gv.consumers[m]):
                plan.materialized.add(m)

    units = _schedule(g, gv, groups, group_of)
    kcount = 0
    for unit in units:
        if isinstance(unit, Group):
            k = _kernel(f"k{kcount}", unit, g, gv, plan.materialized, opts)
            plan.steps.append(k)
            kcount += 1
            if k.partials:
                plan.steps.append(_combine(f"k{kcount}", k, g, opts))
                kcount += 1
        else:
            n = g[unit]
            plan.steps.append(EagerStep(n.id, n.op, n.attr("reason", "")))
    if opts.combine_casts:
        _absorb_casts(plan, g, gv, opts)
    if opts.combine_epilogues and not opts.fixed_row_blocks:
        _absorb_epilogues(plan, g, gv, opts)
    for k in plan.kernels:
        k.completes = tuple(sorted({c for o in k.outputs for c in containers(g, o)}))
    plan.unfused_bytes = unfused_bytes(g)
    return plan


def _absorb_epilogues(plan: Plan, g: ir.Graph, gv: GraphView, opts: PlanOptions) -> None:
    """Per-column element-wise work on a column reduction's result (a batch norm's mean,
    variance, rstd and running-statistics update; a weight gradient's scaling) was a
    kernel of one program after the combine: two launches a channels-last batch norm, a
    hundred a ResNet-50 step.  The combine computes it as its epilogue instead, when
    every member of that kernel is element-wise over the combine's columns, it reads at
    least one of the combine's reductions, and everything else it reads exists before the
    combine runs (so moving it up changes no order).  Kernels that read the epilogue's
    results in turn are taken in as well (the combine's registers grow)."""
    from ..codegen.triton_kernel import generate_combine   # (code generation builds on plan data)
    steps = plan.steps
    written_at: dict[int, int] = {}
    complete_at: dict[int, int] = {}   # a placed concatenation: when its last part is written
    for i, s in enumerate(steps):
        for o in (s.outputs if isinstance(s, KernelPlan) else (s.node,)):
            written_at.setdefault(o, i)
            for c in containers(g, o):
                complete_at[c] = i
    written_at.update(complete_at)
    drop: set[str] = set()
    for ci, c in enumerate(steps):
        if not (isinstance(c, KernelPlan) and c.combine_of) or c.combine_casts:
            continue
        cols = {g[p].numel for p in c.dominant}
        if len(cols) != 1:
            continue
        (width,) = cols
        held = set(c.dominant)   # values the combine has in registers
        for j in range(ci + 1, len(steps)):
            k = steps[j]
            if isinstance(k, EagerStep) and gv.mutates(g[k.node]):
                break   # (a mutation fence: nothing moves across it)
            if (not isinstance(k, KernelPlan) or k.name in drop or k.combine_of or k.partials or k.dominant
                    or k.seeds or k.scheme == "scatter" or not k.domain.is_flat or not set(k.inputs) & held
                    or not all(g[m].kind == ir.POINTWISE and g[m].numel == width for m in k.members)
                    or not all(i in held or written_at.get(i, -1) < ci and g[i].numel in (width, 1)
                               for i in k.inputs)):
                continue
            trial = replace(c, members=c.members + k.members, epilogue=c.epilogue + k.members,
                            outputs=c.outputs + k.outputs,
                            inputs=c.inputs + tuple(i for i in k.inputs if i not in held and i not in c.inputs))
            try:
                generate_combine(g, trial)
            except ix.IndexMismatch:
                continue
            c.members, c.epilogue, c.outputs, c.inputs = trial.members, trial.epilogue, trial.outputs, trial.inputs
            held |= set(k.members)
            drop.add(k.name)
        if c.epilogue:
            # a reduction the epilogue alone reads is no longer stored
            inside = set(c.members)
            keep = {p for p in c.dominant if p in gv.escapes or any(u not in inside for u in gv.consumers[p])}
            gone = {p for p in c.dominant if p not in keep}
            c.outputs = tuple(o for o in c.outputs if o not in gone)
            plan.materialized -= gone
            c.bytes_read, c.bytes_written = _combine_bytes(g, c)
            c.predicted_s = predict_seconds(c, opts.device)
    if drop:
        plan.steps = [s for s in steps if not (isinstance(s, KernelPlan) and s.name in drop)]


def _absorb_casts(plan: Plan, g: ir.Graph, gv: GraphView, opts: PlanOptions) -> None:
    """A column reduction summed in float32 and cast to the parameter's half type (a bias
    or norm-weight gradient) was a one-program kernel of its own after the combine: 52
    such launches in a BERT-base backward step.  The combine stores the cast value
    instead, when the cast is the reduction's only reader and a kernel by itself."""
    by_member = {m: k for k in plan.kernels for m in k.members}
    drop: set[str] = set()
    for c in plan.kernels:
        if not c.combine_of:
            continue
        casts = []
        for p in c.dominant:   # (a combine's reductions: the partials of the kernel it combines)
            users = gv.consumers[p]
            if len(users) != 1 or p in gv.escapes:
                continue
            (u,) = users
            n = g[u]
            k = by_member.get(u)
            if (n.kind != ir.POINTWISE or n.op != "cast" or n.numel != g[p].numel or k is None
                    or k.members != (u,) or k.combine_of or k.name in drop):
                continue
            casts.append((p, u))
            drop.add(k.name)
        if not casts:
            continue
        absorbed = dict(casts)
        c.combine_casts = tuple(casts)
        c.members = tuple(c.dominant) + tuple(u for _, u in casts)
        c.outputs = tuple(absorbed.get(p, p) for p in c.dominant)
        plan.materialized -= set(absorbed)
        c.bytes_read, c.bytes_written = _combine_bytes(g, c)
        c.predicted_s = predict_seconds(c, opts.device)
    if drop:
        plan.steps = [s for s in plan.steps if not (isinstance(s, KernelPlan) and s.name in drop)]


def _kernel(name: str, grp: Group, g: ir.Graph, gv: GraphView, materialized: set[int],
            opts: PlanOptions) -> KernelPlan:
    members = tuple(sorted(grp.members))
    outputs = tuple(m for m in members if m in materialized)
    inputs: dict[int, None] = {}
    for m in members:
        for s in gv.sources[m]:
            if s not in grp.members:
                inputs[s] = None
    stitches = []
    for m in members:
        for s in gv.sources[m]:
            if s in grp.members:
                scheme = "regional" if g[s].numel < g[m].numel or g[s].kind == ir.REDUCE else "local"
                stitches.append((s, m, scheme))
    scatter = any(g[m].kind == ir.SCATTER_ADD for m in members)
    partials = tuple(sorted(grp.cross))
    full = grp.domain.rows * grp.domain.cols
    sizes = [g[i].dtype.itemsize for i in (*inputs, *outputs) if g[i].numel * 2 >= full and g[i].dtype is not None]
    # (the widest: a dropout's bool mask beside bf16 data is not 1-byte data; with it,
    # BERT's bf16 layer-norm tiles grew 4x to 97-128 registers and spilled for sm_90)
    # inputs that vary along a row (every element loads from each, a concatenation's
    # pieces included, masked or not), against per-row values such as a norm's weight
    along = sum(1 for i in inputs if g[i].numel > grp.domain.rows)
    # loads a thread issues for each element of a row it holds: every input read once per
    # index map (`cost.input_paths`: a pooling window's nine shifted reads of its input,
    # and of the per-channel values a normalisation recomputed at each offset reads)
    loads = sum(input_paths(g, members, tuple(inputs)).values())
    mp = mapping_rules.choose(grp.domain, opts, partials=bool(partials), itemsize=max(sizes, default=4),
                              row_values=along, row_loads=loads)
    if mp.segments > 1:
        # row segments combine reductions element-wise; a scan carries along the row, an
        # arg-reduction wants the first index, and register-heavy kernels are spread over
        # warps (`spread_for_registers`)
        unsegmented = any(g[m].kind == ir.SCAN or g[m].op in ("argmax", "argmin")
                          or g[m].op in mapping_rules.REGISTER_HEAVY for m in members)
        if partials and (unsegmented or any(g[m].kind == ir.REDUCE and m not in partials for m in members)):
            # rows as segments beside column partials (`mapping.segmented_partials`) hold a
            # vector of every segment a thread: with row reductions as well (Swin-T's
            # layer-norm backward over 384 columns) sm_90 took 255 registers where the
            # unsegmented tile took 124; so such kernels keep their tile
            mp = mapping_rules.choose(grp.domain, replace(opts, partial_segments=False), partials=True,
                                      itemsize=max(sizes, default=4))
        elif unsegmented:   # (warp rows without partials) one-warp programs instead
            mp = mapping_rules.warp_row_mapping(grp.domain.rows, grp.domain.cols, vec=1, warps=1)
    if any(g[m].op in mapping_rules.REGISTER_HEAVY for m in members):
        mp = mapping_rules.spread_for_registers(mp)
    scheme = "scatter" if scatter else ("regional" if any(s[2] == "regional" for s in stitches) else "local")
    kp = KernelPlan(name, members, outputs, tuple(inputs), grp.domain, mp, scheme, grp.dominant,
                    tuple(stitches), seeds=tuple(m for m in members if g[m].kind == ir.RAND),
                    partials=partials)
    if (mp.form == "pointwise" and opts.layout_order and not scatter and not opts.fixed_row_blocks
            and len(grp.domain.shape) > 1 and may_reorder(g, kp, outputs=True)):
        # accesses contiguous along another dim than the innermost: walk the domain in
        # that order, or in tiles where two layouts meet (plan/access.py)
        dom = layout_domain(g, kp)
        if dom is not None:
            if dom.is_flat:
                walked = replace(kp, domain=dom)
            else:
                full = grp.domain.rows
                itemsize = min(g[i].dtype.itemsize for i in kp.inputs + kp.outputs if g[i].numel >= full // 2)
                walked = replace(kp, domain=dom, mapping=mapping_rules.transpose_tile(dom, opts, itemsize))
            if generates(g, walked):
                kp, mp = walked, walked.mapping
    if (mp.form == "pointwise" and opts.row_values and not scatter and not opts.fixed_row_blocks
            and len(grp.domain.shape) > 1):
        # per-row values broadcast along long rows: read once a row, not once an element
        # (plan/access.py), where programs of whole rows are enough to fill the machine
        dom = row_values_domain(g, kp, min(sizes, default=4))
        if dom is not None:
            rowwise = replace(kp, domain=dom, mapping=mapping_rules.choose(dom, opts, itemsize=max(sizes, default=4)))
            if rowwise.mapping.grid >= ROW_VALUES_MIN_PROGRAMS_PER_SM * opts.device.sms and generates(g, rowwise):
                kp, mp = rowwise, rowwise.mapping
    if (mp.form == "pointwise" and opts.flat_row_runs and not scatter and mp.num_warps * 32 < mp.block_r
            and len(grp.domain.shape) > 1 and may_reorder(g, kp)):
        # reads in row runs that Triton would issue element by element (plan/access.py)
        if row_run_reads(g, kp):
            kp.mapping = mapping_rules.one_per_thread(mp)
            kp.row_runs = True
    if (partials and mp.form in ("packed_rows", "row_persistent") and opts.transposed_tiles
            and opts.looped_partials and not opts.fixed_row_blocks and not scatter and may_reorder(g, kp)):
        # a transposed read gets taller tiles than whole rows give (plan/access.py)
        reads = transposed_reads(g, kp)
        if reads:
            tall = replace(kp, mapping=mapping_rules.transposed_tile(grp.domain, opts,
                                                                     min(g[r].dtype.itemsize for r in reads)),
                           transposed=tuple(reads))
            if generates(g, tall):   # (a per-row value the looped form cannot reach keeps whole rows)
                kp = tall
    if partials and kp.mapping.form == "row_looped" and not kp.transposed and opts.partial_lanes:
        # every row of the tile in each thread: partial rows summed in registers (plan/mapping.py)
        lanes = replace(kp, mapping=mapping_rules.partial_lanes(kp.mapping, grp.domain.cols, min(sizes, default=4)))
        if lanes.mapping != kp.mapping and generates(g, lanes):
            kp = lanes
    walk_mode = opts.walk_looped_partials   # off | auto | on
    if (partials and kp.mapping.form == "row_looped" and not kp.transposed and walk_mode != "off"
            and not opts.fixed_row_blocks and not scatter and kp.mapping.row_blocks <= 1
            and kp.domain.rows > 2 * opts.device.sms):
        # the rows one at a time on a persistent grid, each program adding into its own
        # partial row: re-reads from L2, a smaller partial buffer (plan/mapping.py), where
        # the model prices the kernel and its combine lower (or always: `on`)
        elem_bytes = sum(g[i].dtype.itemsize for i in kp.inputs if g[i].numel >= full) + 4 * len(partials)
        walk = replace(kp, mapping=mapping_rules.walking_looped_partials(
            kp.domain.rows, kp.domain.cols, row_bytes(g, kp), len(partials), opts, elem_bytes))
        before, after = _with_combine(g, kp, opts), _with_combine(g, walk, opts)
        if (walk_mode == "on" or after < before) and generates(g, walk):
            walk.walk_note = (f"rows walked by {walk.mapping.grid} programs, partial rows accumulated: predicted "
                              f"{before * 1e6:.1f} -> {after * 1e6:.1f} us with the combine (knob "
                              f"walk_looped_partials={walk_mode})")
            kp = walk
    if (partials and kp.mapping.form in ("packed_rows", "row_persistent") and not kp.transposed
            and not opts.fixed_row_blocks and not scatter):
        # more bytes in flight a thread: taller row blocks (plan/mapping.py); only where
        # nothing full-size is written: a norm backward's tiles, taller, took 83-121
        # registers for sm_90 (64 before), too many for two 16-warp programs an SM
        bpe = sum(g[i].dtype.itemsize for i in kp.inputs if g[i].numel >= full)
        writes_rows = any(g[o].numel >= full for o in kp.outputs)
        deeper = kp.mapping if writes_rows else mapping_rules.deeper_partial_tile(
            kp.mapping, grp.domain.rows, bpe, len(partials), opts)
        if deeper != kp.mapping:
            tall = replace(kp, mapping=deeper)
            if generates(g, tall):
                kp = tall
    if (not partials and not scatter and opts.transposed_tiles and not opts.fixed_row_blocks
            and not grp.domain.is_flat and kp.mapping.block_r < 32
            and not any(g[m].kind == ir.SCAN for m in members) and may_reorder(g, kp)):
        # a row reduction over a transposed read: tiles a cache line tall (plan/access.py)
        reads = transposed_reads(g, kp)
        itemsize = min((g[r].dtype.itemsize for r in reads), default=4)
        tall_map = mapping_rules.transposed_rows(grp.domain, opts, itemsize) if reads else None
        if tall_map is not None and tall_map.block_r > kp.mapping.block_r:
            tall = replace(kp, mapping=tall_map, transposed=tuple(reads))
            if generates(g, tall):
                kp = tall
        elif reads and kp.mapping.block_r == 1 and opts.chained_columns:
            # too few rows for a program an SM in sector-tall tiles: taken where the model
            # prices the few tall programs below one row a program reading every element
            # in its own sector (the merge of batch-norm chunk statistics: 256 rows)
            few = mapping_rules.transposed_rows(grp.domain, opts, itemsize, few=True)
            tall = replace(kp, mapping=few, transposed=tuple(reads))
            if _priced(g, tall, opts) < _priced(g, kp, opts) and generates(g, tall):
                kp = tall
    if (kp.mapping.form in ("packed_rows", "row_persistent") and kp.mapping.block_c < 32 and not scatter
            and opts.transposed_tiles and may_reorder(g, kp)):
        # rows contiguous, few columns (a K/V gradient summed over its 4 query heads): Triton
        # vectorises along the rows and puts the warps the rows do not fill across the
        # columns, so the row reduction crossed warps through shared memory (sm_90 TTGIR of
        # LLaMA's GQA gradient at 16 warps: warpsPerCTA [4, 4], 3 layout conversions; at 4:
        # [4, 1], none; H200 2026-11-27: 150 µs a launch against 7.5 predicted)
        reads = kp.transposed or transposed_reads(g, kp)   # (probed already when the tile was made taller)
        if reads:
            vec = 16 // min(g[r].dtype.itemsize for r in reads)
            capped = mapping_rules.warps_along_rows(kp.mapping, vec)
            kp.own_warps = capped != kp.mapping
            kp.mapping = capped
    if (kp.mapping.form == "packed_rows" and not partials and not scatter and opts.transposed_row_warps
            and opts.transposed_tiles
            and not opts.fixed_row_blocks and not grp.domain.is_flat and not kp.own_warps
            and kp.mapping.grid >= 2 * opts.device.sms
            and not any(g[m].kind == ir.SCAN for m in members) and may_reorder(g, kp)):
        # whole rows read transposed: fewer warps, more elements a thread (plan/mapping.py),
        # where the grid keeps two programs an SM busy
        reads = kp.transposed or transposed_reads(g, kp)
        if reads:
            vec = 16 // min(g[r].dtype.itemsize for r in reads)
            warps = mapping_rules.transposed_row_warps(kp.mapping, vec)
            # (a horizontal group still runs it at the group's widest warps, as before)
            fewer = replace(kp, mapping=replace(kp.mapping, num_warps=warps))
            if warps < kp.mapping.num_warps and generates(g, fewer):
                kp = fewer
    if (kp.mapping.form == "row_looped" and not partials and not scatter and opts.persistent_rows
            and not opts.fixed_row_blocks and kp.domain.rows > 2 * opts.device.sms
            and max(input_passes(g, kp).values(), default=1) > 1):
        # rows read twice or more whose re-reads would miss L2: a persistent grid (plan/mapping.py)
        miss = reread_miss(g, kp, opts.device)
        walk = replace(kp, mapping=mapping_rules.persistent_looped(kp.domain.rows, kp.domain.cols,
                                                                   row_bytes(g, kp), opts))
        if miss > 0 and reread_miss(g, walk, opts.device) < miss and generates(g, walk):
            kp = walk
    if (kp.mapping.form == "row_looped" and opts.column_tails and not opts.fixed_row_blocks
            and kp.domain.cols % kp.mapping.block_c and kp.domain.cols > kp.mapping.block_c):
        kp.column_tail = True   # whole column blocks unmasked, the partial one apart (codegen)
        if (opts.align_rows and kp.mapping.block_r == 1 and kp.domain.cols >= kp.mapping.block_c + 16
                and not any(g[m].kind == ir.SCAN for m in kp.members)):
            from ..codegen.triton_kernel import row_alignment   # (code generation builds on plan data)
            try:
                kp.row_align = row_alignment(g, kp)   # whole blocks from a 16-byte boundary (codegen)
            except ix.IndexMismatch:
                # the probe generates the kernel, and this one's indices do not line up:
                # no anchor; the plan's validity check (`_invalid_kernels`) splits it
                kp.row_align = ()
    if not kp.domain.is_flat and not scatter and may_reorder(g, kp):
        # transposed reads whose runs fall short of a sector: priced as the sectors moved
        kp.sector_waste = sector_waste(g, kp, list(kp.transposed) or transposed_reads(g, kp))
    kp.exact_rows = opts.exact_rows and not opts.fixed_row_blocks
    # programs walking row blocks wait a memory latency per block unless the next block's
    # loads are issued first (codegen/prefetch.py; H200: 2.0-2.6x their bytes' time without)
    kp = _walk_prefetch(g, kp, opts)
    return _price(g, kp, opts)


def _price(g: ir.Graph, k: KernelPlan, opts: PlanOptions) -> KernelPlan:
    """`k` with the figures the cost model prices it by set from its mapping as it is:
    modelled bytes, the column blocks its programs load one after another, predicted time."""
    k.bytes_read, k.bytes_written = kernel_bytes(g, k, opts.device)
    k.loop_waits = loop_waits(g, k)
    k.predicted_s = predict_seconds(k, opts.device)
    return k


# prefetch (codegen/prefetch.py) holds a block's row loads for a whole step more: only where
# the programs an SM walks with leave a thread registers to spare (warps an SM at most this
# many: 128 registers a thread and more) and the loads held are at most PREFETCH_MAX_BYTES a
# thread (twice that at 8 warps an SM or fewer: 255 registers).  sm_90 (Triton 3.6): 16-warp
# walks went from 62-64 to 82-93 registers and their second program an SM no longer fit (a
# 264-program grid in two rounds); 8-warp walks over 8192-column tiles of float32 (256 bytes
# held) from 106-128 to 156-184; 4-warp bfloat16 walks holding 192 bytes (GPT-2's QKV bias
# gradient) stay at 127
PREFETCH_MAX_WARPS_PER_SM = 16
PREFETCH_MAX_BYTES = 128
# row-looped kernels (knob prefetch_columns): only persistent grids of at most 16 warps an SM
# whose threads hold at most this many elements of a column block.  sm_90 (Triton 3.6), the
# [1, 8192] 16-warp walks of the N=32768 norms and softmax, one program an SM: 59-92 ->
# 104-128 registers, no spill; column-partial kernels ([4, 1024-2048] tiles at 8 warps, two
# an SM, 32 elements a thread and float32 accumulators as many) went 64-69 -> 128-174 (one
# program an SM, or spills), and 16-warp walks two an SM 60 -> 64-85: neither is prefetched
COLUMN_PREFETCH_MAX_ELEMS = 16


def _prefetch_misfit(g: ir.Graph, kp: KernelPlan, opts: PlanOptions) -> str:
    """Why the walk's programs cannot hold the next block's loads ('' where they can)."""
    m = kp.mapping
    warps_per_sm = m.num_warps * -(-m.grid // opts.device.sms)
    if warps_per_sm > PREFETCH_MAX_WARPS_PER_SM:
        return (f"{warps_per_sm} warps an SM (more than {PREFETCH_MAX_WARPS_PER_SM}: the held loads would cost "
                "a program its place on the SM)")
    full = kp.domain.rows * kp.domain.cols
    held = sum(g[i].dtype.itemsize for i in kp.inputs if g[i].numel >= full) * m.block_r * m.block_c
    budget = PREFETCH_MAX_BYTES * (2 if 2 * warps_per_sm <= PREFETCH_MAX_WARPS_PER_SM else 1)
    threads = m.num_warps * 32
    return "" if held <= budget * threads else f"{held / threads:g} bytes of loads held a thread (more than {budget})"


def _walk_prefetch(g: ir.Graph, kp: KernelPlan, opts: PlanOptions) -> KernelPlan:
    """Whether `kp`'s walk over row blocks issues the next block's loads first (`KernelPlan.
    prefetch`), and at which warps.  Where its programs cannot hold those loads (`_prefetch_misfit`:
    16-warp tiles two an SM), the same walk at half the warps (`mapping.narrower_walk`, knob
    `narrow_walks`) is taken with prefetch when the cost model prices it lower: layer_norm_bwd
    [32768 x 1024] bf16 walked 32 blocks of [4, 1024] at 16 warps, no prefetch, 85 µs of device
    time on the H200 for 47.7 µs of bytes (2026-11-30: a latency a block, 0.75 µs); at 8 warps,
    63 blocks of [2, 1024] prefetched, the model prices max(bytes, 63 latencies) = 48 µs.
    A row-looped kernel on a persistent grid prefetches its column loops instead (knob
    `prefetch_columns`), where its registers allow (COLUMN_PREFETCH_MAX_ELEMS)."""
    if kp.mapping.form == "row_looped":
        # a persistent grid walking rows in column blocks: the same wait a block, hidden the
        # same way, in each loop over the row (codegen/emit_core.py::_column_loop)
        m = kp.mapping
        warps_per_sm = m.num_warps * -(-m.grid // opts.device.sms)
        kp.prefetch = (opts.prefetch_columns and m.row_blocks > 1 and not kp.partials
                       and warps_per_sm <= PREFETCH_MAX_WARPS_PER_SM
                       and m.block_r * m.block_c <= COLUMN_PREFETCH_MAX_ELEMS * 32 * m.num_warps
                       and isinstance(kp.domain.cols, int) and kp.domain.cols > m.block_c)
        return kp
    if not (opts.prefetch_rows and kp.walks_rows and kp.mapping.form in ("row_persistent", "packed_rows")):
        return kp
    why = _prefetch_misfit(g, kp, opts)
    if not why:
        kp.prefetch = True
        return kp
    if opts.narrow_walks:
        rows, cols = kp.domain.rows, kp.domain.cols
        narrow = mapping_rules.narrower_walk(kp.mapping, rows, cols, opts) or mapping_rules.fewer_walkers(
            kp.mapping, rows, cols, opts)
        cand = replace(kp, mapping=narrow, prefetch=True) if narrow is not None else None
        if cand is not None:
            how = (f"at {narrow.num_warps} warps, [{narrow.block_r}, {narrow.block_c}] tiles"
                   if narrow.num_warps != kp.mapping.num_warps else f"at {narrow.grid} programs")
            misfit = _prefetch_misfit(g, cand, opts)
            before, after = _priced(g, kp, opts), _priced(g, cand, opts)
            if not misfit and after < before and generates(g, cand):
                cand.walk_note = (f"planned {how} so that it prefetches (as planned: {why}): predicted "
                                  f"{before * 1e6:.1f} -> {after * 1e6:.1f} us (knob narrow_walks)")
                return cand
            if misfit:
                why += f"; {how}: {misfit}"
            elif after >= before:
                why += f"; {how}: predicted {after * 1e6:.1f} us, not below {before * 1e6:.1f}"
            else:
                why += f"; {how}: its kernel did not generate"
    kp.walk_note = f"no prefetch: {why}"
    return kp


def _with_combine(g: ir.Graph, k: KernelPlan, opts: PlanOptions) -> float:
    """`k`'s predicted time as planned so far (`_priced`) and that of the combine that will
    reduce its partial rows (`_combine`)."""
    return _priced(g, k, opts) + _combine("combine_probe", k, g, opts).predicted_s


def _priced(g: ir.Graph, k: KernelPlan, opts: PlanOptions) -> float:
    """`k`'s predicted time as planned so far, its transposed reads' wasted sectors in."""
    k = replace(k, sector_waste=sector_waste(g, k, list(k.transposed) or transposed_reads(g, k)))
    return _price(g, k, opts).predicted_s


ROW_VALUES_MIN_PROGRAMS_PER_SM = 4   # row_values: programs of whole rows, enough to fill the machine


def _combine(name: str, k: KernelPlan, g: ir.Graph, opts: PlanOptions) -> KernelPlan:
    """One launch that reduces the per-program partials of all of `k`'s column
    reductions (sum, max, min or prod over the programs axis)."""
    cols = max(g[n].numel for n in k.partials)
    rows = k.mapping.grid
    # (programs of fewer warps, column lanes: the combine tiled for as few, so that a
    # global launch of the two keeps them)
    mp = mapping_rules.combine_mapping(rows, cols, opts, k.mapping.num_warps if k.mapping.column_lanes else 16)
    kp = KernelPlan(name, k.partials, k.partials, (), Domain((rows, cols), (1,)), mp, "combine", k.partials, (),
                    combine_of=k.name)
    kp.bytes_read, kp.bytes_written = _combine_bytes(g, kp)
    kp.predicted_s = predict_seconds(kp, opts.device)
    return kp


def _combine_bytes(g: ir.Graph, c: KernelPlan) -> tuple[int, int]:
    """A combine's modelled bytes: its partial rows (float32, one a program of the kernel it
    combines) and its epilogue's inputs read, its outputs written."""
    rows = c.domain.shape[0]
    read = (sum(rows * g[p].numel * 4 for p in c.dominant)
            + sum(g[i].numel * g[i].dtype.itemsize for i in c.inputs))
    return read, sum(g[o].numel * g[o].dtype.itemsize for o in c.outputs)


def _schedule(g: ir.Graph, gv: GraphView, groups: list[Group], group_of: dict[int, Group]) -> list:
    """Topological order of kernels and eager ops (views and constants need no step)."""
    unit_of: dict[int, object] = {}
    for grp in groups:
        for m in grp.members:
            unit_of[m] = grp.gid
    eager = [n.id for n in g.nodes if n.kind in (ir.OPAQUE, ir.ITEM)]
    for e in eager:
        unit_of[e] = ("eager", e)
    deps: dict[object, set] = {u: set() for u in set(unit_of.values())}
    inverse: dict[int, set[int]] = {n.id: set() for n in g.nodes}
    for p, us in gv.users.items():
        for u in us:
            inverse[u].add(p)
    for n in g.nodes:
        u = unit_of.get(n.id)
        if u is None:
            continue
        for s in _real_preds(g, gv, inverse, n.id):
            su = unit_of.get(s)
            if su is not None and su != u:
                deps[u].add(su)
    key: dict[object, int] = {}
    for m, u in unit_of.items():
        key[u] = min(key.get(u, m), m)
    users: dict[object, list] = {u: [] for u in deps}
    for u, ds in deps.items():
        for d in ds:
            users[d].append(u)
    indeg = {u: len(ds) for u, ds in deps.items()}
    heap = [(key[u], str(u), u) for u, d in indeg.items() if d == 0]
    heapq.heapify(heap)
    order = []
    by_gid = {grp.gid: grp for grp in groups}
    while heap:
        _, _, u = heapq.heappop(heap)
        order.append(by_gid[u] if not isinstance(u, tuple) else u[1])
        for v in users[u]:
            indeg[v] -= 1
            if indeg[v] == 0:
                heapq.heappush(heap, (key[v], str(v), v))
    if len(order) != len(deps):
        raise RuntimeError("plan has a cycle between kernels (planner bug)")
    return order


def _real_preds(g: ir.Graph, gv: GraphView, inverse: dict[int, set[int]], nid: int) -> set[int]:
    """Data producers (through free nodes) plus mutation-fence predecessors."""
    return set(gv.sources[nid]) | {p for p in inverse[nid] if not is_free(g[p])}


__all__ = ["build_plan"]
