"""GEMM epilogue stitching (issue 15.1): linear + bias / GELU / tanh-GELU / SiLU /
silu·mul / residual / cast as one Triton GEMM, forward and backward against eager
on fresh random inputs (the interpreter runs tl.dot)."""
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F

from stitchml import config, patterns
from stitchml.capture.backend import StitchBackend
from stitchml.patterns.gemm_op import linear_epilogue
from stitchml.plan.devices import DEVICES, describe_source, get_device, save_calibration
from launches import count_launches

M, K, N = 13, 20, 37   # nothing a multiple of the 16 x 16 x 16 tiles


def gelu_bias(x, w, b, r, w3):
    return F.gelu(F.linear(x, w, b))


def tanh_gelu_residual(x, w, b, r, w3):
    return F.gelu(x @ w.T + b, approximate="tanh") + r


def silu_residual_cast(x, w, b, r, w3):
    return (F.silu(F.linear(x, w)) + r).to(torch.bfloat16)


def swiglu(x, w, b, r, w3):
    return F.silu(F.linear(x, w)) * F.linear(x, w3)


def relu_bias(x, w, b, r, w3):
    return torch.relu(F.linear(x, w) + b)


FORMS = {"gelu_bias": (gelu_bias, "act=gelu"), "tanh_gelu_residual": (tanh_gelu_residual, "act=gelu_tanh"),
         "silu_residual_cast": (silu_residual_cast, "cast=torch.bfloat16"), "swiglu": (swiglu, "mul"),
         "relu_bias": (relu_bias, "act=relu")}


def _inputs():
    x = torch.randn(2, M, K, requires_grad=True)
    w = (torch.randn(N, K) / K ** 0.5).requires_grad_()
    b = torch.randn(N, requires_grad=True)
    r = torch.randn(2, M, N, requires_grad=True)
    w3 = (torch.randn(N, K) / K ** 0.5).requires_grad_()
    return x, w, b, r, w3


