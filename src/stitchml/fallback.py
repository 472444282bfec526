"""What happens when something cannot be stitched (issue 18.1): never silently.

- a whole graph that runs eagerly warns once (one warning per compiled graph) with its
  reason, and `explain` shows the reason (`CompiledGraph.eager_reason`);
- a single op without a lowering rule runs eagerly between kernels with the reason
  "no lowering rule"; ops we leave to ATen on purpose (sort, topk: library ops, like a
  matrix product; `_assert_async`, a runtime check) carry their own reason instead;
- under the knob `strict` (STITCHML_STRICT=1, for CI) both raise `StrictFallbackError`
  naming the op (or graph) and the reason.
"""
from __future__ import annotations

import warnings

import torch

from . import config

aten = torch.ops.aten

NO_RULE = "no lowering rule"

# Ops we leave to ATen by design, with why: not stitched, not a "no lowering rule" gap.
LIBRARY_OPS: dict[object, str] = {
    aten.sort.default: "library op: sorting networks are not a stitched kernel form",
    aten.sort.stable: "library op: sorting networks are not a stitched kernel form",
    aten.topk.default: "library op: selection (top-k) is not a stitched kernel form",
    # medians, modes and k-th values select by order, like top-k
    **{op: "library op: selection (median, mode, k-th value) is not a stitched kernel form"
       for op in (aten.median.default, aten.median.dim, aten.nanmedian.default, aten.nanmedian.dim,
                  aten.mode.default, aten.kthvalue.default)},
    aten._local_scalar_dense.default: "library op: reads a value back to the host",
    aten.nonzero.default: "library op: data-dependent output shape",
    aten.masked_select.default: "library op: data-dependent output shape",
    aten.unique_consecutive.default: "library op: data-dependent output shape",
    aten._unique2.default: "library op: data-dependent output shape",
    # F.one_hot's range checks (issue 18): ATen raises when the condition is false, so a
    # failing check is never dropped; a kernel could not raise
    aten._assert_async.msg: "library op: a runtime check (raises when its condition is false)",
    aten._assert_async.default: "library op: a runtime check (raises when its condition is false)",
    # nn.functional.bilinear's contraction of three operands: matrix products in eager
    aten._trilinear.default: "compute-intensive: a bilinear contraction (matrix products)",
    # torch's LSTM decomposition picks oneDNN's fused layer on the CPU (`allow_rnn` on): its
    # gate products and recurrence are one vendor kernel; on a GPU it gives products and
    # point-wise gates, which stitch
    **({aten.mkldnn_rnn_layer.default: "compute-intensive: oneDNN's fused recurrent layer (vendor library, CPU)"}
       if hasattr(aten, "mkldnn_rnn_layer") else {}),
    # a random permutation is a sort of random keys (and eager's generator draws it)
    aten.randperm.default: "library op: a random permutation (a sort of random keys)",
    # size queries of dynamic shapes: answered on the host from the tensor's metadata
    aten.sym_size.int: "host: a size query under dynamic shapes (no data moved)",
    aten.sym_stride.int: "host: a size query under dynamic shapes (no data moved)",
    aten.sym_numel.default: "host: a size query under dynamic shapes (no data moved)",
    aten.sym_storage_offset.default: "host: a size query under dynamic shapes (no data moved)",
    aten.sym_is_contiguous.default: "host: a layout query under dynamic shapes (no data moved)",
}


# Library ops of other packages, by name (their op objects exist only once the package
# is imported): Hugging Face MoE's grouped matrix product is a matmul.
LIBRARY_OP_NAMES: dict[str, str] = {
    "transformers.grouped_mm_fallback.default": "compute-intensive: grouped matrix product (vendor library)",
    "transformers.grouped_mm_fallback_backward.default": "compute-intensive: grouped matrix product (vendor library)",
    # F.linear_cross_entropy with `options`: torch's own chunked loss, chosen by the user
    # (matrix products per chunk of tokens; the logits never exist in full)
    **{f"torch_nn._linear_cross_entropy_batch_chunked{tail}.default":
       "compute-intensive: torch's chunked linear cross-entropy (matrix products per chunk)"
       for tail in ("", "_no_reduction")},
}


class StrictFallbackError(RuntimeError):
    """Raised under `STITCHML_STRICT=1` where stitchml would otherwise run something eagerly."""


def strict() -> bool:
    return bool(config.get("strict"))


def may_fall_back() -> bool:
    """Whether a failure may turn into eager execution (else it propagates)."""
    return bool(config.get("fallback_on_error")) and not strict()


# Dense linear algebra (factorisations, solves, inverses, decompositions) is the vendor
# library's (cuSOLVER / LAPACK): compute-intensive, like the matrix products
_LINALG_PREFIXES = ("aten.linalg_", "aten._linalg_")
_LINALG_OPS = {"lu_unpack", "triangular_solve", "cholesky", "cholesky_solve", "cholesky_inverse", "geqrf",
               "ormqr", "householder_product", "mv", "_lu_with_info", "linalg_lu_factor_ex"}


def library_reason(target: object) -> str | None:
    """Why an op stays in ATen by design, or None: not a library op."""
    if target in LIBRARY_OPS:
        return LIBRARY_OPS[target]
    name = str(target)
    if name in LIBRARY_OP_NAMES:
        return LIBRARY_OP_NAMES[name]
    if name.startswith("aten._fft_"):
        return "compute-intensive: FFT (vendor library)"
    if name == "with_effects":
        return "library op: an op with side effects, ordered by an effect token (linalg's error checks)"
    if name.startswith(_LINALG_PREFIXES) or name.split(".")[1:2] and name.split(".")[1] in _LINALG_OPS:
        return "compute-intensive: dense linear algebra (vendor library)"
    return None


def by_design(reason: str) -> bool:
    """Whether an eager op's reason is the library's by design (compute-intensive or a
    library op), not a gap in stitchml: as given, or behind one prefix naming where it
    came from (`with_effects: `, or the op of a multi-op record)."""
    return any(r.startswith(("compute-intensive", "library op")) for r in (reason, reason.split(": ", 1)[-1]))


def no_rule_reason(target: object) -> str:
    """The reason an op without a lowering rule runs eagerly; raises under strict
    (library ops are by design, so they never raise)."""
    lib = library_reason(target)
    if lib is not None:
        return lib
    from .capture.decomp import declined_reason  # a decomposition that declined the case says why
    reason = declined_reason(target) or NO_RULE
    if strict():
        raise StrictFallbackError(f"stitchml strict: op {target} would run eagerly: {reason}")
    return reason


def graph_falls_back(kind: str, reason: str, error: BaseException | None = None) -> None:
    """A whole graph is about to run eagerly (compiler.compile_graph's except branch).
    Strict: raise instead (an op-level strict error passes through unchanged).  Else one
    warning for this graph with its reason."""
    if isinstance(error, StrictFallbackError):
        raise error
    if strict():
        raise StrictFallbackError(f"stitchml strict: the whole {kind} graph would run eagerly: {reason}") \
            from error
    warnings.warn(f"stitchml: {kind} graph runs eagerly: {reason}", stacklevel=3)
