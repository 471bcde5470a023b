"""What a run learns, as the Lightning module asks it (the `task` config group): a batch's targets, the loss, and the
metrics. The module (vit/training/module.py) holds the network, the optimizer and the bookkeeping every task shares
(the training loss, skipped steps, checkpoints); a task holds everything that depends on what the labels are, so
that a new one is a new class here and a row of TASKS.

- classify (Classification): one label per image; cross-entropy with label smoothing, or Mixup/CutMix's soft
  targets (timm's); top-1 and top-5 accuracy.

Metric names are defined here once; callbacks and train() read them through the task (`monitor`, `results`).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Any, Literal

import torch.nn.functional as F
from timm.data import Mixup
from timm.loss import SoftTargetCrossEntropy
from torch import Tensor, nn
from torchmetrics import MeanMetric, Metric
from torchmetrics.classification import MulticlassAccuracy

from vit.model.config import ConfigError
from vit.training.mixup import MixupConfig

TRAIN_ACC = "train/acc"
VAL_LOSS, VAL_ACC, VAL_ACC5 = "val/loss", "val/acc", "val/acc5"
TEST_LOSS, TEST_ACC, TEST_ACC5 = "test/loss", "test/acc", "test/acc5"
STAGES = ("val", "test")


@dataclass(frozen=True)
class TaskConfig:
    """The `task` group: what the labels are and how the run learns from them."""

    kind: Literal["classify"] = "classify"

    def __post_init__(self) -> None:
        if self.kind not in TASKS:
            raise ConfigError(f"task.kind={self.kind!r}: give one of {', '.join(TASKS)}")

    def build(self, num_classes: int, label_smoothing: float = 0.0, mixup: MixupConfig | None = None) -> Task:
        return TASKS[self.kind](num_classes, label_smoothing, mixup)


class Task(nn.Module):
    """The module's questions to a task. `monitor` is the validation metric that picks the best checkpoint (higher is
    better); its metrics are submodules, so they follow the module to its device."""

    monitor: str

    def mix(self, images: Tensor, labels: Tensor) -> tuple[Tensor, Tensor]:
        """The training batch and its targets (mixed, where the task mixes images)."""
        return images, labels

    def loss(self, logits: Tensor, targets: Tensor) -> Tensor:
        raise NotImplementedError

    def update_train(self, logits: Tensor, labels: Tensor, targets: Tensor) -> None:
        """The training metrics of a step (not the loss: the module averages that)."""

    def train_metrics(self) -> dict[str, Metric]:
        """The training metrics, by the name they are logged under at each epoch's end (a checkpoint keeps their
        running state mid-epoch)."""
        return {}

    def evaluate(self, stage: str, logits: Tensor, labels: Tensor) -> dict[str, Metric]:
        """Update `stage`'s ('val' or 'test') metrics on a batch; the metrics to log, by name."""
        raise NotImplementedError

    def results(self, tested: dict[str, float], best: float | None) -> dict[str, Any]:
        """results.json's entries of the task: the test metrics and the best validation score."""
        raise NotImplementedError


class Classification(Task):
    """One label per image (B,) of `num_classes`: cross-entropy, or timm's Mixup/CutMix targets; accuracy as the
    fraction of images classified right ("micro"), not torchmetrics' default mean over classes ("macro"), which
    differs wherever the classes are not equally many."""

    monitor = VAL_ACC

    def __init__(self, num_classes: int, label_smoothing: float = 0.0, mixup: MixupConfig | None = None):
        super().__init__()
        self.label_smoothing = label_smoothing
        smoothing = dict(label_smoothing=label_smoothing, num_classes=num_classes)
        self.mixup = Mixup(**mixup.arguments(), **smoothing) if mixup is not None else None
        self.soft_loss = SoftTargetCrossEntropy()
        top1 = partial(MulticlassAccuracy, num_classes, average="micro")
        top5 = partial(top1, top_k=min(5, num_classes))
        self.train_acc = top1(validate_args=False)  # every step: no label-range check (a host sync on a GPU)
        self.stages = nn.ModuleDict({stage: nn.ModuleList([MeanMetric(), top1(), top5()]) for stage in STAGES})

    def mix(self, images: Tensor, labels: Tensor) -> tuple[Tensor, Tensor]:
        if self.mixup is None or len(images) % 2:  # timm's Mixup pairs images within the batch
            return images, labels
        return self.mixup(images, labels)  # soft targets (B, K)

    def loss(self, logits: Tensor, targets: Tensor) -> Tensor:
        if targets.dim() == 2:
            return self.soft_loss(logits, targets)
        return F.cross_entropy(logits, targets, label_smoothing=self.label_smoothing)

    def update_train(self, logits: Tensor, labels: Tensor, targets: Tensor) -> None:
        if targets.dim() == 1:  # a mixed batch has no one label an image to be right about
            self.train_acc.update(logits, labels)

    def train_metrics(self) -> dict[str, Metric]:
        return {TRAIN_ACC: self.train_acc}

    def evaluate(self, stage: str, logits: Tensor, labels: Tensor) -> dict[str, Metric]:
        loss, acc, acc5 = self.stages[stage]
        loss(F.cross_entropy(logits, labels), len(labels))
        acc(logits, labels)
        acc5(logits, labels)
        return {f"{stage}/loss": loss, f"{stage}/acc": acc, f"{stage}/acc5": acc5}

    def results(self, tested: dict[str, float], best: float | None) -> dict[str, Any]:
        return {"test_acc": tested.get(TEST_ACC), "test_acc5": tested.get(TEST_ACC5), "best_val_acc": best}


TASKS: dict[str, type[Task]] = {"classify": Classification}
