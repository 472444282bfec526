"""Triton helpers that generated kernels and the hand-written kernels of `patterns/`
share: generated kernels get them through `triton_ops.PRELUDE`, which imports this
module; `patterns/linear_ce_op.py` imports them directly.  (Hashed with the rest of
`codegen/` into the kernel cache's compiler version.)"""
from __future__ import annotations

import triton
import triton.language as tl
from triton.language.extra import libdevice
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

_INTERPRETED = tl.constexpr(bool(triton.knobs.runtime.interpret))


@triton.jit
def _exp_ftz(x):
    # exp of a float32 through libdevice's fast_expf (ex2.approx.ftz): results below
    # 2**-126 are 0.  Triton's `exp` (ex2.approx without ftz) costs three more sm_90
    # instructions an element to keep subnormal results, which a sum of at least 1 (an
    # online softmax's, codegen/emit_reduce.py) does not need.  The interpreter has no
    # libdevice fast_expf: tl.exp there.
    if _INTERPRETED:
        return tl.exp(x)
    else:
        return libdevice.fast_expf(x)


@triton.jit
def _gdc_wait():
    # programmatic dependent launch (runtime/pdl.py): wait until the grid before this one
    # in the stream has finished and its writes are visible.  First in a kernel launched
    # with `launch_pdl`, before any global memory access.  A no-op without PDL, and under
    # the interpreter (which runs launches one after another anyway).
    if not _INTERPRETED:
        gdc_wait()


@triton.jit
def _gdc_launch_dependents():
    # programmatic dependent launch: the next kernel of the stream may start launching
    # once every program of this one got here (it then waits in its `_gdc_wait`), so its
    # launch and start overlap this kernel's tail.  A no-op without PDL.
    if not _INTERPRETED:
        gdc_launch_dependents()


__all__ = ["_exp_ftz", "_gdc_launch_dependents", "_gdc_wait"]
