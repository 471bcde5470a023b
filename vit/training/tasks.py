"""What a run learns, as the Lightning module asks it (the `task` config group): TaskConfig, checked once, and TASKS,
the task of each kind (the seam itself is vit/training/task.py). A new task is a class of that seam and a row here.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from vit.interop.loaded import CLASSIFY, MAE, MULTILABEL
from vit.model.config import ConfigError, ViTConfig
from vit.training.classification import Classification, MultiLabel
from vit.training.mae import MaskedAutoencoder, check_mae_settings
from vit.training.mixup import MixupConfig
from vit.training.task import (  # the metric names, read from here by callbacks and tests
    STAGES,
    TEST_ACC,
    TEST_ACC5,
    TEST_BALANCED_ACC,
    TEST_F1,
    TEST_LOSS,
    TEST_MAP,
    TEST_MAP_MICRO,
    TRAIN_ACC,
    VAL_ACC,
    VAL_ACC5,
    VAL_LOSS,
    VAL_MAP,
    Task,
)

if TYPE_CHECKING:
    from vit.training.settings import Settings

TASKS: dict[str, type[Task]] = {CLASSIFY: Classification, MULTILABEL: MultiLabel, MAE: MaskedAutoencoder}
LOSSES = {CLASSIFY: ("ce", "bce"), MULTILABEL: ("bce", "asl"), MAE: ("mse",)}  # what each task learns with
__all__ = ["MAE", "STAGES", "TASKS", "TEST_ACC", "TEST_ACC5", "TEST_BALANCED_ACC", "TEST_F1", "TEST_LOSS", "TEST_MAP",
           "TEST_MAP_MICRO", "TRAIN_ACC", "VAL_ACC", "VAL_ACC5", "VAL_LOSS", "VAL_MAP", "TaskConfig"]  # fmt: skip


@dataclass(frozen=True)
class TaskConfig:
    """The `task` group: what the labels are and how the run learns from them."""

    kind: str = CLASSIFY  # a name of TASKS
    loss: str = "ce"  # ce: softmax cross-entropy; bce: a sigmoid per class; asl: ASL (several labels per image)
    gamma_neg: float = 4.0  # ASL's focusing of the negatives, γ- (Ridnik et al. 2021's defaults, these three)
    gamma_pos: float = 0.0  # ... of the positives, γ+
    clip: float = 0.05  # ... the margin m by which a negative's probability is shifted down, in [0, 1)
    mask_ratio: float = 0.75  # mae: the share of each image's patches the encoder does not see
    decoder_dim: int | None = None  # mae's decoder: its width, depth and heads; null: scaled to the encoder
    decoder_depth: int | None = None
    decoder_heads: int | None = None
    norm_pix: bool = True  # mae: each patch's target pixels normalised by the patch's own mean and variance

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
        check_mae_settings(self.mask_ratio, self.decoder_dim, self.decoder_depth, self.decoder_heads)

    def build(self, network: ViTConfig, label_smoothing: float = 0.0, mixup: MixupConfig | None = None) -> Task:
        """The task of this config, for the run's `network` (TASKS[kind].network(...) of the declared one)."""
        return TASKS[self.kind](self, network, label_smoothing, mixup)

    def network(self, config: ViTConfig) -> ViTConfig:
        """The network the run builds for this task, from the one its config and data declare."""
        return TASKS[self.kind].network(config)

    @staticmethod
    def check(settings: Settings, data: Mapping[str, Any]) -> None:
        """What the task cannot compose with (vit/training/checks.py calls it with the features' checks)."""
        teacher, target = settings.distill.teacher, settings.distill.target
        if teacher is not None and settings.task.kind == MAE:
            raise ConfigError(
                f"distill.teacher={teacher} with task={MAE}: MAE learns from the images alone; for a teacher's "
                "features without labels use distill.target=features distill.alpha=1 with task=classify"
            )
        if teacher is not None and settings.task.kind == MULTILABEL and target == "logits":
            raise ConfigError(
                f"distill.teacher={teacher} with task={MULTILABEL}: DeiT's distillation (distill.target=logits) "
                "learns the teacher's one class an image (its softmax), not several labels; distill.target=features "
                "regresses its features instead"
            )
