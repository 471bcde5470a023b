"""Multi-head scaled dot-product self-attention (Vaswani et al. 2017; Bishop & Bishop §12.1)."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.attention.flex_attention import BlockMask

from vit.model import kernels
from vit.model.pos_embed import apply_rope


def attention_reference(
    q: Tensor, k: Tensor, v: Tensor, scale: float | None = None, dropout_p: float = 0.0, bias: Tensor | None = None
) -> tuple[Tensor, Tensor]:
    """softmax(Q Kᵀ / √D_k + B) V, written out, returning the output and the attention weights.

    q, k, v: (..., N, D_k). Returns (..., N, D_k) and weights (..., N, N) whose rows sum to one.
    `scale` replaces 1/√D_k (scale=1 gives the unparameterised Softmax[X Xᵀ] X of the textbook); `bias` B, a
    relative position bias (..., N, N), is added to the logits (none: B = 0).
    """
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    scores = (q @ k.transpose(-2, -1)) * scale  # (..., N, N)
    if bias is not None:
        scores = scores + bias
    weights = kernels.softmax_rows(scores)
    return F.dropout(weights, dropout_p) @ v, weights


def attend_heads(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    dropout_p: float,
    fused: bool,
    need_weights: bool = False,
    bias: Tensor | BlockMask | None = None,
) -> tuple[Tensor, Tensor | None]:
    """softmax(Q Kᵀ / √D_k + B) V for every head, by torch's fused kernel where kernels.fused_attention_serves, else
    (and for the weights) written out. (B, H, N_q, D_k) queries against (B, H, N, D_k) keys and values, bias
    (H, N_q, N), packed images' BlockMask (kernels.document_mask) or none -> (B, H, N_q, D_k), weights
    (B, H, N_q, N)."""
    if isinstance(bias, BlockMask):
        if fused and not need_weights:
            return kernels.document_attention(q, k, v, bias, dropout_p), None
        bias = kernels.dense_mask(bias, q.dtype)
    if fused and not need_weights and kernels.fused_attention_serves(v):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=bias, dropout_p=dropout_p), None
    return attention_reference(q, k, v, dropout_p=dropout_p, bias=bias)


class MultiHeadAttention(nn.Module):
    """H heads of attention on one fused QKV projection, concatenated and projected by W⁽ᵒ⁾.

    With `kv_heads` G < H (grouped-query attention, Ainslie et al. 2023) the projection gives G heads of keys and
    values, and query head h reads group ⌊h G / H⌋'s: W_k and W_v shrink to G D_k columns, the rest is unchanged.

    The fast path is torch's scaled_dot_product_attention (flash / memory-efficient kernels), except in bf16 on a
    CPU (kernels.fused_attention_serves); the reference path computes the same thing explicitly and can return the
    weights. `norm` builds the optional norms: of each head's queries and keys (qk_norm), and of the heads'
    concatenation (attn_norm).
    """

    def __init__(
        self,
        dim: int,
        num_heads: int,
        qkv_bias: bool,
        attn_dropout: float,
        dropout: float,
        fused: bool = True,
        *,
        qk_norm: bool = False,
        attn_norm: bool = False,
        proj_bias: bool = True,
        norm: Callable[[int], nn.Module] = nn.LayerNorm,
        kv_heads: int | None = None,
    ):
        super().__init__()
        self.num_heads, self.head_dim = num_heads, dim // num_heads
        self.kv_heads = kv_heads or num_heads  # G
        self.attn_dropout, self.fused = attn_dropout, fused
        # [W_q; W_k; W_v] for all heads at once: (H + 2G) D_k outputs, 3D when G = H
        self.qkv = nn.Linear(dim, (num_heads + 2 * self.kv_heads) * self.head_dim, bias=qkv_bias)
        self.q_norm = norm(self.head_dim) if qk_norm else nn.Identity()
        self.k_norm = norm(self.head_dim) if qk_norm else nn.Identity()
        self.norm = norm(dim) if attn_norm else nn.Identity()
        self.out_proj = nn.Linear(dim, dim, bias=proj_bias)  # W⁽ᵒ⁾
        self.out_drop = nn.Dropout(dropout)

    def forward(
        self,
        x: Tensor,
        rope: tuple[Tensor, Tensor] | None = None,
        bias: Tensor | None = None,
        need_weights: bool = False,
    ) -> tuple[Tensor, Tensor | None]:  # x: (B, N, D) -> (B, N, D), weights (B, H, N, N) when need_weights
        """Every token attends to all N tokens, with a relative position bias (H, N, N) when given."""
        return self.attend(*self.project(x, rope), need_weights, bias)

    def project(self, x: Tensor, rope: tuple[Tensor, Tensor] | None = None) -> tuple[Tensor, Tensor, Tensor]:
        """Q, K, V = X W_q, X W_k, X W_v per head, rotated when rope: (B, N, D) -> 3 x (B, H, N, D_k); a group's
        keys and values repeated for each of its H / G query heads."""
        B, N, _ = x.shape
        H, G = self.num_heads, self.kv_heads
        qkv = self.qkv(x).reshape(B, N, H + 2 * G, self.head_dim).transpose(1, 2)  # (B, H + 2G, N, D_k)
        q, k, v = qkv.split((H, G, G), dim=1)
        q, k = self.q_norm(q), self.k_norm(k)
        if rope is not None:
            q, k = apply_rope(q, *rope), apply_rope(k, *rope)
        if G != H:
            k, v = k.repeat_interleave(H // G, dim=1), v.repeat_interleave(H // G, dim=1)
        return q, k, v

    def attend(
        self, q: Tensor, k: Tensor, v: Tensor, need_weights: bool = False, bias: Tensor | None = None
    ) -> tuple[Tensor, Tensor | None]:
        """softmax(Q Kᵀ / √D_k + B) V per head, concatenated and projected: (B, H, N_q, D_k) queries against N keys,
        bias (H, N_q, N) or none -> (B, N_q, D)."""
        heads, weights = self.heads(q, k, v, need_weights, bias)  # (B, H, N_q, D_k), (B, H, N_q, N)
        B, H, N_q, D_k = heads.shape
        concat = heads.transpose(1, 2).reshape(B, N_q, H * D_k)  # heads side by side
        return self.out_drop(self.out_proj(self.norm(concat))), weights

    def heads(
        self, q: Tensor, k: Tensor, v: Tensor, need_weights: bool = False, bias: Tensor | None = None
    ) -> tuple[Tensor, Tensor | None]:
        """Each head's softmax(Q Kᵀ / √D_k + B) V, and its weights when need_weights."""
        dropout_p = self.attn_dropout if self.training else 0.0
        return attend_heads(q, k, v, dropout_p, self.fused, need_weights, bias)


