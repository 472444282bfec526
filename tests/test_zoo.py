"""Model zoo: small random Hugging Face `transformers` models beyond BERT / GPT-2 /
LLaMA (tests/test_models.py) -- encoders, decoders, encoder-decoders and vision
transformers -- compiled with the stitch backend, float32, train mode, every dropout
probability 0, no downloads.  For each model the output and EVERY parameter gradient
(after backward of `(out * fixed_randn).sum()`) are compared with eager PyTorch on a
deep copy: relative error ||a - b|| / ||b|| <= 1e-4 per tensor.  Stitched kernels must
have run in the forward and the backward graph and no graph may run wholly eagerly.

Attention runs with `attn_implementation="eager"` where the model has a choice, so
softmax / masking / rotary / relative-position code goes through stitchml.  Run with
`-s` (and without `-n`) to see per-graph kernel counts and eager fallbacks.

Zero gradients.  As in tests/test_models.py, a parameter whose exact gradient is zero
holds only rounding noise in both eager and compiled runs, so ||a - b|| / ||b|| means
nothing; for those (the `zero_grad` argument, a regex -> sibling-parameter rewrite) the
error is measured relative to the sibling weight's gradient norm with the same bound,
and the eager gradient itself must be ~0 on that scale.  Every such case is the
attention KEY BIAS of a model whose attention scores are `q . (W_k x_j + b_k) + m_ij`
with a key-independent additive term m (causal / padding mask, learned or relative
position bias) and no rotation of the keys: `q_i . b_k` is the same for every key j
in query row i, softmax is invariant to adding a per-row constant, so d loss / d b_k
= 0 exactly.  Models with rotary embeddings on the keys (Qwen2, GPT-NeoX, Phi) or
key-position terms (DeBERTa's p2c) have a real key-bias gradient and get no such
treatment (with partial rotary -- Phi, GPT-NeoX -- only the bias entries of the
un-rotated head dims are zero; the tensor as a whole has a real gradient).  Each test lists its cases; `_run_model` checks every pattern matches.
"""
from __future__ import annotations

import copy
import re
import time
import warnings

import pytest
import torch

import stitchml
from hf_common import _report, rel_err

transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.slow

