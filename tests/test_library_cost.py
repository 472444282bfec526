"""The library-op cost model (`plan/library_cost.py`): every eager op of a plan gets a
predicted device time from its shapes, so a step's prediction covers its matrix
products and attention, not only the stitched kernels (issue 17: the model's
prediction of the measured median)."""
import pytest
import torch
import torch.nn.functional as F

from stitchml import config
from stitchml.bench.contenders import library_kind, match_kernels
from stitchml.plan.devices import get_device
from stitchml.plan.library_cost import attention_seconds, gemm_seconds, plan_library
from stitchml.tools.explain import plan_report
from planning import plan_of


def _prices(fn, *inputs, device="H100"):
    with config.override(device=device):
        plan = plan_of(fn, *inputs)
        return plan, plan_library(plan, get_device(device))


def test_matrix_products_are_priced_by_their_flops_and_alignment():
    dev = get_device("H100")

    def f(x, w, b, y):
        return torch.relu(x @ w) + torch.addmm(b, x, w), torch.bmm(y, y.transpose(1, 2))
    x, w, b, y = torch.randn(512, 384), torch.randn(384, 640), torch.randn(640), torch.randn(6, 96, 40)
    _, prices = _prices(f, x, w, b, y)
    gemms = [p for p in prices if p.kind == "gemm"]
    assert sorted(p.flops for p in gemms) == sorted([2.0 * 512 * 640 * 384] * 2 + [2.0 * 6 * 96 * 96 * 40])
    for p in gemms:
        # never faster than the datasheet rate, and a launch gap at least
        assert p.seconds >= p.flops / dev.matmul_rate(torch.float32) + dev.graph_launch_s
        assert p.seconds < 1e-3
    assert not [p for p in prices if p.kind == "unpriced"]
    # bfloat16 runs on tensor cores; an unaligned leading dimension (1001 x 2 bytes) gets
    # the align-1/2 kernels
    fast = gemm_seconds(1, 4096, 4096, 4096, torch.bfloat16, dev)
    assert fast < gemm_seconds(1, 4096, 4096, 4096, torch.float32, dev) / 5
    xb, wb = torch.randn(2048, 1001, dtype=torch.bfloat16), torch.randn(1001, 2048, dtype=torch.bfloat16)
    _, (odd,) = _prices(lambda a, c: a @ c, xb, wb)
    _, (even,) = _prices(lambda a, c: a @ c, xb[:, :1000].contiguous(), wb[:1000].contiguous())
    assert odd.note and not even.note
    assert odd.seconds > 3 * even.seconds


def test_attention_fit_reproduces_the_h200_measurements():
    """The H200's profiler tables (models suite, 2026-11-28; bench/NOTES.md, twenty-ninth
    session): cuDNN attention per layer, forward and backward (its two helper kernels
    included), head dim 64.  GPT-2's and LLaMA's calls carried their causal mask as a
    tensor, so the kernels computed every key tile: full keys.  The fitted figures must
    keep every one within 20 %, and a causal call (key tiles past the diagonal skipped)
    must be cheaper."""
    dev = get_device("H200")
    measured = {  # (batch, heads, seq, causal): (forward µs, backward µs)
        (16, 12, 128, False): (10.8, 30.0),    # BERT-base b16 s128
        (8, 12, 512, False): (35.3, 90.7),     # GPT-2 small b8 s512, mask tensor
        (4, 16, 1024, False): (77.5, 195.1),   # LLaMA-style b4 s1024, mask tensor
    }
    for (b, h, s, causal), (fwd, bwd) in measured.items():
        assert attention_seconds(b, h, s, s, 64, causal, False, dev) * 1e6 == pytest.approx(fwd, rel=0.2)
        assert attention_seconds(b, h, s, s, 64, causal, True, dev) * 1e6 == pytest.approx(bwd, rel=0.2)
    assert attention_seconds(4, 16, 1024, 1024, 64, True, False, dev) < \
        attention_seconds(4, 16, 1024, 1024, 64, False, False, dev)


