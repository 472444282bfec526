"""Count real Triton launches (interpreter grid executions) during a block."""
import contextlib

import triton.runtime.interpreter as interp


@contextlib.contextmanager
def count_launches():
    counter = {"n": 0}
    original = interp.GridExecutor.__call__

    def counted(self, *args, **kwargs):
        counter["n"] += 1
        return original(self, *args, **kwargs)

    interp.GridExecutor.__call__ = counted
    try:
        yield counter
    finally:
        interp.GridExecutor.__call__ = original