REL_TOL = 1e-4
BATCH, SEQ, VOCAB = 2, 12, 96
DEC_SEQ = 8                    # decoder length for encoder-decoder models
HIDDEN, HEADS, FFN, LAYERS = 32, 4, 64, 2
NO_DROPOUT = dict(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
# the key bias of BERT-style self-attention (module path ...attention.self.key / ...attention.key)
BERT_KEY_BIAS = {r"\.key\.bias$": ".key.weight"}
# the key bias of BART/OPT-style attention modules (self_attn / encoder_attn .k_proj)
KPROJ_BIAS = {r"\.k_proj\.bias$": ".k_proj.weight"}


def _run_model(name: str, model: torch.nn.Module, inputs: dict, output_attr: str = "logits",
               zero_grad: dict[str, str] | None = None) -> None:
    """Eager vs compiled on a deep copy: output, every parameter gradient, kernels ran."""
    t0 = time.perf_counter()
    zero_grad = zero_grad or {}
    model = model.float().train()
    assert getattr(model.config, "_attn_implementation", "eager") == "eager"
    compiled_model = copy.deepcopy(model)

    expected = getattr(model(**inputs), output_attr)
    torch.manual_seed(1234)
    weight = torch.randn(expected.shape, dtype=expected.dtype)

    backend = stitchml.StitchBackend()
    compiled = torch.compile(compiled_model, backend=backend)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        actual = getattr(compiled(**inputs), output_attr)
        assert actual.shape == expected.shape and actual.dtype == expected.dtype
        (expected * weight).sum().backward()
        (actual * weight).sum().backward()
    stitch_warnings = [str(w.message) for w in caught if str(w.message).startswith("stitchml")]

    errors: dict[str, float] = {output_attr: rel_err(actual, expected)}
    eager_params = dict(model.named_parameters())
    compiled_params = dict(compiled_model.named_parameters())
    assert eager_params.keys() == compiled_params.keys()
    missing, used_patterns, not_zero = [], set(), []
    for pname, p in eager_params.items():
        q = compiled_params[pname]
        if p.grad is None and q.grad is None:
            continue
        if p.grad is None or q.grad is None:
            missing.append(pname)
            continue
        pat = next((pat for pat in zero_grad if re.search(pat, pname)), None)
        if pat is None:
            errors[f"grad {pname}"] = rel_err(q.grad, p.grad)
            continue
        # exact gradient is 0 (see the module docstring): measure against the sibling's gradient norm
        used_patterns.add(pat)
        scale_of = re.sub(pat, zero_grad[pat], pname)
        scale = eager_params[scale_of].grad.double().norm()
        if not p.grad.double().norm() <= REL_TOL * scale:
            not_zero.append(pname)
        errors[f"grad {pname} (vs |grad {scale_of}|)"] = (
            (q.grad.double() - p.grad.double()).norm() / scale).item()

    per_kind = _report(name, backend)
    worst = max(errors, key=errors.get)
    print(f"  max relative error: {errors[worst]:.3g} ({worst}); output: {errors[output_attr]:.3g}; "
          f"kernels: forward {per_kind.get('forward', 0)}, backward {per_kind.get('backward', 0)}; "
          f"{len(errors) - 1} gradients checked; {time.perf_counter() - t0:.1f}s")
    for w in stitch_warnings:
        print(f"  warning: {w}")

    assert not missing, f"gradient present in only one of eager/compiled: {missing}"
    assert not not_zero, f"zero_grad parameters whose eager gradient is not ~0: {not_zero}"
    assert used_patterns == set(zero_grad), f"zero_grad patterns that matched nothing: {set(zero_grad) - used_patterns}"
    bad = {k: v for k, v in errors.items() if not v <= REL_TOL}
    assert not bad, f"relative error above {REL_TOL}: {bad}"

    eager_graphs = [(r.kind, r.eager_reason) for r in backend.records if r.plan is None]
    assert not eager_graphs, f"graphs that ran wholly eagerly: {eager_graphs}"
    assert not [w for w in stitch_warnings if "runs eagerly" in w], stitch_warnings
    assert any(r.plan is not None for r in backend.records)
    assert per_kind.get("forward", 0) > 0, "no stitched kernels in any forward graph"
    assert per_kind.get("backward", 0) > 0, "no stitched kernels in any backward graph"
    assert all(r.calls > 0 for r in backend.records if r.kind in ("forward", "backward"))


def _ids(low: int = 0, seq: int = SEQ, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(low, VOCAB, (BATCH, seq), generator=g)


def _padding_mask(seq: int = SEQ) -> torch.Tensor:
    """Row 0 full, row 1 with its last 3 positions padded (no fully masked query row)."""
    mask = torch.ones(BATCH, seq, dtype=torch.long)
    mask[1, -3:] = 0
    return mask


# ----------------------------------------------------------------------------- encoders

def test_roberta():
    # zero_grad: BERT-style key bias under an additive padding mask (see module docstring)
    cfg = transformers.RobertaConfig(vocab_size=VOCAB, hidden_size=HIDDEN, num_attention_heads=HEADS,
                                     intermediate_size=FFN, num_hidden_layers=LAYERS,
                                     max_position_embeddings=SEQ + 4, type_vocab_size=1, pad_token_id=1,
                                     attn_implementation="eager", **NO_DROPOUT)
    torch.manual_seed(11)
    model = transformers.RobertaForMaskedLM(cfg)
    ids, mask = _ids(low=3, seed=11), _padding_mask()
    ids[mask == 0] = cfg.pad_token_id  # RoBERTa derives position ids from the padding token
    _run_model("roberta", model, dict(input_ids=ids, attention_mask=mask), zero_grad=BERT_KEY_BIAS)


def test_distilbert():
    # zero_grad: key bias (k_lin) under an additive padding mask, no position term on keys
    cfg = transformers.DistilBertConfig(vocab_size=VOCAB, dim=HIDDEN, n_heads=HEADS, hidden_dim=FFN,
                                        n_layers=LAYERS, max_position_embeddings=64, dropout=0.0,
                                        attention_dropout=0.0, qa_dropout=0.0, seq_classif_dropout=0.0,
                                        attn_implementation="eager")
    torch.manual_seed(12)
    model = transformers.DistilBertForMaskedLM(cfg)
    _run_model("distilbert", model, dict(input_ids=_ids(seed=12), attention_mask=_padding_mask()),
               zero_grad={r"\.k_lin\.bias$": ".k_lin.weight"})


def test_albert():
    # one shared layer applied LAYERS times (gradients accumulate over uses); factorised embedding
    # zero_grad: BERT-style key bias, no position term on keys
    cfg = transformers.AlbertConfig(vocab_size=VOCAB, embedding_size=16, hidden_size=HIDDEN,
                                    num_attention_heads=HEADS, intermediate_size=FFN,
                                    num_hidden_layers=LAYERS, max_position_embeddings=64,
                                    classifier_dropout_prob=0.0, attn_implementation="eager", **NO_DROPOUT)
    torch.manual_seed(13)
    model = transformers.AlbertForMaskedLM(cfg)
    _run_model("albert", model, dict(input_ids=_ids(seed=13)), zero_grad=BERT_KEY_BIAS)


def test_electra():
    # discriminator head: one logit per token.  zero_grad: BERT-style key bias (padding mask)
    cfg = transformers.ElectraConfig(vocab_size=VOCAB, embedding_size=16, hidden_size=HIDDEN,
                                     num_attention_heads=HEADS, intermediate_size=FFN,
                                     num_hidden_layers=LAYERS, max_position_embeddings=64,
                                     attn_implementation="eager", **NO_DROPOUT)
    torch.manual_seed(14)
    model = transformers.ElectraForPreTraining(cfg)
    _run_model("electra", model, dict(input_ids=_ids(seed=14), attention_mask=_padding_mask()),
               zero_grad=BERT_KEY_BIAS)


def test_deberta_v2():
    # disentangled attention with c2p and p2c relative-position terms (log buckets, gathers).
    # No zero_grad: the p2c term k_j . q_pos(i - j) makes the key bias's gradient real.
    cfg = transformers.DebertaV2Config(vocab_size=VOCAB, hidden_size=HIDDEN, num_attention_heads=HEADS,
                                       intermediate_size=FFN, num_hidden_layers=LAYERS,
                                       max_position_embeddings=64, type_vocab_size=0,
                                       relative_attention=True, position_buckets=8, max_relative_positions=-1,
                                       pos_att_type=["p2c", "c2p"], norm_rel_ebd="layer_norm",
                                       share_att_key=True, position_biased_input=False, pooler_dropout=0.0,
                                       **NO_DROPOUT)
    torch.manual_seed(15)
    model = transformers.DebertaV2ForMaskedLM(cfg)
    _run_model("deberta_v2", model, dict(input_ids=_ids(seed=15), attention_mask=_padding_mask()))


# ----------------------------------------------------------------------------- decoders

def _decoder_common() -> dict:
    return dict(vocab_size=VOCAB, hidden_size=HIDDEN, num_attention_heads=HEADS, intermediate_size=FFN,
                num_hidden_layers=LAYERS, max_position_embeddings=64, use_cache=False,
                tie_word_embeddings=False, attn_implementation="eager")


def test_mistral():
    # GQA (4 query heads, 2 kv heads), RMSNorm, SwiGLU, rotary, sliding-window causal mask
    cfg = transformers.MistralConfig(num_key_value_heads=2, sliding_window=5, attention_dropout=0.0,
                                     **_decoder_common())
    torch.manual_seed(21)
    model = transformers.MistralForCausalLM(cfg)
    _run_model("mistral", model, dict(input_ids=_ids(seed=21)))


def test_qwen2():
    # q/k/v biases with rotary (key bias gradient is real: R_j b_k differs per key), GQA
    cfg = transformers.Qwen2Config(num_key_value_heads=2, attention_dropout=0.0, use_sliding_window=False,
                                   **_decoder_common())
    torch.manual_seed(22)
    model = transformers.Qwen2ForCausalLM(cfg)
    _run_model("qwen2", model, dict(input_ids=_ids(seed=22)))


def test_phi():
    # partial rotary (half of each head), parallel attention + MLP, gelu_new, LayerNorm, biases
    cfg = transformers.PhiConfig(resid_pdrop=0.0, embd_pdrop=0.0, attention_dropout=0.0,
                                 rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                                  "partial_rotary_factor": 0.5},
                                 **_decoder_common())
    torch.manual_seed(23)
    model = transformers.PhiForCausalLM(cfg)
    _run_model("phi", model, dict(input_ids=_ids(seed=23)))


def test_gpt_neox():
    # fused query_key_value, rotary on 1/4 of each head, parallel residual
    common = _decoder_common()
    del common["tie_word_embeddings"]
    cfg = transformers.GPTNeoXConfig(hidden_dropout=0.0, attention_dropout=0.0, classifier_dropout=0.0,
                                     use_parallel_residual=True, tie_word_embeddings=False,
                                     rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                                      "partial_rotary_factor": 0.25},
                                     **common)
    torch.manual_seed(24)
    model = transformers.GPTNeoXForCausalLM(cfg)
    _run_model("gpt_neox", model, dict(input_ids=_ids(seed=24)))


