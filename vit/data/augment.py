"""Batched augmentation of uint8 image tensors on the training device: one op per batch, not per image,
so two CPU workers never starve a GPU, and the same code runs on CPU for tests."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

INTERPOLATION = "bicubic"  # PIL's filter that `resize` applies, as timm's eval transforms of ViTs; data facts name it


class BatchAugment(nn.Module):
    """uint8 (B, C, H, W) -> normalised float (B, C, size, size), with random crops and flips when training.

    - crop_padding: pad each side by this many pixels (with the value of black after normalisation,
      i.e. zero-intensity) and crop back to H x W at a random offset drawn per image;
    - flip: mirror each image horizontally with probability 1/2;
    - size: the model's input side; images of another size are resized (`resize`: PIL's bicubic) after
      cropping and flipping, in training and evaluation alike. None keeps H x W.
    """

    def __init__(
        self,
        mean: Sequence[float],
        std: Sequence[float],
        crop_padding: int = 0,
        flip: bool = False,
        size: int | None = None,
    ):
        super().__init__()
        self.crop_padding, self.flip, self.size = crop_padding, flip, size
        self.register_buffer("mean", torch.tensor(mean).view(1, -1, 1, 1) * 255, persistent=False)
        self.register_buffer("std", torch.tensor(std).view(1, -1, 1, 1) * 255, persistent=False)

    def normalize(self, images: Tensor) -> Tensor:
        return (images.float() - self.mean) / self.std

    def forward(self, images: Tensor, train: bool) -> Tensor:  # (B, C, H, W) uint8
        if train and self.crop_padding:
            images = random_crop(images, self.crop_padding)
        if train and self.flip:
            flipped = torch.rand(images.shape[0], 1, 1, 1, device=images.device) < 0.5
            images = torch.where(flipped, images.flip(-1), images)
        return self.normalize(resize(images, self.size))


def resize(images: Tensor, size: int | None) -> Tensor:
    """uint8 (B, C, H, W) -> (B, C, size, size) whole-valued float: the pixels PIL's resize with INTERPOLATION
    gives, as prediction (vit.checkpoint.Loaded.preprocess) and timm's eval transforms resize image files, to
    one grey level (PIL computes in fixed point). Unchanged when size is None or already H = W = size.

    Torch's antialiased filters are PIL's (cubic a = -0.5, widened when shrinking); torch's plain bicubic
    (a = -0.75, not antialiased) is not. PIL also rounds and clips to 8 bits after each pass, width then height,
    which decides bright and dark edges, where cubics overshoot."""
    if size is None or images.shape[-2:] == (size, size):
        return images
    out = images.float()
    for shape in ((images.shape[-2], size), (size, size)):  # (B, C, H, size), then (B, C, size, size), as PIL
        out = F.interpolate(out, size=shape, mode=INTERPOLATION, align_corners=False, antialias=True)
        out = out.round_().clamp_(0, 255)
    return out


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


def shift(images: Tensor, dy: int, dx: int, fill: Tensor) -> Tensor:
    """Each image moved dy pixels up and dx left (negative: down, right), the uncovered border filled with `fill`
    (one value per channel, or one for all): the crop random_crop takes at that offset, for test-time views.
    (B, C, H, W)"""
    B, C, H, W = images.shape
    p = max(abs(dy), abs(dx))
    padded = fill.to(images).view(1, -1, 1, 1).expand(B, C, H + 2 * p, W + 2 * p).clone()  # (B, C, H+2p, W+2p)
    padded[..., p : p + H, p : p + W] = images
    return padded[..., p + dy : p + dy + H, p + dx : p + dx + W].contiguous()  # strides as `images`: one compiled graph


def average_over_views(
    score: Callable[[Tensor], Tensor], images: Tensor, flip: bool, shift_px: int, fill: Tensor | None
) -> Tensor:
    """The mean of `score` (images -> logits) over the test-time views: each image, its mirror image when `flip`,
    and, when `shift_px`, both moved that many pixels up-left and down-right (border `fill`), the two moved views
    weighing as much as the unmoved ones (airbench's mirror-translate views). (B, C, H, W) -> (B, K)"""

    def mirrored(views: Tensor) -> Tensor:
        logits = score(views)
        return (logits + score(views.flip(-1))) / 2 if flip else logits  # the image and its mirror, left to right

    logits = mirrored(images)
    if shift_px:
        moved = [mirrored(shift(images, d, d, fill)) for d in (shift_px, -shift_px)]  # up-left, down-right
        logits = (logits + (moved[0] + moved[1]) / 2) / 2
    return logits
