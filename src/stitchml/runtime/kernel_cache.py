"""Content-addressed caches of generated code, in memory and on disk.

- Kernel sources: keyed by sha256 of (code generator's own source, the kernel plan,
  the IR nodes it reads, code knobs, device kind), with node ids *renumbered* in the
  order the kernel reads them.  The same layer's kernel in layer 1 and layer 12 (equal
  up to node ids) therefore has one key: it is generated once per process, and a
  second process generates none (`STATS["generated"]` counts real generations).
  Entries carry a checksum of their payload: a truncated or corrupted entry is
  detected, rebuilt with a warning, never loaded blindly.
- Kernel modules: one module per kernel *body* (the text without its name), so
  kernels equal up to their name share one Triton function, which Triton compiles
  once, across layers and graphs.  Triton's `@jit` needs a source file it can inspect,
  so the module text is written (atomically) to a file named by its hash.
- The helpers every kernel may call (`triton_ops.PRELUDE`, the grid barrier) are one
  module of their own, loaded once per process (`prelude_namespace`) and put into each
  kernel module's namespace before it runs; a kernel module's file holds the kernel
  alone.  Each module used to repeat them: BERT-base's 34 distinct kernel bodies made
  Triton build 2,958 `JITFunction`s, each reading its own source back with `inspect`
  (~2.5 s of a warm process on the 2-core CPU).

Writes go to a private temporary file first and are published with `os.replace`, so
processes compiling at once never see half-written entries.  Directory:
`STITCHML_CACHE_DIR` (default ~/.cache/stitchml).
"""
from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import re
import tempfile
import warnings
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any, Callable

from .. import config
from ..codegen.canonical import canonical_kernel, code_knobs
from ..codegen.composite import BARRIER
from ..codegen.kernel_source import KernelSource
from ..codegen.triton_ops import PRELUDE
from ..ir.nodes import Graph

if TYPE_CHECKING:
    from ..plan.data import KernelPlan

FORMAT = 2
STATS = {"generated": 0, "disk_hits": 0, "memory_hits": 0, "rebuilt": 0, "modules": 0}
_MODULES: dict[str, ModuleType] = {}
_SOURCES: dict[str, dict] = {}  # key -> payload (node ids canonical)


def source_key(source: str) -> str:
    return hashlib.sha256(source.encode()).hexdigest()[:32]


def cache_root() -> Path:
    return Path(config.get("cache_dir"))


def atomic_write(path: Path, data: str | bytes) -> None:
    """Publish `data` at `path` all at once (a private temporary file, then a rename)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
    try:
        with os.fdopen(fd, "wb" if isinstance(data, bytes) else "w") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


_CODE_HASH: list[str] = []


def compiler_version() -> str:
    """Hash of the code that turns plans into kernel text: a changed code generator
    never reads entries made by another (a package version alone would not notice
    an edited checkout)."""
    if not _CODE_HASH:
        from ..codegen import triton_kernel
        from ..ir import index
        from ..plan import row_loops
        h = hashlib.sha256()
        for path in sorted(Path(triton_kernel.__file__).parent.glob("*.py")):  # every emitter module
            h.update(path.read_bytes())
        for module in (index, row_loops):   # what the emitter decides with, outside codegen/
            h.update(Path(module.__file__).read_bytes())
        _CODE_HASH.append(h.hexdigest()[:16])
    return _CODE_HASH[0]


# ----------------------------------------------------------------------------- keys

def kernel_key(g: Graph, k: KernelPlan, device_kind: str, canonical: tuple[str, list[int]] | None = None) -> str:
    """The cache key of kernel `k` (`canonical`: `canonical_kernel(g, k)`, when the
    caller has it already)."""
    text, _ = canonical if canonical is not None else canonical_kernel(g, k)
    payload = repr((FORMAT, compiler_version(), device_kind, text,
                    code_knobs()))
    return hashlib.sha256(payload.encode()).hexdigest()[:40]


# ----------------------------------------------------------------------------- sources

def _to_payload(ks: KernelSource, ids: dict[int, int]) -> dict:
    canon = lambda nid: ids[nid] if nid >= 0 else nid  # noqa: E731 (counter/base params use -1)
    return {"params": [[kind, canon(nid)] for kind, nid in ks.params], "param_names": ks.param_names,
            "body": ks.body, "grid": ks.grid, "num_warps": ks.num_warps,
            "levels": {str(canon(n)): sorted(v) for n, v in ks.levels.items()}}


def _from_payload(name: str, p: dict, closure: list[int]) -> KernelSource:
    actual = lambda i: closure[i] if i >= 0 else i  # noqa: E731
    return KernelSource(name, [(kind, actual(i)) for kind, i in p["params"]], list(p["param_names"]),
                        list(p["body"]), p["grid"], p["num_warps"],
                        {actual(int(i)): frozenset(v) for i, v in p["levels"].items()})


def _checksum(payload: dict) -> str:
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


def _read_entry(path: Path, key: str) -> dict | None:
    if not path.exists():
        return None
    try:
        data = json.loads(path.read_text())
        payload = data["payload"]
        if data.get("format") != FORMAT or data.get("key") != key or _checksum(payload) != data["sha256"]:
            raise ValueError("checksum or key mismatch")
        return payload
    except (ValueError, KeyError, TypeError) as e:
        STATS["rebuilt"] += 1
        warnings.warn(f"stitchml: corrupted kernel cache entry {path} ({e}); rebuilding it", stacklevel=3)
        return None


def cached_payload(key: str, generate: Callable[[], dict]) -> dict:
    """The payload stored under `key` (memory, then disk), else `generate()`'s, stored."""
    if key in _SOURCES:
        STATS["memory_hits"] += 1
        return _SOURCES[key]
    path = cache_root() / "generated" / f"{key}.json"
    payload = _read_entry(path, key)
    if payload is not None:
        STATS["disk_hits"] += 1
    else:
        payload = generate()
        STATS["generated"] += 1
        atomic_write(path, json.dumps({"format": FORMAT, "key": key, "sha256": _checksum(payload),
                                       "payload": payload}))
    _SOURCES[key] = payload
    return payload


