"""Resuming bit-exactly: the random state of torch, numpy and python in every checkpoint, per rank.

Lightning's checkpoint already holds the model, optimizer, schedule, loop progress and callback states
(EMA, the training clock); the training loader adds its position (vit/data/loading.py). What Lightning
leaves out is the random state: `ExactResume` adds it, and puts it back just before the first resumed step, so
dropout, drop path, Mixup/CutMix and the on-device augmentation draw what the uninterrupted run would have
drawn. It also hands the loader its saved position, which Lightning 2.6 drops when `estimated_stepping_batches`
(our schedule's length) has built the training loader before the checkpoint was restored.
"""

from __future__ import annotations

import logging
import random
from typing import Any

import lightning as L
import numpy as np
import torch
import torch.distributed as dist

from vit.interop.files import CheckpointError

log = logging.getLogger(__name__)


def capture() -> dict[str, Any]:
    """This process's random state as plain values and tensors (loadable with weights_only=True)."""
    kind, keys, pos, has_gauss, gauss = np.random.get_state()
    return {
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
        "numpy": [kind, keys.tolist(), pos, has_gauss, gauss],
        "python": random.getstate(),
    }


def restore(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    if state["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    kind, keys, pos, has_gauss, gauss = state["numpy"]
    np.random.set_state((kind, np.array(keys, dtype=np.uint32), pos, has_gauss, gauss))
    version, internal, gauss_next = state["python"]
    random.setstate((version, tuple(internal), gauss_next))


def _data_source(datamodule: L.LightningDataModule | None) -> str | None:
    """The data module's class as data._target_ names it: what wrote a loader position, and can read it back."""
    return None if datamodule is None else f"{type(datamodule).__module__}.{type(datamodule).__qualname__}"


class ExactResume(L.Callback):
    """Saves every rank's random state with each checkpoint; a resumed run restores its rank's state, and
    the training loader's position, at on_train_start: after Lightning has restored everything else and
    before the first batch is drawn. The checkpoint also names the data module whose loader saved the position:
    a position is that loader's own (litdata's items handed out, or ours: epoch, batches, samples), which another
    data source's loader cannot read or would read in another order."""

    def __init__(self) -> None:
        self._pending: list[dict[str, Any]] | None = None
        self._source: str | None = None  # the data module of this run
        self._saved_source: str | None = None  # that of the checkpoint resumed (None: not recorded)

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        self._source = _data_source(trainer.datamodule)

    def state_dict(self) -> dict[str, Any]:
        states = [capture()]
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            states = [None] * dist.get_world_size()
            dist.all_gather_object(states, capture())
        return {"ranks": states, "data": self._source}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._pending = state_dict["ranks"]
        self._saved_source = state_dict.get("data")

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        loop = trainer.fit_loop
        if loop.restarting and loop._combined_loader_states_to_load and self._saved_source not in (None, self._source):
            raise CheckpointError(
                f"{trainer.ckpt_path}: saved mid-epoch while reading data._target_={self._saved_source}, whose "
                f"loader position this run's data._target_={self._source} cannot continue: resume with the "
                "checkpoint's data, or start from its weights with model.pretrained"
            )
        # Lightning applies saved loader states when it builds the loader after the restore; ours was built
        # before it (for the schedule's length), so apply them now. A no-op when there are none.
        loop._load_combined_loader_states()
        if self._pending is None:
            return
        states, self._pending = self._pending, None
        if len(states) != trainer.world_size:
            log.warning(
                "the checkpoint holds the random state of %d rank(s), this run has %d: not restored "
                "(the run continues, but not bit-exactly)",
                len(states),
                trainer.world_size,
            )
            return
        restore(states[trainer.global_rank])
