"""Our decompositions of the `_foreach_*` ops (multi-tensor ops, issue 18): each is its
per-tensor op applied to every list element, so that the element-wise work stitches.

`torch.optim`'s optimizers (their default `foreach` implementation), gradient clipping
(`clip_grad_norm_`, `_foreach_norm`) and gradient scaling call these on lists of
tensors; inside a compiled step AOTAutograd's functionalisation turns the in-place
forms (`_foreach_add_`) into the functional ones listed here.  torch has no
decomposition of them and we have no lowering rule, so without this table a compiled
optimizer step ran every one eagerly (and `STITCHML_STRICT=1` refused it).

Once split, the list element `i` of every op in a chain (an Adam step: moments, bias
corrections, the update) is one element-wise kernel per parameter, and the planner's
launch grouping puts independent kernels side by side (horizontal groups), which is
what a multi-tensor kernel does by hand.

The split is generic, from the op's schema: a `Tensor[]` or `Scalar[]` argument is
indexed per element, any other argument (a scalar, a 0-d tensor, `alpha=`) is passed
to every call.  The per-element op is torch's function of the name without `_foreach_`
(with the exceptions in `_BASE`); the `.Tensor` forms of addcmul/addcdiv take their
scale from a 1-d tensor of scalars, one element per list entry.
"""
from __future__ import annotations

import functools
from typing import Any, Callable

import torch

aten = torch.ops.aten


def _powsum(x: torch.Tensor, ord: float = 2, dtype: torch.dtype | None = None) -> torch.Tensor:
    """sum(|x| ** ord): the norm before its root (eager's `_foreach_powsum`)."""
    if dtype is not None:
        x = x.to(dtype)
    return torch.sum(torch.abs(x) ** ord)


def _norm(x: torch.Tensor, ord: float = 2, dtype: torch.dtype | None = None) -> torch.Tensor:
    return torch.linalg.vector_norm(x, ord, dtype=dtype)


def _copy(x: torch.Tensor, src: torch.Tensor, non_blocking: bool = False) -> torch.Tensor:
    return aten.copy.default(x, src, non_blocking)


def _scaled(op: Callable) -> Callable:
    """addcmul / addcdiv with their scale as a 0-d tensor (the `.Tensor` overloads'
    element of `scalars`): the per-tensor op takes a Python scalar only."""
    def run(x: torch.Tensor, a: torch.Tensor, b: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        return x + op(a, b) * scale.to(x.device)
    return run


def _with_value(op: Callable) -> Callable:
    """addcmul / addcdiv: the list form passes the scale positionally, the per-tensor
    op takes it as `value=` only."""
    def run(x: torch.Tensor, a: torch.Tensor, b: torch.Tensor, value: Any = 1) -> torch.Tensor:
        return op(x, a, b, value=value)
    return run


def _scalar_or_tensor(scalar_op: Callable, tensor_op: Callable) -> Callable:
    """maximum / minimum take tensors only; with a scalar they are eager's clamps."""
    def run(x: torch.Tensor, other: Any) -> torch.Tensor:
        return tensor_op(x, other) if isinstance(other, torch.Tensor) else scalar_op(x, other)
    return run


# per-element op where it is not `torch.<name without _foreach_>` (torch's functions,
# unlike ATen packets, take a Python scalar wherever a tensor operand may be one)
_BASE: dict[str, Callable] = {
    "norm": _norm, "powsum": _powsum, "copy": _copy,
    "max": aten.max.default, "zero": aten.zeros_like.default, "mm": aten.mm.default,
    "addcmul": _with_value(torch.addcmul), "addcdiv": _with_value(torch.addcdiv),
    "maximum": _scalar_or_tensor(torch.clamp_min, torch.maximum),
    "minimum": _scalar_or_tensor(torch.clamp_max, torch.minimum),
}
_SCALED_TENSOR = {"addcmul": _scaled(torch.mul), "addcdiv": _scaled(torch.div)}


def _split(schema: torch.FunctionSchema, per_element: Callable) -> Callable:
    """A decomposition of one `_foreach_*` overload: `per_element` called on list entry
    `i` of each list argument and on every other argument as given."""
    params = list(schema.arguments)
    lists = [str(a.type) in ("List[Tensor]", "List[number]", "List[Scalar]") for a in params]
    tensor_scalars = (schema.overload_name == "Tensor" and len(params) == 4
                      and str(params[3].type) == "Tensor")   # addcmul/addcdiv's 1-d `scalars`

    def decomp(*args: Any, **kwargs: Any) -> list[torch.Tensor]:
        args = list(args)
        n = next(len(a) for a, is_list in zip(args, lists) if is_list)
        out = []
        for i in range(n):
            el = [a[i] if (j < len(lists) and lists[j]) else a for j, a in enumerate(args)]
            if tensor_scalars:
                el[3] = args[3][i]
            out.append(per_element(*el, **kwargs))
        return out
    return decomp


@functools.lru_cache(maxsize=1)
def _table() -> dict:
    # (built once: listing torch's ~4000 schemas makes as many objects, and the table is
    # asked for at every graph's capture)
    out: dict = {}
    for schema in torch._C._jit_get_all_schemas():
        name, overload = schema.name, schema.overload_name
        if not name.startswith("aten::_foreach_") or name.endswith("_") or "out" in overload:
            continue
        base = name[len("aten::_foreach_"):]
        packet = getattr(aten, name[len("aten::"):], None)
        op = getattr(packet, overload or "default", None) if packet is not None else None
        if op is None:
            continue
        if overload == "Tensor" and base in _SCALED_TENSOR:
            per_element = _SCALED_TENSOR[base]
        elif base in _BASE:
            per_element = _BASE[base]
        else:
            per_element = getattr(torch, base, None)
            if per_element is None:
                continue
        out[op] = _split(schema, per_element)
    return out


def table() -> dict:
    """Every functional `_foreach_*` overload this torch has, split per element.  An
    op whose per-tensor op this torch lacks is left out (it runs eagerly, as before)."""
    return dict(_table())
