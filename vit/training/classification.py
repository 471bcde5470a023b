"""The label tasks (vit/training/task.py's seam):

- classify (Classification): one label per image; cross-entropy with label smoothing, or Mixup/CutMix's soft
  targets (timm's); or, task.loss=bce, a sigmoid per class on one-hot targets (DeiT III's); top-1 and top-5 accuracy,
  and tested per class and as balanced accuracy.
- multilabel (MultiLabel): several labels per image, multi-hot; BCE or ASL (vit/training/multilabel.py); macro and
  micro mAP, and F1 at each class's threshold, tuned on validation and kept in checkpoints (THRESHOLDS).
"""

from __future__ import annotations

import math
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
from vit.model.config import ConfigError, ViTConfig
from vit.training.mixup import MixupConfig
from vit.training.multilabel import asymmetric_loss, best_f1_thresholds
from vit.training.task import (
    STAGES,
    TEST_ACC,
    TEST_ACC5,
    TEST_BALANCED_ACC,
    TEST_F1,
    TEST_MAP,
    TEST_MAP_MICRO,
    TRAIN_ACC,
    VAL_ACC,
    VAL_MAP,
    Task,
    best_key,
    several_labels,
)

if TYPE_CHECKING:
    from vit.training.tasks import TaskConfig


class Classification(Task):
    """One label per image (B,) of `num_classes`: cross-entropy, or timm's Mixup/CutMix targets; accuracy as the
    fraction of images classified right ("micro"), not torchmetrics' default mean over classes ("macro"), which
    differs wherever the classes are not equally many. task.loss=bce: a sigmoid per class on the one-hot (smoothed)
    or mixed targets, timm's BinaryCrossEntropy, as DeiT III trains. Tested also per class (the share of each
    class's images classified right, by the data's class names) and as balanced accuracy, the mean of those
    ("macro"), which a rare class moves as much as a common one."""

    monitor = VAL_ACC

    def __init__(
        self, config: TaskConfig, network: ViTConfig, label_smoothing: float = 0.0, mixup: MixupConfig | None = None
    ):
        num_classes = network.num_classes
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
            best_key(self.monitor): best,
        }

    def setup(self, data: Any) -> None:
        refuse_unlabeled(data)
        if several_labels(data):  # its (B, K) targets would fail in the first step, in a traceback
            raise ConfigError(
                f"task={CLASSIFY} learns one label per image, but the data ({type(data).__name__}) gives several "
                f"per image: add task={MULTILABEL}"
            )
        self.names = class_names(data, self.num_classes) or self.names


def refuse_unlabeled(data: Any) -> None:
    """Data without labels (data=images) cannot teach classes: one line naming what can learn from it."""
    if getattr(data, "without_labels", False) is True:
        raise ConfigError(f"{type(data).__name__} has no labels to learn: pretrain on it with task=mae")


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
        self, config: TaskConfig, network: ViTConfig, label_smoothing: float = 0.0, mixup: MixupConfig | None = None
    ):
        num_classes = network.num_classes
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
            best_key(self.monitor): best,
        }

    def setup(self, data: Any) -> None:
        refuse_unlabeled(data)
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
