"""A built-in example for `stitchml demo` / `stitchml explain`: one small
transformer block, written in plain PyTorch.

The block mixes compute-intensive ops (the linear projections and the two
attention matrix products, which stay in vendor libraries) with the
memory-intensive ops stitchml fuses: layer norms, the scaled and masked
softmax, dropout, bias + GELU, residual adds.  Sizes are kept small so it runs
quickly under the Triton interpreter on a CPU.
"""
from __future__ import annotations

import math
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn


class TransformerBlock(nn.Module):
    """A pre-LN transformer block.

        h   = x + dropout(attn(layer_norm(x)))
        out = h + dropout(mlp(layer_norm(h)))

    attn: separate Q/K/V projections (K without bias), scores = q @ k^T * scale + mask, softmax,
    dropout on the probabilities, @ v, output projection.  mlp: linear + bias,
    GELU, linear.  `dropout` is the probability used everywhere (active only in
    train mode).
    """

    def __init__(self, hidden: int = 64, heads: int = 4, mlp_ratio: int = 4, dropout: float = 0.1):
        super().__init__()
        if hidden % heads:
            raise ValueError(f"hidden ({hidden}) must be divisible by heads ({heads})")
        self.hidden, self.heads, self.head_dim = hidden, heads, hidden // heads
        self.p = dropout
        self.ln1 = nn.LayerNorm(hidden)
        self.q = nn.Linear(hidden, hidden)
        # no key bias: it adds q . b_k to every score of a row, which softmax cancels, so
        # its true gradient is exactly zero and eager's float32 rounding noise (~1e-7) would
        # make a relative-error check against it meaningless
        self.k = nn.Linear(hidden, hidden, bias=False)
        self.v = nn.Linear(hidden, hidden)
        self.proj = nn.Linear(hidden, hidden)
        self.ln2 = nn.LayerNorm(hidden)
        self.fc1 = nn.Linear(hidden, mlp_ratio * hidden)
        self.fc2 = nn.Linear(mlp_ratio * hidden, hidden)

    def _split(self, t: torch.Tensor) -> torch.Tensor:
        b, s, _ = t.shape
        return t.view(b, s, self.heads, self.head_dim).transpose(1, 2)   # (b, heads, s, d)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """x: (batch, seq, hidden); mask: additive, broadcastable to (batch, heads, seq, seq)."""
        b, s, h = x.shape
        y = self.ln1(x)
        q, k, v = self._split(self.q(y)), self._split(self.k(y)), self._split(self.v(y))
        scores = q @ k.transpose(-2, -1) * (1.0 / math.sqrt(self.head_dim)) + mask
        probs = F.dropout(torch.softmax(scores, dim=-1), self.p, self.training)
        ctx = (probs @ v).transpose(1, 2).reshape(b, s, h)
        x = x + F.dropout(self.proj(ctx), self.p, self.training)
        y = self.ln2(x)
        y = self.fc2(F.gelu(self.fc1(y)))
        return x + F.dropout(y, self.p, self.training)


def causal_mask(seq: int, batch: int = 1, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Additive causal mask of shape (batch, 1, seq, seq): 0 on and below the
    diagonal, a large negative number above it, plus small random noise so the
    mask is a genuine data input (like a padding or bias mask) rather than a constant."""
    allowed = torch.ones(seq, seq, dtype=torch.bool).tril()
    m = torch.zeros(seq, seq, dtype=dtype).masked_fill(~allowed, -1e4)
    return (m + 0.1 * torch.randn(batch, 1, seq, seq, dtype=dtype)).contiguous()


def make_block(hidden: int = 64, heads: int = 4, dropout: float = 0.1, seed: int | None = 0) -> TransformerBlock:
    """The example block with deterministic random weights (for `seed` not None)."""
    if seed is not None:
        with torch.random.fork_rng():
            torch.manual_seed(seed)
            return TransformerBlock(hidden, heads, dropout=dropout)
    return TransformerBlock(hidden, heads, dropout=dropout)


def example_inputs(batch: int = 2, seq: int = 16, hidden: int = 64, heads: int = 4,
                   dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu"
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """Random (x, mask) for `TransformerBlock(hidden, heads)`: x ~ randn(batch, seq, hidden),
    mask a noisy additive causal mask of shape (batch, 1, seq, seq)."""
    del heads  # the mask broadcasts over heads
    x = torch.randn(batch, seq, hidden, dtype=dtype)
    mask = causal_mask(seq, batch, dtype)
    return x.to(device), mask.to(device)


def block_training_case(batch: int = 2, seq: int = 16, hidden: int = 64,
                        heads: int = 4) -> tuple[Callable[..., tuple[torch.Tensor, ...]], list[torch.Tensor]]:
    """(fn, inputs): the block's forward and its gradients w.r.t. x and every weight as
    one function of plain tensors (weights as inputs), for tracing a whole training
    step with make_fx (ahead-of-time compilation checks)."""
    block = make_block(hidden, heads, 0.0, 0)
    x, mask = example_inputs(batch, seq, hidden, heads)
    names = [n for n, _ in block.named_parameters()]

    def fwd_bwd(x, mask, *ps):
        y = torch.func.functional_call(block, dict(zip(names, ps)), (x, mask))
        return (y,) + torch.autograd.grad(y.sum(), (x,) + ps)

    return fwd_bwd, [x.requires_grad_(), mask] + [p.detach().requires_grad_() for p in block.parameters()]
