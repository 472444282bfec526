"""Tier 3: the same checks at real sizes on a CUDA GPU (`pytest -m gpu`).

Run from source on a GPU machine:  PYTHONPATH=src python3 -m pytest -m gpu tests
(conftest sets TRITON_INTERPRET=1 only as a default for CPU runs; on a GPU machine
export TRITON_INTERPRET=0 so kernels are compiled for the device.)
"""
import pytest
import torch
import torch.nn.functional as F

from stitchml import explain
from stitchml.testing import compare_with_eager

pytestmark = pytest.mark.gpu

DEV = "cuda"


def _randn(*shape, dtype=torch.float32, grad=False):
    return torch.randn(*shape, device=DEV, dtype=dtype, requires_grad=grad)


CASES = {
    "layer_norm_4096x1024": (lambda x, w, b: F.layer_norm(x, (1024,), w, b), [(4096, 1024), (1024,), (1024,)]),
    "softmax_8192x1000": (lambda x: torch.softmax(x, -1), [(8192, 1000)]),
    "softmax_64x30000_looped": (lambda x: torch.softmax(x, -1), [(64, 30000)]),
    "rms_norm_4096x4096": (lambda x, w: x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w,
                           [(4096, 4096), (4096,)]),
    "bias_gelu_8192x3072": (lambda x, b: F.gelu(x + b), [(8192, 3072), (3072,)]),
    "row_sum_750000x32_packed": (lambda x: x.sum(-1), [(750000, 32)]),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("name", sorted(CASES))
def test_patterns_at_real_sizes(name, dtype):
    if torch.version.hip is not None:
        pytest.skip("ROCm not targeted")
    fn, shapes = CASES[name]
    inputs = [_randn(*s, dtype=dtype, grad=dtype == torch.float32) for s in shapes]
    cmp = compare_with_eager(fn, inputs, backward=dtype == torch.float32)
    fwd = cmp.backend.records[0]
    assert fwd.plan is not None and fwd.plan.num_kernels == 1, fwd.eager_reason


def test_residual_dropout_layer_norm_one_kernel_on_gpu():
    x, r = _randn(4096, 1024), _randn(4096, 1024)
    w, b = _randn(1024), _randn(1024)

    def fn(x, r, w, b):
        d = F.dropout(x, 0.1, training=True)
        return F.layer_norm(r + d, (1024,), w, b), d

    out, d = torch.compile(fn, backend="stitch")(x, r, w, b)
    torch.testing.assert_close(out, F.layer_norm(r + d, (1024,), w, b), rtol=1e-4, atol=1e-4)
    assert 0.88 < (d != 0).float().mean().item() < 0.92
    assert explain(fn, x, r, w, b).num_kernels == 1


@pytest.mark.parametrize("model", ["bert", "gpt2", "llama"])
def test_hf_models_on_gpu(model):
    transformers = pytest.importorskip("transformers")
    import copy
    cfgs = {
        "bert": (transformers.BertConfig, transformers.BertModel,
                 dict(hidden_size=256, num_hidden_layers=2, num_attention_heads=4, intermediate_size=1024,
                      vocab_size=1000, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)),
        "gpt2": (transformers.GPT2Config, transformers.GPT2LMHeadModel,
                 dict(n_embd=256, n_layer=2, n_head=4, vocab_size=1000, resid_pdrop=0.0, embd_pdrop=0.0,
                      attn_pdrop=0.0)),
        "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM,
                  dict(hidden_size=256, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                       intermediate_size=512, vocab_size=1000)),
    }
    cfg_cls, model_cls, kw = cfgs[model]
    m = model_cls(cfg_cls(**kw)).to(DEV).train()
    mc = copy.deepcopy(m)
    ids = torch.randint(0, 1000, (4, 128), device=DEV)
    ref = m(input_ids=ids)[0]
    out = torch.compile(mc, backend="stitch")(input_ids=ids)[0]
    g = torch.randn_like(ref)
    ref.backward(g)
    out.backward(g)
    assert (out - ref).norm() / ref.norm() <= 1e-4
    for (n, p), (_, q) in zip(m.named_parameters(), mc.named_parameters()):
        if p.grad is not None:
            assert (q.grad - p.grad).norm() / p.grad.norm().clamp_min(1e-12) <= 1e-4, n


def test_cuda_graph_replay_matches_plain_mode_for_batch1_gpt2():
    transformers = pytest.importorskip("transformers")
    from stitchml import StitchBackend, config
    cfg = transformers.GPT2Config(n_embd=768, n_layer=12, n_head=12, vocab_size=50257)
    m = transformers.GPT2LMHeadModel(cfg).to(DEV).eval()
    ids = torch.randint(0, 50257, (1, 64), device=DEV)
    with torch.no_grad():
        ref = m(input_ids=ids).logits
        plain = torch.compile(m, backend=StitchBackend())(input_ids=ids).logits
        torch._dynamo.reset()
        with config.override(cuda_graphs=True):
            be = StitchBackend()
            f = torch.compile(m, backend=be)
            for _ in range(3):  # warm-up, capture, replays
                graphed = f(input_ids=ids).logits
    torch.testing.assert_close(plain, ref, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(graphed, ref, rtol=1e-4, atol=1e-4)
    assert all(not r.cuda_graph_note for r in be.records)


def test_dynamic_sequence_lengths_on_gpu():
    # GPU twin of tests/test_dynamic.py: kernels with sizes as arguments, compiled by
    # Triton for the device once per bucket, at lengths that are not powers of two
    import stitchml

    backend = stitchml.StitchBackend()

    def fn(x, w, b):
        return F.layer_norm(torch.softmax(x, -1) * x, (x.shape[-1],), w, b)

    f = torch.compile(fn, backend=backend)
    for n in (512, 700, 1000, 777, 1024, 3000):
        x, w, b = _randn(64, 33, n, grad=True), _randn(n, grad=True), _randn(n, grad=True)
        out = f(x, w, b)
        g = torch.randn_like(out)
        got = torch.autograd.grad(out, (x, w, b), g)
        ref_out = fn(x, w, b)
        want = torch.autograd.grad(ref_out, (x, w, b), g)
        torch.testing.assert_close(out, ref_out, rtol=1e-4, atol=1e-4)
        for a, e in zip(got, want):
            torch.testing.assert_close(a, e, rtol=1e-3, atol=1e-3)
    for rec in backend.records[2:]:
        st = rec.dynamic
        assert st is not None and not st.eager_calls, st
        assert st.num_templates <= st.buckets + len(st.refusals), st.describe()
