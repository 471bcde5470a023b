"""What every source of image files (folders, Hugging Face datasets, shards) does to a decoded image: timm's
transforms (RandomResizedCrop, flip, RandAugment for training; resize and centre crop for evaluation) with
ImageNet's normalisation, so that the same config trains the same way whatever the images are stored in."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torchvision.transforms as T
from PIL import Image
from timm.data import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD, create_transform
from timm.data import auto_augment as timm_augment
from timm.data.transforms_factory import transforms_imagenet_train

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
    """A PIL image to a normalised (C, img_size, img_size) tensor, augmented when `train`: timm's crop and flip,
    then `augmentation`, as timm's create_transform orders them."""
    settings = dict(crop_pct=crop_pct, interpolation=interpolation, mean=mean, std=std)
    if not train:
        return create_transform(img_size, is_training=False, **settings)
    crop, _, to_tensor = create_transform(
        img_size,
        is_training=True,
        color_jitter=None,  # timm's default adds ColorJitter(0.4) when auto_augment is null, which means none
        hflip=0.5 if flip else 0.0,
        separate=True,
        **settings,
    )
    augment = [augmentation(auto_augment, mean, img_size, interpolation)] if auto_augment else []
    return T.Compose([*crop.transforms, *augment, *to_tensor.transforms])


def augmentation(policy: str, mean: Sequence[float], img_size: int = 224, interpolation: str = "random") -> Callable:
    """timm's RandAugment, AutoAugment or AugMix that `policy` names (data.auto_augment), built as timm's
    create_transform builds it (filling with the data's mean, absolute translations scaled to img_size), with our
    fixes to timm's ops (`posterize`): the one augmentation of square images and of images at their own size."""
    _, augment, _ = transforms_imagenet_train(
        img_size,
        hflip=0.0,
        color_jitter=None,
        auto_augment=policy,
        interpolation=interpolation,
        mean=mean,
        separate=True,
    )
    (stage,) = augment.transforms
    for op in _augment_ops(stage):
        op.aug_fn = FIXED_OPS.get(op.aug_fn, op.aug_fn)
    return stage


def posterize(image: Image.Image, bits_to_keep: int, **kwargs) -> Image.Image:
    """timm's posterize, where keeping 0 bits (RandAugment's increasing posterize at magnitude 10, which mstd
    noise reaches for ~2% of draws) gives a black image as Pillow < 13 did; Pillow 13 raises, stopping a run."""
    if bits_to_keep <= 0:
        return Image.new(image.mode, image.size)
    return timm_augment.posterize(image, bits_to_keep, **kwargs)


FIXED_OPS = {timm_augment.posterize: posterize}  # timm's op -> ours


def _augment_ops(transform: Callable) -> list[timm_augment.AugmentOp]:
    """The AugmentOps of a RandAugment, AutoAugment or AugMix stage, or of those stages in a composed transform."""
    ops = []
    for stage in getattr(transform, "transforms", [transform]):
        ops += getattr(stage, "ops", [])  # RandAugment, AugMixAugment
        ops += [op for sub_policy in getattr(stage, "policy", []) for op in sub_policy]  # AutoAugment
    return [op for op in ops if isinstance(op, timm_augment.AugmentOp)]
