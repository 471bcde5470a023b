"""One printed line per epoch, instead of the progress bar, where stdout is not a terminal."""

from __future__ import annotations

import lightning as L

from vit.training.clock import THROUGHPUT, TrainingClock
from vit.training.module import LR, TRAIN_LOSS
from vit.training.tasks import VAL_ACC, VAL_LOSS


class EpochLine(L.Callback):
    """Prints `epoch 3/10 | train/loss 0.412 | val/acc 0.8912 | ... | 41.2 s training` once per epoch from
    rank zero, the validation metric being the task's (`monitor`); used instead of the progress bar when stdout is
    not a terminal (CI logs stay readable)."""

    def __init__(self, clock: TrainingClock, monitor: str = VAL_ACC):
        self.clock = clock
        self.keys = tuple(dict.fromkeys((TRAIN_LOSS, VAL_LOSS, monitor, THROUGHPUT, LR)))  # once each (mae: val/loss)

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not trainer.is_global_zero:
            return
        metrics = trainer.callback_metrics
        parts = [f"epoch {trainer.current_epoch + 1}/{trainer.max_epochs}"]
        for key in self.keys:
            if key in metrics:
                value = float(metrics[key])
                parts.append(f"{value:.0f} img/s" if key == THROUGHPUT else f"{key} {value:.4g}")
        parts.append(f"{self.clock.seconds:.1f} s training")
        print(" | ".join(parts), flush=True)
