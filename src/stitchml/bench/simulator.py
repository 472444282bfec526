"""The simulator suite: a vectorised CartPole stepped K times inside ONE compiled
function (simulator fusion for RL, DESIGN §2).

Each of the 4 state components is its own 1-D tensor of N environments; a step is
purely element-wise on N (no reductions), and the random numbers (a random policy's
action, the reset state of environments that fell) come from `torch.rand_like`
inside the function, which stitchml lowers to in-kernel RNG.  So all K steps can
become one kernel that reads the state once and writes it once: stitchml must
produce exactly one launch per call, or the case is reported FAILED.

Random numbers cannot match eager's generator, so correctness is checked twice:
a deterministic twin (the same step code, its random numbers taken from one
pre-drawn tensor, K_CHECK steps) must match eager's trajectory value for value, and
the real run must satisfy CartPole's invariants (every state inside the limits, an
integer count of episode ends, a mean count statistically close to eager's).
"""
from __future__ import annotations

import math
from typing import Any, Callable

import torch

from .compare import compare, tolerance
from .workload import CaseSpec, CheckOutcome, JaxSpec, Workload

# classic-control CartPole constants
GRAVITY, MASS_CART, MASS_POLE, HALF_LENGTH = 9.8, 1.0, 0.1, 0.5
TOTAL_MASS = MASS_CART + MASS_POLE
POLE_MASS_LENGTH = MASS_POLE * HALF_LENGTH
FORCE, TAU = 10.0, 0.02
THETA_LIMIT, X_LIMIT = 12 * 2 * math.pi / 360, 2.4
RESET_SPAN = 0.05          # a fresh episode starts uniformly in [-0.05, 0.05]^4

K_STEPS = 100
FULL_ENVS, QUICK_ENVS = 10**6, 1024
K_CHECK = 10               # steps of the deterministic twin


def cartpole_step(xp: Any, x: Any, xd: Any, th: Any, thd: Any, u_act: Any,
                  u_reset: list[Any]) -> tuple[Any, Any, Any, Any, Any]:
    """One Euler step of every environment, then reset the ones that fell.  `xp` is
    `torch` or `jax.numpy` (same function names), so both versions share the physics.
    `u_act` and `u_reset` are uniform [0, 1) numbers."""
    force = FORCE * xp.sign(u_act - 0.5)
    c, s = xp.cos(th), xp.sin(th)
    temp = (force + POLE_MASS_LENGTH * thd * thd * s) / TOTAL_MASS
    th_acc = (GRAVITY * s - c * temp) / (HALF_LENGTH * (4.0 / 3.0 - MASS_POLE * c * c / TOTAL_MASS))
    x_acc = temp - POLE_MASS_LENGTH * th_acc * c / TOTAL_MASS
    x, xd = x + TAU * xd, xd + TAU * x_acc
    th, thd = th + TAU * thd, thd + TAU * th_acc
    done = (xp.abs(x) > X_LIMIT) | (xp.abs(th) > THETA_LIMIT)
    fresh = [(u - 0.5) * (2 * RESET_SPAN) for u in u_reset]
    x, xd = xp.where(done, fresh[0], x), xp.where(done, fresh[1], xd)
    th, thd = xp.where(done, fresh[2], th), xp.where(done, fresh[3], thd)
    return x, xd, th, thd, done


def simulate(x: torch.Tensor, xd: torch.Tensor, th: torch.Tensor, thd: torch.Tensor,
             steps: int = K_STEPS) -> tuple[torch.Tensor, ...]:
    """K steps with in-function randomness; returns the final state and, per
    environment, how many episodes ended."""
    ends = torch.zeros_like(x)
    for _ in range(steps):
        u = [torch.rand_like(x) for _ in range(5)]
        x, xd, th, thd, done = cartpole_step(torch, x, xd, th, thd, u[0], u[1:])
        ends = ends + done.to(x.dtype)
    return x, xd, th, thd, ends


