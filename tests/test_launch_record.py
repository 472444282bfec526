"""Launches recorded under the interpreter (knob `record_launches`) and compiled for sm_90
afterwards (`tools/aot_replay.py`): what a GPU would compile, checked without one."""
import json
import textwrap

import pytest
import torch

import stitchml
from stitchml import config
from stitchml.runtime.launch_record import describe
from stitchml.testing import compare_with_eager
from stitchml.tools.aot_replay import read_records
from test_aot_gpu import _run_outside_interpreter


def _model(x, w, b):
    h = torch.nn.functional.layer_norm(x, (x.shape[-1],), w, b)
    return torch.cat([torch.softmax(h, -1), h.relu()], 0).sum(0)


def test_a_run_records_each_distinct_launch_with_its_specialisation(tmp_path):
    x, w, b = torch.randn(37, 200), torch.randn(200), torch.randn(200)
    with config.override(record_launches=str(tmp_path)):
        fn = torch.compile(_model, backend=stitchml.StitchBackend())
        out = fn(x, w, b)
        fn(x, w, b)   # the same launches again: nothing new recorded
    torch.testing.assert_close(out, _model(x, w, b), rtol=1e-4, atol=1e-4)
    recs = read_records(str(tmp_path))
    assert recs, "no launch recorded"
    lines = sum(len(f.read_text().splitlines()) for f in tmp_path.glob("launches-*.jsonl"))
    assert lines == len(recs)   # no repeats written
    for r in recs:
        assert r["path"].endswith(".py") and r["name"]
        assert all(t.startswith("*") for n, t in r["sig"].items() if n.startswith(("in", "out")))
        assert r["options"].get("num_warps", 0) >= 1


