"""Once-only log messages traced as no-ops instead of graph breaks.

Dynamo breaks the graph at every `logging.Logger` method it meets unless the method is
in `torch._dynamo.config.ignore_logging_functions`.  Hugging Face adds `warning_once` and
`info_once` to `logging.Logger` and calls them inside `forward`: GPT-2's LM-head model
warns once about its loss type, so its training step became two graphs, the LM head in
one and the cross-entropy in the other, and the chunked linear + cross-entropy rewrite
(patterns/linear_ce.py), which needs both in one graph, never applied (the [tokens,
50257] logits were materialised, with their float32 gradient).  Knob
`ignore_once_logging` (default on).
"""
from __future__ import annotations

import logging

import torch

from .. import config

ONCE_METHODS = ("warning_once", "info_once")


def ignore_once_logging() -> list[str]:
    """Add the `logging.Logger` once-only methods defined in this process (Hugging Face adds
    them when imported) to Dynamo's ignored logging functions; the names added."""
    if not config.get("ignore_once_logging"):
        return []
    ignored = torch._dynamo.config.ignore_logging_functions
    added = []
    for name in ONCE_METHODS:
        fn = getattr(logging.Logger, name, None)
        if callable(fn) and fn not in ignored:
            ignored.add(fn)
            added.append(name)
    return added


__all__ = ["ONCE_METHODS", "ignore_once_logging"]
