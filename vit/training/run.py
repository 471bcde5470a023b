"""train(cfg): fit, test the best checkpoint, and write the run's outputs. train.py wraps it in Hydra;
tests call it directly with a composed config."""

from __future__ import annotations

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
from hydra.errors import InstantiationException
from hydra.types import RunMode
from hydra.utils import instantiate
from lightning.fabric.utilities.exceptions import MisconfigurationException
from lightning.pytorch.callbacks import ModelCheckpoint, TQDMProgressBar
from lightning.pytorch.loggers import Logger
from omegaconf import DictConfig, OmegaConf

from vit.data.errors import DataError
from vit.data.loading import SplitDataModule
from vit.interop.files import CheckpointError, nonfinite, read
from vit.interop.finetune import describe, finetune_config, load_pretrained_, pretrained_normalization
from vit.interop.load import Loaded, load
from vit.model import ConfigError, ViTConfig
from vit.training.allocator import keep_freed_memory
from vit.training.best_checkpoint import BestCheckpoint
from vit.training.checkpoint_io import AtomicCheckpointIO
from vit.training.checks import check_config, model_fields
from vit.training.clock import THROUGHPUT, TrainingClock
from vit.training.compiler import resolve_compile
from vit.training.distill import Teacher
from vit.training.ema import EMA
from vit.training.epoch_line import EpochLine
from vit.training.exact_resume import ExactResume
from vit.training.loggers import finish_runs
from vit.training.model_summary import NetworkSummary
from vit.training.module import TEST_ACC, TEST_ACC5, VAL_ACC, VAL_SAMPLES, ViTClassifier
from vit.training.precision import resolve_precision
from vit.training.preemption import Preemption
from vit.training.resume import resume_path
from vit.training.run_folder import CHECKPOINT_DIR, LAST, RESULTS_FILE, RUN_CONFIG

log = logging.getLogger(__name__)
NVML_CUDA_CHECK = "PYTORCH_NVML_BASED_CUDA_CHECK"  # set to "1" by `import lightning`