@pytest.mark.parametrize("form", sorted(FORMS))
def test_epilogue_matches_eager(form):
    torch.manual_seed(len(form))
    fn, needle = FORMS[form]
    args = _inputs()
    seen = len(patterns.LOG)
    backend = StitchBackend()
    with config.override(gemm_epilogue=True):
        got = torch.compile(fn, backend=backend)(*args)
    recs = [r for r in patterns.LOG[seen:] if r.pattern == "gemm_epilogue"]
    assert [r.applied for r in recs] == [True] and needle in recs[0].detail, recs
    want = fn(*args)
    assert got.dtype == want.dtype
    tol = dict(rtol=2e-2, atol=2e-2) if want.dtype == torch.bfloat16 else dict(rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(got, want, **tol)
    _same_gradients(got, want, args)
    assert all(rec.eager_reason is None for rec in backend.records)


def _same_gradients(got, want, args):
    """The gradients of `got` and `want` for one fresh cotangent, input by input."""
    g = torch.randn_like(want)
    used = [a for a in args if a.requires_grad]
    got_g = torch.autograd.grad(got, used, g, allow_unused=True)
    want_g = torch.autograd.grad(want, used, g, allow_unused=True)
    for a, e in zip(got_g, want_g):
        assert (a is None) == (e is None)
        if a is not None:
            torch.testing.assert_close(a, e, rtol=1e-3, atol=1e-4)


def test_inference_is_one_launch():
    """gelu(linear(x) + b) + r with no grad: the whole graph is our one GEMM launch."""
    torch.manual_seed(9)
    x, w, b, r, w3 = (a.detach() for a in _inputs())
    with config.override(gemm_epilogue=True), torch.no_grad():
        f = torch.compile(tanh_gelu_residual, backend=StitchBackend())
        f(x, w, b, r, w3)
        with count_launches() as launches:
            out = f(x, w, b, r, w3)
    torch.testing.assert_close(out, tanh_gelu_residual(x, w, b, r, w3), rtol=1e-4, atol=1e-5)
    assert launches["n"] == 1


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_kernel_against_fp32_math(dtype):
    torch.manual_seed(11)
    x = torch.randn(M, K).to(dtype)
    w = torch.randn(N, K).to(dtype)
    b, r, m = torch.randn(N).to(dtype), torch.randn(M, N).to(dtype), torch.randn(M, N).to(dtype)
    y, z = linear_epilogue(x, w, b, r, m, "silu", "float32", True)
    zr = x.float() @ w.float().t() + b.float()
    torch.testing.assert_close(z.float(), zr, rtol=1e-2 if dtype != torch.float32 else 1e-5, atol=1e-2)
    torch.testing.assert_close(y, F.silu(zr) * m.float() + r.float(), rtol=1e-4, atol=1e-4)


def test_knob_off_leaves_the_graph():
    x, w, b, r, w3 = _inputs()
    seen = len(patterns.LOG)
    with config.override(gemm_epilogue="off"):
        torch.compile(gelu_bias, backend=StitchBackend())(x, w, b, r, w3)
    assert not [r for r in patterns.LOG[seen:] if r.pattern == "gemm_epilogue"]


# --------------------------------------------------------------------------- the cost model's choice (auto)

def _auto(fn, args, **knobs):
    """Compile fn under gemm_epilogue=auto; (records, result, backend)."""
    seen = len(patterns.LOG)
    backend = StitchBackend()
    with config.override(gemm_epilogue="auto", **knobs):
        out = torch.compile(fn, backend=backend)(*args)
    return [r for r in patterns.LOG[seen:] if r.pattern == "gemm_epilogue"], out, backend


def _eager_ops(backend):
    return {str(s.op) for rec in backend.records for s in rec.plan.steps if type(s).__name__ == "EagerStep"}


def test_auto_keeps_cublas_while_the_template_is_unmeasured_and_says_why(tmp_path):
    """The default: on a table value for our GEMM template's speed nothing is fused,
    each product's record gives both predicted times and points at calibrate."""
    torch.manual_seed(3)
    args = _inputs()
    with config.override(cache_dir=str(tmp_path)):
        assert config.get("gemm_epilogue") == "auto" and get_device("H100").triton_gemm_source == "table"
        recs, got, backend = _auto(gelu_bias, args, device="H100")
    assert [r.applied for r in recs] == [False], recs
    why = recs[0].detail
    assert "not measured" in why and "stitchml calibrate" in why and "µs" in why and "on H100" in why
    assert not any("linear_epilogue" in op for op in _eager_ops(backend))
    torch.testing.assert_close(got, gelu_bias(*args), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("efficiency,fused", [(1.0, True), (0.1, False)])
def test_auto_follows_a_measured_template_speed(tmp_path, efficiency, fused):
    """With a calibration that measured the template, the cheaper way wins: at cuBLAS's
    speed the fused form saves a pass over z and a launch; at a tenth of it the
    product's time outweighs them."""
    torch.manual_seed(4)
    args = _inputs()
    with config.override(cache_dir=str(tmp_path)):
        save_calibration(DEVICES["H100"], {"triton_gemm": {"efficiency": efficiency, "shapes": []}})
        dev = get_device("H100")
        assert dev.triton_gemm_source == "calibrated" and dev.triton_gemm_efficiency == efficiency
        recs, got, backend = _auto(swiglu, args, device="H100")
    assert len(recs) == 1 and recs[0].applied is fused, recs
    assert "cost model" in recs[0].detail and "µs" in recs[0].detail
    assert any("linear_epilogue" in op for op in _eager_ops(backend)) is fused
    want = swiglu(*args)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    _same_gradients(got, want, args)


def test_a_calibration_without_the_gemm_measurement_keeps_the_table_guess(tmp_path):
    """A calibration file's top-level figure is only the table value it was written
    with: the template counts as measured only where `measurements.triton_gemm` is."""
    with config.override(cache_dir=str(tmp_path)):
        save_calibration(replace(DEVICES["H200"], triton_gemm_efficiency=0.9), {})
        dev = get_device("H200")
        assert dev.source == "calibrated" and dev.triton_gemm_source == "table"
        assert "our GEMM template not measured" in describe_source(dev)


def test_the_knob_reads_off_auto_on_and_booleans(monkeypatch):
    assert [config.off_auto_on(v) for v in ("auto", " ON ", "1", "true", "0", "no", "", True, False)] == \
        ["auto", "on", "on", "on", "off", "off", "off", "on", "off"]
    monkeypatch.setenv("STITCHML_GEMM_EPILOGUE", "sometimes")
    with pytest.raises(ValueError, match="STITCHML_GEMM_EPILOGUE='sometimes'.*off, auto, on"):
        config.get("gemm_epilogue")
    monkeypatch.setenv("STITCHML_GEMM_EPILOGUE", "0")
    assert config.get("gemm_epilogue") == "off"


def test_calibrate_times_each_tile_configuration_against_addmm_and_keeps_the_best():
    """`stitchml calibrate`'s Triton-GEMM figures, on the CPU: the interpreter runs the
    template on each candidate configuration (checked against addmm first), a stand-in
    timer makes the times known: the best configuration's median ratio is kept, and the
    device loaded from that calibration launches with it."""
    from stitchml.patterns import gemm_op
    from stitchml.tools import calibrate
    fast, slow = gemm_op.TileConfig(16, 16, 16, 4, 1), gemm_op.TileConfig(32, 16, 16, 4, 1)
    seconds = {"addmm": 1.0, fast.name: [0.5, 4.0, 1.0], slow.name: [2.0, 2.0, 2.0]}
    shape_of = {}

    def timer(fn, reps):
        fn()
        tile = getattr(fn, "__defaults__", None)
        if not tile:
            return seconds["addmm"]
        i = shape_of.setdefault(tile[0].name, [0])
        i[0] += 1
        return seconds[tile[0].name][i[0] - 1]

    shapes = ((13, 37, 20), (8, 16, 24), (5, 9, 7))
    res = calibrate.measure_triton_gemm(reps=1, dtype=torch.float32, device="cpu", shapes=shapes, timer=timer,
                                        configs=(fast, slow))
    assert res["by_config"] == {fast.name: 1.0, slow.name: 0.5}            # medians of 2, 0.25, 1 and of 0.5 x3
    assert res["best"] == fast.name and res["efficiency"] == 1.0 and len(res["shapes"]) == 6


def test_the_calibrated_tile_configuration_is_what_a_launch_uses(tmp_path):
    from stitchml.patterns import gemm_op
    big = gemm_op.CONFIGS[1]
    with config.override(cache_dir=str(tmp_path), device="H100"):
        assert gemm_op.cuda_config() == gemm_op.DEFAULT                      # no calibration: the default
        save_calibration(DEVICES["H100"], {"triton_gemm": {"efficiency": 0.9, "best": big.name}})
        assert get_device("H100").triton_gemm_config == big.name and gemm_op.cuda_config() == big
        assert f"our GEMM template 0.90 of cuBLAS ({big.name})" in describe_source(get_device("H100"))
        save_calibration(DEVICES["H100"], {"triton_gemm": {"efficiency": 0.9, "best": "3x3x3/w1/s1"}})
        assert gemm_op.cuda_config() == gemm_op.DEFAULT                      # unknown to this version: the default
    with pytest.raises(ValueError, match="candidates"):
        gemm_op.config_named("nope")


@pytest.mark.gpu
def test_gpu_calibrate_measures_the_template_against_cublas():
    """On a GPU: the three transformer-sized bf16 products compile, match addmm, and give
    a ratio in the range the cost model accepts."""
    from stitchml.tools import calibrate
    from stitchml.patterns import gemm_op
    res = calibrate.measure_triton_gemm(reps=3)
    assert len(res["shapes"]) == len(calibrate.GEMM_SHAPES) * len(gemm_op.CONFIGS)
    assert all(r["cublas_s"] > 0 and r["triton_s"] > 0 for r in res["shapes"])
    assert 0.05 <= res["efficiency"] <= 1.5 and res["best"] in {c.name for c in gemm_op.CONFIGS}


@pytest.mark.parametrize("mode", ["on", "auto"])
def test_a_product_with_a_plain_weight_matrix_input(mode):
    """`x @ W` with W a graph input laid out [K, N] (no transpose in sight): matched and
    fused under `on`, priced under `auto`; it used to crash the rewrite (a graph input
    taken for a transpose), which every compile of such a product then met."""
    torch.manual_seed(12)
    x = torch.randn(2, M, K, requires_grad=True)
    wkn = (torch.randn(K, N) / K ** 0.5).requires_grad_()
    b = torch.randn(N, requires_grad=True)

    def fn(x, wkn, b):
        return torch.relu(x @ wkn + b)

    seen = len(patterns.LOG)
    with config.override(gemm_epilogue=mode):
        got = torch.compile(fn, backend=StitchBackend())(x, wkn, b)
    recs = [r for r in patterns.LOG[seen:] if r.pattern == "gemm_epilogue"]
    assert [r.applied for r in recs] == [mode == "on"], recs
    want = fn(x, wkn, b)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    _same_gradients(got, want, (x, wkn, b))


def test_dynamic_sizes_refuse_only_products_with_an_epilogue():
    """In a graph with symbolic sizes a product with an epilogue is refused with that
    reason; a bare product has nothing to fuse and leaves no record."""
    torch.manual_seed(13)
    w, b = torch.randn(N, K), torch.randn(N)

    def bare(x):
        return F.linear(x, w, b)

    def fused(x):
        return F.gelu(F.linear(x, w, b))

    for fn, want in ((bare, []), (fused, [False])):
        torch._dynamo.reset()
        seen = len(patterns.LOG)
        x = torch.randn(5, K)
        torch._dynamo.mark_dynamic(x, 0)
        with config.override(gemm_epilogue="on"):
            got = torch.compile(fn, backend=StitchBackend())(x)
        recs = [r for r in patterns.LOG[seen:] if r.pattern == "gemm_epilogue"]
        assert [r.applied for r in recs] == want, recs
        assert all("symbolic" in r.detail for r in recs)
        torch.testing.assert_close(got, fn(x), rtol=1e-4, atol=1e-5)


@pytest.mark.gpu
@pytest.mark.parametrize("form", sorted(FORMS))
def test_gpu_epilogue_forms_judged_against_float64(form):
    """On a GPU (the template's real Triton code, the default tile configuration), bf16:
    each form's output and gradients judged against float64 with eager bf16's own error as
    the yardstick (`judge_against_float64`).  Not element-wise against float32: the ReLU's
    mask flips where bf16 rounds a near-zero pre-activation across zero (46 of 54400 here),
    and each flip moves a whole row of the input gradient by g * W — eager bf16 fails an
    element-wise 5 % test as well (350 of 38400 elements on the CPU)."""
    from stitchml.testing import compare_against_float64
    torch.manual_seed(len(form) + 100)
    fn, _ = FORMS[form]
    m, k, n = 200, 96, 136
    full = [torch.randn(2, m, k), torch.randn(n, k) / k ** 0.5, torch.randn(n), torch.randn(2, m, n),
            torch.randn(n, k) / k ** 0.5]
    half = [t.cuda().bfloat16().requires_grad_() for t in full]
    with config.override(gemm_epilogue="on"):
        cmp, judgement = compare_against_float64(fn, half, backward=True, backend=StitchBackend())
    judgement.assert_ok(f"epilogue form {form}")
