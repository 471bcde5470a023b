"""Attention pooling (SigLIP's multihead attention pooling head, Zhai et al. 2023): one learned query attends
to the patch tokens, and the result passes a residual MLP, as a transformer layer's second half."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from vit.model.attention import attend_heads
from vit.model.mlp import Mlp


class AttentionPool(nn.Module):
    """y = z + MLP(LN(z)),  z = W_o MHA(q = latent W_q;  K, V = X W_k, X W_v): (B, N, D) -> (B, D)."""

    def __init__(self, dim: int, num_heads: int, hidden: int, act: str, norm: nn.Module, fused: bool = True):
        super().__init__()
        self.num_heads, self.head_dim, self.fused = num_heads, dim // num_heads, fused
        self.latent = nn.Parameter(torch.zeros(1, 1, dim))  # the query token
        self.q = nn.Linear(dim, dim)
        self.kv = nn.Linear(dim, 2 * dim)  # [W_k; W_v]
        self.proj = nn.Linear(dim, dim)
        self.norm = norm
        self.mlp = Mlp(dim, hidden, act, dropout=0.0)

    def forward(self, x: Tensor) -> Tensor:
        B, N, D = x.shape
        q = self.q(self.latent.expand(B, -1, -1)).reshape(B, 1, self.num_heads, self.head_dim).transpose(1, 2)
        k, v = self.kv(x).reshape(B, N, 2, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4).unbind(0)
        heads, _ = attend_heads(q, k, v, 0.0, self.fused)  # (B, H, 1, D_k)
        z = self.proj(heads.transpose(1, 2).reshape(B, 1, D))  # (B, 1, D)
        return (z + self.mlp(self.norm(z)))[:, 0]
