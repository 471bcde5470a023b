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


class ExactResume(L.Callback):
    """Saves every rank's random state with each checkpoint; a resumed run restores its rank's state, and
    the training loader's position, at on_train_start: after Lightning has restored everything else and
    before the first batch is drawn."""

    def __init__(self) -> None:
        self._pending: list[dict[str, Any]] | None = None

    def state_dict(self) -> dict[str, Any]:
        states = [capture()]
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            states = [None] * dist.get_world_size()
            dist.all_gather_object(states, capture())
        return {"ranks": states}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._pending = state_dict["ranks"]

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # Lightning applies saved loader states when it builds the loader after the restore; ours was built
        # before it (for the schedule's length), so apply them now. A no-op when there are none.
        trainer.fit_loop._load_combined_loader_states()
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
