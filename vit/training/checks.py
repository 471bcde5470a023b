"""Config checks made before any data or device work, so that a mistake is one line naming the key; check_config
returns the run's settings, each group typed and checked once (vit/training/settings.py). A feature's own checks,
and its refusals of what it cannot compose with, are its own (FEATURE_CHECKS)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from vit.data.errors import DataError
from vit.interop.hub import is_hub_name
from vit.model.config import ConfigError, ViTConfig
from vit.model.size import check_memory
from vit.training.data_checks import (
    check_arguments,
    check_batch_memory,
    check_data_values,
    check_follows_data,
    check_types,
    presets_that_fit,
    shown,
)
from vit.training.finetune import FrozenWeights
from vit.training.loggers import check_logger_packages
from vit.training.native_size import NativeSize
from vit.training.settings import Settings, model_fields
from vit.training.sharding import is_sharded
from vit.training.tasks import TASKS, TaskConfig

DATA_FAULTS = (DataError, FileNotFoundError)  # what the data's own checks raise, each naming the file or key
FEATURE_CHECKS: tuple[Callable[[Settings, DictConfig], None], ...] = (
    FrozenWeights.check,
    NativeSize.check,
    TaskConfig.check,
)


def check_config(cfg: DictConfig) -> Settings:
    """Fail before any device work: every value resolves (data.num_classes by reading the data's classes), no
    required value is missing, the model can be built and tells the data's classes apart. Messages name the
    full key. Returns the run's settings."""
    try:
        missing = sorted(OmegaConf.missing_keys(cfg))
    except OmegaConfBaseException as err:  # a key that interpolates a missing value
        raise (
            data_fault(err) or _config_fault(err) or ConfigError(f"{_first_line(err)} (needed by {err.full_key})")
        ) from None
    if missing:
        raise ConfigError(
            f"missing value(s) for {', '.join(missing)}: set them on the command line, e.g. {missing[0]}=..."
        )
    try:
        OmegaConf.resolve(cfg)
    except Exception as err:  # an interpolation that does not resolve, with its full key
        where = f" (needed by {err.full_key})" if isinstance(err, OmegaConfBaseException) else ""
        raise (
            data_fault(err) or _config_fault(err) or ConfigError(f"config does not resolve: {_first_line(err)}{where}")
        ) from None
    fields, pretrained = model_fields(cfg)
    check_follows_data(fields, cfg.data)
    if pretrained is not None and not Path(pretrained).exists() and not is_hub_name(pretrained):
        raise ConfigError(
            f"model.pretrained={pretrained}: no such file or folder (nor a hub name: hf-hub:ORG/REPO, torchvision:ARCH)"
        )
    config = None
    if pretrained is None:  # else the file is the network, checked against the run when it is read
        try:
            config = ViTConfig.from_dict(fields)
        except ConfigError as err:
            raise ConfigError(str(err).replace("ViTConfig.", "model.") + presets_that_fit(fields)) from None
        check_memory(config, where="model.")  # model.depth=1000000 would fill the memory before failing
        check_whole_patches(config, presets_that_fit(fields))
    # before the run's switches, some of which follow data keys (test_time_shift); an unknown task: Settings.of
    task = TASKS.get(cfg.get("task", {}).get("kind"))
    check_data_values(cfg.data, classifies=task is None or task.learns_labels)
    settings = Settings.of(cfg, model=config)
    _check_trainer(cfg.trainer)
    check_logger_packages(cfg.get("logger"))
    for check in FEATURE_CHECKS:
        check(settings, cfg.data)
    check_batch_memory(cfg.data, settings.switches.test_time_shift)
    return settings


def check_whole_patches(config: ViTConfig, hint: str = "", source: ViTConfig | None = None) -> None:
    """A run's images are whole numbers of patches: the network would leave the last rows and columns out, as timm's
    does for a checkpoint made so (SigLIP so400m at 384 px, patch 14), which a run trains with only where its
    pretrained `source` was made so too."""
    (ih, iw), (ph, pw) = config.img_size, config.patch_size
    if (ih % ph or iw % pw) and (source is None or not (source.img_size[0] % ph or source.img_size[1] % pw)):
        said = "" if source is None else "the pretrained network cannot take this run's settings: "
        raise ConfigError(
            f"{said}model.img_size={ih}x{iw} is not divisible by patch_size={ph}x{pw} (each side of a run's images "
            f"must be a whole number of patches){hint}"
        )


def _check_trainer(trainer: DictConfig) -> None:
    """The trainer group's keys and numbers, and what the machine and the strategy allow of them."""
    check_arguments(trainer, "trainer")
    check_types(trainer, "trainer")
    for key, (allowed, words) in TRAINER_NUMBERS.items():
        if key in trainer and isinstance(trainer[key], (int, float, type(None))) and not allowed(trainer[key]):
            raise ConfigError(f"trainer.{key}={shown(trainer[key])}: must be {words}")
    if trainer.get("accelerator") in ("gpu", "cuda") and not torch.cuda.is_available():  # else torch's traceback
        raise ConfigError(
            f"trainer.accelerator={trainer.accelerator}, but torch sees no GPU here: add trainer=cpu "
            "(or trainer.accelerator=cpu)"
        )
    if is_sharded(trainer) and str(trainer.get("precision")) not in ("32-true", "32"):
        raise ConfigError(
            f"trainer.precision={trainer.precision} with trainer=fsdp: FSDP2 computes in "
            "trainer.strategy.param_dtype (bf16, fp16, or null for fp32) with fp32 master weights; keep "
            "trainer.precision=32-true"
        )
    if trainer.get("max_steps", -1) not in (-1, None):
        raise ConfigError(
            f"trainer.max_steps={trainer.max_steps}: runs are counted in epochs here (trainer.max_epochs; "
            "trainer.limit_train_batches for shorter epochs): the schedule's warm-up is in epochs, and Lightning 2.6 "
            "resumes an end-of-epoch checkpoint wrongly under max_steps (it repeats the epoch's end, skips an epoch)"
        )


# Trainer numbers that Lightning takes unchecked and then fails on in the first step (a division by zero: 0 batches
# to accumulate, logging every 0 steps), runs on for 1000 epochs (max_epochs=null) or forever (-1), or quietly
# ignores (a negative clipping norm): the values allowed, in words. Lightning checks the others itself (build()).
TRAINER_NUMBERS: dict[str, tuple[Callable[[Any], bool], str]] = {
    "max_epochs": (lambda v: v is not None and v >= 1, "a number of epochs >= 1 (the schedule needs an end)"),
    "accumulate_grad_batches": (lambda v: v >= 1, "a number of batches >= 1"),
    "log_every_n_steps": (lambda v: v is None or v >= 1, "a number of steps >= 1"),
    "check_val_every_n_epoch": (lambda v: v is None or v >= 1, "a number of epochs >= 1, or null"),
    "val_check_interval": (lambda v: v is None or v > 0, "a share of the epoch in (0, 1], or a number of batches"),
    "num_sanity_val_steps": (lambda v: v is None or v >= -1, "a number of batches >= 0, or -1 for all"),
    "gradient_clip_val": (lambda v: v is None or v >= 0, "a gradient norm >= 0 (0 or null: no clipping)"),
    "limit_train_batches": (lambda v: v is None or v > 0, "a share of the epoch in (0, 1], or a number of batches"),
}


def data_fault(err: Exception) -> Exception | None:
    """The data's own error (a missing folder, one without classes) behind OmegaConf's: a resolver that reads the
    data raised it, and OmegaConf keeps it only as the exception being handled when it raised its own."""
    return _behind(err, DATA_FAULTS)


def _config_fault(err: Exception) -> Exception | None:
    """A resolver's own ConfigError (vit.required's) behind OmegaConf's, which wraps it in three lines."""
    return _behind(err, (ConfigError,))


def _behind(err: Exception, kinds: tuple[type[Exception], ...]) -> Exception | None:
    """The first exception of `kinds` among those being handled when `err` and its predecessors were raised."""
    cause = err.__context__
    while cause is not None and not isinstance(cause, kinds):
        cause = cause.__context__
    return cause


def _first_line(err: Exception) -> str:
    """OmegaConf's message without the full_key and object_type lines it appends (the caller names the key)."""
    return str(getattr(err, "msg", None) or err).splitlines()[0]
