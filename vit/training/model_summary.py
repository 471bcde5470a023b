"""Lightning's model summary, its FLOPs column the network's forward FLOPs per image (vit.model.flops): Lightning
counts FLOPs only while running an example input through the module, and printed zeros without one."""

from __future__ import annotations

from importlib.util import find_spec
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import ModelSummary, RichModelSummary
from lightning.pytorch.utilities.model_summary import ModelSummary as Summary

from vit.model.flops import forward_flops

NETWORK = "model"  # ViTClassifier's attribute holding the VisionTransformer: the row the FLOPs belong to


class _NetworkFlops(Summary):
    @property
    def total_flops(self) -> int:
        return round(forward_flops(self._model.config))

    @property
    def flop_counts(self) -> dict[str, dict[Any, int]]:
        return {name: {"forward": self.total_flops} if name == NETWORK else {} for name in self.layer_names}


class NetworkSummary(ModelSummary):
    """The table Lightning prints as fitting starts (rich's where rich is installed, as Lightning's default), with
    the network's forward FLOPs per image in its FLOPs column and total."""

    def _summary(self, trainer: L.Trainer, pl_module: L.LightningModule) -> Summary:
        return _NetworkFlops(pl_module, max_depth=self._max_depth)

    @staticmethod
    def summarize(*args: Any, **kwargs: Any) -> None:
        (RichModelSummary if find_spec("rich") else ModelSummary).summarize(*args, **kwargs)
