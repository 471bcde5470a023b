"""data.max_tokens: images at their own size and aspect ratio (NaFlex). The data modules hand over batches as
lists of (C, H_i, W_i) images, each on the largest grid of the network's whole patches within the budget
(vit/data/native_size.py); this feature packs them into sequences of that many tokens
(VisionTransformer.forward_packed)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from torch import Tensor

from vit.model.config import ConfigError
from vit.training.feature import Feature

if TYPE_CHECKING:
    from vit.training.module import ViTClassifier
    from vit.training.settings import Settings


class NativeSize(Feature):
    """Images of their own sizes, `max_tokens` patches each at most, packed; their test-time views are the image
    and, with test_time_flip, its mirror image."""

    def __init__(self, max_tokens: int):
        self.max_tokens = max_tokens

    @staticmethod
    def check(settings: Settings) -> None:
        """What needs square batches of one size is refused with data.max_tokens."""
        if settings.max_tokens is None:
            return
        square = {
            "mixup": settings.mixup is not None,
            "test_time_shift": bool(settings.switches.test_time_shift),
            "distill.teacher": settings.distill.teacher is not None,
            "compile": settings.switches.compile,
        }
        if clash := [key for key, on in square.items() if on]:
            raise ConfigError(
                f"data.max_tokens with {', '.join(clash)}: not built for batches of images of their own sizes yet; "
                "turn it off"
            )

    def forward(self, module: ViTClassifier, images: Any) -> Tensor | None:
        if not isinstance(images, list):
            return None
        return module.model.forward_packed(images, self.max_tokens + module.config.num_prefix_tokens)

    def views(self, module: ViTClassifier, images: Any) -> Tensor | None:
        if not isinstance(images, list):
            return None
        logits = module(images)
        return (logits + module([image.flip(-1) for image in images])) / 2 if module.test_time_flip else logits
