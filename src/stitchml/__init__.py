"""stitchml: a JIT compiler that stitches the memory-intensive part of PyTorch
programs into few Triton kernels.  `torch.compile(model, backend="stitch")`."""
from __future__ import annotations

from typing import Any

import torch

from .capture.backend import StitchBackend, stitch_backend
from .capture.logging_breaks import ignore_once_logging
from .tools.explain import Report, explain

__version__ = "0.1.0"


def compile(model_or_fn: Any, *, backend: StitchBackend | None = None, **options: Any) -> Any:
    """`torch.compile` with the stitch backend; `options` go to `torch.compile`
    (e.g. `dynamic=False`, `fullgraph=True`)."""
    ignore_once_logging()   # (transformers may have been imported after stitchml)
    return torch.compile(model_or_fn, backend=backend or stitch_backend, **options)


def _register() -> None:
    try:
        from torch._dynamo.backends.registry import _BACKENDS, register_backend
        if "stitch" not in _BACKENDS or _BACKENDS.get("stitch") is None:
            register_backend(name="stitch")(stitch_backend)
    except Exception:  # the entry point registers it too
        pass


_register()
ignore_once_logging()   # knob ignore_once_logging: Hugging Face's once-only warnings break no graph

from .runtime import interpreter_calls, interpreter_overheads, interpreter_tree  # noqa: E402

interpreter_tree.install()   # under TRITON_INTERPRET only: vectorised custom reductions and scans
interpreter_calls.install()  # under TRITON_INTERPRET only: helper calls without re-patching the language
interpreter_overheads.install()  # under TRITON_INTERPRET only: no overflow checks nobody reads, dtypes kept

__all__ = ["compile", "explain", "Report", "StitchBackend", "stitch_backend"]