def test_gemm_fit_reproduces_the_h200_measurements():
    """cuBLAS products on the H200 (profiler tables of the models suite, bf16, bench/NOTES.md
    twentieth session), device time per call: a small product waits on its K steps'
    latency (BERT inference at batch 1: 128 tokens), a split-K one adds its reduction,
    a large one runs at the sustained rate."""
    dev = get_device("H200")
    measured = {  # (M, N, K): µs per call
        (128, 768, 768): 4.4,        # BERT b1: q/k/v/o projections (64x16 tiles)
        (128, 3072, 768): 5.4,       # BERT b1: FFN up
        (128, 768, 3072): 8.0,       # BERT b1: FFN down, split-K kernel + its reduction
        (2048, 3072, 768): 17.2,     # BERT b16: FFN up
    }
    for (m, n, k), us in measured.items():
        assert gemm_seconds(1, m, n, k, torch.bfloat16, dev) * 1e6 == pytest.approx(us, rel=0.25), (m, n, k)

    def trio(m, n, k):    # a linear layer's product and its two gradients' products
        return sum(gemm_seconds(1, *s, torch.bfloat16, dev) for s in ((m, n, k), (m, k, n), (n, k, m)))
    # whole training steps' products: LLaMA-style (8 layers, 4096 tokens, GQA, SwiGLU 2816, head 32000)
    # measured 4426 µs; BERT-base b16 s128's 12 layers (2048 tokens, the head apart) 2168 µs
    t, h, kv, f = 4096, 1024, 256, 2816
    llama = 8 * sum(trio(*s) for s in ((t, h, h), (t, kv, h), (t, kv, h), (t, h, h), (t, f, h), (t, f, h), (t, h, f)))
    assert (llama + trio(t, 32000, h)) * 1e6 == pytest.approx(4426, rel=0.2)
    bert = 12 * (4 * trio(2048, 768, 768) + trio(2048, 3072, 768) + trio(2048, 768, 3072)) + trio(2048, 768, 768)
    assert bert * 1e6 == pytest.approx(2168, rel=0.2)


def test_sdpa_in_a_plan_is_priced_as_attention_with_its_causal_flag():
    q, k, v = (torch.randn(2, 4, 256, 32) for _ in range(3))
    _, causal = _prices(lambda a, b, c: F.scaled_dot_product_attention(a, b, c, is_causal=True) * 2, q, k, v)
    _, full = _prices(lambda a, b, c: F.scaled_dot_product_attention(a, b, c) * 2, q, k, v)
    (pc,) = [p for p in causal if p.kind == "attention"]
    (pf,) = [p for p in full if p.kind == "attention"]
    assert pc.note == "causal" and pf.note == ""
    assert pf.flops == 4.0 * 2 * 4 * 256 * 256 * 32 and pc.flops == pf.flops / 2
    assert 0 < pc.seconds < pf.seconds


def test_other_eager_ops_are_priced_by_their_bytes():
    dev = get_device("H100")
    x = torch.randn(1000, 300)
    _, prices = _prices(lambda t: torch.sort(t * 2, dim=1)[0] + 1, x)
    (s,) = [p for p in prices if "sort" in p.op]
    assert s.kind == "memory"
    assert s.bytes == 1000 * 300 * (4 + 4 + 8)          # values in; values and int64 indices out
    assert s.seconds == pytest.approx(s.bytes / dev.bandwidth + dev.graph_launch_s)


