"""Batched augmentation of uint8 image tensors on the training device: one op per batch, not per image,
so two CPU workers never starve a GPU, and the same code runs on CPU for tests."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn


class BatchAugment(nn.Module):
    """uint8 (B, C, H, W) -> normalised float (B, C, H, W), with random crops and flips when training.

    - crop_padding: pad each side by this many pixels (with the value of black after normalisation,
      i.e. zero-intensity) and crop back to H x W at a random offset drawn per image;
    - flip: mirror each image horizontally with probability 1/2.
    """

    def __init__(self, mean: Sequence[float], std: Sequence[float], crop_padding: int = 0, flip: bool = False):
        super().__init__()
        self.crop_padding, self.flip = crop_padding, flip
        self.register_buffer("mean", torch.tensor(mean).view(1, -1, 1, 1) * 255, persistent=False)
        self.register_buffer("std", torch.tensor(std).view(1, -1, 1, 1) * 255, persistent=False)

    def normalize(self, images: Tensor) -> Tensor:
        return (images.float() - self.mean) / self.std

    def forward(self, images: Tensor, train: bool) -> Tensor:  # (B, C, H, W) uint8
        if not train:
            return self.normalize(images)
        if self.crop_padding:
            images = random_crop(images, self.crop_padding)
        if self.flip:
            flipped = torch.rand(images.shape[0], 1, 1, 1, device=images.device) < 0.5
            images = torch.where(flipped, images.flip(-1), images)
        return self.normalize(images)


def random_crop(images: Tensor, padding: int) -> Tensor:
    """Zero-pad by `padding` and crop each image of the batch at its own random offset. (B, C, H, W)"""
    B, C, H, W = images.shape
    padded = F.pad(images, (padding,) * 4)  # (B, C, H + 2p, W + 2p)
    dy, dx = torch.randint(0, 2 * padding + 1, (2, B, 1), device=images.device)
    rows = (dy + torch.arange(H, device=images.device))[:, None, :, None]  # (B, 1, H, 1)
    cols = (dx + torch.arange(W, device=images.device))[:, None, None, :]  # (B, 1, 1, W)
    batch = torch.arange(B, device=images.device)[:, None, None, None]
    channel = torch.arange(C, device=images.device)[None, :, None, None]
    return padded[batch, channel, rows, cols]
