"""Triton's interpreter (TRITON_INTERPRET=1) without its dead int32 overflow checks.

The interpreter's options turn `sanitize_overflow` on.  Every add, subtract and multiply
of 32-bit integers then also casts both operands to int64, redoes the operation and
compares the result with the type's bounds, four more interpreted operations for each
one, and then hands the comparison to `device_assert`, which drops it: the interpreter
runs without debug mode, where an assert is not emitted.  So nothing is ever checked,
and the work is pure cost.  Our kernels' index arithmetic is such operations (row x
stride + column, every block), and so are the bit manipulations of the bfloat16 rounding
helpers: ~37 % of the time of an interpreter-heavy test (a layer norm's prefetched walks,
57 -> 36 s).

Here the option is turned off when stitchml is imported under the interpreter, unless
the interpreter's options ask for debug mode (then the checks do assert, and stay).
Results cannot change: the checks compute on copies.  `install` is called at import;
`uninstall` puts Triton's options back.
"""
from __future__ import annotations

import dataclasses
import os
from typing import Any

_ORIGINAL: dict[str, Any] = {}   # the interpreter's options, while ours replace them


def install() -> bool:
    """Turn the checks off (once, under TRITON_INTERPRET, outside debug mode); whether they
    are off.  Left alone, and False, where this Triton's interpreter has no such option."""
    if _ORIGINAL:
        return True
    if os.environ.get("TRITON_INTERPRET", "0") in ("", "0"):
        return False
    from triton.runtime import interpreter
    builder = getattr(interpreter, "interpreter_builder", None)
    options = getattr(builder, "options", None)
    if (not dataclasses.is_dataclass(options) or not getattr(options, "sanitize_overflow", False)
            or getattr(options, "debug", True)):
        return False
    _ORIGINAL["options"] = options
    builder.options = dataclasses.replace(options, sanitize_overflow=False)
    return True


def uninstall() -> None:
    """The interpreter's own options again (tests compare the two)."""
    if not _ORIGINAL:
        return
    from triton.runtime import interpreter
    interpreter.interpreter_builder.options = _ORIGINAL.pop("options")
