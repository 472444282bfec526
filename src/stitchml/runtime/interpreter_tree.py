"""Tree-ordered reductions and scans for Triton's interpreter (TRITON_INTERPRET=1).

Triton's interpreter runs `tl.sum`, `tl.max`, `tl.min`, `tl.argmax` and `tl.cumsum`
with NumPy, but a `tl.reduce` or `tl.associative_scan` with any other combine function
(our NaN-propagating max, index-carrying argmax, Welford and log-add-exp combines,
tuple carries) element by element in a Python loop: one call of the combine function
and a handful of NumPy scalars per element of the block.  A row of 8192 values then
costs ~0.1 s a program, and such combines are in most kernels the test suite runs.

Here the same combine function is applied to whole arrays, in the order a GPU uses:
- reduce: pairwise halving along the axis, `combine(element 2i, element 2i+1)`, until
  one remains: log2(n) vectorised calls;
- scan: inclusive Hillis-Steele steps, `out[i] = combine(out[i - d], out[i])` for
  d = 1, 2, 4, …: log2(n) vectorised calls.
Left operands always come from lower indices, so any associative combine (Triton
requires one) gives the same value as the sequential loop up to floating-point
reassociation, which a GPU's tree does too.  An axis that is not a power of two (Triton's
blocks always are), and any combine function that does not take arrays, go to Triton's
own loop, and so does a combine with Python control flow on its values (the interpreter
gives a block's truth value as True, so a tree would silently take one branch).

Knob `interpreter_tree` (STITCHML_INTERPRETER_TREE) turns it off; `install` is called
when stitchml is imported under the interpreter.
"""
from __future__ import annotations

import ast
import inspect
import os
import textwrap
from typing import Any

import numpy as np

STATS = {"tree": 0, "loop": 0}   # calls served by the tree forms, and sent to Triton's loop
_ORIGINAL: dict[str, Any] = {}   # Triton's element loops, while the trees replace them


def _data(value: Any, like: np.ndarray) -> np.ndarray:
    """A combine result as an array of `like`'s dtype and shape (a combine may return a
    Python constant or a scalar tensor for one of its outputs)."""
    data = value.handle.data if hasattr(value, "handle") else np.asarray(value)
    return np.broadcast_to(np.asarray(data).astype(like.dtype, copy=False), like.shape)


_ELEMENTWISE: dict[Any, bool] = {}


def _elementwise(fn) -> bool:
    """Whether a combine function is straight-line code that takes whole arrays as it
    takes scalars.  Python control flow on values (`if a > b:`, `and`/`or`, `x if c
    else y`) asks a tensor for its truth value, which the interpreter answers for one
    element only (for a block it says True): such combines keep Triton's loop."""
    known = _ELEMENTWISE.get(fn)
    if known is None:
        try:
            tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
            known = not any(isinstance(n, (ast.If, ast.While, ast.For, ast.IfExp, ast.BoolOp, ast.Assert))
                            for n in ast.walk(tree.body[0]) if n is not tree.body[0])
        except (OSError, TypeError, SyntaxError, IndexError):
            known = False
        _ELEMENTWISE[fn] = known
    return known


def _combine(op, left: list[np.ndarray], right: list[np.ndarray], dtypes: list) -> list[np.ndarray]:
    args = [op.to_tensor(a, t) for a, t in zip(left, dtypes)] + [op.to_tensor(a, t) for a, t in zip(right, dtypes)]
    out = op.combine_fn.fn(*args)
    out = out if isinstance(out, tuple) else (out,)
    return [_data(v, a) for v, a in zip(out, left)]


def _loop(kind: str, op, input):
    STATS["loop"] += 1
    return _ORIGINAL[kind](op, input)


def _tree_reduce(self, input):
    """`ReduceOps.generic_reduce` by pairwise halving (see the module doc)."""
    original_axis = self.axis
    flat, axis = self.unravel(input, self.axis)
    arrays = [t.handle.data for t in flat]
    dtypes = [t.dtype for t in flat]
    n = arrays[0].shape[axis]
    if n == 0 or n & (n - 1) or not _elementwise(self.combine_fn.fn):
        return _loop("reduce", self, input)   # (Triton's blocks are powers of two: the halves stay blocks)
    try:
        while n > 1:
            pairs = n // 2
            lo = [np.take(a, np.arange(0, 2 * pairs, 2), axis=axis) for a in arrays]
            hi = [np.take(a, np.arange(1, 2 * pairs, 2), axis=axis) for a in arrays]
            merged = _combine(self, lo, hi, dtypes)
            arrays, n = merged, pairs
    except Exception:   # a combine that does not take arrays: Triton's element loop
        return _loop("reduce", self, input)
    STATS["tree"] += 1
    out = []
    for a, t in zip(arrays, dtypes):
        data = np.squeeze(a, axis=axis)
        if self.keep_dims:
            if original_axis is not None:
                data = np.expand_dims(data, axis)
            else:
                data = data.reshape((1,) * len(input[0].handle.data.shape))
        elif original_axis is None:
            data = data.item()
        out.append(self.to_tensor(data, t))
    return out


def _tree_scan(self, input):
    """`ScanOps.generic_scan` by Hillis-Steele steps (see the module doc).  Every call of
    the combine takes whole blocks (the interpreter accepts power-of-two shapes only):
    lanes below the step's distance combine with themselves and keep their old value."""
    arrays = [np.array(t.handle.data) for t in input]
    dtypes = [t.dtype for t in input]
    axis = self.axis
    n = arrays[0].shape[axis]
    if n == 0 or n & (n - 1) or not _elementwise(self.combine_fn.fn):
        return _loop("scan", self, input)
    at = np.arange(n)
    lane = at.reshape([n if i == axis else 1 for i in range(arrays[0].ndim)])
    try:
        d = 1
        while d < n:
            left = [np.take(a, np.where(at >= d, at - d, at), axis=axis) for a in arrays]
            merged = _combine(self, left, arrays, dtypes)
            arrays = [np.where(lane >= d, m, a) for m, a in zip(merged, arrays)]
            d *= 2
    except Exception:
        return _loop("scan", self, input)
    STATS["tree"] += 1
    return [self.to_tensor(a, t) for a, t in zip(arrays, dtypes)]


def install() -> bool:
    """Replace the interpreter's element loops (once, and only under TRITON_INTERPRET
    with knob `interpreter_tree` on); whether the tree forms are in place."""
    if _ORIGINAL:   # (holds Triton's loops while the trees are in place)
        return True
    from .. import config
    if os.environ.get("TRITON_INTERPRET", "0") in ("", "0") or not config.get("interpreter_tree"):
        return False
    from triton.runtime import interpreter
    _ORIGINAL["reduce"] = interpreter.ReduceOps.generic_reduce
    _ORIGINAL["scan"] = interpreter.ScanOps.generic_scan
    interpreter.ReduceOps.generic_reduce = _tree_reduce
    interpreter.ScanOps.generic_scan = _tree_scan
    return True


def uninstall() -> None:
    """Triton's own element loops again (tests compare the two)."""
    if not _ORIGINAL:
        return
    from triton.runtime import interpreter
    interpreter.ReduceOps.generic_reduce = _ORIGINAL["reduce"]
    interpreter.ScanOps.generic_scan = _ORIGINAL["scan"]
    _ORIGINAL.clear()
