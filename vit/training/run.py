"""train(cfg): fit, test the best checkpoint, and write the run's outputs. train.py wraps it in Hydra;
tests call it directly with a composed config."""

from __future__ import annotations

import json
import logging
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import lightning as L
from hydra.core.hydra_config import HydraConfig
from hydra.errors import InstantiationException
from hydra.types import RunMode
from hydra.utils import instantiate
from lightning.fabric.utilities.exceptions import MisconfigurationException
from lightning.pytorch.callbacks import ModelCheckpoint, TQDMProgressBar
from lightning.pytorch.loggers import Logger
from omegaconf import DictConfig, OmegaConf

from vit.atomic import write_atomically
from vit.data.errors import DataError
from vit.data.loading import SplitDataModule
from vit.interop.files import CheckpointError, refuse_nonfinite
from vit.interop.finetune import Pretrained, describe, start_from
from vit.interop.load import load
from vit.interop.sharded import CONSOLIDATE, is_sharded_checkpoint, read_meta
from vit.interop.sharded import check as check_sharded
from vit.interop.training_checkpoint import NotATrainingCheckpoint, read_training_checkpoint
from vit.model import ConfigError, ViTConfig
from vit.training.best_checkpoint import BestCheckpoint
from vit.training.checkpoint_io import AtomicCheckpointIO
from vit.training.checks import check_config, check_whole_patches
from vit.training.clock import THROUGHPUT, TrainingClock
from vit.training.compiler import resolve_compile
from vit.training.distill import Distillation, FeatureDistillation
from vit.training.ema import EMA
from vit.training.epoch_line import EpochLine
from vit.training.exact_resume import ExactResume
from vit.training.feature import Feature
from vit.training.finetune import FrozenWeights
from vit.training.loggers import finish_runs
from vit.training.model_summary import NetworkSummary
from vit.training.module import VAL_SAMPLES, ViTClassifier
from vit.training.native_size import NativeSize
from vit.training.precision import resolve_precision
from vit.training.preemption import Preemption
from vit.training.process import quiet_lightning_adverts, tune_process
from vit.training.resume import resume_path
from vit.training.run_folder import CHECKPOINT_DIR, LAST, RESULTS_FILE, RUN_CONFIG
from vit.training.settings import Settings
from vit.training.sharding import is_sharded

log = logging.getLogger(__name__)


def _normalize_as_pretrained(datamodule: L.LightningDataModule, pretrained: Pretrained, use_its_stats: bool) -> None:
    """Fine-tuning feeds the network images normalised as in its pretraining (CLIP's mean and std for a CLIP
    tower, not ImageNet's), unless pretrained_stats=false; one log line says which it uses and why."""
    if not isinstance(datamodule, SplitDataModule):
        return
    stats = pretrained.normalization
    if not use_its_stats or isinstance(stats, str):
        why = "pretrained_stats=false" if isinstance(stats, tuple) else stats
        log.info("normalising with the data's mean %s and std %s (%s)", datamodule.mean, datamodule.std, why)
        return
    datamodule.normalize_with(*stats)
    log.info(
        "normalising with the pretrained file's mean %s and std %s, as its weights saw images "
        "(pretrained_stats=false: the data's own)",
        *stats,
    )


def network(settings: Settings) -> tuple[ViTConfig, Pretrained | None]:
    """The network the run builds, and the pretrained file it starts from, if any: the file is then the network,
    its architecture with the run's own fields (new classes, image size) over it."""
    if settings.pretrained is None:
        return settings.task.network(settings.model or ViTConfig.from_dict(settings.model_fields)), None
    pretrained = start_from(settings.pretrained, settings.model_fields, _command_line_model_keys())
    check_whole_patches(pretrained.config, source=pretrained.loaded.config)
    config = settings.task.network(pretrained.config)
    return config, replace(pretrained, config=config)


