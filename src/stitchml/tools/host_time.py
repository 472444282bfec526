"""Host time of a compiled training step on this machine, kernels not run (issue 12).

A GPU is what measures host time per step against Inductor (`stitchml bench`).  This
tool gives the part of it that is stitchml's own Python, on any machine, so that a
change to the wrapper or the launcher can be measured where it is made:

- a BERT-shaped model (12 layers, BERT-base's graph structure at a small width, so
  that the library ops it calls eagerly cost microseconds as they do on a GPU's host)
  is compiled by the stitch backend and run once through the Triton interpreter;
- then every launcher's kernel is swapped for a dry one: the launcher binds it and
  takes its direct path as on a GPU, and the compiled entry point does nothing;
- the training step (forward + backward) is timed (median of rounds), then timed
  again with every launch line replaced by a function that does nothing, so that the
  difference is what the launch lines cost above a bare Python call (their checks,
  the stream, the call into the compiled entry point).

The figures are this CPU's: they compare two versions of stitchml on one machine, not
stitchml with Inductor (whose CPU code is C++, not Triton launches).

`--graph-runner INPUTS OUTPUTS` times one CUDA-graph replay's host work instead
(`runtime/cuda_graphs.GraphRunner._replay`: the checks that the inputs read in place did
not move and that no output is still held, and the outputs rebuilt), with a stand-in
graph that does nothing: BERT-base's training graphs have 206 / 330 inputs and ~215
outputs each.

    TRITON_INTERPRET=1 python -m stitchml.tools.host_time [--layers 12] [--rounds 7]
    python -m stitchml.tools.host_time --graph-runner 330 215
"""
from __future__ import annotations

import argparse
import contextlib
import gc
import json
import statistics
import time
from typing import Any, Callable, Iterator

import torch


class _DryKernel:
    """What the launcher binds: a compiled kernel whose entry point does nothing."""

    function = 1
    packed_metadata = 2

    def __init__(self, counter: list[int]):
        self.counter = counter

    def run(self, *args: Any) -> None:
        self.counter[0] += 1


class _DryJIT:
    """Stands for a Triton function: `fn[grid](*args, **options)` returns a dry kernel."""

    def __init__(self, counter: list[int]):
        self.counter = counter

    def __getitem__(self, grid: tuple) -> Callable:
        def first(*args: Any, **options: Any) -> _DryKernel:
            self.counter[0] += 1
            return _DryKernel(self.counter)
        return first


def live_launchers() -> list:
    from ..runtime.launcher import Launcher
    # (`type(o) is`: isinstance on a dead weak proxy among gc's objects raises)
    return [o for o in gc.get_objects() if type(o) is Launcher]


def dry_launchers(counter: list[int], found: list) -> int:
    """The launchers `found` launch dry from now on; their number."""
    for launcher in found:
        # the interpreter's functions keep `do_not_specialize` as a keyword (a GPU's
        # JITFunction as parameters): seeds are not checked on a GPU, nor here
        names = getattr(launcher.fn, "arg_names", ())
        fresh = (getattr(launcher.fn, "kwargs", None) or {}).get("do_not_specialize") or ()
        launcher.fresh = launcher.fresh | frozenset(i for i, n in enumerate(names) if n in fresh or i in fresh)
        launcher.fn = _DryJIT(counter)
        launcher.bound.clear()
        launcher.direct = True
        launcher.stream = lambda index: 0
        for site in launcher.sites.values():
            site.fast = None
    return len(found)


@contextlib.contextmanager
def _launches_removed(launchers: list) -> Iterator[None]:
    """The launch lines of `launchers` no-ops (what is left of a step is everything else)."""
    from ..runtime.launcher import Launcher
    sites = [site for o in launchers for site in o.sites.values()]
    saved = [(site, site.namespace[site.name]) for site in sites]
    real_launch = Launcher.launch
    try:
        Launcher.launch = lambda self, grid, args, options: None   # launches of size-expression grids
        for site in sites:
            site.namespace[site.name] = _nothing
        yield
    finally:
        Launcher.launch = real_launch
        for site, fn in saved:
            site.namespace[site.name] = fn


def _nothing(*args: Any) -> None:
    return None


def small_bert(layers: int, batch: int, seq: int) -> tuple[torch.nn.Module, torch.Tensor]:
    from transformers import BertConfig, BertModel
    cfg = BertConfig(num_hidden_layers=layers, hidden_size=64, num_attention_heads=4, intermediate_size=256,
                     vocab_size=512, hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1,
                     attn_implementation="eager")
    return BertModel(cfg).train(), torch.randint(0, cfg.vocab_size, (batch, seq))


def _rounds(step: Callable[[], None], rounds: int, per_round: int) -> list[float]:
    out = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(per_round):
            step()
        out.append((time.perf_counter() - t0) / per_round)
    return out


