"""The training clock: wall time spent training (validation excluded) and images per second."""

from __future__ import annotations

import time
from typing import Any

import lightning as L

THROUGHPUT = "train/images_per_second"


class TrainingClock(L.Callback):
    """Wall time spent training, validation excluded, and images/second per epoch (summed over ranks).

    Listed before EpochLine so that each epoch's throughput is logged before it is printed.
    """

    def __init__(self) -> None:
        self.seconds = 0.0  # all epochs so far
        self._started: float | None = None
        self._epoch_seconds, self._epoch_images = 0.0, 0

    def _resume(self) -> None:
        self._started = time.perf_counter()

    def _pause(self) -> None:
        if self._started is not None:
            elapsed = time.perf_counter() - self._started
            self.seconds += elapsed
            self._epoch_seconds += elapsed
            self._started = None

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._epoch_seconds, self._epoch_images = 0.0, 0
        self._resume()

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, i: int) -> None:
        if self._started is None:  # the first batch after a validation inside the epoch (val_check_interval < 1)
            self._resume()

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        self._epoch_images += len(batch[0])

    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._pause()

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._pause()
        rate = self._epoch_images / max(self._epoch_seconds, 1e-9)
        pl_module.log(THROUGHPUT, rate, sync_dist=True, reduce_fx="sum")

    def state_dict(self) -> dict[str, float]:
        """The seconds so far, the running stretch included: a preempted run saves mid-epoch, clock running."""
        running = time.perf_counter() - self._started if self._started is not None else 0.0
        return {"seconds": self.seconds + running}

    def load_state_dict(self, state_dict: dict[str, float]) -> None:
        self.seconds = state_dict["seconds"]
