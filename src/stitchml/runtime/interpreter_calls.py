"""Cheaper `@triton.jit` helper calls under Triton's interpreter (TRITON_INTERPRET=1).

A launch under the interpreter first points `triton.language`'s builtins at the
interpreter's semantics (`_patch_lang`: `inspect.getmembers` over `tl`, `tl.core`,
`tl.tensor` and `tl.math`, wrapping each builtin) and restores them when the launch ends.
Triton 3.9 also does that whole patching again at every call of a `@triton.jit` helper
*inside* the launch (`InterpretedFunction.__call__`), where it changes nothing: the
launch's patches are in place, and the helper's own patch scope is dropped unrestored.
Our kernels call helpers per element block (`_from_bf16`, `_to_bf16`, `_round_bf16`, the
special functions): ~1.5 ms a call, an eighth of the interpreter's time in the test suite.

Here a helper called while a launch is running, from a module whose language modules that
launch patched, runs its rewritten body directly.  A helper called outside any launch, or
one that sees a language module the launch did not patch, keeps Triton's path (so do
Triton's own `@triton.jit` library functions such as `tl.sum`, which see `tl.core`; that
path leaves its patches behind, as it does without this module).  Results are the same by
construction: the same rewritten function runs under the same patches.

Knob `interpreter_calls` (STITCHML_INTERPRETER_CALLS) turns it off; `install` is called
when stitchml is imported under the interpreter.
"""
from __future__ import annotations

import inspect
import os
from typing import Any

STATS = {"direct": 0, "patched": 0}   # helper calls run directly, and through Triton's re-patching
_ORIGINAL: dict[str, Any] = {}        # Triton's two methods (and its error class), while ours replace them
_ACTIVE: list[frozenset[int]] = []    # language modules patched by each running launch (innermost last)
_LANGS: dict[Any, frozenset[int]] = {}


def _langs(fn: Any) -> frozenset[int]:
    """The `triton.language` modules `_patch_lang(fn)` would patch: those of tl and
    tl.core among `fn`'s module globals (kept per function)."""
    known = _LANGS.get(fn)
    if known is None:
        import triton.language as tl
        wanted = (tl, tl.core)
        known = frozenset(id(v) for v in fn.__globals__.values() if inspect.ismodule(v) and v in wanted)
        _LANGS[fn] = known
    return known


def _launch(self, *args: Any, **kwargs: Any) -> Any:
    """`GridExecutor.__call__`, recording which language modules the launch patches."""
    _ACTIVE.append(_langs(self.fn))
    try:
        return _ORIGINAL["launch"](self, *args, **kwargs)
    finally:
        _ACTIVE.pop()


def _helper_call(self, *args: Any, **kwargs: Any) -> Any:
    """`InterpretedFunction.__call__` (a device function call) without the redundant
    re-patching when the running launch has patched everything the helper sees."""
    langs = _langs(self.fn)
    if not _ACTIVE or not langs or not langs <= _ACTIVE[-1]:
        STATS["patched"] += 1
        return _ORIGINAL["call"](self, *args, **kwargs)
    STATS["direct"] += 1
    fn = self.rewrite()
    try:
        return fn(*args, **kwargs)
    except Exception as e:   # (as Triton's own call reports it)
        raise _ORIGINAL["error"](repr(e)) from e


def install() -> bool:
    """Put the two methods in place (once, and only under TRITON_INTERPRET with knob
    `interpreter_calls` on); whether they are in place.  Left alone, and False, if this
    Triton lacks the methods they wrap."""
    if _ORIGINAL:
        return True
    from .. import config
    if os.environ.get("TRITON_INTERPRET", "0") in ("", "0") or not config.get("interpreter_calls"):
        return False
    from triton.runtime import interpreter
    grid = getattr(interpreter, "GridExecutor", None)
    func = getattr(interpreter, "InterpretedFunction", None)
    if grid is None or func is None or not hasattr(func, "rewrite") or not hasattr(interpreter, "_patch_lang"):
        return False
    try:
        from triton.runtime.errors import InterpreterError
    except ImportError:
        return False
    _ORIGINAL["launch"], _ORIGINAL["call"], _ORIGINAL["error"] = grid.__call__, func.__call__, InterpreterError
    grid.__call__, func.__call__ = _launch, _helper_call
    return True


def uninstall() -> None:
    """Triton's own methods again (tests compare the two)."""
    if not _ORIGINAL:
        return
    from triton.runtime import interpreter
    interpreter.GridExecutor.__call__ = _ORIGINAL["launch"]
    interpreter.InterpretedFunction.__call__ = _ORIGINAL["call"]
    _ORIGINAL.clear()
