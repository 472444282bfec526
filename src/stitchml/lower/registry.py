"""Rule registry keyed by ATen overload.

A rule receives the lowering context, the FX node, and the node's arguments with
tensors replaced by `Ref`s; it returns a node id (or a tuple of ids for multi-output
ops).  Raising `Unsupported` makes the op opaque with that reason.
"""
from __future__ import annotations

from typing import Callable

import torch

RULES: dict[object, Callable] = {}


class Unsupported(Exception):
    """This op (with these arguments) has no stitched lowering; run it eagerly."""


def register(*targets) -> Callable:
    def deco(fn: Callable) -> Callable:
        for t in targets:
            if isinstance(t, torch._ops.OpOverloadPacket):
                for name in t.overloads():
                    RULES.setdefault(getattr(t, name), fn)
            else:
                RULES[t] = fn
        return fn
    return deco


def lowered_ops() -> list[str]:
    """Names of every ATen overload with a rule (for docs and the OpInfo sweep)."""
    return sorted({str(t) for t in RULES})
