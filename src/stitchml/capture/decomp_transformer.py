"""PyTorch's fused Transformer encoder layer, taken apart so its memory-intensive work stitches.

`nn.TransformerEncoderLayer` in inference (eval mode, no gradient, batch-first, an even
head count; `TransformerEncoder` calls it a layer at a time) calls one native op,
`aten._transformer_encoder_layer_fwd`: without this decomposition it ran eagerly with "no
lowering rule", its layer norms, residual adds and FFN activation unstitched.

The decomposition composes the ops the native kernel itself composes
(aten/src/ATen/native/transformers/transformer.cpp): layer norms, the attention block as
`aten._native_multi_head_attention` (projections, masked softmax and the output
projection; a library op, as attention is), the residual adds and the FFN (two linear
layers around an exact GELU or a ReLU).  Keeping the attention op the native one keeps its
mask rules bit for bit (a key fully masked by padding gives NaN there, where the
module's own slow path gives values): only the memory-intensive work around it changes
hands."""
from __future__ import annotations

import torch

aten = torch.ops.aten


def transformer_encoder_layer(src: torch.Tensor, embed_dim: int, num_heads: int, qkv_weight: torch.Tensor,
                              qkv_bias: torch.Tensor, proj_weight: torch.Tensor, proj_bias: torch.Tensor,
                              use_gelu: bool, norm_first: bool, eps: float, norm_weight_1: torch.Tensor,
                              norm_bias_1: torch.Tensor, norm_weight_2: torch.Tensor, norm_bias_2: torch.Tensor,
                              ffn_weight_1: torch.Tensor, ffn_bias_1: torch.Tensor, ffn_weight_2: torch.Tensor,
                              ffn_bias_2: torch.Tensor, mask: torch.Tensor | None = None,
                              mask_type: int | None = None) -> torch.Tensor:
    """`aten._transformer_encoder_layer_fwd` on a dense batch-first `src` (B, L, E)."""
    if src.numel() == 0:
        return src.clone()

    def norm(x, w, b):
        return aten.native_layer_norm(x, [embed_dim], w, b, eps)[0]

    x = norm(src, norm_weight_1, norm_bias_1) if norm_first else src
    x = aten._native_multi_head_attention(x, x, x, embed_dim, num_heads, qkv_weight, qkv_bias, proj_weight,
                                          proj_bias, mask, False, True, mask_type)[0]
    x = x + src
    if not norm_first:
        x = norm(x, norm_weight_1, norm_bias_1)
    residual = x
    if norm_first:
        x = norm(x, norm_weight_2, norm_bias_2)
    h = aten.linear(x, ffn_weight_1, ffn_bias_1)
    h = aten.gelu(h) if use_gelu else aten.relu(h)
    x = aten.linear(h, ffn_weight_2, ffn_bias_2) + residual
    if not norm_first:
        x = norm(x, norm_weight_2, norm_bias_2)
    return x


def table() -> dict:
    return {aten._transformer_encoder_layer_fwd.default: transformer_encoder_layer}
