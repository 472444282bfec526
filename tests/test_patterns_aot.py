"""The fused ops' Triton kernels (chunked cross-entropy rows, GEMM with epilogue)
compile for Hopper (sm_90) with the launch configurations the ops use, without
spilling; no GPU needed.  Outside this process, which runs Triton's interpreter (`outside_interpreter`)."""
import json

import outside_interpreter


def test_fused_kernels_compile_for_sm90_without_spills():
    proc = outside_interpreter.run(module="stitchml.patterns.aot", timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads(proc.stdout.strip().splitlines()[-1])
    from stitchml.patterns import gemm_op
    # per dtype: three cross-entropy row kernels and every candidate GEMM tile configuration
    assert len(results) == 2 * (3 + len(gemm_op.CONFIGS))
    assert {n for n in results if n.startswith("gemm_epilogue_bf16_")} == \
        {f"gemm_epilogue_bf16_{c.name}" for c in gemm_op.CONFIGS}
    for name, r in results.items():
        assert r["ok"], (name, r)
        if r["registers"] is not None:
            assert r["registers"] <= 255 and r["spills"] == 0, (name, r)
