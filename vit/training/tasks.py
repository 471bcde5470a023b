"""What a run learns, as the Lightning module asks it (the `task` config group): a batch's targets, the loss, and the
metrics. The module (vit/training/module.py) holds the network, the optimizer and the bookkeeping every task shares
(the training loss, skipped steps, checkpoints); a task holds everything that depends on what the labels are, so
that a new one is a new class here and a row of TASKS.

- classify (Classification): one label per image; cross-entropy with label smoothing, or Mixup/CutMix's soft
  targets (timm's); or, task.loss=bce, a sigmoid per class on one-hot targets (DeiT III's); top-1 and top-5 accuracy.
- multilabel (MultiLabel): several labels per image, multi-hot; BCE or ASL (vit/training/multilabel.py); macro and
  micro mAP, and F1 at each class's threshold, tuned on validation and kept in checkpoints (THRESHOLDS).

Metric names are defined here once; callbacks and train() read them through the task (`monitor`, `results`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from timm.data import Mixup
from timm.loss import BinaryCrossEntropy, SoftTargetCrossEntropy
from torch import Tensor, nn
from torchmetrics import MeanMetric, Metric
from torchmetrics.classification import MulticlassAccuracy, MultilabelAveragePrecision
from torchmetrics.functional.classification import multilabel_average_precision, multilabel_f1_score
from torchmetrics.utilities import dim_zero_cat

from vit.interop.loaded import CLASSIFY, EVEN_ODDS, MULTILABEL, THRESHOLDS, read_task
from vit.model.config import ConfigError
from vit.training.mixup import MixupConfig
from vit.training.multilabel import asymmetric_loss, best_f1_thresholds

if TYPE_CHECKING:
    from vit.training.settings import Settings

TRAIN_ACC = "train/acc"
VAL_LOSS, VAL_ACC, VAL_ACC5, VAL_MAP = "val/loss", "val/acc", "val/acc5", "val/map"
TEST_LOSS, TEST_ACC, TEST_ACC5 = "test/loss", "test/acc", "test/acc5"
TEST_BALANCED_ACC = "test/balanced_acc"
TEST_MAP, TEST_MAP_MICRO, TEST_F1 = "test/map", "test/map_micro", "test/f1"
STAGES = ("val", "test")
LOSSES = {CLASSIFY: ("ce", "bce"), MULTILABEL: ("bce", "asl")}  # what each task learns with


@dataclass(frozen=True)
class TaskConfig:
    """The `task` group: what the labels are and how the run learns from them."""

    kind: str = CLASSIFY  # a name of TASKS
    loss: str = "ce"  # ce: softmax cross-entropy; bce: a sigmoid per class; asl: ASL (several labels per image)
    gamma_neg: float = 4.0  # ASL's focusing of the negatives, γ- (Ridnik et al. 2021's defaults, these three)
    gamma_pos: float = 0.0  # ... of the positives, γ+
    clip: float = 0.05  # ... the margin m by which a negative's probability is shifted down, in [0, 1)

    def __post_init__(self) -> None:
        if self.kind not in TASKS:
            raise ConfigError(f"task.kind={self.kind!r}: give one of {', '.join(TASKS)}")
        if self.loss not in (losses := LOSSES[self.kind]):
            several = " (several labels per image)" if self.loss == "asl" else ""
            other = next((f"; task.loss={self.loss} is task={k}'s" for k, v in LOSSES.items() if self.loss in v), "")
            raise ConfigError(f"task.loss={self.loss!r}: task={self.kind} takes {' or '.join(losses)}{other}{several}")
        for key, most in (("gamma_neg", math.inf), ("gamma_pos", math.inf), ("clip", 1)):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < most:
                allowed = "a finite number >= 0" if most == math.inf else f"a number in [0, {most})"
                raise ConfigError(f"task.{key}={value!r}: ASL's {key} must be {allowed}")

    def build(self, num_classes: int, label_smoothing: float = 0.0, mixup: MixupConfig | None = None) -> Task:
        return TASKS[self.kind](self, num_classes, label_smoothing, mixup)

    @staticmethod
    def check(settings: Settings, data: Mapping[str, Any]) -> None:
        """What the task cannot compose with (vit/training/checks.py calls it with the features' checks)."""
        if settings.task.kind == MULTILABEL and settings.distill.teacher is not None:
            raise ConfigError(
                f"distill.teacher={settings.distill.teacher} with task={MULTILABEL}: DeiT's distillation learns the "
                "teacher's one class an image (its softmax), not several labels; drop distill.teacher"
            )


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

    def epoch_end(self, stage: str) -> dict[str, Tensor]:
        """At `stage`'s end, what the whole epoch's scores give at once, to log by name (the metrics evaluate()
        returned still hold the epoch)."""
        return {}

    def results(self, tested: dict[str, float], best: float | None) -> dict[str, Any]:
        """results.json's entries of the task: the test metrics and the best validation score."""
        raise NotImplementedError

    def setup(self, data: Any) -> None:
        """The run's data module, set up: what the task reads of it, and its refusal of labels it cannot learn."""

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """What the task keeps in a checkpoint besides its settings (the module's hyper_parameters hold those)."""

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Put back what on_save_checkpoint kept."""


def several_labels(data: Any) -> bool:
    """Whether a data module gives several labels per image (its `multilabel`), multi-hot targets (B, K)."""
    return bool(getattr(data, "multilabel", False))


class Classification(Task):
    """One label per image (B,) of `num_classes`: cross-entropy, or timm's Mixup/CutMix targets; accuracy as the
    fraction of images classified right ("micro"), not torchmetrics' default mean over classes ("macro"), which
    differs wherever the classes are not equally many. task.loss=bce: a sigmoid per class on the one-hot (smoothed)
    or mixed targets, timm's BinaryCrossEntropy, as DeiT III trains. Tested also per class (the share of each
    class's images classified right, by the data's class names) and as balanced accuracy, the mean of those
    ("macro"), which a rare class moves as much as a common one."""

    monitor = VAL_ACC

    def __init__(
        self, config: TaskConfig, num_classes: int, label_smoothing: float = 0.0, mixup: MixupConfig | None = None
    ):
        super().__init__()
        self.label_smoothing, self.num_classes = label_smoothing, num_classes
        smoothing = dict(label_smoothing=label_smoothing, num_classes=num_classes)
        self.mixup = Mixup(**mixup.arguments(), **smoothing) if mixup is not None else None
        self.soft_loss = SoftTargetCrossEntropy()
        # Mixup's targets come smoothed; one-hot targets are smoothed by timm's BCE itself
        self.bce = BinaryCrossEntropy(smoothing=label_smoothing) if config.loss == "bce" else None
        top1 = partial(MulticlassAccuracy, num_classes, average="micro")
        top5 = partial(top1, top_k=min(5, num_classes))
        self.train_acc = top1(validate_args=False)  # every step: no label-range check (a host sync on a GPU)
        self.stages = nn.ModuleDict({stage: nn.ModuleList([MeanMetric(), top1(), top5()]) for stage in STAGES})
        self.test_balanced = MulticlassAccuracy(num_classes, average="macro")
        self.test_per_class = MulticlassAccuracy(num_classes, average=None)
        self.names = [str(k) for k in range(num_classes)]  # the data's class names, once setup() has read them
        self.tested_per_class: dict[str, float | None] = {}

    def mix(self, images: Tensor, labels: Tensor) -> tuple[Tensor, Tensor]:
        if self.mixup is None or len(images) % 2:  # timm's Mixup pairs images within the batch
            return images, labels
        return self.mixup(images, labels)  # soft targets (B, K)

    def loss(self, logits: Tensor, targets: Tensor) -> Tensor:
        if self.bce is not None:
            return self.bce(logits, targets)
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
        if self.bce is not None:  # the training loss, unsmoothed
            loss(
                F.binary_cross_entropy_with_logits(logits, F.one_hot(labels, self.num_classes).to(logits)), len(labels)
            )
        else:
            loss(F.cross_entropy(logits, labels), len(labels))
        acc(logits, labels)
        acc5(logits, labels)
        logged = {f"{stage}/loss": loss, f"{stage}/acc": acc, f"{stage}/acc5": acc5}
        if stage == "test":  # update: no per-batch value, which nothing reads
            self.test_balanced.update(logits, labels)
            self.test_per_class.update(logits, labels)
            logged[TEST_BALANCED_ACC] = self.test_balanced
        return logged

    def epoch_end(self, stage: str) -> dict[str, Tensor]:
        """The test's per-class accuracies, for results(): computed here, on the device and over every rank, as the
        logged metrics are (after testing Lightning moves the module to the CPU, where NCCL syncs nothing)."""
        if stage != "test" or not self.test_per_class.update_count:
            return {}
        per_class = self.test_per_class.compute()
        with self.test_per_class.sync_context():
            images = (self.test_per_class.tp + self.test_per_class.fn).tolist()  # (K,) test images of each class
        self.test_per_class.reset()
        # a class the test split lacks has no accuracy (torchmetrics gives 0)
        self.tested_per_class = {
            name: float(acc) if count else None for name, acc, count in zip(self.names, per_class, images, strict=True)
        }
        return {}

    def results(self, tested: dict[str, float], best: float | None) -> dict[str, Any]:
        return {
            "test_acc": tested.get(TEST_ACC),
            "test_acc5": tested.get(TEST_ACC5),
            "test_balanced_acc": tested.get(TEST_BALANCED_ACC),
            "test_acc_per_class": self.tested_per_class,
            "best_val_acc": best,
        }

    def setup(self, data: Any) -> None:
        if several_labels(data):  # its (B, K) targets would fail in the first step, in a traceback
            raise ConfigError(
                f"task={CLASSIFY} learns one label per image, but the data ({type(data).__name__}) gives several "
                f"per image: add task={MULTILABEL}"
            )
        self.names = class_names(data, self.num_classes) or self.names


def class_names(data: Any, count: int) -> list[str] | None:
    """A data module's `count` class names in label order (its facts': those a class subset keeps), or None."""
    facts = data.facts() if hasattr(data, "facts") else {}
    names = facts.get("classes") or getattr(data, "classes", None)
    return list(names) if names and len(names) == count else None


class MultiLabel(Task):
    """Several labels per image: multi-hot targets (B, K) as the data gives them (one label an image: one-hot), each
    class a yes or no of its own. Label smoothing moves each target toward 1/2, Mixup/CutMix mix the multi-hot
    targets (timm's, multi_label=True). Loss: BCE, or ASL. Metrics: mean average precision over classes ("macro",
    val/map picks the best checkpoint) and over all (image, class) pairs ("micro"); each class's AP; F1 (macro) with
    each class predicted from its own threshold, the one of best F1 on the last validation epoch's scores."""

    monitor = VAL_MAP

    def __init__(
        self, config: TaskConfig, num_classes: int, label_smoothing: float = 0.0, mixup: MixupConfig | None = None
    ):
        super().__init__()
        self.num_classes, self.label_smoothing = num_classes, label_smoothing
        smoothing = dict(label_smoothing=label_smoothing, num_classes=num_classes)
        self.mixup = Mixup(**mixup.arguments(), **smoothing, multi_label=True) if mixup is not None else None
        if config.loss == "asl":
            self.criterion = partial(
                asymmetric_loss, gamma_neg=config.gamma_neg, gamma_pos=config.gamma_pos, clip=config.clip
            )
        else:
            self.criterion = F.binary_cross_entropy_with_logits
        # every score of the epoch (thresholds=None: exact), which the thresholds and test's figures read too
        ap = partial(MultilabelAveragePrecision, num_classes, average="macro")
        self.stages = nn.ModuleDict({stage: nn.ModuleList([MeanMetric(), ap()]) for stage in STAGES})
        self.thresholds = torch.full((num_classes,), EVEN_ODDS)  # (K,), until validation tunes them
        self.names = [f"class {k}" for k in range(num_classes)]
        self.tested_ap: dict[str, float | None] = {}  # each class's test AP, by name

    def multi_hot(self, labels: Tensor) -> Tensor:
        """(B,) class indices or (B, K) multi-hot -> (B, K) float."""
        return (F.one_hot(labels, self.num_classes) if labels.dim() == 1 else labels).float()

    def mix(self, images: Tensor, labels: Tensor) -> tuple[Tensor, Tensor]:
        targets = self.multi_hot(labels)
        if self.mixup is None or len(images) % 2:  # timm's Mixup pairs images within the batch
            return images, targets * (1 - self.label_smoothing) + 0.5 * self.label_smoothing  # as timm smooths
        return self.mixup(images, targets)

    def loss(self, logits: Tensor, targets: Tensor) -> Tensor:
        return self.criterion(logits.float(), targets)

    def evaluate(self, stage: str, logits: Tensor, labels: Tensor) -> dict[str, Metric]:
        loss, ap = self.stages[stage]
        targets = self.multi_hot(labels)
        loss(self.criterion(logits.float(), targets), len(labels))
        # probabilities: torchmetrics applies the sigmoid only to a batch with a score outside [0, 1]
        ap.update(logits.float().sigmoid(), targets.int())  # update: no per-batch AP, which nothing reads
        return {f"{stage}/loss": loss, f"{stage}/map": ap}

    def epoch_end(self, stage: str) -> dict[str, Tensor]:
        ap = self.stages[stage][1]
        if not ap.update_count:
            return {}
        with ap.sync_context():  # every rank's scores, so that the ranks agree
            scores, targets = dim_zero_cat(ap.preds), dim_zero_cat(ap.target)
        if stage == "val":
            self.thresholds = best_f1_thresholds(scores, targets)
            return {}
        per_class = multilabel_average_precision(scores, targets, self.num_classes, average=None)
        self.tested_ap = {
            name: v if math.isfinite(v := float(a)) else None for name, a in zip(self.names, per_class, strict=True)
        }
        predicted = (scores >= self.thresholds.to(scores.device)).int()
        return {
            TEST_MAP_MICRO: multilabel_average_precision(scores, targets, self.num_classes, average="micro"),
            TEST_F1: multilabel_f1_score(predicted, targets, self.num_classes, average="macro"),
        }

    def results(self, tested: dict[str, float], best: float | None) -> dict[str, Any]:
        return {
            "test_map": tested.get(TEST_MAP),
            "test_map_micro": tested.get(TEST_MAP_MICRO),
            "test_f1": tested.get(TEST_F1),
            "test_ap_per_class": self.tested_ap,  # a class test never shows: None
            "best_val_map": best,
        }

    def setup(self, data: Any) -> None:
        facts = data.facts() if hasattr(data, "facts") else {}  # the class names a class subset keeps
        names = facts.get("classes") or getattr(data, "classes", None)
        if names and len(names) == self.num_classes:
            self.names = list(names)

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        checkpoint[THRESHOLDS] = self.thresholds.tolist()

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        record = {"kind": MULTILABEL, THRESHOLDS: checkpoint.get(THRESHOLDS)}
        _, thresholds = read_task(record, self.num_classes, "the checkpoint")
        if thresholds is not None:
            self.thresholds = torch.tensor(thresholds)


TASKS: dict[str, type[Task]] = {CLASSIFY: Classification, MULTILABEL: MultiLabel}