def simulate_predrawn(x: torch.Tensor, xd: torch.Tensor, th: torch.Tensor, thd: torch.Tensor,
                      u: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """The same steps with the random numbers read from `u` [steps, 5, N]."""
    ends = torch.zeros_like(x)
    for k in range(u.shape[0]):
        x, xd, th, thd, done = cartpole_step(torch, x, xd, th, thd, u[k, 0], [u[k, j] for j in range(1, 5)])
        ends = ends + done.to(x.dtype)
    return x, xd, th, thd, ends


def _jax_simulate(steps: int) -> Callable[[Any], Callable[..., Any]]:
    def build(jax: Any) -> Callable[..., Any]:
        jnp = jax.numpy

        def body(carry: Any, key: Any) -> Any:
            x, xd, th, thd, ends = carry
            u = jax.random.uniform(key, (5,) + x.shape, dtype=x.dtype)
            x, xd, th, thd, done = cartpole_step(jnp, x, xd, th, thd, u[0], [u[1], u[2], u[3], u[4]])
            return (x, xd, th, thd, ends + done.astype(x.dtype)), None

        def f(key: Any, x: Any, xd: Any, th: Any, thd: Any) -> Any:
            carry, _ = jax.lax.scan(body, (x, xd, th, thd, jnp.zeros_like(x)), jax.random.split(key, steps))
            return carry
        return f
    return build


def _jax_simulate_predrawn(jax: Any) -> Callable[..., Any]:
    jnp = jax.numpy

    def body(carry: Any, u: Any) -> Any:
        x, xd, th, thd, ends = carry
        x, xd, th, thd, done = cartpole_step(jnp, x, xd, th, thd, u[0], [u[1], u[2], u[3], u[4]])
        return (x, xd, th, thd, ends + done.astype(x.dtype)), None

    def f(key: Any, x: Any, xd: Any, th: Any, thd: Any, u: Any) -> Any:
        carry, _ = jax.lax.scan(body, (x, xd, th, thd, jnp.zeros_like(x)), u)
        return carry
    return f


def invariants_checker(steps: int) -> Callable[[list[torch.Tensor], list[torch.Tensor]], CheckOutcome]:
    def check(actual: list[torch.Tensor], expected: list[torch.Tensor]) -> CheckOutcome:
        if len(actual) != 5 or any(a.shape != e.shape or a.dtype != e.dtype for a, e in zip(actual, expected)):
            return CheckOutcome(False, math.inf, "outputs differ in number, shape or dtype from eager's")
        x, xd, th, thd, ends = (a.detach().double().cpu() for a in actual)
        if not all(torch.isfinite(t).all() for t in (x, xd, th, thd, ends)):
            return CheckOutcome(False, math.inf, "non-finite state")
        if (x.abs() > X_LIMIT).any() or (th.abs() > THETA_LIMIT).any():
            return CheckOutcome(False, math.inf, "a state outside the limits survived the step (reset missed)")
        if not torch.equal(ends, ends.round()) or ends.min() < 0 or ends.max() > steps:
            return CheckOutcome(False, math.inf, f"episode-end counts not integers in [0, {steps}]")
        e_ends = expected[4].detach().double().cpu()
        n = ends.numel()
        # both are means of n independent counts: compare within 6 standard errors
        se = math.sqrt((ends.var().item() + e_ends.var().item()) / n) if n > 1 else 0.0
        gap = abs(ends.mean().item() - e_ends.mean().item())
        bound = 6 * se + 0.02 * e_ends.mean().item() + 1e-3
        if gap > bound:
            return CheckOutcome(False, math.inf, f"mean episode ends {ends.mean().item():.3f} vs eager "
                                                 f"{e_ends.mean().item():.3f} (bound {bound:.3f})")
        return CheckOutcome(True, 0.0, f"invariants hold; mean episode ends {ends.mean().item():.3f} vs eager "
                                       f"{e_ends.mean().item():.3f}")
    return check


def _initial_state(n: int, device: torch.device, seed: int) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return [((torch.rand(n, generator=gen) - 0.5) * (2 * RESET_SPAN)).to(device) for _ in range(4)]


def cases(quick: bool) -> list[CaseSpec]:
    n = QUICK_ENVS if quick else FULL_ENVS
    name = f"cartpole[N={n},K={K_STEPS}]"

    def build(dtype: str, device: torch.device) -> Workload:
        state = _initial_state(n, device, 7)
        n_check = min(n, 65536)
        gen = torch.Generator().manual_seed(8)
        u = torch.rand((K_CHECK, 5, n_check), generator=gen).to(device)
        twin = Workload(f"cartpole_predrawn[N={n_check},K={K_CHECK}]", "simulator", "fp32", simulate_predrawn,
                        [t[:n_check].clone() for t in state] + [u], shape=f"{n_check} envs, u[{K_CHECK},5,{n_check}]",
                        tol=tolerance("simulator", "fp32"), jax=JaxSpec(_jax_simulate_predrawn))
        return Workload(name, "simulator", "fp32", lambda x, xd, th, thd: simulate(x, xd, th, thd, K_STEPS),
                        state, shape=f"4 x [{n}] fp32, {K_STEPS} steps", tol=tolerance("simulator", "fp32"),
                        min_bytes=9 * n * 4,   # 4 state tensors read, 4 written, 1 count written
                        checker=invariants_checker(K_STEPS), check_variant=twin, expect_stitch_kernels=1,
                        jax=JaxSpec(_jax_simulate(K_STEPS), note="lax.scan over the steps"),
                        notes="random: checked by a deterministic twin (pre-drawn numbers) + invariants")
    return [CaseSpec(name, "simulator", build, dtypes=("fp32",))]


def trajectory_error(fn_compiled: Callable[..., Any], n: int, steps: int, seed: int = 0) -> float:
    """Max relative error between `fn_compiled` (a compiled `simulate_predrawn`) and
    eager on the same pre-drawn numbers (for tests)."""
    state = _initial_state(n, torch.device("cpu"), seed)
    u = torch.rand((steps, 5, n), generator=torch.Generator().manual_seed(seed + 1))
    got = fn_compiled(*[t.clone() for t in state], u)
    want = simulate_predrawn(*[t.clone() for t in state], u)
    return compare(list(got), list(want), math.inf).max_rel_err
