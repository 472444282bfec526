"""Compile time (issue 14): kernels shared by content, the plan cache across processes,
concurrent writers, damaged entries, version changes, the parallel compile jobs."""
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import stitchml
from stitchml import config, pipeline
from stitchml.runtime import kernel_cache, plan_cache


class Block(torch.nn.Module):
    def __init__(self, h):
        super().__init__()
        self.ln = torch.nn.LayerNorm(h)
        self.fc = torch.nn.Linear(h, h)

    def forward(self, x):
        return x + F.gelu(self.fc(self.ln(x))).softmax(-1)


def _stack(layers, h=24):
    torch.manual_seed(0)
    return torch.nn.Sequential(*[Block(h) for _ in range(layers)])


def test_identical_layers_compile_to_shared_kernels(tmp_path):
    """Five equal layers: the interior layers' kernels are one body, generated once and
    loaded as one Triton function (what Triton compiles once).  (Five, not three: with
    min-cut rematerialisation the first and last layers save other values for the
    backward, so their kernels differ and three layers have no interior repeat.)"""
    def distinct_functions(layers):
        kernel_cache.drop_memory()
        before = dict(kernel_cache.STATS)
        backend = stitchml.StitchBackend()
        model = _stack(layers)
        x = torch.randn(6, 24)
        with config.override(cache_dir=str(tmp_path / f"c{layers}")):
            out = torch.compile(model, backend=backend)(x)
        torch.testing.assert_close(out, model(x), rtol=1e-5, atol=1e-5)
        rec = backend.records[0]
        generated = kernel_cache.STATS["generated"] - before["generated"]
        modules = kernel_cache.STATS["modules"] - before["modules"]
        return len(rec.kernels), generated, modules

    k1, gen1, mod1 = distinct_functions(1)
    k5, gen5, mod5 = distinct_functions(5)
    assert k5 > k1 >= 2
    # layer 1 alone is what five layers generate and load, give or take the kernels at
    # the seams (the first layer reads the graph input, the last one writes the output)
    assert gen5 <= gen1 + 2 and mod5 <= mod1 + 2, (k1, gen1, mod1, k5, gen5, mod5)
    assert mod5 < k5


def test_equal_bodies_share_one_triton_function(tmp_path):
    with config.override(cache_dir=str(tmp_path)):
        body = "@triton.jit\ndef {}(x):\n    tl.store(x + tl.arange(0, 4), 1.0)\n"
        fns = kernel_cache.load_kernels({"a": body.format("k1"), "b": body.format("k7"),
                                         "c": body.format("k1").replace("1.0", "2.0")})
    assert fns["a"] is fns["b"] and fns["a"] is not fns["c"]


def test_kernel_modules_share_one_helpers_module(tmp_path):
    """The helpers (triton_ops.PRELUDE) are built once per process, not once per kernel
    module: module files hold the kernel alone, and every kernel calls the same helper
    objects."""
    with config.override(cache_dir=str(tmp_path)):
        body = "@triton.jit\ndef {}(x):\n    tl.store(x + tl.arange(0, 4), _nanmax({}, 1.0))\n"
        fns = kernel_cache.load_kernels({"a": body.format("k1", "0.5"), "b": body.format("k2", "2.5")})
        x = torch.full((4,), -7.0)
        fns["a"][(1,)](x)
        assert x.tolist() == [1.0] * 4
        fns["b"][(1,)](x)
        assert x.tolist() == [2.5] * 4
    kernels = sorted((tmp_path / "kernels").glob("sk_*.py"))
    assert len(kernels) == 2, kernels
    for f in kernels:
        text = f.read_text()
        assert "def _nanmax" not in text and len(text) < 400, text
    # (the helpers' file is written where the process first loaded a kernel)
    shared = kernel_cache.prelude_namespace()["_nanmax"]
    mods = [m for m in kernel_cache._MODULES.values() if hasattr(m, "KERNEL")]
    assert len(mods) >= 2 and all(m.__dict__["_nanmax"] is shared for m in mods)


