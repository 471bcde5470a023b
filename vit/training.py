"""train(cfg): fit, test the best checkpoint, and write the run's outputs. train.py wraps it in Hydra;
tests call it directly with a composed config."""

from __future__ import annotations

import dataclasses
import inspect
import json
import logging
import os
import sys
import warnings
from pathlib import Path
from typing import Any

import lightning as L
import torch
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from hydra.utils import get_class, instantiate
from lightning.pytorch.callbacks import ModelCheckpoint, TQDMProgressBar
from lightning.pytorch.loggers import Logger
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException
from timm.data import Mixup

from vit.callbacks import EMA, THROUGHPUT, EpochLine, TrainingClock
from vit.checkpoint import AtomicCheckpointIO, read
from vit.config import ConfigError, ViTConfig
from vit.finetune import load_pretrained_
from vit.module import TEST_ACC, TEST_ACC5, VAL_ACC, VAL_SAMPLES, ViTClassifier
from vit.optim import OptimConfig
from vit.resume import LAST, BestCheckpoint, ExactResume, Preemption, resume_path

log = logging.getLogger(__name__)

RESULTS_FILE = "results.json"
CHECKPOINT_DIR = "checkpoints"
MATMUL_PRECISIONS = ("highest", "high", "medium")  # torch.set_float32_matmul_precision
NVML_CUDA_CHECK = "PYTORCH_NVML_BASED_CUDA_CHECK"  # set to "1" by `import lightning`
PRETRAINED = "pretrained"  # model.pretrained: a checkpoint to start from (vit/finetune.py); not a ViTConfig field


def model_fields(cfg: DictConfig) -> tuple[dict[str, Any], str | None]:
    """cfg.model as ViTConfig fields, and the pretrained checkpoint path if one is set."""
    fields = OmegaConf.to_container(cfg.model, resolve=True)
    return fields, fields.pop(PRETRAINED, None)


@dataclasses.dataclass(frozen=True)
class RunSwitches:
    """The top-level switches of conf/train.yaml, typed, so that `seed=abc` or `label_smoothing=high` is named
    before any work instead of failing inside a training step. No defaults: conf/train.yaml holds them."""

    seed: int
    matmul_precision: str
    label_smoothing: float
    mixup: dict[str, Any] | None  # timm.data.Mixup's arguments
    ema_decay: float | None
    compile: bool
    resume: str | None

    def __post_init__(self) -> None:
        if self.matmul_precision not in MATMUL_PRECISIONS:
            raise ConfigError(f"matmul_precision={self.matmul_precision!r} is not one of {MATMUL_PRECISIONS}")
        if not 0 <= self.label_smoothing < 1:
            raise ConfigError(f"label_smoothing={self.label_smoothing} must be in [0, 1)")
        if self.ema_decay is not None and not 0 < self.ema_decay < 1:
            raise ConfigError(f"ema_decay={self.ema_decay} must be in (0, 1), or null for no average")

    @classmethod
    def check(cls, cfg: DictConfig) -> None:
        values = {f.name: cfg.get(f.name) for f in dataclasses.fields(cls)}
        try:
            typed = OmegaConf.to_container(OmegaConf.merge(OmegaConf.structured(cls), values))
        except OmegaConfBaseException as err:
            raise ConfigError(f"{err.full_key}: {str(err.msg).splitlines()[0]}") from None
        cls(**typed)


