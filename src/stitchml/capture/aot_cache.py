"""Warm starts that skip AOTAutograd: stitched graphs kept in torch's AOTAutograd cache.

Where a warm second process spent its first call (BERT-base training, 2-core CPU,
2026-11-25, stitch's own plan and kernel caches warm): Dynamo 1.9 s, AOTAutograd 4.7 s
(metadata 0.5, joint-graph trace 2.0, min-cut partition ~1.8), stitch 0.1 s.  Inductor's
warm start skips AOTAutograd through `AOTAutogradCache`; this module lets stitch's graphs
use the same cache in its *bundled* form, whose entries carry the compiled forward and
backward as `OutputCode` objects (torch's "regional Inductor" is the other such user).

- `StitchOutput` is the `OutputCode` our forward/backward compilers return: it runs the
  stitched callable, and pickles as the ATen graph it was compiled from (`GraphPickler`,
  fake tensors as metadata).  A cache hit deserialises that graph and compiles it again
  through `compiler.compile_graph`, whose own caches (plan cache, kernel cache, Triton's
  binaries) make that cheap: the entry never holds generated code, so it cannot run
  kernels an older stitchml generated.
- The key is torch's (the Dynamo graph, input metadata, grad mode, autocast,
  deterministic algorithms, torch's configs) plus, through
  `torch.compiler.config.cache_key_tag`, stitch's identity (the hash of stitchml's
  source — decompositions, pattern rewrites, the partitioner live there — and every
  knob) and the inputs' storage sharing and offsets (`input_storage_signature`).
  Inductor's entries and ours never meet; an edited checkout or a changed knob misses.
  The functions stitch's pattern rewrites call are marked cacheable for torch.
- Only graphs with static sizes are cached (a symbolic graph's entry would need its
  guards replayed on stitch's bucketed kernels).  A damaged entry is torch's business:
  its loader treats any failure as a miss and compiles cold.
- While caching, AOTAutograd hands over the backward with the forward
  (`force_non_lazy_backward_lowering`): torch saves an entry when both exist, and only
  inside our backend call are the cache settings ours.  Stitch still compiles a backward
  at its first call, as AOTAutograd's lazy backward would (`StitchOutput.build`): a
  forward that never runs backward costs no backward compile, and a backward's failure
  shows when it runs.

Knob `aot_cache`; torch's own switches are respected (`TORCHINDUCTOR_FX_GRAPH_CACHE=0`,
`torch.compiler.config.force_disable_caches`).  Entries live in torch's cache directory
(`TORCHINDUCTOR_CACHE_DIR`, under `aotautograd/`), not stitch's.
"""
from __future__ import annotations

import contextlib
import contextvars
import hashlib
import logging
from typing import Any, Callable, Iterator, Sequence

import torch

from .. import config

log = logging.getLogger("stitchml")

# the backend whose AOTAutograd call is running: a cache hit compiles its graphs there
_BACKEND: contextvars.ContextVar[Any] = contextvars.ContextVar("stitchml_aot_backend", default=None)


def _torch_parts() -> tuple[Any, Any, Any] | None:
    """(OutputCode, SerializableAOTDispatchCompiler, GraphPickler), or None where this
    torch lacks the bundled cache."""
    try:
        import torch._functorch.config as fconfig
        from torch._functorch.aot_autograd import SerializableAOTDispatchCompiler
        from torch._inductor.output_code import OutputCode
        from torch.fx._graph_pickler import GraphPickler
    except ImportError:
        return None
    if not all(hasattr(fconfig, k) for k in ("bundled_autograd_cache", "force_non_lazy_backward_lowering",
                                             "enable_autograd_cache")):
        return None
    if not hasattr(torch.compiler.config, "cache_key_tag"):
        return None
    return OutputCode, SerializableAOTDispatchCompiler, GraphPickler


