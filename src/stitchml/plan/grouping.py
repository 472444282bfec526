"""Planner v1: the AStitch rules.

Dominant ops are reductions (and expensive element-wise ops feeding a broadcast).
Walking the graph in topological order, each kernel member tries to join the kernel
of each producer; a join is legal when the two iteration domains are compatible
(local stitching: same element count; regional stitching: a per-row value feeding
its row) and no cycle through an outside node results.  Every refusal is recorded.
"""
from __future__ import annotations

from dataclasses import dataclass, field


from ..ir import nodes as ir
from .data import Domain, Refusal
from .mapping import looped_rows, fits_on_chip, partials_fit
from .options import PlanOptions
from .graph_view import EXPENSIVE, GraphView, is_free, is_member
from .window_reads import window_readers


@dataclass
class Group:
    gid: int
    members: set[int]
    domain: Domain
    dominant: tuple[int, ...] = ()
    rowwise: bool = False  # domain was chosen by a reduction or an expensive broadcast
    cross: set[int] = field(default_factory=set)  # column reductions: across rows, combined after
    # kept up to date by `Grouper._merge`, so that a merge test costs the size of a group's
    # boundary, not of the group: greedy merging grows one group over thousands of nodes
    # (an unrolled 100-step simulation), and a test that walked every member was quadratic
    scatter: bool = False                          # a member is a scatter-add
    frontier: set[int] = field(default_factory=set)   # users of members, outside the group
    top: int = -1                                  # the highest member id
    low: int = -1                                  # the lowest member id


LEAF_MAX_ELEMS = 1024   # `_merge_input_leaves`: kernels this small are all launch
REREAD_MAX_COLS = 16    # `Grouper._rereads_reduction`: reductions this short are recomputed at other rows


class _PrefixMax:
    """Prefix maxima over node ids, values only growing (a Fenwick tree): at a group's
    lowest member id, its highest; `upto(i)` is the highest member id of any group whose
    lowest is at most i.  (A merged group covers both old intervals, so the stale entry of
    a group merged away never exceeds the entry of the group it went into.)"""

    def __init__(self, n: int):
        self.tree = [-1] * (n + 1)

    def raise_to(self, i: int, v: int) -> None:
        i += 1
        while i < len(self.tree):
            if self.tree[i] < v:
                self.tree[i] = v
            i += i & -i

    def upto(self, i: int) -> int:
        i, best = min(i + 1, len(self.tree) - 1), -1
        while i > 0:
            best = max(best, self.tree[i])
            i -= i & -i
        return best


