"""Triton helpers that generated kernels and the hand-written kernels of `patterns/`
share: generated kernels get them through `triton_ops.PRELUDE`, which imports this
module; `patterns/linear_ce_op.py` imports them directly.  (Hashed with the rest of
`codegen/` into the kernel cache's compiler version.)"""
from __future__ import annotations

import triton
import triton.language as tl
from triton.language.extra import libdevice

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


__all__ = ["_exp_ftz"]
