"""Real-model sweep (issue 18): small random Hugging Face models of many architectures
through stitchml, one training step at two sizes, judged against a float64 run.

    python -m stitchml.tools.model_sweep --out docs/MODELS.md [--models a,b] [--jobs N]

For each architecture (tiny config, random weights, no download, every dropout and
drop-path probability 0, attention `eager` so softmax/masks/rotary go through stitchml):
forward and backward of `(out * w).sum()` (w fixed random, out the model's first tensor)
eagerly in float32, eagerly in float64 on a copy, and compiled with the stitch backend
under `fallback_on_error=False` and `strict=True` (an exception inside stitchml, an op
left eager for "no lowering rule" or a graph run wholly eagerly is an error, not a
fallback); then the same at a second size (a dynamic-shape graph); trained models then
take two compiled AdamW steps (see `_optimizer_step`); decoders then `generate()`
greedily with their cache (see `_generate`).  The output and
every parameter gradient are judged by `stitchml.testing.judge_against_float64`
(stitch's error within 4x eager's own, plus a few ulps: quantities that are zero in
exact arithmetic, such as an attention key bias, are judged at their group's scale).
A parameter eager leaves without a gradient (a pooler the loss does not reach) may
get zeros from the compiled graph, as under any torch.compile backend.

Each model runs in its own process (a crash is a row, not the end of the sweep).
tests/test_model_sweep.py runs a slice of it in CI; docs/MODELS.md holds the last
full run.
"""
from __future__ import annotations

import argparse
import copy
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

# knobs a tiny config takes where the architecture has them
SMALL: dict[str, Any] = dict(
    hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, intermediate_size=48,
    vocab_size=96, max_position_embeddings=64, head_dim=8, moe_intermediate_size=16, num_experts=4,
    num_local_experts=4, n_routed_experts=4, num_experts_per_tok=2, n_shared_experts=1, first_k_dense_replace=1,
    n_group=2, topk_group=1, kv_lora_rank=16, q_lora_rank=16, qk_rope_head_dim=4, qk_nope_head_dim=4,
    v_head_dim=8, shared_expert_intermediate_size=16, d_model=32, n_embd=32, n_layer=2, n_head=4, n_positions=64,
    hidden_dim=48, dim=32, n_heads=4, n_layers=2, ffn_dim=48, embed_dim=32,
    hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, attention_dropout=0.0, hidden_dropout=0.0,
    resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, dropout=0.0, activation_dropout=0.0, classifier_dropout=0.0,
    dropout_rate=0.0, layerdrop=0.0, drop_path_rate=0.0, image_size=32, patch_size=4, num_channels=3,
    state_size=4, conv_kernel=3, expand=2, use_cache=False, pad_token_id=0, bos_token_id=1, eos_token_id=2,
    decoder_start_token_id=1, rope_theta=10000.0, tie_word_embeddings=False)


# an `Arch.extra` value that leaves the SMALL knob of that name out (a config that
# raises when given it, e.g. XLNet's max_position_embeddings)
DROP = object()


@dataclass(frozen=True)
class Arch:
    config: str                     # transformers config class
    kind: str                       # text | seq2seq | image | masked_image | audio
    auto: str = "AutoModelForCausalLM"
    extra: dict = field(default_factory=dict)
    train: bool = True              # train mode (PhiMoE's router samples in training: eval)
    family: str = ""
    # "float64": judged against a float64 run (`testing.judge_against_float64`); "float32":
    # for a model whose own code cannot run in float64 (XGLM's float32-only mask constant),
    # judged against float32 eager alone, normwise (`testing.judge_against_eager`)
    reference: str = "float64"


# the gated-delta-rule layers of Qwen3-Next / Qwen3.5, small
_LINEAR_ATTN = dict(linear_key_head_dim=8, linear_value_head_dim=8, linear_num_key_heads=2, linear_num_value_heads=4,
                    layer_types=["linear_attention", "full_attention"])


def _a(config, kind, auto="AutoModelForCausalLM", family="", train=True, reference="float64", **extra) -> Arch:
    return Arch(config, kind, auto, extra, train, family, reference)


# small encoder-decoder and speech-encoder knobs (not in SMALL: some decoder-only
# configs have attributes of these names with other meanings)
_S2S = dict(encoder_layers=2, decoder_layers=2, encoder_attention_heads=4, decoder_attention_heads=4,
            encoder_ffn_dim=48, decoder_ffn_dim=48)
_SPEECH = dict(conv_dim=(16, 16, 16), conv_stride=(5, 2, 2), conv_kernel=(10, 3, 3), num_conv_pos_embeddings=8,
               num_conv_pos_embedding_groups=4, feat_proj_dropout=0.0, final_dropout=0.0, mask_time_prob=0.05,
               mask_time_length=2, feat_extract_norm="group")