class Grouper:
    def __init__(self, gv: GraphView, opts: PlanOptions, forbidden: frozenset = frozenset(),
                 cuts: dict[int, str] | None = None):
        # pairs of dominant ops whose kernels must stay apart, and singletons: dominant
        # ops that must not absorb an element-wise consumer group (a dry
        # run of code generation showed their index spaces do not line up)
        self.forbidden = forbidden
        # values written once rather than computed again at each of many index maps
        # (`window_reads.heavy_window_reads`), with their window readers and the reason
        users = gv.g.users() if cuts else {}
        self.cuts = {m: (window_readers(gv.g, m, users), why) for m, why in (cuts or {}).items()}
        self.opts = opts
        self.gv = gv
        self.g = gv.g
        self.group_of: dict[int, Group] = {}
        self.refusals: list[Refusal] = []
        self._next = 0
        # column reductions over long rows kept out of row kernels (a first pass found no
        # row reduction beside them: their partials would only add bytes)
        self._plain_columns: set[int] = set()
        # column reductions over long rows of a buffer that a kernel with column partials
        # over the same rows reads (a layer norm's bias gradient beside its weight gradient):
        # taken in as one more partial (`_column_siblings`)
        self._sibling_columns: set[int] = set()
        # the groups' member-id spans, for the cycle test's bound (made afresh by `_run_once`)
        self._spans = _PrefixMax(0)
        self._chained = _chained_columns(self.g) if opts.chained_columns else frozenset()

    # -- initial groups -----------------------------------------------------
    def _new_group(self, n: ir.Node) -> Group:
        if n.kind == ir.REDUCE:
            src = self.g[n.refs[0]]
            if self._column_reduce(n, src):
                kept = tuple(d for d in range(len(src.shape)) if d not in n.attr("dims"))
                grp = Group(self._next, {n.id}, Domain(src.shape, kept), (n.id,), True, {n.id})
            else:
                grp = Group(self._next, {n.id}, Domain(src.shape, n.attr("dims")), (n.id,), True)
        elif n.kind == ir.SCAN:
            # the scanned dim runs along the program's column axis, like a reduced dim
            grp = Group(self._next, {n.id}, Domain(n.shape, (n.attr("dim"),)), (n.id,), True)
        elif n.kind == ir.SCATTER_ADD:
            src = self.g[n.refs[0]]
            grp = Group(self._next, {n.id}, Domain(src.shape, (len(src.shape) - 1,)), (n.id,), True)
        else:
            grp = Group(self._next, {n.id}, Domain(n.shape))
        grp.scatter = n.kind == ir.SCATTER_ADD
        grp.frontier = set(self.gv.users[n.id]) - {n.id}
        grp.top = grp.low = n.id
        self._spans.raise_to(n.id, n.id)
        self._next += 1
        return grp

    def _merge(self, keep: Group, gone: Group) -> None:
        """`gone`'s members into `keep`, with the cached fields (the caller sets the
        domain, dominant ops and column reductions)."""
        keep.members |= gone.members
        keep.frontier = {u for u in keep.frontier | gone.frontier if u not in keep.members}
        keep.scatter = keep.scatter or gone.scatter
        keep.top = max(keep.top, gone.top)
        keep.low = min(keep.low, gone.low)
        self._spans.raise_to(keep.low, keep.top)
        for m in gone.members:
            self.group_of[m] = keep

    def _column_reduce(self, n: ir.Node, src: ir.Node) -> bool:
        """A column reduction computed as per-program partials.  Over rows too long for
        the chip only where it sums something computed in a kernel (a norm backward's
        g * xhat) and, as `run` checks, only where a row reduction shares its kernel:
        then the summed value never goes to memory.  A lone column sum of long rows stays
        a reduction of its own (its partials would only add bytes)."""
        if not is_column_reduce(n, src, self.opts, self.g):
            return False
        if self.opts.chained_columns and not self.opts.fixed_row_blocks and n.id in self._chained:
            return False   # a row reduction, read transposed in tall tiles (`_chained_columns`)
        if fits_on_chip(n.numel, self.opts):
            return True
        if n.id in self._plain_columns:
            return False
        if n.id in self._sibling_columns:
            return True
        rows = src.numel // max(n.numel, 1)
        producers = [self.group_of[s] for s in self.gv.sources[n.id] if s in self.group_of]
        return any((p.domain.rows, p.domain.cols) == (rows, n.numel) if not p.domain.is_flat
                   else _numel(p.domain) == rows * n.numel for p in producers)

    def run(self) -> list[Group]:
        groups = self._run_once()
        siblings = self._column_siblings(groups)
        if siblings:   # plan again with those as partials, for `_merge_siblings` to take in
            self._sibling_columns |= siblings
            self.group_of, self.refusals, self._next = {}, [], 0
            groups = self._run_once()
        lone = {c for grp in groups if grp.cross and not fits_on_chip(grp.domain.cols, self.opts)
                and not any(self.g[m].kind in (ir.REDUCE, ir.SCAN) and m not in grp.cross for m in grp.members)
                for c in grp.cross}
        if lone:   # plan again with those column reductions as reductions of their own
            self._plain_columns |= lone
            self.group_of, self.refusals, self._next = {}, [], 0
            groups = self._run_once()
        return groups

    def _column_siblings(self, groups: list[Group]) -> set[int]:
        """Column reductions over rows too long for the chip, planned as reductions of
        their own because nothing they sum is computed in a kernel (the bias gradient
        sum_rows dy of a norm backward: dy is a graph input), whose buffer a kernel with
        column partials over the same rows x cols reads anyway (the row-looped kernel
        that takes dx and the weight gradient's partials reads dy): as one more partial
        of that kernel the buffer is read once instead of twice.  Only where that saves
        bytes: the partial rows cost 8 bytes (a float32 written and read back) per column
        and R rows of the kernel (`mapping.looped_rows`), against the buffer's itemsize per
        element read again: float32 dy at R = 4 (2 < 4 bytes), not bfloat16 (a tie)."""
        found: set[int] = set()
        partial_kernels = [g for g in groups if g.cross and not g.domain.is_flat]
        if not partial_kernels:
            return found
        for grp in groups:
            if grp.cross or len(grp.dominant) != 1:
                continue
            n = self.g[grp.dominant[0]]
            if n.kind != ir.REDUCE or n.id in self._plain_columns:
                continue
            src = self.g[n.refs[0]]
            if not is_column_reduce(n, src, self.opts, self.g) or fits_on_chip(n.numel, self.opts):
                continue
            rows = src.numel // max(n.numel, 1)
            reads = self._reads(grp)
            for other in partial_kernels:
                if (other.domain.rows, other.domain.cols) != (rows, n.numel):
                    continue
                shared = reads & self._reads(other)
                itemsize = max((self.g[s].dtype.itemsize for s in shared if self.g[s].dtype is not None), default=0)
                if itemsize * looped_rows(rows, self.opts) > 8:
                    found.add(n.id)
                    break
        return found

    def _reads(self, grp: Group) -> set[int]:
        """The values a group's kernel reads from outside it."""
        return {s for m in grp.members for s in self.gv.sources[m] if s not in grp.members}

    def _run_once(self) -> list[Group]:
        self._spans = _PrefixMax(max((n.id for n in self.g.nodes), default=0) + 1)
        for n in self.g.nodes:
            if not is_member(n):
                continue
            self.group_of[n.id] = self._new_group(n)
            for src in self.gv.sources[n.id]:
                if src in self.group_of and self.group_of[src] is not self.group_of[n.id]:
                    self._try_merge(src, n.id)
        self._merge_siblings()
        self._merge_input_leaves()
        groups = {id(g): g for g in self.group_of.values()}
        return sorted(groups.values(), key=lambda g: min(g.members))

    def _merge_input_leaves(self) -> None:
        """Tiny element-wise kernels that read nothing but graph inputs, of one domain,
        become one kernel: a training step's batch-norm counters (`num_batches_tracked + 1`,
        one element each, 53 in ResNet-50) are 53 launches of no work apart.  They read
        no value a kernel computes, so only a mutation fence (an eager op writing an input
        between the two reads) could order them: the cycle test still decides; their
        buffers live for the whole call anyway."""
        if not self.opts.sibling_fusion:
            return
        first: dict[tuple, Group] = {}
        for grp in sorted({id(g): g for g in self.group_of.values()}.values(), key=lambda g: min(g.members)):
            if (grp.rowwise or grp.cross or grp.scatter or _numel(grp.domain) > LEAF_MAX_ELEMS
                    or any(self.g[s].kind != ir.INPUT for s in self._reads(grp))):
                continue
            keep = first.setdefault(tuple(grp.domain.shape), grp)
            if keep is not grp and not self._creates_cycle(keep, grp) and self._cut_apart(keep, grp) is None:
                self._merge(keep, grp)

    def _merge_siblings(self) -> None:
        """Operator-level reuse: kernels with the same domain that read the same
        buffer (dγ and dβ of a norm backward, several bias gradients of one tensor,
        element-wise ops of one input such as a rotary embedding's halves) become one
        kernel, so the shared operand is loaded once and one launch does the work; and
        column reductions over the outputs of one multi-output op (`_one_origin`)."""
        readers: dict[int, list[Group]] = {}
        for grp in {id(g): g for g in self.group_of.values()}.values():
            if grp.scatter:
                continue
            for s in self._reads(grp):
                readers.setdefault(s, []).append(grp)
            origin = self._one_origin(grp) if self.opts.multi_output_siblings else None
            if origin is not None:
                # (keyed apart from node ids: negative)
                readers.setdefault(-1 - origin, []).append(grp)
        for s, grps in readers.items():
            # every pair (not only the first reader with each other one: a norm backward's
            # row kernel reads dy first, and the two column sums that read it after it
            # share a domain with each other, not with it)
            for i, j in ((i, j) for j in range(1, len(grps)) for i in range(j)):
                a, b = self.group_of[min(grps[i].members)], self.group_of[min(grps[j].members)]
                if a is b or a.rowwise != b.rowwise:
                    continue
                if a.rowwise and (a.domain.rows, a.domain.cols) != (b.domain.rows, b.domain.cols):
                    continue
                if not a.rowwise and (a.domain.shape != b.domain.shape or not self.opts.sibling_fusion):
                    continue
                if not a.rowwise and self._serial_siblings(s, a):
                    continue
                if self._forbidden(a, b) or self._reads_cross(a, b) or self._reads_cross(b, a):
                    continue  # a reader of a column reduction needs the combined value
                if self._cut_apart(a, b) is not None:
                    continue
                if any(frozenset((d,)) in self.forbidden for d in (*a.dominant, *b.dominant)):
                    continue  # a dry run failed for this reduction's kernel: no more members (seed 12021)
                if self._creates_cycle(a, b):
                    continue
                keep, gone = (a, b) if len(a.members) >= len(b.members) else (b, a)
                if (a.cross or b.cross) and not partials_fit(a.domain.rows, a.domain.cols, self.opts):
                    continue
                keep.dominant = tuple(sorted(set(a.dominant) | set(b.dominant)))
                keep.cross = a.cross | b.cross
                self._merge(keep, gone)

    def _serial_siblings(self, shared: int, grp: Group) -> bool:
        """Point-wise siblings whose only common read is small (an optimizer's 0-d bias
        correction, read by the update of every parameter) save no memory traffic by
        sharing a kernel, only a launch, and each merged body is more serial work for the
        same programs.  Those are left to launch grouping, which runs each body on programs
        of its own.  Measured (H200, 2026-11-30, BERT-base AdamW step, bf16): the 49
        updates of the 768 x 768 weights merged into one kernel of 576 programs took
        402 us for 405 MB (25% of copy bandwidth; 99 us predicted), the 12 updates of
        each FFN weight 159 us for 396 MB, where the word-embedding update alone, one body
        over 11446 programs, ran at 100%.  (Forty-sixth session: refused only where the
        domain filled fewer programs than SMs.)"""
        return not (self.opts.serial_siblings or shared < 0 or self.g[shared].numel * 8 > _numel(grp.domain))

    def _one_origin(self, grp: Group) -> int | None:
        """The multi-output op all of a column-reduction kernel's reads are outputs of
        (an attention backward's query, key and value gradients, read by their three
        bias gradients), else None.  Such kernels merge although they read different
        buffers: one launch of partials and one combine instead of one of each per
        output, and since the buffers appear together, no lifetime grows (kernels that
        are merely independent, such as two layers' bias gradients, are left apart: one
        would keep its input alive until the other's is ready)."""
        if not grp.cross or any(d not in grp.cross for d in grp.dominant):
            return None
        origins = set()
        for s in self._reads(grp):
            n = self.g[s]
            if n.kind != ir.ITEM:
                return None
            origins.add(n.refs[0])
        return origins.pop() if len(origins) == 1 else None

    # -- merging --------------------------------------------------------------
    def _try_merge(self, producer: int, consumer: int) -> None:
        a, b = self.group_of[producer], self.group_of[consumer]
        reason = None
        if self.g[producer].kind == ir.SCATTER_ADD:
            reason = "reads a scatter's result: complete only when every program of the scatter kernel has added"
        elif self._has_scatter(a) or self._has_scatter(b):
            if not (self.g[consumer].kind == ir.SCATTER_ADD and self._feeds_only(a, b, consumer)):
                reason = "a scatter kernel takes in only element-wise producers of its values and index"
        elif producer in a.cross or self._reads_cross(a, b) or self._reads_cross(b, a):
            reason = "consumer of a column reduction needs the combined value (read after the combine)"
        elif (again := self._rereads_reduction(a, b)) is not None or (again := self._rereads_reduction(b, a)) is not None:
            reason = (f"reads node {again} (after a reduction) through a slice at other rows: the kernel would "
                      "compute that reduction again there, a second pass over its input")
        dom = None
        if reason is None and (why := self._cut_apart(a, b)) is not None:
            reason = why
        if reason is None and self._forbidden(a, b):
            reason = "reduction axes do not line up (transposed index spaces)"
        if reason is None:
            dom, reason = self._merged_domain(a, b, producer, consumer)
        if reason is None and self._creates_cycle(a, b):
            reason = "cycle: a path between the two kernels leaves them"
        if reason is not None:
            self.refusals.append(Refusal(producer, consumer, reason))
            return
        keep, gone = (a, b) if len(a.members) >= len(b.members) else (b, a)
        keep.domain = dom
        keep.dominant = tuple(sorted(set(a.dominant) | set(b.dominant)))
        keep.rowwise = a.rowwise or b.rowwise or not dom.is_flat
        keep.cross = a.cross | b.cross
        self._merge(keep, gone)

    def _has_scatter(self, grp: Group) -> bool:
        return grp.scatter

    def _feeds_only(self, small: Group, scatter: Group, consumer: int) -> bool:
        """`small` is element-wise work (an index's wrap and linearisation, a cast of
        the values, an index gathered from another kernel's result: the compact
        embedding gradient's representatives, `rules_index._embedding_backward_compact`)
        that only the scatter reads: computed inside the scatter kernel at the scatter's
        positions instead of written out and read back."""
        if small.rowwise or self._has_scatter(small) or any(self.g[m].kind not in (ir.POINTWISE, ir.GATHER)
                                                            for m in small.members):
            return False
        inside = small.members | scatter.members | {consumer}
        return all(m not in self.gv.escapes and set(self.gv.consumers[m]) <= inside for m in small.members)

    def _reads_cross(self, a: Group, b: Group) -> bool:
        """Does a member of `b` read one of `a`'s column reductions (complete only
        after the combine, so never inside the same kernel)?"""
        return bool(a.cross) and any(s in a.cross for m in b.members for s in self.gv.sources[m])

    def _rereads_reduction(self, a: Group, b: Group) -> int | None:
        """A per-row value of `a` (one a row of its domain) that depends on a reduction
        inside `a` and that a member of `b` reads through a narrowing view (a slice or
        select of it, broadcast back: batch-norm chunk statistics' shift, the first chunk's
        mean `m[:1]`), else None.  Fewer values than rows: the reader's rows take it at
        other rows, which code generation gets by computing the reduction again there, so
        each program re-reads those rows' input (the chunk kernel read x twice, 510
        instead of 359 sm_90 instructions a thread), work the cost model, counting each
        input once, does not see.  Element-wise values read that way stay cheap to
        recompute and may merge; so do full-size values read through a slice (a rotary
        embedding's halves of a row: the same rows, other columns), and reductions over at
        most REREAD_MAX_COLS columns (LLaMA's GQA key gradient, summed over its 4 query
        heads, then rotated: each row sums its partner row's 4 values again, from the
        tile it has just read, instead of a kernel more, 16 µs a step by the model)."""
        # (b's readers of a are found from a's frontier through views: a merge test costs
        # the groups' boundary, not their size, see `Group`)
        readers, stack, seen = [], list(a.frontier), set()
        while stack:
            u = stack.pop()
            if u in seen:
                continue
            seen.add(u)
            if u in b.members:
                readers.append(u)
            elif self.g[u].kind == ir.VIEW:
                stack.extend(self.gv.users[u])
        for m in readers:
            for r in self.g[m].refs:
                n, narrowed = self.g[r], False
                while n.id not in a.members and n.kind == ir.VIEW and n.refs:
                    src = self.g[n.refs[0]]
                    narrowed = narrowed or n.numel < src.numel
                    n = src
                if (narrowed and n.id in a.members and n.numel == a.domain.rows and not a.domain.is_flat
                        and a.domain.cols > REREAD_MAX_COLS and self._after_reduction(a, n.id)):
                    return n.id
        return None

    def _after_reduction(self, grp: Group, nid: int) -> bool:
        """Does member `nid` of `grp` depend, through members of `grp`, on a reduction?"""
        stack, seen = [nid], set()
        while stack:
            n = self.g[stack.pop()]
            if n.kind == ir.REDUCE:
                return True
            for r in n.refs:
                if r not in seen and (r in grp.members or self.g[r].kind == ir.VIEW):
                    seen.add(r)
                    stack.append(r)
        return False

    def _cut_apart(self, a: Group, b: Group) -> str | None:
        """The reason a cut value of one group is read through index maps by a member
        of the other (`cuts`), else None."""
        for m, (readers, why) in self.cuts.items():
            for x, y in ((a, b), (b, a)):
                if m in x.members and not readers.isdisjoint(y.members):
                    return why
        return None

    def _forbidden(self, a: Group, b: Group) -> bool:
        return any(frozenset((x, y)) in self.forbidden for x in a.dominant for y in b.dominant)

    def _merged_domain(self, a: Group, b: Group, producer: int, consumer: int):
        da, db = a.domain, b.domain
        na, nb = _numel(da), _numel(db)
        if na == 0 or nb == 0:
            return None, "empty tensor: nothing to stitch"
        if da.is_flat and db.is_flat:
            if na == nb:
                return (da if a.rowwise else db), None
            if na < nb and nb % na == 0:
                if self._inlinable(a, b, consumer):
                    return db, None
                return self._broadcast_domain(a, b, producer, consumer)
            return None, f"shape mismatch: {da.shape} vs {db.shape}"
        if not da.is_flat and not db.is_flat:
            if (da.rows, da.cols) == (db.rows, db.cols):
                if (a.cross or b.cross) and not partials_fit(da.rows, da.cols, self.opts):
                    return None, ("row and column reductions together need whole rows on chip, or (looped rows) "
                                  "rows for two programs per SM and static shapes")
                if a.cross and not b.cross and b.rowwise:
                    return db, None  # keep the row reduction's geometry
                if bool(a.dominant) != bool(b.dominant):
                    # a reduction's or scan's dims must stay its columns: a broadcast
                    # kernel (no dominant op) over the same rows x cols may walk other
                    # dims as its columns (a [17, 17] scan over dim 0 fed by a product
                    # broadcast along dim 1: fuzz seed 14912)
                    return (da if a.dominant else db), None
                return da, None
            return None, (f"different reduction axes: rows x cols {da.rows}x{da.cols} vs "
                          f"{db.rows}x{db.cols}")
        row, flat = (da, db) if not da.is_flat else (db, da)
        nf = _numel(flat)
        if flat is db and any(frozenset((d,)) in self.forbidden for d in a.dominant):
            return None, ("the per-row values would be read at a reordered index (a dry run of code generation "
                          "failed for this fusion)")
        if nf in (row.rows * row.cols, row.rows):
            return row, None
        if flat is da and self._inlinable(a, b, consumer):
            return row, None
        return None, f"shape mismatch: {flat.shape} does not fit rows x cols {row.rows}x{row.cols}"

    def _inlinable(self, small: Group, big: Group, consumer: int) -> bool:
        """A cheap producer of a broadcast operand (a cast or scale of a weight vector)
        is recomputed inside its only consumer kernel instead of being written out."""
        if small.rowwise or any(self.g[m].op in EXPENSIVE or self.g[m].kind != ir.POINTWISE
                                for m in small.members):
            return False
        inside = small.members | big.members | {consumer}
        return all(m not in self.gv.escapes and set(self.gv.consumers[m]) <= inside for m in small.members)

    def _broadcast_domain(self, small: Group, big: Group, producer: int, consumer: int):
        """Regional stitching of an expensive op whose result is broadcast: compute it
        once per row on chip and reuse it across the row."""
        if not any(self.g[m].op in EXPENSIVE for m in small.members):
            return None, "broadcast of a cheap value: read from memory instead of recomputed per element"
        expand = self._expand_between(producer, consumer)
        if expand is None:
            return None, "broadcast not through a single expand"
        in_shape, out_shape = self.g[expand.refs[0]].shape, expand.shape
        lead = len(out_shape) - len(in_shape)
        cols = tuple(i for i in range(len(out_shape))
                     if i < lead or (in_shape[i - lead] == 1 and out_shape[i] != 1))
        if out_shape != big.domain.shape or cols != tuple(range(len(out_shape) - len(cols), len(out_shape))):
            return None, "broadcast dims are not trailing: would read across rows"
        domain = Domain(out_shape, cols)
        if domain.rows < self.opts.device.sms and not fits_on_chip(domain.cols, self.opts):
            # one program walks each row: a 0-d value (an optimizer's bias correction, a
            # learned temperature's exp) broadcast over a whole tensor would put the
            # tensor in one program (2 ms instead of 9 us for 16 MB on an H200)
            return None, (f"broadcast of {domain.rows} value(s) over rows of {domain.cols} elements: too few rows "
                          f"to spread over the device's {self.opts.device.sms} SMs (one program walks a row); "
                          f"the value is written by its own kernel and read as a broadcast")
        return domain, None

    def _expand_between(self, producer: int, consumer: int):
        for r in self.g[consumer].refs:
            n = self.g[r]
            while is_free(n) and n.refs:
                if n.op == "expand":
                    return n
                n = self.g[n.refs[0]]
        return None

    def _creates_cycle(self, a: Group, b: Group) -> bool:
        """True if a path from one group to the other passes through a node that
        belongs to neither and is not a free index map (a real intermediate step).
        Another kernel runs as a unit: reaching one of its members reaches all of
        them (its outputs depend on all its inputs, as far as ordering goes)."""
        def inside(nid: int) -> bool:
            return nid in a.members or nid in b.members
        # Nodes after both groups cannot lead back to them, except through a kernel that
        # has members before as well (entered at a later member, it runs as a unit:
        # everything its earlier members feed comes after): the bound takes in every such
        # kernel, and the kernels those reach back into in turn
        limit = max(a.top, b.top)
        while (wider := self._spans.upto(limit)) > limit:
            limit = wider
        for start, target in ((a, b), (b, a)):
            stack = [(u, not is_free(self.g[u])) for u in start.frontier if not inside(u)]
            seen, entered = set(), set()
            while stack:
                nid, crossed = stack.pop()
                if (nid, crossed) in seen or nid > limit:
                    continue
                seen.add((nid, crossed))
                other = self.group_of.get(nid)
                users = self.gv.users[nid]
                if other is not None and other is not a and other is not b:
                    # reaching a member reaches everything the kernel's members feed (its
                    # frontier), across a real step; once a kernel, not once a member
                    if id(other) in entered:
                        continue
                    entered.add(id(other))
                    crossed, users = True, other.frontier
                for u in users:
                    if u in target.members:
                        if crossed:
                            return True
                    elif not inside(u):
                        stack.append((u, crossed or not is_free(self.g[u])))
        return False


