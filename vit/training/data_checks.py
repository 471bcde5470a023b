"""Checks of the data group made before any file is read: its keys are its data module's arguments, of the kinds
the module declares; its values are in range; the model's input and classes follow it; and the images its keys ask
a batch to hold fit in memory. Each mistake is one line naming the key."""

from __future__ import annotations

import inspect
import math
import types
import typing
from collections.abc import Sequence
from typing import Any

from hydra.utils import get_class
from omegaconf import DictConfig, ListConfig, OmegaConf

from vit.data.encoded.transforms import image_transform
from vit.model.config import ConfigError
from vit.model.presets import list_presets, preset_config
from vit.model.size import check_fits

# the model fields that are the data's shape, each with how a message counts it
FOLLOWS_DATA = {"num_classes": "{} classes", "img_size": "{}-pixel images", "in_chans": "{}-channel images"}


def check_follows_data(fields: dict[str, Any], data: DictConfig) -> None:
    """The model's input and outputs are the data's: a model.num_classes, img_size or in_chans typed by hand must
    agree with them. A model of 8-pixel inputs trained on 16-pixel images (its position table resampled at every
    step) reported the 16-pixel accuracy, while its checkpoint had predict and export read images at 8 pixels."""
    for key, count in FOLLOWS_DATA.items():
        if key not in data or _sides(fields.get(key)) == _sides(data[key]):
            continue
        where = f" in data.root={data.root}" if "root" in data else ""
        also = "" if key == "num_classes" else f"; data.{key} sets both"
        raise ConfigError(
            f"model.{key}={fields.get(key)}, but the data{where} has {count.format(data[key])} "
            f"(data.{key}): leave model.{key} out, it follows the data{also}"
        )


def _sides(value: Any) -> Any:
    """An image size as (height, width) whether given as one number or two; any other value as it is."""
    if isinstance(value, int) and not isinstance(value, bool):
        return (value, value)
    return tuple(value) if isinstance(value, Sequence) and not isinstance(value, str) else value


def presets_that_fit(fields: dict[str, Any]) -> str:
    """Where the model's patches do not tile the data's images (data=cifar10 alone keeps the default model's patch
    7, made for 28 px): the model presets whose patches do, as the command to add."""
    size = fields.get("img_size")
    sides = (size, size) if isinstance(size, int) else tuple(size or ())
    patch = fields.get("patch_size")
    if len(sides) != 2 or not patch or all(side % p == 0 for side, p in zip(sides, _pair(patch), strict=True)):
        return ""
    fit = [
        name
        for name in list_presets()
        if all(side % p == 0 for side, p in zip(sides, _pair(preset_config(name).patch_size), strict=True))
    ]
    return f"; a model preset whose patches fit {sides[0]}x{sides[1]} images: {', '.join(f'model={n}' for n in fit)}"


def _pair(value: int | Sequence[int]) -> tuple[int, int]:
    return (value, value) if isinstance(value, int) else (value[0], value[1])


IMAGE_CHANNELS = (1, 3)  # what images decode to ('L' or 'RGB'), for training and for predict alike


def check_data_values(data: DictConfig, classifies: bool = True) -> None:
    """The data group's keys, each an argument of its data module, and the values the data groups share, checked
    before any file is read (torch or timm would fail later, in a traceback, or a checkpoint reader would refuse the
    finished run's files). `classifies`: the task learns the data's classes (task=mae does not)."""
    check_arguments(data, "data")
    check_types(data, "data")
    for key in ("img_size", "batch_size", "eval_batch_size", "train_size", "test_size"):
        if key in data and not data[key] > 0:
            raise ConfigError(f"data.{key}={data[key]}: must be a positive whole number")
    for key in ("crop_padding", "noise", "val_size"):
        if key in data and data[key] < 0:
            raise ConfigError(f"data.{key}={data[key]}: must be >= 0")
    if "in_chans" in data and data.in_chans not in IMAGE_CHANNELS:
        raise ConfigError(f"data.in_chans={data.in_chans}: images are read as 1 (grayscale) or 3 (RGB) channels")
    if "crop_pct" in data and not 0 < data.crop_pct <= 1:
        raise ConfigError(f"data.crop_pct={data.crop_pct}: the share of the image evaluation keeps, in (0, 1]")
    if "val_fraction" in data and not 0 <= data.val_fraction < 1:
        raise ConfigError(f"data.val_fraction={data.val_fraction}: the share held out for validation, in [0, 1)")
    if classifies and "num_classes" in data and data.num_classes < 2:
        where = f" in data.root={data.root}" if "root" in data else ""
        raise ConfigError(
            f"data.num_classes={data.num_classes}{where}: a classifier needs at least 2 classes (images without "
            "labels pretrain with task=mae)"
        )
    if data.get("auto_augment"):
        try:
            image_transform(32, True, data.auto_augment, False, 1.0, "bicubic", (0.5,), (0.5,))
        except (AssertionError, ValueError, KeyError, IndexError) as err:  # timm's parser asserts
            raise ConfigError(
                f"data.auto_augment={data.auto_augment!r}: not a timm augmentation policy ({err})"
            ) from None


