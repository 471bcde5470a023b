"""The task seam: what the Lightning module asks of what a run learns (vit/training/module.py holds the network, the
optimizer and the bookkeeping every task shares; a task holds everything that depends on what the labels are).
The tasks themselves: classification.py (one label per image, several labels per image) and mae.py (masked
autoencoding, no labels); their config and registry: tasks.py.

Metric names are defined here once; callbacks and train() read them through the task (`monitor`, `results`).
"""

from __future__ import annotations

from typing import Any

from torch import Tensor, nn
from torchmetrics import Metric

from vit.model.config import ViTConfig

TRAIN_ACC = "train/acc"
VAL_LOSS, VAL_ACC, VAL_ACC5, VAL_MAP = "val/loss", "val/acc", "val/acc5", "val/map"
TEST_LOSS, TEST_ACC, TEST_ACC5 = "test/loss", "test/acc", "test/acc5"
TEST_BALANCED_ACC = "test/balanced_acc"
TEST_MAP, TEST_MAP_MICRO, TEST_F1 = "test/map", "test/map_micro", "test/f1"
STAGES = ("val", "test")


def best_key(monitor: str) -> str:
    """results.json's key of the best validation value of `monitor` (val/acc: best_val_acc), the score that chose
    best.ckpt and the objective a hyper-parameter search optimises (train.py)."""
    return "best_" + monitor.replace("/", "_")


class Task(nn.Module):
    """The module's questions to a task. `monitor` is the validation metric that picks the best checkpoint, higher
    better or, where `mode` is "min", lower; its metrics (and any module that learns, as MAE's decoder) are
    submodules, so they follow the module to its device, and what learns is saved with the network."""

    monitor: str
    mode = "max"
    learns_labels = True  # the data's classes: at least two (task=mae reads none)

    @staticmethod
    def network(config: ViTConfig) -> ViTConfig:
        """The network the run builds for this task, from the one its config and data declare."""
        return config

    def compile(self, module: Any) -> bool:
        """compile=true: torch.compile what this task computes with, in place, where forward is not it (its own
        outputs); whether it did. Else the module compiles the network whole."""
        return False

    def start_from(self, path: Any) -> None:
        """A run that starts from a pretrained file: what the task takes from it besides the network's weights."""

    def outputs(self, module: Any, images: Tensor, evaluation_batch: int | None = None) -> Any:
        """What the loss and the metrics read of a batch, where the task computes it itself (its own forward: MAE's
        encoder on the visible patches and decoder); None: the network's logits (in evaluation, averaged over the
        test-time views). `evaluation_batch`: the batch's index in a validation or test epoch, None in training."""
        return None

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