def test_opt():
    # learned positions (offset 2, from the attention mask's cumsum), pre-LayerNorm, ReLU MLP.
    # zero_grad: k_proj bias under a causal mask with no position term on keys
    cfg = transformers.OPTConfig(vocab_size=VOCAB, hidden_size=HIDDEN, num_attention_heads=HEADS, ffn_dim=FFN,
                                 num_hidden_layers=LAYERS, max_position_embeddings=64, word_embed_proj_dim=HIDDEN,
                                 dropout=0.0, attention_dropout=0.0, layerdrop=0.0, enable_bias=True,
                                 do_layer_norm_before=True, use_cache=False, pad_token_id=1, bos_token_id=2,
                                 eos_token_id=2, attn_implementation="eager")
    torch.manual_seed(25)
    model = transformers.OPTForCausalLM(cfg)
    _run_model("opt", model, dict(input_ids=_ids(low=3, seed=25)), zero_grad=KPROJ_BIAS)


def test_falcon():
    # multi-query attention (one kv head), parallel attention + MLP, rotary, GELU
    cfg = transformers.FalconConfig(vocab_size=VOCAB, hidden_size=HIDDEN, num_attention_heads=HEADS,
                                    num_hidden_layers=LAYERS, max_position_embeddings=64, multi_query=True,
                                    parallel_attn=True, new_decoder_architecture=False, alibi=False,
                                    bias=False, hidden_dropout=0.0, attention_dropout=0.0, use_cache=False,
                                    ffn_hidden_size=FFN, attn_implementation="eager")
    torch.manual_seed(26)
    model = transformers.FalconForCausalLM(cfg)
    _run_model("falcon", model, dict(input_ids=_ids(seed=26)))


