"""Our training checkpoints, the .ckpt files a training run writes (Lightning's, read without running code): their
parts checked once, with one set of messages, for the loader (load.py builds their network) and for a run that
resumes one (vit.training.run compares it with its own network and optimizer)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vit.interop.files import CheckpointError, read
from vit.model import ConfigError, ViTConfig


class NotATrainingCheckpoint(CheckpointError):
    """A readable checkpoint that lacks a training checkpoint's parts: someone else's file, or one edited by hand."""


@dataclass(frozen=True)
class TrainingCheckpoint:
    config: ViTConfig  # the network, from hyper_parameters["model"]
    hyper_parameters: dict[str, Any]  # ViTClassifier's arguments: model, optim, finetune, test-time views, ...
    state_dict: dict[str, Any]  # the Lightning module's: the network's weights are "model.*"


def recorded_config(values: Any, path: Path) -> ViTConfig:
    """The ViTConfig a file of ours records (a training checkpoint's hyper_parameters, an export's metadata), or
    the reason it is not one, naming the file."""
    try:
        return ViTConfig.from_dict(values)
    except (ConfigError, TypeError) as err:
        raise CheckpointError(f"{path}: its model configuration is invalid: {err}") from None


def read_training_checkpoint(path: Path, contents: dict[str, Any] | None = None) -> TrainingCheckpoint:
    """The training checkpoint at `path` (its `contents`, where the caller has read them already), its parts
    checked: hyper_parameters, their model and the state dict are mappings, the model a valid ViTConfig."""
    contents = read(path) if contents is None else contents
    hparams = contents.get("hyper_parameters")
    parts = {
        "hyper_parameters": hparams,
        "hyper_parameters.model": hparams.get("model") if isinstance(hparams, dict) else None,
        "state_dict": contents.get("state_dict"),
    }
    for entry, value in parts.items():
        if not isinstance(value, dict):
            what = f"a {type(value).__name__}" if value is not None else "missing"
            raise NotATrainingCheckpoint(f"{path}: not a vit training checkpoint ({entry} is {what}, not a mapping)")
    config = recorded_config(parts["hyper_parameters.model"], path)
    return TrainingCheckpoint(config, hparams, parts["state_dict"])
