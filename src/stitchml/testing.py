"""Compare a compiled function with eager PyTorch: outputs, input gradients, and
input mutations, on the same fresh inputs.  Used by our tests; usable by users."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch

from .capture.backend import StitchBackend

TOL = {torch.float32: (1e-4, 1e-5), torch.float64: (1e-7, 1e-9), torch.float16: (1e-2, 1e-2),
       torch.bfloat16: (2e-2, 2e-2)}


@dataclass
class Comparison:
    backend: StitchBackend
    outputs: Any
    expected: Any

    @property
    def launches_per_graph(self) -> list[int]:
        return [r.plan.num_kernels if r.plan is not None else -1 for r in self.backend.records]

    @property
    def num_kernels(self) -> int:
        return sum(r.plan.num_kernels for r in self.backend.records if r.plan is not None)


def _clone(x):
    if isinstance(x, torch.Tensor):
        y = x.detach().clone()
        return y.requires_grad_(x.requires_grad)
    return x


def _flat(out) -> list[torch.Tensor]:
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, (tuple, list)):
        return [t for o in out for t in _flat(o)]
    if isinstance(out, dict) or hasattr(out, "values"):
        return [t for o in out.values() for t in _flat(o)]
    return []


def assert_close(actual: torch.Tensor, expected: torch.Tensor, what: str, rtol=None, atol=None) -> None:
    if expected.dtype.is_floating_point:
        r, a = TOL.get(expected.dtype, (1e-4, 1e-5))
        rtol, atol = rtol or r, atol or a
    torch.testing.assert_close(actual, expected, rtol=rtol or 0, atol=atol or 0, equal_nan=True,
                               msg=lambda m: f"{what}: {m}")


def compare_with_eager(fn: Callable, inputs: Sequence[Any], *, backward: bool = True, rtol=None, atol=None,
                       fullgraph: bool = False, grad_rtol=None, grad_atol=None) -> Comparison:
    """Run `fn` eagerly and compiled on copies of `inputs`; check outputs, gradients of
    every input that requires grad (for a random cotangent), and mutated inputs.
    `grad_rtol`/`grad_atol` (default: `rtol`/`atol`) loosen gradients alone, e.g. for
    bf16, where eager rounds every backward intermediate and kernels do not."""
    backend = StitchBackend()
    eager_in = [_clone(x) for x in inputs]
    comp_in = [_clone(x) for x in inputs]
    expected = fn(*eager_in)
    actual = torch.compile(fn, backend=backend, fullgraph=fullgraph)(*comp_in)
    exp_t, act_t = _flat(expected), _flat(actual)
    assert len(exp_t) == len(act_t), "different number of outputs"
    for i, (a, e) in enumerate(zip(act_t, exp_t)):
        assert a.shape == e.shape and a.dtype == e.dtype, f"output {i}: {a.shape}/{a.dtype} vs {e.shape}/{e.dtype}"
        assert_close(a, e, f"output {i}", rtol, atol)
    for i, (a, e) in enumerate(zip(comp_in, eager_in)):
        if isinstance(e, torch.Tensor):
            assert_close(a.detach(), e.detach(), f"input {i} after the call (mutation)", rtol, atol)
    if backward and any(isinstance(x, torch.Tensor) and x.requires_grad for x in inputs):
        grads = [torch.randn_like(e) if e.requires_grad and e.dtype.is_floating_point else None for e in exp_t]
        pairs = [(a, e, g) for a, e, g in zip(act_t, exp_t, grads) if g is not None]
        torch.autograd.backward([e for _, e, _ in pairs], [g for _, _, g in pairs])
        torch.autograd.backward([a for a, _, _ in pairs], [g for _, _, g in pairs])
        for i, (a, e) in enumerate(zip(comp_in, eager_in)):
            if isinstance(e, torch.Tensor) and e.requires_grad:
                assert a.grad is not None, f"input {i}: no gradient"
                assert_close(a.grad, e.grad, f"grad of input {i}", grad_rtol or rtol, grad_atol or atol)
    return Comparison(backend, actual, expected)
