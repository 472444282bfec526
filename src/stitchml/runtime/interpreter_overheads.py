"""Work Triton's interpreter (TRITON_INTERPRET=1) does that changes nothing, removed.

1. Int32 overflow checks.  The interpreter's options turn `sanitize_overflow` on.  Every
   add, subtract and multiply of 32-bit integers then also casts both operands to int64,
   redoes the operation and compares the result with the type's bounds, four more
   interpreted operations for each one, and then hands the comparison to `device_assert`,
   which drops it: the interpreter runs without debug mode, where an assert is not
   emitted.  Nothing is ever checked.  Our kernels' index arithmetic is such operations
   (row x stride + column, every block), and so are the bit manipulations of the bfloat16
   rounding helpers: ~37 % of the time of an interpreter-heavy test (a layer norm's
   prefetched walks, 57 -> 36 s).  The option is turned off unless the interpreter's
   options ask for debug mode (then the checks do assert, and stay).  Results cannot
   change: the checks compute on copies.
2. The NumPy dtype of a Triton type.  `interpreter._get_np_dtype` builds its table of 19
   types (19 `np.dtype` objects, 19 hashes) at every call, ~900,000 calls in that test;
   here each answer is kept by the type's class and name (a type's name spells its
   element type, and a block's shape), asking Triton's function once per type.

`install` is called when stitchml is imported under the interpreter; `uninstall` puts
Triton's own back (tests compare the two).
"""
from __future__ import annotations

import dataclasses
import os
from typing import Any

_ORIGINAL: dict[str, Any] = {}   # what ours replace, while they do


def _np_dtype_kept(original):
    kept: dict[tuple[type, str], Any] = {}

    def np_dtype(tt_dtype):
        key = (type(tt_dtype), getattr(tt_dtype, "name", None))
        found = kept.get(key)
        if found is None:
            found = original(tt_dtype)
            if key[1] is not None:
                kept[key] = found
        return found
    return np_dtype


def install() -> bool:
    """Remove both (once, under TRITON_INTERPRET; the checks only outside debug mode);
    whether anything was replaced.  Each is left alone where this Triton's interpreter
    lacks what it replaces."""
    if _ORIGINAL:
        return True
    if os.environ.get("TRITON_INTERPRET", "0") in ("", "0"):
        return False
    from triton.runtime import interpreter
    builder = getattr(interpreter, "interpreter_builder", None)
    options = getattr(builder, "options", None)
    if (dataclasses.is_dataclass(options) and getattr(options, "sanitize_overflow", False)
            and not getattr(options, "debug", True)):
        _ORIGINAL["options"] = options
        builder.options = dataclasses.replace(options, sanitize_overflow=False)
    if callable(getattr(interpreter, "_get_np_dtype", None)):
        _ORIGINAL["np_dtype"] = interpreter._get_np_dtype
        interpreter._get_np_dtype = _np_dtype_kept(interpreter._get_np_dtype)
    return bool(_ORIGINAL)


def uninstall() -> None:
    """Triton's own options and dtype function again."""
    from triton.runtime import interpreter
    if "options" in _ORIGINAL:
        interpreter.interpreter_builder.options = _ORIGINAL.pop("options")
    if "np_dtype" in _ORIGINAL:
        interpreter._get_np_dtype = _ORIGINAL.pop("np_dtype")