def features(settings: Settings, config: ViTConfig, pretrained: Pretrained | None) -> list[Feature]:
    """The run's features, each with its hooks into the module (vit/training/feature.py)."""
    source = None if pretrained is None else pretrained.source
    out: list[Feature] = [FrozenWeights(settings.finetune, source, pretrained is not None and pretrained.resized)]
    if settings.distill.teacher is not None:
        teacher = load(settings.distill.teacher)
        log.info("distilling from %s: %s", settings.distill.teacher, describe(teacher.config))
        kind = FeatureDistillation if settings.distill.target == "features" else Distillation
        out.append(kind(settings.distill, teacher, config))
    if settings.max_tokens is not None:
        out.append(NativeSize(settings.max_tokens))
    return out


def build(
    cfg: DictConfig, settings: Settings | None = None, built: tuple[ViTConfig, Pretrained | None] | None = None
) -> tuple[L.LightningDataModule, ViTClassifier, L.Trainer]:
    """Instantiate the data module, the Lightning module and the trainer from the config, reading no data.
    `settings`: check_config(cfg), and `built`: network(settings), where the caller has them already."""
    quiet_lightning_adverts()
    settings = settings or check_config(cfg)
    output_dir, switches = Path(cfg.output_dir), settings.switches
    datamodule = instantiate_setting(cfg.data, "data")
    config, pretrained = built or network(settings)
    datamodule.patch_size = config.patch_size  # images at their own size are fitted to the network's patches
    if pretrained is not None:
        log.info("pretrained %s: %s", pretrained.loaded.path, pretrained.architecture)
        _normalize_as_pretrained(datamodule, pretrained, switches.pretrained_stats)
    task = settings.task.build(config, switches.label_smoothing, settings.mixup)
    module = ViTClassifier(
        config,
        task,
        settings.optim,
        test_time_flip=switches.test_time_flip,
        test_time_shift=switches.test_time_shift,
        compile=resolve_compile(switches.compile, cfg.trainer.accelerator),
        features=features(settings, config, pretrained),
        record=settings.record(config, None if pretrained is None else pretrained.source),
    )
    module.model.set_grad_checkpointing(switches.grad_checkpointing)
    if pretrained is not None:
        for change in pretrained.fill_(module.model):
            log.info("pretrained %s: %s", pretrained.loaded.path, change)
        task.start_from(pretrained.loaded.path)
    module.adapt()  # after the starting weights: LoRA's layers wrap the loaded ones
    trainable, total = _parameter_counts(module)
    log.info(
        f"finetune={settings.finetune.kind}: {trainable:,} of {total:,} parameters learn ({trainable / total:.2%})"
    )
    folder = output_dir / CHECKPOINT_DIR
    # best.ckpt, never best-v1.ckpt: a second run in a fixed hydra.run.dir replaces the first one's (the README's
    # and the examples' path), as last.ckpt is replaced; a resumed run carries the earlier run's best over
    checkpoint = BestCheckpoint(
        dirpath=folder, filename="best", monitor=task.monitor, mode=task.mode, enable_version_counter=False
    )
    # last.ckpt after every epoch, whether or not it was the best: Lightning's save_last=True skips epochs
    # that saved no top-k checkpoint, which would leave resume=auto an old state. Lightning saves at validation
    # ends (inside epochs too, with val_check_interval < 1) or, when validation is not every epoch, only at those:
    # then at every training epoch's end instead
    every_epoch = cfg.trainer.get("check_val_every_n_epoch", 1) in (1, None)
    latest = ModelCheckpoint(
        dirpath=folder,
        filename=Path(LAST).stem,
        enable_version_counter=False,
        save_on_train_epoch_end=None if every_epoch else True,
    )
    clock = TrainingClock()
    callbacks: list[L.Callback] = [checkpoint, latest, clock, ExactResume()]
    callbacks += [
        instantiate_setting(c, f"callbacks.{name}") for name, c in (cfg.callbacks or {}).items() if c is not None
    ]
    if cfg.trainer.get("enable_model_summary", True):  # Lightning's table, with the network's FLOPs
        callbacks.append(NetworkSummary())
    if switches.ema_decay:
        callbacks.append(EMA(switches.ema_decay))
    interactive = sys.stdout.isatty()
    callbacks.append(TQDMProgressBar() if interactive else EpochLine(clock, task.monitor))
    callbacks.append(Preemption(folder))  # last: its checkpoint holds every other callback's update of the step
    loggers: list[Logger] = [
        instantiate_setting(c, f"logger.{name}", save_dir=str(output_dir))
        for name, c in (cfg.logger or {}).items()
        if c
    ]
    trainer = instantiate_setting(
        cfg.trainer,
        "trainer",
        precision=resolve_precision(cfg.trainer.precision, cfg.trainer.accelerator),
        callbacks=callbacks,
        logger=loggers or False,
        default_root_dir=str(output_dir),
        enable_progress_bar=interactive,
        enable_model_summary=False,  # NetworkSummary is among the callbacks instead
        use_distributed_sampler=False,  # the data modules choose their samplers (vit/data/loading.py)
        plugins=[AtomicCheckpointIO()],
    )
    return datamodule, module, trainer