def refusal(example_inputs: Sequence[Any]) -> str | None:
    """Why this graph's AOTAutograd result is not cached, or None when it is."""
    if not config.get("aot_cache"):
        return "knob aot_cache is off"
    if _torch_parts() is None:
        return f"torch {torch.__version__} has no bundled AOTAutograd cache"
    import torch._inductor.config as iconfig
    if getattr(torch.compiler.config, "force_disable_caches", False):
        return "torch.compiler.config.force_disable_caches is set"
    if not iconfig.fx_graph_cache or not torch._functorch.config.enable_autograd_cache:
        return "torch's compile caches are off (TORCHINDUCTOR_FX_GRAPH_CACHE / TORCHINDUCTOR_AUTOGRAD_CACHE)"
    for x in example_inputs:
        if isinstance(x, torch.SymInt) or (isinstance(x, torch.Tensor) and any(
                not isinstance(s, int) for s in (*x.shape, *x.stride()))):
            return "symbolic sizes (the dynamic runner's buckets are not cached at this level)"
    return None


def identity() -> str:
    """stitch's part of the cache key: its source and every knob's value."""
    from ..runtime.plan_cache import stitchml_source_hash
    h = hashlib.sha256(stitchml_source_hash().encode())
    for name in sorted(config.KNOBS):
        h.update(f"{name}={config.get(name)!r};".encode())
    return h.hexdigest()[:20]


def input_storage_signature(example_inputs: Sequence[Any]) -> str:
    """Which inputs share a storage, and where each starts in its storage.  torch's key
    leaves both out, yet both change what the graphs compute: an input written through
    another input's view, `as_strided` addressing its storage from an absolute offset
    (stitch lowers it at the traced offset).  A review found each: an entry from one
    process gave a wrong answer, or a crash, to another calling with other aliasing."""
    from torch.multiprocessing.reductions import StorageWeakRef
    groups: dict[Any, int] = {}
    parts = []
    for x in example_inputs:
        if not isinstance(x, torch.Tensor):
            parts.append("-")
            continue
        try:
            group = groups.setdefault(StorageWeakRef(x.untyped_storage()), len(groups))
        except Exception:   # (a tensor without a storage of its own)
            group = -1
        parts.append(f"{group}@{x.storage_offset()}")
    return hashlib.sha256(",".join(parts).encode()).hexdigest()[:16]


def _stitch_functions(gm: torch.fx.GraphModule, ident: str) -> dict[str, str]:
    """Plain Python functions stitch's pattern rewrites put in the Dynamo graph (the
    fused linear + cross-entropy, ...), as torch's `unsafe_marked_cacheable_functions`
    wants them: torch refuses to cache a graph calling a function it does not know,
    and what these do is stitch's source, already in the key."""
    out = {}
    for n in gm.graph.nodes:
        module = getattr(n.target, "__module__", "") or ""
        if n.op == "call_function" and module.startswith("stitchml.") and hasattr(n.target, "__name__"):
            out[f"{module}.{n.target.__name__}"] = ident
    return out


