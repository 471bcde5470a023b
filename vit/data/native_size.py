"""Images at their own size and aspect ratio (NaFlex; data.max_tokens): the batch is a list of (C, H_i, W_i)
images, each resized, keeping its aspect ratio, to the largest grid of whole patches within the token budget, and
the network packs their patches (VisionTransformer.forward_packed).

In the loader's workers an image is augmented (RandAugment and a flip, as the square pipeline minus its crop) and
resized to its grid of the network's patches (FitToGrid), as timm's NaFlex transforms do: the run gives the data
module the network's patch size before it reads any image. The same transform, without the augmentation, reads an
image for prediction (vit.checkpoint.Loaded.preprocess)."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from functools import lru_cache
from typing import Any

import torch
import torch.nn.functional as F
import torchvision.transforms as T
from PIL import Image
from timm.data.naflex_transforms import get_image_size_for_seq
from torch import Tensor
from torch.utils.data import default_collate

from vit.data.encoded.transforms import augmentation


def budget_grid(height: int, width: int, patch: Sequence[int], max_tokens: int) -> tuple[int, int]:
    """The grid (h, w) of whole patches for an image of height x width pixels: timm's NaFlex rule
    (get_image_size_for_seq), the largest scale s with ceil(H s / p_h) * ceil(W s / p_w) <= max_tokens, found by
    bisection: the aspect ratio kept as well as whole patches allow, shrunk or enlarged to the budget. Remembered
    per size: a loader asks it of every image, and a bisection costs about as much as decoding a small image."""
    return _budget_grid(int(height), int(width), (int(patch[0]), int(patch[1])), int(max_tokens))


@lru_cache(maxsize=1 << 16)
def _budget_grid(height: int, width: int, patch: tuple[int, int], max_tokens: int) -> tuple[int, int]:
    _, (h, w) = get_image_size_for_seq((height, width), patch, max_tokens)
    return h // patch[0], w // patch[1]


def fit(image: Tensor, patch: Sequence[int], max_tokens: int) -> Tensor:
    """FitToGrid of an image already a tensor (C, H, W) -> (C, h p_h, w p_w), bilinearly with antialiasing;
    (B, C, H, W) images of one size alike."""
    h, w = budget_grid(image.shape[-2], image.shape[-1], patch, max_tokens)
    size = (h * patch[0], w * patch[1])
    if tuple(image.shape[-2:]) == size:
        return image
    batch = image if image.dim() == 4 else image.unsqueeze(0)
    resized = F.interpolate(batch, size=size, mode="bilinear", antialias=True, align_corners=False)
    return resized if image.dim() == 4 else resized[0]


def per_shape(images: Sequence[Tensor], fn: Callable[[Tensor], Tensor]) -> list[Tensor]:
    """fn of the images of each shape stacked (B, C, H, W) -> (B, ...), returned image by image in their order: a
    batch's few shapes cost a few calls, not one an image."""
    out: list[Tensor] = list(images)
    shapes: dict[tuple[int, ...], list[int]] = {}
    for i, image in enumerate(images):
        shapes.setdefault(tuple(image.shape), []).append(i)
    for indices in shapes.values():
        for i, result in zip(indices, fn(torch.stack([images[i] for i in indices])), strict=True):
            out[i] = result
    return out


class FitToGrid:
    """A PIL image resized to its budget_grid of `patch` pixels, (h p_h, w p_w), bilinearly (PIL's filter widens
    when it shrinks: antialiased)."""

    def __init__(self, patch: Sequence[int], max_tokens: int):
        self.patch, self.max_tokens = tuple(patch), max_tokens

    def __call__(self, image: Image.Image) -> Image.Image:
        h, w = budget_grid(image.height, image.width, self.patch, self.max_tokens)
        size = (w * self.patch[1], h * self.patch[0])  # PIL's (width, height)
        return image if image.size == size else image.resize(size, Image.BILINEAR)


def native_transform(
    train: bool,
    max_tokens: int,
    patch: Sequence[int],
    auto_augment: str | None,
    flip: bool,
    mean: Sequence[float],
    std: Sequence[float],
) -> T.Compose:
    """The square pipeline's augmentation without its crop and resize (training), none (evaluation); then FitToGrid,
    ToTensor and Normalize, the shape every source's pipeline takes (vit/data/encoded/decoding.py)."""
    stages: list[Any] = []
    if train and auto_augment:
        stages.append(augmentation(auto_augment, mean))
    if train and flip:
        stages.append(T.RandomHorizontalFlip())
    return T.Compose([*stages, FitToGrid(patch, max_tokens), T.ToTensor(), T.Normalize(mean, std)])


class ImageList(list):
    """A batch's images of their own sizes, (C, H_i, W_i) each, that leave a loader's worker as one tensor: pickled
    one by one, each image would pass its own shared-memory handle, a socket connection an image (NOTES.md change
    49). The main process receives the plain list, each image a view."""

    def __reduce__(self) -> tuple[Any, ...]:
        if not self or len({(image.dtype, image.device) for image in self}) > 1:
            return list, (list(self),)
        flat = torch.cat([image.reshape(-1) for image in self])
        return _images_of, (flat, [tuple(image.shape) for image in self])


def _images_of(flat: Tensor, shapes: list[tuple[int, ...]]) -> list[Tensor]:
    """ImageList's images back out of their one tensor."""
    parts = flat.split([math.prod(shape) for shape in shapes])
    return [part.view(shape) for part, shape in zip(parts, shapes, strict=True)]


def collate_native(samples: list[tuple[Tensor, int | Tensor]]) -> tuple[list[Tensor], Tensor]:
    """A batch of images of their own sizes: the list of (C, H_i, W_i) (an ImageList), and the labels (B,) or
    multi-hot targets (B, K)."""
    return ImageList(image for image, _ in samples), default_collate([label for _, label in samples])