# ----------------------------------------------------------------------------- encoder-decoders

def test_t5():
    # T5 v1.1 style: gated-gelu, RMS-style layer norm, bucketed relative attention bias, no biases
    cfg = transformers.T5Config(vocab_size=VOCAB, d_model=HIDDEN, d_kv=HIDDEN // HEADS, d_ff=FFN,
                                num_layers=LAYERS, num_decoder_layers=LAYERS, num_heads=HEADS,
                                relative_attention_num_buckets=8, relative_attention_max_distance=16,
                                dropout_rate=0.0, feed_forward_proj="gated-gelu", tie_word_embeddings=False,
                                use_cache=False, pad_token_id=0, eos_token_id=1, decoder_start_token_id=0,
                                attn_implementation="eager")
    torch.manual_seed(31)
    model = transformers.T5ForConditionalGeneration(cfg)
    _run_model("t5", model, dict(input_ids=_ids(low=2, seed=31), attention_mask=_padding_mask(),
                                 decoder_input_ids=_ids(low=2, seq=DEC_SEQ, seed=32)))


def test_bart():
    # zero_grad: k_proj bias of encoder self-attention (padding mask), decoder self-attention
    # (causal mask) and cross-attention (padding mask): learned positions enter only the inputs
    cfg = transformers.BartConfig(vocab_size=VOCAB, d_model=HIDDEN, encoder_layers=LAYERS, decoder_layers=LAYERS,
                                  encoder_attention_heads=HEADS, decoder_attention_heads=HEADS,
                                  encoder_ffn_dim=FFN, decoder_ffn_dim=FFN, max_position_embeddings=64,
                                  dropout=0.0, attention_dropout=0.0, activation_dropout=0.0,
                                  classifier_dropout=0.0, encoder_layerdrop=0.0, decoder_layerdrop=0.0,
                                  use_cache=False, pad_token_id=1, bos_token_id=0, eos_token_id=2,
                                  decoder_start_token_id=2, forced_eos_token_id=None,
                                  attn_implementation="eager")
    torch.manual_seed(33)
    model = transformers.BartForConditionalGeneration(cfg)
    _run_model("bart", model, dict(input_ids=_ids(low=3, seed=33), attention_mask=_padding_mask(),
                                   decoder_input_ids=_ids(low=3, seq=DEC_SEQ, seed=34)),
               zero_grad=KPROJ_BIAS)


