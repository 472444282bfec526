"""runtime/interpreter_overheads.py: under the interpreter, int32 arithmetic runs without
Triton's overflow checks, which outside debug mode compute a comparison and drop it (the
values are those of the interpreter's own options: both wrap; in debug mode the checks
assert, and are left on), and a Triton type's NumPy dtype is kept instead of rebuilt."""
import dataclasses
import os

import numpy as np
import pytest
import torch
import triton
import triton.language as tl

import stitchml  # noqa: F401  (installs it)
from stitchml.runtime import interpreter_overheads

pytestmark = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET", "0") in ("", "0"),
                                reason="the interpreter's options: under TRITON_INTERPRET=1 only")


@triton.jit
def _wrapping_add(x_ptr, y_ptr, n, B: tl.constexpr):
    i = tl.program_id(0) * B + tl.arange(0, B)
    x = tl.load(x_ptr + i, mask=i < n, other=0)
    tl.store(y_ptr + i, x * 3 + 2_000_000_000, mask=i < n)


def _run(x: torch.Tensor) -> torch.Tensor:
    y = torch.full_like(x, -7)   # poisoned
    _wrapping_add[(triton.cdiv(x.numel(), 64),)](x, y, x.numel(), B=64)
    return y


def test_int32_arithmetic_runs_unchecked_with_the_interpreters_values():
    from triton.runtime import interpreter
    assert interpreter_overheads.install(), "stitchml installs it under TRITON_INTERPRET"
    builder = interpreter.interpreter_builder
    assert not builder.options.sanitize_overflow
    x = torch.randint(0, 2**29, (200,), dtype=torch.int32)
    wide = x.to(torch.int64) * 3 + 2_000_000_000
    assert (wide > 2**31 - 1).any()   # some do overflow
    got = _run(x)
    assert torch.equal(got, ((wide + 2**31) % 2**32 - 2**31).to(torch.int32))   # wrapped, as compiled
    interpreter_overheads.uninstall()
    try:
        assert builder.options.sanitize_overflow and not builder.options.debug
        assert torch.equal(_run(x), got)   # the interpreter's own options: the same values
        debug = builder.options
        builder.options = dataclasses.replace(debug, debug=True)
        try:   # in debug mode the checks assert, and install leaves them on
            interpreter_overheads.install()
            assert builder.options.sanitize_overflow
            with pytest.raises(Exception, match="overflow"):
                _run(x)
            interpreter_overheads.uninstall()
        finally:
            builder.options = debug
    finally:
        assert interpreter_overheads.install()
    assert not builder.options.sanitize_overflow


def test_kept_numpy_dtypes_are_tritons():
    from triton.runtime import interpreter
    assert interpreter_overheads.install()
    kept = interpreter._get_np_dtype
    own = interpreter_overheads._ORIGINAL["np_dtype"]
    assert kept is not own
    scalars = [tl.int1, tl.int8, tl.uint8, tl.int16, tl.uint16, tl.int32, tl.uint32, tl.int64, tl.uint64,
               tl.float16, tl.bfloat16, tl.float32, tl.float64, tl.float8e5, tl.float8e4nv]
    types = scalars + [tl.pointer_type(t) for t in scalars] + [tl.block_type(t, [2, 64]) for t in scalars]
    types += [tl.block_type(tl.pointer_type(tl.float32), [4]), tl.block_type(tl.bfloat16, [8])]
    for _ in range(2):   # asked, then kept
        for t in types:
            assert kept(t) == own(t) and isinstance(kept(t), np.dtype), t
    # a block of int32 and one of bfloat16 with the same shape are told apart
    assert kept(tl.block_type(tl.int32, [2, 64])) != kept(tl.block_type(tl.bfloat16, [2, 64]))
