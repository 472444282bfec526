"""GPU measurement of the LM loss (issue 15's "peak memory of the loss ≥ 4x lower than
Inductor's and no slower"): eager, Inductor and stitchml on the same inputs, the
loss and gradients checked against eager before anything is timed.

    PYTHONPATH=src python3 -m stitchml.patterns.measure --tokens 4096 --hidden 4096 --vocab 128256

Peak memory is `torch.cuda.max_memory_allocated` during one forward + backward,
above what was allocated before it (inputs and weights excluded).  Time: median of
`triton.testing.do_bench` (L2 flushed between runs).  Needs CUDA; without it, says so.
"""
from __future__ import annotations

import argparse
import json
import sys
from typing import Callable

import torch
import torch.nn.functional as F


def hf_style_loss(h: torch.Tensor, w: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Hugging Face's causal-LM loss: lm_head, fp32 upcast, shift, mean cross-entropy."""
    logits = F.linear(h, w).float()
    shift = logits[..., :-1, :].contiguous()
    return F.cross_entropy(shift.view(-1, shift.size(-1)), labels[..., 1:].contiguous().view(-1), ignore_index=-100)


def _contender(name: str) -> Callable:
    import stitchml
    torch._dynamo.reset()  # one backend's compiled code must not serve another
    if name == "eager":
        return hf_style_loss
    if name == "inductor":
        return torch.compile(hf_style_loss)
    return torch.compile(hf_style_loss, backend=stitchml.StitchBackend())


def measure(batch: int, seq: int, hidden: int, vocab: int, dtype: torch.dtype) -> dict:
    from triton.testing import do_bench
    torch.manual_seed(0)
    h = torch.randn(batch, seq, hidden, device="cuda", dtype=dtype, requires_grad=True)
    w = (torch.randn(vocab, hidden, device="cuda") / hidden ** 0.5).to(dtype).requires_grad_()
    labels = torch.randint(0, vocab, (batch, seq), device="cuda")
    labels[:, :3] = -100

    def step(fn):
        h.grad = w.grad = None
        loss = fn(h, w, labels)
        loss.backward()
        return loss

    ref_loss = step(hf_style_loss).detach()
    ref_gh, ref_gw = h.grad.clone(), w.grad.clone()
    rows = {}
    for name in ("eager", "inductor", "stitchml"):
        fn = _contender(name)
        loss = step(fn)  # compile + correctness before timing
        ok = (torch.allclose(loss.float(), ref_loss.float(), rtol=2e-2, atol=2e-2)
              and torch.allclose(h.grad.float(), ref_gh.float(), rtol=5e-2, atol=5e-3)
              and torch.allclose(w.grad.float(), ref_gw.float(), rtol=5e-2, atol=5e-3))
        h.grad = w.grad = None
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        step(fn)
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() - base
        ms = do_bench(lambda: step(fn), return_mode="median")
        rows[name] = {"correct": bool(ok), "peak_bytes": int(peak), "median_ms": float(ms)}
    return {"shape": {"batch": batch, "seq": seq, "hidden": hidden, "vocab": vocab, "dtype": str(dtype)},
            "device": torch.cuda.get_device_name(), "torch": torch.__version__, "results": rows}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--hidden", type=int, default=4096)
    ap.add_argument("--vocab", type=int, default=128256)
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("stitchml.patterns.measure: needs a CUDA GPU (peak memory and time are GPU figures)", file=sys.stderr)
        return 2
    out = measure(args.batch, args.seq, args.hidden, args.vocab, getattr(torch, args.dtype))
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