def test_whisper():
    # audio encoder (two conv1d + GELU, fixed sinusoidal positions) and text decoder with
    # cross-attention; Whisper's k_proj has no bias, so no zero gradients
    cfg = transformers.WhisperConfig(vocab_size=VOCAB, num_mel_bins=16, d_model=HIDDEN, encoder_layers=LAYERS,
                                     decoder_layers=LAYERS, encoder_attention_heads=HEADS,
                                     decoder_attention_heads=HEADS, encoder_ffn_dim=FFN, decoder_ffn_dim=FFN,
                                     max_source_positions=SEQ, max_target_positions=32, dropout=0.0,
                                     attention_dropout=0.0, activation_dropout=0.0, encoder_layerdrop=0.0,
                                     decoder_layerdrop=0.0, use_cache=False, pad_token_id=VOCAB - 1,
                                     bos_token_id=VOCAB - 2, eos_token_id=VOCAB - 1,
                                     decoder_start_token_id=VOCAB - 2, suppress_tokens=None,
                                     begin_suppress_tokens=None, apply_spec_augment=False,
                                     attn_implementation="eager")
    torch.manual_seed(35)
    model = transformers.WhisperForConditionalGeneration(cfg)
    features = torch.randn(BATCH, cfg.num_mel_bins, 2 * cfg.max_source_positions,
                           generator=torch.Generator().manual_seed(35))
    _run_model("whisper", model, dict(input_features=features,
                                      decoder_input_ids=_ids(seq=DEC_SEQ, seed=36)))


# ----------------------------------------------------------------------------- vision

def _pixels(size: int, seed: int) -> torch.Tensor:
    return torch.randn(BATCH, 3, size, size, generator=torch.Generator().manual_seed(seed))


def test_vit():
    # conv patch embedding, CLS token, learned positions, pre-LayerNorm encoder, classifier on CLS.
    # zero_grad: k_proj bias (positions are added to the inputs, not to the scores; no mask)
    cfg = transformers.ViTConfig(image_size=16, patch_size=4, num_channels=3, hidden_size=HIDDEN,
                                 num_attention_heads=HEADS, intermediate_size=FFN, num_hidden_layers=LAYERS,
                                 num_labels=10, attn_implementation="eager", **NO_DROPOUT)
    torch.manual_seed(41)
    model = transformers.ViTForImageClassification(cfg)
    _run_model("vit", model, dict(pixel_values=_pixels(16, 41)), zero_grad=KPROJ_BIAS)


def test_swin():
    # windowed attention with shifted windows (stage 1 has two blocks: shift 0, then shift 2 with
    # the shift mask), relative position bias table, patch merging, mean pooling.
    # zero_grad: k_proj bias -- the relative position bias and the shift mask are additive,
    # key-independent terms on the scores
    cfg = transformers.SwinConfig(image_size=32, patch_size=4, num_channels=3, embed_dim=16, depths=[2, 1],
                                  num_heads=[2, 4], window_size=4, mlp_ratio=2.0, drop_path_rate=0.0,
                                  num_labels=10, attn_implementation="eager", **NO_DROPOUT)
    torch.manual_seed(42)
    model = transformers.SwinForImageClassification(cfg)
    _run_model("swin", model, dict(pixel_values=_pixels(32, 42)), zero_grad=KPROJ_BIAS)
