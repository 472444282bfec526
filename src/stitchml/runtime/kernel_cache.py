"""Content-addressed caches of generated code, in memory and on disk.

- Kernel sources: keyed by sha256 of (compiler version, the kernel plan, the IR nodes
  it reads, config knobs that change code, device kind).  A second process compiling
  the same model loads them instead of generating code (`STATS["generated"]` counts
  real generations).  Entries carry a checksum of their payload: a truncated or
  corrupted entry is detected, rebuilt with a warning, never loaded blindly.
- Kernel modules: Triton's `@jit` needs a source file it can inspect, so the module
  text is written (atomically) to a file named by its own hash.

Writes go to a private temporary file first and are published with `os.replace`, so
processes compiling at once never see half-written entries.  Directory:
`STITCHML_CACHE_DIR` (default ~/.cache/stitchml).
"""
from __future__ import annotations

import dataclasses
import hashlib
import importlib.util
import json
import os
import tempfile
import warnings
from pathlib import Path
from types import ModuleType
from typing import Callable

from .. import config
from ..codegen.composite import BARRIER
from ..codegen.triton_kernel import KernelSource
from ..codegen.triton_ops import PRELUDE

FORMAT = 1
STATS = {"generated": 0, "disk_hits": 0, "rebuilt": 0}
_MODULES: dict[str, ModuleType] = {}
# knobs that change generated code (the rest only change planning, which is in the key)
_CODE_KNOBS = ("pointwise_block", "persistent_max_cols", "loop_block_cols", "block_elems")


def source_key(source: str) -> str:
    return hashlib.sha256(source.encode()).hexdigest()[:32]


def _root() -> Path:
    return Path(config.get("cache_dir"))


def _atomic_write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, path)


_CODE_HASH: list[str] = []


def compiler_version() -> str:
    """Hash of the code that turns plans into kernel text: a changed code generator
    never reads entries made by another (a package version alone would not notice
    an edited checkout)."""
    if not _CODE_HASH:
        from ..codegen import composite, triton_kernel, triton_ops
        from ..ir import index
        h = hashlib.sha256()
        for mod in (triton_kernel, triton_ops, composite, index):
            h.update(Path(mod.__file__).read_bytes())
        _CODE_HASH.append(h.hexdigest()[:16])
    return _CODE_HASH[0]


def kernel_key(g, k, device_kind: str) -> str:
    __version__ = compiler_version()
    nodes = sorted({m for m in k.members} | set(k.inputs) | {r for m in k.members for r in g[m].refs})
    closure = set(nodes)
    stack = list(nodes)
    while stack:  # views and constants pulled through are part of what the code reads
        n = g[stack.pop()]
        for r in n.refs:
            if r not in closure:
                closure.add(r)
                if g[r].kind in ("view", "pointwise") and r not in k.inputs:
                    stack.append(r)
    payload = repr((FORMAT, __version__, device_kind, [repr(g[i]) for i in sorted(closure)],
                    repr(dataclasses.replace(k, predicted_s=0.0)),
                    [(name, config.get(name)) for name in _CODE_KNOBS]))
    return hashlib.sha256(payload.encode()).hexdigest()[:40]


def cached_kernel(key: str, generate: Callable[[], KernelSource]) -> KernelSource:
    path = _root() / "generated" / f"{key}.json"
    if path.exists():
        try:
            data = json.loads(path.read_text())
            payload = data["payload"]
            if data.get("format") != FORMAT or data.get("key") != key or \
                    hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest() != data["sha256"]:
                raise ValueError("checksum or key mismatch")
            STATS["disk_hits"] += 1
            return KernelSource(payload["name"], [tuple(p) for p in payload["params"]], payload["param_names"],
                                payload["body"], payload["grid"], payload["num_warps"],
                                {int(k): frozenset(v) for k, v in payload["levels"].items()})
        except (ValueError, KeyError, TypeError) as e:
            STATS["rebuilt"] += 1
            warnings.warn(f"stitchml: corrupted kernel cache entry {path} ({e}); rebuilding it", stacklevel=2)
    ks = generate()
    STATS["generated"] += 1
    payload = {"name": ks.name, "params": [list(p) for p in ks.params], "param_names": ks.param_names,
               "body": ks.body, "grid": ks.grid, "num_warps": ks.num_warps,
               "levels": {str(k): sorted(v) for k, v in ks.levels.items()}}
    digest = hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()
    _atomic_write(path, json.dumps({"format": FORMAT, "key": key, "sha256": digest, "payload": payload}))
    return ks


def load_module(kernel_sources: list[str]) -> ModuleType:
    source = PRELUDE + BARRIER + "\n\n" + "\n\n".join(kernel_sources)
    key = source_key(source)
    if key in _MODULES:
        return _MODULES[key]
    path = _root() / "kernels" / f"sk_{key}.py"
    if not path.exists() or path.read_text() != source:  # missing or damaged: (re)publish
        _atomic_write(path, source)
    spec = importlib.util.spec_from_file_location(f"stitchml_kernels_{key}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    _MODULES[key] = module
    return module
