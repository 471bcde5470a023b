"""An exponential moving average of the weights, for validation, testing and checkpoints."""

from __future__ import annotations

from typing import Any

import lightning as L
from lightning.pytorch.callbacks import WeightAveraging
from lightning.pytorch.trainer.states import TrainerFn
from torch.optim.swa_utils import get_ema_multi_avg_fn


class EMA(WeightAveraging):
    """An exponential moving average of the weights (and buffers), updated after every optimizer step, used for
    validation, testing and checkpoints: Lightning's EMAWeightAveraging with torch's foreach update, one fused
    lerp per device and dtype instead of one formula per tensor, which dominated a GPU step (benchmarks/NOTES.md,
    change 10)."""

    def __init__(self, decay: float):
        super().__init__(use_buffers=True, multi_avg_fn=get_ema_multi_avg_fn(decay))
        self.decay = decay

    def on_load_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict[str, Any]) -> None:
        """Resuming a fit restores the live weights and the average; testing (or validating) a checkpoint keeps its
        state_dict, the average. Lightning's WeightAveraging restores the live weights whenever its average exists,
        which after a fit on the same trainer made trainer.test(ckpt_path=best) test the live weights."""
        if trainer.state.fn == TrainerFn.FITTING:
            super().on_load_checkpoint(trainer, pl_module, checkpoint)
