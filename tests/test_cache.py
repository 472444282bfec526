"""Persistent kernel cache: reuse across processes, concurrency, corruption."""
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import torch

from stitchml import config
from stitchml.runtime import kernel_cache

SCRIPT = textwrap.dedent("""
    import os, sys, json
    os.environ["TRITON_INTERPRET"] = "1"
    import torch, torch.nn.functional as F, stitchml
    from stitchml.runtime.kernel_cache import STATS
    torch.manual_seed(0)
    def f(x, w, b, r):
        return F.layer_norm(x + r, (x.shape[-1],), w, b).softmax(-1) * 2
    x, w, b, r = torch.randn(16, 48, requires_grad=True), torch.randn(48), torch.randn(48), torch.randn(16, 48)
    out = torch.compile(f, backend=stitchml.StitchBackend())(x, w, b, r)
    out.sum().backward()
    ok = torch.allclose(out, f(x, w, b, r), atol=1e-5)
    print(json.dumps({"ok": ok, **STATS}))
""")


def _run(cache: Path, background: bool = False):
    env = dict(os.environ, STITCHML_CACHE_DIR=str(cache), TRITON_INTERPRET="1")
    args = [sys.executable, "-c", SCRIPT]
    if background:
        return subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out = subprocess.run(args, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_second_process_does_no_code_generation(tmp_path):
    first = _run(tmp_path)
    second = _run(tmp_path)
    assert first["ok"] and second["ok"]
    assert first["generated"] > 0 and first["disk_hits"] == 0
    assert second["generated"] == 0 and second["disk_hits"] == first["generated"]


def test_two_processes_compiling_at_once_both_succeed(tmp_path):
    procs = [_run(tmp_path, background=True) for _ in range(2)]
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err[-3000:]
        assert json.loads(out.strip().splitlines()[-1])["ok"]
    entries = list((tmp_path / "generated").glob("*.json"))
    assert entries and all(json.loads(e.read_text())["payload"] for e in entries)
    assert not list((tmp_path / "generated").glob("*.tmp"))


def test_corrupted_entry_is_rebuilt_with_a_warning(tmp_path):
    import pytest
    with config.override(cache_dir=str(tmp_path)):
        calls = []

        def make():
            calls.append(1)
            return {"params": [["in", 0]], "param_names": ["in0"], "body": ["pass"], "grid": 1,
                    "num_warps": 1, "levels": {}}

        kernel_cache.drop_memory()
        kernel_cache.cached_payload("abc", make)
        path = tmp_path / "generated" / "abc.json"
        data = json.loads(path.read_text())
        data["payload"]["body"] = ["tl.store(in0, 0)"]  # tampered: checksum no longer matches
        path.write_text(json.dumps(data))
        kernel_cache.drop_memory()   # as a new process would: only the disk entry is left
        with pytest.warns(UserWarning, match="corrupted kernel cache entry"):
            payload = kernel_cache.cached_payload("abc", make)
        assert payload["body"] == ["pass"] and len(calls) == 2
        path.write_text(path.read_text()[:25])  # truncated
        kernel_cache.drop_memory()
        with pytest.warns(UserWarning, match="corrupted"):
            kernel_cache.cached_payload("abc", make)
        assert len(calls) == 3
        kernel_cache.drop_memory()
        assert kernel_cache.cached_payload("abc", make)["body"] == ["pass"] and len(calls) == 3


def test_key_changes_with_the_kernel_and_the_code_generator(monkeypatch):
    import torch.nn.functional as F
    from planning import plan_of
    p1 = plan_of(lambda x: torch.softmax(x, -1), torch.randn(8, 40))
    p2 = plan_of(lambda x: torch.softmax(x, -1), torch.randn(8, 41))
    k1 = kernel_cache.kernel_key(p1.graph, p1.kernels[0], "cuda")
    assert k1 != kernel_cache.kernel_key(p2.graph, p2.kernels[0], "cuda")
    assert k1 != kernel_cache.kernel_key(p1.graph, p1.kernels[0], "cpu")
    monkeypatch.setattr(kernel_cache, "_CODE_HASH", ["another-generator"])
    assert k1 != kernel_cache.kernel_key(p1.graph, p1.kernels[0], "cuda")
