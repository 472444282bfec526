"""What one benchmark case is: a function, the inputs every contender shares, what
is timed (forward, backward, or both), the byte floor, and how to check a result.

A suite module lists `CaseSpec`s; a spec is built into a `Workload` only when it
runs (one dtype at a time), so a full run never holds every case's tensors at once.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import torch

DTYPES: dict[str, torch.dtype] = {"fp32": torch.float32, "bf16": torch.bfloat16}

# what a step computes (and what is timed):
#   fwd     the function under no_grad
#   bwd     the backward only: the forward runs once before timing, each timed step is
#           autograd.grad(outputs, grad_targets, cotangents, retain_graph=True)
#   fwdbwd  forward + backward in every step (a training step without the optimizer)
MODES = ("fwd", "bwd", "fwdbwd")


@dataclass
class CheckOutcome:
    ok: bool
    max_rel_err: float
    detail: str = ""


# checker(actual, expected) -> outcome; both are flat lists: outputs, then gradients
Checker = Callable[[list[torch.Tensor], list[torch.Tensor]], CheckOutcome]


@dataclass
class JaxSpec:
    """How to express a case in JAX.  `build(jax)` gets the imported `jax` module and
    returns `f(key, *arrays) -> array | tuple of arrays`, taking the workload's tensor
    inputs in the same order (non-tensor inputs are dropped).  `argnums` are the
    positions (in that tensor-only list) differentiated in bwd / fwdbwd modes."""

    build: Callable[[Any], Callable[..., Any]]
    argnums: tuple[int, ...] = ()
    note: str = ""


@dataclass
class Workload:
    """One case at one dtype, ready to run."""

    name: str
    suite: str
    dtype: str
    fn: Callable[..., Any]
    inputs: list[Any]
    mode: str = "fwd"
    grad_targets: list[torch.Tensor] = field(default_factory=list)
    grad_names: list[str] | None = None   # for messages (models: parameter names)
    shape: str = ""
    # the fewest bytes a perfect implementation moves: inputs read once, outputs (and
    # gradients) written once; None = counted by the harness from the tensors; 0 = not
    # meaningful (models: matrix products dominate)
    min_bytes: int | None = None
    tol: float = 1e-4
    # custom correctness check (random results: check structure, not values)
    checker: Checker | None = None
    # a deterministic twin (e.g. the same code fed pre-drawn random numbers) that is
    # checked value-for-value against eager before the real case runs
    check_variant: "Workload | None" = None
    # stitchml must produce exactly this many launches per call (simulator: 1)
    expect_stitch_kernels: int | None = None
    jax: JaxSpec | None = None
    notes: str = ""
    # cotangents for bwd / fwdbwd, made once from eager's outputs and shared
    cotangents: list[torch.Tensor] | None = None
    # the same step in float64 (outputs, then gradients, as `harness.reference` lists them),
    # given the shared cotangents: a row that misses its tolerance against eager is judged
    # against it instead (eager can be the inaccurate one: BatchNorm's CPU backward)
    truth: "Callable[[list[torch.Tensor]], list[torch.Tensor]] | None" = None
    truth_values: list[torch.Tensor] | None = None   # (computed once, when first needed)

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"{self.name}: mode {self.mode!r} not in {MODES}")


@dataclass
class CaseSpec:
    """A named case of a suite; `build(dtype, device)` makes its Workload."""

    name: str
    suite: str
    build: Callable[[str, torch.device], Workload]
    dtypes: tuple[str, ...] = ("fp32", "bf16")
    family: str = ""          # the name without its size label, for --case matching
    requires: tuple[str, ...] = ()   # importable modules the case needs (e.g. transformers)

    def __post_init__(self) -> None:
        if not self.family:
            self.family = self.name.split("[", 1)[0]


def flat_tensors(out: Any) -> list[torch.Tensor]:
    """Every tensor in a (nested) output, in order; HF ModelOutput-like objects too."""
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, (tuple, list)):
        return [t for o in out for t in flat_tensors(o)]
    if isinstance(out, dict) or hasattr(out, "values"):
        return [t for o in out.values() for t in flat_tensors(o)]
    return []


def tensor_bytes(ts: list[Any]) -> int:
    return sum(t.numel() * t.element_size() for t in ts if isinstance(t, torch.Tensor))


def floor_bytes(w: Workload, outputs: list[torch.Tensor], grads: list[torch.Tensor]) -> int:
    """The minimal byte count of a step, counted from the tensors eager produced:
    fwd reads the inputs and writes the outputs; bwd reads the inputs and the
    cotangents and writes the gradients; fwdbwd reads the inputs (and non-scalar
    cotangents) and writes outputs and gradients."""
    if w.min_bytes is not None:
        return w.min_bytes
    ins = tensor_bytes(w.inputs)
    cots = tensor_bytes([c for c in (w.cotangents or []) if c.numel() > 1])
    if w.mode == "fwd":
        return ins + tensor_bytes(outputs)
    if w.mode == "bwd":
        return ins + cots + tensor_bytes(grads)
    return ins + cots + tensor_bytes(outputs) + tensor_bytes(grads)


def randn(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device, gen: torch.Generator,
          *, scale: float = 1.0, shift: float = 0.0) -> torch.Tensor:
    """Seeded normal numbers drawn on the CPU (the same values on every device), then moved."""
    t = torch.randn(shape, generator=gen, dtype=torch.float32) * scale + shift
    return t.to(device=device, dtype=dtype)


def rand(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device, gen: torch.Generator,
         *, low: float = 0.0, high: float = 1.0) -> torch.Tensor:
    t = torch.rand(shape, generator=gen, dtype=torch.float32) * (high - low) + low
    return t.to(device=device, dtype=dtype)