def measure(layers: int = 12, batch: int = 1, seq: int = 8, rounds: int = 7, per_round: int = 5) -> dict:
    from ..capture.backend import StitchBackend
    from .. import config
    torch.manual_seed(0)
    model, ids = small_bert(layers, batch, seq)
    backend = StitchBackend()
    compiled = torch.compile(model, backend=backend)

    def step() -> None:
        compiled(ids).last_hidden_state.sum().backward()

    earlier = live_launchers()                   # (other compiled functions' launchers stay as they are)
    with config.override(cuda_graphs=False):
        step()                                   # compiles; kernels run in the interpreter
        launches = [0]
        known = {id(o) for o in earlier}
        ours = [o for o in live_launchers() if id(o) not in known]
        n_launchers = dry_launchers(launches, ours)
        step()                                   # binds every launch site to its dry kernel
        launches[0] = 0
        step()
        per_step = launches[0]
        full = _rounds(step, rounds, per_round)
        with _launches_removed(ours):
            bare = _rounds(step, rounds, per_round)
    step_s, bare_s = statistics.median(full), statistics.median(bare)
    return {"model": f"BERT-shaped, {layers} layers, hidden 64, batch {batch}, seq {seq}, training step",
            "graphs": len(backend.records), "launchers": n_launchers, "launches_per_step": per_step,
            "step_us": step_s * 1e6, "step_iqr_us": _iqr(full) * 1e6,
            "launch_path_us_per_step": (step_s - bare_s) * 1e6,
            "launch_path_us_per_launch": (step_s - bare_s) * 1e6 / max(per_step, 1),
            "rounds": rounds, "steps_per_round": per_round,
            "sites": sum(len(o.sites) for o in ours),
            "sites_bound": sum(1 for o in ours for site in o.sites.values()
                               if site.fast is not None and site.namespace[site.name] is site.fast)}


class _NoGraph:
    """A CUDA-graph backend whose capture calls once and whose replay does nothing."""

    def capture(self, call: Callable, inputs: list) -> tuple[Any, Any]:
        return "graph", call(list(inputs))

    def replay(self, graph: Any, inputs: list) -> None:
        pass

    def on_device(self, t: torch.Tensor) -> bool:
        return True


def graph_runner_replay(inputs: int = 330, outputs: int = 215, rounds: int = 7, per_round: int = 500) -> dict:
    """Host time of one `GraphRunner` replay with `inputs` parameters read in place and
    `outputs` static outputs (the caller lets go of them between calls)."""
    from types import SimpleNamespace

    from ..runtime.cuda_graphs import GraphRunner
    params = [torch.nn.Parameter(torch.randn(4)) for _ in range(inputs)]
    made = [torch.randn(2, 3) for _ in range(outputs)]
    runner = GraphRunner(lambda xs: tuple(o.clone() for o in made), SimpleNamespace(kind="forward", cuda_graph_note=""),
                         set(), _NoGraph(), warmup=1)

    def step() -> None:
        runner(list(params))
    for _ in range(3):
        step()
    times = _rounds(step, rounds, per_round)
    assert runner.misses == 0, runner.last_miss
    return {"inputs": inputs, "outputs": outputs, "replay_us": statistics.median(times) * 1e6,
            "replay_iqr_us": _iqr(times) * 1e6, "replays": runner.replays}


def _iqr(xs: list[float]) -> float:
    q = statistics.quantiles(xs, n=4)
    return q[2] - q[0]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--seq", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--json", action="store_true", help="print the figures as JSON")
    ap.add_argument("--graph-runner", nargs=2, type=int, metavar=("INPUTS", "OUTPUTS"),
                    help="time a CUDA-graph replay's host work (stand-in graph) instead")
    args = ap.parse_args(argv)
    if args.graph_runner:
        g = graph_runner_replay(*args.graph_runner, rounds=args.rounds)
        print(json.dumps(g, indent=1) if args.json else
              f"GraphRunner replay, {g['inputs']} inputs read in place, {g['outputs']} outputs: "
              f"{g['replay_us']:.1f} us (IQR {g['replay_iqr_us']:.1f}) a replay on this CPU")
        return 0
    r = measure(args.layers, args.batch, args.seq, args.rounds)
    if args.json:
        print(json.dumps(r, indent=1))
        return 0
    print(r["model"])
    print(f"  graphs {r['graphs']}, launchers {r['launchers']}, launch lines {r['sites']} ({r['sites_bound']} bound), "
          f"launches a step {r['launches_per_step']}")
    print(f"  step (kernels dry): {r['step_us']:.0f} us (IQR {r['step_iqr_us']:.0f})")
    print(f"  of which the launch lines, above a no-op call: {r['launch_path_us_per_step']:.0f} us "
          f"({r['launch_path_us_per_launch']:.2f} us a launch)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
