"""Rewrite: attention written out as math → `F.scaled_dot_product_attention`.

Matched on the Dynamo graph from the second matrix product back:

    s = q @ kᵀ                       (matmul / bmm; kᵀ any [..., E, S] value)
    s = s / c  |  s * c              (optional scale, next to the product)
    s = s + m                        (additive float mask)
      | s.masked_fill(b, -inf)       (boolean mask, True = masked out)
      | torch.where(b, s, -inf)      (boolean mask, True = kept)
    p = softmax(s, -1)               (optionally in float32 and cast back)
    p = dropout(p, rate, training)   (optional)
    out = p @ v

becomes `scaled_dot_product_attention(q, k, v, attn_mask, dropout_p, is_causal, scale)`.
A boolean mask built in the graph as `tril(ones(L, S, dtype=bool))` becomes
`is_causal=True` (no mask tensor at all); any other boolean mask is passed as one.
So does an additive mask built in the graph from query and key positions that keeps
exactly key j <= query i (`where(kv_idx <= q_idx, 0, finfo.min)` over two equal
aranges: Hugging Face's eager causal mask, `_causal_additive`); a shifted, strict or
padding-combined one stays a mask tensor.
A fill value that is a very large finite negative number (finfo.min, as Hugging
Face writes masks) is passed as an additive mask of that value, which gives the same
probabilities (the masked scores round to the fill value either way).  Every
intermediate must have exactly one user: scores or probabilities that are returned
(output_attentions) or reused refuse the rewrite, with that reason.

Numerics: rows whose every key is masked with -inf give NaN in eager and may give 0
in a fused backend; that case is not matched differently (it cannot be seen at
compile time).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx as fx
import torch.nn.functional as F

from .common import (NoMatch, PatternRecord, Refused, arg, is_number, kind, only_user, rewrite_matches, same,
                     same_shape, show, sizes, value, written_in_place)

_NEG_FILL = -1e30   # finite fills at or below this act like -inf after softmax (in fp32, bf16 and fp16 alike)


@dataclass
class Match:
    out: fx.Node
    q: fx.Node
    k_t: fx.Node                     # the [..., E, S] operand of the first product
    v: fx.Node
    scale: float = 1.0
    mask: fx.Node | None = None      # additive float mask, or bool mask (True = keep)
    mask_kind: str = "none"          # none | additive | bool | inverted-bool | causal | fill
    fill: float = 0.0
    dropout_p: float = 0.0
    dead: list[fx.Node] = field(default_factory=list)


def _dropout(node: fx.Node) -> float:
    # F.dropout(input, p=0.5, training=True, inplace=False) / torch.dropout(input, p, train)
    p = arg(node, 1, "p", 0.5)
    training = arg(node, 2, "training" if node.target is F.dropout else "train", True)
    if not is_number(p) or not isinstance(training, bool):
        raise Refused(f"{node.name}: dropout rate or training flag is not a constant")
    if arg(node, 3, "inplace", False):
        raise Refused(f"{node.name}: in-place dropout")
    return float(p) if training else 0.0


def _causal(node) -> bool:
    """A bool mask built in the graph as tril(ones(L, S)) (optionally cast to bool)."""
    v = value(node)
    if v is None or v.dtype != torch.bool or v.dim() != 2:
        return False
    if kind(node) in ("bool", "to"):
        node = node.args[0]
    return kind(node) == "tril" and arg(node, 1, "diagonal", 0) == 0 and kind(node.args[0]) == "ones"


def _size(x: Any) -> Any:
    """A size argument as an int or SymInt (a symbolic size is a graph node in Dynamo's graph)."""
    if isinstance(x, fx.Node):
        v = x.meta.get("example_value", x.meta.get("val"))
        return v if isinstance(v, (int, torch.SymInt)) else None
    return x if isinstance(x, int) else None


def _positions(node: Any, ndim: int, axis: int) -> tuple[Any, Any] | None:
    """(length, first value) when node is `arange(n)` or `arange(a, b)` (step 1, integer),
    optionally plus an integer constant, indexed with Nones into `ndim` dims with the
    positions along `axis` (`x[None, None, :, None]`: Hugging Face's q_indices at -2,
    kv_indices at -1); None for anything else."""
    if kind(node) != "getitem" or not isinstance(node.args[1], tuple) or len(node.args[1]) != ndim:
        return None
    idx = node.args[1]
    full = slice(None, None, None)
    if any(not (i is None or i == full) for i in idx) or [i for i, x in enumerate(idx) if x == full] != [axis]:
        return None
    node, offset = node.args[0], 0
    if kind(node) == "add":
        a, b = node.args[:2]
        node, offset = (a, b) if kind(a) == "arange" else (b, a)
        if not isinstance(offset, int) or isinstance(offset, bool):
            return None
    if kind(node) != "arange" or node.kwargs.get("step", 1) != 1 or len(node.args) > 2:
        return None
    v = value(node)
    if v is None or v.dtype.is_floating_point or v.dtype == torch.bool:
        return None
    start, end = (0, node.args[0]) if len(node.args) == 1 else node.args
    end = _size(end)
    if not isinstance(start, int) or end is None:
        return None
    return end - start, start + offset


def _causal_additive(mask: fx.Node, ndim: int) -> list[fx.Node] | None:
    """The construction nodes of an additive mask that is exactly causal, or None:
    `where(kv_idx <= q_idx, 0, fill)` (fill -inf or a huge negative), the condition
    possibly expanded over batch and heads, q_idx / kv_idx the same positions
    (`arange(L) + c`, the same c) along the query and key axes, as Hugging Face's masking
    utilities build an eager causal mask in the graph (GPT-2, LLaMA, ... under
    `attn_implementation="eager"`).  Key j of query i is kept iff j <= i: SDPA's
    `is_causal=True`, whose flash and cuDNN kernels skip the key tiles past the diagonal
    where a mask tensor makes them compute every tile (H200: GPT-2's masked attention,
    cuDNN, 35.3 µs forward a layer for 320 of 512 keys a query on average).  Only with
    as many queries as keys (then top-left and bottom-right alignment agree) and a mask
    of the scores' rank; any other mask (padding combined in, a cache offset, `<`) stays
    a mask tensor."""
    if kind(mask) != "where" or len(mask.args) != 3:
        return None
    cond, keep, fill = mask.args
    if not (is_number(fill) and (fill == float("-inf") or fill <= _NEG_FILL)):
        return None
    zero_tensor = kind(keep) == "zeros" and tuple(keep.args) == ((),)   # torch.zeros((), dtype=...)
    if not (zero_tensor or is_number(keep) and keep == 0):
        return None
    nodes = [mask] + ([keep] if isinstance(keep, fx.Node) else [])
    if kind(cond) == "expand":
        nodes.append(cond)
        cond = cond.args[0]
    if kind(cond) not in ("le", "ge") or len(cond.args) != 2:
        return None
    kv, q = cond.args if kind(cond) == "le" else cond.args[::-1]
    pq, pk = _positions(q, ndim, ndim - 2), _positions(kv, ndim, ndim - 1)
    if pq is None or pk is None or not same(pq[0], pk[0]) or not (isinstance(pq[1], int) and pq[1] == pk[1]):
        return None
    nodes.append(cond)
    for n in (q, kv):   # the indexing, the offset add, the arange
        while n is not None:
            nodes.append(n)
            if kind(n) == "getitem":
                n = n.args[0]
            elif kind(n) == "add":
                n = next(a for a in n.args[:2] if kind(a) == "arange")   # (`_positions` found one)
            else:
                n = None
    return nodes


def _scores_operand(node: fx.Node) -> fx.Node:
    """The operand of a scale or mask step that carries the scores."""
    k = kind(node)
    if k in ("masked_fill", "div"):
        scores = node.args[0]
    elif k == "where":
        scores = node.args[1]
    else:  # add / mul: the operand that comes from the product (through earlier steps)
        cands = [a for a in node.args[:2] if _reaches_product(a, 3)]
        if len(cands) != 1:
            raise Refused(f"{node.name}: cannot tell the scores from the other operand")
        scores = cands[0]
    if not isinstance(scores, fx.Node):
        raise Refused(f"{node.name}: the scores are not a graph value")
    return scores


def _reaches_product(node, depth: int) -> bool:
    """Whether node is a matmul or a scale/mask step over one (within depth steps)."""
    k = kind(node)
    if k == "matmul":
        return True
    if depth == 0 or k not in ("div", "mul", "add", "masked_fill", "where"):
        return False
    return any(_reaches_product(a, depth - 1) for a in node.args[:3] if isinstance(a, fx.Node))


def _mask(m: Match, node: fx.Node, scores: fx.Node) -> None:
    """Read the mask step at node into m."""
    k = kind(node)
    if k == "add":
        mask = node.args[1] if node.args[0] is scores else node.args[0]
        mv = value(mask)
        if mv is None or not mv.dtype.is_floating_point:
            raise Refused(f"{node.name}: the additive mask is not a float tensor")
        if mv.dtype != value(m.q).dtype:
            raise Refused(f"{node.name}: mask dtype {mv.dtype} differs from the query's {value(m.q).dtype}")
        causal = _causal_additive(mask, len(sizes(scores)))
        if causal is not None:
            m.mask_kind = "causal"
            m.dead += causal
            return
        m.mask, m.mask_kind = mask, "additive"
        return
    if k == "masked_fill":
        bmask, fill = arg(node, 1, "mask"), arg(node, 2, "value")
        keep_when = False   # masked_fill masks where True
    else:  # where(cond, scores, fill)
        bmask, fill = node.args[0], node.args[2]
        keep_when = True
    if not is_number(fill) or (fill != float("-inf") and fill > _NEG_FILL):
        raise Refused(f"{node.name}: fill value {fill!r} is not -inf or a huge negative constant")
    bv = value(bmask)
    if bv is None or bv.dtype != torch.bool:
        raise Refused(f"{node.name}: the mask is not a boolean tensor")
    if fill != float("-inf"):
        m.mask, m.mask_kind, m.fill = bmask, "fill" if keep_when else "fill-inverted", float(fill)
        return
    inner = bmask.args[0] if not keep_when and kind(bmask) == "invert" else None
    if keep_when and _causal(bmask):
        m.mask_kind = "causal"
        m.dead += _construction(bmask)
    elif inner is not None and _causal(inner):
        m.mask_kind = "causal"
        m.dead += [bmask] + _construction(inner)
    else:
        m.mask, m.mask_kind = bmask, "bool" if keep_when else "inverted-bool"


def _construction(node: fx.Node) -> list[fx.Node]:
    """The nodes of a causal mask's construction (cast, tril, ones), outermost first."""
    out = []
    while isinstance(node, fx.Node) and kind(node) in ("bool", "to", "tril", "ones"):
        out.append(node)
        node = node.args[0] if node.args and kind(node) != "ones" else None
    return out


def match(out: fx.Node) -> Match:
    p = out.args[0]
    m = Match(out, None, None, out.args[1])
    if kind(p) in ("softmax", "dropout", "to", "float") and (w := written_in_place(out)) is not None:
        # (the product's backward does not read its output; the fused attention's does)
        raise Refused(f"{w.name} writes into the attention output in place, which the fused attention's "
                      f"backward reads")
    cur = p
    while kind(cur) in ("dropout", "to", "float"):  # between softmax and the product
        only_user(cur, "the attention probabilities")
        if kind(cur) == "dropout":
            if m.dropout_p:
                raise Refused("two dropouts")
            m.dropout_p = _dropout(cur)
        m.dead.append(cur)
        cur = cur.args[0]
    if kind(cur) != "softmax":
        raise NoMatch()  # a product of something else (no attention here)
    only_user(cur, "the attention probabilities")
    ndim = len(sizes(cur))
    if arg(cur, 1, "dim") not in (-1, ndim - 1):
        raise Refused(f"{cur.name}: softmax is not over the key dim")
    m.dead.append(cur)
    cur = cur.args[0]
    while kind(cur) in ("to", "float"):
        only_user(cur, "the attention scores")
        m.dead.append(cur)
        cur = cur.args[0]
    # scale and mask steps, read from softmax inwards; interpreted once q's dtype is known
    steps: list[tuple[fx.Node, fx.Node]] = []   # (step, its scores operand)
    while kind(cur) in ("add", "masked_fill", "where", "div", "mul"):
        only_user(cur, "the attention scores")
        scores = _scores_operand(cur)
        steps.append((cur, scores))
        cur = scores
    if kind(cur) != "matmul":
        raise Refused(f"{getattr(cur, 'name', cur)} is not the q·kᵀ product")
    only_user(cur, "the attention scores")
    m.q, m.k_t = cur.args[0], cur.args[1]
    m.dead.append(cur)
    qs, kts, vs = sizes(m.q), sizes(m.k_t), sizes(m.v)   # (symbolic under dynamic shapes)
    if not (len(qs) == len(kts) == len(vs) >= 3) or not same_shape(qs[:-2], kts[:-2]) \
            or not same_shape(qs[:-2], vs[:-2]):
        raise Refused(f"q {show(qs)}, kᵀ {show(kts)}, v {show(vs)}: batch dims differ (broadcast/grouped "
                      f"attention not matched)")
    if not same(kts[-2], qs[-1]) or not same(vs[-2], kts[-1]):
        raise Refused(f"q {show(qs)}, kᵀ {show(kts)}, v {show(vs)} do not line up as attention")
    dts = {value(x).dtype for x in (m.q, m.k_t, m.v)}
    if len(dts) != 1 or not next(iter(dts)).is_floating_point:
        raise Refused(f"q, k, v dtypes {sorted(map(str, dts))}")
    # steps from the product outwards: an optional scale, then an optional mask
    steps.reverse()
    for i, (node, scores) in enumerate(steps):
        k = kind(node)
        if k in ("div", "mul") and i == 0:
            c = node.args[1] if node.args[0] is scores else node.args[0]
            if not is_number(c) or c == 0:
                raise Refused(f"{node.name}: the scale is not a constant")
            m.scale = 1.0 / c if k == "div" else float(c)
        elif k in ("add", "masked_fill", "where") and m.mask_kind == "none":
            _mask(m, node, scores)
        else:
            raise Refused(f"{node.name} ({k}) between q·kᵀ and softmax is not a scale followed by one mask")
        m.dead.append(node)
    if value(out).dtype != value(m.q).dtype:
        raise Refused(f"the result is {value(out).dtype}, the inputs {value(m.q).dtype}")
    return m


def _transpose_last(node: fx.Node) -> fx.Node | None:
    """x when node is x with its last two dims swapped."""
    k = kind(node)
    nd = len(sizes(node))
    if k == "getattr" and node.args[1] == "mT" or k == "t" and nd == 2:
        return node.args[0]
    if k == "transpose" and sorted(d % nd for d in node.args[1:3]) == [nd - 2, nd - 1]:
        return node.args[0]
    if k == "permute":
        dims = list(node.args[1]) if isinstance(node.args[1], (list, tuple)) else list(node.args[1:])
        return node.args[0] if [d % nd for d in dims] == list(range(nd - 2)) + [nd - 1, nd - 2] else None
    return None


def apply(gm: fx.GraphModule, m: Match) -> str:
    g = gm.graph
    with g.inserting_before(m.out):
        k = _transpose_last(m.k_t)
        if k is None:
            k = g.call_function(torch.transpose, (m.k_t, -2, -1))
        else:
            m.dead.append(m.k_t)  # erased if nothing else reads kᵀ
        mask = m.mask
        if m.mask_kind == "inverted-bool":
            mask = g.call_function(torch.logical_not, (mask,))
        elif m.mask_kind in ("fill", "fill-inverted"):  # keep → 0, masked → the fill value, in q's dtype
            keep = mask if m.mask_kind == "fill" else g.call_function(torch.logical_not, (mask,))
            mask = g.call_function(torch.where, (keep, 0.0, m.fill))
            mask = g.call_method("to", (mask, value(m.q).dtype))
        sdpa = g.call_function(F.scaled_dot_product_attention, (m.q, k, m.v), dict(
            attn_mask=mask, dropout_p=m.dropout_p, is_causal=m.mask_kind == "causal", scale=m.scale))
    sdpa.meta.update({key: v for key, v in m.out.meta.items() if key in ("example_value", "val", "stack_trace",
                                                                           "nn_module_stack", "source_fn_stack")})
    m.out.replace_all_uses_with(sdpa)
    dead = [m.out] + m.dead
    while True:  # erase the chain (each node once its users are gone)
        free = [n for n in dead if not n.users]
        if not free:
            break
        for n in free:
            g.erase_node(n)
            dead.remove(n)
    return (f"{m.out.name}: scaled_dot_product_attention(mask={m.mask_kind}, dropout_p={m.dropout_p}, "
            f"scale={m.scale:.6g}): the score tensor stays inside the attention kernel")


def _anchor(node: fx.Node) -> bool:
    """The final `· v` matmul of a math attention (its left operand the softmax, its dropout or a cast)."""
    return kind(node) == "matmul" and kind(node.args[0]) in ("softmax", "dropout", "to", "float")


def rewrite(gm: fx.GraphModule) -> list[PatternRecord]:
    return rewrite_matches(gm, "attention", _anchor, match, apply)