class _NoAdverts(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("💡 Tip")


def quiet_lightning_adverts() -> None:
    """Lightning 2.6 advertises its cloud logger (litlogger) as every Trainer starts: users should see our lines and
    real warnings only. A filter on the one logger Lightning prints it through; its other lines stay."""
    rank_zero = logging.getLogger("lightning.pytorch.utilities.rank_zero")
    if not any(isinstance(f, _NoAdverts) for f in rank_zero.filters):
        rank_zero.addFilter(_NoAdverts())


def _normalize_as_pretrained(datamodule: L.LightningDataModule, loaded: Loaded, cfg: DictConfig) -> None:
    """Fine-tuning feeds the network images normalised as in its pretraining (CLIP's mean and std for a CLIP
    tower, not ImageNet's), unless pretrained_stats=false; one log line says which it uses and why."""
    if not isinstance(datamodule, SplitDataModule):
        return
    stats = pretrained_normalization(loaded, cfg.data.in_chans)
    if not cfg.get("pretrained_stats", True) or isinstance(stats, str):
        why = "pretrained_stats=false" if isinstance(stats, tuple) else stats
        log.info("normalising with the data's mean %s and std %s (%s)", datamodule.mean, datamodule.std, why)
        return
    datamodule.normalize_with(*stats)
    log.info(
        "normalising with the pretrained file's mean %s and std %s, as its weights saw images "
        "(pretrained_stats=false: the data's own)",
        *stats,
    )


def network(cfg: DictConfig) -> tuple[dict[str, Any], Loaded | None]:
    """The ViTConfig fields of the network the run builds, and the pretrained file it starts from, if any: the
    file is then the network, its architecture with the run's own fields (new classes, image size) over it."""
    fields, pretrained = model_fields(cfg)
    if pretrained is None:
        return fields, None
    loaded = load(pretrained, config=_hint(fields))
    return finetune_config(loaded.config, fields, _command_line_model_keys()).to_dict(), loaded


def build(
    cfg: DictConfig, built: tuple[dict[str, Any], Loaded | None] | None = None
) -> tuple[L.LightningDataModule, ViTClassifier, L.Trainer]:
    """Instantiate the data module, the Lightning module and the trainer from the config, reading no data.
    `built`: network(cfg), where the caller has it already."""
    quiet_lightning_adverts()
    output_dir = Path(cfg.output_dir)
    datamodule = instantiate_setting(cfg.data, "data")
    fields, loaded = built or network(cfg)
    if loaded is not None:
        log.info("pretrained %s: %s", loaded.path, describe(loaded.config))
        _normalize_as_pretrained(datamodule, loaded, cfg)
    module = ViTClassifier(
        model=fields,
        optim=OmegaConf.to_container(cfg.optim),
        label_smoothing=cfg.label_smoothing,
        mixup=OmegaConf.to_container(cfg.mixup) if cfg.mixup else None,
        compile=resolve_compile(cfg.compile, cfg.trainer.accelerator),
        test_time_flip=cfg.test_time_flip,
        test_time_shift=cfg.test_time_shift,
        finetune=OmegaConf.to_container(cfg.finetune),
        # which weights the run started from, in its checkpoints: a hub name's repo, commit and files, or the path
        pretrained_from=None if loaded is None else loaded.source or {"path": str(loaded.path)},
        distill=OmegaConf.to_container(cfg.distill) if cfg.distill.teacher else None,
    )
    if cfg.distill.teacher:
        module.teacher = _teacher(cfg.distill.teacher, module.config)
    if loaded is not None:
        for change in load_pretrained_(module.model, loaded.path, loaded):
            log.info("pretrained %s: %s", loaded.path, change)
    resized = loaded is not None and loaded.config.grid_size != module.config.grid_size
    module.adapt(resized_table=resized)  # after the starting weights: LoRA's layers wrap the loaded ones
    trainable, total = _parameter_counts(module)
    log.info(f"finetune={cfg.finetune.kind}: {trainable:,} of {total:,} parameters learn ({trainable / total:.2%})")
    folder = output_dir / CHECKPOINT_DIR
    # best.ckpt, never best-v1.ckpt: a second run in a fixed hydra.run.dir replaces the first one's (the README's
    # and the examples' path), as last.ckpt is replaced; a resumed run carries the earlier run's best over
    checkpoint = BestCheckpoint(
        dirpath=folder, filename="best", monitor=VAL_ACC, mode="max", enable_version_counter=False
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
    if cfg.ema_decay:
        callbacks.append(EMA(cfg.ema_decay))
    interactive = sys.stdout.isatty()
    callbacks.append(TQDMProgressBar() if interactive else EpochLine(clock))
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


def _teacher(name: str, student: ViTConfig) -> Teacher:
    """distill.teacher, loaded and frozen; refused in one line where it predicts other classes than the student."""
    loaded = load(name)
    if loaded.config.num_classes != student.num_classes:
        raise CheckpointError(
            f"distill.teacher={name} predicts {loaded.config.num_classes} classes, the student (the data) "
            f"{student.num_classes}: distil from a teacher of the data's classes"
        )
    loaded.model.requires_grad_(False)
    log.info("distilling from %s: %s", name, describe(loaded.config))
    return Teacher(loaded)


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


def _hint(fields: dict[str, Any]) -> ViTConfig | None:
    """What the config says of a pretrained network, for the files that do not say it all (a bare timm file's
    heads): the model fields, less an image size its patches need not tile (the file has its own)."""
    for values in (fields, {k: v for k, v in fields.items() if k not in ("img_size", "patch_size")}):
        try:
            return ViTConfig.from_dict(values)
        except ConfigError:
            continue
    return None


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


def set_matmul_precision(precision: str) -> None:
    """torch.set_float32_matmul_precision for GPUs (TF32 on Ampere and later), with CPU matrix products left
    in full fp32: in torch 2.14 'high' also sends them to oneDNN's TF32 path, which is much slower on CPUs with AMX
    (Intel Xeon 4th gen+; benchmarks/NOTES.md change 8)."""
    torch.set_float32_matmul_precision(precision)
    torch.backends.mkldnn.matmul.fp32_precision = "none"  # torch's default: no reduced precision


def drop_nvml_cuda_check() -> None:
    """Lightning sets NVML_CUDA_CHECK on import, so that asking whether CUDA is there does not initialise it before
    a fork. torch then asks NVML on each such call, and AdamW asks every step (its CUDA-graph capture check): on a
    machine without NVIDIA's driver the library fails to load each time, a cost on every step of a training loop
    (benchmarks/NOTES.md change 15). Where no GPU is visible there is nothing for a fork to break, so the
    variable goes."""
    if os.environ.get(NVML_CUDA_CHECK) == "1" and not torch.cuda.is_available():
        del os.environ[NVML_CUDA_CHECK]


def _check_resumable(path: Path, fields: dict[str, Any], optimizer: str) -> None:
    """Refuse, naming the file, what Lightning would fail on later with a traceback or a page of size mismatches:
    a truncated, corrupt or code-carrying file, NaN weights, a checkpoint of another architecture or optimizer."""
    contents = read(path)
    if bad := nonfinite(contents.get("state_dict", {})):
        raise CheckpointError(f"{path}: non-finite values (NaN or infinity) in {', '.join(bad[:5])}")
    saved = contents.get("hyper_parameters", {}).get("model")
    if saved is None:
        raise CheckpointError(
            f"{path}: not a vit training checkpoint (no hyper_parameters.model); to start from its "
            "weights, give it as model.pretrained instead of resume"
        )
    try:
        theirs = ViTConfig.from_dict(saved).to_dict()
    except ConfigError as err:
        raise CheckpointError(f"{path}: its model configuration is invalid: {err}") from None
    ours = ViTConfig.from_dict(fields).to_dict()
    # the network itself must be the same; regularisation (dropout, drop path) may change between runs
    if differ := [k for k in ours if "drop" not in k and ours[k] != theirs[k]]:
        raise CheckpointError(
            f"{path}: a checkpoint of another model, so it cannot be resumed: "
            + ", ".join(f"model.{k} is {theirs[k]} there, {ours[k]} here" for k in differ[:6])
        )
    # checkpoints written before optim.optimizer existed were all AdamW's
    if (saved_optimizer := contents["hyper_parameters"].get("optim", {}).get("optimizer", "adamw")) != optimizer:
        raise CheckpointError(
            f"{path}: trained with optim.optimizer={saved_optimizer}, whose state cannot continue as "
            f"optim.optimizer={optimizer}: resume with optim.optimizer={saved_optimizer}, or start from its weights "
            "with model.pretrained"
        )


def train(cfg: DictConfig) -> dict[str, Any]:
    """Fit, test the best checkpoint, write config.yaml and results.json into cfg.output_dir; return results."""
    check_config(cfg)
    # the run folder holds Hydra's and our own files besides the CSV log, by design
    warnings.filterwarnings("ignore", message="Experiment logs directory .* exists and is not empty")
    # lightning 2.6 calls a torch pytree API that torch 2.14 deprecates, as each fit and test starts: not the user's
    warnings.filterwarnings("ignore", message=r"`isinstance\(treespec, LeafSpec\)` is deprecated")
    # under DDP Lightning asks for sync_dist on epoch-level logs; the epoch's train loss and accuracy are torchmetrics'
    # computes, already summed over the ranks (module.py _log_epoch_means)
    warnings.filterwarnings("ignore", message=r"It is recommended to use `self.log\('train/(loss|acc)'")
    # data=stream: litdata's StreamingDataset gives each DataLoader worker its own items, which Lightning cannot see
    warnings.filterwarnings("ignore", message=r"Your `IterableDataset` has `__len__` defined")
    output_dir = Path(cfg.output_dir)
    resume = resume_path(cfg.resume, output_dir, sweep_job(), OmegaConf.to_container(cfg, resolve=True))
    built = network(cfg)
    if resume is not None:  # against the network the run builds: a fine-tuning run's is its pretrained file's
        _check_resumable(resume, built[0], cfg.optim.optimizer)
        log.info("resuming from %s", resume)
    output_dir.mkdir(parents=True, exist_ok=True)
    L.seed_everything(cfg.seed, workers=True)
    set_matmul_precision(cfg.matmul_precision)
    keep_freed_memory()
    drop_nvml_cuda_check()
    datamodule, module, trainer = build(cfg, built)
    checkpoint, clock = trainer.checkpoint_callback, _find(trainer.callbacks, TrainingClock)
    if trainer.is_global_zero:
        (output_dir / RUN_CONFIG).write_text(OmegaConf.to_yaml(cfg, resolve=True))
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

    results = {
        "test_acc": test_metrics.get(TEST_ACC),
        "test_acc5": test_metrics.get(TEST_ACC5),
        "best_val_acc": float(checkpoint.best_model_score) if checkpoint.best_model_score is not None else None,
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
        (output_dir / RESULTS_FILE).write_text(json.dumps(results, indent=2) + "\n")
        log.info("results: %s", json.dumps(results))
    finish_runs(trainer.loggers)
    return results