@contextlib.contextmanager
def caching(backend: Any, gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> Iterator[None]:
    """Around one AOTAutograd call: the bundled cache on, keyed by stitch's identity and
    the inputs' storage sharing, the backward handed over with the forward, and
    `backend` where a hit compiles."""
    import torch._functorch.config as fconfig
    import torch._inductor.config as iconfig
    ident = identity()
    tag = f"{torch.compiler.config.cache_key_tag}|stitchml-{ident}-{input_storage_signature(example_inputs)}"
    marked = _stitch_functions(gm, ident)
    token = _BACKEND.set(backend)
    try:
        with contextlib.ExitStack() as stack:
            stack.enter_context(fconfig.patch(bundled_autograd_cache=True, force_non_lazy_backward_lowering=True))
            stack.enter_context(torch.compiler.config.patch(cache_key_tag=tag))
            if marked and hasattr(iconfig, "unsafe_marked_cacheable_functions"):
                stack.enter_context(iconfig.patch(unsafe_marked_cacheable_functions={
                    **iconfig.unsafe_marked_cacheable_functions, **marked}))
            yield
    finally:
        _BACKEND.reset(token)


def serializable(compile_fn: Callable[[torch.fx.GraphModule, Sequence[Any], str], Callable],
                 kind: str) -> Any:
    """An AOTAutograd compiler for graphs of `kind` whose result the cache can keep:
    `compile_fn(gm, example_inputs, kind)` wrapped in a `StitchOutput`."""
    OutputCode, Serializable, _ = _torch_parts()  # type: ignore[misc]

    def compiler(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> Any:
        blob = _dump(gm)            # before compiling: the pipeline pads GEMMs in place
        if kind == "backward":      # compiled at its first call (see the module doc)
            return output_class()(kind, blob, None, lambda: compile_fn(gm, example_inputs, kind))
        return output_class()(kind, blob, compile_fn(gm, example_inputs, kind))

    return Serializable(output_class(), compiler)


def _dump(gm: torch.fx.GraphModule) -> bytes | None:
    _, _, GraphPickler = _torch_parts()  # type: ignore[misc]
    try:
        from torch.fx._graph_pickler import Options
        # any torch.ops op (stitch's own `torch.ops.stitchml`, prims, higher-order ops),
        # not only aten: one whose library is not loaded at a hit fails there, a miss.
        # Of node metadata, stitch reads only the fake value: stack traces and provenance
        # took half the time (BERT-base training graphs: 1.1 s to pickle all of it)
        options = Options(ops_filter=lambda name: name.startswith("torch.ops."),
                          node_metadata_key_filter=lambda key: key == "val")
    except (ImportError, TypeError):
        options = None
    try:
        return GraphPickler.dumps(gm, options) if options is not None else GraphPickler.dumps(gm)
    except Exception as e:  # an unpicklable graph is compiled, just not cached
        log.info("stitchml: graph not cached by AOTAutograd (%s: %s)", type(e).__name__, e)
        return None


_CLASS: list[type] = []


def output_class() -> type:
    """`StitchOutput`, made on first use (its base class is torch's `OutputCode`)."""
    if not _CLASS:
        OutputCode = _torch_parts()[0]  # type: ignore[index]

        class StitchOutput(OutputCode):  # type: ignore[misc, valid-type]
            """A stitched graph as AOTAutograd's cache sees it: run, or pickled as its
            ATen graph and compiled again on load."""

            def __init__(self, kind: str, blob: bytes | None, run: Callable | None,
                         build: Callable[[], Callable] | None = None) -> None:
                super().__init__()
                self.kind, self.blob, self.run, self.build = kind, blob, run, build
                self._boxed_call = True

            def __call__(self, inputs: Sequence[Any]) -> Any:
                run = self.run
                if run is None:   # a backward: compiled now, at its first call
                    run = self.run = self.build()
                    self.build = None
                return run(inputs)

            def prepare_for_serialization(self) -> None:
                # (called on a copy of the live object: the running callable stays there)
                if self.blob is None:   # (a bypass: torch counts it and logs at INFO, no warning)
                    try:
                        from torch._functorch._aot_autograd.autograd_cache import BypassAOTAutogradCache as why
                    except ImportError:  # pragma: no cover
                        why = RuntimeError
                    raise why("stitchml: the graph could not be pickled")
                self.run = self.build = None

            def post_compile(self, example_inputs: Sequence[Any], constants: Any, graph_kwargs: Any) -> None:
                if self.run is not None or self.build is not None:
                    return
                build = _load(self.kind, self.blob, example_inputs)
                if self.kind == "backward":
                    self.build = build
                else:
                    self.run = build()

            def set_triton_bundle(self, triton_bundle: Any) -> None:
                pass

        StitchOutput.__module__ = __name__
        StitchOutput.__qualname__ = "StitchOutput"
        _CLASS.append(StitchOutput)
    return _CLASS[0]


def __getattr__(name: str) -> Any:
    # pickle finds the class by `stitchml.capture.aot_cache.StitchOutput`
    if name == "StitchOutput":
        return output_class()
    raise AttributeError(name)


def _load(kind: str, blob: bytes, example_inputs: Sequence[Any]) -> Callable[[], Callable]:
    """A cache hit: the graph back from its bytes, and what compiles it in the running
    backend (called at once for a forward, at its first call for a backward)."""
    from torch._guards import detect_fake_mode
    _, _, GraphPickler = _torch_parts()  # type: ignore[misc]
    fake_mode = detect_fake_mode(example_inputs)
    if fake_mode is None:
        from torch._subclasses.fake_tensor import FakeTensorMode
        fake_mode = FakeTensorMode()
    gm = GraphPickler.loads(blob, fake_mode)
    gm.recompile()
    inputs = [n.meta.get("val") for n in gm.graph.find_nodes(op="placeholder")]
    backend = _BACKEND.get()
    if backend is None:
        raise RuntimeError("a stitchml AOTAutograd cache entry loaded outside the stitch backend")
    return lambda: backend.compile_loaded(gm, inputs, kind)


__all__ = ["caching", "identity", "output_class", "refusal", "serializable"]
