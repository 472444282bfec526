"""The fused ops' Triton kernels (chunked cross-entropy rows, GEMM with epilogue)
compile for Hopper (sm_90) with the launch configurations the ops use, without
spilling; no GPU needed.  A subprocess, because this process runs Triton's interpreter."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_fused_kernels_compile_for_sm90_without_spills():
    pytest.importorskip("triton.backends.nvidia")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = str(ROOT / "src") + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.run([sys.executable, "-m", "stitchml.patterns.aot"], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=600)
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
