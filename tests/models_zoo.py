"""Small real models for the model sweep (tests/test_models_real.py), no downloads.

The CNNs are written here in plain torch.nn (ResNet basic blocks with BatchNorm and
max/adaptive-average pooling; MobileNet-v3-style inverted residuals with depthwise
convolution, hardswish, squeeze-excitation, GroupNorm and a PoolFormer-like avg-pool)
because the package index's torchvision wheel is built against the CUDA build of torch:
with the CPU build, `import torchvision` fails registering `torchvision::nms` (and so
timm fails too).  The transformers come from Hugging Face `transformers` tiny configs.
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F


class BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.down = None
        if stride != 1 or cin != cout:
            self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        return F.relu(y + (x if self.down is None else self.down(x)))


class TinyResNet(nn.Module):
    """ResNet-18 shape in miniature: stem conv + BN + ReLU + 3x3/2 max-pool, two stages
    of basic blocks, adaptive average pool, linear head."""

    def __init__(self, classes: int = 10, width: int = 8) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, width, 3, 1, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU(),
                                  nn.MaxPool2d(3, 2, 1))
        self.layer1 = BasicBlock(width, width)
        self.layer2 = BasicBlock(width, 2 * width, stride=2)
        self.head = nn.Linear(2 * width, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.layer2(self.layer1(self.stem(x)))
        return self.head(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


class MobileBlock(nn.Module):
    """MobileNet-v3 style: expand 1x1, depthwise 3x3, squeeze-excitation, project;
    GroupNorm and avg-pool (PoolFormer-like token mixer) on the residual path."""

    def __init__(self, c: int) -> None:
        super().__init__()
        self.expand = nn.Conv2d(c, 2 * c, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(2 * c)
        self.dw = nn.Conv2d(2 * c, 2 * c, 3, 1, 1, groups=2 * c, bias=False)
        self.bn2 = nn.BatchNorm2d(2 * c)
        self.se1 = nn.Conv2d(2 * c, c // 2, 1)
        self.se2 = nn.Conv2d(c // 2, 2 * c, 1)
        self.project = nn.Conv2d(2 * c, c, 1, bias=False)
        self.gn = nn.GroupNorm(2, c)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.hardswish(self.bn1(self.expand(x)))
        y = F.hardswish(self.bn2(self.dw(y)))
        s = F.hardsigmoid(self.se2(F.relu(self.se1(F.adaptive_avg_pool2d(y, 1)))))
        y = self.project(y * s)
        z = self.gn(x + y)
        return z + F.avg_pool2d(z, 3, 1, 1, count_include_pad=False) - z


class TinyMobileNet(nn.Module):
    def __init__(self, classes: int = 10, width: int = 8) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, width, 3, 2, 1, bias=False), nn.BatchNorm2d(width), nn.Hardswish())
        self.blocks = nn.Sequential(MobileBlock(width), MobileBlock(width))
        self.head = nn.Linear(width, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.blocks(self.stem(x))
        return self.head(F.adaptive_avg_pool2d(x, 1).flatten(1))


def tiny_swin():
    from transformers import SwinConfig, SwinForImageClassification
    cfg = SwinConfig(image_size=32, patch_size=4, num_channels=3, embed_dim=16, depths=[1, 2], num_heads=[1, 2],
                     window_size=2, mlp_ratio=2.0, num_labels=10, hidden_dropout_prob=0.0,
                     attention_probs_dropout_prob=0.0, drop_path_rate=0.0)
    return SwinForImageClassification(cfg)


def tiny_vit():
    from transformers import ViTConfig, ViTForImageClassification
    cfg = ViTConfig(image_size=16, patch_size=4, num_channels=3, hidden_size=32, num_hidden_layers=1,
                    num_attention_heads=2, intermediate_size=64, num_labels=10, hidden_dropout_prob=0.0,
                    attention_probs_dropout_prob=0.0)
    return ViTForImageClassification(cfg)


def tiny_mixtral():
    from transformers import MixtralConfig, MixtralForCausalLM
    cfg = MixtralConfig(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=1,
                        num_attention_heads=2, num_key_value_heads=1, num_local_experts=4, num_experts_per_tok=2,
                        max_position_embeddings=64, attn_implementation="eager")
    return MixtralForCausalLM(cfg)


def tiny_mamba():
    from transformers import MambaConfig, MambaForCausalLM
    cfg = MambaConfig(vocab_size=64, hidden_size=16, state_size=4, num_hidden_layers=1, expand=2, conv_kernel=3,
                      time_step_rank=4, use_mambapy=False)
    return MambaForCausalLM(cfg)
