"""A persistent cache of planned and generated graphs, so that a second process (or a
second graph with the same structure) skips planning and code generation.

Key: sha256 of the *lowered* IR graph (nodes, inputs, outputs, eager calls and
constants by their metadata), every knob's value, the cost model's device (with its
calibration), the mapping mode (dynamic shapes fix row blocks), the torch and Triton
versions and the hash of stitchml's own source.  Lowering is cheap and deterministic,
so it always runs; what is cached is what comes after it.

Value: the pickled plan and kernel sources.  Objects pickle cannot carry (ATen op
overloads, the module's constant tensors) are written as their position in the
lowered graph and taken from the freshly lowered graph on load: an entry never holds
another model's tensors.  Entries are checksummed and published atomically; a damaged
one is rebuilt with a warning; one that cannot be pickled is simply not cached.
"""
from __future__ import annotations

import hashlib
import io
import pickle
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .. import config
from .kernel_cache import atomic_write, cache_root

if TYPE_CHECKING:
    from ..ir.nodes import Graph
    from ..plan.options import PlanOptions

FORMAT = 1
STATS = {"hits": 0, "misses": 0, "stored": 0, "rebuilt": 0, "unpicklable": 0}
_MEMORY: dict[str, bytes] = {}
_SOURCE_HASH: list[str] = []
_PRIMITIVE = (int, float, bool, str, bytes, type(None))


def stitchml_source_hash() -> str:
    """Hash of every module of the package: an edited checkout never reads plans
    another version made."""
    if not _SOURCE_HASH:
        root = Path(__file__).resolve().parents[1]
        h = hashlib.sha256()
        for path in sorted(root.rglob("*.py")):
            h.update(str(path.relative_to(root)).encode())
            h.update(path.read_bytes())
        _SOURCE_HASH.append(h.hexdigest()[:20])
    return _SOURCE_HASH[0]


def _objects(graph) -> list[Any]:
    """The objects of a lowered graph that are referenced, not pickled: eager call
    targets and non-primitive argument objects, then constant tensors, in a fixed order."""
    seen: dict[int, Any] = {}

    def visit(a):
        if isinstance(a, (tuple, list)):
            for x in a:
                visit(x)
        elif isinstance(a, dict):
            for x in a.values():
                visit(x)
        elif not isinstance(a, _PRIMITIVE) and id(a) not in seen and not _plain(a):
            seen[id(a)] = a

    for nid in sorted(graph.eager_calls):
        target, args, kwargs = graph.eager_calls[nid]
        visit([target, args, kwargs])
    for nid in sorted(graph.constants):
        seen.setdefault(id(graph.constants[nid]), graph.constants[nid])
    return list(seen.values())


def _plain(a: Any) -> bool:
    """Values that pickle by value and say nothing about a model (dtypes, devices, refs)."""
    import torch

    from ..ir.nodes import Ref
    return isinstance(a, (Ref, torch.dtype, torch.device, torch.layout, torch.memory_format))


def _describe(a: Any) -> str:
    import torch
    if isinstance(a, torch.Tensor):
        return f"tensor{tuple(a.shape)}{a.dtype}{tuple(a.stride())}"
    return str(a)


def plan_key(graph: Graph, device_type: str, options: "PlanOptions | None" = None) -> str:
    """The key of what planning (under `options`, default the knobs' values) and code
    generation make of lowered graph `graph`.  Every knob is part of it too: code
    generation reads some (e.g. output poisoning)."""
    import torch
    import triton

    from ..plan.options import PlanOptions
    opts = options or PlanOptions.from_config()
    h = hashlib.sha256()
    for part in (FORMAT, stitchml_source_hash(), torch.__version__, triton.__version__, device_type,
                 opts.key(), [(k, repr(config.get(k))) for k in sorted(config.KNOBS)],
                 [repr(n) for n in graph.nodes], graph.inputs, repr(graph.outputs),
                 [(f.op, f.reason) for f in graph.fallbacks]):
        h.update(repr(part).encode())
    for nid in sorted(graph.eager_calls):
        target, args, kwargs = graph.eager_calls[nid]
        h.update(repr((nid, str(target), _describe_args(args), _describe_args(kwargs))).encode())
    for nid in sorted(graph.constants):
        h.update(repr((nid, _describe(graph.constants[nid]))).encode())
    return h.hexdigest()[:40]


def _describe_args(a: Any) -> Any:
    if isinstance(a, (tuple, list)):
        return tuple(_describe_args(x) for x in a)
    if isinstance(a, dict):
        return tuple((k, _describe_args(v)) for k, v in sorted(a.items()))
    return a if isinstance(a, _PRIMITIVE) or _plain(a) else _describe(a)


class _Pickler(pickle.Pickler):
    def __init__(self, f, table: dict[int, int]):
        super().__init__(f, protocol=pickle.HIGHEST_PROTOCOL)
        self.table = table

    def persistent_id(self, obj):
        return self.table.get(id(obj)) if not isinstance(obj, _PRIMITIVE) else None


class _Unpickler(pickle.Unpickler):
    def __init__(self, f, objects: list[Any]):
        super().__init__(f)
        self.objects = objects

    def persistent_load(self, pid):
        return self.objects[pid]


def _path(key: str) -> Path:
    return cache_root() / "plans" / f"{key}.pkl"


def load(key: str, graph: Graph) -> Any | None:
    """What `store` kept under `key`, with `graph`'s own objects put back; None on a miss."""
    if not config.get("plan_cache"):
        return None
    blob = _MEMORY.get(key)
    if blob is None:
        path = _path(key)
        if path.exists():
            raw = path.read_bytes()
            digest, _, blob = raw.partition(b"\n")
            if digest.decode(errors="replace") != hashlib.sha256(blob).hexdigest():
                STATS["rebuilt"] += 1
                warnings.warn(f"stitchml: corrupted plan cache entry {path}; planning again", stacklevel=3)
                blob = None
    if blob is None:
        STATS["misses"] += 1
        return None
    try:
        value = _Unpickler(io.BytesIO(blob), _objects(graph)).load()
    except Exception as e:  # an entry this process cannot read: plan again
        STATS["rebuilt"] += 1
        warnings.warn(f"stitchml: unreadable plan cache entry {key} ({type(e).__name__}: {e}); planning again",
                      stacklevel=3)
        return None
    _MEMORY[key] = blob
    STATS["hits"] += 1
    return value


def store(key: str, graph: Graph, value: Any) -> None:
    """Keep `value` (the plan and kernel sources made from lowered graph `graph`)."""
    if not config.get("plan_cache"):
        return
    table = {id(o): i for i, o in enumerate(_objects(graph))}
    buf = io.BytesIO()
    try:
        _Pickler(buf, table).dump(value)
    except Exception:  # e.g. an eager call argument pickle cannot carry: not cached
        STATS["unpicklable"] += 1
        return
    blob = buf.getvalue()
    _MEMORY[key] = blob
    atomic_write(_path(key), hashlib.sha256(blob).hexdigest().encode() + b"\n" + blob)
    STATS["stored"] += 1


def drop_memory() -> None:
    _MEMORY.clear()


__all__ = ["STATS", "drop_memory", "load", "plan_key", "stitchml_source_hash", "store"]