def _numel(d: Domain) -> int:
    return d.rows * d.cols


CHAINED_COLUMN_ROWS = 1024   # `_chained_columns`: the most rows a program holds per column
_CHAIN_WALK = 64             # nodes a walk back from a reduction visits at most


def _chained_columns(g: ir.Graph) -> frozenset[int]:
    """Reductions over at most CHAINED_COLUMN_ROWS leading rows that another reduction
    over the same rows depends on, or that depend on one (through element-wise ops and
    views, not through another reduction): a softmax or a two-pass variance over a small
    leading dim, the merge of batch-norm chunk statistics (`capture/decomp.py::
    _chunk_stats`: the chunks' mean correction, then their variance about it).  As column
    partials each would be a kernel and a combine, one after the other; as row reductions
    (knob `chained_columns`) a program holds its columns' rows whole and computes both,
    reading them transposed in tall tiles (`mapping.transposed_rows`): one launch."""
    def key(n: ir.Node):
        src = g[n.refs[0]] if n.refs else None
        if n.kind != ir.REDUCE or src is None or src.shape is None:
            return None
        dims = n.attr("dims") or ()
        rows = 1
        for d in dims:
            rows *= src.shape[d]
        if not dims or dims != tuple(range(len(dims))) or rows > CHAINED_COLUMN_ROWS or rows < 2:
            return None
        return dims, tuple(src.shape)

    keys = {n.id: k for n in g.nodes if (k := key(n)) is not None}
    out: set[int] = set()
    for nid, k in keys.items():
        # the reductions this one's operand is computed from, stopping at each
        seen, stack, walked = set(), list(g[nid].refs), 0
        while stack and walked < _CHAIN_WALK:
            x = stack.pop()
            if x in seen:
                continue
            seen.add(x)
            walked += 1
            n = g[x]
            if n.kind == ir.REDUCE:
                if keys.get(x) == k:
                    out.update((x, nid))
                continue
            if n.kind in (ir.POINTWISE, ir.VIEW):
                stack.extend(n.refs)
    # and the other reductions over those rows (a mean beside the variance): row
    # reductions too, so that one reading the same buffer shares the kernel
    chained = {keys[nid] for nid in out}
    out.update(nid for nid, k in keys.items() if k in chained)
    return frozenset(out)


