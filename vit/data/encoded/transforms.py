"""What every source of image files (folders, Hugging Face datasets, shards) does to a decoded image: timm's
transforms (RandomResizedCrop, flip, RandAugment for training; resize and centre crop for evaluation) with
ImageNet's normalisation, so that the same config trains the same way whatever the images are stored in."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from PIL import Image
from timm.data import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD, create_transform
from timm.data import auto_augment as timm_augment

LUMA = (0.299, 0.587, 0.114)  # ITU-R 601 weights, those of PIL's convert("L")


def normalization(channels: int) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """ImageNet's per-channel mean and std, or for grayscale those of its luma: the mean exactly (luma is
    linear), the std as the weighted stds, exact for perfectly correlated channels and close for photographs."""
    if channels == 3:
        return tuple(IMAGENET_DEFAULT_MEAN), tuple(IMAGENET_DEFAULT_STD)
    mean = sum(w * m for w, m in zip(LUMA, IMAGENET_DEFAULT_MEAN, strict=True))
    std = sum(w * s for w, s in zip(LUMA, IMAGENET_DEFAULT_STD, strict=True))
    return (mean,), (std,)


def image_transform(
    img_size: int,
    train: bool,
    auto_augment: str | None,
    flip: bool,
    crop_pct: float,
    interpolation: str,
    mean: Sequence[float],
    std: Sequence[float],
) -> Callable:
    """A PIL image to a normalised (C, img_size, img_size) tensor, augmented when `train`."""
    transform = create_transform(
        img_size,
        is_training=train,
        auto_augment=auto_augment if train else None,
        color_jitter=None,  # timm's default adds ColorJitter(0.4) when auto_augment is null, which means none
        hflip=0.5 if flip else 0.0,
        crop_pct=crop_pct,
        interpolation=interpolation,
        mean=mean,
        std=std,
    )
    for op in _augment_ops(transform):
        if op.aug_fn is timm_augment.posterize:
            op.aug_fn = posterize
    return transform


def posterize(image: Image.Image, bits_to_keep: int, **kwargs) -> Image.Image:
    """timm's posterize, where keeping 0 bits (RandAugment's increasing posterize at magnitude 10, which mstd
    noise reaches for ~2% of draws) gives a black image as Pillow < 13 did; Pillow 13 raises, stopping a run."""
    if bits_to_keep <= 0:
        return Image.new(image.mode, image.size)
    return timm_augment.posterize(image, bits_to_keep, **kwargs)


def _augment_ops(transform: Callable) -> list[timm_augment.AugmentOp]:
    """The AugmentOps of the RandAugment, AutoAugment or AugMix stages in a composed transform."""
    ops = []
    for stage in getattr(transform, "transforms", []):
        ops += getattr(stage, "ops", [])  # RandAugment, AugMixAugment
        ops += [op for sub_policy in getattr(stage, "policy", []) for op in sub_policy]  # AutoAugment
    return [op for op in ops if isinstance(op, timm_augment.AugmentOp)]
