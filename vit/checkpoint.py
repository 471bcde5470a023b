"""The one way from a checkpoint file to a model: visualization (and every later reader) calls `load`.

Our Lightning checkpoints carry the model's ViTConfig (hyper_parameters["model"]), its weights
(state_dict, keys "model.*") and the data facts the model was trained with (DATA_FACTS: per-channel
mean and std, class names), so that an image is preprocessed the way training did. Files are read with
torch.load(weights_only=True) only: a checkpoint that would unpickle anything but tensors and plain
containers is refused, and nothing in it runs.
"""

from __future__ import annotations

import pickle
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from PIL import Image
from torch import Tensor

from vit.config import ConfigError, ViTConfig
from vit.data.images import to_channels
from vit.model import VisionTransformer
from vit.module import DATA_FACTS

MODEL_PREFIX = "model."  # ViTClassifier holds the network as self.model


class CheckpointError(ValueError):
    """A checkpoint that cannot be used; the message names the file."""


@dataclass(frozen=True)
class Loaded:
    """A model in eval mode and what it needs to read an image as training did."""

    model: VisionTransformer
    mean: tuple[float, ...]
    std: tuple[float, ...]
    classes: tuple[str, ...] | None
    path: Path

    @property
    def config(self) -> ViTConfig:
        return self.model.config

    def preprocess(self, image: Image.Image) -> Tensor:
        """A PIL image of any mode and size -> (1, C, H, W) float: converted to the model's channels, resized
        (aspect kept) to cover img_size and center-cropped, then normalized with the training statistics."""
        c = self.config
        (h, w), channels = c.img_size, c.in_chans
        image = to_channels(image, channels)
        scale = max(h / image.height, w / image.width)  # the smallest resize that covers (h, w)
        size = (max(w, round(image.width * scale)), max(h, round(image.height * scale)))
        image = image.resize(size, Image.Resampling.BICUBIC)
        left, top = (size[0] - w) // 2, (size[1] - h) // 2
        image = image.crop((left, top, left + w, top + h))
        pixels = torch.frombuffer(bytearray(image.tobytes()), dtype=torch.uint8)
        pixels = pixels.view(h, w, channels).permute(2, 0, 1).float() / 255  # (C, H, W)
        mean = torch.tensor(self.mean).view(-1, 1, 1)
        std = torch.tensor(self.std).view(-1, 1, 1)
        return ((pixels - mean) / std)[None]


def read(path: str | Path) -> dict[str, Any]:
    """The checkpoint's contents on the CPU, read without running any pickled code."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{path}: no such checkpoint file")
    try:
        contents = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as err:  # weights_only refused a global: it would have run code
        raise CheckpointError(
            f"{path}: refused: it pickles objects other than tensors and plain containers, which could run "
            f"code when loaded ({str(err).splitlines()[0] if str(err) else 'unsafe pickle'})"
        ) from None
    except (RuntimeError, EOFError, zipfile.BadZipFile, ValueError, OSError) as err:
        raise CheckpointError(f"{path}: not a readable checkpoint (truncated or corrupt?): {err}") from None
    if not isinstance(contents, dict):
        raise CheckpointError(f"{path}: holds a {type(contents).__name__}, not a checkpoint dictionary")
    return contents


def _floats(values: Sequence[float] | None, channels: int, what: str, path: Path) -> tuple[float, ...]:
    if values is None:
        return (0.5,) * channels  # no record of the training data: map [0, 1] to [-1, 1]
    values = tuple(float(v) for v in values)
    if len(values) == 1:
        return values * channels
    if len(values) != channels:
        raise CheckpointError(f"{path}: {DATA_FACTS}.{what} has {len(values)} values for {channels} channels")
    return values


def load(path: str | Path) -> Loaded:
    """Our Lightning checkpoint -> the model it trained (eval mode, CPU) with its data facts."""
    path = Path(path)
    contents = read(path)
    try:
        config = ViTConfig.from_dict(contents["hyper_parameters"]["model"])
        state = contents["state_dict"]
    except KeyError as err:
        raise CheckpointError(f"{path}: not a vit training checkpoint (no {err.args[0]!r} entry)") from None
    except ConfigError as err:
        raise CheckpointError(f"{path}: its model configuration is invalid: {err}") from None
    model = VisionTransformer(config)
    weights = {k.removeprefix(MODEL_PREFIX): v for k, v in state.items() if k.startswith(MODEL_PREFIX)}
    missing, unexpected = model.load_state_dict(weights, strict=False)
    if missing or unexpected:
        raise CheckpointError(
            f"{path}: weights do not match the model it describes: missing {sorted(missing)}, "
            f"unexpected {sorted(unexpected)}"
        )
    facts = contents.get(DATA_FACTS, {})
    classes = facts.get("classes")
    return Loaded(
        model=model.eval(),
        mean=_floats(facts.get("mean"), config.in_chans, "mean", path),
        std=_floats(facts.get("std"), config.in_chans, "std", path),
        classes=tuple(classes) if classes else None,
        path=path,
    )
