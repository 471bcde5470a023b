"""The per-token network of each layer: fc2(φ(fc1 x)), or gated, fc2(SiLU(x W_g) ⊙ x W_v) (SwiGLU, Shazeer 2020)."""

from __future__ import annotations

import torch
from torch import Tensor, nn


class QuickGELU(nn.Module):
    """x σ(1.702 x): the sigmoid approximation of GELU that OpenAI's CLIP was trained with."""

    def forward(self, x: Tensor) -> Tensor:
        return x * torch.sigmoid(1.702 * x)


# the MLP's φ; for swiglu the gate's
ACTIVATIONS = {
    "gelu": nn.GELU,
    "gelu_tanh": lambda: nn.GELU(approximate="tanh"),
    "quick_gelu": QuickGELU,
    "swiglu": nn.SiLU,
}


class Mlp(nn.Module):
    """Linear -> φ -> [norm] -> Linear, hidden width h. With act='swiglu', fc1 packs [W_g; W_v] (2h outputs)
    and φ(x W_g) ⊙ x W_v is the hidden layer. The optional norm on the hidden layer is EVA-02's sub-LN."""

    def __init__(
        self, dim: int, hidden: int, act: str, dropout: float, bias: bool = True, norm: nn.Module | None = None
    ):
        super().__init__()
        self.gated = act == "swiglu"
        self.fc1 = nn.Linear(dim, 2 * hidden if self.gated else hidden, bias=bias)
        self.act = ACTIVATIONS[act]()
        self.norm = norm if norm is not None else nn.Identity()
        self.fc2 = nn.Linear(hidden, dim, bias=bias)
        self.drop = nn.Dropout(dropout)

    def forward(self, x: Tensor) -> Tensor:  # (B, N, D) -> (B, N, D)
        h = self.fc1(x)  # (B, N, h), or (B, N, 2h) gated
        if self.gated:
            gate, value = h.chunk(2, dim=-1)
            h = self.act(gate) * value
        else:
            h = self.act(h)
        return self.drop(self.fc2(self.norm(self.drop(h))))
