"""Helpers that rules use to build IR: casts, broadcasts, views and reductions."""
from __future__ import annotations

from typing import Any, Iterable, Sequence

import torch

from ..ir import nodes as ir
from ..ir.nodes import Ref, prod
from .registry import Unsupported

FLOAT_TYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
SUPPORTED_DTYPES = FLOAT_TYPES + (torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8, torch.bool)
# unsigned types wider than a byte: torch gives them few ops, so kernels hold them only
# as bit-cast results (`view(dtype)`, hash_tensor) and views of them, never compute
# with them (`lower._unsupported_dtype`)
BITCAST_RESULT_DTYPES = (torch.uint16, torch.uint32, torch.uint64)
# every type a kernel may hold without computing in it: empty results, bit-cast results
# (float8 values are held as their bits: `ir.nodes.FLOAT8_DTYPES`)
HELD_DTYPES = SUPPORTED_DTYPES + BITCAST_RESULT_DTYPES + ir.FLOAT8_DTYPES


def static_shape(t: torch.Tensor) -> tuple[int, ...]:
    try:
        return tuple(int(s) for s in t.shape)
    except Exception as e:  # symbolic sizes
        raise Unsupported(f"symbolic shape {tuple(t.shape)}") from e


class LowerCtx:
    def __init__(self, graph: ir.Graph):
        self.g = graph

    # -- inspection -------------------------------------------------------
    def node(self, r: Ref) -> ir.Node:
        return self.g[r.id]

    def shape(self, x: Any) -> tuple[int, ...]:
        return self.g[x.id].shape if isinstance(x, Ref) else ()

    def dtype(self, x: Any) -> torch.dtype:
        if isinstance(x, Ref):
            return self.g[x.id].dtype
        raise TypeError("scalar has no tensor dtype")

    # -- builders ----------------------------------------------------------
    def pointwise(self, op: str, args: tuple, shape: Sequence[int], dtype: torch.dtype,
                  attrs: Iterable[tuple[str, Any]] = ()) -> Ref:
        if not (dtype in ir.FLOAT8_DTYPES and op in ("cast", "identity")):  # (float8: moved, converted)
            self._check_dtype(dtype)
        return Ref(self.g.add(ir.POINTWISE, op, args, shape, dtype, ir.contiguous_strides(tuple(shape)), attrs))

    def full(self, shape: Sequence[int], value: bool | int | float, dtype: torch.dtype) -> Ref:
        return self.pointwise("full", (), shape, dtype, (("value", value),))

    def empty(self, shape: Sequence[int], dtype: torch.dtype) -> Ref:
        """A tensor without elements: a free node the wrapper allocates (any dtype the
        kernels may write, as nothing is computed)."""
        assert prod(shape) == 0, shape
        if dtype not in HELD_DTYPES:
            raise Unsupported(f"dtype {dtype} is not supported in kernels")
        return Ref(self.g.add(ir.POINTWISE, "full", (), tuple(shape), dtype, ir.contiguous_strides(tuple(shape)),
                              (("value", 0),)))

    def cast(self, x: Any, dtype: torch.dtype) -> Any:
        if not isinstance(x, Ref) or self.dtype(x) == dtype:
            return x
        return self.pointwise("cast", (x,), self.shape(x), dtype)

    def bitcast(self, x: Ref, dtype: torch.dtype) -> Ref:
        """x's bits read as `dtype` of the same size (unsigned results allowed)."""
        if self.dtype(x) == dtype:
            return x
        if dtype not in HELD_DTYPES or torch.bool in (dtype, self.dtype(x)):
            raise Unsupported(f"bit-cast to {dtype} is not supported in kernels")
        if dtype.itemsize != self.dtype(x).itemsize:
            raise Unsupported("bit-cast between sizes changes the last dim: not a stitched form")
        shape = self.shape(x)
        return Ref(self.g.add(ir.POINTWISE, "bitcast", (x,), shape, dtype, ir.contiguous_strides(tuple(shape))))

    def view(self, op: str, x: Ref, shape: Sequence[int], params: Iterable[tuple[str, Any]] = ()) -> Ref:
        shape = tuple(shape)
        src = self.g[x.id]
        if op == "reshape" and src.shape == shape:
            return x
        return Ref(self.g.add(ir.VIEW, op, (x,), shape, src.dtype, ir.contiguous_strides(shape), params))

    def broadcast_to(self, x: Any, shape: Sequence[int]) -> Any:
        shape = tuple(shape)
        if not isinstance(x, Ref) or self.shape(x) == shape:
            return x
        return self.view("expand", x, shape)

    def reshape(self, x: Ref, shape: Sequence[int]) -> Ref:
        shape = tuple(shape)
        if prod(shape) != prod(self.shape(x)):
            raise Unsupported(f"reshape {self.shape(x)} -> {shape} changes element count")
        return self.view("reshape", x, shape)

    def reduce(self, op: str, x: Ref, dims: Iterable[int], keepdim: bool, dtype: torch.dtype) -> Ref:
        shape = self.shape(x)
        nd = len(shape)
        dims = tuple(sorted({d % nd for d in dims})) if nd else ()
        if not dims and nd:
            dims = tuple(range(nd))  # an empty dim list means all dims (ATen convention)
        kept = tuple(s for i, s in enumerate(shape) if i not in dims)
        self._check_dtype(dtype)
        if prod(shape) == 0:
            if prod(kept) == 0:  # an empty result: nothing to reduce, no kernel (issue 19)
                out_shape = tuple(1 if i in dims else s for i, s in enumerate(shape)) if keepdim else kept
                return self.full(out_shape, 0, dtype)
            if op not in ("sum", "prod"):
                raise Unsupported("reduction over an empty tensor")
            # an empty sum (product) is its identity: a constant, no kernel reads `x`
            out_shape = tuple(1 if i in dims else s for i, s in enumerate(shape)) if keepdim else kept
            return self.full(out_shape, 0 if op == "sum" else 1, dtype)
        out = Ref(self.g.add(ir.REDUCE, op, (x,), kept, dtype, ir.contiguous_strides(kept), (("dims", dims),)))
        if keepdim:
            kshape = tuple(1 if i in dims else s for i, s in enumerate(shape))
            out = self.view("reshape", out, kshape)
        return out

    def _check_dtype(self, dtype):
        if dtype not in SUPPORTED_DTYPES:
            raise Unsupported(f"dtype {dtype} is not supported in kernels")
