"""Relative position bias: a per-head term b_h(i, j) added to the attention logit of query i and key j, a function of
where key j lies from query i alone. Here b is a small MLP of the log-spaced offset, Swin-v2's continuous position
bias in timm's 'cr' form (timm's vit_relpos models): b(i, j) = MLP(sign(d) log(1 + |d|)) with d = (Δy, Δx) between
the patches, so that any grid gets a bias from the same weights. Prefix tokens take none.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

GridSize = tuple[int, int]
MLP_DROPOUT = 0.125  # on the bias MLP's hidden layer while training, as timm's RelPosMlp


def log_offsets(grid: GridSize) -> Tensor:
    """Every offset (Δy, Δx) that two patches of the grid can have, as sign(d) log(1 + |d|). (2h-1, 2w-1, 2)"""
    h, w = grid
    dy, dx = torch.meshgrid(torch.arange(1 - h, h), torch.arange(1 - w, w), indexing="ij")
    d = torch.stack((dy, dx), dim=-1).float()
    return d.sign() * d.abs().log1p()


def offset_index(grid: GridSize) -> Tensor:
    """For each (query i, key j) of the grid's N patches in raster order, the row of log_offsets's flattened table
    that holds position i - position j. (N, N)"""
    h, w = grid
    y, x = torch.meshgrid(torch.arange(h), torch.arange(w), indexing="ij")
    dy = y.flatten()[:, None] - y.flatten()[None, :]  # (N, N)
    dx = x.flatten()[:, None] - x.flatten()[None, :]
    return (dy + h - 1) * (2 * w - 1) + (dx + w - 1)


class RelativePositionBias(nn.Module):
    """b(i, j) per head = fc2(ReLU(fc1(log offset of i from j))). forward(grid) -> (H, P + N, P + N)"""

    def __init__(self, num_heads: int, hidden: int, num_prefix_tokens: int):
        super().__init__()
        self.num_prefix_tokens = num_prefix_tokens
        self.fc1 = nn.Linear(2, hidden)
        self.drop = nn.Dropout(MLP_DROPOUT)
        self.fc2 = nn.Linear(hidden, num_heads)

    def forward(self, grid: GridSize) -> Tensor:
        device = self.fc1.weight.device
        table = self.fc2(self.drop(F.relu(self.fc1(log_offsets(grid).to(device)))))  # (2h-1, 2w-1, H)
        bias = table.flatten(0, 1)[offset_index(grid).to(device)].permute(2, 0, 1)  # (H, N, N)
        p = self.num_prefix_tokens
        return F.pad(bias, (p, 0, p, 0))  # prefix rows and columns: no bias