def is_column_reduce(n: ir.Node, src: ir.Node, opts: PlanOptions, g: ir.Graph | None = None) -> bool:
    """Reduces leading dims and keeps trailing ones (bias gradients, dγ/dβ) that fit on
    chip, or that looped programs of several rows can take (`mapping.partials_fit`):
    computed as per-program partials over row blocks, then combined.  Leading in memory
    counts too: a batch norm's statistics over (N, H, W) of a channels-last tensor keep
    its innermost dim, C (`outer_in_memory`)."""
    dims = n.attr("dims")
    nd = len(src.shape)
    if not (n.op in ir.COMBINABLE_REDUCES and 0 < len(dims) < nd
            and (dims == tuple(range(len(dims))) or opts.layout_columns and outer_in_memory(dims, src, g))):
        return False
    rows = 1
    for d in dims:
        rows *= src.shape[d]
    return partials_fit(rows, n.numel, opts)


def outer_in_memory(dims: tuple[int, ...], src: ir.Node, g: ir.Graph | None = None) -> bool:
    """Whether `src` is laid out with the reduced `dims` outside the kept ones: every
    reduced dim strides over the whole block the kept dims span, and both walk memory
    outermost first in their natural order.  Such a reduction is a column reduction of a
    [reduced, kept] matrix whose columns are contiguous (channels-last batch-norm
    statistics: reduced (0, 2, 3), kept 1 of stride 1).  As a row reduction it would read
    one element of every 32-byte sector a program loads, and with only C rows it leaves
    most SMs idle (ResNet-50's 64-channel stem: 64 programs).  A view's `stride` is its
    logical one: its memory layout is replayed from the value it views (`memory_stride`),
    e.g. the leading samples of a channels-last batch (batch norm's shift)."""
    shape = src.shape
    stride = memory_stride(g, src) if g is not None else src.stride or ir.contiguous_strides(tuple(shape))
    red = [d for d in dims if shape[d] > 1]
    kept = [d for d in range(len(shape)) if d not in dims and shape[d] > 1]
    if not red or not kept:
        return False
    span = max(stride[d] * shape[d] for d in kept)
    in_order = all(stride[a] > stride[b] for seq in (red, kept) for a, b in zip(seq, seq[1:]))
    return in_order and min(stride[d] for d in red) >= span


def memory_stride(g: ir.Graph, n: ir.Node) -> tuple[int, ...]:
    """The strides in memory of the elements node `n` names: its own for a computed
    value, or for a chain of views the layout the chain gives the value it starts from
    (a slice of a channels-last tensor is channels-last); the view's logical strides
    where a view of the chain is not a plain re-stride."""
    from ..runtime.steps import Layout, view_layout   # (the wrapper's own view arithmetic)
    chain, base = [], n
    while base.kind == ir.VIEW and base.refs:
        chain.append(base)
        base = g[base.refs[0]]
    fallback = n.stride or ir.contiguous_strides(tuple(n.shape))
    if not chain or base.stride is None:
        return fallback
    lay: Layout | None = Layout(tuple(base.shape), tuple(base.stride))
    for v in reversed(chain):
        lay = view_layout(v.op, lay, tuple(v.shape), dict(v.attrs))
        if lay is None:
            return fallback
    return lay.stride
