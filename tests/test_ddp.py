"""DistributedDataParallel: a small transformer trained for 3 steps on 2 processes
(gloo, CPU), compiled with the stitch backend, matches the same run in eager: the
loss of every step and the parameters afterwards (relative error ≤ 1e-4)."""
import os

# the spawned children import this module first: the interpreter must be chosen
# before triton is imported (through torch.compile or stitchml)
os.environ.setdefault("TRITON_INTERPRET", "1")


import pytest  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from dist_common import free_port, init_gloo  # noqa: E402
from hf_common import rel_err  # noqa: E402

WORLD = 2
STEPS = 3
B, T, D, HEADS, CLASSES = 3, 6, 16, 2, 3


class Block(nn.Module):
    """Pre-norm transformer block: layer norm, softmax attention, layer norm, MLP."""

    def __init__(self, d: int, heads: int):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc1, self.fc2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).chunk(3, dim=-1)
        q, k, v = (z.reshape(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        att = torch.softmax(q @ k.transpose(-1, -2) / (d // self.heads) ** 0.5, dim=-1)
        x = x + self.proj((att @ v).transpose(1, 2).reshape(b, t, d))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class TinyTransformer(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.Sequential(Block(D, HEADS), Block(D, HEADS))
        self.ln = nn.LayerNorm(D)
        self.head = nn.Linear(D, CLASSES)

    def forward(self, x):
        return self.head(self.ln(self.blocks(x)).mean(1))


def _train(rank: int, compiled: bool) -> dict:
    import stitchml
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.manual_seed(0)
    model = DDP(TinyTransformer())
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    backend = stitchml.StitchBackend()
    step_fn = torch.compile(model, backend=backend) if compiled else model
    losses = []
    for step in range(STEPS):
        g = torch.Generator().manual_seed(100 * step + rank)  # each rank its own shard
        x = torch.randn(B, T, D, generator=g)
        y = torch.randint(0, CLASSES, (B,), generator=g)
        opt.zero_grad()
        loss = F.cross_entropy(step_fn(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    records = [(r.kind, r.eager_reason, r.plan.num_kernels if r.plan is not None else 0) for r in backend.records]
    return {"losses": losses, "params": {k: v.detach().clone() for k, v in model.module.state_dict().items()},
            "records": records}


def _worker(rank: int, port: int, out_dir: str) -> None:
    init_gloo(rank, port, WORLD)
    try:
        from stitchml.compiler import _interpreter_on
        result = {"interpreter": _interpreter_on(), "eager": _train(rank, False)}
        torch._dynamo.reset()
        result["stitch"] = _train(rank, True)
        torch.save(result, os.path.join(out_dir, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()




@pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(), reason="needs torch.distributed gloo")
def test_ddp_transformer_three_steps_match_eager(tmp_path):
    mp.spawn(_worker, args=(free_port(), str(tmp_path)), nprocs=WORLD, join=True)
    results = [torch.load(tmp_path / f"rank{r}.pt") for r in range(WORLD)]
    for rank, res in enumerate(results):
        assert res["interpreter"] or torch.cuda.is_available(), "child ran without TRITON_INTERPRET"
        eager, stitch = res["eager"], res["stitch"]
        for step, (a, e) in enumerate(zip(stitch["losses"], eager["losses"])):
            assert abs(a - e) <= 1e-4 * abs(e), f"rank {rank} step {step}: loss {a} vs eager {e}"
        assert len(set(eager["losses"])) == STEPS  # training moved: the steps differ
        for name, p in eager["params"].items():
            assert rel_err(stitch["params"][name], p) <= 1e-4, f"rank {rank}: parameter {name}"
        # the compiled run really ran stitched kernels, forward and backward, with no graph falling back
        kinds = {kind for kind, _, _ in stitch["records"]}
        assert {"forward", "backward"} <= kinds, stitch["records"]
        assert all(reason is None for _, reason, _ in stitch["records"]), stitch["records"]
        assert sum(n for _, _, n in stitch["records"]) > 0
    # DDP kept the replicas identical
    for name, p in results[0]["stitch"]["params"].items():
        assert torch.equal(p, results[1]["stitch"]["params"][name]), name
    # the ranks saw different data, so their local losses differ
    assert results[0]["stitch"]["losses"][0] != results[1]["stitch"]["losses"][0]