ARCHS: dict[str, Arch] = {
    # decoders
    "qwen3": _a("Qwen3Config", "text", family="decoder"),
    "gemma2": _a("Gemma2Config", "text", family="decoder", final_logit_softcapping=30.0,
                 attn_logit_softcapping=50.0, query_pre_attn_scalar=8, sliding_window=4),
    "gemma3": _a("Gemma3TextConfig", "text", family="decoder", query_pre_attn_scalar=8, sliding_window=4),
    "gptj": _a("GPTJConfig", "text", family="decoder", rotary_dim=4),
    "bloom": _a("BloomConfig", "text", family="decoder (ALiBi)"),
    "olmo2": _a("Olmo2Config", "text", family="decoder"),
    "starcoder2": _a("Starcoder2Config", "text", family="decoder"),
    "persimmon": _a("PersimmonConfig", "text", family="decoder"),
    "stablelm": _a("StableLmConfig", "text", family="decoder"),
    "cohere": _a("CohereConfig", "text", family="decoder"),
    "cohere2": _a("Cohere2Config", "text", family="decoder"),
    "nemotron": _a("NemotronConfig", "text", family="decoder"),
    "phi3": _a("Phi3Config", "text", family="decoder"),
    "glm4": _a("Glm4Config", "text", family="decoder"),
    "difflama": _a("DiffLlamaConfig", "text", family="decoder (differential attention)"),
    "gpt_bigcode": _a("GPTBigCodeConfig", "text", family="decoder (multi-query)"),
    "biogpt": _a("BioGptConfig", "text", family="decoder"),
    "ctrl": _a("CTRLConfig", "text", family="decoder"),
    "gpt_oss": _a("GptOssConfig", "text", family="decoder (MoE, attention sinks)", sliding_window=4),
    # mixtures of experts
    "qwen2_moe": _a("Qwen2MoeConfig", "text", family="MoE", decoder_sparse_step=1, mlp_only_layers=[]),
    "qwen3_moe": _a("Qwen3MoeConfig", "text", family="MoE", decoder_sparse_step=1, mlp_only_layers=[]),
    "olmoe": _a("OlmoeConfig", "text", family="MoE"),
    "granitemoe": _a("GraniteMoeConfig", "text", family="MoE"),
    "phimoe": _a("PhimoeConfig", "text", family="MoE (eval: the router samples in training)", train=False),
    "deepseek_v2": _a("DeepseekV2Config", "text", family="MoE, latent attention", num_key_value_heads=4,
                      head_dim=4),
    "deepseek_v3": _a("DeepseekV3Config", "text", family="MoE, latent attention", num_key_value_heads=4,
                      head_dim=4),
    "llama4": _a("Llama4TextConfig", "text", family="MoE, chunked attention", interleave_moe_layer_step=1,
                 intermediate_size_mlp=48, no_rope_layers=[1, 0], attention_chunk_size=8),
    # state-space and hybrids
    "mamba2": _a("Mamba2Config", "text", family="state space", num_heads=8, head_dim=8, n_groups=1, chunk_size=4,
                 state_size=4),
    "jamba": _a("JambaConfig", "text", family="hybrid (Mamba + attention + MoE)", attn_layer_period=2,
                attn_layer_offset=1, expert_layer_period=2, expert_layer_offset=1, mamba_d_state=4, mamba_dt_rank=4,
                mamba_expand=2, mamba_d_conv=3, use_mamba_kernels=False),
    "falcon_h1": _a("FalconH1Config", "text", family="hybrid", mamba_d_ssm=32, mamba_n_heads=4, mamba_d_head=8,
                    mamba_d_state=4, mamba_n_groups=1, mamba_chunk_size=4, mamba_d_conv=3),
    "bamba": _a("BambaConfig", "text", family="hybrid", mamba_n_heads=4, mamba_d_head=16, mamba_d_state=4,
                mamba_n_groups=1, mamba_chunk_size=4, mamba_d_conv=3, attn_layer_indices=[1]),
    "lfm2": _a("Lfm2Config", "text", family="hybrid (short convolutions)", full_attn_idxs=[1]),
    "recurrent_gemma": _a("RecurrentGemmaConfig", "text", family="recurrent (RG-LRU)", lru_width=32,
                          attention_window_size=4, block_types=["recurrent", "attention"], partial_rotary_factor=0.5),
    # encoders
    "modernbert": _a("ModernBertConfig", "text", "AutoModel", family="encoder (local/global attention)",
                     global_attn_every_n_layers=2, local_attention=4),
    "mobilebert": _a("MobileBertConfig", "text", "AutoModel", family="encoder", embedding_size=16,
                     intra_bottleneck_size=16, true_hidden_size=16, num_feedforward_networks=2),
    "squeezebert": _a("SqueezeBertConfig", "text", "AutoModel", family="encoder (grouped conv)",
                      embedding_size=32, q_groups=2, k_groups=2, v_groups=2, post_attention_groups=2,
                      intermediate_groups=2, output_groups=2),
    "roformer": _a("RoFormerConfig", "text", "AutoModel", family="encoder (rotary)", embedding_size=32),
    "esm": _a("EsmConfig", "text", "AutoModel", family="encoder (rotary)", position_embedding_type="rotary"),
    "megatron_bert": _a("MegatronBertConfig", "text", "AutoModel", family="encoder"),
    # vision
    "convnext": _a("ConvNextConfig", "image", "AutoModel", family="CNN", hidden_sizes=[8, 16], depths=[1, 1],
                   num_stages=2),
    "convnextv2": _a("ConvNextV2Config", "image", "AutoModel", family="CNN (GRN)", hidden_sizes=[8, 16],
                     depths=[1, 1], num_stages=2),
    # 64 px: at 32 px the last stage's batch norm sees 2 values a channel, where its input
    # gradient is exact cancellation (1 - x_hat^2 ~ eps/var): every gradient below it is
    # rounding luck, eager's included (NOTES, tenth session)
    "resnet": _a("ResNetConfig", "image", "AutoModel", family="CNN", embedding_size=8,
                 hidden_sizes=[8, 16, 16, 32], depths=[1, 1, 1, 1], image_size=64),
    "regnet": _a("RegNetConfig", "image", "AutoModel", family="CNN (grouped conv)", embedding_size=8,
                 hidden_sizes=[8, 16, 16, 32], depths=[1, 1, 1, 1], groups_width=8),
    "poolformer": _a("PoolFormerConfig", "image", "AutoModel", family="pooling mixer",
                     hidden_sizes=[8, 16, 16, 32], depths=[1, 1, 1, 1]),
    "mobilevit": _a("MobileViTConfig", "image", "AutoModel", family="CNN + transformer",
                    hidden_sizes=[16, 24, 32], neck_hidden_sizes=[8, 8, 16, 16, 24, 32, 64], image_size=64),
    "segformer": _a("SegformerConfig", "image", "AutoModel", family="vision transformer (efficient attention)",
                    hidden_sizes=[8, 16, 16, 32], depths=[1, 1, 1, 1], num_attention_heads=[1, 2, 2, 4],
                    decoder_hidden_size=16),
    "focalnet": _a("FocalNetConfig", "image", "AutoModel", family="focal modulation", embed_dim=16,
                   depths=[1, 1], hidden_sizes=[16, 32]),
    "hiera": _a("HieraConfig", "image", "AutoModel", family="hierarchical ViT (unroll, mask units)",
                embed_dim=16, depths=[1, 1], num_heads=[1, 2], image_size=[64, 64], patch_size=[7, 7],
                patch_stride=[4, 4], patch_padding=[3, 3], query_stride=[2, 2], masked_unit_size=[8, 8],
                num_query_pool=1),
    "dinov2": _a("Dinov2Config", "image", "AutoModel", family="vision transformer"),
    "beit": _a("BeitConfig", "image", "AutoModel", family="vision transformer (relative position bias)",
               use_relative_position_bias=True),
    "deit": _a("DeiTConfig", "image", "AutoModel", family="vision transformer"),
    "siglip": _a("SiglipVisionConfig", "image", "AutoModel", family="vision transformer"),
    "clip": _a("CLIPVisionConfig", "image", "AutoModel", family="vision transformer"),
    # speech: a convolutional feature encoder (group norm, weight-normed positional
    # convolution), SpecAugment's mask token written into the masked frames
    "wav2vec2": _a("Wav2Vec2Config", "audio", "AutoModel", family="speech encoder (mask token)", **_SPEECH),
    # added in the thirty-first session (each found nothing or a bug, fixed: Longformer's
    # write into a transposed view, I-BERT's keyword operands, Nystromformer's in-place add
    # into an attention output).  XGLM, MRA and CANINE, whose float64 runs fail or return
    # NaN in the models' own code, are judged against float32 eager (below, with RoBERTa)
    "mpt": _a("MptConfig", "text", family="decoder (ALiBi)"),
    "codegen": _a("CodeGenConfig", "text", family="decoder", rotary_dim=4),
    "gpt_neo": _a("GPTNeoConfig", "text", family="decoder (local attention)", num_layers=2, num_heads=4,
                  attention_types=[[["global", "local"], 1]], window_size=4),
    "granite": _a("GraniteConfig", "text", family="decoder (scaled residuals)"),
    "helium": _a("HeliumConfig", "text", family="decoder"),
    "olmo": _a("OlmoConfig", "text", family="decoder (non-parametric norm)"),
    "smollm3": _a("SmolLM3Config", "text", family="decoder (no-rope layers)"),
    "bitnet": _a("BitNetConfig", "text", family="decoder (ternary weights)"),
    "dbrx": _a("DbrxConfig", "text", family="MoE (clipped qkv)", d_model=32, n_heads=4, n_layers=2, max_seq_len=64,
               attn_config={"kv_n_heads": 2, "rope_theta": 10000.0, "clip_qkv": 8.0},
               ffn_config={"ffn_hidden_size": 16, "moe_num_experts": 4, "moe_top_k": 2}),
    "jetmoe": _a("JetMoeConfig", "text", family="MoE (mixture of attention heads)"),
    "minimax": _a("MiniMaxConfig", "text", family="MoE, lightning (linear) attention"),
    "ernie4_5_moe": _a("Ernie4_5_MoeConfig", "text", family="MoE"),
    "hunyuan_moe": _a("HunYuanMoEV1Config", "text", family="MoE"),
    "dots1": _a("Dots1Config", "text", family="MoE"),
    "mamba": _a("MambaConfig", "text", family="state space (selective scan)"),
    "falcon_mamba": _a("FalconMambaConfig", "text", family="state space"),
    "zamba2": _a("Zamba2Config", "text", family="hybrid (Mamba2 + shared attention)",
                 layers_block_type=["mamba", "hybrid"], mamba_d_state=4, n_mamba_heads=4, chunk_size=4,
                 adapter_rank=4, mamba_headdim=16),
    "rwkv": _a("RwkvConfig", "text", family="recurrent (RWKV)"),
    "xlnet": _a("XLNetConfig", "text", "AutoModel", family="encoder (two-stream relative attention)", d_inner=48,
                d_head=8, n_head=4, n_layer=2, mem_len=None, max_position_embeddings=DROP),
    "longformer": _a("LongformerConfig", "text", "AutoModel", family="encoder (sliding-window chunks)",
                     attention_window=4),
    "big_bird": _a("BigBirdConfig", "text", "AutoModel", family="encoder", attention_type="original_full"),
    "convbert": _a("ConvBertConfig", "text", "AutoModel", family="encoder (span-based dynamic convolution)"),
    "nystromformer": _a("NystromformerConfig", "text", "AutoModel", family="encoder (Nyström attention)"),
    "yoso": _a("YosoConfig", "text", "AutoModel", family="encoder (LSH attention)"),
    "fnet": _a("FNetConfig", "text", "AutoModel", family="encoder (Fourier mixing)"),
    "rembert": _a("RemBertConfig", "text", "AutoModel", family="encoder"),
    "ibert": _a("IBertConfig", "text", "AutoModel", family="encoder (integer-only, keyword operands)"),
    "swinv2": _a("Swinv2Config", "image", "AutoModel", family="vision transformer (shifted windows, log-CPB)",
                 embed_dim=16, depths=[1, 1], num_heads=[2, 4], window_size=4, pretrained_window_sizes=[0, 0],
                 num_attention_heads=DROP, num_hidden_layers=DROP, hidden_size=DROP, num_layers=DROP),
    "levit": _a("LevitConfig", "image", "AutoModel", family="CNN + attention (attention biases)",
                hidden_sizes=[16, 24, 32], num_attention_heads=[2, 3, 4], depths=[1, 1, 1], key_dim=[4, 4, 4],
                patch_size=16, mlp_ratio=[2, 2, 2], attention_ratio=[2, 2, 2], image_size=64, drop_path_rate=0,
                down_ops=[["Subsample", 4, 2, 4, 2, 2], ["Subsample", 4, 3, 4, 2, 2]]),
    "pvt_v2": _a("PvtV2Config", "image", "AutoModel", family="pyramid vision transformer",
                 hidden_sizes=[8, 16, 24, 32], num_attention_heads=[1, 2, 3, 4], depths=[1, 1, 1, 1],
                 mlp_ratios=[2, 2, 2, 2], image_size=64),
    "glpn": _a("GLPNConfig", "image", "AutoModel", family="depth estimation encoder",
               hidden_sizes=[8, 16, 24, 32], num_attention_heads=[1, 2, 3, 4], depths=[1, 1, 1, 1],
               mlp_ratios=[2, 2, 2, 2], decoder_hidden_size=16),
    "ijepa": _a("IJepaConfig", "image", "AutoModel", family="vision transformer"),
    "vitdet": _a("VitDetConfig", "image", "AutoModel", family="vision transformer (windowed, rel. positions)"),
    "bit": _a("BitConfig", "image", "AutoModel", family="CNN (weight-standardised conv, group norm)",
              embedding_size=8, hidden_sizes=[8, 16, 24, 32], depths=[1, 1, 1, 1], num_groups=4),
    "mobilenet_v1": _a("MobileNetV1Config", "image", "AutoModel", family="CNN (depthwise)"),
    "mobilenet_v2": _a("MobileNetV2Config", "image", "AutoModel", family="CNN (inverted residuals)"),
    # added in the thirty-second session (each found nothing or a bug, fixed: DeBERTa-v2's
    # bucket table stored under a dynamic row block).  Left out: LongT5 (Dynamo's fake-tensor
    # trace of its transient-global attention fails: a cat of [1, 1, 4, 3, 9] and
    # [2, 4, 4, 3, 3]), EfficientNet (past the 900-s limit under the interpreter; torchvision's EfficientNet-B0 is in tests/test_models_torchvision.py)
    "mistral": _a("MistralConfig", "text", family="decoder (sliding window)", sliding_window=4),
    # added in the thirty-third session, with the knobs the thirty-second lacked: Funnel
    # and ProphetNet refuse `num_hidden_layers` (DROP), ViT-MAE takes its masking noise
    # as an input (kind "masked_image")
    "funnel": _a("FunnelConfig", "text", "AutoModel", family="encoder-decoder (pooled queries, upsampling)",
                 num_hidden_layers=DROP, block_sizes=[1, 1], num_decoder_layers=1, n_head=4, d_head=8, d_inner=48,
                 architectures=["FunnelModel"]),   # (AutoModel picks between two classes by it)
    "prophetnet": _a("ProphetNetConfig", "seq2seq", "AutoModelForSeq2SeqLM",
                     family="encoder-decoder (n-gram streams)", num_hidden_layers=DROP, num_encoder_layers=2,
                     num_decoder_layers=2, num_encoder_attention_heads=4, num_decoder_attention_heads=4,
                     encoder_ffn_dim=48, decoder_ffn_dim=48, num_buckets=8, relative_max_distance=16),
    "vit_mae": _a("ViTMAEConfig", "masked_image", "AutoModel", family="vision transformer (random patch masking)",
                  decoder_hidden_size=16, decoder_num_hidden_layers=1, decoder_num_attention_heads=2,
                  decoder_intermediate_size=32),
    "gemma": _a("GemmaConfig", "text", family="decoder"),
    "phi": _a("PhiConfig", "text", family="decoder (partial rotary, parallel block)"),
    "qwen2": _a("Qwen2Config", "text", family="decoder"),
    "exaone4": _a("Exaone4Config", "text", family="decoder (local/global layers)", sliding_window=4),
    "arcee": _a("ArceeConfig", "text", family="decoder (ReLU² MLP)"),
    "ministral": _a("MinistralConfig", "text", family="decoder"),
    "doge": _a("DogeConfig", "text", family="decoder (dynamic mask attention)"),
    "glm": _a("GlmConfig", "text", family="decoder"),
    "seed_oss": _a("SeedOssConfig", "text", family="decoder"),
    "apertus": _a("ApertusConfig", "text", family="decoder (xIELU)"),
    "hunyuan_dense": _a("HunYuanDenseV1Config", "text", family="decoder (QK norm)"),
    "olmo3": _a("Olmo3Config", "text", family="decoder", sliding_window=4),
    "glm4_moe": _a("Glm4MoeConfig", "text", family="MoE", first_k_dense_replace=1),
    "flex_olmo": _a("FlexOlmoConfig", "text", family="MoE"),
    "albert": _a("AlbertConfig", "text", "AutoModel", family="encoder (shared layers)", embedding_size=16),
    "distilbert": _a("DistilBertConfig", "text", "AutoModel", family="encoder"),
    "electra": _a("ElectraConfig", "text", "AutoModel", family="encoder", embedding_size=16),
    "deberta": _a("DebertaConfig", "text", "AutoModel", family="encoder (disentangled attention)",
                  relative_attention=True, pos_att_type=["c2p", "p2c"], max_relative_positions=16),
    "deberta_v2": _a("DebertaV2Config", "text", "AutoModel", family="encoder (disentangled attention, buckets)",
                     relative_attention=True, pos_att_type=["c2p", "p2c"], position_buckets=8,
                     max_relative_positions=16, norm_rel_ebd="layer_norm", share_att_key=True),
    "roberta": _a("RobertaConfig", "text", "AutoModel", family="encoder"),
    # added in the thirty-third session: models whose own code cannot run in float64 (a
    # float32-only mask constant, a float32 cast before a linear), judged against float32
    # eager alone (`Arch.reference`)
    "xglm": _a("XGLMConfig", "text", family="decoder (sinusoidal positions)", reference="float32",
               num_layers=2, attention_heads=4),
    "mra": _a("MraConfig", "text", "AutoModel", family="encoder (multi-resolution attention)", reference="float32"),
    "canine": _a("CanineConfig", "text", "AutoModel", family="character encoder (hash embeddings, downsampling)",
                 reference="float32", num_hash_buckets=64, max_position_embeddings=64),
    "xlm_roberta": _a("XLMRobertaConfig", "text", "AutoModel", family="encoder"),
    "roberta_prelayernorm": _a("RobertaPreLayerNormConfig", "text", "AutoModel", family="encoder (pre-norm)"),
    "mpnet": _a("MPNetConfig", "text", "AutoModel", family="encoder (relative buckets)"),
    "data2vec_text": _a("Data2VecTextConfig", "text", "AutoModel", family="encoder"),
    "ernie": _a("ErnieConfig", "text", "AutoModel", family="encoder"),
    "layoutlm": _a("LayoutLMConfig", "text", "AutoModel", family="encoder (2-D positions)"),
    "xmod": _a("XmodConfig", "text", "AutoModel", family="encoder (language adapters)", default_language="en_XX",
               languages=["en_XX"]),
    "t5_v1_1": _a("UMT5Config", "seq2seq", "AutoModelForSeq2SeqLM", family="encoder-decoder (UMT5)", d_ff=48,
                  d_kv=8, num_layers=2, num_decoder_layers=2, num_heads=4, feed_forward_proj="gated-gelu"),
    "mbart": _a("MBartConfig", "seq2seq", "AutoModelForSeq2SeqLM", family="encoder-decoder", **_S2S),
    "pegasus": _a("PegasusConfig", "seq2seq", "AutoModelForSeq2SeqLM", family="encoder-decoder (sinusoidal)",
                  **_S2S),
    "marian": _a("MarianConfig", "seq2seq", "AutoModelForSeq2SeqLM", family="encoder-decoder", **_S2S),
    "m2m_100": _a("M2M100Config", "seq2seq", "AutoModelForSeq2SeqLM", family="encoder-decoder", **_S2S),
    "blenderbot": _a("BlenderbotConfig", "seq2seq", "AutoModelForSeq2SeqLM", family="encoder-decoder", **_S2S),
    "led": _a("LEDConfig", "seq2seq", "AutoModelForSeq2SeqLM", family="encoder-decoder (Longformer encoder)",
              attention_window=4, max_encoder_position_embeddings=64, max_decoder_position_embeddings=64, **_S2S),
    "switch_transformers": _a("SwitchTransformersConfig", "seq2seq", "AutoModelForSeq2SeqLM",
                              family="encoder-decoder MoE", d_ff=48, d_kv=8, num_layers=2, num_decoder_layers=2,
                              num_heads=4, num_sparse_encoder_layers=1, num_sparse_decoder_layers=1,
                              expert_capacity=8, router_jitter_noise=0.0),   # (the jitter is random in training)
    "cvt": _a("CvtConfig", "image", "AutoModel", family="convolutional vision transformer", embed_dim=[8, 16, 32],
              num_heads=[1, 2, 4], depth=[1, 2, 3], drop_path_rate=[0.0, 0.0, 0.0]),   # (depth[i] > i: its drop-path list)
    "yolos": _a("YolosConfig", "image", "AutoModel", family="vision transformer (detection tokens)",
                image_size=[32, 32], num_detection_tokens=4),
    "data2vec_vision": _a("Data2VecVisionConfig", "image", "AutoModel",
                          family="vision transformer (relative position bias)", use_relative_position_bias=True),
    "mobilevitv2": _a("MobileViTV2Config", "image", "AutoModel", family="CNN + separable attention",
                      width_multiplier=0.25, image_size=128),
    "swiftformer": _a("SwiftFormerConfig", "image", "AutoModel", family="efficient additive attention",
                      depths=[1, 1, 1, 1], embed_dims=[8, 16, 24, 32]),
    "pvt": _a("PvtConfig", "image", "AutoModel", family="pyramid vision transformer",
              hidden_sizes=[8, 16, 24, 32], num_attention_heads=[1, 2, 3, 4], depths=[1, 1, 1, 1], image_size=64),
    "dinov2_registers": _a("Dinov2WithRegistersConfig", "image", "AutoModel",
                           family="vision transformer (registers)", num_register_tokens=2),
    "vit_msn": _a("ViTMSNConfig", "image", "AutoModel", family="vision transformer"),
    "hubert": _a("HubertConfig", "audio", "AutoModel", family="speech encoder", **_SPEECH),
    "wavlm": _a("WavLMConfig", "audio", "AutoModel", family="speech encoder (gated relative positions)",
                num_buckets=16, max_bucket_distance=32, **_SPEECH),
    "sew": _a("SEWConfig", "audio", "AutoModel", family="speech encoder (squeezed)", squeeze_factor=2, **_SPEECH),
    "sew_d": _a("SEWDConfig", "audio", "AutoModel", family="speech encoder (disentangled attention)",
                squeeze_factor=2, position_buckets=8, max_position_embeddings=64, **_SPEECH),
    "unispeech_sat": _a("UniSpeechSatConfig", "audio", "AutoModel", family="speech encoder", **_SPEECH),
    "data2vec_audio": _a("Data2VecAudioConfig", "audio", "AutoModel", family="speech encoder (conv positions)",
                         num_conv_pos_embeddings=8, conv_pos_kernel_size=3, num_conv_pos_embedding_groups=4,
                         **{k: v for k, v in _SPEECH.items() if not k.startswith("num_conv_pos")
                            and k != "feat_extract_norm"}),
    "wav2vec2_conformer": _a("Wav2Vec2ConformerConfig", "audio", "AutoModel",
                             family="speech encoder (conformer, rotary)", position_embeddings_type="rotary",
                             conv_depthwise_kernel_size=3, **_SPEECH),
    # added in the forty-fifth session: transformers 5.24's newer architectures (linear
    # attention with gated delta rules, xLSTM, Mamba-2 hybrids, AltUp, sparse-attention
    # indexers, shortcut MoE) and the classic decoders tests/test_models_real.py covers
    # only partly
    "qwen3_next": _a("Qwen3NextConfig", "text", family="hybrid (gated DeltaNet + gated attention, MoE)",
                     **_LINEAR_ATTN, mlp_only_layers=[]),
    "qwen3_5": _a("Qwen3_5TextConfig", "text", family="hybrid (gated DeltaNet + attention)", **_LINEAR_ATTN),
    "kimi_linear": _a("KimiLinearConfig", "text", family="hybrid (Kimi delta attention, latent attention, MoE)",
                      linear_head_dim=8, linear_num_heads=4, layer_types=["linear_attention", "full_attention"],
                      mlp_layer_types=["dense", "sparse"], num_local_experts=4, q_lora_rank=None,
                      num_key_value_heads=4),
    "xlstm": _a("xLSTMConfig", "text", family="recurrent (mLSTM, chunkwise)", num_blocks=2, embedding_dim=32,
                chunk_size=1, mode="train", v_head_dim=DROP, qk_head_dim=DROP, head_dim=DROP),
    "nemotron_h": _a("NemotronHConfig", "text", family="hybrid (Mamba-2 + attention, squared ReLU)",
                     layers_block_type=["mamba", "attention", "mlp"], mamba_num_heads=4, mamba_head_dim=16,
                     ssm_state_size=4, n_groups=1, chunk_size=4, conv_kernel=3, use_mamba_kernels=False),
    "granitemoehybrid": _a("GraniteMoeHybridConfig", "text", family="hybrid (Mamba-2 + attention, MoE)",
                           layer_types=["mamba", "attention"], mamba_n_heads=4, mamba_d_state=4, mamba_d_head=16,
                           mamba_chunk_size=4, mamba_d_conv=3, shared_intermediate_size=16),
    "gemma3n": _a("Gemma3nTextConfig", "text", family="decoder (AltUp, LAuReL, per-layer inputs)",
                  layer_types=["sliding_attention", "full_attention"], num_kv_shared_layers=0, sliding_window=4,
                  vocab_size_per_layer_input=96, hidden_size_per_layer_input=8, laurel_rank=4,
                  activation_sparsity_pattern=[0.0, 0.0]),
    "gemma4": _a("Gemma4TextConfig", "text", family="decoder", layer_types=["sliding_attention", "full_attention"],
                 sliding_window=4, vocab_size_per_layer_input=96, hidden_size_per_layer_input=8),
    "vaultgemma": _a("VaultGemmaConfig", "text", family="decoder"),
    "lfm2_moe": _a("Lfm2MoeConfig", "text", family="hybrid (short convolutions, MoE)",
                   layer_types=["conv", "full_attention"], num_dense_layers=1, num_experts=4),
    "minimax_m2": _a("MiniMaxM2Config", "text", family="MoE"),
    "afmoe": _a("AfmoeConfig", "text", family="MoE"),
    "olmo_hybrid": _a("OlmoHybridConfig", "text", family="hybrid"),
    "deepseek_v32": _a("DeepseekV32Config", "text", family="MoE, sparse attention indexer",
                       num_key_value_heads=4, head_dim=4, index_topk=4, index_head_dim=8, index_n_heads=2),
    "longcat_flash": _a("LongcatFlashConfig", "text", family="MoE (zero-computation experts)", num_layers=1,
                        num_key_value_heads=4,
                        head_dim=4, ffn_hidden_size=48, expert_ffn_hidden_size=16, moe_topk=2, zero_expert_num=2),
    "bailing_hybrid": _a("BailingHybridConfig", "text", family="hybrid"),
    "mimo_v2_flash": _a("MiMoV2FlashConfig", "text", family="MoE"),
    "cohere2_moe": _a("Cohere2MoeConfig", "text", family="MoE"),
    "exaone_moe": _a("ExaoneMoeConfig", "text", family="MoE"),
    "falcon": _a("FalconConfig", "text", family="decoder (parallel attention)", head_dim=DROP),
    "gpt_neox": _a("GPTNeoXConfig", "text", family="decoder (parallel residual, partial rotary)"),
    "gpt2": _a("GPT2Config", "text", family="decoder"),
    "opt": _a("OPTConfig", "text", family="decoder"),
    "llama": _a("LlamaConfig", "text", family="decoder"),
}


