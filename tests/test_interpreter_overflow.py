"""runtime/interpreter_overflow.py: under the interpreter, int32 arithmetic runs without
Triton's overflow checks, which outside debug mode compute a comparison and drop it: the
values are those of the interpreter's own options (both wrap), and only in debug mode do
the checks assert, where they are left on."""
import dataclasses
import os

import pytest
import torch
import triton
import triton.language as tl

import stitchml  # noqa: F401  (installs it)
from stitchml.runtime import interpreter_overflow

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
    assert interpreter_overflow.install(), "stitchml turns the checks off under TRITON_INTERPRET"
    builder = interpreter.interpreter_builder
    assert not builder.options.sanitize_overflow
    x = torch.randint(0, 2**29, (200,), dtype=torch.int32)
    wide = x.to(torch.int64) * 3 + 2_000_000_000
    assert (wide > 2**31 - 1).any()   # some do overflow
    got = _run(x)
    assert torch.equal(got, ((wide + 2**31) % 2**32 - 2**31).to(torch.int32))   # wrapped, as compiled
    interpreter_overflow.uninstall()
    try:
        assert builder.options.sanitize_overflow and not builder.options.debug
        assert torch.equal(_run(x), got)   # the interpreter's own options: the same values
        debug = builder.options
        builder.options = dataclasses.replace(debug, debug=True)
        try:   # in debug mode the checks assert, and install leaves them on
            assert not interpreter_overflow.install()
            with pytest.raises(Exception, match="overflow"):
                _run(x)
        finally:
            builder.options = debug
    finally:
        assert interpreter_overflow.install()
    assert not builder.options.sanitize_overflow
