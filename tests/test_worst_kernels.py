"""tools/worst_kernels: the stitched kernels that lost most against their prediction,
read from a bench results.json (what the GPU runner's Nsight Compute step profiles)."""
import json

from stitchml.tools import worst_kernels as wk


def _row(case, contender, kernels):
    return {"case": case, "contender": contender, "kernel_times": {"rows": [
        {"profiler_name": n, "class": c, "measured_s": m * 1e-6, "predicted_device_s": p * 1e-6,
         "measured_launches": 1} for n, c, m, p in kernels]}}


def test_kernels_are_ranked_by_time_lost_each_name_once_library_calls_left_out(tmp_path, capsys):
    results = {"results": [
        _row("a", "stitchml", [("k_slow", "packed_rows", 300, 30), ("k_fine", "pointwise", 10, 9),
                               ("gemm", "library:gemm", 900, 100)]),
        _row("b", "stitchml", [("k_slow", "packed_rows", 100, 30), ("k_mid", "horizontal", 60, 10)]),
        _row("a", "inductor", [("triton_x", "pointwise", 999, 0)]),
    ]}
    rows = wk.worst(results, top=2)
    assert [(r["name"], r["case"], round(r["lost_us"])) for r in rows] == [("k_slow", "a", 270), ("k_mid", "b", 50)]
    path = tmp_path / "results.json"
    path.write_text(json.dumps(results))
    assert wk.main([str(path), "--top", "3", "--regex"]) == 0
    assert capsys.readouterr().out.strip() == "k_slow|k_mid|k_fine"
    path.write_text(json.dumps({"results": []}))
    assert wk.main([str(path), "--regex"]) == 1                      # nothing measured: says so by status
