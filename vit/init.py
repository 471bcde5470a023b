"""All weight initialisation, in one place."""

from __future__ import annotations

import math

import torch
from torch import nn

from vit.pos_embed import AbsolutePositionEmbedding

STD = 0.02  # BERT's and timm's truncated-normal scale
CLS_STD = 1e-6  # timm starts the class token at almost zero


@torch.no_grad()
def trunc_normal_(tensor: torch.Tensor, std: float) -> torch.Tensor:
    """Fill with N(0, std) truncated at ±2 std, by the inverse CDF:
    u ~ U(erf(-√2), erf(√2)), x = √2 std erfinv(u).

    The same distribution as torch.nn.init.trunc_normal_(a=-2std, b=2std), about 10x faster on CPU,
    which matters for ViT-L's 300M parameters.
    """
    bound = math.erf(2 / math.sqrt(2))
    return tensor.uniform_(-bound, bound).erfinv_().mul_(std * math.sqrt(2))


def init_weights(model: nn.Module) -> None:
    """Initialise a VisionTransformer in place, as timm's default ('timm' mode) does where it has a rule:

    - nn.Linear (Q/K/V, W⁽ᵒ⁾, MLP, head): weight ~ normal(0, 0.02) truncated at ±2 std, bias = 0.
      (timm passes ±2 in absolute units, which at std 0.02 cuts nothing; we truncate as intended.)
    - Patch embedding (the per-patch linear map, a strided conv): weight ~ truncated normal(0, 0.02),
      bias = 0. (timm leaves PyTorch's default here; we treat the conv as the linear map it is.)
    - nn.LayerNorm: weight = 1, bias = 0.
    - Learned position table and its class-token row: truncated normal(0, 0.02).
    - Class token: normal(0, 1e-6).
    - LayerScale gains: keep their configured start value (set at construction).
    - Fixed sinusoid tables and rope phases are buffers, computed, never initialised.
    """
    for module in model.modules():
        if isinstance(module, (nn.Linear, nn.Conv2d)):
            trunc_normal_(module.weight, STD)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.LayerNorm):
            nn.init.ones_(module.weight)
            nn.init.zeros_(module.bias)
        elif isinstance(module, AbsolutePositionEmbedding) and module.learned:
            trunc_normal_(module.table, STD)
            if module.prefix is not None:
                trunc_normal_(module.prefix, STD)
    cls_token = getattr(model, "cls_token", None)
    if cls_token is not None:
        nn.init.normal_(cls_token, std=CLS_STD)
