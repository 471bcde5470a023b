"""The position-embedding figure, drawn during training so the table can be watched becoming 2D."""

from __future__ import annotations

from pathlib import Path

import lightning as L

from vit.figures.analysis import position_table, table_name
from vit.figures.drawing import DPI, pos_embed_figure
from vit.training.loggers import log_figure


class PositionEmbeddingFigure(L.Callback):
    """Every `every_n_epochs` epochs (and after the last), draws the position-embedding similarity figure
    (vit/cli/visualize.py) into `<run dir>/<dirname>/pos_embed_epoch<N>.png`, and into the loggers that keep
    images (TensorBoard, W&B, MLflow), so the table can be watched becoming 2D. One table and one figure: well
    under a second. Models without a position table (pos_embed='none') are skipped."""

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
        what = table_name(pl_module.model)
        figure = pos_embed_figure(table.cpu(), f"epoch {epoch}: {what}, patch {c.patch_size}")
        folder = Path(trainer.default_root_dir) / self.dirname
        folder.mkdir(parents=True, exist_ok=True)
        figure.savefig(folder / f"pos_embed_epoch{epoch:03d}.png", dpi=DPI)
        log_figure(trainer.loggers, "pos_embed/similarity", figure, trainer.global_step)
