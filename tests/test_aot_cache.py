"""AOTAutograd's cache holding stitched graphs (capture/aot_cache.py, issue 14): a second
process takes the forward and backward ATen graphs from the cache instead of tracing and
partitioning the joint graph again, and compiles them through stitch's pipeline."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from stitchml import config
from stitchml.capture import aot_cache

pytestmark = pytest.mark.skipif(aot_cache._torch_parts() is None,
                                reason=f"torch {torch.__version__} has no bundled AOTAutograd cache")

CHILD = r'''
import copy, json, os, sys
import torch
import stitchml
from stitchml.capture.backend import DEFAULT
from torch._dynamo.utils import counters

class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.up, self.norm, self.down = torch.nn.Linear(24, 40), torch.nn.LayerNorm(40), torch.nn.Linear(40, 24)

    def forward(self, x):
        h = torch.nn.functional.gelu(self.norm(self.up(x)))
        return (self.down(h) + x).softmax(-1)

torch.manual_seed(0)                 # the same parameters in both processes
model = Block()
ref = copy.deepcopy(model)
torch.manual_seed(int.from_bytes(os.urandom(4), "little"))   # fresh inputs each process
x = torch.randn(6, 24)
y = torch.compile(model, backend="stitch")(x)
y.square().sum().backward()
e = ref(x)
e.square().sum().backward()
err = max([(y - e).abs().max().item()] +
          [(p.grad - q.grad).abs().max().item() for p, q in zip(model.parameters(), ref.parameters())])
print("RESULT " + json.dumps({
    "counters": dict(counters["aot_autograd"]),
    "records": [[r.kind, r.aot_cache, r.eager_reason, r.plan.num_kernels if r.plan else 0] for r in DEFAULT.records],
    "note": DEFAULT.aot_cache_note, "err": err}))
'''


def _run(tmp_path: Path, **env: str) -> dict:
    full = dict(os.environ, TRITON_INTERPRET="1", STITCHML_AOT_CACHE="1", STITCHML_PLAN_CACHE="1",
                STITCHML_CACHE_DIR=str(tmp_path / "stitch"), TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "torch"),
                PYTHONPATH=os.pathsep.join([str(Path(__file__).resolve().parents[1] / "src"),
                                            os.environ.get("PYTHONPATH", "")]))
    full.update(env)
    out = subprocess.run([sys.executable, "-c", CHILD], env=full, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    line = next(ln for ln in out.stdout.splitlines() if ln.startswith("RESULT "))
    return json.loads(line[len("RESULT "):])


def _kernels(res: dict) -> list:
    return [(kind, n) for kind, _, _, n in res["records"]]


def test_second_process_takes_both_graphs_from_the_cache(tmp_path):
    cold = _run(tmp_path)
    assert cold["counters"].get("autograd_cache_miss") == 1 and cold["counters"].get("autograd_cache_saved") == 1
    assert [r[1] for r in cold["records"]] == ["", ""]
    assert cold["err"] < 1e-4
    warm = _run(tmp_path)
    assert warm["counters"].get("autograd_cache_hit") == 1, warm
    assert "autograd_cache_miss" not in warm["counters"]
    # the same stitched graphs, compiled from the cached ATen graphs, every op in kernels
    assert [r[:2] for r in warm["records"]] == [["forward", "hit"], ["backward", "hit"]]
    assert all(r[2] is None for r in warm["records"])
    assert _kernels(warm) == _kernels(cold) and all(n > 0 for _, n in _kernels(warm))
    assert warm["err"] < 1e-4           # fresh inputs: the loaded graphs compute the right thing


def test_a_changed_knob_or_a_damaged_entry_compiles_cold(tmp_path):
    cold = _run(tmp_path)
    assert cold["counters"].get("autograd_cache_saved") == 1
    other = _run(tmp_path, STITCHML_POINTWISE_BLOCK="256")   # part of stitch's key: no hit
    assert "autograd_cache_hit" not in other["counters"] and other["err"] < 1e-4
    entries = [p for p in (tmp_path / "torch" / "aotautograd").rglob("*") if p.is_file()]
    assert entries
    for p in entries:
        p.write_bytes(b"\x80\x04 not a pickle")
    damaged = _run(tmp_path)
    assert "autograd_cache_hit" not in damaged["counters"]
    assert [r[1] for r in damaged["records"]] == ["", ""] and damaged["err"] < 1e-4
    assert _kernels(damaged) == _kernels(cold)


def test_knob_off_writes_nothing(tmp_path):
    res = _run(tmp_path, STITCHML_AOT_CACHE="0")
    assert res["note"] == "knob aot_cache is off"
    assert not (tmp_path / "torch" / "aotautograd").exists() or \
        not any(p.is_file() for p in (tmp_path / "torch" / "aotautograd").rglob("*"))


def test_identity_follows_every_knob():
    base = aot_cache.identity()
    with config.override(loop_block_cols=config.get("loop_block_cols") * 2):
        assert aot_cache.identity() != base
    assert aot_cache.identity() == base


def test_refusals_name_their_reason():
    with config.override(aot_cache=False):
        assert aot_cache.refusal([torch.randn(2)]) == "knob aot_cache is off"
    with config.override(aot_cache=True):
        assert aot_cache.refusal([torch.randn(2)]) is None
        with torch.compiler.config.patch(force_disable_caches=True):
            assert "force_disable_caches" in aot_cache.refusal([torch.randn(2)])


def test_symbolic_graphs_are_not_cached(tmp_path, monkeypatch):
    from stitchml.capture.backend import StitchBackend
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    backend = StitchBackend()
    f = torch.compile(lambda a: (a * 2).relu(), backend=backend, dynamic=True)
    with config.override(aot_cache=True):
        a = torch.randn(5)
        torch.testing.assert_close(f(a), (a * 2).relu())
    assert "symbolic" in backend.aot_cache_note


def test_a_hit_that_fails_half_way_leaves_only_the_cold_records(tmp_path, monkeypatch):
    """The backward's load fails after the forward's compiled: torch compiles cold, and
    the backend keeps the records of the graphs that run, not of the abandoned load."""
    from stitchml.capture.backend import StitchBackend
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    lin = torch.nn.Linear(8, 8)

    def step(backend):
        torch._dynamo.reset()
        x = torch.randn(4, 8)
        y = torch.compile(lambda a: torch.tanh(lin(a)).sum(-1), backend=backend)(x)
        y.sum().backward()
        g = lin.weight.grad.clone()
        lin.weight.grad = None
        e = torch.tanh(lin(x)).sum(-1)
        e.sum().backward()
        torch.testing.assert_close(y, e)
        torch.testing.assert_close(g, lin.weight.grad)
        lin.weight.grad = None

    with config.override(aot_cache=True):
        first = StitchBackend()
        step(first)
        assert [r.aot_cache for r in first.records] == ["", ""]
        hit = StitchBackend()
        step(hit)
        assert [r.aot_cache for r in hit.records] == ["hit", "hit"]
        from stitchml.tools.explain import Report
        assert Report(hit.records).to_text().count("ATen graph from AOTAutograd's cache") == 2
        assert "AOTAutograd's cache" not in Report(first.records).to_text()

        real = aot_cache._load

        def failing(kind, blob, example_inputs):
            if kind == "backward":   # (the forward's graph is compiled by then)
                raise RuntimeError("injected: the backward's entry cannot be loaded")
            return real(kind, blob, example_inputs)

        monkeypatch.setattr(aot_cache, "_load", failing)
        broken = StitchBackend()
        step(broken)
    assert [(r.kind, r.aot_cache) for r in broken.records] == [("forward", ""), ("backward", "")]


def test_the_backward_compiles_at_its_first_call(tmp_path, monkeypatch):
    """AOTAutograd hands the backward over with the forward while caching; stitch
    compiles it when it first runs, cold or from the cache, as without the cache."""
    from stitchml.capture.backend import StitchBackend
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    norm = torch.nn.LayerNorm(16)
    with config.override(aot_cache=True):
        for source in ("", "hit"):
            torch._dynamo.reset()
            backend = StitchBackend()
            x = torch.randn(5, 16)
            y = torch.compile(lambda a: torch.sigmoid(norm(a)) * a, backend=backend)(x)
            assert [(r.kind, r.aot_cache) for r in backend.records] == [("forward", source)]
            y.square().sum().backward()
            assert [(r.kind, r.aot_cache) for r in backend.records] == [("forward", source), ("backward", source)]
            got = norm.weight.grad.clone()
            norm.weight.grad = norm.bias.grad = None
            (torch.sigmoid(norm(x)) * x).square().sum().backward()
            torch.testing.assert_close(got, norm.weight.grad)
            norm.weight.grad = norm.bias.grad = None


def test_retained_graphs_run_backward_again(tmp_path, monkeypatch):
    """backward(retain_graph=True) twice, cold and from the cache: the backward handed
    over with the forward donates no saved buffer (AOTAutograd would refuse the call)."""
    from stitchml.capture.backend import StitchBackend
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    w = torch.randn(12, requires_grad=True)
    with config.override(aot_cache=True):
        for source in ("", "hit"):
            torch._dynamo.reset()
            backend = StitchBackend()
            x = torch.randn(3, 12)
            y = torch.compile(lambda a: torch.softmax(a * w, -1).square().sum(), backend=backend)(x)
            (g1,) = torch.autograd.grad(y, w, retain_graph=True)
            (g2,) = torch.autograd.grad(y, w)
            (e,) = torch.autograd.grad(torch.softmax(x * w, -1).square().sum(), w)
            torch.testing.assert_close(g1, e)
            torch.testing.assert_close(g2, e)
            assert [r.aot_cache for r in backend.records] == [source, source]


def test_a_retained_backward_after_a_plain_one(tmp_path, monkeypatch):
    """Without the cache too: a first plain backward compiles the backward; a later
    backward(retain_graph=True) still runs (stitch takes no donated buffers)."""
    from stitchml.capture.backend import StitchBackend
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    w = torch.randn(10, requires_grad=True)
    f = torch.compile(lambda a: torch.tanh(a * w).square().sum(), backend=StitchBackend())
    with config.override(aot_cache=False):
        x = torch.randn(4, 10)
        (g0,) = torch.autograd.grad(f(x), w)
        y = f(x)
        (g1,) = torch.autograd.grad(y, w, retain_graph=True)
        (g2,) = torch.autograd.grad(y, w)
    (e,) = torch.autograd.grad(torch.tanh(x * w).square().sum(), w)
    for g in (g0, g1, g2):
        torch.testing.assert_close(g, e)


def test_inputs_that_share_storage_or_start_elsewhere_are_other_entries():
    """torch's key leaves out which inputs alias and their storage offsets; both change
    the graphs (a write through a view of another input, as_strided's absolute offset)."""
    a = torch.randn(4, 8)
    sig = aot_cache.input_storage_signature
    assert sig([a, a[1]]) != sig([a, torch.randn(8)])
    big = torch.randn(64)
    assert sig([big[0:32]]) != sig([big[16:48]])
    assert sig([big[16:48]]) == sig([torch.randn(64)[16:48]]) and sig([a, 3]) == sig([torch.randn(4, 8), 5])


def _cold_then_hit(tmp_path, monkeypatch, fn, *inputs, check):
    from stitchml.capture.backend import StitchBackend
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    backends = []
    with config.override(aot_cache=True):
        for _ in range(2):
            torch._dynamo.reset()
            backends.append(StitchBackend())
            check(torch.compile(fn, backend=backends[-1])(*inputs))
    return backends


def test_graphs_with_stitch_pattern_functions_are_cached(tmp_path, monkeypatch):
    """The fused linear + cross-entropy the pattern rewrite puts in the Dynamo graph is a
    Python function torch would not cache without being told it is stitch's."""
    lin = torch.nn.Linear(16, 40)
    x, t = torch.randn(12, 16), torch.randint(0, 40, (12,))

    def loss(a, b):
        return torch.nn.functional.cross_entropy(lin(a), b)

    def check(out):
        out.backward()
        got = lin.weight.grad.clone()
        lin.weight.grad = lin.bias.grad = None
        ref = loss(x, t)
        ref.backward()
        torch.testing.assert_close(out, ref)
        torch.testing.assert_close(got, lin.weight.grad)
        lin.weight.grad = lin.bias.grad = None

    cold, warm = _cold_then_hit(tmp_path, monkeypatch, loss, x, t, check=check)
    assert any(p.applied and p.pattern == "linear_ce" for p in cold.patterns)
    assert [r.aot_cache for r in warm.records] == ["hit", "hit"] and warm.aot_cache_note is None


def test_a_late_backward_keeps_the_hits_of_other_graphs(tmp_path, monkeypatch):
    """Two graphs (a graph break); the second process changes the first graph only: its
    backward compiles cold, after the second graph was loaded from the cache, and must
    leave that graph's records alone."""
    from stitchml.capture.backend import StitchBackend
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    w = torch.randn(10, requires_grad=True)
    x = torch.randn(3, 10)

    def make(scale):
        def f(a):
            h = torch.tanh(a * w * scale)
            torch._dynamo.graph_break()
            return torch.sigmoid(h).sum()
        return f

    backends = []
    with config.override(aot_cache=True):
        for scale in (2.0, 3.0):
            torch._dynamo.reset()
            backends.append(StitchBackend())
            torch.compile(make(scale), backend=backends[-1])(x).backward()
            got = w.grad.clone()
            w.grad = None
            make(scale)(x).backward()
            torch.testing.assert_close(got, w.grad)
            w.grad = None
    cold, warm = backends
    assert len(cold.records) == 4
    assert sorted((r.kind, r.aot_cache) for r in warm.records) == [
        ("backward", ""), ("backward", "hit"), ("forward", ""), ("forward", "hit")]


def test_an_unpicklable_graph_is_compiled_not_cached_and_says_so(tmp_path, monkeypatch, caplog):
    from stitchml.capture.backend import StitchBackend
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(aot_cache, "_dump", lambda gm: None)   # as if GraphPickler refused it
    w = torch.randn(16, requires_grad=True)
    x = torch.randn(8, 16)
    be = StitchBackend()
    with config.override(aot_cache=True):
        y = torch.compile(lambda a: (a * w).tanh().sum(-1), backend=be)(x)
    torch.testing.assert_close(y, (x * w).tanh().sum(-1))
    assert "bypassed" in be.aot_cache_note
    assert not any("unable to serialize" in r.getMessage() for r in caplog.records if r.levelname == "WARNING")
    assert not any(p.is_file() for p in tmp_path.rglob("*") if "aotautograd" in str(p))