def test_what_if_adds_the_library_ops_to_the_step():
    x, w = torch.randn(256, 128, requires_grad=True), torch.randn(128, 128, requires_grad=True)
    with config.override(device="H100"):
        r = plan_report(lambda a, b: F.layer_norm(torch.relu(a @ b), (128,)).sum(), x, w)
        t = r.what_if()
    assert t["library_ops"] >= 3 and t["library_us"] > 0 and not t["unpriced_ops"]   # x@w, and its two gradients
    chosen = next(p for p in t["plans"] if p["name"] == t["chosen"])
    assert t["step_us"] == pytest.approx(chosen["predicted_us"] + t["library_us"], abs=1e-2)
    # explain prices each eager op, and sums the step
    with config.override(device="H100"):
        text = r.to_text()
    assert text.count("[gemm: predicted ") == 3
    assert f"+ {t['library_us']:.1f} us of library ops" in text


def test_bench_matches_library_kinds_to_profiler_names():
    assert library_kind("nvjet_sm90_tst_96x128_64x6_2x1_v_bz_NNN") == "gemm"
    assert library_kind("void cutlass::Kernel2<cutlass_80_tensorop_bf16_s16816gemm_bf16_256x128_32x3_nt_align2>") \
        == "gemm"
    assert library_kind("cudnn_generated_fort_native_sdpa_sm90_flash_bprop_wgmma_f16_knob_26") == "attention"
    assert library_kind("void cudnn::fusion::compute_dot_do_o_specialized<true, 64>") == "attention"
    assert library_kind("k_0123456789abcdef01234567") is None
    assert library_kind("Memcpy DtoD (Device -> Device)") is None
    assert library_kind("void at::native::vectorized_elementwise_kernel<4, FillFunctor<float>>") == "memory"
    kernels = [{"graph": "forward", "kernel": "library:gemm", "class": "library:gemm", "launches": 3,
                "predicted_s": 30e-6, "predicted_device_s": 25e-6, "names": [], "note": "", "library": "gemm"}]
    measured = {"nvjet_a": (10e-6, 2), "void cutlass::Kernel2<x_gemm>": (10e-6, 1), "Memset (Device)": (1e-6, 1),
                "void at::native::reduce_kernel<x>": (4e-6, 1)}
    out = match_kernels(kernels, measured)
    rows = {r["class"]: r for r in out["rows"]}
    assert rows["library:gemm"]["measured_s"] == pytest.approx(20e-6)
    assert rows["library:gemm"]["error_pct"] == pytest.approx(50.0)
    assert rows["library:gemm"]["device_error_pct"] == pytest.approx(25.0)
    # a kind the profiler saw and no priced op has is listed apart, not an error of 100 %
    assert "library:memory" not in rows and out["library_unpredicted"] == {"memory": pytest.approx(4e-6)}


def test_grouped_products_are_library_calls_priced_by_their_flops():
    """`torch._grouped_mm` (an MoE's experts over tokens sorted by expert: transformers'
    bfloat16 path) is a vendor-library product, not an op without a lowering rule: it runs
    under STITCHML_STRICT=1 beside stitched kernels, matches eager, and is priced as one
    product of all its rows."""
    import stitchml
    x = torch.randn(12, 16).to(torch.bfloat16)
    w = torch.randn(3, 16, 8).to(torch.bfloat16)
    offs = torch.tensor([4, 8, 12], dtype=torch.int32)

    def f(x, w, offs):
        return torch.relu(torch._grouped_mm(x * 2, w, offs)) + 1.0
    backend = stitchml.StitchBackend()
    with config.override(strict=True):
        got = torch.compile(f, backend=backend)(x, w, offs)
    torch.testing.assert_close(got, f(x, w, offs))
    (rec,) = backend.records
    reasons = {s.op: s.reason for s in rec.plan.steps if hasattr(s, "reason")}
    assert reasons.get("aten._grouped_mm.default") == "compute-intensive: vendor library", reasons
    assert rec.plan.num_kernels >= 1
    _, prices = _prices(f, x, w, offs)
    (p,) = [p for p in prices if p.op == "aten._grouped_mm.default"]
    assert p.kind == "gemm" and p.flops == 2.0 * 12 * 16 * 8 and p.seconds > 0
