"""The process-wide settings a training run makes once, before its first step: how matrix products compute, how
malloc keeps memory, whether torch asks NVML about CUDA, and which library warnings reach the user. train() makes
them in one call, tune_process; the benchmarks call it too, so that every loop they time steps as a training run
does. Lightning's advert is filtered where a Trainer is built (quiet_lightning_adverts)."""

from __future__ import annotations

import logging
import os
import warnings

import torch

from vit.training.allocator import keep_freed_memory

NVML_CUDA_CHECK = "PYTORCH_NVML_BASED_CUDA_CHECK"  # set to "1" by `import lightning`


def tune_process(matmul_precision: str | None, *, training_warnings: bool = True) -> None:
    """Set this process up for training steps: GPU matrix products at `matmul_precision` (set_matmul_precision;
    None leaves torch's setting), freed memory kept by malloc (keep_freed_memory), no NVML question per step where
    no GPU is visible (drop_nvml_cuda_check) and, with `training_warnings`, the warnings a training run gives that
    are not the user's to act on silenced (quiet_training_warnings)."""
    if matmul_precision is not None:
        set_matmul_precision(matmul_precision)
    keep_freed_memory()  # benchmarks/NOTES.md change 32
    drop_nvml_cuda_check()
    if training_warnings:
        quiet_training_warnings()


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


def quiet_training_warnings() -> None:
    """Warnings Lightning gives during a run that describe the run's design, not a mistake of the user's."""
    # the run folder holds Hydra's and our own files besides the CSV log, by design
    warnings.filterwarnings("ignore", message="Experiment logs directory .* exists and is not empty")
    # lightning 2.6 calls a torch pytree API that torch 2.14 deprecates, as each fit and test starts: not the user's
    warnings.filterwarnings("ignore", message=r"`isinstance\(treespec, LeafSpec\)` is deprecated")
    # under DDP Lightning asks for sync_dist on epoch-level logs; the epoch's train loss and accuracy are torchmetrics'
    # computes, already summed over the ranks (module.py _log_epoch_means)
    warnings.filterwarnings("ignore", message=r"It is recommended to use `self.log\('train/(loss|acc)'")
    # data=stream: litdata's StreamingDataset gives each DataLoader worker its own items, which Lightning cannot see
    warnings.filterwarnings("ignore", message=r"Your `IterableDataset` has `__len__` defined")


class _NoAdverts(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("💡 Tip")


def quiet_lightning_adverts() -> None:
    """Lightning 2.6 advertises its cloud logger (litlogger) as every Trainer starts: users should see our lines and
    real warnings only. A filter on the one logger Lightning prints it through; its other lines stay. Called where a
    Trainer is built (vit.training.run.build), which tests and tools call without train()."""
    rank_zero = logging.getLogger("lightning.pytorch.utilities.rank_zero")
    if not any(isinstance(f, _NoAdverts) for f in rank_zero.filters):
        rank_zero.addFilter(_NoAdverts())
