"""The normalisation every norm of the model uses: LayerNorm (the textbook's), or RMSNorm (no centring, no bias)."""

from __future__ import annotations

from torch import nn


def make_norm(kind: str, dim: int, eps: float) -> nn.Module:
    """LayerNorm(x) = γ (x - μ) / √(σ² + ε) + β;  RMSNorm(x) = γ x / √(mean(x²) + ε)."""
    if kind == "layernorm":
        return nn.LayerNorm(dim, eps=eps)
    if kind == "rmsnorm":
        return nn.RMSNorm(dim, eps=eps)
    raise ValueError(f"not a norm layer: {kind!r}")
