"""Faults to inject into a training run, as callbacks a test adds through the config
(`+callbacks.fault._target_=tests.reliability.faults.NAME`)."""

from __future__ import annotations

import os
import signal
import time
from typing import Any

import lightning as L
import torch


class SignalAt(L.Callback):
    """Sends this process `signum` as global step `step` begins: the signal lands mid-step, as a scheduler's would.
    Under DDP, every rank's process, or only rank `rank`'s."""

    def __init__(self, step: int, signum: int = signal.SIGTERM, rank: int | None = None):
        self.step, self.signum, self.rank = step, signum, rank

    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        if trainer.global_step == self.step and self.rank in (None, trainer.global_rank):
            os.kill(os.getpid(), self.signum)


class NaNBatchAt(L.Callback):
    """Turns the images of the batches at the given global steps into NaN (after the transfer to the device)."""

    def __init__(self, steps: list[int]):
        self.steps = set(steps)

    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        if trainer.global_step in self.steps:
            batch[0].fill_(torch.nan)


class RecordWeights(L.Callback):
    """Keeps a copy of the live weights after every optimizer step, in the class-level `history` (Hydra builds
    the instance, so the test reads the class); clear it before the run."""

    history: list[dict[str, torch.Tensor]] = []  # noqa: RUF012 - shared on purpose, see above

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        RecordWeights.history.append({k: v.detach().clone() for k, v in pl_module.state_dict().items()})


class SlowSteps(L.Callback):
    """Every training step takes at least `seconds` longer (a sleep before its backward pass)."""

    def __init__(self, seconds: float):
        self.seconds = seconds

    def on_before_backward(self, trainer: L.Trainer, pl_module: L.LightningModule, loss: Any) -> None:
        time.sleep(self.seconds)


class RecordLastCheckpoint(L.Callback):
    """Not a fault: a witness. As each training epoch starts, appends the global step that checkpoints/last.ckpt
    holds (None while there is none) to the class-level `steps`, what a kill at that moment leaves to resume."""

    steps: list[int | None] = []  # noqa: RUF012 - shared on purpose, as RecordWeights.history

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        path = os.path.join(trainer.default_root_dir, "checkpoints", "last.ckpt")
        held = torch.load(path, weights_only=True)["global_step"] if os.path.exists(path) else None
        RecordLastCheckpoint.steps.append(held)


class RecordLabels(L.Callback):
    """Not a fault: a witness. Appends the labels of every training batch to `folder`/rank<R>.txt, one line a
    batch as 'epoch label label ...'. Data whose every image has its own label (num_classes = images) thus
    shows which images each rank trained on, in which order, and whether any came twice or never."""

    def __init__(self, folder: str):
        self.folder = folder

    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        os.makedirs(self.folder, exist_ok=True)
        with open(os.path.join(self.folder, f"rank{trainer.global_rank}.txt"), "a") as f:
            f.write(" ".join(map(str, [trainer.current_epoch, *batch[1].tolist()])) + "\n")


def recorded_labels(folder: str) -> dict[int, list[tuple[int, list[int]]]]:
    """RecordLabels' files: rank -> [(epoch, labels of one batch), ...] in the order trained."""
    seen = {}
    for name in sorted(os.listdir(folder)):
        with open(os.path.join(folder, name)) as f:
            rows = [list(map(int, line.split())) for line in f if line.strip()]
        seen[int(name.removeprefix("rank").removesuffix(".txt"))] = [(row[0], row[1:]) for row in rows]
    return seen


def stopped_and_resumed_end_alike(run: Any, folder: Any, step: int, steps: int, whole: Any = None) -> None:
    """`run(name, *overrides)` -> a config writing into folder/name: the whole run (or the folder `whole`, where one
    such run was trained already), then one stopped by SIGTERM as global step `step` begins and resumed with
    resume=auto, must end after `steps` steps with bit-identical last.ckpt weights."""
    from vit.training.run import train
    from vit.training.run_folder import LAST

    stop = f"+callbacks.fault={{_target_: tests.reliability.faults.SignalAt, step: {step}}}"
    if whole is None:
        train(run("whole"))
        whole = folder / "whole"
    try:
        train(run("runs/1", stop))
    except SystemExit as stopped:
        assert stopped.code == 128 + signal.SIGTERM
    else:
        raise AssertionError(f"the run was not stopped at step {step}")
    assert train(run("runs/2", stop, "resume=auto"))["global_steps"] == steps
    expected, got = (torch.load(f / "checkpoints" / LAST)["state_dict"] for f in (whole, folder / "runs/2"))
    assert expected.keys() == got.keys()
    assert not [k for k in expected if not torch.equal(expected[k], got[k])]
