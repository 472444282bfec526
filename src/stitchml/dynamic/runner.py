"""Running a graph whose sizes are known only at run time.

Per call: read the sizes off the arguments, and
1. a size seen before → its template, called with the sizes (no compilation at all);
2. a new size → the static pipeline plans and generates code at that size (no kernel
   is compiled from it), and the sources are compared with the templates of its
   bucket; a template that equals them token for token at these sizes is reused:
   its kernels are already compiled;
3. no template of the bucket matches → the pipeline also runs at two other sizes of
   the bucket (the probes), and a new template with sizes as arguments is built from
   the three (`template.py`).  Where that is impossible the sources of this size are
   used as they are (an *exact* template, valid for this size only) and the reason is
   kept for `explain`.
Any failure runs that call eagerly with a warning.  So a kernel is compiled once per
bucket, and what runs at a size is always what the static pipeline would run there.

The runner calls the pipeline module itself (`pipeline.build_static` at each size,
`pipeline.build_callable` for each new template), so a template's kernels load like a
static graph's: compiled in parallel on a GPU, launched through launchers.
"""
from __future__ import annotations

import time
import warnings
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Iterable

import torch
import torch.fx as fx

from .. import config, pipeline
from ..runtime.precompile import Job, job_for
from ..runtime.pdl import pdl_sources
from ..runtime.wrapper import build_program
from . import template as tpl
from .shapes import Signature, bucket_of, concrete_graph, is_symbolic, nearby, probes, signature, tensor_args

if TYPE_CHECKING:
    from ..compiler import CompiledGraph

__all__ = ["compile_dynamic", "is_symbolic", "sources_at", "DynamicState"]

# sizes next to a new size planned, at most, when a probe at the bucket's edge planned
# other kernels (`reprobe`)
REPROBES = 2


@dataclass
class DynamicState:
    """What a dynamic graph compiled so far (inspected by tests and `explain`)."""

    sig: Signature
    templates: dict[tuple, list[tpl.Template]] = field(default_factory=dict)   # bucket -> templates
    by_size: dict[tuple, tpl.Template] = field(default_factory=dict)
    refusals: list[str] = field(default_factory=list)   # why a bucket got an exact template
    eager_calls: list[str] = field(default_factory=list)
    probe_errors: list[str] = field(default_factory=list)   # exceptions the pipeline raised at a probe size
    pipeline_runs: int = 0
    plan_seconds: float = 0.0

    @property
    def buckets(self) -> int:
        return len(self.templates)

    @property
    def num_templates(self) -> int:
        return sum(len(v) for v in self.templates.values())

    def kernel_sources(self) -> set[str]:
        """Distinct texts of the kernels launched, over all buckets."""
        return {t for ts in self.templates.values() for x in ts for t in x.launched.values()}

    def describe(self) -> str:
        lines = [f"dynamic sizes {', '.join(map(str, self.sig.symbols))}: {len(self.by_size)} sizes seen, "
                 f"{self.buckets} buckets, {self.num_templates} templates, {len(self.kernel_sources())} distinct "
                 f"kernels, {self.pipeline_runs} planning runs ({self.plan_seconds:.2f}s)"]
        for key, ts in sorted(self.templates.items()):
            for t in ts:
                kind = "sizes as arguments" if t.generic else "exact sizes"
                lines.append(f"  bucket {_fmt_bucket(key)}: template from {_fmt_sizes(t.sizes)} ({kind})")
        lines += [f"  exact template: {r}" for r in self.refusals]
        lines += [f"  eager call: {r}" for r in self.eager_calls]
        return "\n".join(lines)


def _fmt_bucket(key: tuple) -> str:
    return " x ".join(f"({lo},{hi}]" for lo, hi in key)


def _fmt_sizes(sizes: dict) -> str:
    return ", ".join(f"{k}={v}" for k, v in sorted(sizes.items(), key=lambda t: str(t[0])))


def sources_at(gm: fx.GraphModule, sig: Signature, values: dict,
               device: torch.device) -> tuple[pipeline.Built, tuple[dict, Any, dict]]:
    """The static pipeline at fixed sizes, as the dynamic runner uses it: the plan, and
    (kernel texts, wrapper steps, wrapper constants) for `template.build`/`matches`."""
    # no horizontal launch groups: their program-id ranges are sums of grids, which
    # no single size expression gives (global groups have a fixed grid: kept)
    built = pipeline.build_static(concrete_graph(gm, sig, values), device, horizontal=False, fixed_row_blocks=True)
    kernels = pdl_sources(built.kernels, device)     # (programmatic dependent launch: knob pdl)
    program = build_program(built.plan, kernels, device, generic=True)
    return built, ({n: k.source for n, k in kernels.items()}, program, program.consts)


def _size_args(t: tpl.Template, name: str) -> tuple[tuple[str, int | float], ...]:
    """(Triton type, value at the template's own sizes) of kernel `name`'s size
    arguments `sz0, sz1, …`: one per distinct slot expression, in token order (as
    `template.build` numbers them)."""
    unit = t.kernels[name]
    first: dict[str, tpl.Slot] = {}
    for i in sorted(unit.slots):
        first.setdefault(unit.slots[i].text, unit.slots[i])
    args = tuple(t.sizes[s] for s in t.symbols)
    return tuple((ty, slot.fn(*args)) for ty, slot in zip(t.size_arg_types.get(name, []), first.values()))