SCRIPT = textwrap.dedent("""
    import os, sys, json, time
    os.environ["TRITON_INTERPRET"] = "1"
    import torch, torch.nn.functional as F, stitchml
    from stitchml.runtime import kernel_cache, plan_cache
    torch.manual_seed(0)
    def f(x, w, b, r):
        return F.layer_norm(x + r, (x.shape[-1],), w, b).softmax(-1) * 2
    x, w, b, r = torch.randn(16, 48, requires_grad=True), torch.randn(48), torch.randn(48), torch.randn(16, 48)
    backend = stitchml.StitchBackend()
    out = torch.compile(f, backend=backend)(x, w, b, r)
    out.sum().backward()
    ref = f(x.detach().requires_grad_(), w, b, r)
    ok = torch.allclose(out, ref, atol=1e-5)
    times = [(r.kind, r.times.plan_cached, r.times.plan_s) for r in backend.records]
    print(json.dumps({"ok": ok, "plans": plan_cache.STATS, "sources": kernel_cache.STATS, "times": times}))
""")


def _run(cache: Path, background: bool = False, **env_extra):
    env = dict(os.environ, STITCHML_CACHE_DIR=str(cache), TRITON_INTERPRET="1", STITCHML_PLAN_CACHE="1",
               **env_extra)
    args = [sys.executable, "-c", SCRIPT]
    if background:
        return subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out = subprocess.run(args, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_second_process_skips_planning_and_code_generation(tmp_path):
    first = _run(tmp_path)
    second = _run(tmp_path)
    assert first["ok"] and second["ok"]
    assert first["plans"]["stored"] == 2 and first["plans"]["hits"] == 0   # forward and backward
    assert second["plans"]["hits"] == 2 and second["plans"]["stored"] == 0
    assert second["sources"]["generated"] == 0
    assert all(cached for _, cached, _ in second["times"]) and not any(c for _, c, _ in first["times"])


def test_two_processes_writing_at_once_both_succeed(tmp_path):
    procs = [_run(tmp_path, background=True) for _ in range(2)]
    for p in procs:
        out, err = p.communicate(timeout=600)
        assert p.returncode == 0, err[-3000:]
        assert json.loads(out.strip().splitlines()[-1])["ok"]
    entries = list((tmp_path / "plans").glob("*.pkl"))
    assert len(entries) == 2 and not list((tmp_path / "plans").glob("*.tmp"))
    third = _run(tmp_path)
    assert third["ok"] and third["plans"]["hits"] == 2


def _plan_twice(tmp_path, fn, *inputs):
    """Build the same graph twice in this process (memory dropped in between, as in a
    new process); return both Built objects."""
    from torch.fx.experimental.proxy_tensor import make_fx

    from stitchml.capture.decomp import decomposition_table
    gm = make_fx(fn, decomposition_table=decomposition_table())(*inputs)
    out = []
    with config.override(cache_dir=str(tmp_path), plan_cache=True):
        for _ in range(2):
            plan_cache.drop_memory()
            out.append(pipeline.build_static(gm, torch.device("cpu")))
    return out


def test_cached_plan_equals_a_fresh_one(tmp_path):
    def fn(x, w):
        return torch.softmax(x * w, -1) + x.sum(-1, keepdim=True)
    a, b = _plan_twice(tmp_path, fn, torch.randn(8, 40), torch.randn(40))
    assert not a.times.plan_cached and b.times.plan_cached
    assert [k.name for k in a.plan.kernels] == [k.name for k in b.plan.kernels]
    assert {n: k.source for n, k in a.kernels.items()} == {n: k.source for n, k in b.kernels.items()}
    assert repr(a.graph.nodes) == repr(b.graph.nodes)
    # the lowered graph (what-if plans it again) is not stored, and is set again on a hit
    assert a.plan.source is not None and b.plan.source is not None
    assert repr(a.plan.source.nodes) == repr(b.plan.source.nodes)
    import pickle
    assert pickle.loads(pickle.dumps(a.plan)).source is None


def test_corrupted_plan_entry_is_rebuilt_with_a_warning(tmp_path):
    def fn(x):
        return torch.softmax(x, -1)
    x = torch.randn(4, 16)
    _plan_twice(tmp_path, fn, x)
    (entry,) = list((tmp_path / "plans").glob("*.pkl"))
    raw = entry.read_bytes()
    entry.write_bytes(raw[:-7] + b"garbage")
    with pytest.warns(UserWarning, match="corrupted plan cache entry"):
        a, b = _plan_twice(tmp_path, fn, x)
    assert not a.times.plan_cached and b.times.plan_cached   # rebuilt, then read back


def test_a_changed_triton_or_torch_version_misses(tmp_path, monkeypatch):
    import triton
    from torch.fx.experimental.proxy_tensor import make_fx

    from stitchml.capture.decomp import decomposition_table
    from stitchml.lower.lower import lower
    g = lower(make_fx(lambda x: torch.softmax(x, -1), decomposition_table=decomposition_table())(torch.randn(4, 8)))
    key = plan_cache.plan_key(g, "cuda")
    assert key == plan_cache.plan_key(g, "cuda")
    monkeypatch.setattr(triton, "__version__", triton.__version__ + ".changed")
    assert plan_cache.plan_key(g, "cuda") != key
    monkeypatch.undo()
    monkeypatch.setattr(torch, "__version__", torch.__version__ + ".changed")
    assert plan_cache.plan_key(g, "cuda") != key
    monkeypatch.undo()
    with config.override(block_elems=2048):
        assert plan_cache.plan_key(g, "cuda") != key    # a knob that changes planning
    assert plan_cache.plan_key(g, "cpu") != key


def test_constants_come_from_the_fresh_graph_not_the_cache(tmp_path):
    """A cached plan never carries another model's tensors: constants are taken from the
    graph being compiled."""
    from torch.fx.experimental.proxy_tensor import make_fx

    from stitchml.capture.decomp import decomposition_table

    def make(value):
        c = torch.full((8,), value)
        return make_fx(lambda x: torch.softmax(x + c, -1), decomposition_table=decomposition_table())(
            torch.randn(4, 8))

    with config.override(cache_dir=str(tmp_path), plan_cache=True):
        a = pipeline.build_static(make(1.0), torch.device("cpu"))
        plan_cache.drop_memory()
        b = pipeline.build_static(make(2.0), torch.device("cpu"))
    if not a.graph.constants:
        pytest.skip("make_fx inlined the constant")   # nothing to check then
    assert b.times.plan_cached
    assert all(float(v[0]) == 2.0 for v in b.graph.constants.values())


def test_compile_jobs_one_per_distinct_body(tmp_path):
    from torch.fx.experimental.proxy_tensor import make_fx

    from stitchml.capture.decomp import decomposition_table
    from stitchml.runtime.precompile import distinct_jobs
    gm = make_fx(lambda x, y: (torch.softmax(x, -1), torch.softmax(y, -1)),
                 decomposition_table=decomposition_table())(torch.randn(8, 40), torch.randn(8, 40))
    with config.override(cache_dir=str(tmp_path)):
        apart = pipeline.build_static(gm, torch.device("cpu"), horizontal=False)
        jobs = distinct_jobs(apart.kernels, apart.graph, apart.plan.launched)
        assert len(apart.plan.launched) == 2 and len(jobs) == 1   # the two softmaxes are one body
        job = jobs[0]
        assert Path(job.path).exists() and job.arg_types.count(torch.float32) == len(job.arg_types)
        assert all(t.startswith("*fp32") for _, t in job.signature)
        # launched as one horizontal group: only the composite is compiled, not its members
        together = pipeline.build_static(gm, torch.device("cpu"))
        (group,) = together.plan.groups
        jobs = distinct_jobs(together.kernels, together.graph, together.plan.launched)
        assert together.plan.launched == [group.name] and len(jobs) == 1
        assert jobs[0].path == str(kernel_cache.module_path(together.kernels[group.name].source))


def test_compile_job_of_a_kernel_reading_its_seed_from_memory(tmp_path):
    """Under CUDA graphs a kernel reads its seed through a pointer (`device_seed_source`):
    its compile job must compile that text with a pointer there, not an integer."""
    from torch.fx.experimental.proxy_tensor import make_fx

    from stitchml.capture.decomp import decomposition_table
    from stitchml.runtime.cuda_graphs import device_seed_source
    from stitchml.runtime.precompile import job_for
    gm = make_fx(lambda x: torch.ops.aten.native_dropout(x * 2, 0.5, True)[0],
                 decomposition_table=decomposition_table())(torch.randn(8, 40))
    with config.override(cache_dir=str(tmp_path)):
        b = pipeline.build_static(gm, torch.device("cuda"))
        (name,) = b.plan.launched
        plain = job_for(b.kernels[name], b.graph)
        seeded_ks = device_seed_source(b.kernels[name])
        seeded = job_for(seeded_ks, b.graph)
        assert seeded.path == str(kernel_cache.module_path(seeded_ks.source)) != plain.path
    ks = b.kernels[name]
    seeds = [n for (kind, _), n in zip(ks.params, ks.param_names) if kind == "seed"]
    assert seeds and all(dict(plain.signature)[n] == "i32" for n in seeds), plain.signature
    assert all(dict(seeded.signature)[n + "_ptr"] == "*i64" for n in seeds), seeded.signature


def test_cache_cli_info_and_clear(tmp_path, capsys):
    from stitchml.cli import main
    _plan_twice(tmp_path, lambda x: torch.softmax(x, -1), torch.randn(4, 8))
    with config.override(cache_dir=str(tmp_path)):
        assert main(["cache", "info"]) == 0
        out = capsys.readouterr().out
        assert "plans" in out and "1 entries" in out
        assert "AOTAutograd results" in out and "aotautograd" in out
        assert main(["cache", "clear"]) == 0
        assert not list(tmp_path.rglob("*.pkl"))
        main(["cache", "info"])
        assert "plans" in capsys.readouterr().out


@pytest.mark.slow
def test_aot_compile_of_distinct_kernels_for_sm90(tmp_path):
    """Without a GPU: the distinct kernels of a block compile for sm_90 in parallel."""
    code = textwrap.dedent("""
        import json, torch, torch.nn.functional as F
        from stitchml import pipeline
        from stitchml.runtime.precompile import compile_for_target, shutdown
        from torch.fx.experimental.proxy_tensor import make_fx
        from stitchml.capture.decomp import decomposition_table
        def f(x, y, z):   # two equal bodies and one other, launched one by one
            return F.layer_norm(x, (64,)).softmax(-1), F.layer_norm(y, (64,)).softmax(-1), (z * 2).sum(-1)
        gm = make_fx(f, decomposition_table=decomposition_table())(*[torch.randn(32, 64) for _ in range(3)])
        b = pipeline.build_static(gm, torch.device("cuda"), horizontal=False)
        r = compile_for_target(b.kernels, b.graph, 90, launched=b.plan.launched)
        shutdown()
        print(json.dumps(r))
    """)
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(STITCHML_CACHE_DIR=str(tmp_path), STITCHML_COMPILE_WORKERS="2")
    res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    r = json.loads(res.stdout.strip().splitlines()[-1])
    assert not r["failed"], r["failed"]
    assert r["kernels"] == 3 and r["distinct"] == 2 and r["workers"] == 2


@pytest.fixture
def fake_gpu_pool(monkeypatch):
    """A GPU machine's compile pool, stood in for: `precompile` believes a GPU is present
    and the interpreter off, and `pool()` returns a pool that records each submission as
    (function name, arguments) and completes it at once."""
    from concurrent.futures import Future

    import stitchml.compiler as compiler
    from stitchml.runtime import precompile as pc

    submitted: list[tuple[str, tuple]] = []

    class FakePool:
        def submit(self, fn, *args):
            submitted.append((fn.__name__, args))
            f = Future()
            f.set_result((0.0, None))   # (seconds, no retry: `precompile._warm_up`)
            return f

    monkeypatch.setattr(pc, "pool", lambda: FakePool())
    monkeypatch.setattr(pc, "_POOL", [])
    monkeypatch.setattr(pc, "_DONE", set())
    monkeypatch.setattr(pc.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(compiler, "_interpreter_on", lambda: False)
    return submitted


def test_a_second_process_skips_kernels_an_earlier_pool_compiled(tmp_path, monkeypatch, fake_gpu_pool):
    """Markers of compiled jobs (runtime/precompile.py): the first process's pool compiles
    two kernels and marks them; a second process (the pool's memory of what it did
    cleared) submits nothing and starts no pool; a changed target (another Triton version,
    another GPU) misses the markers and compiles again.  The GPU and the pool are stood
    in for: what is tested is the bookkeeping, which decides whether a warm process
    spends seconds spawning workers (measured: 9-11 s on an H200)."""
    from stitchml import config
    from stitchml.runtime import precompile as pc

    submitted = fake_gpu_pool
    target = [((9, 0), "3.6.0", "2.11.0", "/tmp/triton")]
    monkeypatch.setattr(pc, "_target", lambda: target[0])
    jobs = [pc.Job(str(tmp_path / f"sk_{i}.py"), (torch.float32, 7), (("a", "*fp32"), ("n", "i32")), 4)
            for i in range(3)]
    with config.override(cache_dir=str(tmp_path / "cache"), compile_workers=4):
        pc.precompile(jobs).wait()                        # first process: all three compiled
        assert len(submitted) == 3 and all(pc.marker(j).exists() for j in jobs)
        pc._DONE.clear()                                  # a new process
        pending = pc.precompile(jobs)
        assert pending.futures == [] and len(submitted) == 3   # nothing submitted, no pool asked for
        pc._DONE.clear()
        target[0] = ((9, 0), "3.7.0", "2.11.0", "/tmp/triton")   # another Triton: markers miss
        pc.precompile(jobs).wait()
        assert len(submitted) == 6


def test_prestart_starts_the_pool_in_a_cold_process_only(tmp_path, monkeypatch, fake_gpu_pool):
    """`precompile.prestart` (called when a graph reaches the backend) starts every
    worker of the pool without waiting, on a GPU with a pool, when no earlier process
    left compiled-kernel markers; a warm cache, the interpreter, the knob off or a pool of
    one start nothing.  The GPU and the pool are stood in for."""
    import stitchml.compiler as compiler
    from stitchml import config
    from stitchml.runtime import precompile as pc

    submitted = fake_gpu_pool
    interp = [False]
    monkeypatch.setattr(compiler, "_interpreter_on", lambda: interp[0])
    cache = tmp_path / "cache"
    with config.override(cache_dir=str(cache), compile_workers=3):
        assert pc.prestart() and [name for name, _ in submitted] == ["_ready"] * 3   # cold: three workers
        submitted.clear()
        with config.override(compile_pool_prestart=False):
            assert not pc.prestart()
        with config.override(compile_workers=1):
            assert not pc.prestart()
        interp[0] = True
        assert not pc.prestart()
        interp[0] = False
        (cache / "compiled").mkdir(parents=True)
        (cache / "compiled" / "0123").touch()                          # a marker: a warm cache
        assert not pc.prestart()
        assert submitted == []


def test_pool_workers_are_forks_of_one_server_and_never_rerun_the_main_script(tmp_path):
    """Knob `compile_pool_method`: with the fork server (default) every worker is a child
    of one server process that imported torch, Triton and stitchml before forking it;
    with `spawn` each worker is the caller's own child.  Either way a worker does not run
    the caller's main script again: this one has no `if __name__ == "__main__":` guard
    (a training script under Linux's default `fork` needs none) and records each run of
    its top level.  Start-up measured with
    `python -m stitchml.tools.compile_time --pool-start 2 16`: 16 workers on 2 CPUs
    ready in 2.8 s forked, 24.8 s spawned."""
    code = textwrap.dedent("""
        import json, os, sys
        from multiprocessing import forkserver
        from stitchml import config
        from stitchml.runtime import precompile as pc

        with open(sys.argv[1], "a") as f:      # the top level, no main guard
            f.write("ran\\n")
        out = {}
        for method in ("forkserver", "spawn"):
            with config.override(compile_pool_method=method, compile_workers=2):
                pc.start_pool()
                out[method] = [[pc._submit(os.getpid).result(), pc._submit(os.getppid).result()]
                               for _ in range(6)]
                pc.shutdown()
        out["server"] = forkserver._forkserver._forkserver_pid
        out["me"] = os.getpid()
        out["preload"] = forkserver._forkserver._preload_modules
        print(json.dumps(out))
    """)
    script = tmp_path / "train.py"
    script.write_text(code)
    runs = tmp_path / "runs.txt"
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(STITCHML_CACHE_DIR=str(tmp_path / "cache"))
    res = subprocess.run([sys.executable, str(script), str(runs)], env=env, capture_output=True, text=True,
                         timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert runs.read_text().splitlines() == ["ran"]                       # once: the caller's own run
    assert out["server"] is not None and out["server"] != out["me"]
    assert "__main__" not in out["preload"] and "stitchml.runtime.precompile" in out["preload"]
    assert {ppid for _, ppid in out["forkserver"]} == {out["server"]}    # forks of the server
    assert {ppid for _, ppid in out["spawn"]} == {out["me"]}              # the caller's children
    assert len({pid for pid, _ in out["forkserver"]} | {pid for pid, _ in out["spawn"]}) <= 4


def test_jobs_carry_the_callers_triton_cache_folder_into_long_lived_workers(tmp_path, monkeypatch, fake_gpu_pool):
    """A pool worker keeps the environment of its start; the bench points TRITON_CACHE_DIR
    at empty folders for every models row.  Each job carries the caller's `TRITON_*`
    settings as they are at submission, and the worker takes them (set, changed or
    removed) before compiling, so the binary lands where the caller's first launch looks.
    The marker's target names the folder of the moment, not the first one seen."""
    from stitchml import config
    from stitchml.runtime import precompile as pc

    monkeypatch.setattr(pc, "_device_and_versions", lambda: ((9, 0), "3.6.0", "2.11.0"))
    jobs = [pc.Job(str(tmp_path / f"sk_{i}.py"), (torch.float32,), (("a", "*fp32"),), 4) for i in range(2)]
    with config.override(cache_dir=str(tmp_path / "cache"), compile_workers=2):
        for folder in ("row1", "row2"):
            monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / folder))
            assert pc._target()[-1] == str(tmp_path / folder)
            pc._DONE.clear()                              # the pool's memory: a new process's
            pc.precompile(jobs).wait()                    # row2: row1's markers name row1's folder: miss
    envs = [args[1] for name, args in fake_gpu_pool if name == "_warm_up"]   # (job, env, retry)
    assert [e["TRITON_CACHE_DIR"] for e in envs] == [str(tmp_path / "row1")] * 2 + [str(tmp_path / "row2")] * 2

    # the worker's side: set, changed and removed (this process's environment restored
    # after: the adoption removes TRITON_INTERPRET too)
    from unittest import mock
    with mock.patch.dict(os.environ):
        os.environ.update(TRITON_CACHE_DIR="/old", TRITON_DEBUG="1")
        pc._adopt_env({"TRITON_CACHE_DIR": "/new", "TRITON_PRINT_AUTOTUNING": "1"})
        assert os.environ["TRITON_CACHE_DIR"] == "/new" and os.environ["TRITON_PRINT_AUTOTUNING"] == "1"
        assert "TRITON_DEBUG" not in os.environ and "TRITON_INTERPRET" not in os.environ
    assert os.environ.get("TRITON_INTERPRET") == "1"
