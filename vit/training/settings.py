"""A run's settings as typed objects: each config group a frozen dataclass that checks itself once as it is built
(ViTConfig, OptimConfig, FinetuneConfig, DistillConfig, MixupConfig, TaskConfig, and the top-level switches,
RunSwitches), built from the composed config by `Settings.of` and handed to the run's parts as they are, so that
nothing reads or checks a raw config node twice. vit/training/registry.py stores each group's defaults in Hydra's
ConfigStore, so that conf/ states only what differs and every field can be overridden."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from vit.interop.frozen import FinetuneConfig
from vit.model.config import ConfigError, ViTConfig
from vit.training.distill import DistillConfig
from vit.training.mixup import MixupConfig
from vit.training.optim import OptimConfig
from vit.training.tasks import TaskConfig

MATMUL_PRECISIONS = ("highest", "high", "medium")  # torch.set_float32_matmul_precision
MAX_SEED = 2**32 - 1  # Lightning's seed_everything seeds numpy too, which takes 32-bit unsigned seeds only
PRETRAINED = "pretrained"  # model.pretrained: a checkpoint to start from, not a ViTConfig field


@dataclasses.dataclass(frozen=True)
class RunSwitches:
    """The top-level switches of conf/train.yaml, typed, so that `seed=abc` or `label_smoothing=high` is named
    before any work instead of failing inside a training step. No defaults: conf/train.yaml holds them."""

    seed: int
    matmul_precision: str
    label_smoothing: float
    ema_decay: float | None
    compile: bool
    grad_checkpointing: bool
    test_time_flip: bool
    test_time_shift: int
    pretrained_stats: bool
    resume: str | None

    def __post_init__(self) -> None:
        if not 0 <= self.seed <= MAX_SEED:
            raise ConfigError(f"seed={self.seed}: must be a whole number from 0 to {MAX_SEED} (numpy's seeds)")
        if self.matmul_precision not in MATMUL_PRECISIONS:
            raise ConfigError(f"matmul_precision={self.matmul_precision!r} is not one of {MATMUL_PRECISIONS}")
        if not 0 <= self.label_smoothing < 1:
            raise ConfigError(f"label_smoothing={self.label_smoothing} must be in [0, 1)")
        if self.ema_decay is not None and not 0 < self.ema_decay < 1:
            raise ConfigError(f"ema_decay={self.ema_decay} must be in (0, 1), or null for no average")
        if self.test_time_shift < 0:
            raise ConfigError(f"test_time_shift={self.test_time_shift} must be a number of pixels >= 0")

    @classmethod
    def of(cls, cfg: DictConfig) -> RunSwitches:
        values = {f.name: cfg.get(f.name) for f in dataclasses.fields(cls)}
        try:  # OmegaConf's typing of the values first: seed=abc is its one line, not a TypeError below
            typed = OmegaConf.to_container(OmegaConf.merge(OmegaConf.structured(cls), values))
        except OmegaConfBaseException as err:
            raise ConfigError(f"{err.full_key}: {str(err.msg).splitlines()[0]}") from None
        return cls(**typed)


def model_fields(cfg: DictConfig) -> tuple[dict[str, Any], str | None]:
    """cfg.model as ViTConfig fields, and model.pretrained, the checkpoint to start from, if one is set."""
    fields = OmegaConf.to_container(cfg.model, resolve=True)
    return fields, fields.pop(PRETRAINED, None)


def group(kind: type, node: Mapping[str, Any] | None, key: str) -> Any:
    """The dataclass `kind` from a config group's mapping, naming a key it does not have; its own checks name the
    values at fault."""
    values = {k: v for k, v in dict(node or {}).items() if k != "_target_"}
    known = [f.name for f in dataclasses.fields(kind) if f.init]
    if unknown := sorted(set(values) - set(known)):
        raise ConfigError(
            f"{', '.join(f'{key}.{k}' for k in unknown)}: not a setting of {key}; drop it with "
            f"{' '.join(f'~{key}.{k}' for k in unknown)}; its settings: {', '.join(known)}"
        )
    try:
        return kind(**values)
    except TypeError as err:  # a value the dataclass's own checks compare with a number or a list
        raise ConfigError(f"{key}: {err}") from None


@dataclasses.dataclass(frozen=True)
class Settings:
    """A run's settings, each group typed and checked once. The network is `model`, or, with model.pretrained, the
    file's architecture with the run's own fields over it (`model_fields`), known once the file is read."""

    model: ViTConfig | None  # None until the pretrained file says the architecture
    model_fields: dict[str, Any]  # model.* as the config gives them
    pretrained: str | None  # model.pretrained
    optim: OptimConfig
    finetune: FinetuneConfig
    distill: DistillConfig
    mixup: MixupConfig | None
    task: TaskConfig
    switches: RunSwitches
    max_tokens: int | None  # data.max_tokens: images at their own size, within this many patches

    @staticmethod
    def of(cfg: DictConfig, model: ViTConfig | None = None) -> Settings:
        """From a composed, resolved config (check_config builds the model, where it is not a pretrained file's)."""
        fields, pretrained = model_fields(cfg)
        mixup = OmegaConf.to_container(cfg.mixup, resolve=True) if cfg.get("mixup") is not None else None
        return Settings(
            model=model,
            model_fields=fields,
            pretrained=pretrained,
            optim=OptimConfig.from_dict(OmegaConf.to_container(cfg.optim, resolve=True)),
            finetune=group(FinetuneConfig, cfg.get("finetune"), "finetune"),
            distill=group(DistillConfig, cfg.get("distill"), "distill"),
            mixup=MixupConfig.of(mixup),
            task=group(TaskConfig, cfg.get("task"), "task"),
            switches=RunSwitches.of(cfg),
            max_tokens=cfg.data.get("max_tokens"),
        )

    def record(self, config: ViTConfig, pretrained_from: dict[str, Any] | None) -> dict[str, Any]:
        """The settings a training checkpoint keeps (its hyper_parameters), as plain values that load with
        weights_only=True: what readers of the checkpoint need (the network, what learned from which file, the
        test-time views, the optimizer a resumed run must share) and a record of the recipe."""
        s = self.switches
        return {
            "model": config.to_dict(),
            "optim": _plain(dataclasses.asdict(self.optim)),
            "task": dataclasses.asdict(self.task),
            "label_smoothing": s.label_smoothing,
            "mixup": self.mixup.arguments() if self.mixup is not None else None,
            "compile": s.compile,
            "test_time_flip": s.test_time_flip,
            "test_time_shift": s.test_time_shift,
            "finetune": self.finetune.to_dict(),
            "pretrained_from": pretrained_from,  # a hub name's repo, commit and files, or the path
            "distill": dataclasses.asdict(self.distill) if self.distill.teacher else None,
            "max_tokens": self.max_tokens,
        }


def _plain(values: dict[str, Any]) -> dict[str, Any]:
    return {k: list(v) if isinstance(v, tuple) else v for k, v in values.items()}
