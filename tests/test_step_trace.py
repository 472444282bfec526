"""tools/step_trace: the gap arithmetic on made-up events, and one CPU run of the tool."""
import gzip
import json

import pytest

from stitchml.tools import step_trace as st


def _ev(name, s, e, device=False, parent=""):
    return st.Interval(name, float(s), float(e), device, parent)


def test_idle_gaps_union_device_activity_and_name_the_host_work_in_each_gap():
    events = [
        _ev("k0", 0, 100, device=True), _ev("k1", 50, 150, device=True),     # overlapping: one busy span
        _ev("k2", 400, 500, device=True), _ev("k3", 503, 600, device=True),  # a 3 µs gap: launch spacing
        _ev("cudaGraphLaunch", 140, 160, parent="GraphRunner._replay"),
        _ev("autograd::engine", 160, 390),                                   # the host work the GPU waited for
        _ev("cudaStreamSynchronize", 600, 700, parent="aten::item"),
    ]
    busy, idle, gaps = st.idle_gaps(events, (0.0, 800.0))
    assert busy == pytest.approx(150 + 100 + 97) and idle == pytest.approx(800 - busy)
    assert [round(g.us) for g in gaps] == [250, 200]                          # 150-400 and 600-800; not 500-503
    assert gaps[0].host[0] == ("autograd::engine", pytest.approx(230.0))
    assert gaps[0].host[1][0] == "cudaGraphLaunch [in GraphRunner._replay]"
    assert gaps[1].host == [("cudaStreamSynchronize [in aten::item]", pytest.approx(100.0))]
    syncs = st.sync_calls(events)
    assert syncs == {"cudaStreamSynchronize [in aten::item]": {"count": 1, "us": pytest.approx(100.0)}}


def test_step_trace_runs_a_bench_case_and_writes_a_trace(tmp_path):
    """On the CPU (no device activity to analyse): the harness's call order runs, a Chrome
    trace and the summary are written, and each compiled graph says whether it replays."""
    assert st.main(["--case", "bert_train", "--quick", "--dtype", "fp32", "--contender", "stitchml",
                    "--steps", "2", "--profile-steps", "2", "--out", str(tmp_path)]) == 0
    rows = json.loads((tmp_path / "step_trace.json").read_text())
    assert [r["contender"] for r in rows] == ["stitchml"]
    r = rows[0]
    assert len(r["wall_ms_per_step"]) == 2 and all(x > 0 for x in r["wall_ms_per_step"])
    assert [g.split(" graph:")[0] for g in r["graphs"]] == ["forward", "backward"]
    trace = json.loads(gzip.open(tmp_path / r["trace"]).read())
    assert any("aten::" in e.get("name", "") for e in trace["traceEvents"])
    md = (tmp_path / "step_trace.md").read_text()
    assert "## bert_train" in md
    assert r["host_profile_steps"] == 2 and r["host_profile"] and "Host time by function" in md
    assert all(h["calls"] > 0 and h["cum_us"] >= h["own_us"] for h in r["host_profile"])


def _leaf(n):
    return sum(range(n))


def test_host_profile_counts_calls_per_step_and_ranks_by_own_time():
    def step():
        for _ in range(3):
            _leaf(20000)
        _leaf(10)

    rows = st.host_profile(step, steps=4, top=50)
    leaf = [h for h in rows if h["function"].endswith("(_leaf)")]
    assert len(leaf) == 1 and leaf[0]["calls"] == 4.0          # 4 calls a step, averaged over 4 steps
    assert leaf[0]["cum_us"] >= leaf[0]["own_us"] > 0
    assert [h["own_us"] for h in rows] == sorted((h["own_us"] for h in rows), reverse=True)
    assert len(st.host_profile(step, steps=1, top=2)) == 2