SCALARS = {int: (int,), float: (int, float), bool: (bool,), str: (str,), type(None): (type(None),)}


def check_types(node: DictConfig, name: str) -> None:
    """Each scalar setting under `name` of the kind its _target_'s constructor declares (`noise: float`,
    `split_seed: int`, the Trainer's `accumulate_grad_batches: int`), and finite: data.noise=abc or
    trainer.max_epochs=abc is named here, not met as a TypeError inside setup or the first step, and data.noise=nan
    no longer trains on NaN images."""
    hints: dict[str, Any] = {}
    for cls in reversed(get_class(node._target_).__mro__):  # a subclass's settings override its base's
        if "__init__" in vars(cls):
            try:
                hints |= typing.get_type_hints(cls.__init__)
            except NameError:  # an annotation naming what only a type checker imports
                continue
    for key, value in node.items():
        if key.startswith("_") or key not in hints:
            continue
        union = typing.get_origin(hints[key]) in (typing.Union, types.UnionType)
        kinds = typing.get_args(hints[key]) if union else (hints[key],)
        if not all(kind in SCALARS for kind in kinds):
            continue  # a container or a class: not a command-line scalar
        allowed = tuple(t for kind in kinds for t in SCALARS[kind])
        if not isinstance(value, allowed) or (isinstance(value, bool) and bool not in kinds):
            names = " or ".join("null" if kind is type(None) else kind.__name__ for kind in kinds)
            raise ConfigError(f"{name}.{key}={shown(value)}: must be {names}")
        if isinstance(value, float) and not math.isfinite(value):
            raise ConfigError(f"{name}.{key}={value}: must be a finite number")


def shown(value: Any) -> str:
    """A config value as the command line writes it: null, [16, 16] for a list (not ListConfig's repr)."""
    if value is None:
        return "null"
    return repr(OmegaConf.to_container(value) if isinstance(value, (DictConfig, ListConfig)) else value)


def check_arguments(node: DictConfig, key: str, target: Any = None, taken: tuple[str, ...] = ()) -> None:
    """Every setting under `key` must be an argument of `target` (default: the node's _target_): an experiment
    written for one data group can set keys that another group's module does not take (fashion_mnist_best's
    crop_padding, data=imagefolder); a misspelt Trainer or Mixup argument would fail after the data is read."""
    target = target or get_class(node._target_)
    parameters = inspect.signature(target).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
        return
    settings = [name for name in parameters if name not in taken]
    unknown = sorted(k for k in node if not k.startswith("_") and k not in settings)
    if unknown:
        where = f" ({key}._target_={node._target_})" if "_target_" in node else ""
        raise ConfigError(
            f"{', '.join(f'{key}.{k}' for k in unknown)}: not a setting of {target.__name__}{where}; "
            f"drop it with {' '.join(f'~{key}.{k}' for k in unknown)}, or choose another {key} group; "
            f"its settings: {', '.join(settings)}"
        )


def check_batch_memory(data: DictConfig, test_time_shift: int) -> None:
    """The images the data keys ask to hold at once must fit in this machine's memory, checked before any is made:
    data.img_size=70000 asked for 235 GB of images at the first batch (a network without a position table states
    no image size in its weights, so check_memory passes it), and data.crop_padding and test_time_shift pad every
    image of a batch by their pixels. Lower bounds: one batch as the pipeline makes it (uint8 padded crops, fp32
    inputs), and data.train_size / test_size images made up at once; the activations come on top."""
    if not {"img_size", "batch_size"} <= data.keys() or data.get("max_tokens") is not None:  # images at own sizes
        return
    side, channels, pad = data.img_size, data.get("in_chans", 3), data.get("crop_padding", 0)
    images = f"images of data.img_size={side} pixels"
    train, evaluation = data.batch_size, data.get("eval_batch_size", data.batch_size)
    shift, made_up = test_time_shift, max(data.get("train_size", 0), data.get("test_size", 0))
    for need, what in (
        (4 * train * channels * side**2, f"data.batch_size={train} {images}"),
        (train * channels * (2 * pad + 1) ** 2, f"data.crop_padding={pad} around data.batch_size={train} images"),
        (4 * evaluation * channels * (side + 2 * shift) ** 2, f"test_time_shift={shift} around "
         f"data.eval_batch_size={evaluation} {images}"),
        (4 * made_up * channels * side**2, f"data.train_size={data.get('train_size')}, data.test_size="
         f"{data.get('test_size')} {images}"),
    ):  # fmt: skip
        check_fits(need, what)
