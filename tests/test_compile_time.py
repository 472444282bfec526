"""Compile time on this machine (issue 14): lowering + planning + code generation of
BERT-base training graphs, cold and with a warm cache, each in a fresh process
(`python -m stitchml.tools.compile_time`, which measures all 12 layers; here 2, with
the bound scaled per layer so that it means something on 2 cores in under a minute)."""
from stitchml.tools import compile_time

LAYERS = 2


# The bound is for 12 layers, checked by the tool (`bench/NOTES.md`: 1.46 s against
# 2.0 s).  Here it is scaled per layer and given 25 % of slack: on the shared 2-core
# machine the same 2-layer compilation takes 0.30-0.47 CPU seconds from one run to the
# next, and the reference workload tracks only part of that.  What this test catches is
# a regression of a third or more, on any machine.
SLACK = 1.25


def _bound(run: dict) -> float:
    """The 12-layer bound per layer, stretched by how much slower than the machine the
    bound was set on this process ran a fixed reference workload (a CI runner, another
    job on the cores), with `SLACK`."""
    return compile_time.COLD_BOUND_S * LAYERS / 12 * compile_time.speed_factor(run) * SLACK


def _measure() -> dict:
    result = compile_time.measure(layers=LAYERS)
    if any("source changed" in p for p in result["problems"]):   # another checkout edit between the runs
        result = compile_time.measure(layers=LAYERS)
    elif result["cold"]["cpu_s"] > _bound(result["cold"]):
        # CPU time only grows with interference (another job on the 2 cores evicting
        # caches): the lower of two cold measurements is the estimate, the bound stays
        again = compile_time.measure(layers=LAYERS)
        if not again["problems"] and again["cold"]["cpu_s"] < result["cold"]["cpu_s"]:
            result = again
    return result


def test_bert_base_training_plans_and_generates_within_the_bounds():
    result = _measure()
    cold, warm = result["cold"], result["warm"]
    assert not result["problems"], result["problems"]
    assert [g["kind"] for g in cold["graphs"]] == ["forward", "backward"]
    assert not any(g["plan_cached"] for g in cold["graphs"]) and cold["plan_cache"]["stored"] == 2
    assert cold["kernel_cache"]["generated"] > 0 and cold["launched"] > 0
    # the second layer's candidate kernels are answered from the first's (codegen/probes.py)
    assert 0 < cold["probes"]["analysed"] < cold["probes"]["asked"], cold["probes"]
    assert warm["probes"]["asked"] == 0   # (a plan-cache hit plans nothing)
    # the warm process lowers and reads the plan cache; it plans and generates nothing
    assert all(g["plan_cached"] and g["plan_s"] == 0 and g["codegen_s"] == 0 for g in warm["graphs"])
    assert warm["kernel_cache"]["generated"] == 0 and all(g["lower_s"] > 0 for g in warm["graphs"])
    # CPU seconds: the 2 cores are shared with other work, which stretches wall time
    assert len(cold["reference_cpu_s"]) == 2 and 1.0 <= compile_time.speed_factor(cold) < 4.0
    assert cold["cpu_s"] <= _bound(cold), "\n".join(compile_time.report(result))
    assert warm["cpu_s"] <= cold["cpu_s"] / 3, "\n".join(compile_time.report(result))
    assert "(bound 2.0 s: wall " in "\n".join(compile_time.report(result))
