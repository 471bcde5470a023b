"""All weight initialisation, in one place."""

from __future__ import annotations

import math

import torch
from torch import nn

from vit.model.pool import AttentionPool
from vit.model.pos_embed import AbsolutePositionEmbedding

STD = 0.02  # BERT's and timm's truncated-normal scale
CLS_STD = 1e-6  # timm starts the class token at almost zero
TRUNCATED_STD_RATIO = 0.8796  # std of N(0, 1) truncated at ±2


@torch.no_grad()
def trunc_normal_(tensor: torch.Tensor, std: float) -> torch.Tensor:
    """Fill with N(0, std) truncated at ±2 std, by the inverse CDF:
    u ~ U(erf(-√2), erf(√2)), x = √2 std erfinv(u).

    The same distribution as torch.nn.init.trunc_normal_(a=-2std, b=2std), faster on CPU, which matters for
    ViT-L's 300M parameters (benchmarks/NOTES.md change 39).
    """
    bound = math.erf(2 / math.sqrt(2))
    return tensor.uniform_(-bound, bound).erfinv_().mul_(std * math.sqrt(2))


def init_weights(model: nn.Module) -> None:
    """Initialise a VisionTransformer in place, as timm's default ('timm' mode) does where it has a rule:

    - nn.Linear (Q/K/V, W⁽ᵒ⁾, MLP, head): weight ~ normal(0, 0.02) truncated at ±2 std, bias = 0.
      (timm passes ±2 in absolute units, which at std 0.02 cuts nothing; we truncate as intended.)
    - Patch embedding (the per-patch linear map, a strided conv): LeCun normal, weight ~ normal(0, 1/fan_in)
      truncated at ±2 std with fan_in = C * P * P, bias = 0, as big_vision does. (timm keeps PyTorch's
      fan-in uniform default, of similar scale.) With 0.02, a 4x4 grayscale patch would embed ~10x weaker
      than a sinusoid table, and the first epochs would see mostly positions.
    - nn.LayerNorm: weight = 1, bias = 0.
    - Learned position table and its class-token row: truncated normal(0, 0.02).
    - Class, distillation and register tokens: normal(0, 1e-6).
    - An MAE decoder's mask token: normal(0, 0.02), as MAE's.
    - Attention pooling's query: truncated normal(0, 1/√D).
    - RMSNorm: weight = 1 (torch's own start).
    - LayerScale gains: keep their configured start value (set at construction).
    - Fixed sinusoid tables and rope phases are buffers, computed, never initialised.
    """
    if (first := next(model.parameters(), None)) is not None and first.is_meta:
        return  # shapes without values (vit/model/size.py): nothing to fill, and filling costs half the build
    for module in model.modules():
        if isinstance(module, nn.Conv2d):
            fan_in = module.weight[0].numel()
            # a truncated normal has 0.88x its parent's std; divide so the result keeps variance 1/fan_in
            trunc_normal_(module.weight, 1 / math.sqrt(fan_in) / TRUNCATED_STD_RATIO)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Linear):
            trunc_normal_(module.weight, STD)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.LayerNorm):
            nn.init.ones_(module.weight)
            nn.init.zeros_(module.bias)
        elif isinstance(module, AbsolutePositionEmbedding) and module.learned:
            for table in module.tables:
                trunc_normal_(table, STD)
            if module.prefix is not None:
                trunc_normal_(module.prefix, STD)
        elif isinstance(module, AttentionPool):
            trunc_normal_(module.latent, module.latent.shape[-1] ** -0.5)  # unit-scale query, as timm's
    for name in ("cls_token", "dist_token", "reg_token"):
        if (token := getattr(model, name, None)) is not None:
            nn.init.normal_(token, std=CLS_STD)
    if (mask := getattr(model, "mask_token", None)) is not None:
        nn.init.normal_(mask, std=STD)
