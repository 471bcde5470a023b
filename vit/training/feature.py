"""A run feature's seam into the Lightning module: a small object the module holds (vit/training/module.py) whose
hooks it calls in order, each a no-op unless the feature needs it. A feature also owns its checks and its refusals of
what it cannot compose with, so that the module and the run's config checks need no branch for it.

Today's features: frozen-weight fine-tuning (vit/training/finetune.py), DeiT's distillation
(vit/training/distill.py) and images at their own size (vit/training/native_size.py). The sharded strategy's
specifics live in its strategy (vit/training/sharding.py), which the module asks to shard the network.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from torch import Tensor, nn

if TYPE_CHECKING:
    from vit.training.module import ViTClassifier


class Feature:
    """Hooks of the module into a feature, in the order a run calls them."""

    def modules(self) -> dict[str, nn.Module]:
        """Modules of the feature's own that learn with the network (a projector), by name: the module holds them,
        so they train, move to the device and are saved with it."""
        return {}

    def compile(self, module: ViTClassifier) -> bool:
        """torch.compile the network in place this feature's way (its batches' shapes need it); whether it did."""
        return False

    def adapt(self, module: ViTClassifier) -> None:
        """Once the network holds its starting weights, before training: change what learns."""

    def forward(self, module: ViTClassifier, images: Any) -> Tensor | None:
        """The logits of a batch this feature computes (images of their own sizes), else None."""
        return None

    def training_outputs(self, module: ViTClassifier, images: Tensor) -> tuple[Tensor, Tensor, Any] | None:
        """A training step's (logits the task's loss reads, logits its metrics score, what loss() needs), where the
        feature changes them, else None."""
        return None

    def loss(self, module: ViTClassifier, images: Tensor, extra: Any, loss: Tensor) -> Tensor:
        """The step's loss with this feature's term (`extra`: training_outputs' third part)."""
        return loss

    def views(self, module: ViTClassifier, images: Any) -> Tensor | None:
        """Evaluation's logits averaged over the test-time views, where this feature's batches need their own."""
        return None

    def on_fit_start(self, module: ViTClassifier) -> None:
        """On the training device, before the first step."""

    def on_save_checkpoint(self, module: ViTClassifier, checkpoint: dict[str, Any]) -> None:
        """What the feature keeps in, or leaves out of, a checkpoint."""

    def on_load_checkpoint(self, module: ViTClassifier, checkpoint: dict[str, Any]) -> None:
        """Before the module's weights are loaded from `checkpoint`: put back what on_save_checkpoint left out."""