def _write(path: Path, text: str) -> None:
    """config.yaml and results.json whole or not at all: resume=auto and the sweep table read them."""
    write_atomically(path, lambda temporary: temporary.write_text(text))


def _parameter_counts(module: ViTClassifier) -> tuple[int, int]:
    """The network's parameters that learn, and all of them (LoRA's adapters included)."""
    params = list(module.model.parameters())
    return sum(p.numel() for p in params if p.requires_grad), sum(p.numel() for p in params)


def instantiate_setting(node: DictConfig, key: str, **kwargs: Any) -> Any:
    """instantiate(node, **kwargs), where the target's own check of its values (Lightning's Trainer on devices=0 or
    precision=17, a callback's every_n_epochs=0) is one line naming `key` rather than Hydra's wrapped traceback; the
    data module's refusal of its data is its own DataError."""
    try:
        return instantiate(node, **kwargs)
    except InstantiationException as err:
        cause = err.__cause__
        if isinstance(cause, DataError):
            raise cause from None
        if isinstance(cause, (ValueError, TypeError, MisconfigurationException)):
            raise ConfigError(f"{key}: {(str(cause).strip().splitlines() or [type(cause).__name__])[0]}") from None
        raise


def _command_line_model_keys() -> set[str]:
    """The model.* fields set on this run's command line (model.pool=avg): a fine-tuning run applies them over the
    pretrained architecture. None when train() is called without Hydra."""
    if not HydraConfig.initialized():
        return set()
    keys = (o.split("=", 1)[0].lstrip("+~") for o in HydraConfig.get().overrides.task)
    return {k.removeprefix("model.") for k in keys if k.startswith("model.")}


def sweep_job() -> bool:
    """Whether Hydra runs this job as part of a sweep (-m); False when train() is called without Hydra."""
    return HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN


def _find(callbacks: list[L.Callback], kind: type) -> Any:
    return next(c for c in callbacks if isinstance(c, kind))