def _has(cfg, key: str) -> bool:
    """Whether a config takes `key`; a per-layer attribute of a heterogeneous config
    (Gemma 4's head_dim) raises on a global read, and counts as taken."""
    try:
        return hasattr(cfg, key)
    except Exception:   # (transformers' AmbiguousGlobalPerLayerAttributeError)
        return True


def _config(arch: Arch):
    import transformers
    cls = getattr(transformers, arch.config)
    base = cls()
    kw = {k: v for k, v in SMALL.items() if _has(base, k)}
    kw.update(arch.extra)
    kw = {k: v for k, v in kw.items() if v is not DROP}
    cfg = cls(**kw)
    cfg._attn_implementation = "eager"
    # every dropout, drop-path and layer-drop probability 0, including those SMALL does not
    # name (Seed-OSS's residual_dropout): random in training, they would differ between runs
    for k, v in cfg.to_dict().items():
        if "drop" in k and isinstance(v, (int, float)) and not isinstance(v, bool) and v:
            setattr(cfg, k, 0.0)
        elif "drop" in k and isinstance(v, list) and any(isinstance(x, (int, float)) and x for x in v):
            setattr(cfg, k, [0.0] * len(v))
    return cfg


def _inputs(arch: Arch, cfg, which: int, dtype=None) -> dict:
    """The first, second or third size: 12, 9, 10 tokens (batch 2) or batch 2, 3, 4;
    floating-point inputs in `dtype` where given (the bfloat16 sweep)."""
    inputs = _inputs_fp32(arch, cfg, which)
    return inputs if dtype is None else {k: v.to(dtype) if v.is_floating_point() else v for k, v in inputs.items()}


