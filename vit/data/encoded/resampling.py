"""Crop, resize and flip a batch of differently sized images at once, as two batched matrix products.

Antialiased resizing is separable and linear: along each axis, output sample j is a normalised, filter-weighted
sum of the input samples within the filter's reach of its centre (torch's and PIL's rule). A crop moves where those
weights start, a flip reverses their rows, and a centre crop after a resize keeps some of them; so each image's
whole geometry is one (H_out, H_in) matrix and one (W_out, W_in) matrix, and the batch is `Wy @ image @ Wxᵀ`. On a
GPU this is a handful of kernels for the batch (and one copy per image into the padded batch) where torchvision's
functions take several per image (benchmarks/NOTES.md change 22).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import PIL
import torch
from torch import Tensor
from torchvision.transforms import InterpolationMode


def _triangle(x: Tensor) -> Tensor:
    return (1 - x.abs()).clamp(min=0)


def _cubic(x: Tensor, a: float = -0.5) -> Tensor:
    """Keys' cubic with a = -0.5, as torch's and PIL's antialiased bicubic."""
    x = x.abs()
    near = ((a + 2) * x - (a + 3)) * x * x + 1
    far = ((a * x - 5 * a) * x + 8 * a) * x - 4 * a
    return torch.where(x < 1, near, torch.where(x < 2, far, torch.zeros_like(x)))


PILLOW_PICKS_ORDER = int(PIL.__version__.split(".")[0]) >= 13  # else width first always (read in Pillow 12.2, 13.0)
FILTERS: dict[InterpolationMode, tuple[float, Callable[[Tensor], Tensor]]] = {
    InterpolationMode.BILINEAR: (1.0, _triangle),  # (reach in input samples at scale 1, filter)
    InterpolationMode.BICUBIC: (2.0, _cubic),
}


@dataclass(frozen=True)
class Frame:
    """Where one output image comes from: the region (top, left, height, width) of the decoded image, resized to
    (full_h, full_w), of which the window starting at (off_y, off_x) is kept (beyond the resized image: black),
    mirrored left to right if `flip`."""

    top: int
    left: int
    height: int
    width: int
    full_h: int
    full_w: int
    off_y: int = 0
    off_x: int = 0
    flip: bool = False


def axis_weights(length: Tensor, full: Tensor, offset: Tensor, size: int, span: int, mode: InterpolationMode) -> Tensor:
    """(B, size, span): row j of image b weighs input samples 0..span-1 to make output sample j, the input's first
    `length[b]` samples resized to `full[b]`, from `offset[b]` on. Outputs outside the resized extent weigh nothing.

    As torch's antialiased interpolate: centre (j + ½)·scale, reach r·max(scale, 1), weights
    filter((i + ½ − centre) / max(scale, 1)) over the reach within the input, normalised to sum to one."""
    reach, kernel = FILTERS[mode]
    length, full, offset = length.float(), full.float(), offset.float()  # (B,), in float32 as torch computes them
    scale = (length / full)[:, None, None]  # (B, 1, 1)
    stretch = scale.clamp(min=1)
    j = offset[:, None] + torch.arange(size, device=length.device)  # (B, size) in the resized image
    centre = scale[..., 0] * (j + 0.5)  # (B, size)
    first = (centre - reach * stretch[..., 0] + 0.5).floor().clamp(min=0)[..., None]  # (B, size, 1)
    stop = torch.minimum((centre + reach * stretch[..., 0] + 0.5).floor(), length[:, None])[..., None]
    i = torch.arange(span, device=length.device)  # (span,)
    weights = kernel((i - centre[..., None] + 0.5) * (1 / stretch)) * ((i >= first) & (i < stop))  # (B, size, span)
    total = weights.sum(-1, keepdim=True)
    inside = ((j >= 0) & (j < full[:, None]))[..., None]
    return torch.where(inside & (total != 0), weights / total, 0.0)


@contextlib.contextmanager
def _full_fp32(device: torch.device) -> Iterator[None]:
    """Products in full fp32 (not TF32, which a GPU run may have switched on) and outside any autocast: a pixel
    must come out as the resize computes it, to the grey level."""
    kept = torch.backends.cuda.matmul.fp32_precision
    torch.backends.cuda.matmul.fp32_precision = "ieee"
    try:
        with torch.autocast(device.type, enabled=False):
            yield
    finally:
        torch.backends.cuda.matmul.fp32_precision = kept


def resample(images: list[Tensor], frames: list[Frame], size: tuple[int, int], mode: InterpolationMode) -> Tensor:
    """(B, C, H, W) float, whole numbers 0..255: each (C, h, w) uint8 image framed by its Frame. One axis is resized,
    rounded to whole levels, then the other, in the order the installed Pillow takes for that image, so that the
    pixels are PIL's but where a sum lands within float32's error of a half. The images share a device and channel
    count; the work is a batch of matrix products over the largest region, so callers keep batches of similar sizes
    (or small) where memory matters."""
    device, channels = images[0].device, images[0].shape[0]
    span_h, span_w = max(f.height for f in frames), max(f.width for f in frames)
    regions = images[0].new_zeros(len(images), channels, span_h, span_w)  # (B, C, span_h, span_w) uint8
    for region, image, f in zip(regions, images, frames, strict=True):
        region[:, : f.height, : f.width] = image[:, f.top : f.top + f.height, f.left : f.left + f.width]
    numbers = torch.tensor([[f.height, f.width, f.full_h, f.full_w, f.off_y, f.off_x, f.flip] for f in frames])
    numbers = numbers.to(device, non_blocking=True)  # (B, 7)
    down = axis_weights(numbers[:, 0], numbers[:, 2], numbers[:, 4], size[0], span_h, mode)  # (B, H, span_h)
    across = axis_weights(numbers[:, 1], numbers[:, 3], numbers[:, 5], size[1], span_w, mode)  # (B, W, span_w)
    across = torch.where(numbers[:, 6, None, None].bool(), across.flip(1), across)
    order = [_down_first(f) for f in frames]
    with _full_fp32(device):
        if len(set(order)) == 1:
            return _two_passes(regions, down, across, order[0])
        out = torch.empty((len(frames), channels, *size), device=device)
        for first in (False, True):
            picked = torch.tensor([k for k, d in enumerate(order) if d == first], device=device)
            out[picked] = _two_passes(regions[picked], down[picked], across[picked], first)
        return out


def _down_first(f: Frame) -> bool:
    """Pillow 13 resizes along the height first where the height shrinks by more than twice what the width does;
    earlier Pillows always resize along the width first."""
    shrink = f.height - f.full_h
    return PILLOW_PICKS_ORDER and shrink > 0 and shrink > 2 * (f.width - f.full_w)


def _two_passes(regions: Tensor, down: Tensor, across: Tensor, down_first: bool) -> Tensor:
    """(B, C, H, W): regions (B, C, span_h, span_w) resized along the height (down @) and the width (@ acrossᵀ),
    in whole levels after each."""
    regions, across = regions.float(), across[:, None].transpose(-1, -2)  # across: (B, 1, span_w, W)
    if down_first:
        return _whole_levels(_whole_levels(down[:, None] @ regions) @ across)
    return _whole_levels(down[:, None] @ _whole_levels(regions @ across))


def _whole_levels(x: Tensor) -> Tensor:
    """Rounded half up and clipped to 0..255, as PIL's fixed-point sums are."""
    return x.add_(0.5).floor_().clamp_(0, 255)
