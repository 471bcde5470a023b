"""The best checkpoint and its score, kept across the new folder Hydra gives a resumed run."""

from __future__ import annotations

import logging
import shutil
from functools import partial
from pathlib import Path
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import ModelCheckpoint

from vit.atomic import write_atomically, write_folder_atomically

log = logging.getLogger(__name__)


class BestCheckpoint(ModelCheckpoint):
    """A ModelCheckpoint whose top-k a resumed run continues in its own folder. Lightning forgets the scores of
    a checkpoint written to another dirpath, so a resumed run in a new Hydra folder would take its first
    validation for the best, however well an earlier epoch did. This one keeps the scores, and as the fit starts
    copies the earlier run's top-k files into its own folder: the best checkpoint is always in the run's folder,
    whichever run found it, and a run resumed again continues from there."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._carry: list[tuple[Path, Path]] = []  # (the earlier run's file, its copy here), for on_fit_start

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._carry = []
        if state_dict.get("dirpath", self.dirpath) == self.dirpath:
            super().load_state_dict(state_dict)
            return
        best_k = state_dict.get("best_k_models", {})
        here = {path: str(Path(self.dirpath) / Path(path).name) for path in best_k}
        # testing the best checkpoint reloads its state, which names the earlier folder: the copy is here already
        gone = [path for path, copy in here.items() if not Path(path).exists() and not Path(copy).exists()]
        if gone:
            log.warning("%s: gone; the earlier run's best checkpoints and scores are not carried over", gone[0])
            super().load_state_dict({**state_dict, "best_model_path": ""})  # Lightning's own: forgets the scores
            return
        self._carry = [(Path(path), Path(copy)) for path, copy in here.items() if Path(path).exists()]
        best, kth = state_dict["best_model_path"], state_dict.get("kth_best_model_path", "")
        super().load_state_dict(
            {
                **state_dict,
                "dirpath": self.dirpath,
                "best_k_models": {here[path]: score for path, score in best_k.items()},
                "best_model_path": here.get(best, best),
                "kth_best_model_path": here.get(kth, kth),
            }
        )

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._carry_over(trainer)

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._carry_over(trainer)  # trainer=fsdp restores its checkpoint after on_fit_start

    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._carry_over(trainer)  # ... and a finished run resumed there never starts training

    def _carry_over(self, trainer: L.Trainer) -> None:
        carry, self._carry = self._carry, []
        if trainer.is_global_zero:
            for path, copy in carry:
                _copy(path, copy)
                log.info("best checkpoint %s carried over to %s", path, copy)
        trainer.strategy.barrier()  # a finished run tests the copy at once, on every rank


def _copy(path: Path, copy: Path) -> None:
    """A checkpoint's atomic copy: a file, or a sharded checkpoint's folder (trainer=fsdp) as a whole."""
    if path.is_dir():
        names = [p.name for p in path.iterdir()]
        write_folder_atomically(copy, lambda to: [shutil.copyfile(path / n, to / n) for n in names], names)
    else:
        write_atomically(copy, partial(shutil.copyfile, path))
