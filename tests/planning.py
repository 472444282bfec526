"""Build IR and plans from a function without running any kernel (tier-1 tests)."""
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from stitchml.capture.decomp import decomposition_table
from stitchml.lower.lower import lower
from stitchml.plan.planner import build_plan


def graph_of(fn, *inputs):
    gm = make_fx(fn, decomposition_table=decomposition_table(), tracing_mode="fake")(*inputs)
    return lower(gm)


def plan_of(fn, *inputs):
    return build_plan(graph_of(fn, *inputs))


def plan_on(device: str, fn, *shapes, dtype=torch.float32, **knobs):
    """The plan of `fn` over empty inputs of `shapes` for `device`, knobs overridden."""
    from stitchml import config
    with config.override(device=device, **knobs):
        return plan_of(fn, *[torch.empty(*s, dtype=dtype) for s in shapes])
