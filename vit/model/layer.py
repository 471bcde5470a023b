"""One transformer layer: attention and a per-token MLP, each inside a residual with LayerNorm."""

from __future__ import annotations

import torch
from torch import Tensor, nn
from torchvision.ops import StochasticDepth

from vit.model.attention import MultiHeadAttention
from vit.model.config import ViTConfig


class Mlp(nn.Module):
    """The per-token network: Linear -> GELU -> Linear, hidden width mlp_ratio * D."""

    def __init__(self, dim: int, hidden_dim: int, dropout: float):
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden_dim)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(hidden_dim, dim)
        self.drop = nn.Dropout(dropout)

    def forward(self, x: Tensor) -> Tensor:  # (B, N, D) -> (B, N, D)
        return self.drop(self.fc2(self.drop(self.act(self.fc1(x)))))


class LayerScale(nn.Module):
    """A learned per-channel gain on a residual branch (Touvron et al. 2021, CaiT)."""

    def __init__(self, dim: int, init_value: float):
        super().__init__()
        self.gamma = nn.Parameter(torch.full((dim,), init_value))

    def forward(self, x: Tensor) -> Tensor:
        return x * self.gamma


class TransformerLayer(nn.Module):
    """pre-norm:  Z = X + MHA(LN(X));   X̃ = Z + MLP(LN(Z))
    post-norm: Z = LN(X + MHA(X));   X̃ = LN(Z + MLP(Z))

    Each branch may be scaled by LayerScale and dropped per sample by stochastic depth (drop path).
    """

    def __init__(self, config: ViTConfig, drop_path: float):
        super().__init__()
        dim = config.embed_dim
        self.pre_norm = config.norm == "pre"
        self.norm1 = nn.LayerNorm(dim, eps=config.norm_eps)
        self.attn = MultiHeadAttention(
            dim, config.num_heads, config.qkv_bias, config.attn_dropout, config.dropout, config.fused_attn
        )
        self.norm2 = nn.LayerNorm(dim, eps=config.norm_eps)
        self.mlp = Mlp(dim, config.mlp_hidden_dim, config.dropout)
        init = config.layer_scale_init
        self.ls1 = LayerScale(dim, init) if init else nn.Identity()
        self.ls2 = LayerScale(dim, init) if init else nn.Identity()
        self.drop_path = StochasticDepth(drop_path, mode="row") if drop_path > 0 else nn.Identity()

    def forward(
        self, x: Tensor, rope: tuple[Tensor, Tensor] | None = None, need_weights: bool = False
    ) -> tuple[Tensor, Tensor | None]:  # x: (B, N, D) -> (B, N, D)
        a, weights = self.attn(self.norm1(x) if self.pre_norm else x, rope, need_weights)
        return self._residuals(x, a), weights

    def forward_first_token(self, x: Tensor, rope: tuple[Tensor, Tensor] | None = None) -> Tensor:
        """forward(x)[0][:, :1] for less work: only the first token queries, every token gives keys and values,
        and the rest of the layer is per token. (B, N, D) -> (B, 1, D)."""
        q, k, v = self.attn.project(self.norm1(x) if self.pre_norm else x, rope)
        a, _ = self.attn.attend(q[:, :, :1], k, v)
        return self._residuals(x[:, :1], a)

    def _residuals(self, x: Tensor, a: Tensor) -> Tensor:
        """The layer after attention, given X and the attention output A = MHA(LN(X)) or MHA(X), row for row."""
        if self.pre_norm:
            z = x + self.drop_path(self.ls1(a))
            return z + self.drop_path(self.ls2(self.mlp(self.norm2(z))))
        z = self.norm1(x + self.drop_path(self.ls1(a)))
        return self.norm2(z + self.drop_path(self.ls2(self.mlp(z))))