def _inputs_fp32(arch: Arch, cfg, which: int) -> dict:
    import torch
    g = torch.Generator().manual_seed(int(which))
    if arch.kind in ("text", "seq2seq"):
        t = (12, 9, 10)[which]
        vocab = min(getattr(cfg, "vocab_size", None) or 96, 96)
        ids = {"input_ids": torch.randint(3, vocab, (2, t), generator=g)}
        if arch.kind == "seq2seq":   # (a decoder sequence of its own length)
            ids["decoder_input_ids"] = torch.randint(3, vocab, (2, t - 3), generator=g)
        return ids
    if arch.kind == "audio":
        # raw samples, and the frames SpecAugment masks given explicitly (drawn inside
        # the model they come from NumPy's generator, which Dynamo runs apart)
        n = (800, 720, 760)[which]
        frames = n
        for k, st in zip(cfg.conv_kernel, cfg.conv_stride):
            frames = (frames - k) // st + 1
        return {"input_values": torch.randn(2, n, generator=g),
                "mask_time_indices": torch.rand(2, frames, generator=g) > 0.6}
    size = getattr(cfg, "image_size", 32)
    s = size if isinstance(size, int) else size[0]
    b = (2, 3, 4)[which]
    pixels = {"pixel_values": torch.randn(b, cfg.num_channels, s, s, generator=g)}
    if arch.kind == "masked_image":   # the noise that ranks the patches to mask, given (drawn inside: random)
        pixels["noise"] = torch.rand(b, (s // cfg.patch_size) ** 2, generator=g)
    return pixels


def _first(out):
    import torch
    for k in ("last_hidden_state", "logits"):
        v = getattr(out, k, None)
        if isinstance(v, torch.Tensor):
            return v
    return out[0] if isinstance(out, (tuple, list)) else next(v for v in out.values() if isinstance(v, torch.Tensor))


def run_one(name: str, optimizer: bool = True) -> dict:
    """One architecture, both sizes; a JSON-ready verdict.  `optimizer=False` leaves out
    the compiled AdamW steps (CI's slice takes them on one model: `tests/test_model_sweep.py`).
    `name:bf16` runs the model in bfloat16 (parameters and inputs), judged against a float64
    run of the same rounded parameters with eager bfloat16's own error as the measure; no
    AdamW steps and no `generate()` there (their checks compare with eager to 1e-5, and a
    greedy token may flip on a bfloat16 rounding)."""
    import torch
    import transformers

    from torch._dynamo.utils import counters

    import stitchml
    from stitchml import config
    from stitchml.testing import judge_against_eager, judge_against_float64

    name, _, low = name.partition(":")
    if low not in ("", "bf16"):
        raise ValueError(f"{name}: dtype {low!r} (fp32 by default, or bf16)")
    dtype = torch.bfloat16 if low else None
    arch = ARCHS[name]
    torch.manual_seed(0)
    cfg = _config(arch)
    model = getattr(transformers, arch.auto).from_config(cfg).float().train(arch.train)
    if dtype is not None:
        model = model.to(dtype)
    fresh = copy.deepcopy(model)
    counters.clear()
    # (a float32-reference model has no float64 run: eager stands in for it below, and
    # the judge compares with eager alone; in bfloat16, a float32 run is its reference)
    hi = torch.float32 if arch.reference == "float32" else torch.float64
    ref = model if hi == torch.float32 and dtype is None else copy.deepcopy(model).to(hi)
    if ref is not model and getattr(ref.config, "_experts_implementation", None) not in (None, "eager"):
        ref.config._experts_implementation = "eager"   # (grouped matrix products take no float64)
    mine = copy.deepcopy(model)
    backend = stitchml.StitchBackend()
    compiled = torch.compile(mine, backend=backend)
    row: dict[str, Any] = {"name": name, "family": arch.family, "reference": arch.reference, "sizes": [],
                           "dtype": low or "fp32"}
    for which in (0, 1):
        inputs = _inputs(arch, cfg, which, dtype)
        ref_in = {k: v.to(hi) if v.is_floating_point() and ref is not model else v for k, v in inputs.items()}
        for m in (model, ref, mine):
            m.zero_grad(set_to_none=True)
        eager_out = _training_step(model, inputs).detach()
        ref_out = eager_out if ref is model else _training_step(ref, ref_in).detach()
        with config.override(fallback_on_error=False, strict=True):
            mine_out = _training_step(compiled, inputs).detach()
        names, groups, acts, eags, refs = ["output"], ["output"], [mine_out], [eager_out], [ref_out]
        zeros_for_none, missing = [], []
        for (pn, p), q, r in zip(model.named_parameters(), mine.parameters(), ref.parameters()):
            if p.grad is None and r.grad is None:
                if q.grad is not None and bool((q.grad != 0).any()):
                    missing.append(pn)
                elif q.grad is not None:
                    zeros_for_none.append(pn)
                continue
            if p.grad is None or q.grad is None or r.grad is None:
                missing.append(pn)
                continue
            names.append(pn)
            groups.append("grad")
            acts.append(q.grad)
            eags.append(p.grad)
            refs.append(r.grad)
        if ref is model:
            j = judge_against_eager(acts, eags, names, groups=groups)
        else:   # (against float64, or bfloat16 against float32)
            j = judge_against_float64(acts, eags, refs, names, groups=groups)
        worst = max(j.rows, key=lambda t: (t.err_actual / t.allowed) if t.allowed else (0.0 if t.ok else float("inf")))
        row["sizes"].append({
            "ok": j.ok and not missing, "checked": len(acts), "missing": missing,
            "zeros_for_none": len(zeros_for_none),
            "worst": worst.name, "ratio": (worst.err_actual / worst.allowed) if worst.allowed else 0.0,
            "failed": [t.line() for t in j.rows if not t.ok][:3]})
    row["third_size"] = _third_size(arch, cfg, fresh, compiled, dtype)
    records = backend.records
    row["graphs"] = len(records)
    row["dynamic"] = sum(r.dynamic is not None for r in records)
    row["kernels"] = sum(r.plan.num_kernels for r in records if r.plan is not None)
    row["whole_graph_eager"] = [f"{r.kind}: {r.eager_reason}" for r in records if r.eager_reason is not None]
    eager = _eager_ops(records)
    row["eager"] = eager
    # a dynamic graph is expected unless Dynamo itself traced a graph a size (RWKV's
    # Python loop over the tokens): our count was checked against Dynamo's above
    row["ok"] = (all(s["ok"] for s in row["sizes"]) and not eager and not row["whole_graph_eager"]
                 and (row["dynamic"] >= 1 or row["third_size"]["dynamo_graphs"] >= 3) and row["third_size"]["ok"])
    if arch.train and optimizer and dtype is None:
        row["optimizer"] = _optimizer_step(model, mine)
        row["ok"] = row["ok"] and row["optimizer"]["ok"]
    if arch.auto in ("AutoModelForCausalLM", "AutoModelForSeq2SeqLM") and dtype is None:
        row["generate"] = _generate(fresh, cfg)
        row["ok"] = row["ok"] and row["generate"]["ok"]
    return row


def _optimizer_step(model, mine, steps: int = 2) -> dict:
    """The model's AdamW step with gradient clipping (`foreach`, as torch picks on a GPU)
    compiled with the stitch backend, strict, the fallback off, against the same step
    eagerly: both start from eager's gradients of the last training step, so only the
    update differs.  Parameters within 1e-5 relative (plus 1e-6) after `steps` steps; no
    eager op; every parameter and moment the update writes is overwritten in place by
    the kernel computing it (0-d step counters may be copied after the call)."""
    import torch

    from stitchml import StitchBackend, config

    pairs = [(p, q) for p, q in zip(model.parameters(), mine.parameters()) if p.grad is not None]
    grads = [p.grad.detach().clone() for p, _ in pairs]
    eager_opt = torch.optim.AdamW([p for p, _ in pairs], lr=1e-3, weight_decay=0.01, foreach=True)
    mine_opt = torch.optim.AdamW([q for _, q in pairs], lr=1e-3, weight_decay=0.01, foreach=True)
    mine_ps = [q for _, q in pairs]
    backend = StitchBackend()

    def step():
        torch.nn.utils.clip_grad_norm_(mine_ps, 1.0, foreach=True)
        mine_opt.step()

    torch._dynamo.reset()
    compiled = torch.compile(step, backend=backend)
    with torch.no_grad():   # (equal already: both are copies of one model, neither stepped)
        for p, q in pairs:
            q.copy_(p)
    for _ in range(steps):
        for (p, q), g in zip(pairs, grads):
            p.grad, q.grad = g.clone(), g.clone()
        torch.nn.utils.clip_grad_norm_([p for p, _ in pairs], 1.0, foreach=True)
        eager_opt.step()
        with config.override(fallback_on_error=False, strict=True):
            compiled()
    err = max(float(((q - p).abs() / (1e-6 + 1e-5 * p.abs())).max()) for p, q in pairs) if pairs else 0.0
    records = [r for r in backend.records if r.plan is not None]
    written = [(r, n) for r in records for _, n in r.plan.graph.written()]
    copied = [n for r, n in written if r.plan.copy_reason(n) is not None and r.plan.graph[n].numel > 1]
    out = {"tensors": len(pairs), "ratio": err, "graphs": len(backend.records), "written": len(written),
           "copied": len(copied), "eager": _eager_ops(backend.records),
           "whole_graph_eager": [f"{r.kind}: {r.eager_reason}" for r in backend.records if r.eager_reason]}
    out["ok"] = (err <= 1.0 and not out["eager"] and not out["whole_graph_eager"] and not copied
                 and len(written) >= len(pairs))
    return out


def _training_step(run, inputs: dict):
    """Forward under a fixed seed, then the backward of (out * w).sum() for a fixed
    random w (float64: the same cotangent for every run); the output."""
    import torch
    torch.manual_seed(3)
    out = _first(run(**inputs))
    w = torch.randn(out.shape, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    (out.double() * w).sum().backward()
    return out


# Dynamo's own graph count is taken with AOTAutograd and no compiler: AOTAutograd's
# runtime marks the dynamic dims of a dynamic graph's outputs on the tensors it returns
# (`_dynamo_propagated_dynamic_indices`), so the frame after a graph break is traced with
# those dims symbolic under any AOTAutograd backend, ours, Inductor's or `aot_eager`
# (Longformer: 4 -> 21 graphs at the second size with each, 7 with a backend that runs
# the graph as Dynamo traced it).  A guard of ours would still show as one more graph.
BASELINE = "aot_eager"


def _third_size(arch: Arch, cfg, fresh, compiled, dtype=None) -> dict:
    """A training step at a third size, which the second size's dynamic graph must serve:
    the Dynamo graphs compiled over the three sizes are no more than Dynamo's own count
    for the same steps (with `BASELINE`, AOTAutograd and no compiler, on a fresh copy).  A
    size guard added while compiling would specialise the dynamic graph and show as one
    more graph here."""
    import torch
    from torch._dynamo.utils import counters

    from stitchml import config

    with config.override(fallback_on_error=False, strict=True):
        out = _training_step(compiled, _inputs(arch, cfg, 2, dtype))
    ours = counters["stats"]["unique_graphs"]
    baseline = BASELINE
    for baseline in (BASELINE, "eager"):
        torch._dynamo.reset()
        counters.clear()
        run = torch.compile(copy.deepcopy(fresh), backend=baseline)
        try:
            for which in range(3):
                _training_step(run, _inputs(arch, cfg, which, dtype))
            break
        except Exception:   # torch's own AOT path fails on the model (Doge's backward): Dynamo alone
            if baseline != BASELINE:
                raise
    theirs = counters["stats"]["unique_graphs"]
    torch._dynamo.reset()
    return {"graphs": ours, "dynamo_graphs": theirs, "baseline": baseline, "finite": bool(torch.isfinite(out).all()),
            "ok": ours <= theirs and bool(torch.isfinite(out).all())}


def _generate(model, cfg, new_tokens: int = 6) -> dict:
    """Greedy `generate()` with the model's cache (a KV cache growing a token a step, or
    recurrent states): the compiled forward under strict mode with the fallback off gives
    eager's tokens and logits (relative error <= 1e-5 a step), and compiles no more graphs
    than Dynamo itself does for the same loop (counted with `BASELINE`): a size guard
    added while compiling would recompile at every token, and
    past Dynamo's recompile limit run the rest eagerly."""
    import torch
    from torch._dynamo.utils import counters

    from stitchml import StitchBackend, config

    model = model.eval()
    model.config.use_cache = True
    g = torch.Generator().manual_seed(2)
    ids = torch.randint(3, min(getattr(cfg, "vocab_size", None) or 96, 96), (2, 5), generator=g)
    kw = dict(max_new_tokens=new_tokens, do_sample=False, output_logits=True, return_dict_in_generate=True,
              attention_mask=torch.ones_like(ids), pad_token_id=0)
    forward = model.forward
    with torch.no_grad():
        want = model.generate(ids, **kw)
    torch._dynamo.reset()
    counters.clear()
    model.forward = torch.compile(forward, backend=BASELINE)
    with torch.no_grad():
        model.generate(ids, **kw)
    traced = counters["stats"]["unique_graphs"]
    torch._dynamo.reset()
    backend = StitchBackend()
    model.forward = torch.compile(forward, backend=backend)
    with torch.no_grad(), config.override(fallback_on_error=False, strict=True):
        got = model.generate(ids, **kw)
    model.forward = forward
    same = torch.equal(got.sequences, want.sequences)
    err = max(float((a - b).norm() / b.norm().clamp_min(1e-30)) for a, b in zip(got.logits, want.logits))
    records = backend.records
    out = {"tokens_equal": same, "logit_err": err, "graphs": len(records), "dynamo_graphs": traced,
           "dynamic": sum(r.dynamic is not None for r in records),
           "whole_graph_eager": [f"{r.kind}: {r.eager_reason}" for r in records if r.eager_reason is not None]}
    # (a graph of views and a library product alone, as a graph break leaves around an
    # LM head, has no kernel to launch: what must not be there is an op left eager)
    out["eager"] = _eager_ops(records)
    out["kernels"] = sum(r.plan.num_kernels for r in records if r.plan is not None)
    # templates against buckets of the dynamic graphs: a template per token would mean new
    # kernels compiled at every token on a GPU (one a bucket is the design; a plan choice
    # flipping inside a bucket adds an exact one)
    dyn = [r.dynamic for r in records if r.dynamic is not None]
    out["templates"], out["buckets"] = sum(d.num_templates for d in dyn), sum(d.buckets for d in dyn)
    out["ok"] = (same and err <= 1e-5 and len(records) <= traced and not out["whole_graph_eager"]
                 and not out["eager"] and out["kernels"] >= 1)
    return out


def _eager_ops(records) -> dict[str, int]:
    """Ops the compiled graphs left eager for a reason other than being library work
    (matrix products, attention, sorting...): "op: reason" -> count."""
    from stitchml.fallback import by_design
    eager: dict[str, int] = {}
    for r in records:
        for f in (r.graph.fallbacks if r.graph is not None else []):
            if not by_design(f.reason):
                eager[f"{f.op}: {f.reason}"] = eager.get(f"{f.op}: {f.reason}", 0) + 1
        if r.dynamic is not None and r.dynamic.eager_calls:
            eager[f"dynamic eager calls: {r.dynamic.describe()[:120]}"] = 1
    return eager


def _subprocess(name: str, timeout: float, module: str = "stitchml.tools.model_sweep",
                marker: str = "SWEEP ", interpret: bool = True) -> dict:
    """`python -m module --one name` in its own process (a crash is a row, not the end of
    the sweep): the JSON row it prints after `marker`, or an error row.  The vision sweep
    (`timm_sweep`) and the sm_90 sweep (`aot_sweep`, `interpret=False`) run their models
    through it too."""
    t0 = time.perf_counter()
    cmd = [sys.executable, "-m", module, "--one", name]
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=_child_env(interpret))
    except subprocess.TimeoutExpired:
        return {"name": name, "ok": False, "error": f"timed out after {timeout:.0f} s",
                "seconds": round(time.perf_counter() - t0, 1)}
    line = next((x for x in p.stdout.splitlines() if x.startswith(marker)), None)
    if line is None:
        tail = (p.stderr or p.stdout).strip().splitlines()[-3:]
        return {"name": name, "ok": False, "error": f"exit {p.returncode}: {' | '.join(tail)[:300]}"}
    row = json.loads(line[len(marker):])
    row["seconds"] = round(time.perf_counter() - t0, 1)
    return row


def _child_env(interpret: bool) -> dict[str, str]:
    """The environment of a model's process: on a machine without a GPU, kernels run in
    Triton's interpreter, which must be chosen before triton is imported, so an unset
    TRITON_INTERPRET becomes 1 there (as `opinfo_sweep` does for itself): without it
    every model of the sweep fails at its first kernel with the same message."""
    env = os.environ.copy()
    if interpret and env.get("TRITON_INTERPRET", "") == "":
        import torch
        if not torch.cuda.is_available():
            env["TRITON_INTERPRET"] = "1"
    return env


def write_report(text: str, out: str | None) -> None:
    """The sweep's markdown into `out`, or printed."""
    if out:
        with open(out, "w", encoding="utf-8") as f:
            f.write(text)
    else:
        print(text)


def _markdown(rows: list[dict], command: str, seconds: float, dtype: str = "fp32") -> str:
    import torch
    import transformers
    ok = sum(1 for r in rows if r.get("ok"))
    title = "" if dtype == "fp32" else " in bfloat16"
    out = [f"# Real-model sweep{title}: {len(rows)} Hugging Face architectures", "",
           f"Generated by `{command}` on {time.strftime('%Y-%m-%d')} with torch {torch.__version__}, "
           f"transformers {transformers.__version__} ({seconds:.0f} s). Do not edit by hand.", "",
           "Each row: tiny random model, one training step (forward + backward) at a first and a second size "
           "(a dynamic-shape graph), compiled under `fallback_on_error=False` and `STITCHML_STRICT=1`, the "
           "output and every parameter gradient judged against a float64 run (error within 4x eager's own plus "
           "a few ulps). Ratio: the worst tensor's error over its allowance (≤ 1 passes). Decoders then "
           "`generate()` 6 tokens greedily with their cache: tokens equal to eager's, logits within 1e-5, "
           "and no more graphs compiled than Dynamo with AOTAutograd and no compiler (`aot_eager`) for the "
           "same loop (graphs / Dynamo's). Trained models then take two compiled AdamW steps with gradient "
           "clipping (`foreach`) from eager's gradients: parameters within 1e-5 relative of eager's (ratio ≤ 1), "
           "no eager op, every parameter and moment written in place (written / copied after the call). "
           "A third training step at a third size must compile nothing that "
           "`aot_eager` would not (Dynamo graphs over the three sizes, ours / Dynamo's, in the graphs column). "
           "Where the float64 run itself loses a value eager keeps, stitch is measured from eager there. "
           "A model whose own code cannot run in float64 (marked \"vs float32 eager\") is judged against float32 "
           "eager alone, normwise within 1e-4 relative (`testing.judge_against_eager`). See "
           "`src/stitchml/tools/model_sweep.py`."
           + ("" if dtype == "fp32" else " **In bfloat16** (`--dtype bf16`): parameters and inputs in bfloat16, "
              "the float64 run (float32 for the \"vs float32 eager\" models) made from the same rounded "
              "parameters, the allowance from eager bfloat16's own error; no AdamW steps and no `generate()`."),
           "",
           f"**{ok} of {len(rows)} pass.**", "",
           "| model | family | size 1 | size 2 | worst ratio (tensor) | graphs (dynamic); Dynamo graphs, 3 sizes | "
           "kernels | eager ops "
           "| generate | optimizer | s |",
           "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if "error" in r:
            out.append(f"| {r['name']} | {ARCHS[r['name'].partition(':')[0]].family} | ERROR | | {r['error']} | | | | | | |")
            continue
        s1, s2 = r["sizes"]

        def cell(s):
            return ("pass" if s["ok"] else "FAIL") + f" ({s['checked']})"
        worst = max(r["sizes"], key=lambda s: s["ratio"])
        eager = "; ".join(r["eager"]) or ("whole graph: " + "; ".join(r["whole_graph_eager"])
                                          if r["whole_graph_eager"] else "none")
        gen = r.get("generate")
        gen_cell = "—" if gen is None else (
            ("pass" if gen["ok"] else "FAIL") + f" ({gen['graphs']} / {gen['dynamo_graphs']}, "
            f"{gen['logit_err']:.0e}{'' if gen['tokens_equal'] else ', tokens differ'})")
        opt = r.get("optimizer")
        opt_cell = "—" if opt is None else (("pass" if opt["ok"] else "FAIL")
                                            + f" ({opt['written']} written, {opt['copied']} copied, {opt['ratio']:.2f})")
        against = " vs float32 eager" if r.get("reference") == "float32" else ""
        out.append(f"| {r['name']} | {r['family']} | {cell(s1)} | {cell(s2)} | {worst['ratio']:.2f} "
                   f"({worst['worst']}{against}) | {r['graphs']} ({r['dynamic']}); {r['third_size']['graphs']} / "
                   f"{r['third_size']['dynamo_graphs']}"
                   f"{'' if r['third_size'].get('baseline', BASELINE) == BASELINE else ' (Dynamo alone: aot_eager fails)'}"
                   f" | {r['kernels']} | {eager} | "
                   f"{gen_cell} | {opt_cell} | {r.get('seconds', '')} |")
    notes = [f"- {r['name']}: {'; '.join(s['failed'] + ['missing gradients: ' + ', '.join(s['missing'])] if s['missing'] else s['failed'])}"
             for r in rows if "sizes" in r for s in r["sizes"] if not s["ok"]]
    notes += [f"- {r['name']} third size: {r['third_size']}" for r in rows
              if "third_size" in r and not r["third_size"]["ok"]]
    notes += [f"- {r['name']} generate: {r['generate']}" for r in rows
              if r.get("generate") is not None and not r["generate"]["ok"]]
    notes += [f"- {r['name']} optimizer: {r['optimizer']}" for r in rows
              if r.get("optimizer") is not None and not r["optimizer"]["ok"]]
    if notes:
        out += ["", "## Failures", ""] + notes
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default="", help="comma-separated names (default: all): " + ", ".join(ARCHS))
    p.add_argument("--out", help="markdown file to write (default: print)")
    p.add_argument("--jobs", type=int, default=1, help="models run at once (one process each)")
    p.add_argument("--timeout", type=float, default=900.0, help="seconds per model")
    p.add_argument("--dtype", choices=("fp32", "bf16"), default="fp32",
                   help="the models' parameters and inputs (bf16: judged against float64, no AdamW or generate())")
    p.add_argument("--one", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.one:
        print("SWEEP " + json.dumps(run_one(a.one)), flush=True)
        return 0
    names = [n for n in a.models.split(",") if n] or list(ARCHS)
    unknown = [n for n in names if n not in ARCHS]
    if unknown:
        p.error(f"unknown models {unknown}; known: {', '.join(ARCHS)}")
    t0 = time.perf_counter()
    with ThreadPoolExecutor(max(1, a.jobs)) as pool:
        rows = []
        spec = "" if a.dtype == "fp32" else ":" + a.dtype
        for row in pool.map(lambda n: _subprocess(n + spec, a.timeout), names):
            print(f"{row['name']}: {'ok' if row.get('ok') else 'FAIL'} {row.get('error', '')} "
                  f"({row.get('seconds', '?')} s)", flush=True)
            rows.append(row)
    command = "python -m stitchml.tools.model_sweep" + (f" --models {a.models}" if a.models else "") + \
        (f" --dtype {a.dtype}" if a.dtype != "fp32" else "") + (f" --out {a.out}" if a.out else "")
    write_report(_markdown(rows, command, time.perf_counter() - t0, a.dtype), a.out)
    return 0 if all(r.get("ok") for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
