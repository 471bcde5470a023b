"""data.max_tokens: images at their own size and aspect ratio (NaFlex). The data modules hand over batches as
lists of (C, H_i, W_i) images, each on the largest grid of the network's whole patches within the budget
(vit/data/native_size.py); this feature packs them into sequences of that many tokens
(VisionTransformer.forward_packed)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from torch import Tensor

from vit.model.config import ConfigError, ViTConfig
from vit.model.size import check_fits
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
    def check(settings: Settings, data: Mapping[str, Any]) -> None:
        """What needs square batches of one size is refused with data.max_tokens, and a batch at the budget must
        fit in memory."""
        if settings.max_tokens is None:
            return
        square = {
            "mixup": settings.mixup is not None,
            "test_time_shift": bool(settings.switches.test_time_shift),
            "distill.teacher": settings.distill.teacher is not None,
        }
        if clash := [key for key, on in square.items() if on]:
            raise ConfigError(
                f"data.max_tokens with {', '.join(clash)}: not built for batches of images of their own sizes yet; "
                "turn it off"
            )
        budget = settings.max_tokens
        if isinstance(budget, int) and not isinstance(budget, bool) and budget >= 1:  # else the data module names it
            _check_budget_memory(settings.model, data, budget)

    def compile(self, module: ViTClassifier) -> bool:
        """Each layer with dynamic shapes: forward_packed groups and packs in Python over each batch's image shapes,
        which one graph of the whole would recompile at nearly every batch until dynamo's recompile limit sent it
        back to eager, while its layers see only (S, L, D) sequences and their masks: one graph for every count S and
        length L."""
        for layer in module.model.layers:
            layer.compile(dynamic=True)
        return True

    def forward(self, module: ViTClassifier, images: Any) -> Tensor | None:
        if not isinstance(images, list):
            return None
        return module.model.forward_packed(images, self.max_tokens + module.config.num_prefix_tokens)

    def views(self, module: ViTClassifier, images: Any) -> Tensor | None:
        if not isinstance(images, list):
            return None
        logits = module(images)
        return (logits + module([image.flip(-1) for image in images])) / 2 if module.test_time_flip else logits


def _check_budget_memory(config: ViTConfig | None, data: Mapping[str, Any], budget: int) -> None:
    """A batch at the budget must fit in memory: data.max_tokens=1000000000 asked for exabytes at the first batch.
    Each image is fitted to nearly `budget` patches, so no two share a sequence, and each sequence carries its
    (L, L) attention mask; a lower bound at 16 bits a number: the images' pixels, their tokens and the masks (a
    pretrained file's patch and width are known once it is read: the masks alone then)."""
    key = max(("batch_size", "eval_batch_size"), key=lambda k: data.get(k) or 0)
    batch, per_token, prefix, sizes = data[key], 0, 0, ""
    if config is not None:
        (ph, pw), width, prefix = config.patch_size, config.embed_dim, config.num_prefix_tokens
        per_token, sizes = config.in_chans * ph * pw + width, f" of {ph}x{pw} patches, model.embed_dim={width} wide,"
    length = budget + prefix
    need = 2 * batch * (budget * per_token + length**2)
    masks = f"each with its {length}x{length} attention mask,"
    check_fits(need, f"data.max_tokens={budget}: data.{key}={batch} images{sizes} {masks}")
