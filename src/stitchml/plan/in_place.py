"""In-place writes of graph inputs: which new values a kernel may write straight into
the input's own buffer (`Graph.input_writes`: an optimizer step's parameters and
moments, a batch-norm buffer updated under `no_grad`).

Written in place, an AdamW step over fp32 parameters moves 28 bytes an element (read
parameter, gradient and two moments, write three); written to fresh buffers and copied
back after the call (AOTAutograd's way without `keep_inference_input_mutations`), 52.

The kernel that computes the new value overwrites the old one, so it may do so only
when nothing reads an old element after it is overwritten:
- every reader of the input outside that kernel is launched before it, and not in its
  launch group (a horizontal group's bodies run side by side, a global group's phases
  share one launch);
- inside the kernel, the input is read only element-wise at the element being written,
  by members the new value is computed from: a kernel over the input's shape in which
  one program reads and writes each element in one pass (point-wise, or rows held
  whole on chip), or a combine's epilogue over the input's elements (one program a
  column: a batch norm's running statistics), whose members read the input through
  element-wise steps only (no view, no broadcast), so each element is loaded before
  the store that depends on it, and no other program touches it; and the new value is
  computed from those reads through element-wise steps too (`_aligned`: a flip between
  them reads a mirrored element another program may have overwritten), and it does not
  itself read the input through a view or a concatenation evaluated where it is read (a
  rotation `x.copy_(cat([x[1:], x[:1]]))`); nor does another output of the kernel take a
  value computed from the input through a view, a concatenation or a gather (`_reindexed`:
  the kernel evaluates that value at other indices, a load of the input emitted after
  the store; fuzz seed 53791: `v.diagonal(0, 0, 2).add_(1)` of a value computed from x,
  in the kernel that wrote x in place, read x's diagonal elements already overwritten);
- neither the input nor a view of it is returned (the caller would hold the new value
  where the graph returned the old);
- no as_strided reads the input's storage by position (`rules_views.storage_read`).
Otherwise the value is written to a buffer of its own and copied into the input after
the call, with the reason (shown by `explain`).  The decision is plain data on the plan
(`Plan.in_place`), made after launch grouping, which fixes the launch order.
"""
from __future__ import annotations

from ..ir import nodes as ir
from .data import EagerStep, KernelPlan, Plan
from .graph_view import is_free


def in_place_writes(plan: Plan) -> dict[int, str | None]:
    """For each in-place write's new value (node id): None where its kernel writes it
    into the input's buffer, else the reason it is copied there after the call."""
    g = plan.graph
    written = g.written()
    if not written:
        return {}
    kernels_of: dict[int, list[KernelPlan]] = {}
    for k in plan.kernels:
        for m in k.members:
            kernels_of.setdefault(m, []).append(k)
    launch = _launch_positions(plan)
    returned = {r.id for r in g.returned if isinstance(r, ir.Ref)}
    users = g.users()   # (once: an optimizer step writes hundreds of inputs)
    # inputs an as_strided reads by storage position (`rules_views.storage_read`): a
    # reader no view chain of the input shows, so the order of writes is not known
    by_storage = g.read_by_position()
    out: dict[int, str | None] = {}
    for pos, new in written:
        if pos in by_storage:
            out[new] = "an as_strided reads the input's storage by position (between or past its elements)"
            continue
        out[new] = _refusal(g, plan, g.inputs[pos], new, kernels_of, launch, returned, users)
    return out


def _launch_positions(plan: Plan) -> dict[object, int]:
    """Launch order of each kernel (by name) and eager step (by node id): a launch
    group's kernels all launch where its first member stands."""
    first: dict[str, int] = {}
    out: dict[object, int] = {}
    for i, s in enumerate(plan.steps):
        if isinstance(s, KernelPlan):
            grp = plan.group_of(s.name)
            out[s.name] = first.setdefault(grp.name, i) if grp is not None else i
        elif isinstance(s, EagerStep):
            out[s.node] = i
    return out


