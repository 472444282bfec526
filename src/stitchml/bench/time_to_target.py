"""The time-to-target suite (MLPerf / AlgoPerf style): train a small transformer on a
synthetic task until the training loss reaches a fixed target, and report the steps
and the wall time it took, for eager, Inductor and stitchml.

Every contender starts from the same initial weights and sees the same batches.
The task is copying: each sequence is h random tokens followed by the same h tokens
again, and the loss counts only the second half, which is predictable only by
attending back h positions, so the attention has to be learnt (the loss falls from
ln(V) to ~0 in tens to hundreds of steps).  Before training, each contender's loss
and gradients on the first batch are checked against eager's.  The compile happens
in that check call and is reported separately: the wall time to target counts
training steps only (warm-up excluded, as MLPerf does).
"""
from __future__ import annotations

import copy
import math
import statistics
import time
import traceback
import warnings
from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import nn

from .compare import compare, tolerance
from .contenders import Contender, RunContext, TorchContender
from .timing import sync

TTT_CONTENDERS = ("eager", "inductor", "stitchml")


@dataclass(frozen=True)
class TTTConfig:
    vocab: int
    dim: int
    layers: int
    heads: int
    seq: int
    batch: int
    lr: float
    target: float
    max_steps: int
    runs: int


# checked on a CPU (eager, batch 32): the loss reaches 0.05 after ~40 steps, after a plateau
# at ln(V) while the model finds the copy offset
FULL = TTTConfig(vocab=128, dim=256, layers=2, heads=4, seq=128, batch=64, lr=3e-3, target=0.02,
                 max_steps=2000, runs=3)
# --quick: a smoke test of the loop (the interpreter makes each stitchml step cost seconds):
# a loose target that the first few steps reach
QUICK = TTTConfig(vocab=16, dim=32, layers=1, heads=1, seq=8, batch=16, lr=2e-2, target=2.85,
                  max_steps=20, runs=1)