def check_config(cfg: DictConfig) -> None:
    """Fail before any data or device work: every value resolves, no required value is missing,
    and the model can be built. Messages name the full key."""
    try:
        missing = sorted(OmegaConf.missing_keys(cfg))
    except OmegaConfBaseException as err:  # a key that interpolates a missing value
        raise ConfigError(f"{err.msg} (needed by {err.full_key})") from None
    if missing:
        raise ConfigError(
            f"missing value(s) for {', '.join(missing)}: set them on the command line, e.g. {missing[0]}=..."
        )
    try:
        OmegaConf.resolve(cfg)
    except Exception as err:  # an interpolation that does not resolve, with its full key
        raise ConfigError(f"config does not resolve: {err}") from None
    fields, pretrained = model_fields(cfg)
    try:
        ViTConfig.from_dict(fields)
    except ConfigError as err:
        raise ConfigError(str(err).replace("ViTConfig.", "model.")) from None
    if pretrained is not None and not Path(pretrained).exists():
        raise ConfigError(f"model.pretrained={pretrained}: no such file or folder")
    OptimConfig.from_dict(OmegaConf.to_container(cfg.optim))
    RunSwitches.check(cfg)
    _check_arguments(cfg.data, "data")
    _check_arguments(cfg.trainer, "trainer")
    if cfg.trainer.get("max_steps", -1) not in (-1, None):
        raise ConfigError(
            f"trainer.max_steps={cfg.trainer.max_steps}: runs are counted in epochs here (trainer.max_epochs; "
            "trainer.limit_train_batches for shorter epochs): the schedule's warm-up is in epochs, and Lightning 2.6 "
            "resumes an end-of-epoch checkpoint wrongly under max_steps (it repeats the epoch's end, skips an epoch)"
        )
    if cfg.mixup:  # train() passes label_smoothing and num_classes itself
        _check_arguments(cfg.mixup, "mixup", Mixup, taken=("label_smoothing", "num_classes"))


def _check_arguments(node: DictConfig, key: str, target: Any = None, taken: tuple[str, ...] = ()) -> None:
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


def build(cfg: DictConfig) -> tuple[L.LightningDataModule, ViTClassifier, L.Trainer]:
    """Instantiate the data module, the Lightning module and the trainer from the config, reading no data."""
    output_dir = Path(cfg.output_dir)
    datamodule = instantiate(cfg.data)
    fields, pretrained = model_fields(cfg)
    module = ViTClassifier(
        model=fields,
        optim=OmegaConf.to_container(cfg.optim),
        label_smoothing=cfg.label_smoothing,
        mixup=OmegaConf.to_container(cfg.mixup) if cfg.mixup else None,
        compile=cfg.compile,
    )
    if pretrained is not None:
        for change in load_pretrained_(module.model, pretrained):
            log.info("pretrained %s: %s", pretrained, change)
    folder = output_dir / CHECKPOINT_DIR
    # best.ckpt, never best-v1.ckpt: a second run in a fixed hydra.run.dir replaces the first one's (the README's
    # and the examples' path), as last.ckpt is replaced; a resumed run carries the earlier run's best over
    checkpoint = BestCheckpoint(
        dirpath=folder, filename="best", monitor=VAL_ACC, mode="max", enable_version_counter=False
    )
    # last.ckpt after every epoch, whether or not it was the best: Lightning's save_last=True skips epochs
    # that saved no top-k checkpoint, which would leave resume=auto an old state
    latest = ModelCheckpoint(dirpath=folder, filename=Path(LAST).stem, enable_version_counter=False)
    clock = TrainingClock()
    callbacks: list[L.Callback] = [checkpoint, latest, clock, ExactResume()]
    callbacks += [instantiate(c) for c in (cfg.callbacks or {}).values() if c is not None]
    if cfg.ema_decay:
        callbacks.append(EMA(cfg.ema_decay))
    interactive = sys.stdout.isatty()
    callbacks.append(TQDMProgressBar() if interactive else EpochLine(clock))
    callbacks.append(Preemption(folder))  # last: its checkpoint holds every other callback's update of the step
    loggers: list[Logger] = [instantiate(c, save_dir=str(output_dir)) for c in (cfg.logger or {}).values() if c]
    trainer = instantiate(
        cfg.trainer,
        callbacks=callbacks,
        logger=loggers or False,
        default_root_dir=str(output_dir),
        enable_progress_bar=interactive,
        use_distributed_sampler=False,  # the data modules choose their samplers (vit/data/loading.py)
        plugins=[AtomicCheckpointIO()],
    )
    return datamodule, module, trainer


def _multirun() -> bool:
    """Whether Hydra runs this job as part of a sweep (-m); False when train() is called without Hydra."""
    return HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN


def _find(callbacks: list[L.Callback], kind: type) -> Any:
    return next(c for c in callbacks if isinstance(c, kind))


def set_matmul_precision(precision: str) -> None:
    """torch.set_float32_matmul_precision for GPUs (TF32 on Ampere and later), with CPU matrix products left
    in full fp32: in torch 2.14 'high' also sends them to oneDNN's TF32 path, which on CPUs with AMX (Intel
    Xeon 4th gen+) measured 1.2x slower for the default model and 4.4x for a patch-4 one (benchmarks/NOTES.md)."""
    torch.set_float32_matmul_precision(precision)
    torch.backends.mkldnn.matmul.fp32_precision = "none"  # torch's default: no reduced precision


def drop_nvml_cuda_check() -> None:
    """Lightning sets NVML_CUDA_CHECK on import, so that asking whether CUDA is there does not initialise it before
    a fork. torch then asks NVML on each such call, and AdamW asks every step (its CUDA-graph capture check): on a
    machine without NVIDIA's driver the library fails to load each time, ~0.2 ms a step in a training loop
    (benchmarks/NOTES.md, change 15). Where no GPU is visible there is nothing for a fork to break, so the
    variable goes."""
    if os.environ.get(NVML_CUDA_CHECK) == "1" and not torch.cuda.is_available():
        del os.environ[NVML_CUDA_CHECK]


def train(cfg: DictConfig) -> dict[str, Any]:
    """Fit, test the best checkpoint, write config.yaml and results.json into cfg.output_dir; return results."""
    check_config(cfg)
    # the run folder holds Hydra's and our own files besides the CSV log, by design
    warnings.filterwarnings("ignore", message="Experiment logs directory .* exists and is not empty")
    output_dir = Path(cfg.output_dir)
    resume = resume_path(cfg.resume, output_dir, _multirun(), OmegaConf.to_container(cfg, resolve=True))
    if resume is not None:
        read(resume)  # a truncated, corrupt or code-carrying file is refused here, naming it
        log.info("resuming from %s", resume)
    output_dir.mkdir(parents=True, exist_ok=True)
    L.seed_everything(cfg.seed, workers=True)
    set_matmul_precision(cfg.matmul_precision)
    drop_nvml_cuda_check()
    datamodule, module, trainer = build(cfg)
    checkpoint, clock = trainer.checkpoint_callback, _find(trainer.callbacks, TrainingClock)
    if trainer.is_global_zero:
        (output_dir / "config.yaml").write_text(OmegaConf.to_yaml(cfg, resolve=True))

    trainer.fit(module, datamodule=datamodule, ckpt_path=resume, weights_only=True)
    fit_metrics = {k: float(v) for k, v in trainer.callback_metrics.items()}
    # testing restores the best checkpoint's callback and module state, the clock's and skip count's included:
    # read what the whole fit measured first
    seconds, skipped = clock.seconds, module.skipped_steps
    best = checkpoint.best_model_path or None
    tested = trainer.test(module, datamodule=datamodule, ckpt_path=best, weights_only=True)
    test_metrics = tested[0] if tested else {}

    results = {
        "test_acc": test_metrics.get(TEST_ACC),
        "test_acc5": test_metrics.get(TEST_ACC5),
        "best_val_acc": float(checkpoint.best_model_score) if checkpoint.best_model_score is not None else None,
        "val_samples": fit_metrics.get(VAL_SAMPLES),
        "epochs": trainer.current_epoch,
        "global_steps": trainer.global_step,
        "train_seconds": round(seconds, 3),
        "train_images_per_second": fit_metrics.get(THROUGHPUT),
        "params": sum(p.numel() for p in module.model.parameters()),
        "skipped_steps": skipped,
        "bad_images": len(getattr(datamodule, "bad_images", [])),
        "resumed_from": str(resume) if resume else None,
        "best_checkpoint": best,
        "output_dir": str(output_dir),
    }
    if trainer.is_global_zero:
        (output_dir / RESULTS_FILE).write_text(json.dumps(results, indent=2) + "\n")
        log.info("results: %s", json.dumps(results))
    return results