def _kernel_fn(tmp_path, body: str, name: str = "kern"):
    """A Triton function from a module file (as the recorder needs: it records files)."""
    import triton
    path = tmp_path / f"{name}_mod.py"
    path.write_text("import triton\nimport triton.language as tl\n\n\n" + textwrap.dedent(body))
    import importlib.util
    spec = importlib.util.spec_from_file_location(f"{name}_mod", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    fn = getattr(module, name)
    assert isinstance(fn, (triton.runtime.JITFunction, getattr(triton.runtime.interpreter, "InterpretedFunction")))
    return fn, path


def test_the_record_specialises_as_the_jit_would(tmp_path):
    fn, path = _kernel_fn(tmp_path, """
        @triton.jit(do_not_specialize=["seed"])
        def kern(x, y, n, one, seed, scale, BLOCK: tl.constexpr):
            pass
    """)
    base = torch.zeros(64)
    rec = describe(fn, (base, base[1:], 32, 1, 32, 0.5), {"BLOCK": 128, "num_warps": 4})
    assert rec["path"] == str(path) and rec["name"] == "kern"
    assert rec["sig"] == {"x": "*fp32", "y": "*fp32", "n": "i32", "seed": "i32", "scale": "fp32"}
    assert rec["consts"] == {"one": 1, "BLOCK": 128}          # an integer 1 is the constant 1
    assert set(rec["aligned"]) == {"x", "n"}                   # y is 4 bytes off; seed is never specialised
    assert rec["options"] == {"num_warps": 4}
    wide = describe(fn, (base, base, 2**40, 3, 7, 1.0), {"BLOCK": 128})
    assert wide["sig"]["n"] == "i64" and wide["sig"]["one"] == "i32" and "one" not in wide["consts"]


def test_recorded_launches_compile_for_sm90_and_a_kernel_only_the_interpreter_runs_fails(tmp_path):
    rec_dir = tmp_path / "launches"
    x = torch.randn(37, 200)
    with config.override(record_launches=str(rec_dir)):
        torch.compile(_model, backend=stitchml.StitchBackend())(x, torch.randn(200), torch.randn(200))
    good = len(read_records(str(rec_dir)))
    # a kernel the interpreter runs (plain Python inside) but Triton's compiler refuses:
    # a value defined in one branch of a data-dependent `if` only
    fn, path = _kernel_fn(tmp_path, """
        @triton.jit
        def kern(x):
            if tl.load(x) > 0:
                r = 3.0
            tl.store(x, r)
    """)
    t = torch.ones(4)
    fn[(1,)](t)
    assert t[0].item() == 3.0   # the interpreter ran it
    with (rec_dir / "launches-0.jsonl").open("a") as f:
        f.write(json.dumps(describe(fn, (t,), {"num_warps": 1}), sort_keys=True) + "\n")
    out = _run_outside_interpreter(textwrap.dedent(f"""
        import json
        from stitchml.tools.aot_replay import replay
        rs = replay({str(rec_dir)!r}, jobs=2)
        print(json.dumps([[r["name"], v["ok"], v.get("error", ""), v.get("warps", "-")] for r, v in rs]))
    """))
    assert len(out) == good + 1
    failed = [(n, e, w) for n, ok, e, w in out if not ok]
    assert [n for n, _, _ in failed] == ["kern"], failed
    assert failed[0][2] is None       # refused at every warp count: no retry would save it
    assert all(ok for n, ok, _, _ in out if n != "kern")


def test_the_replay_says_at_which_warps_a_refused_kernel_would_run(monkeypatch):
    """A launch refused at its warp count is compiled at the others, in the launcher's
    order: the verdict names the first that compiles (the warps a GPU's launch retries
    at); a grid-barrier kernel (maxnreg) is not retried."""
    from stitchml.tools import aot_check, aot_replay
    tried = []

    def compile_function(fn, sig, consts, options, arch, aligned):
        tried.append(options["num_warps"])
        return {"ok": False, "error": "PassManager::run failed"} if options["num_warps"] >= 4 else {"ok": True}
    monkeypatch.setattr(aot_check, "compile_function", compile_function)
    monkeypatch.setattr(aot_replay, "_function", lambda path, name: object())
    rec = {"path": "k.py", "name": "k", "sig": {}, "consts": {}, "aligned": [], "options": {"num_warps": 8}}
    verdict = aot_replay.compile_record(rec)
    assert verdict["ok"] is False and verdict["warps"] == 2 and tried == [8, 4, 2]
    tried.clear()
    verdict = aot_replay.compile_record({**rec, "options": {"num_warps": 8, "maxnreg": 128}})
    assert "warps" not in verdict and tried == [8]


LENGTHS = torch.tensor([2, 0, 3, 1, 1])   # an empty segment included


def test_atomics_of_a_constant_compile_for_sm90(tmp_path):
    """A scatter-add of a constant (a count: segment lengths turned into offsets, bag
    sizes) was a [1] block beside a [rows, 1] pointer: the interpreter broadcast it,
    Triton's compiler refused it ("Cannot broadcast, rank mismatch"), so on a GPU the
    graph ran eagerly."""
    with config.override(record_launches=str(tmp_path)):
        cmp = compare_with_eager(lambda t: torch.segment_reduce(t * 1.5, "sum", lengths=LENGTHS),
                                 [torch.randn(7, 3).t().contiguous().t().requires_grad_()])
        assert cmp.num_kernels >= 1
        cmp = compare_with_eager(lambda w, i, o: torch.nn.functional.embedding_bag(i, w * 2, o, mode="sum"),
                                 [torch.randn(11, 5, requires_grad=True), torch.randint(0, 11, (13,)),
                                  torch.tensor([0, 4, 4, 9])])
        assert cmp.num_kernels >= 1
    recs = read_records(str(tmp_path))
    # Triton 3.6 (torch 2.11's) refuses the [1] summand, later versions broadcast it: this
    # suite's Triton may take it, so the kernels' text is checked too (`_one_element_summands`)
    atomics = [line for r in recs for line in _one_element_summands(r["path"])]
    assert not atomics, atomics
    assert sum("atomic_add" in open(r["path"]).read() for r in recs) >= 1
    verdicts = _run_outside_interpreter(textwrap.dedent(f"""
        import json
        from stitchml.tools.aot_replay import replay
        print(json.dumps([[r["name"], v["ok"], v.get("error", "")[-200:]] for r, v in replay({str(tmp_path)!r})]))
    """))
    assert verdicts and all(ok for _, ok, _ in verdicts), [v for v in verdicts if not v[1]]


def _one_element_summands(path: str) -> list[str]:
    """The atomic lines of a kernel module whose value is a one-element block
    (`name = tl.full([1], ...)`)."""
    import re
    text = open(path).read()
    ones = set(re.findall(r"^\s*(\w+) = tl\.full\(\[1\],", text, re.M))
    return [line.strip() for line in text.splitlines()
            if (m := re.search(r"tl\.atomic_\w+\([^,]+, (\w+),", line)) and m.group(1) in ones]
