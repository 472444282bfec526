"""runtime/interpreter_calls.py: a `@triton.jit` helper called inside a running launch
runs without Triton re-patching `triton.language`; the values are those of Triton's own
path, the language is restored after every launch, and calls outside a launch (or that
see a language module the launch did not patch) keep Triton's path."""
import os

import pytest
import torch
import triton
import triton.language as tl

from stitchml.runtime import interpreter_calls

pytestmark = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET", "0") in ("", "0"),
                                reason="the interpreter's helper calls: under TRITON_INTERPRET=1 only")


@triton.jit
def _scaled_exp(x, s):
    return tl.exp(x * s)


@triton.jit
def _twice(x):
    # a helper calling a helper
    return _scaled_exp(x, 0.5) + _scaled_exp(x, 0.25)


@triton.jit
def _kernel(x_ptr, y_ptr, n, B: tl.constexpr):
    i = tl.program_id(0) * B + tl.arange(0, B)
    m = i < n
    x = tl.load(x_ptr + i, mask=m, other=0.0)
    tl.store(y_ptr + i, _twice(x) - tl.sum(_scaled_exp(x, 1.0), 0), mask=m)


def _run(x: torch.Tensor) -> torch.Tensor:
    y = torch.full_like(x, float("nan"))   # poisoned
    _kernel[(triton.cdiv(x.numel(), 64),)](x, y, x.numel(), B=64)
    return y


def _language_state() -> dict:
    return {(mod.__name__, name): getattr(mod, name, None) for mod in (tl, tl.core, tl.math, tl.tensor)
            for name in ("exp", "sum", "where", "reduce", "associative_scan", "multiple_of", "__add__", "to")}


@pytest.fixture
def installed():
    was = bool(interpreter_calls._ORIGINAL)
    assert interpreter_calls.install(), "stitchml installs it under TRITON_INTERPRET"
    yield
    if not was:
        interpreter_calls.uninstall()


def test_helpers_inside_a_launch_run_directly_with_triton_s_values(installed):
    x = torch.randn(200)
    before = dict(interpreter_calls.STATS)
    got = _run(x)
    direct = interpreter_calls.STATS["direct"] - before["direct"]
    # 4 programs x (_twice, its two _scaled_exp calls, the kernel's own _scaled_exp)
    assert direct == 4 * 4, interpreter_calls.STATS
    interpreter_calls.uninstall()
    try:
        want = _run(x)
    finally:
        interpreter_calls.install()
    assert torch.equal(got, want)
    padded = torch.cat([x, torch.zeros(56)])   # (the last block's masked lanes load 0: exp(0) = 1 in its sum)
    ref = torch.exp(x * 0.5) + torch.exp(x * 0.25) - torch.exp(padded).view(4, 64).sum(1).repeat_interleave(64)[:200]
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)


@triton.jit
def _plain_kernel(x_ptr, y_ptr, n, B: tl.constexpr):
    i = tl.program_id(0) * B + tl.arange(0, B)
    tl.store(y_ptr + i, _twice(tl.load(x_ptr + i, mask=i < n)), mask=i < n)


def test_the_language_is_restored_after_each_launch(installed):
    """Every helper of this kernel runs directly, and the launch leaves `triton.language`
    exactly as it found it.  (Triton's own path does not: a standard-library helper such
    as `tl.sum`, a `@triton.jit` function that sees `tl.core`, re-patches it at each call and
    leaves that behind; it still goes that way here, as without this module.)"""
    _run(torch.randn(70))   # (Triton's path for tl.sum: whatever it leaves, before the state is taken)
    state = _language_state()
    before = dict(interpreter_calls.STATS)
    x = torch.randn(70)
    y = torch.full_like(x, float("nan"))
    _plain_kernel[(2,)](x, y, 70, B=64)
    assert _language_state() == state
    assert interpreter_calls.STATS["patched"] == before["patched"]
    assert interpreter_calls.STATS["direct"] == before["direct"] + 2 * 3
    torch.testing.assert_close(y, torch.exp(x * 0.5) + torch.exp(x * 0.25))


def test_a_call_outside_a_launch_keeps_triton_s_path(installed):
    """With no launch running, a helper call goes through Triton's own path (which
    patches the language itself), whatever Triton makes of it; launches stay right after."""
    before = interpreter_calls.STATS["patched"]
    try:
        _twice(torch.ones(3))
    except Exception:   # (Triton's business: a bare call is not a launch)
        pass
    assert interpreter_calls.STATS["patched"] > before
    x = torch.randn(64)
    torch.testing.assert_close(_run(x), torch.exp(x * 0.5) + torch.exp(x * 0.25) - torch.exp(x).sum(),
                               rtol=1e-5, atol=1e-5)


def test_knob_off_leaves_triton_alone(monkeypatch):
    from triton.runtime import interpreter
    was = bool(interpreter_calls._ORIGINAL)
    interpreter_calls.uninstall()
    try:
        monkeypatch.setenv("STITCHML_INTERPRETER_CALLS", "0")
        assert not interpreter_calls.install()
        assert interpreter.InterpretedFunction.__call__ is not interpreter_calls._helper_call
        monkeypatch.setenv("STITCHML_INTERPRETER_CALLS", "1")
        assert interpreter_calls.install()
        assert interpreter.InterpretedFunction.__call__ is interpreter_calls._helper_call
        assert interpreter.GridExecutor.__call__ is interpreter_calls._launch
    finally:
        if not was:
            interpreter_calls.uninstall()


@triton.jit
def _bad_shape(x):
    return x + tl.zeros([4], tl.float32)    # a 64-wide block and a 4-wide one: no broadcast


@triton.jit
def _bad_kernel(x_ptr, B: tl.constexpr):
    i = tl.arange(0, B)
    tl.store(x_ptr + i, _bad_shape(tl.load(x_ptr + i)))


def test_an_error_in_a_helper_is_reported_as_triton_reports_it(installed):
    """As Triton's own helper call does: the helper's error wrapped in Triton's
    InterpreterError (which the launch wraps once more)."""
    from triton.runtime.errors import InterpreterError
    before = interpreter_calls.STATS["direct"]
    with pytest.raises(InterpreterError, match=r"InterpreterError\("):
        _bad_kernel[(1,)](torch.randn(64), B=64)
    assert interpreter_calls.STATS["direct"] == before + 1
