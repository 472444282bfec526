"""The fused ops' Triton kernels compiled ahead of time for a GPU target, no GPU
needed (as `tools/aot_check.py` does for generated kernels), with the launch
configurations the ops use on CUDA; registers and spills reported.  Must run where
Triton is not in interpreter mode."""
from __future__ import annotations

import os
from typing import Any

from . import gemm_op, linear_ce_op

_CE_SIG = {"z_ptr": "*{dt}", "z_stride": "i32", "tgt_ptr": "*i64", "loss_ptr": "*fp32", "lse_ptr": "*fp32",
           "count_ptr": "*fp32", "V": "i32", "ignore_index": "i32", "smooth": "fp32", "softcap": "fp32"}
_GEMM_PTRS = ("x_ptr", "w_ptr", "b_ptr", "r_ptr", "m_ptr", "y_ptr", "z_ptr")
_GEMM_INTS = ("M", "N", "K", "sxm", "sxk", "swn", "swk", "srm", "srn", "smm", "smn")


def _compile(fn, sig: dict, consts: dict, warps: int, arch: int, stages: int | None = None,
             aligned: tuple[str, ...] = ()) -> dict[str, Any]:
    """Compile `fn` for sm_`arch` (`aot_check.compile_function`): `aligned` the arguments
    the JIT marks divisible by 16 (pointers from the allocator, leading dimensions a
    multiple of 16)."""
    from ..tools.aot_check import compile_function
    options: dict[str, Any] = {"num_warps": warps}
    if stages is not None:
        options["num_stages"] = stages
    return compile_function(fn, sig, consts, options, arch, aligned)


def check(arch: int = 90) -> dict[str, dict[str, Any]]:
    """{kernel variant: {ok, registers, spills | error}} for the variants the ops launch."""
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        raise RuntimeError("patterns.aot.check needs Triton out of interpreter mode")
    out = {}
    for dt in ("bf16", "fp32"):
        for vocab, has_lse in ((1000, False), (128256, False), (128256, True)):
            block = linear_ce_op.launch_block(vocab)
            sig = {k: v.format(dt=dt) for k, v in _CE_SIG.items()}
            consts = {"HAS_SOFTCAP": True, "WRITE_GRAD": True, "HAS_LSE": has_lse, "BLOCK": block, "HAS_SMOOTH": True}
            name = f"ce_rows_{dt}_block{block}" + ("_backward" if has_lse else "")
            out[name] = _compile(linear_ce_op._ce_rows_kernel, sig, consts, linear_ce_op.launch_warps(block), arch)
        # every candidate tile configuration with every epilogue input, as a launch on
        # contiguous operands compiles it: unit strides specialised, pointers and leading
        # dimensions 16-byte aligned (unspecialised strides defeat the software pipeline:
        # 64x64x32 then took 151 registers and one K step at a time, against 57 and 3)
        sig = {**{p: f"*{dt}" for p in _GEMM_PTRS}, **{i: "i32" for i in _GEMM_INTS}}
        for tile in gemm_op.CONFIGS:
            consts = dict(sxk=1, swk=1, srn=1, smn=1, ACT=3, HAS_BIAS=True, HAS_RES=True, HAS_MUL=True,
                          SAVE_PRE=True, UPCAST=False, BM=tile.bm, BN=tile.bn, BK=tile.bk)
            out[f"gemm_epilogue_{dt}_{tile.name}"] = _compile(
                gemm_op._gemm_epilogue_kernel, sig, consts, tile.warps, arch, tile.stages,
                aligned=_GEMM_PTRS + ("N", "K", "sxm", "swn", "srm", "smm"))
    return out


if __name__ == "__main__":
    import json
    print(json.dumps(check()))
