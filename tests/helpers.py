"""Builders shared by the tests: tiny CPU configs and weights moved off their initial values."""

from __future__ import annotations

import torch

from vit.config import ViTConfig


def tiny_config(**overrides) -> ViTConfig:
    """A 16x16 RGB, patch-4 ViT (4x4 grid, D=32, 2 layers, 4 heads of 8 dims): milliseconds per step."""
    values = dict(img_size=16, patch_size=4, in_chans=3, num_classes=5, embed_dim=32, depth=2, num_heads=4)
    return ViTConfig(**{**values, **overrides})


def perturb_(module: torch.nn.Module, std: float = 0.1) -> torch.nn.Module:
    """Move every parameter off its initial value so that comparisons cannot pass on zeros and ones."""
    with torch.no_grad():
        for p in module.parameters():
            p.add_(torch.randn_like(p) * std)
    return module