class Block(nn.Module):
    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.fc1, self.fc2 = nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, s, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        scores = q @ k.transpose(-1, -2) / math.sqrt(d // self.heads) + mask
        att = (torch.softmax(scores, -1) @ v).transpose(1, 2).reshape(b, s, d)
        x = x + self.proj(att)
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class TinyLM(nn.Module):
    def __init__(self, cfg: TTTConfig):
        super().__init__()
        self.tok, self.pos = nn.Embedding(cfg.vocab, cfg.dim), nn.Embedding(cfg.seq, cfg.dim)
        self.blocks = nn.ModuleList(Block(cfg.dim, cfg.heads) for _ in range(cfg.layers))
        self.ln, self.head = nn.LayerNorm(cfg.dim), nn.Linear(cfg.dim, cfg.vocab)

    def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        x = self.tok(ids) + self.pos.weight[: ids.shape[1]]
        for blk in self.blocks:
            x = blk(x, mask)
        return self.head(self.ln(x))


class Task:
    """Copy-task batches; batch i is the same for every contender.  Targets of the
    first half are -100 (cross-entropy's ignore index): random tokens cannot be predicted."""

    def __init__(self, cfg: TTTConfig, device: torch.device, seed: int = 0):
        self.cfg, self.device, self.seed = cfg, device, seed

    def batch(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        g = torch.Generator().manual_seed(self.seed * 100003 + i)
        half = self.cfg.seq // 2 + 1
        first = torch.randint(0, self.cfg.vocab, (self.cfg.batch, half), generator=g)
        seq = torch.cat([first, first], 1)[:, : self.cfg.seq + 1]
        targets = seq[:, 1:].clone()
        targets[:, : half - 1] = -100
        return seq[:, :-1].to(self.device), targets.to(self.device)


def _loss_fn(model: TinyLM, mask: torch.Tensor) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    def loss(ids: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(model(ids, mask).flatten(0, 1), targets.flatten())
    return loss


def _one_run(c: TorchContender, init: TinyLM, task: Task, mask: torch.Tensor, ref: list[torch.Tensor],
             ctx: RunContext) -> dict[str, Any]:
    cfg = task.cfg
    torch._dynamo.reset()
    model = copy.deepcopy(init)
    params = list(model.parameters())
    loss_fn = c.compile(_loss_fn(model, mask))
    x0, y0 = task.batch(0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        sync(ctx.device)
        t0 = time.perf_counter()
        loss0 = loss_fn(x0, y0)
        grads0 = torch.autograd.grad(loss0, params)
        sync(ctx.device)
        compile_s = time.perf_counter() - t0
    problems, _ = c.review(caught)
    got = compare([loss0.detach()] + list(grads0), ref, tolerance("time_to_target", "fp32"))
    out: dict[str, Any] = {"compile_s": compile_s, "check": got.detail, "problems": problems}
    if not got.ok:
        out["wrong"] = True
        return out
    opt = torch.optim.Adam(params, lr=cfg.lr)
    losses, wall = [], 0.0
    reached = None
    for i in range(cfg.max_steps):
        x, y = task.batch(i)
        sync(ctx.device)
        t0 = time.perf_counter()
        loss = loss_fn(x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        value = loss.item()        # the evaluation: one host sync per step, for everyone
        wall += time.perf_counter() - t0
        losses.append(value)
        if value <= cfg.target:
            reached = i + 1
            break
    out.update(steps=reached, wall_s=wall, losses=losses, final_loss=losses[-1] if losses else None)
    return out


def run(ctx: RunContext, contenders: list[Contender], tick: Callable[[str], None]) -> list[dict[str, Any]]:
    cfg = QUICK if ctx.quick else FULL
    torch.manual_seed(11)
    mask = torch.full((cfg.seq, cfg.seq), float("-inf")).triu(1).to(ctx.device)
    init = TinyLM(cfg).to(ctx.device)
    task = Task(cfg, ctx.device)
    # eager's loss and gradients on the first batch: the reference every contender must match
    x0, y0 = task.batch(0)
    ref_model = copy.deepcopy(init)
    loss0 = _loss_fn(ref_model, mask)(x0, y0)
    ref = [loss0.detach()] + list(torch.autograd.grad(loss0, list(ref_model.parameters())))
    results = []
    for c in contenders:
        if c.name not in TTT_CONTENDERS or not isinstance(c, TorchContender):
            continue
        tick(f"time_to_target {c.name}")
        res: dict[str, Any] = {"contender": c.name, "config": cfg.__dict__, "target": cfg.target,
                               "max_steps": cfg.max_steps, "status": "ok", "reason": "", "runs": []}
        if c.name == "inductor" and "time_to_target" in ctx.inductor_skip_suites:
            res["status"], res["reason"] = "skipped", ("--quick on CPU: Inductor's C++ compile of a training "
                                                       "step takes ~30-90 s on 2 cores; run without --quick")
            results.append(res)
            continue
        try:
            for _ in range(cfg.runs):
                r = _one_run(c, init, task, mask, ref, ctx)
                res["runs"].append(r)
                if r.get("wrong"):
                    res["status"], res["reason"] = "FAILED", f"wrong answer on the first batch: {r['check']}"
                    break
                if r["problems"]:
                    res["status"], res["reason"] = "FAILED", "; ".join(r["problems"])
                if r["steps"] is None:
                    res["status"] = "FAILED"
                    res["reason"] = (res["reason"] + "; " if res["reason"] else "") + \
                        f"target {cfg.target} not reached in {cfg.max_steps} steps (last loss {r['final_loss']:.4f})"
                    break
        except Exception as e:
            res["status"], res["reason"] = "FAILED", f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
            res["traceback"] = traceback.format_exc()[-6000:]
        finally:
            torch._dynamo.reset()
        runs = [r for r in res["runs"] if r.get("steps")]
        if runs:
            res["steps_to_target"] = statistics.median(r["steps"] for r in runs)
            walls = [r["wall_s"] for r in runs]
            res["wall_s_median"] = statistics.median(walls)
            res["wall_s_iqr"] = (statistics.quantiles(walls, n=4, method="inclusive")[2]
                                 - statistics.quantiles(walls, n=4, method="inclusive")[0]) if len(walls) > 1 else 0.0
            res["compile_s_median"] = statistics.median(r["compile_s"] for r in res["runs"])
        res["timings_meaningful"] = ctx.device.type == "cuda" and not ctx.interpreted
        results.append(res)
    return results