def _refusal(g: ir.Graph, plan: Plan, x: int, new: int, kernels_of: dict, launch: dict,
             returned: set[int], users: dict[int, list[int]]) -> str | None:
    writers = kernels_of.get(new, [])
    if len(writers) != 1 or new not in writers[0].outputs:
        return "its new value is not written by one kernel"
    k = writers[0]
    if g[new].stride != g[x].stride:
        return "its new value is laid out otherwise than the input"
    if x in returned:
        return "the input is also returned"
    group = plan.group_of(k.name)
    inside = set(k.members)
    feeding = _feeding(g, new, inside)
    aligned = _aligned(g, new, g[x].shape)
    for r, elementwise in _readers(g, x, users):
        n = g[r]
        if r in returned and n.kind == ir.VIEW:
            return f"a view of it (%{r} {n.op}) is also returned"
        if is_free(n):
            continue   # (evaluated where it is read: its readers are among the readers)
        if r == new:
            if not elementwise:   # (fuzz seed 32227: `x.copy_(cat([x[1:], x[:1]]))`, the cat evaluated
                # where read, so the new value itself loaded x rotated; another program had overwritten it)
                return (f"its new value (%{r} {n.op}) reads it at other elements than it writes, through a "
                        "view or a concatenation of its parts")
            continue
        if r in inside:
            if k.combine_of:
                # a combine's epilogue: per column, after its reductions, each column owned by
                # one program (a batch norm's running statistics updated in place)
                if r not in k.epilogue or new not in k.epilogue or g[x].numel != g[k.dominant[0]].numel:
                    return f"kernel {k.name}, which writes it, reads it in a combine outside its epilogue"
            elif not _owns_elements(k):
                return f"kernel {k.name}, which writes it, reads it in a {k.mapping.describe()} kernel"
            elif tuple(k.domain.shape) != tuple(g[x].shape):
                return (f"kernel {k.name}, which writes it, spans {tuple(k.domain.shape)}, not the input's "
                        f"{tuple(g[x].shape)}")
            if not elementwise or n.kind != ir.POINTWISE or n.shape != g[x].shape:
                return f"kernel {k.name}, which writes it, reads it other than element-wise (%{r} {n.kind}.{n.op})"
            if r not in feeding:
                return f"kernel {k.name}, which writes it, reads it for another value (%{r} {n.op})"
            if r not in aligned:
                return (f"kernel {k.name}, which writes it, reads it (%{r} {n.op}) at other elements than it "
                        "writes: the new value is computed from it through a view")
        # (a combine kernel holds a column reduction as a member but reads its partials, not
        # the input: except in its epilogue, whose members read what they use (fuzz seed
        # 28251: a softmax's normaliser divided by a function of the input, in a combine's
        # epilogue launched after the kernel that overwrote the input); a member recomputed
        # in several kernels is read in each)
        others = [o for o in kernels_of.get(r, []) if o is not k and (not o.combine_of or r in o.epilogue)]
        for o in others:
            if group is not None and plan.group_of(o.name) is group:
                return f"kernel {o.name} reads it in the same launch ({group.kind} {group.name})"
            if launch[o.name] >= launch[k.name]:
                return f"kernel {o.name} reads it after kernel {k.name} writes it"
        if r in launch and launch[r] >= launch[k.name]:
            return f"eager op %{r} ({n.op}) reads it after kernel {k.name} writes it"
        if r not in inside and r not in kernels_of and r not in launch:
            return f"%{r} ({n.op}) reads it outside any kernel or eager step"
    far = _reindexed(g, x, inside, users)
    if far is not None:
        return (f"kernel {k.name}, which writes it, also reads a value computed from it through "
                f"%{far} {g[far].kind}.{g[far].op}: at other elements, possibly after the store")
    return None


def _readers(g: ir.Graph, x: int, users: dict[int, list[int]]) -> list[tuple[int, bool]]:
    """Every node that reads input `x`, directly or through free nodes (views, and values
    computed where they are read: casts of inputs, recomputed chains), each with whether
    every path from `x` to it is element-wise (through free point-wise nodes of `x`'s
    shape only, no view)."""
    shape = g[x].shape
    ew_of: dict[int, bool] = {}
    stack = [(x, True)]
    while stack:
        nid, ew = stack.pop()
        for u in users[nid]:
            prev = ew_of.get(u)
            if prev is not None and (prev is False or ew):
                continue   # (nothing new along this path)
            ew_of[u] = ew if prev is None else False
            n = g[u]
            if is_free(n):
                stack.append((u, ew_of[u] and n.kind == ir.POINTWISE and n.shape == shape))
    return list(ew_of.items())


def _reindexed(g: ir.Graph, x: int, inside: set[int], users: dict[int, list[int]]) -> int | None:
    """A view, concatenation or gather inside the kernel (a member, or a free node it
    evaluates) of a value computed from input `x`, or None.  The kernel pulls that value
    at the view's indices, loading `x` at other elements than the one being written: the
    load is a different expression from the element's own, not shared with it, and may be
    emitted after the store that overwrote the element."""
    seen: set[int] = set()
    stack = [x]
    while stack:
        for u in users[stack.pop()]:
            if u in seen or not (u in inside or is_free(g[u])):
                continue
            seen.add(u)
            n = g[u]
            if n.kind in (ir.VIEW, ir.CAT, ir.GATHER) and x not in n.refs:
                return u   # (a view of x itself: `_readers` says how it is read)
            stack.append(u)
    return None


def _owns_elements(k: KernelPlan) -> bool:
    """Each element of the kernel's domain is read and written by one program, in one
    pass: point-wise kernels, and rows held whole on chip (no looped walk of a row that
    could read an element again after a pass wrote it; no column partials)."""
    m = k.mapping
    if m.form == "pointwise":
        return True
    return m.form in ("row_persistent", "packed_rows") and m.row_blocks == 1 and not k.partials


def _feeding(g: ir.Graph, new: int, inside: set[int]) -> set[int]:
    """Members of the kernel (and free nodes it evaluates) that the new value is computed
    from: their loads precede its store by data dependence (a load feeding only another
    value may be emitted after the store)."""
    seen: set[int] = set()
    stack = [new]
    while stack:
        for r in g[stack.pop()].refs:
            if r not in seen and (r in inside or is_free(g[r])):
                seen.add(r)
                stack.append(r)
    return seen


def _aligned(g: ir.Graph, new: int, shape: tuple) -> set[int]:
    """The nodes the new value is computed from through element-wise steps of the input's
    shape only (point-wise nodes, no view): a reader of the input among them reads the
    element being written.  Fuzz seed 29842: `x.copy_(erf(x).flip(0))` read x element-wise
    into `erf` but wrote each element from the erf of the mirrored row, which another
    program overwrote first (bfloat16, three programs of four rows)."""
    seen = {new}
    stack = [new]
    while stack:
        n = g[stack.pop()]
        if n.kind != ir.POINTWISE or n.shape != shape:
            continue
        for r in n.refs:
            if r not in seen and g[r].kind == ir.POINTWISE and g[r].shape == shape:
                seen.add(r)
                stack.append(r)
    return seen


__all__ = ["in_place_writes"]