class DifferentialAttention(MultiHeadAttention):
    """Differential attention (Ye et al. 2024): each head's queries and keys split into two halves of D_k / 2 dims,
    and the second softmax map, scaled by a learned λ, taken from the first:

        head = (1 - λ_init) RMSNorm( (softmax(Q₁ K₁ᵀ / √(D_k/2) + B) - λ softmax(Q₂ K₂ᵀ / √(D_k/2) + B)) V )
        λ = exp(λ_q1 · λ_k1) - exp(λ_q2 · λ_k2) + λ_init,    λ_init = 0.8 - 0.6 exp(-0.3 l) at layer l (0 first)

    The RMSNorm (`sub_norm`, eps 1e-5, over each head's D_k dims) is the paper's and timm's. qk_norm normalises each
    half. The rest (projections, concatenation, W⁽ᵒ⁾) is MultiHeadAttention's.
    """

    def __init__(self, *args, layer: int = 0, norm: Callable[[int], nn.Module] = nn.LayerNorm, **kwargs):
        super().__init__(*args, norm=norm, **kwargs)
        half = self.head_dim // 2
        if not isinstance(self.q_norm, nn.Identity):  # each half of a head is normalised
            self.q_norm, self.k_norm = norm(half), norm(half)
        self.lambda_q1, self.lambda_k1, self.lambda_q2, self.lambda_k2 = (
            nn.Parameter(torch.randn(half) * 0.1) for _ in range(4)
        )
        self.sub_norm = nn.RMSNorm(self.head_dim, eps=1e-5)
        self.lambda_init = 0.8 - 0.6 * math.exp(-0.3 * layer)

    def project(self, x: Tensor, rope: tuple[Tensor, Tensor] | None = None) -> tuple[Tensor, Tensor, Tensor]:
        """Q and K per head and half (B, H, N, 2, D_k / 2), V per head (B, H, N, D_k)."""
        B, N, _ = x.shape
        qkv = self.qkv(x).reshape(B, N, 3 * self.num_heads, self.head_dim).transpose(1, 2)
        q, k, v = qkv.split(self.num_heads, dim=1)
        halves = lambda t: t.unflatten(-1, (2, self.head_dim // 2))  # noqa: E731
        return self.q_norm(halves(q)), self.k_norm(halves(k)), v

    def heads(
        self, q: Tensor, k: Tensor, v: Tensor, need_weights: bool = False, bias: Tensor | None = None
    ) -> tuple[Tensor, Tensor | None]:
        """Each head's (1 - λ_init) RMSNorm((A₁ - λ A₂) V), and A₁ - λ A₂ when need_weights."""
        lam = (
            torch.exp((self.lambda_q1 * self.lambda_k1).sum().float())
            - torch.exp((self.lambda_q2 * self.lambda_k2).sum().float())
            + self.lambda_init
        ).to(q.dtype)
        a1, w1 = super().heads(q[..., 0, :], k[..., 0, :], v, need_weights, bias)
        a2, w2 = super().heads(q[..., 1, :], k[..., 1, :], v, need_weights, bias)
        heads = self.sub_norm(a1 - lam * a2) * (1 - self.lambda_init)
        return heads, (w1 - lam * w2 if need_weights else None)
