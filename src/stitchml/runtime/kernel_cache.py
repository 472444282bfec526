"""Content-addressed cache of generated kernel modules (in memory, and on disk
because Triton's `@jit` needs source files it can inspect)."""
from __future__ import annotations

import hashlib
import importlib.util
import os
import tempfile
from pathlib import Path
from types import ModuleType

from .. import config
from ..codegen.composite import BARRIER
from ..codegen.triton_ops import PRELUDE

_MODULES: dict[str, ModuleType] = {}


def source_key(source: str) -> str:
    return hashlib.sha256(source.encode()).hexdigest()[:32]


def load_module(kernel_sources: list[str]) -> ModuleType:
    source = PRELUDE + BARRIER + "\n\n" + "\n\n".join(kernel_sources)
    key = source_key(source)
    if key in _MODULES:
        return _MODULES[key]
    directory = Path(config.get("cache_dir")) / "kernels"
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"sk_{key}.py"
    if not path.exists() or path.read_text() != source:
        # atomic publish: write a private file, then rename over the final name
        fd, tmp = tempfile.mkstemp(dir=directory, suffix=".tmp")
        with os.fdopen(fd, "w") as f:
            f.write(source)
        os.replace(tmp, path)
    spec = importlib.util.spec_from_file_location(f"stitchml_kernels_{key}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    _MODULES[key] = module
    return module