def cached_kernel(g: Graph, k: KernelPlan, device_kind: str, generate: Callable[[], KernelSource]) -> KernelSource:
    """Kernel `k`'s source, generated once per content (see the module doc)."""
    canonical = canonical_kernel(g, k)   # (its text keys the cache; its closure numbers the payload)
    key = kernel_key(g, k, device_kind, canonical)
    closure = canonical[1]
    ids = {nid: i for i, nid in enumerate(closure)}
    payload = cached_payload(key, lambda: _to_payload(generate(), ids))
    return _from_payload(k.name, payload, closure)


# ----------------------------------------------------------------------------- modules

_DEF = re.compile(r"^@triton\.jit(\([^\n]*\))?\ndef (\w+)\(", re.M)


_HEADER = "# helpers (triton, tl, libdevice, the @triton.jit helpers): kernel_cache.prelude_namespace\n\n"


def _body_key(text: str) -> tuple[str, str]:
    """(hash of the kernel text with its own name blanked, that name)."""
    m = _DEF.search(text)
    if m is None:
        raise ValueError("not a generated kernel: no `@triton.jit def`")
    name = m.group(2)
    blank = text[:m.start(2)] + "KERNEL" + text[m.end(2):]
    return source_key(PRELUDE + BARRIER + blank), name


_PRELUDE: list[dict[str, Any]] = []   # the helpers' namespace, loaded once per process


def prelude_source() -> str:
    return PRELUDE + BARRIER + "\n"


def prelude_namespace(folder: Path | None = None) -> dict[str, Any]:
    """The names of the helpers' module (Triton, `tl`, libdevice, every `@triton.jit`
    helper), published as a file in `folder` (default: the kernel modules' folder of
    the cache) and executed the first time a process asks."""
    if not _PRELUDE:
        source = prelude_source()
        key = source_key(source)
        path = (folder if folder is not None else cache_root() / "kernels") / f"sp_{key}.py"
        if not path.exists() or path.read_text() != source:
            atomic_write(path, source)
        spec = importlib.util.spec_from_file_location(f"stitchml_prelude_{key}", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        _PRELUDE.append({k: v for k, v in vars(module).items() if not k.startswith("__")})
    return _PRELUDE[0]


def exec_kernel_module(path: Path, name: str) -> ModuleType:
    """Run a kernel module file (written by `load_kernels`/`load_module`) with the
    helpers' names in its namespace."""
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    module.__dict__.update(prelude_namespace(Path(path).parent))
    spec.loader.exec_module(module)
    return module


def load_kernels(sources: dict[str, str]) -> dict[str, Any]:
    """The Triton function of every kernel text, by the name the caller uses for it.
    Texts equal up to the kernel's name share one function (one module per body),
    so Triton compiles such kernels once."""
    out = {}
    for name, text in sources.items():
        key, own = _body_key(text)
        module = _MODULES.get(key)
        if module is None:
            fn = f"k_{key[:24]}"
            m = _DEF.search(text)
            body = text[:m.start(2)] + fn + text[m.end(2):]
            source = _HEADER + body + f"\n\nKERNEL = {fn}\n"
            path = cache_root() / "kernels" / f"sk_{key}.py"
            if not path.exists() or path.read_text() != source:  # missing or damaged: (re)publish
                atomic_write(path, source)
            module = exec_kernel_module(path, f"stitchml_kernels_{key}")
            _MODULES[key] = module
            STATS["modules"] += 1
        out[name] = module.KERNEL
    return out


def module_path(text: str) -> Path:
    """Where `load_kernels` writes the module of this kernel text."""
    return cache_root() / "kernels" / f"sk_{_body_key(text)[0]}.py"


def load_module(kernel_sources: list[str]) -> ModuleType:
    """All kernel texts in one module, each under its own name (tools that want one
    namespace, e.g. the ahead-of-time compile check)."""
    source = _HEADER + "\n\n".join(kernel_sources)
    key = source_key(prelude_source() + source)
    if key in _MODULES:
        return _MODULES[key]
    path = cache_root() / "kernels" / f"sm_{key}.py"
    if not path.exists() or path.read_text() != source:
        atomic_write(path, source)
    module = exec_kernel_module(path, f"stitchml_module_{key}")
    _MODULES[key] = module
    return module


def drop_memory() -> None:
    """Forget what this process generated and loaded (tests of cross-process reuse)."""
    _SOURCES.clear()
    _MODULES.clear()


__all__ = ["STATS", "atomic_write", "cache_root", "cached_kernel", "cached_payload", "canonical_kernel",
           "compiler_version", "drop_memory", "exec_kernel_module", "kernel_key", "load_kernels", "load_module",
           "module_path", "prelude_namespace",
           "source_key"]
