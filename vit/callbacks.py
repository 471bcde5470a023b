"""Callbacks of our own, for what Lightning does not measure or print the way we need."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import WeightAveraging
from lightning.pytorch.loggers import TensorBoardLogger
from lightning.pytorch.trainer.states import TrainerFn
from torch.optim.swa_utils import get_ema_multi_avg_fn

from vit.analysis import position_table
from vit.module import LR, TRAIN_LOSS, VAL_ACC, VAL_LOSS
from vit.visualize import DPI, figure_pixels, pos_embed_figure

THROUGHPUT = "train/images_per_second"


class EMA(WeightAveraging):
    """An exponential moving average of the weights (and buffers), updated after every optimizer step, used for
    validation, testing and checkpoints: Lightning's EMAWeightAveraging with torch's foreach update, one fused
    lerp per device and dtype instead of one formula per tensor. Measured on an H100 for fashion_mnist_best's
    11.9 M parameters: 1.7 against 9.7 ms a step, of a 33 ms step (benchmarks/NOTES.md, change 10)."""

    def __init__(self, decay: float):
        super().__init__(use_buffers=True, multi_avg_fn=get_ema_multi_avg_fn(decay))
        self.decay = decay

    def on_load_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict[str, Any]) -> None:
        """Resuming a fit restores the live weights and the average; testing (or validating) a checkpoint keeps its
        state_dict, the average. Lightning's WeightAveraging restores the live weights whenever its average exists,
        which after a fit on the same trainer made trainer.test(ckpt_path=best) test the live weights."""
        if trainer.state.fn == TrainerFn.FITTING:
            super().on_load_checkpoint(trainer, pl_module, checkpoint)


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
        return {"seconds": self.seconds}

    def load_state_dict(self, state_dict: dict[str, float]) -> None:
        self.seconds = state_dict["seconds"]


class EpochLine(L.Callback):
    """Prints `epoch 3/10 | train/loss 0.412 | val/acc 0.8912 | ... | 41.2 s training` once per epoch from
    rank zero; used instead of the progress bar when stdout is not a terminal (CI logs stay readable)."""

    keys = (TRAIN_LOSS, VAL_LOSS, VAL_ACC, THROUGHPUT, LR)

    def __init__(self, clock: TrainingClock):
        self.clock = clock

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


class PositionEmbeddingFigure(L.Callback):
    """Every `every_n_epochs` epochs (and after the last), draws the position-embedding similarity figure
    (vit/visualize.py) into `<run dir>/<dirname>/pos_embed_epoch<N>.png`, and into TensorBoard when that
    logger is on, so the table can be watched becoming 2D. One table and one figure: well under a second.
    Models without a position table (pos_embed='none') are skipped."""

    def __init__(self, every_n_epochs: int = 1, dirname: str = "figures"):
        if every_n_epochs < 1:
            raise ValueError(f"every_n_epochs must be at least 1, got {every_n_epochs}")
        self.every_n_epochs, self.dirname = every_n_epochs, dirname

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        epoch = trainer.current_epoch + 1
        last = (trainer.max_epochs or 0) > 0 and epoch >= trainer.max_epochs
        if not trainer.is_global_zero or (epoch % self.every_n_epochs and not last):
            return
        table = position_table(pl_module.model)
        if table is None:
            return
        c = pl_module.model.config
        figure = pos_embed_figure(table.cpu(), f"epoch {epoch}: pos_embed={c.pos_embed}, patch {c.patch_size}")
        folder = Path(trainer.default_root_dir) / self.dirname
        folder.mkdir(parents=True, exist_ok=True)
        figure.savefig(folder / f"pos_embed_epoch{epoch:03d}.png", dpi=DPI)
        for logger in trainer.loggers:
            if isinstance(logger, TensorBoardLogger):
                pixels = figure_pixels(figure)
                logger.experiment.add_image("pos_embed/similarity", pixels, trainer.global_step, dataformats="HWC")