def _jobs(t: tpl.Template, built: pipeline.Built) -> Iterable[Job]:
    """The compile jobs of the kernels template `t` launches; `built` is the static
    pipeline's output at the template's sizes (its kernels' parameters and dtypes)."""
    return (job_for(built.kernels[name], built.graph, text, _size_args(t, name)) for name, text in t.launched.items())


def compile_dynamic(gm: fx.GraphModule, kind: str, device: torch.device, rec: CompiledGraph) -> Callable:
    """The callable for a graph with symbolic sizes (`rec`: the graph's `CompiledGraph`)."""
    try:
        sig = signature(gm)
    except ValueError as e:
        from ..lower.registry import Unsupported
        raise Unsupported(f"dynamic shapes: {e}") from None
    state = DynamicState(sig)
    rec.dynamic = state

    def generate(values: dict):
        t0 = time.perf_counter()
        built, sources = sources_at(gm, sig, values, device)
        state.pipeline_runs += 1
        state.plan_seconds += time.perf_counter() - t0
        return built, sources

    def reprobe(values: dict, points: list, builds: list, reason: str) -> tuple[list, list, tpl.Template | str]:
        """A plan choice flips inside the bucket (a probe at its edge planned other
        kernels): keep the probes whose code is this size's up to numbers, add up to
        `REPROBES` sizes nearest to it, and build from those; else the first reason.
        Without this every size on the other side of the flip got an exact template
        (gpt-neo's local-attention mask at 9 of (8, 16]: eight sizes, eight templates)."""
        def alike(i: int) -> bool:
            pair = tpl.build(sig, [points[0], points[i]], [builds[0], builds[i]])
            return not (isinstance(pair, str) and tpl.differs_in_structure(pair))

        keep = [0] + [i for i in range(1, len(points)) if alike(i)]
        points, builds = [points[i] for i in keep], [builds[i] for i in keep]
        for p in nearby(sig, values, points, REPROBES):
            if len(points) == 3:
                break
            points.append(p)
            builds.append(generate(p)[1])
            if not alike(len(points) - 1):
                points.pop()
                builds.pop()
        if len(points) < 2:
            return points, builds, reason
        return points, builds, tpl.build(sig, points, builds)

    def template_for(values: dict) -> tpl.Template:
        key = tuple(sorted(values.items(), key=lambda t: str(t[0])))
        if key in state.by_size:
            return state.by_size[key]
        bucket = tuple(bucket_of(values[s]) for s in sig.symbols)
        built, sources = generate(values)
        rec.graph, rec.plan, rec.kernels = built.graph, built.plan, built.kernels
        found = next((t for t in state.templates.get(bucket, []) if t.matches(*sources, values)), None)
        if found is None:
            points = probes(sig, values)
            builds = [sources]
            try:
                for p in points[1:]:
                    builds.append(generate(p)[1])
                found = tpl.build(sig, points, builds) if len(points) > 1 else (
                    "the bucket has one size" if all(hi - lo == 1 for lo, hi in bucket) else
                    "no other size of the bucket satisfies the graph's guards")
                if isinstance(found, str) and tpl.differs_in_structure(found):
                    points, builds, found = reprobe(values, points, builds, found)
            except Exception as e:  # a probe size the pipeline cannot compile: this size still can
                if not config.get("fallback_on_error"):
                    raise
                where = _fmt_sizes(points[len(builds)]) if len(builds) < len(points) else "building the template"
                state.probe_errors.append(f"{where}: {type(e).__name__}: {str(e)[:300]}")
                found = f"the static pipeline failed at a probe size: {type(e).__name__}: {str(e)[:200]}"
            if isinstance(found, str):
                state.refusals.append(f"{_fmt_sizes(values)}: {found}")
                found = tpl.build(sig, points[:1], builds[:1])  # exact: no numbers move
            assert found.matches(*sources, values), "a template must reproduce the sources it was built from"
            found.call = pipeline.build_callable(found.wrapper_text, found.consts, found.kernel_texts, device,
                                                 rec.times, _jobs(found, built))
            state.templates.setdefault(bucket, []).append(found)
        rec.wrapper_source = found.wrapper_text
        state.by_size[key] = found
        return found

    def run(args):
        rec.calls += 1
        inputs = list(args)
        args.clear()
        try:
            values = sig.bind(inputs)
            t = template_for(values)
            sizes = tuple(values[s] for s in sig.symbols)
            return t.call(tensor_args(sig, inputs), sizes)
        except Exception as e:
            if not config.get("fallback_on_error") or config.get("strict"):
                raise
            reason = f"{type(e).__name__}: {str(e)[:300]}"
            state.eager_calls.append(reason)
            warnings.warn(f"stitchml: {kind} graph (dynamic sizes) runs eagerly for this call: {reason}",
                          stacklevel=2)
            return gm(*inputs)

    run._boxed_call = True
    return run

