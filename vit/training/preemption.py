"""Preemption: SIGTERM (schedulers, torchrun) or SIGUSR1 (SLURM's warning signal) becomes a checkpoint and a
requeueable exit. The current optimizer step finishes (and the validation or epoch end that follows it, if one
does), checkpoints/last.ckpt is written, and the process exits with 128 + the signal number (143 for SIGTERM);
rerunning the command with `resume=auto` continues from there."""

from __future__ import annotations

import logging
import signal
from pathlib import Path
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import Checkpoint

from vit.training.run_folder import LAST

log = logging.getLogger(__name__)
PREEMPTION_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)


class Preempted(SystemExit):
    """Raised after the checkpoint is written; its code is the process's exit status."""


class Preemption(Checkpoint):
    """On SIGTERM or SIGUSR1: the optimizer step under way finishes, checkpoints/last.ckpt is written, and the
    process exits with 128 + signal number. Under DDP the ranks agree (a signal on any rank stops all) at the same
    step, so every rank takes part in the save.

    The checkpoint is written where Lightning's own ModelCheckpoint would write one, so that the stopped run and
    its continuation validate, checkpoint, step their schedules and log each epoch once, as an uninterrupted run:
    - after a step that neither a validation nor the epoch's end follows: at once, in on_train_batch_end;
    - after a step that a validation inside the epoch follows (val_check_interval < 1): in on_validation_end, once
      the other checkpoints have recorded the validation; then the process exits;
    - after the epoch's last step: in on_train_epoch_end, after the epoch's validation if it has
      one and every other epoch-end hook; the process exits once Lightning has logged the epoch, at the next hook
      (the next epoch's on_train_epoch_start, after the other callbacks', or on_train_end).
    Lightning 2.6 takes a checkpoint written at an epoch's last on_train_batch_end for a finished epoch (FitLoop.reset):
    that epoch's validation and end, and the next epoch's on_train_epoch_start, never run; a validation due after
    the step it skips (TrainingEpochLoop.advance). The cost of waiting: the grace period after the signal must cover
    a validation. With trainer.max_steps set, Lightning resumes no epoch-end checkpoint rightly (it repeats the
    epoch's end and skips an epoch), ModelCheckpoint's last.ckpt included: vit.training.check_config refuses it.
    As a Checkpoint, this callback runs after all others, ModelCheckpoints included, in every hook."""

    def __init__(self, checkpoint_dir: str | Path):
        self.path = Path(checkpoint_dir) / LAST
        self.received: int | None = None
        self._previous: dict[int, Any] = {}
        self._save_at: str | None = None  # the hook that writes the checkpoint once the ranks have agreed to stop
        self._saved = False

    def _handler(self, signum: int, frame: Any) -> None:
        log.warning("received %s: stopping after this step", signal.Signals(signum).name)
        self.received = signum

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        for sig in PREEMPTION_SIGNALS:
            self._previous[sig] = signal.signal(sig, self._handler)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._uninstall()
        self._exit_if_saved()  # the signal came at the last step of the fit

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        self._uninstall()

    def _uninstall(self) -> None:
        for sig, previous in self._previous.items():
            signal.signal(sig, previous)
        self._previous = {}

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        stepped = (batch_idx + 1) % trainer.accumulate_grad_batches == 0
        if not stepped:
            return
        # a decision already taken (the same on every rank) whose validation did not come is taken again
        if self._save_at is None and not trainer.strategy.reduce_boolean_decision(self.received is not None, all=False):
            return
        self.received = self.received or signal.SIGTERM  # another rank received it
        # the loop's own tests, made before it makes them: the same on every rank
        loop = trainer.fit_loop.epoch_loop
        if loop._is_training_done:  # the epoch's last batch
            self._save_at = "on_train_epoch_end"
        elif loop._should_check_val_fx(trainer.fit_loop._data_fetcher):
            self._save_at = "on_validation_end"
        else:
            self._save(trainer)
            self._exit_if_saved()
            return
        log.warning("a validation or the epoch's end follows this step: the checkpoint waits for %s", self._save_at)

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self._save_at == "on_validation_end":
            self._save(trainer)
            self._exit_if_saved()

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self._save_at == "on_train_epoch_end":
            self._save(trainer)  # exits at the next hook: Lightning logs the epoch's means after this one

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._exit_if_saved()

    def _save(self, trainer: L.Trainer) -> None:
        trainer.save_checkpoint(self.path, weights_only=False)  # everything, to resume from
        self._saved = True

    def _exit_if_saved(self) -> None:
        if self._saved:
            code = 128 + self.received
            log.warning("checkpoint written to %s; exiting with %d (rerun with resume=auto)", self.path, code)
            raise Preempted(code)