def _check_resumable(path: Path, config: ViTConfig, optimizer: str, sharded: bool = False) -> None:
    """Refuse, naming the file, what Lightning would fail on later with a traceback or a page of size mismatches:
    a truncated, corrupt or code-carrying file (a sharded one's every file), NaN weights, a checkpoint of another
    architecture or optimizer, a sharded checkpoint (a folder) in a run that is not (`sharded`: trainer=fsdp)."""
    if is_sharded_checkpoint(path) and not sharded:
        raise CheckpointError(
            f"{path}: a sharded checkpoint (trainer=fsdp): resume it with trainer=fsdp (any number of processes), "
            f"or make one file of it ({CONSOLIDATE} {path} --out model.ckpt) and start from it with model.pretrained"
        )
    if is_sharded_checkpoint(path):  # read whole, running nothing, before the processes start: one line, not one a rank
        check_sharded(path)
    try:  # a sharded one's weights are not read here: its writer refused non-finite ones
        checkpoint = read_training_checkpoint(path, read_meta(path) if is_sharded_checkpoint(path) else None)
    except NotATrainingCheckpoint as err:
        advice = "to start from its weights, give it as model.pretrained instead of resume"
        raise CheckpointError(f"{err}; {advice}") from None
    refuse_nonfinite(checkpoint.state_dict, path)
    theirs, ours = checkpoint.config.to_dict(), config.to_dict()
    # the network itself must be the same; regularisation (dropout, drop path) may change between runs
    if differ := [k for k in ours if "drop" not in k and ours[k] != theirs[k]]:
        raise CheckpointError(
            f"{path}: a checkpoint of another model, so it cannot be resumed: "
            + ", ".join(f"model.{k} is {theirs[k]} there, {ours[k]} here" for k in differ[:6])
        )
    # checkpoints written before optim.optimizer existed were all AdamW's
    if (saved_optimizer := checkpoint.hyper_parameters.get("optim", {}).get("optimizer", "adamw")) != optimizer:
        raise CheckpointError(
            f"{path}: trained with optim.optimizer={saved_optimizer}, whose state cannot continue as "
            f"optim.optimizer={optimizer}: resume with optim.optimizer={saved_optimizer}, or start from its weights "
            "with model.pretrained"
        )


def train(cfg: DictConfig) -> dict[str, Any]:
    """Fit, test the best checkpoint, write config.yaml and results.json into cfg.output_dir; return results."""
    settings = check_config(cfg)
    output_dir = Path(cfg.output_dir)
    resume = resume_path(cfg.resume, output_dir, sweep_job(), OmegaConf.to_container(cfg, resolve=True))
    built = network(settings)
    if resume is not None:  # against the network the run builds: a fine-tuning run's is its pretrained file's
        _check_resumable(resume, built[0], settings.optim.optimizer, sharded=is_sharded(cfg.trainer))
        log.info("resuming from %s", resume)
    output_dir.mkdir(parents=True, exist_ok=True)
    L.seed_everything(settings.switches.seed, workers=True)
    tune_process(settings.switches.matmul_precision)
    datamodule, module, trainer = build(cfg, settings, built)
    checkpoint, clock = trainer.checkpoint_callback, _find(trainer.callbacks, TrainingClock)
    if trainer.is_global_zero:
        _write(output_dir / RUN_CONFIG, OmegaConf.to_yaml(cfg, resolve=True))
    for logger in trainer.loggers:  # the run's whole config, as config.yaml holds it (the module logs none)
        logger.log_hyperparams(OmegaConf.to_container(cfg, resolve=True))

    trainer.fit(module, datamodule=datamodule, ckpt_path=resume, weights_only=True)
    fit_metrics = {k: float(v) for k, v in trainer.callback_metrics.items()}
    # testing restores the best checkpoint's callback and module state, the clock's and skip count's included:
    # read what the whole fit measured first
    seconds, skipped = clock.seconds, module.skipped_steps
    best = checkpoint.best_model_path or None
    tested = trainer.test(module, datamodule=datamodule, ckpt_path=best, weights_only=True)
    test_metrics = tested[0] if tested else {}

    best_score = float(checkpoint.best_model_score) if checkpoint.best_model_score is not None else None
    results = {
        **module.task.results(test_metrics, best_score),
        "val_samples": fit_metrics.get(VAL_SAMPLES),
        "epochs": trainer.current_epoch,
        "global_steps": trainer.global_step,
        "train_seconds": round(seconds, 3),
        "train_images_per_second": fit_metrics.get(THROUGHPUT),
        "params": _parameter_counts(module)[1],
        "trainable_params": _parameter_counts(module)[0],
        "skipped_steps": skipped,
        "bad_images": len(getattr(datamodule, "bad_images", [])),
        "resumed_from": str(resume) if resume else None,
        "pretrained_from": module.hparams.pretrained_from,
        "best_checkpoint": best,
        "output_dir": str(output_dir),
    }
    if trainer.is_global_zero:
        _write(output_dir / RESULTS_FILE, json.dumps(results, indent=2) + "\n")
        log.info("results: %s", json.dumps(results))
    finish_runs(trainer.loggers)
    return results
